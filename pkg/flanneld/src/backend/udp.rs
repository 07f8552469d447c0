//! `udp`: flannel's first backend, wire-compatible with Go's flanneld: a TUN device
//! `flannel0` with this node's subnet's network address as a /32 and MTU the external
//! interface's less 28 (IPv4 and UDP headers), one route for the whole network through it, and
//! a tunnel that sends each IP packet whole as one UDP datagram to `Backend.Port` (8285) of the
//! node whose subnet holds its destination. IPv4 only, as Go's. Its leases carry no
//! `BackendType` and no backend data, as Go's.
//!
//! The tunnel is a process of its own (`flannel-udp`, beside flanneld), started when none
//! answers on its socket and left running when flanneld stops, so that pods keep talking
//! across a restart of flanneld: Go's proxy runs inside flanneld, and its device goes with it.
//! The other nodes' routes are the device's peers: the datapath plane reads them back and
//! writes what differs, as it does WireGuard's.

use super::api::{Backend, Device, DevicePeer, Held, Peer, Refusal, Skip};
use crate::config::{ConfigError, Fields, NetConfig};
use crate::entries::Want;
use crate::family::IpFamily;
use crate::iface::External;
use cni_kernel::netlink::{Conn, Link, Route};
use futures::future::BoxFuture;
use ipnetwork::{IpNetwork, Ipv4Network};
use serde_json::value::RawValue;
use std::any::Any;
use std::net::{IpAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tracing::info;
use udptunnel::control::{socket_path, Change, Client, SOCKET_DIR};
use wireguard::supervise::{ensure_process, Launcher};

/// Go's `udp` backend's port.
pub const DEFAULT_PORT: u16 = 8285;
/// The TUN device, as Go's `flannel%d` names the first.
pub const DEVICE: &str = "flannel0";
/// An IPv4 header and a UDP header: what the wire adds to each packet.
const OVERHEAD: u32 = 28;
/// The tunnel's program, beside flanneld's own.
const TUNNEL_PROGRAM: &str = "flannel-udp";

/// udp's keys in the config's `Backend`, and where its tunnel's socket lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Udp {
    pub port: u16,
    /// The cluster network, routed whole through the device.
    network: Option<Ipv4Network>,
    /// `$FLANNEL_UDP_SOCKET_DIR`, else /run/flannel.
    socket_dir: PathBuf,
}

impl Udp {
    /// The config's `Backend` keys, checked; each refusal names the key.
    pub fn from_config(cfg: &NetConfig) -> Result<Udp, ConfigError> {
        let b = Fields::backend(cfg);
        // 0, as absent, is Go's default port.
        let port = match b.number("Port", 0..=65535, "must be a UDP port, 1 to 65535")? {
            None | Some(0) => DEFAULT_PORT,
            Some(n) => n as u16,
        };
        let network = match cfg.network(IpFamily::V4) {
            Some(IpNetwork::V4(n)) => Some(n),
            _ => None,
        };
        let socket_dir = std::env::var_os("FLANNEL_UDP_SOCKET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(SOCKET_DIR));
        Ok(Udp {
            port,
            network,
            socket_dir,
        })
    }
}

impl Backend for Udp {
    fn name(&self) -> &'static str {
        "udp"
    }

