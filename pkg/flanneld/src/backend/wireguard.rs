//! `wireguard`: pod traffic between nodes encrypted by WireGuard, in flannel's config and lease
//! formats. A device per family (`flannel-wg`, `flannel-wg-v6`; `Mode` auto/ipv4/ipv6: one
//! `flannel-wg` for both), the lease's subnet address on it, one route for the whole network
//! through it, and per other node a peer (its public key, its public address and port, its
//! subnet as allowed IPs, the PSK, the keepalive). The tunnel is the kernel's WireGuard where
//! the kernel has it, else our userspace tunnel (`flannel-wireguard`, a process of its own
//! that outlives flanneld), chosen once at start or forced by `Backend.Tunnel`.

use super::api::{Backend, Device, DevicePeer, Held, Peer, PeerFamily, Refusal, Skip};
use crate::config::{ConfigError, Fields, NetConfig};
use crate::entries::Want;
use crate::family::IpFamily;
use crate::iface::External;
use crate::lease::{Annotated, Ipv6Annotated};
use cni_kernel::netlink::{Conn, Link, LinkKind, LinkSpec, Route};
use futures::future::BoxFuture;
use ipnetwork::IpNetwork;
use serde_json::value::RawValue;
use std::any::Any;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tracing::{info, warn};
use wireguard::control::{choose_mode, Control, TunnelMode};
use wireguard::supervise::{ensure_running, Launcher};
use wireguard::uapi::{DeviceConfig, DeviceState, PeerConfig, PeerState, SOCKET_DIR};
use wireguard::{key, Key};

/// How the tunnel carries a node's families (`Backend.Mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A device per family, each over its own family.
    Separate,
    /// One device; the underlay family the two nodes can best reach each other by.
    Auto,
    Ipv4,
    Ipv6,
}

/// The userspace tunnel's program, beside flanneld's own.
const TUNNEL_PROGRAM: &str = "flannel-wireguard";

/// wireguard's keys in the config's `Backend`, with their defaults, and what this node's start
/// settles once: its private key and which WireGuard runs the tunnel.
#[derive(Debug)]
pub struct WireGuard {
    pub listen_port: u16,
    pub listen_port_v6: u16,
    /// `MTU`: the underlay MTU the device's is derived from (80 less); None: the external
    /// interface's.
    pub mtu: Option<u32>,
    pub psk: Option<Key>,
    /// Seconds; 0: off.
    pub keepalive: u16,
    pub mode: Mode,
    /// `Backend.Tunnel`: kernel, userspace, or None (auto).
    pub forced: Option<TunnelMode>,
    /// The cluster networks, IPv4 and IPv6, each routed whole through its device.
    networks: (Option<IpNetwork>, Option<IpNetwork>),
    key_file: PathBuf,
    shared: Arc<Shared>,
}

/// What the devices of one start share.
#[derive(Debug, Default)]
struct Shared {
    key: OnceLock<Key>,
    tunnel: OnceLock<TunnelMode>,
    /// Leases already warned of (subnet key and reason), so a bad one is said once.
    warned: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl WireGuard {
    /// The config's `Backend` keys, checked; each refusal names the key. The key file is
    /// `$WIREGUARD_KEY_FILE`, else /run/flannel/wgkey; it is read at `check`, and made with
    /// the device when there is none.
    pub fn from_config(cfg: &NetConfig) -> Result<WireGuard, ConfigError> {
        let b = Fields::backend(cfg);
        let psk = match b.text("PSK")? {
            None | Some("") => None,
            // The value is a secret: the refusal says what is wrong, never what it is.
            Some(s) => Some(key::parse_psk(s).map_err(|_| {
                b.refuse(
                    "PSK",
                    "(not shown)",
                    "must be 32 bytes of base64, as `wg genpsk` prints",
                )
            })?),
        };
        let keepalive = b
            .number(
                "PersistentKeepaliveInterval",
                0..=65535,
                "must be whole seconds, 0 to 65535",
            )?
            .unwrap_or(0) as u16;
        let mode = match b.text("Mode")? {
            None | Some("separate") => Mode::Separate,
            Some("auto") => Mode::Auto,
            Some("ipv4") => Mode::Ipv4,
            Some("ipv6") => Mode::Ipv6,
            Some(other) => {
                return Err(b.refuse(
                    "Mode",
                    format!("{other:?}"),
                    "must be separate, auto, ipv4 or ipv6",
                ))
            }
        };
        let forced = match b.text("Tunnel")? {
            None => None,
            Some(t) => TunnelMode::parse_forced(t)
                .map_err(|e| b.refuse("Tunnel", format!("{t:?}"), e.to_string()))?,
        };
        let port = |key: &str, default: u16| {
            let port = b.number(key, 1..=65535, "must be a UDP port, 1 to 65535")?;
            Ok::<u16, ConfigError>(port.map_or(default, |p| p as u16))
        };
        // The device's MTU is 80 less; IPv6 refuses a link under 1280.
        let least = if cfg.network(IpFamily::V6).is_some() {
            1280 + MTU_OVERHEAD
        } else {
            576 + MTU_OVERHEAD
        };
        let mtu = b.number(
            "MTU",
            u64::from(least)..=65535,
            &format!(
                "must be a whole number from {least} to 65535: the device's MTU is \
                 {MTU_OVERHEAD} less"
            ),
        )?;
        Ok(WireGuard {
            listen_port: port("ListenPort", 51820)?,
            listen_port_v6: port("ListenPortV6", 51821)?,
            mtu: mtu.map(|m| m as u32),
            psk,
            keepalive,
            mode,
            forced,
            networks: (cfg.network(IpFamily::V4), cfg.network(IpFamily::V6)),
            key_file: key::key_file_path(),
            shared: Arc::new(Shared::default()),
        })
    }

    fn device_name(&self, family: IpFamily) -> &'static str {
        match (self.mode, family) {
            (Mode::Separate, IpFamily::V6) => "flannel-wg-v6",
            _ => "flannel-wg",
        }
    }

