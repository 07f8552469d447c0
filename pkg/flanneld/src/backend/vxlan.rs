//! `vxlan`: a device per family (`flannel.<VNI>`, `flannel-v6.<VNI>`) over the external
//! interface; per other node a permanent neighbour (its subnet's network address to its
//! VtepMAC), a permanent FDB entry (its VtepMAC to its public address) and a path to its subnet
//! via that network address on the device, onlink. With `DirectRouting`, a node on the
//! external interface's own link is reached by a plain path via its public address instead.

use super::api::{Backend, Device, Held, Peer, PeerFamily, Skip};
use crate::config::{field, ConfigError, Fields, NetConfig};
use crate::entries::{Hop, Want};
use crate::family::IpFamily;
use crate::iface::External;
use crate::lease::{Annotated, Ipv6Annotated};
use cni_kernel::ethtool;
use cni_kernel::netlink::{
    format_mac, Conn, FdbEntry, Link, LinkKind, LinkSpec, Neighbour, Vxlan as VxlanAttrs,
};
use futures::future::BoxFuture;
use serde_json::value::RawValue;
use serde_json::Value;
use std::sync::Arc;
use tracing::info;

/// vxlan's per-packet overhead over an IPv4 and an IPv6 underlay.
const OVERHEAD_V4: u32 = 50;
const OVERHEAD_V6: u32 = 70;

/// vxlan's keys in the config's `Backend`, with their defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vxlan {
    pub vni: u32,
    pub port: u16,
    /// The underlay MTU to derive the device's from; None: the external interface's.
    pub mtu: Option<u32>,
    pub gbp: bool,
    pub learning: bool,
    pub direct_routing: bool,
    /// `TxChecksumOffload`: false turns the device's tx checksum offload off, and keeps it off
    /// (where vxlan packets leave with bad checksums: flannel-io/flannel#2152); true leaves the
    /// kernel's default.
    pub tx_checksum_offload: bool,
}

/// `aa:bb:cc:dd:ee:ff` as six bytes.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut out = [0u8; 6];
    let mut parts = s.split(':');
    for b in out.iter_mut() {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(out)
}

/// The device of one family's name.
pub fn device_name(family: IpFamily, vni: u32) -> String {
    match family {
        IpFamily::V4 => format!("flannel.{vni}"),
        IpFamily::V6 => format!("flannel-v6.{vni}"),
    }
}

impl Vxlan {
    /// The config's `Backend` keys, checked; each refusal names the key.
    pub fn from_config(cfg: &NetConfig) -> Result<Vxlan, ConfigError> {
        let b = Fields::backend(cfg);
        let uint = |key: &str, max: u64| {
            b.number(key, 0..=max, &format!("must be a whole number up to {max}"))
        };
        let vni = uint("VNI", (1 << 24) - 1)?.unwrap_or(1) as u32;
        let port = uint("Port", 65535)?.filter(|p| *p != 0).unwrap_or(8472) as u16;
        let mtu = uint("MTU", 65535)?.map(|m| m as u32);
        if let Some(m) = mtu.filter(|m| *m < 1280) {
            return Err(b.refuse("MTU", m, "must be at least 1280"));
        }
        Ok(Vxlan {
            vni,
            port,
            mtu,
            gbp: b.bool("GBP")?.unwrap_or(false),
            learning: b.bool("Learning")?.unwrap_or(false),
            direct_routing: b.bool("DirectRouting")?.unwrap_or(false),
            tx_checksum_offload: b.bool("TxChecksumOffload")?.unwrap_or(true),
        })
    }

    /// The device of one family, with `mac` (None: whatever it has).
    fn vxlan_device(&self, family: IpFamily, ext: &External, mac: Option<[u8; 6]>) -> VxlanDevice {
        VxlanDevice {
            vni: self.vni,
            link: LinkSpec {
                name: device_name(family, self.vni),
                kind: LinkKind::Vxlan(VxlanAttrs {
                    vni: self.vni,
                    port: self.port,
                    local: ext.iface_ip(family).or(ext.public(family)),
                    device: Some(ext.index),
                    learning: self.learning,
                    gbp: self.gbp,
                }),
                mtu: Some(self.device_mtu(family, ext)),
                mac,
            },
            tx_checksum_off: !self.tx_checksum_offload,
        }
    }

    /// The device's MTU over one family's underlay: the underlay's less the encapsulation.
    fn device_mtu(&self, family: IpFamily, ext: &External) -> u32 {
        let overhead = match family {
            IpFamily::V4 => OVERHEAD_V4,
            IpFamily::V6 => OVERHEAD_V6,
        };
        self.mtu.unwrap_or(ext.mtu).saturating_sub(overhead)
    }
}