    /// Go's udp leases name no backend type.
    fn lease_type(&self) -> &'static str {
        ""
    }

    fn check(&self, ext: &External, families: &[IpFamily]) -> Result<(), Refusal> {
        if families.contains(&IpFamily::V6) {
            return Err("the udp backend carries IPv4 only, as Go's flanneld's: \
                        use vxlan, host-gw or wireguard for an IPv6 network"
                .into());
        }
        if ext.iface_ip.is_none() {
            return Err(format!(
                "the udp backend listens on the external interface's IPv4 address, and {} has none",
                ext.name
            )
            .into());
        }
        Ok(())
    }

    fn device(
        &self,
        family: IpFamily,
        ext: &External,
        _announced: Option<&RawValue>,
    ) -> Option<Arc<dyn Device>> {
        if family != IpFamily::V4 {
            return None;
        }
        Some(Arc::new(UdpDevice {
            mtu: ext.mtu.saturating_sub(OVERHEAD),
            listen: SocketAddrV4::new(ext.iface_ip?, self.port),
            socket: socket_path(&self.socket_dir, DEVICE),
        }))
    }

    fn peer(&self, _ext: &External, peer: &Peer<'_>, want: &mut Want) -> Vec<Skip> {
        for f in &peer.families {
            let (Some(dev), IpNetwork::V4(subnet), IpAddr::V4(public)) =
                (f.dev, f.subnet, f.public)
            else {
                continue;
            };
            // The whole network: one route through the device, made once.
            if let Some(net) = self.network {
                let net = IpNetwork::V4(net);
                let routes = &mut want.entries.routes;
                if !routes.iter().any(|r| r.dst == net && r.oif == Some(dev)) {
                    routes.push(Route::new(net, None, Some(dev)));
                }
            }
            want.device_peer(
                dev,
                Arc::new(UdpRoute {
                    subnet,
                    endpoint: SocketAddrV4::new(public, self.port),
                }),
            );
        }
        Vec::new()
    }
}

/// Another node's subnet, and where the tunnel sends its packets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdpRoute {
    pub subnet: Ipv4Network,
    pub endpoint: SocketAddrV4,
}

impl DevicePeer for UdpRoute {
    fn key(&self) -> String {
        self.subnet.to_string()
    }

    fn fits(&self, held: &dyn DevicePeer) -> bool {
        held.as_any()
            .downcast_ref::<UdpRoute>()
            .is_some_and(|h| h.endpoint == self.endpoint)
    }

    fn show(&self) -> String {
        format!("{} via {}", self.subnet, self.endpoint)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// `flannel0` and its tunnel.
#[derive(Debug)]
pub struct UdpDevice {
    mtu: u32,
    /// Where the tunnel receives: the external interface's address and `Backend.Port`.
    listen: SocketAddrV4,
    socket: PathBuf,
}

/// Runs a blocking exchange with the tunnel (a socket round trip, a process start) off the
/// async workers.
async fn blocking<T: Send + 'static>(
    op: &'static str,
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> cni_kernel::Result<T> {
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(cni_kernel::Error::failed(op, DEVICE, e)),
        Err(e) => Err(cni_kernel::Error::failed(op, DEVICE, e)),
    }
}

impl UdpDevice {
    fn client(&self) -> Client {
        Client::at(&self.socket)
    }

    /// The tunnel's program: beside flanneld, else on PATH.
    fn tunnel_program() -> PathBuf {
        std::env::current_exe()
            .ok()
            .and_then(|exe| Some(exe.parent()?.join(TUNNEL_PROGRAM)))
            .filter(|p| p.exists())
            .unwrap_or_else(|| PathBuf::from(TUNNEL_PROGRAM))
    }

    /// Starts the tunnel unless one answers; whether it had to.
    async fn run_tunnel(&self) -> cni_kernel::Result<bool> {
        let socket = self.socket.clone();
        blocking("starting the udp tunnel", move || {
            let dir = socket
                .parent()
                .unwrap_or(Path::new(SOCKET_DIR))
                .to_path_buf();
            let dir_arg = dir.display().to_string();
            let log = dir.join(format!("{DEVICE}.log"));
            let program = UdpDevice::tunnel_program();
            let launcher = Launcher {
                program: &program,
                args: &["--socket-dir", &dir_arg],
                log: Some(&log),
            };
            let client = Client::at(&socket);
            ensure_process(
                DEVICE,
                &socket,
                &|| client.is_alive(),
                &launcher,
                Duration::from_secs(20),
            )
            .map_err(std::io::Error::other)
        })
        .await
    }
}

impl Device for UdpDevice {
    fn name(&self) -> &str {
        DEVICE
    }

    fn kind(&self) -> &'static str {
        "udp"
    }