    /// The port a family's device listens on (announced in the lease's `Port`), and the one
    /// other nodes are reached at when their lease has none (flanneld before v0.26).
    fn port_of(&self, family: IpFamily) -> u16 {
        match (self.mode, family) {
            (Mode::Separate, IpFamily::V6) => self.listen_port_v6,
            _ => self.listen_port,
        }
    }
}

impl Backend for WireGuard {
    fn name(&self) -> &'static str {
        "wireguard"
    }

    /// The private key, read when there is one (a check writes nothing: the device's making
    /// makes the key); unreadable or malformed ends the start, naming it.
    fn check(&self, _ext: &External, _families: &[IpFamily]) -> Result<(), Refusal> {
        if let Some(k) = key::load(&self.key_file)? {
            info!("wireguard: public key {}", k.public());
            let _ = self.shared.key.set(k);
        }
        Ok(())
    }

    fn device(
        &self,
        family: IpFamily,
        ext: &External,
        _announced: Option<&RawValue>,
    ) -> Option<Arc<dyn Device>> {
        // One device for both families outside `separate`: the second family's is a shadow of
        // the first's, which holds and writes the peers.
        let primary = self.mode == Mode::Separate
            || family == IpFamily::V4
            || ext.public(IpFamily::V4).is_none();
        Some(Arc::new(WgDevice {
            name: self.device_name(family).to_string(),
            mtu: device_mtu(self.mtu.unwrap_or(ext.mtu)),
            port: self.port_of(family),
            primary,
            forced: self.forced,
            key_file: self.key_file.clone(),
            shared: self.shared.clone(),
        }))
    }

    /// IPv6's only with its public key.
    fn annotated(&self) -> Annotated {
        Annotated {
            ipv4_needs_data: false,
            ipv6: Ipv6Annotated::WithData,
        }
    }

    /// A peer per device: per family in `separate`; one for both families on a one-device
    /// mode, its endpoint the family the mode takes.
    fn peer(&self, ext: &External, peer: &Peer<'_>, want: &mut Want) -> Vec<Skip> {
        let mut skipped = Vec::new();
        let mut made: Vec<(u32, WgPeer)> = Vec::new();
        for f in &peer.families {
            let Some(dev) = f.dev else { continue };
            let announced = match parse_backend_data(f.data.map_or("", |d| d.get())) {
                Ok(a) => a,
                Err(why) => {
                    self.warn_once(peer, f, &why);
                    skipped.push(Skip::NoBackendData {
                        what: "WireGuard public key",
                        subnet: f.subnet,
                    });
                    continue;
                }
            };
            // The whole network of the family: one route through the device, made once.
            if let Some(net) = self.network(f.family) {
                let routes = &mut want.entries.routes;
                if !routes.iter().any(|r| r.dst == net && r.oif == Some(dev)) {
                    routes.push(Route::new(net, None, Some(dev)));
                }
            }
            let port = announced.port.unwrap_or(self.port_of(f.family));
            let endpoint = SocketAddr::new(f.public, port);
            match made
                .iter_mut()
                .find(|(d, p)| *d == dev && p.public_key == announced.public_key)
            {
                Some((_, p)) => {
                    p.allowed_ips.push(f.subnet);
                    p.endpoint = self.joint_endpoint(ext, p.endpoint, endpoint);
                }
                None => made.push((
                    dev,
                    WgPeer {
                        public_key: announced.public_key,
                        endpoint,
                        allowed_ips: vec![f.subnet],
                        psk: self.psk,
                        keepalive: self.keepalive,
                    },
                )),
            }
        }
        for (dev, p) in made {
            want.device_peer(dev, Arc::new(p));
        }
        skipped
    }
}

impl WireGuard {
    /// Says once per lease and reason that a lease's family is not programmed.
    fn warn_once(&self, peer: &Peer<'_>, f: &PeerFamily<'_>, why: &str) {
        let key = peer.lease.key;
        let mut warned = self.shared.warned.lock().unwrap_or_else(|e| e.into_inner());
        if warned.insert(format!("{key} {why}")) {
            warn!(
                "wireguard: the node of lease {key} (public address {}) is not programmed: {why}",
                f.public
            );
        }
    }

    fn network(&self, family: IpFamily) -> Option<IpNetwork> {
        match family {
            IpFamily::V4 => self.networks.0,
            IpFamily::V6 => self.networks.1,
        }
    }

    /// The endpoint of a node with both families on a one-device mode: `first` is its
    /// IPv4 one, `second` its IPv6 one.
    fn joint_endpoint(&self, ext: &External, first: SocketAddr, second: SocketAddr) -> SocketAddr {
        let (v4, v6) = match (first.ip(), second.ip()) {
            (IpAddr::V4(a), IpAddr::V6(b)) => (a, b),
            _ => return first,
        };
        let ip = match self.mode {
            Mode::Ipv6 => IpAddr::V6(v6),
            Mode::Auto => auto_endpoint(Some(v4), Some(v6), ext.public_ip, ext.public_ipv6)
                .unwrap_or(IpAddr::V4(v4)),
            _ => IpAddr::V4(v4),
        };
        SocketAddr::new(
            ip,
            if ip.is_ipv4() {
                first.port()
            } else {
                second.port()
            },
        )
    }
}

