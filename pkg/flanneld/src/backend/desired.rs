//! What the kernel must hold for the other nodes' leases, and the difference to what it holds:
//! pure functions, so that start, restart, repair and normal operation are one computation.

use super::mode::Mode;
use crate::config::field;
use crate::lease::{Lease, SubnetKey};
use cni_kernel::netlink::{FdbEntry, Neighbour, Route, MAIN_TABLE};
use ipnetwork::{IpNetwork, Ipv4Network, Ipv6Network};
use serde_json::value::RawValue;
use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;

/// This node, as the datapath sees it.
#[derive(Debug, Clone)]
pub struct Local {
    pub mode: Mode,
    /// The backend type name leases of ours carry.
    pub backend_type: String,
    pub own: SubnetKey,
    pub network4: Option<Ipv4Network>,
    pub network6: Option<Ipv6Network>,
    pub ext_index: u32,
    /// The external interface's addresses with their prefixes (DirectRouting's on-link test).
    pub ext_nets: Vec<IpNetwork>,
    /// The vxlan devices, once made.
    pub dev4: Option<u32>,
    pub dev6: Option<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Entries {
    pub routes: Vec<Route>,
    pub neighbours: Vec<Neighbour>,
    pub fdb: Vec<FdbEntry>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Desired {
    pub entries: Entries,
    /// Leases that give no entry, with why.
    pub skipped: Vec<(SubnetKey, String)>,
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

/// The `VtepMAC` of a lease's backend data.
pub fn vtep_mac(data: Option<&RawValue>) -> Option<[u8; 6]> {
    let v: serde_json::Value = serde_json::from_str(data?.get()).ok()?;
    parse_mac(field(v.as_object()?, "VtepMAC")?.as_str()?)
}

fn on_link(nets: &[IpNetwork], ip: IpAddr) -> bool {
    nets.iter().any(|n| n.contains(ip))
}

/// One address family of a lease: its subnet, public address, our device, its backend data.
type Family<'a> = (
    Option<IpNetwork>,
    Option<IpAddr>,
    Option<u32>,
    Option<&'a RawValue>,
);

/// The entries the other nodes' leases call for.
pub fn desired<'a>(local: &Local, others: impl IntoIterator<Item = &'a Lease>) -> Desired {
    let mut d = Desired::default();
    let e = &mut d.entries;
    let vx = match &local.mode {
        Mode::Alloc => return d,
        Mode::Vxlan(p) => Some(p),
        Mode::HostGw => None,
    };
    let others = others.into_iter();
    // One of each per lease in the usual single-stack case: sized once rather than grown by
    // doubling, which at thousands of leases would hold up to twice the room.
    let n = others.size_hint().0;
    e.routes.reserve_exact(n);
    if vx.is_some() {
        e.neighbours.reserve_exact(n);
        e.fdb.reserve_exact(n);
    }
    for lease in others.filter(|l| l.key != local.own) {
        if lease.attrs.backend_type != local.backend_type {
            d.skipped.push((
                lease.key,
                format!(
                    "its backend is {:?}, this node's is {}",
                    lease.attrs.backend_type, local.backend_type
                ),
            ));
            continue;
        }
        let families: [Family; 2] = [
            (
                lease
                    .key
                    .ipv4
                    .filter(|_| local.network4.is_some())
                    .map(IpNetwork::V4),
                lease.attrs.public_ip.map(IpAddr::V4),
                local.dev4,
                lease.attrs.backend_data.as_deref(),
            ),
            (
                lease
                    .key
                    .ipv6
                    .filter(|_| local.network6.is_some())
                    .map(IpNetwork::V6),
                lease.attrs.public_ipv6.map(IpAddr::V6),
                local.dev6,
                lease.attrs.backend_v6_data.as_deref(),
            ),
        ];
        for (subnet, public, dev, data) in families {
            let Some(subnet) = subnet else { continue };
            let Some(public) = public else {
                d.skipped
                    .push((lease.key, format!("no public address for {subnet}")));
                continue;
            };
            let direct = Route::new(subnet, Some(public), Some(local.ext_index));
            match vx {
                None => e.routes.push(direct),
                Some(p) if p.direct_routing && on_link(&local.ext_nets, public) => {
                    e.routes.push(direct)
                }
                Some(_) => {
                    let Some(dev) = dev else { continue };
                    let Some(mac) = vtep_mac(data) else {
                        d.skipped
                            .push((lease.key, format!("no VtepMAC for {subnet}")));
                        continue;
                    };
                    let gw = subnet.network();
                    e.routes
                        .push(Route::new(subnet, Some(gw), Some(dev)).onlink());
                    e.neighbours.push(Neighbour::permanent(dev, gw, mac));
                    e.fdb.push(FdbEntry::permanent(dev, mac, public));
                }
            }
        }
    }
    d
}

/// Whether a route of the kernel is one this datapath owns: into the cluster network (not this
/// node's own subnet), through a vxlan device of ours or via a gateway on the external link.
pub fn owns_route(local: &Local, r: &Route) -> bool {
    if r.table != MAIN_TABLE {
        return false;
    }
    let inside = match r.dst {
        IpNetwork::V4(n) => {
            local.network4.is_some_and(|net| net.is_supernet_of(n)) && local.own.ipv4 != Some(n)
        }
        IpNetwork::V6(n) => {
            local.network6.is_some_and(|net| net.is_supernet_of(n)) && local.own.ipv6 != Some(n)
        }
    };
    let ours = r
        .oif
        .is_some_and(|o| Some(o) == local.dev4 || Some(o) == local.dev6)
        || (r.oif == Some(local.ext_index) && r.gw.is_some());
    inside && ours
}

/// Entries of a desired or an actual table, by reference: at thousands of nodes a copy of
/// each entry to write would cost as much as the table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EntryRefs<'a> {
    pub routes: Vec<&'a Route>,
    pub neighbours: Vec<&'a Neighbour>,
    pub fdb: Vec<&'a FdbEntry>,
}