    fn mtu(&self) -> u32 {
        self.mtu
    }

    fn differences(&self, held: &Link) -> Vec<String> {
        let mut d = Vec::new();
        let kind = held.kind.as_deref().unwrap_or("plain");
        if kind != "tun" {
            d.push(format!("kind {kind}, the udp tunnel makes tun"));
        }
        if held.mtu != Some(self.mtu) {
            d.push(format!(
                "mtu {}, want {}",
                held.mtu.unwrap_or_default(),
                self.mtu
            ));
        }
        d
    }

    fn show(&self, held: &Link) -> String {
        format!("{} (udp tunnel on {})", held.name, self.listen)
    }

    fn make<'a>(&'a self, conn: &'a Conn) -> BoxFuture<'a, cni_kernel::Result<Link>> {
        Box::pin(async move {
            if let Some(held) = conn.link_by_name(DEVICE).await? {
                if held.kind.as_deref() != Some("tun") {
                    conn.delete_link(held.index).await?;
                }
            }
            if self.run_tunnel().await? {
                info!("udp: started the tunnel for {DEVICE}");
            }
            let client = self.client();
            let change = Change {
                listen: Some(self.listen),
                ..Change::default()
            };
            blocking("configuring the udp tunnel", move || client.set(&change)).await?;
            let link = conn.link_by_name(DEVICE).await?.ok_or_else(|| {
                cni_kernel::Error::failed("making the udp device", DEVICE, "its tunnel made none")
            })?;
            if link.mtu != Some(self.mtu) {
                conn.set_mtu(link.index, self.mtu).await?;
            }
            info!(
                "udp: device {DEVICE} made or mended (listening on {}, mtu {})",
                self.listen, self.mtu
            );
            Ok(link)
        })
    }