/// One node as a peer of a device: what flanneld writes for it, or what the device holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WgPeer {
    pub public_key: Key,
    pub endpoint: SocketAddr,
    pub allowed_ips: Vec<IpNetwork>,
    pub psk: Option<Key>,
    pub keepalive: u16,
}

impl WgPeer {
    /// What a device holds, as a peer; None without an endpoint (nothing flanneld writes).
    fn held(p: PeerState) -> Option<WgPeer> {
        Some(WgPeer {
            public_key: p.public_key,
            endpoint: p.endpoint?,
            allowed_ips: p.allowed_ips,
            psk: p.preshared_key,
            keepalive: p.persistent_keepalive,
        })
    }

    /// The peer's settings in full: a PSK or keepalive held but not wanted is cleared.
    fn config(&self) -> PeerConfig {
        let mut c = PeerConfig::new(self.public_key);
        c.endpoint = Some(self.endpoint);
        c.preshared_key = Some(self.psk.unwrap_or_default());
        c.persistent_keepalive = Some(self.keepalive);
        c.replace_allowed_ips = true;
        c.allowed_ips = self.allowed_ips.clone();
        c
    }

    fn sorted_ips(&self) -> Vec<IpNetwork> {
        let mut v = self.allowed_ips.clone();
        v.sort();
        v
    }
}

impl DevicePeer for WgPeer {
    fn key(&self) -> String {
        self.public_key.to_base64()
    }

    fn fits(&self, held: &dyn DevicePeer) -> bool {
        held.as_any().downcast_ref::<WgPeer>().is_some_and(|h| {
            h.endpoint == self.endpoint
                && h.sorted_ips() == self.sorted_ips()
                && h.psk == self.psk
                && h.keepalive == self.keepalive
        })
    }

    fn show(&self) -> String {
        let ips: Vec<String> = self.allowed_ips.iter().map(|n| n.to_string()).collect();
        let mut s = format!(
            "peer {} endpoint {} allowed-ips {}",
            self.public_key,
            self.endpoint,
            ips.join(",")
        );
        if self.psk.is_some() {
            s.push_str(" psk");
        }
        if self.keepalive != 0 {
            s.push_str(&format!(" keepalive {}", self.keepalive));
        }
        s
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A WireGuard device of this node, run by the kernel or by our userspace tunnel.
#[derive(Debug)]
pub struct WgDevice {
    name: String,
    mtu: u32,
    port: u16,
    /// False for the second family's view of a one-device mode's device: it holds and writes
    /// no peers (the first family's view does).
    primary: bool,
    forced: Option<TunnelMode>,
    key_file: PathBuf,
    shared: Arc<Shared>,
}

/// The link kind each tunnel makes.
fn link_kind(mode: TunnelMode) -> &'static str {
    match mode {
        TunnelMode::Kernel => "wireguard",
        TunnelMode::Userspace => "tun",
    }
}

fn mode_of(held: &Link) -> Option<TunnelMode> {
    match held.kind.as_deref() {
        Some("wireguard") => Some(TunnelMode::Kernel),
        Some("tun") => Some(TunnelMode::Userspace),
        _ => None,
    }
}

/// Runs blocking device I/O (a socket round trip, a process start) off the async workers.
async fn blocking<T: Send + 'static, E: std::fmt::Display + Send + 'static>(
    op: &'static str,
    object: String,
    f: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> cni_kernel::Result<T> {
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(cni_kernel::Error::failed(op, object, e)),
        Err(e) => Err(cni_kernel::Error::failed(op, object, e)),
    }
}

impl WgDevice {
    /// The private key, made once (and reused) when the device is made.
    fn key(&self) -> cni_kernel::Result<Key> {
        if let Some(k) = self.shared.key.get() {
            return Ok(*k);
        }
        let (k, made) = key::load_or_create(&self.key_file)
            .map_err(|e| cni_kernel::Error::invalid("reading the WireGuard key", &self.name, e))?;
        if made {
            info!("wireguard: made private key {}", self.key_file.display());
        }
        let k = *self.shared.key.get_or_init(|| k);
        info!("wireguard: public key {}", k.public());
        Ok(k)
    }

    /// The tunnel this start runs: the kernel's when it can (or forced), said once.
    async fn mode(&self, conn: &Conn) -> cni_kernel::Result<TunnelMode> {
        if let Some(m) = self.shared.tunnel.get() {
            return Ok(*m);
        }
        let support = kernel_support(conn).await;
        let (mode, why) = choose_mode(self.forced, &support).map_err(|why| {
            cni_kernel::Error::invalid("choosing the WireGuard tunnel", &self.name, why)
        })?;
        if self.shared.tunnel.set(mode).is_ok() {
            info!("wireguard: {mode} tunnel ({why})");
            let gauge = match mode {
                TunnelMode::Kernel => 1,
                TunnelMode::Userspace => 2,
            };
            crate::metrics::set(&crate::metrics::METRICS.wireguard_tunnel, gauge);
        }
        Ok(mode)
    }

    fn control(&self, mode: TunnelMode) -> Control {
        Control::for_mode(mode, &self.name, Path::new(SOCKET_DIR))
    }