/// The VtepMAC a lease's backend data announces.
fn announced_mac(data: Option<&RawValue>) -> Option<[u8; 6]> {
    let v: Value = serde_json::from_str(data?.get()).ok()?;
    parse_mac(field(v.as_object()?, "VtepMAC")?.as_str()?)
}

fn random_mac() -> [u8; 6] {
    let mut m = [0u8; 6];
    for b in m.iter_mut() {
        *b = fastrand::u8(..);
    }
    // Unicast, locally administered.
    m[0] = (m[0] & 0xfe) | 0x02;
    m
}

impl Backend for Vxlan {
    fn name(&self) -> &'static str {
        "vxlan"
    }

    /// The external interface's address as the local source, the interface as its device.
    fn device(
        &self,
        family: IpFamily,
        ext: &External,
        announced: Option<&RawValue>,
    ) -> Option<Arc<dyn Device>> {
        Some(Arc::new(self.vxlan_device(
            family,
            ext,
            announced_mac(announced),
        )))
    }

    /// A family's annotations only with its VtepMAC.
    fn annotated(&self) -> Annotated {
        Annotated {
            ipv4_needs_data: true,
            ipv6: Ipv6Annotated::WithData,
        }
    }

    /// Each family on its own.
    fn peer(&self, ext: &External, peer: &Peer<'_>, want: &mut Want) -> Vec<Skip> {
        peer.families
            .iter()
            .filter_map(|f| self.peer_family(ext, f, want).err())
            .collect()
    }
}

impl Vxlan {
    fn peer_family(&self, ext: &External, f: &PeerFamily<'_>, want: &mut Want) -> Result<(), Skip> {
        if self.direct_routing && ext.addrs.iter().any(|n| n.contains(f.public)) {
            want.route(Hop {
                dst: f.subnet,
                gw: f.public,
                dev: ext.index,
                onlink: false,
            });
            return Ok(());
        }
        let Some(dev) = f.dev else { return Ok(()) };
        let Some(mac) = announced_mac(f.data) else {
            return Err(Skip::NoBackendData {
                what: "VtepMAC",
                subnet: f.subnet,
            });
        };
        let gw = f.subnet.network();
        want.neighbour(Neighbour::permanent(dev, gw, mac));
        want.fdb(FdbEntry::permanent(dev, mac, f.public));
        want.route(Hop {
            dst: f.subnet,
            gw,
            dev,
            onlink: true,
        });
        Ok(())
    }
}

/// A vxlan device: its link as it must be, its MAC the VtepMAC the lease announces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VxlanDevice {
    pub vni: u32,
    pub link: LinkSpec,
    /// Its tx checksum offload is kept off (`TxChecksumOffload` false).
    pub tx_checksum_off: bool,
}

impl VxlanDevice {
    /// The lease's backend data that announces `mac` to the other nodes.
    fn lease_data(&self, mac: [u8; 6]) -> Option<Box<RawValue>> {
        RawValue::from_string(format!(
            r#"{{"VNI":{},"VtepMAC":"{}"}}"#,
            self.vni,
            format_mac(&mac)
        ))
        .ok()
    }
}

impl Device for VxlanDevice {
    fn name(&self) -> &str {
        &self.link.name
    }