impl EntryRefs<'_> {
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty() && self.neighbours.is_empty() && self.fdb.is_empty()
    }
}

/// What to write (from `want`) and what to remove (from `have`) so that `have` becomes
/// `want`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan<'a> {
    pub put: EntryRefs<'a>,
    pub remove: EntryRefs<'a>,
}

impl Plan<'_> {
    pub fn is_empty(&self) -> bool {
        self.put.is_empty() && self.remove.is_empty()
    }
}

/// The difference; entries already right are in neither list.
pub fn diff<'a>(want: &'a Entries, have: &'a Entries) -> Plan<'a> {
    let mut plan = Plan::default();
    let have_routes: HashSet<&Route> = have.routes.iter().collect();
    let want_dsts: HashSet<(IpNetwork, u32)> =
        want.routes.iter().map(|r| (r.dst, r.table)).collect();
    let want_routes: HashSet<&Route> = want.routes.iter().collect();
    plan.put.routes = want
        .routes
        .iter()
        .filter(|r| !have_routes.contains(r))
        .collect();
    // A wrong route to a wanted destination is replaced in place, not removed.
    let replaced: HashSet<(IpNetwork, u32)> =
        plan.put.routes.iter().map(|r| (r.dst, r.table)).collect();
    plan.remove.routes = have
        .routes
        .iter()
        .filter(|r| !want_routes.contains(r))
        .filter(|r| !want_dsts.contains(&(r.dst, r.table)) || !replaced.contains(&(r.dst, r.table)))
        .collect();

    let have_n: BTreeMap<(u32, IpAddr), &Neighbour> = have
        .neighbours
        .iter()
        .map(|n| ((n.device, n.ip), n))
        .collect();
    let want_n: BTreeMap<(u32, IpAddr), &Neighbour> = want
        .neighbours
        .iter()
        .map(|n| ((n.device, n.ip), n))
        .collect();
    plan.put.neighbours = want_n
        .iter()
        .filter(|(k, n)| have_n.get(k).is_none_or(|h| h.mac != n.mac || !h.permanent))
        .map(|(_, n)| *n)
        .collect();
    plan.remove.neighbours = have_n
        .iter()
        .filter(|(k, _)| !want_n.contains_key(k))
        .map(|(_, n)| *n)
        .collect();

    let have_f: BTreeMap<(u32, [u8; 6]), &FdbEntry> =
        have.fdb.iter().map(|f| ((f.device, f.mac), f)).collect();
    let want_f: BTreeMap<(u32, [u8; 6]), &FdbEntry> =
        want.fdb.iter().map(|f| ((f.device, f.mac), f)).collect();
    for (k, f) in &want_f {
        match have_f.get(k) {
            Some(h) if h.dst == f.dst => {}
            Some(h) => {
                // An entry towards the wrong node goes before the right one is written.
                plan.remove.fdb.push(*h);
                plan.put.fdb.push(*f);
            }
            None => plan.put.fdb.push(*f),
        }
    }
    plan.remove.fdb.extend(
        have_f
            .iter()
            .filter(|(k, _)| !want_f.contains_key(k))
            .map(|(_, f)| *f),
    );
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::mode::VxlanParams;
    use crate::lease::LeaseAttrs;

    fn vx(direct: bool) -> Mode {
        Mode::Vxlan(VxlanParams {
            vni: 1,
            port: 8472,
            mtu: None,
            gbp: false,
            learning: false,
            direct_routing: direct,
        })
    }

    fn local(mode: Mode) -> Local {
        Local {
            backend_type: match mode {
                Mode::HostGw => "host-gw".into(),
                _ => "vxlan".into(),
            },
            mode,
            own: SubnetKey::parse("10.5.1.0-24&fc00:0:0:1::-64").unwrap(),
            network4: "10.5.0.0/16".parse().ok(),
            network6: "fc00::/48".parse().ok(),
            ext_index: 2,
            ext_nets: vec!["192.168.0.1/24".parse().unwrap()],
            dev4: Some(10),
            dev6: Some(11),
        }
    }

    fn lease(key: &str, ip: &str, ty: &str, mac: Option<&str>) -> Lease {
        let data =
            mac.map(|m| RawValue::from_string(format!(r#"{{"VNI":1,"VtepMAC":"{m}"}}"#)).unwrap());
        Lease {
            key: SubnetKey::parse(key).unwrap(),
            attrs: LeaseAttrs {
                public_ip: ip.parse().ok(),
                public_ipv6: None,
                backend_type: ty.into(),
                backend_data: data,
                backend_v6_data: None,
            },
        }
    }

    const MAC: [u8; 6] = [0xc6, 0xd2, 0x32, 0x6f, 0x8f, 0x44];

    #[test]
    fn vxlan_gives_a_route_a_neighbour_and_an_fdb_entry_per_node() {
        let l = local(vx(false));
        let d = desired(
            &l,
            &[lease(
                "10.5.2.0-24",
                "192.168.0.2",
                "vxlan",
                Some("c6:d2:32:6f:8f:44"),
            )],
        );
        let sn: IpNetwork = "10.5.2.0/24".parse().unwrap();
        let gw: IpAddr = "10.5.2.0".parse().unwrap();
        assert_eq!(
            d.entries.routes,
            vec![Route::new(sn, Some(gw), Some(10)).onlink()]
        );
        assert_eq!(
            d.entries.neighbours,
            vec![Neighbour::permanent(10, gw, MAC)]
        );
        assert_eq!(
            d.entries.fdb,
            vec![FdbEntry::permanent(10, MAC, "192.168.0.2".parse().unwrap())]
        );
        assert!(d.skipped.is_empty());
    }

    #[test]
    fn direct_routing_takes_a_plain_route_to_nodes_on_the_same_link() {
        let l = local(vx(true));
        let d = desired(
            &l,
            &[
                lease(
                    "10.5.2.0-24",
                    "192.168.0.2",
                    "vxlan",
                    Some("c6:d2:32:6f:8f:44"),
                ),
                lease(
                    "10.5.3.0-24",
                    "172.16.0.3",
                    "vxlan",
                    Some("c6:d2:32:6f:8f:45"),
                ),
            ],
        );
        assert_eq!(d.entries.routes.len(), 2);
        assert_eq!(
            d.entries.routes[0],
            Route::new(
                "10.5.2.0/24".parse().unwrap(),
                "192.168.0.2".parse().ok(),
                Some(2)
            )
        );
        assert!(d.entries.routes[1].onlink);
        assert_eq!((d.entries.neighbours.len(), d.entries.fdb.len()), (1, 1));
    }

    #[test]
    fn host_gw_routes_via_the_public_address() {
        let l = local(Mode::HostGw);
        let d = desired(&l, &[lease("10.5.2.0-24", "192.168.0.2", "host-gw", None)]);
        assert_eq!(
            d.entries.routes,
            vec![Route::new(
                "10.5.2.0/24".parse().unwrap(),
                "192.168.0.2".parse().ok(),
                Some(2)
            )]
        );
        assert!(d.entries.neighbours.is_empty() && d.entries.fdb.is_empty());
    }

    #[test]
    fn leases_of_another_backend_or_without_a_vtep_mac_are_skipped_and_own_lease_ignored() {
        let l = local(vx(false));
        let d = desired(
            &l,
            &[
                lease("10.5.2.0-24", "192.168.0.2", "host-gw", None),
                lease("10.5.3.0-24", "192.168.0.3", "vxlan", None),
                lease(
                    "10.5.1.0-24&fc00:0:0:1::-64",
                    "192.168.0.1",
                    "vxlan",
                    Some("c6:d2:32:6f:8f:44"),
                ),
            ],
        );
        assert_eq!(d.entries, Entries::default());
        assert_eq!(d.skipped.len(), 2);
        assert!(d.skipped[0].1.contains("host-gw"));
        assert!(d.skipped[1].1.contains("VtepMAC"));
    }

    #[test]
    fn dual_stack_programs_both_devices() {
        let l = local(vx(false));
        let mut le = lease(
            "10.5.2.0-24&fc00:0:0:2::-64",
            "192.168.0.2",
            "vxlan",
            Some("c6:d2:32:6f:8f:44"),
        );
        le.attrs.public_ipv6 = "fd00::2".parse().ok();
        le.attrs.backend_v6_data = Some(
            RawValue::from_string(r#"{"VNI":1,"VtepMAC":"c6:d2:32:6f:8f:46"}"#.into()).unwrap(),
        );
        let d = desired(&l, &[le]);
        assert_eq!(d.entries.routes.len(), 2);
        assert_eq!(d.entries.routes[1].oif, Some(11));
        assert_eq!(d.entries.fdb[1].dst, "fd00::2".parse().ok());
        assert_eq!(d.entries.neighbours[1].mac[5], 0x46);
    }

    #[test]
    fn only_routes_into_the_network_through_our_devices_are_owned() {
        let l = local(vx(false));
        let r = |dst: &str, gw: Option<&str>, oif: u32| {
            Route::new(
                dst.parse().unwrap(),
                gw.and_then(|g| g.parse().ok()),
                Some(oif),
            )
        };
        assert!(owns_route(&l, &r("10.5.2.0/24", Some("10.5.2.0"), 10)));
        assert!(owns_route(&l, &r("10.5.2.0/24", Some("192.168.0.2"), 2)));
        assert!(
            !owns_route(&l, &r("10.5.1.0/24", None, 5)),
            "own subnet (cni0)"
        );
        assert!(
            !owns_route(&l, &r("10.5.1.0/24", Some("10.5.1.0"), 10)),
            "own subnet"
        );
        assert!(
            !owns_route(&l, &r("192.168.0.0/24", None, 2)),
            "outside the network"
        );
        assert!(
            !owns_route(&l, &r("10.5.9.0/24", None, 2)),
            "no gateway on the external link"
        );
        assert!(
            !owns_route(&l, &r("10.5.9.0/24", Some("10.0.0.1"), 7)),
            "another device"
        );
    }

    #[test]
    fn the_diff_writes_what_is_missing_or_wrong_and_removes_what_is_not_wanted() {
        let l = local(vx(false));
        let want = desired(
            &l,
            &[
                lease(
                    "10.5.2.0-24",
                    "192.168.0.2",
                    "vxlan",
                    Some("c6:d2:32:6f:8f:44"),
                ),
                lease(
                    "10.5.3.0-24",
                    "192.168.0.3",
                    "vxlan",
                    Some("c6:d2:32:6f:8f:45"),
                ),
            ],
        )
        .entries;
        // Right as it is: nothing to do.
        assert!(diff(&want, &want).is_empty());
        // Node 3 changed its VtepMAC; a stale node 9 is still programmed.
        let mut have = want.clone();
        have.neighbours[1].mac = vec![1, 2, 3, 4, 5, 6];
        have.fdb[1].mac = [1, 2, 3, 4, 5, 6];
        let gw9: IpAddr = "10.5.9.0".parse().unwrap();
        have.routes
            .push(Route::new("10.5.9.0/24".parse().unwrap(), Some(gw9), Some(10)).onlink());
        have.neighbours.push(Neighbour::permanent(10, gw9, [9; 6]));
        // Node 2's route was changed by hand.
        have.routes[0].onlink = false;
        let plan = diff(&want, &have);
        assert_eq!(plan.put.routes, vec![&want.routes[0]]);
        assert_eq!(plan.remove.routes.len(), 1);
        assert_eq!(plan.remove.routes[0].dst.to_string(), "10.5.9.0/24");
        assert_eq!(plan.put.neighbours, vec![&want.neighbours[1]]);
        assert_eq!(plan.remove.neighbours.len(), 1);
        assert_eq!(plan.put.fdb, vec![&want.fdb[1]]);
        assert_eq!(plan.remove.fdb[0].mac, [1, 2, 3, 4, 5, 6]);
        // An FDB entry towards the wrong node is removed and written again.
        let mut have = want.clone();
        have.fdb[0].dst = "192.168.0.99".parse().ok();
        let plan = diff(&want, &have);
        assert_eq!((plan.put.fdb.len(), plan.remove.fdb.len()), (1, 1));
    }
}