    /// What the device holds (its key, port and peers), read off the async workers.
    async fn state(&self, mode: TunnelMode) -> cni_kernel::Result<DeviceState> {
        let control = self.control(mode);
        blocking("reading WireGuard device", self.name.clone(), move || {
            control.get()
        })
        .await
    }

    /// Whether the device answers: a userspace tunnel's socket (the kernel always does).
    async fn answers(&self, mode: TunnelMode) -> bool {
        mode == TunnelMode::Kernel || self.state(mode).await.is_ok()
    }

    /// How the key and port it holds differ from this node's.
    fn key_and_port(&self, state: &DeviceState) -> Vec<String> {
        let mut d = Vec::new();
        match self.shared.key.get() {
            None => d.push(format!("no private key in {} yet", self.key_file.display())),
            Some(k) if state.private_key != Some(*k) => d.push(format!(
                "another private key than {}'s",
                self.key_file.display()
            )),
            Some(_) => {}
        }
        if state.listen_port != self.port {
            d.push(format!(
                "listen port {}, want {}",
                state.listen_port, self.port
            ));
        }
        d
    }

    /// The userspace tunnel's program: beside flanneld, else on PATH.
    fn tunnel_program() -> PathBuf {
        std::env::current_exe()
            .ok()
            .and_then(|exe| Some(exe.parent()?.join(TUNNEL_PROGRAM)))
            .filter(|p| p.exists())
            .unwrap_or_else(|| PathBuf::from(TUNNEL_PROGRAM))
    }

    /// Private key and port as they must be on the device.
    async fn configure(&self, mode: TunnelMode) -> cni_kernel::Result<()> {
        let config = DeviceConfig {
            private_key: Some(self.key()?),
            listen_port: Some(self.port),
            ..DeviceConfig::default()
        };
        let control = self.control(mode);
        blocking(
            "configuring WireGuard device",
            self.name.clone(),
            move || control.set(&config),
        )
        .await
    }
}

impl Device for WgDevice {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &'static str {
        "wireguard"
    }

    fn mtu(&self) -> u32 {
        self.mtu
    }

    fn differences(&self, held: &Link) -> Vec<String> {
        let mut d = Vec::new();
        let kind = held.kind.as_deref().unwrap_or("plain");
        match self.shared.tunnel.get() {
            Some(m) if kind != link_kind(*m) => d.push(format!(
                "kind {kind}, the {m} tunnel makes {}",
                link_kind(*m)
            )),
            None if mode_of(held).is_none() => {
                d.push(format!("kind {kind}, not a WireGuard device"))
            }
            _ => {}
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
        let tunnel = mode_of(held).map_or("no", |m| m.as_str());
        format!("{} ({tunnel} tunnel, port {})", held.name, self.port)
    }

    fn make<'a>(&'a self, conn: &'a Conn) -> BoxFuture<'a, cni_kernel::Result<Link>> {
        Box::pin(async move {
            let mode = self.mode(conn).await?;
            if let Some(held) = conn.link_by_name(&self.name).await? {
                if held.kind.as_deref() != Some(link_kind(mode)) || !self.answers(mode).await {
                    warn!(
                        "wireguard: replacing {} ({})",
                        self.name,
                        self.differences(&held).join(", ")
                    );
                    conn.delete_link(held.index).await?;
                }
            }
            match mode {
                TunnelMode::Kernel => {
                    let spec = LinkSpec {
                        name: self.name.clone(),
                        kind: LinkKind::Named("wireguard"),
                        mtu: Some(self.mtu),
                        mac: None,
                    };
                    conn.create_link(&spec).await?;
                }
                TunnelMode::Userspace => {
                    let name = self.name.clone();
                    let log = self.key_file.with_file_name(format!("{}.log", self.name));
                    let started = blocking(
                        "starting the userspace WireGuard tunnel",
                        name.clone(),
                        move || {
                            let program = WgDevice::tunnel_program();
                            let launcher = Launcher {
                                program: &program,
                                args: &[],
                                log: Some(&log),
                            };
                            ensure_running(
                                &name,
                                Path::new(SOCKET_DIR),
                                &launcher,
                                Duration::from_secs(20),
                            )
                            .map(|(_, started)| started)
                        },
                    )
                    .await?;
                    if started {
                        info!("wireguard: started the userspace tunnel for {}", self.name);
                    }
                }
            }
            let link = conn.link_by_name(&self.name).await?.ok_or_else(|| {
                cni_kernel::Error::failed(
                    "making WireGuard device",
                    &self.name,
                    "it vanished after creation",
                )
            })?;
            if link.mtu != Some(self.mtu) {
                conn.set_mtu(link.index, self.mtu).await?;
            }
            self.configure(mode).await?;
            info!(
                "wireguard: device {} made or mended ({mode} tunnel, port {}, mtu {})",
                self.name, self.port, self.mtu
            );
            Ok(link)
        })
    }

    /// The device kept when it fits (its peers with it, so pods keep talking across a
    /// restart), else made; the lease announces this node's public key.
    fn establish<'a>(
        &'a self,
        conn: &'a Conn,
        _earlier: Option<&'a RawValue>,
    ) -> BoxFuture<'a, cni_kernel::Result<Option<Box<RawValue>>>> {
        Box::pin(async move {
            let key = self.key()?;
            let mode = self.mode(conn).await?;
            let fits = match conn.link_by_name(&self.name).await? {
                Some(held) => self.differences(&held).is_empty() && self.answers(mode).await,
                None => false,
            };
            if fits {
                self.configure(mode).await?;
            } else {
                self.make(conn).await?;
            }
            Ok(RawValue::from_string(backend_data(&key.public(), self.port)).ok())
        })
    }

    /// The tunnel answering, and the primary view's key, port and peers: a key or port
    /// changed behind flanneld's back is a difference, which making the device puts back.
    fn inspect<'a>(&'a self, held: &'a Link) -> BoxFuture<'a, cni_kernel::Result<Held>> {
        Box::pin(async move {
            let Some(mode) = mode_of(held) else {
                return Ok(Held::default());
            };
            if !self.primary && mode == TunnelMode::Kernel {
                return Ok(Held::default());
            }
            let state = match (self.state(mode).await, mode) {
                (Ok(state), _) => state,
                (Err(_), TunnelMode::Userspace) => {
                    return Ok(Held {
                        differences: vec![format!(
                            "no tunnel process answers on {}/{}.sock",
                            SOCKET_DIR, self.name
                        )],
                        peers: Vec::new(),
                    })
                }
                (Err(e), TunnelMode::Kernel) => return Err(e),
            };
            if !self.primary {
                return Ok(Held::default());
            }
            Ok(Held {
                differences: self.key_and_port(&state),
                peers: state
                    .peers
                    .into_iter()
                    .filter_map(WgPeer::held)
                    .map(|p| Arc::new(p) as Arc<dyn DevicePeer>)
                    .collect(),
            })
        })
    }

    fn write_peers<'a>(
        &'a self,
        held: &'a Link,
        put: &'a [&'a dyn DevicePeer],
        remove: &'a [&'a dyn DevicePeer],
    ) -> BoxFuture<'a, Vec<cni_kernel::Error>> {
        Box::pin(async move {
            let Some(mode) = mode_of(held).filter(|_| self.primary) else {
                return Vec::new();
            };
            let mut peers: Vec<PeerConfig> = remove
                .iter()
                .filter_map(|p| Key::from_base64(&p.key()).ok())
                .map(|k| PeerConfig {
                    remove: true,
                    ..PeerConfig::new(k)
                })
                .collect();
            peers.extend(
                put.iter()
                    .filter_map(|p| p.as_any().downcast_ref::<WgPeer>())
                    .map(WgPeer::config),
            );
            let config = DeviceConfig {
                peers,
                ..DeviceConfig::default()
            };
            let control = self.control(mode);
            match blocking("writing WireGuard peers", self.name.clone(), move || {
                control.set(&config)
            })
            .await
            {
                Ok(()) => Vec::new(),
                Err(e) => vec![e],
            }
        })
    }
}