    fn kind(&self) -> &'static str {
        "vxlan"
    }

    fn mtu(&self) -> u32 {
        self.link.mtu.unwrap_or_default()
    }

    fn differences(&self, held: &Link) -> Vec<String> {
        self.link.differences(held)
    }

    fn show(&self, held: &Link) -> String {
        let csum = match ethtool::tx_checksum(&held.name) {
            Ok(on) => format!("tx checksum offload {}", if on { "on" } else { "off" }),
            Err(e) => format!("tx checksum offload unknown ({e})"),
        };
        format!(
            "{} mac {} (the lease says {}), {csum}",
            held.name,
            held.mac_string(),
            self.link
                .mac
                .map(|m| format_mac(&m))
                .unwrap_or_else(|| "nothing".into())
        )
    }

    /// With `TxChecksumOffload` false, the offload still on is a difference.
    fn inspect<'a>(&'a self, held: &'a Link) -> BoxFuture<'a, cni_kernel::Result<Held>> {
        Box::pin(async move {
            let mut found = Held::default();
            if self.tx_checksum_off && ethtool::tx_checksum(&held.name)? {
                found
                    .differences
                    .push("tx checksum offload on (Backend.TxChecksumOffload is false)".into());
            }
            Ok(found)
        })
    }

    fn make<'a>(&'a self, conn: &'a Conn) -> BoxFuture<'a, cni_kernel::Result<Link>> {
        Box::pin(async move {
            let (link, _) = conn.ensure_link(&self.link).await?;
            if self.tx_checksum_off && ethtool::tx_checksum(&link.name)? {
                ethtool::set_tx_checksum(&link.name, false)?;
                info!(
                    "vxlan device {}: tx checksum offload turned off (Backend.TxChecksumOffload)",
                    link.name
                );
            }
            info!(
                "vxlan device {} made or mended (VNI {}, VtepMAC {})",
                self.link.name,
                self.vni,
                link.mac_string()
            );
            Ok(link)
        })
    }

    /// The MAC of a vxlan device of its name that fits, else the VtepMAC `earlier` announced,
    /// else a new one.
    fn establish<'a>(
        &'a self,
        conn: &'a Conn,
        earlier: Option<&'a RawValue>,
    ) -> BoxFuture<'a, cni_kernel::Result<Option<Box<RawValue>>>> {
        Box::pin(async move {
            let any_mac = LinkSpec {
                mac: None,
                ..self.link.clone()
            };
            let held = conn.link_by_name(&self.link.name).await.ok().flatten();
            let existing = held
                .as_ref()
                .filter(|l| l.is_vxlan() && any_mac.differences(l).is_empty())
                .and_then(|l| <[u8; 6]>::try_from(l.mac.as_slice()).ok());
            let mac = existing
                .or_else(|| announced_mac(earlier))
                .unwrap_or_else(random_mac);
            let dev = VxlanDevice {
                link: LinkSpec {
                    mac: Some(mac),
                    ..self.link.clone()
                },
                ..self.clone()
            };
            if held.is_none_or(|l| !dev.differences(&l).is_empty()) {
                dev.make(conn).await?;
            }
            Ok(dev.lease_data(mac))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::api::testing;
    use super::*;
    use crate::config;
    use crate::entries::{NexthopIds, RouteStyle};
    use crate::lease::Lease;
    use cni_kernel::netlink::Route;
    use std::net::IpAddr;

    fn v(text: &str) -> Result<Vxlan, ConfigError> {
        Vxlan::from_config(&config::parse(text).unwrap())
    }

    fn vx(direct_routing: bool) -> Vxlan {
        Vxlan {
            direct_routing,
            ..v(r#"{"Network":"10.5.0.0/16"}"#).unwrap()
        }
    }

    fn ext() -> External {
        External::example()
    }

    const MAC: [u8; 6] = [0xc6, 0xd2, 0x32, 0x6f, 0x8f, 0x44];

    const DATA: &str = r#"{"VNI":1,"VtepMAC":"c6:d2:32:6f:8f:44"}"#;

    fn lease(subnet: &str, public: &str, data: Option<&str>) -> Lease {
        testing::lease("vxlan", &[(subnet, public, data)])
    }

    #[test]
    fn defaults_and_keys() {
        assert_eq!(
            v(r#"{"Network":"10.5.0.0/16"}"#).unwrap(),
            Vxlan {
                vni: 1,
                port: 8472,
                mtu: None,
                gbp: false,
                learning: false,
                direct_routing: false,
                tx_checksum_offload: true,
            }
        );
        let p = v(r#"{"Network":"10.5.0.0/16","Backend":{"Type":"vxlan","vni":7,"Port":4789,"MTU":9000,"DirectRouting":true,"TxChecksumOffload":false}}"#).unwrap();
        assert_eq!(
            (
                p.vni,
                p.port,
                p.mtu,
                p.direct_routing,
                p.tx_checksum_offload
            ),
            (7, 4789, Some(9000), true, false)
        );
        assert!(p.vxlan_device(IpFamily::V4, &ext(), None).tx_checksum_off);
    }

    #[test]
    fn refusals_name_the_key() {
        let e = v(r#"{"Network":"10.5.0.0/16","Backend":{"VNI":"one"}}"#).unwrap_err();
        assert_eq!(e.key, "Backend.VNI");
        let e = v(r#"{"Network":"10.5.0.0/16","Backend":{"VNI":16777216}}"#).unwrap_err();
        assert_eq!(e.value, "16777216");
        let e = v(r#"{"Network":"10.5.0.0/16","Backend":{"DirectRouting":"yes"}}"#).unwrap_err();
        assert_eq!(e.key, "Backend.DirectRouting");
        let e = v(r#"{"Network":"10.5.0.0/16","Backend":{"MTU":1000}}"#).unwrap_err();
        assert_eq!(e.key, "Backend.MTU");
        let e =
            v(r#"{"Network":"10.5.0.0/16","Backend":{"TxChecksumOffload":"off"}}"#).unwrap_err();
        assert_eq!(e.key, "Backend.TxChecksumOffload");
    }

    #[test]
    fn the_device_of_each_family_and_its_mtu() {
        let b = vx(false);
        let d = b.vxlan_device(IpFamily::V4, &ext(), Some(MAC)).link;
        assert_eq!(d.name, "flannel.1");
        let LinkKind::Vxlan(attrs) = &d.kind else {
            panic!("{d:?} is no vxlan device")
        };
        assert_eq!(attrs.local, "192.168.0.1".parse().ok());
        assert_eq!(
            (attrs.device, d.mtu, d.mac),
            (Some(2), Some(1450), Some(MAC))
        );
        let d6 = b.device(IpFamily::V6, &ext(), None).unwrap();
        assert_eq!((d6.name(), d6.mtu()), ("flannel-v6.1", 1430));
        let big = Vxlan {
            mtu: Some(9000),
            ..b
        };
        assert_eq!(big.device(IpFamily::V4, &ext(), None).unwrap().mtu(), 8950);
    }

    #[test]
    fn the_lease_announces_the_vtep_mac_and_reads_back() {
        let b = vx(false);
        let data = b
            .vxlan_device(IpFamily::V4, &ext(), None)
            .lease_data(MAC)
            .unwrap();
        assert_eq!(data.get(), r#"{"VNI":1,"VtepMAC":"c6:d2:32:6f:8f:44"}"#);
        assert_eq!(announced_mac(Some(&data)), Some(MAC));
        let d = b.vxlan_device(IpFamily::V4, &ext(), announced_mac(Some(&data)));
        assert_eq!(d.link.mac, Some(MAC));
        assert_eq!(announced_mac(None), None);
        assert_eq!(parse_mac("c6:d2:32:6f:8f"), None);
    }

    #[test]
    fn a_peer_gives_a_neighbour_an_fdb_entry_and_an_onlink_route() {
        let (b, e) = (vx(false), ext());
        let mut want = Want::new(RouteStyle::Plain, NexthopIds::default(), 1, true);
        let l = lease("10.5.2.0/24", "192.168.0.2", Some(DATA));
        let skipped = b.peer(&e, &testing::peer(&l, Some(10), None), &mut want);
        assert_eq!(skipped, []);
        let gw: IpAddr = "10.5.2.0".parse().unwrap();
        assert_eq!(
            want.entries.routes,
            [Route::new("10.5.2.0/24".parse().unwrap(), Some(gw), Some(10)).onlink()]
        );
        assert_eq!(want.entries.neighbours, [Neighbour::permanent(10, gw, MAC)]);
        assert_eq!(
            want.entries.fdb,
            [FdbEntry::permanent(10, MAC, "192.168.0.2".parse().unwrap())]
        );
        let bare = lease("10.5.3.0/24", "192.168.0.3", None);
        let why = b.peer(&e, &testing::peer(&bare, Some(10), None), &mut want);
        assert!(why[0].to_string().contains("VtepMAC"), "{why:?}");
        // Before the device is made: nothing yet, and no complaint.
        let mut none = Want::new(RouteStyle::Plain, NexthopIds::default(), 1, true);
        let skipped = b.peer(&e, &testing::peer(&l, None, None), &mut none);
        assert_eq!(skipped, []);
        assert_eq!(none.entries, Default::default());
    }

    #[test]
    fn direct_routing_takes_a_plain_route_to_nodes_on_the_same_link() {
        let (b, e) = (vx(true), ext());
        let mut want = Want::new(RouteStyle::Plain, NexthopIds::default(), 2, true);
        for l in [
            lease("10.5.2.0/24", "192.168.0.2", Some(DATA)),
            lease("10.5.3.0/24", "172.16.0.3", Some(DATA)),
        ] {
            assert_eq!(
                b.peer(&e, &testing::peer(&l, Some(10), None), &mut want),
                []
            );
        }
        assert_eq!(
            want.entries.routes[0],
            Route::new(
                "10.5.2.0/24".parse().unwrap(),
                "192.168.0.2".parse().ok(),
                Some(2)
            )
        );
        assert!(want.entries.routes[1].onlink);
        assert_eq!(
            (want.entries.neighbours.len(), want.entries.fdb.len()),
            (1, 1)
        );
    }
}