    /// The device kept when it fits and its tunnel answers (its routes with it, so pods keep
    /// talking across a restart), else made; the lease announces nothing, as Go's.
    fn establish<'a>(
        &'a self,
        conn: &'a Conn,
        _earlier: Option<&'a RawValue>,
    ) -> BoxFuture<'a, cni_kernel::Result<Option<Box<RawValue>>>> {
        Box::pin(async move {
            let held = conn.link_by_name(DEVICE).await?;
            let client = self.client();
            let state = blocking("reading the udp tunnel", move || client.get())
                .await
                .ok();
            let fits = held.is_some_and(|l| self.differences(&l).is_empty())
                && state.is_some_and(|s| s.listen == Some(self.listen));
            if !fits {
                self.make(conn).await?;
            }
            Ok(None)
        })
    }

    /// The tunnel answering on its socket and listening where it must, and the routes it
    /// holds.
    fn inspect<'a>(&'a self, _held: &'a Link) -> BoxFuture<'a, cni_kernel::Result<Held>> {
        Box::pin(async move {
            let client = self.client();
            let state = match blocking("reading the udp tunnel", move || client.get()).await {
                Ok(s) => s,
                Err(_) => {
                    return Ok(Held {
                        differences: vec![format!(
                            "no tunnel process answers on {}",
                            self.socket.display()
                        )],
                        peers: Vec::new(),
                    })
                }
            };
            let mut differences = Vec::new();
            if state.listen != Some(self.listen) {
                differences.push(match state.listen {
                    Some(l) => format!("the tunnel listens on {l}, want {}", self.listen),
                    None => format!("the tunnel listens nowhere, want {}", self.listen),
                });
            }
            Ok(Held {
                differences,
                peers: state
                    .routes
                    .into_iter()
                    .map(|(subnet, endpoint)| {
                        Arc::new(UdpRoute { subnet, endpoint }) as Arc<dyn DevicePeer>
                    })
                    .collect(),
            })
        })
    }

    fn write_peers<'a>(
        &'a self,
        _held: &'a Link,
        put: &'a [&'a dyn DevicePeer],
        remove: &'a [&'a dyn DevicePeer],
    ) -> BoxFuture<'a, Vec<cni_kernel::Error>> {
        Box::pin(async move {
            let routes = |list: &[&dyn DevicePeer]| -> Vec<UdpRoute> {
                list.iter()
                    .filter_map(|p| p.as_any().downcast_ref::<UdpRoute>().cloned())
                    .collect()
            };
            let change = Change {
                listen: None,
                put: routes(put)
                    .into_iter()
                    .map(|r| (r.subnet, r.endpoint))
                    .collect(),
                remove: routes(remove).into_iter().map(|r| r.subnet).collect(),
            };
            let client = self.client();
            match blocking("writing the udp tunnel's routes", move || {
                client.set(&change)
            })
            .await
            {
                Ok(()) => Vec::new(),
                Err(e) => vec![e],
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::api::testing;
    use crate::config;
    use crate::entries::{NexthopIds, RouteStyle};

    fn udp(text: &str) -> Result<Udp, ConfigError> {
        Udp::from_config(&config::parse(text).unwrap())
    }

    #[test]
    fn its_port_is_go_s_unless_given() {
        assert_eq!(udp(r#"{"Network":"10.5.0.0/16"}"#).unwrap().port, 8285);
        let u = udp(r#"{"Network":"10.5.0.0/16","Backend":{"Type":"udp","Port":9000}}"#);
        assert_eq!(u.unwrap().port, 9000);
        let e = udp(r#"{"Network":"10.5.0.0/16","Backend":{"Port":"x"}}"#).unwrap_err();
        assert_eq!(
            (e.key.as_str(), e.value.as_str()),
            ("Backend.Port", "\"x\"")
        );
        assert_eq!(
            udp(r#"{"Network":"10.5.0.0/16","Backend":{"Port":0}}"#)
                .unwrap()
                .port,
            8285
        );
        let e = udp(r#"{"Network":"10.5.0.0/16","Backend":{"Port":65536}}"#).unwrap_err();
        assert_eq!(
            (e.key.as_str(), e.reason.as_str()),
            ("Backend.Port", "must be a UDP port, 1 to 65535")
        );
    }

    #[test]
    fn ipv4_only_its_device_and_mtu_and_a_route_per_peer() {
        let u = udp(r#"{"Network":"10.5.0.0/16","Backend":{"Type":"udp"}}"#).unwrap();
        let ext = External::example();
        assert!(u.check(&ext, &[IpFamily::V4]).is_ok());
        let e = u.check(&ext, &[IpFamily::V4, IpFamily::V6]).unwrap_err();
        assert!(e.to_string().contains("IPv4 only"), "{e}");
        assert!(u.device(IpFamily::V6, &ext, None).is_none());
        let dev = u.device(IpFamily::V4, &ext, None).unwrap();
        assert_eq!((dev.name(), dev.mtu()), ("flannel0", 1472));
        assert_eq!(u.lease_type(), "");
        let mut want = Want::new(
            RouteStyle::Plain,
            NexthopIds::new(vec!["10.5.0.0/16".parse().unwrap()], Default::default()),
            2,
            true,
        );
        for (subnet, public) in [
            ("10.5.2.0/24", "192.168.0.2"),
            ("10.5.3.0/24", "192.168.0.3"),
        ] {
            let lease = testing::lease("", &[(subnet, public, None)]);
            let skipped = u.peer(&ext, &testing::peer(&lease, Some(9), None), &mut want);
            assert!(skipped.is_empty(), "{skipped:?}");
        }
        let routes: Vec<String> = want
            .entries
            .routes
            .iter()
            .map(|r| format!("{} dev {:?}", r.dst, r.oif))
            .collect();
        assert_eq!(routes, ["10.5.0.0/16 dev Some(9)"]);
        let peers: Vec<String> = want.entries.peers.iter().map(|p| p.peer.show()).collect();
        assert_eq!(
            peers,
            [
                "10.5.2.0/24 via 192.168.0.2:8285",
                "10.5.3.0/24 via 192.168.0.3:8285"
            ]
        );
    }
}