// The kernel path: taken only where the kernel can run WireGuard itself.

/// Ok when the kernel of `conn`'s namespace makes a link of kind `wireguard` (a probe, made
/// and deleted at once) and its `wireguard` generic netlink family answers; else why not.
pub async fn kernel_support(conn: &Conn) -> Result<(), String> {
    let probe = format!("wgprobe{}", std::process::id() % 10_000_000);
    let spec = LinkSpec {
        name: probe.clone(),
        kind: LinkKind::Named("wireguard"),
        mtu: None,
        mac: None,
    };
    match conn.create_link(&spec).await {
        Ok(_) => {
            if let Ok(Some(link)) = conn.link_by_name(&probe).await {
                let _ = conn.delete_link(link.index).await;
            }
        }
        Err(e) if e.errno().map(|n| n as i32) == Some(libc::EOPNOTSUPP) => {
            return Err("the kernel has no WireGuard: it knows no link kind \"wireguard\"".into());
        }
        Err(e) => return Err(format!("probing for kernel WireGuard: {e}")),
    }
    match wireguard::genl::KernelWireguard::open() {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(
            "the kernel made a wireguard link but has no \"wireguard\" generic netlink family"
                .into(),
        ),
        Err(e) => Err(format!(
            "opening the \"wireguard\" generic netlink family: {e}"
        )),
    }
}

// The lease's wireguard data: what this backend announces and reads in BackendData.

/// The lease's BackendData / BackendV6Data, byte for byte as flanneld writes it since v0.26:
/// the public key and the port the family's device listens on.
pub fn backend_data(public: &Key, port: u16) -> String {
    // Keys are base64: nothing in them needs escaping in JSON.
    format!(
        "{{\"PublicKey\":\"{}\",\"Port\":{port}}}",
        public.to_base64()
    )
}

/// A remote node's announcement: its public key and, from flanneld versions that add it, the
/// port its device listens on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announced {
    pub public_key: Key,
    pub port: Option<u16>,
}

/// Reads BackendData; the error says what is wrong with it (the caller names the node).
pub fn parse_backend_data(raw: &str) -> Result<Announced, String> {
    let v: serde_json::Value =
        serde_json::from_str(raw).map_err(|e| format!("backend data {raw:?} is not JSON: {e}"))?;
    let obj = v
        .as_object()
        .ok_or_else(|| format!("backend data {raw:?} is not a JSON object"))?;
    // Go's decoder matches field names without regard to case.
    let field = |name: &str| {
        obj.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    };
    let key = match field("PublicKey") {
        None | Some(serde_json::Value::Null) => {
            return Err("the lease announces no PublicKey".into())
        }
        Some(serde_json::Value::String(s)) if s.is_empty() => {
            return Err("the lease announces no PublicKey".into())
        }
        Some(serde_json::Value::String(s)) => {
            Key::from_base64(s).map_err(|e| format!("PublicKey: {e}"))?
        }
        Some(other) => return Err(format!("PublicKey {other} is not a string")),
    };
    let port = match field("Port") {
        None | Some(serde_json::Value::Null) => None,
        Some(p) => match p.as_u64() {
            Some(0) => None,
            Some(n) if n <= u64::from(u16::MAX) => Some(n as u16),
            _ => return Err(format!("Port {p} is not a UDP port")),
        },
    };
    Ok(Announced {
        public_key: key,
        port,
    })
}

fn is_private_v4(ip: Ipv4Addr) -> bool {
    ip.is_private()
}

/// RFC 4193 unique local addresses, as flannel's IP6.IsPrivate.
fn is_private_v6(ip: Ipv6Addr) -> bool {
    ip.octets()[0] & 0xfe == 0xfc
}

/// The address to reach a node at in `auto` mode, as flanneld chooses it: its only address;
/// else IPv4 when its IPv4 is public and this node has IPv4; else IPv6 when both sides' IPv6
/// is public; else IPv4.
pub fn auto_endpoint(
    remote_v4: Option<Ipv4Addr>,
    remote_v6: Option<Ipv6Addr>,
    local_v4: Option<Ipv4Addr>,
    local_v6: Option<Ipv6Addr>,
) -> Option<IpAddr> {
    match (remote_v4, remote_v6) {
        (None, None) => None,
        (Some(v4), None) => Some(IpAddr::V4(v4)),
        (None, Some(v6)) => Some(IpAddr::V6(v6)),
        (Some(v4), Some(v6)) => {
            if !is_private_v4(v4) && local_v4.is_some() {
                Some(IpAddr::V4(v4))
            } else if !is_private_v6(v6) && local_v6.is_some_and(|l| !is_private_v6(l)) {
                Some(IpAddr::V6(v6))
            } else {
                Some(IpAddr::V4(v4))
            }
        }
    }
}

/// flanneld's one overhead for the device's MTU, whatever the underlay: an IPv6 header (40),
/// UDP (8), WireGuard's header and tag (32).
pub const MTU_OVERHEAD: u32 = 80;

/// The device's MTU on an external interface of MTU `external`.
pub fn device_mtu(external: u32) -> u32 {
    external.saturating_sub(MTU_OVERHEAD)
}

#[cfg(test)]
mod tests {
    use super::super::api::testing;
    use super::*;
    use crate::config;
    use crate::entries::{NexthopIds, RouteStyle};
    use crate::lease::Lease;

    fn wg(text: &str) -> Result<WireGuard, ConfigError> {
        WireGuard::from_config(&config::parse(text).unwrap())
    }

    const NET: &str = r#""Network":"10.5.0.0/16","IPv6Network":"fd10::/48","EnableIPv6":true"#;

    fn with(backend: &str) -> WireGuard {
        wg(&format!(
            r#"{{{NET},"Backend":{{"Type":"wireguard"{backend}}}}}"#
        ))
        .unwrap()
    }

    const KEY_A: &str = "HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw=";

    fn data(key: &str) -> String {
        format!(r#"{{"PublicKey":"{key}"}}"#)
    }

    /// A node's lease of one family.
    fn lease(subnet: &str, public: &str, data: Option<&str>) -> Lease {
        testing::lease("wireguard", &[(subnet, public, data)])
    }

    /// Node 2's lease of both families, `data` the backend data of each.
    fn dual(data: &str) -> Lease {
        testing::lease(
            "wireguard",
            &[
                ("10.5.2.0/24", "192.168.0.2", Some(data)),
                ("fd10:0:2::/64", "fd00::2", Some(data)),
            ],
        )
    }

    fn want() -> Want {
        Want::new(RouteStyle::Plain, NexthopIds::default(), 2, true)
    }

    fn peers(w: &Want) -> Vec<(u32, WgPeer)> {
        w.entries
            .peers
            .iter()
            .map(|e| {
                (
                    e.device,
                    e.peer.as_any().downcast_ref::<WgPeer>().unwrap().clone(),
                )
            })
            .collect()
    }

    #[test]
    fn defaults_and_keys() {
        let d = with("");
        assert_eq!(
            (d.listen_port, d.listen_port_v6, d.keepalive),
            (51820, 51821, 0)
        );
        assert_eq!((d.mode, d.forced, d.psk), (Mode::Separate, None, None));
        let psk = "K5a7JJe7Bku4QhsJm6D2lkgqJCKNcL1NwmVrBbfJQKk=";
        let k = with(&format!(
            r#","ListenPort":5000,"listenportv6":5001,"PSK":"{psk}","PersistentKeepaliveInterval":25,"Mode":"auto","Tunnel":"userspace""#
        ));
        assert_eq!(
            (k.listen_port, k.listen_port_v6, k.keepalive),
            (5000, 5001, 25)
        );
        assert_eq!(
            (k.mode, k.forced),
            (Mode::Auto, Some(TunnelMode::Userspace))
        );
        assert_eq!(k.psk, Some(Key::from_base64(psk).unwrap()));
    }

    #[test]
    fn refusals_name_the_key_and_never_show_the_psk() {
        for (backend, key) in [
            (r#","PSK":"c2VjcmV0""#, "Backend.PSK"),
            (r#","PSK":7"#, "Backend.PSK"),
            (r#","ListenPort":0"#, "Backend.ListenPort"),
            (r#","ListenPortV6":70000"#, "Backend.ListenPortV6"),
            (
                r#","PersistentKeepaliveInterval":-1"#,
                "Backend.PersistentKeepaliveInterval",
            ),
            (r#","Mode":"both""#, "Backend.Mode"),
            (r#","Tunnel":"boringtun""#, "Backend.Tunnel"),
            (r#","MTU":1300"#, "Backend.MTU"),
            (r#","MTU":"1500""#, "Backend.MTU"),
        ] {
            let text = format!(r#"{{{NET},"Backend":{{"Type":"wireguard"{backend}}}}}"#);
            let e = wg(&text).unwrap_err();
            assert_eq!(e.key, key, "{backend}");
            assert!(!e.to_string().contains("c2VjcmV0"), "{e}");
        }
    }

    #[test]
    fn devices_by_mode_with_the_mtu_less_80() {
        let ext = External::example();
        let sep = with("");
        let v4 = sep.device(IpFamily::V4, &ext, None).unwrap();
        let v6 = sep.device(IpFamily::V6, &ext, None).unwrap();
        assert_eq!(
            (v4.name(), v4.mtu(), v4.kind()),
            ("flannel-wg", 1420, "wireguard")
        );
        assert_eq!((v6.name(), v6.mtu()), ("flannel-wg-v6", 1420));
        // MTU names the underlay's, as Go's flanneld reads it: the device's is 80 less.
        let set = with(r#","MTU":1400"#);
        assert_eq!(set.device(IpFamily::V4, &ext, None).unwrap().mtu(), 1320);
        assert_eq!(set.device(IpFamily::V6, &ext, None).unwrap().mtu(), 1320);
        let auto = with(r#","Mode":"auto""#);
        assert_eq!(
            auto.device(IpFamily::V6, &ext, None).unwrap().name(),
            "flannel-wg"
        );
    }

    #[test]
    fn a_peer_per_node_and_one_route_for_the_network_through_the_device() {
        let (b, ext) = (
            with(r#","PersistentKeepaliveInterval":5"#),
            External::example(),
        );
        let mut w = want();
        let c = data(&Key([7; 32]).to_base64());
        let (two, three) = (
            dual(&data(KEY_A)),
            lease("10.5.3.0/24", "192.168.0.3", Some(&c)),
        );
        for l in [&two, &three] {
            assert_eq!(
                b.peer(&ext, &testing::peer(l, Some(10), Some(11)), &mut w),
                []
            );
        }
        assert_eq!(
            w.entries.routes,
            [
                Route::new("10.5.0.0/16".parse().unwrap(), None, Some(10)),
                Route::new("fd10::/48".parse().unwrap(), None, Some(11))
            ]
        );
        let got = peers(&w);
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].0, 10);
        assert_eq!(
            got[0].1,
            WgPeer {
                public_key: Key::from_base64(KEY_A).unwrap(),
                endpoint: "192.168.0.2:51820".parse().unwrap(),
                allowed_ips: vec!["10.5.2.0/24".parse().unwrap()],
                psk: None,
                keepalive: 5,
            }
        );
        assert_eq!(
            got[0].1.show(),
            format!("peer {KEY_A} endpoint 192.168.0.2:51820 allowed-ips 10.5.2.0/24 keepalive 5")
        );
        // The IPv6 device's peers are reached on ListenPortV6.
        assert_eq!(
            (got[1].0, got[1].1.endpoint),
            (11, "[fd00::2]:51821".parse().unwrap())
        );
        assert_eq!(got[2].1.allowed_ips, ["10.5.3.0/24".parse().unwrap()]);
    }

    #[test]
    fn a_lease_without_a_usable_key_gives_nothing() {
        let (b, ext) = (with(""), External::example());
        for d in [None, Some("{\"PublicKey\":\"AAAA\"}")] {
            let mut w = want();
            let l = lease("10.5.2.0/24", "192.168.0.2", d);
            let why = b.peer(&ext, &testing::peer(&l, Some(10), None), &mut w);
            assert!(
                why[0].to_string().contains("WireGuard public key"),
                "{why:?}"
            );
            assert!(w.entries.peers.is_empty() && w.entries.routes.is_empty());
        }
        // A port announced by a newer flanneld is used.
        let newer = format!(r#"{{"PublicKey":"{KEY_A}","Port":51999}}"#);
        let mut w = want();
        let l = lease("10.5.2.0/24", "192.168.0.2", Some(&newer));
        assert_eq!(b.peer(&ext, &testing::peer(&l, Some(10), None), &mut w), []);
        assert_eq!(peers(&w)[0].1.endpoint.port(), 51999);
    }

    #[test]
    fn one_device_modes_join_a_node_s_families_in_one_peer() {
        let ext = External::example();
        let two = dual(&data(KEY_A));
        for (mode, endpoint) in [
            ("ipv4", "192.168.0.2:51820"),
            ("ipv6", "[fd00::2]:51820"),
            ("auto", "192.168.0.2:51820"),
        ] {
            let b = with(&format!(r#","Mode":"{mode}""#));
            let mut w = want();
            assert_eq!(
                b.peer(&ext, &testing::peer(&two, Some(10), Some(10)), &mut w),
                []
            );
            let got = peers(&w);
            assert_eq!(got.len(), 1, "{mode}");
            assert_eq!(got[0].1.endpoint, endpoint.parse().unwrap(), "{mode}");
            assert_eq!(got[0].1.allowed_ips.len(), 2, "{mode}");
            assert_eq!(
                w.entries.routes.len(),
                2,
                "{mode}: a route per family's network"
            );
        }
    }

    #[test]
    fn a_key_or_port_other_than_this_node_s_is_a_difference_and_no_key_file_is_one_too() {
        let b = with(r#","ListenPort":5000"#);
        let dev = WgDevice {
            name: "flannel-wg".into(),
            mtu: 1420,
            port: b.port_of(IpFamily::V4),
            primary: true,
            forced: None,
            key_file: "/nowhere/wgkey".into(),
            shared: b.shared.clone(),
        };
        let mut held = DeviceState {
            private_key: Some(Key([1; 32])),
            listen_port: 5000,
            ..DeviceState::default()
        };
        assert_eq!(
            dev.key_and_port(&held),
            ["no private key in /nowhere/wgkey yet"]
        );
        b.shared.key.set(Key([1; 32])).unwrap();
        assert!(dev.key_and_port(&held).is_empty());
        held.private_key = Some(Key([2; 32]));
        held.listen_port = 51820;
        assert_eq!(
            dev.key_and_port(&held),
            [
                "another private key than /nowhere/wgkey's",
                "listen port 51820, want 5000"
            ]
        );
    }

    #[test]
    fn a_held_peer_fits_whatever_the_order_of_its_allowed_ips() {
        let want = WgPeer {
            public_key: Key([1; 32]),
            endpoint: "192.168.0.2:51820".parse().unwrap(),
            allowed_ips: vec![
                "10.5.2.0/24".parse().unwrap(),
                "fd10:0:2::/64".parse().unwrap(),
            ],
            psk: None,
            keepalive: 0,
        };
        let mut held = want.clone();
        held.allowed_ips.reverse();
        assert!(want.fits(&held));
        held.endpoint = "192.168.0.9:51820".parse().unwrap();
        assert!(!want.fits(&held));
        let with_psk = WgPeer {
            psk: Some(Key([2; 32])),
            ..want.clone()
        };
        assert!(!want.fits(&with_psk));
        // What is written clears a PSK and keepalive that are not wanted.
        let c = want.config();
        assert_eq!(
            (c.preshared_key, c.persistent_keepalive),
            (Some(Key::default()), Some(0))
        );
        assert!(c.replace_allowed_ips);
    }

    #[test]
    fn backend_data_is_flanneld_s_byte_for_byte_and_reads_back() {
        let key = Key::from_base64("HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw=").unwrap();
        let raw = backend_data(&key, 51830);
        assert_eq!(
            raw,
            r#"{"PublicKey":"HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw=","Port":51830}"#
        );
        assert_eq!(
            parse_backend_data(&raw).unwrap(),
            Announced {
                public_key: key,
                port: Some(51830)
            }
        );
        // flanneld before v0.26 wrote no port.
        let older = r#"{"PublicKey":"HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw="}"#;
        assert_eq!(parse_backend_data(older).unwrap().port, None);
        let lower = r#"{"publickey":"HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw="}"#;
        assert_eq!(parse_backend_data(lower).unwrap().public_key, key);
    }

    #[test]
    fn leases_without_a_usable_key_are_refused_saying_why() {
        for (raw, why) in [
            ("{}", "no PublicKey"),
            (r#"{"PublicKey":""}"#, "no PublicKey"),
            (r#"{"PublicKey":"AAAA"}"#, "3 bytes"),
            (r#"{"PublicKey":"@@@"}"#, "not base64"),
            (r#"{"PublicKey":5}"#, "not a string"),
            ("null", "not a JSON object"),
            ("{", "not JSON"),
            (
                r#"{"PublicKey":"HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw=","Port":70000}"#,
                "not a UDP port",
            ),
        ] {
            let err = parse_backend_data(raw).unwrap_err();
            assert!(err.contains(why), "{raw}: {err}");
        }
    }

    #[test]
    fn auto_mode_prefers_public_ipv4_then_public_ipv6_then_ipv4() {
        let pub4: Ipv4Addr = "198.51.100.2".parse().unwrap();
        let priv4: Ipv4Addr = "192.168.0.2".parse().unwrap();
        let pub6: Ipv6Addr = "2001:db8::2".parse().unwrap();
        let ula6: Ipv6Addr = "fd00::2".parse().unwrap();
        let local4 = Some("192.168.0.1".parse().unwrap());
        let local6 = Some("2001:db8::1".parse().unwrap());
        assert_eq!(
            auto_endpoint(Some(priv4), None, local4, local6),
            Some(IpAddr::V4(priv4))
        );
        assert_eq!(
            auto_endpoint(None, Some(ula6), local4, local6),
            Some(IpAddr::V6(ula6))
        );
        assert_eq!(
            auto_endpoint(Some(pub4), Some(pub6), local4, local6),
            Some(IpAddr::V4(pub4))
        );
        assert_eq!(
            auto_endpoint(Some(priv4), Some(pub6), local4, local6),
            Some(IpAddr::V6(pub6))
        );
        assert_eq!(
            auto_endpoint(Some(priv4), Some(pub6), local4, Some(ula6)),
            Some(IpAddr::V4(priv4))
        );
        assert_eq!(
            auto_endpoint(Some(priv4), Some(ula6), local4, local6),
            Some(IpAddr::V4(priv4))
        );
        assert_eq!(
            auto_endpoint(Some(pub4), Some(pub6), None, local6),
            Some(IpAddr::V6(pub6))
        );
        assert_eq!(auto_endpoint(None, None, local4, local6), None);
    }

    #[test]
    fn device_mtu_is_the_external_less_80_whatever_the_family() {
        assert_eq!(device_mtu(1500), 1420);
        assert_eq!(device_mtu(9001), 8921);
        assert_eq!(device_mtu(40), 0);
    }
}
