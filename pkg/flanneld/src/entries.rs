//! The kernel entries the datapath keeps for the other nodes (routes, neighbours, FDB entries,
//! nexthop objects), how a backend asks for them, and the difference between what is wanted and what the kernel
//! holds: pure, so that start, restart, repair, normal operation and `flanneld doctor` are one
//! computation.
//!
//! Each kind of entry says how it is keyed, when a held entry is the wanted one and how `doctor`
//! shows it ([`Kind`]), and a kind of the kernel's tables how it is written and removed
//! ([`Written`]); the diff, the write order and the doctor's findings are written once over
//! any kind. A new kind is a field of [`Entries`] and of [`Plan`], an impl of [`Kind`], and a
//! line in [`diff`], [`Plan::writes`] (its place in the order), [`Plan::counts`] and
//! [`findings`]. What a device holds per peer itself (WireGuard's peers) is one kind for every
//! backend type ([`PeerEntry`]), written through the device.

use crate::report::Finding;
use cni_kernel::netlink::{format_mac, FdbEntry, Neighbour, Nexthop, Route, Write, PROTOCOL_BOOT};
use ipnetwork::IpNetwork;
use std::any::Any;
use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::fmt::{self, Write as _};
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::Arc;

/// The entries of a desired or an actual table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Entries {
    pub routes: Vec<Route>,
    pub neighbours: Vec<Neighbour>,
    pub fdb: Vec<FdbEntry>,
    pub nexthops: Vec<Nexthop>,
    /// What the devices hold per peer themselves.
    pub peers: Vec<PeerEntry>,
}

/// One peer's state that a device holds itself (WireGuard: the peer of a public key, with its
/// endpoint, allowed IPs, keepalive), as a backend wants it ([`Want::device_peer`]) or a
/// device holds it (`backend::api::Device::inspect`). The datapath plane diffs wanted against
/// held by key, as it diffs neighbours and routes, and shows each in `doctor`.
pub trait DevicePeer: Send + Sync + fmt::Debug + 'static {
    /// What the device holds at most one of (WireGuard: the public key).
    fn key(&self) -> String;

    /// Whether `held`, held under this one's key, is this one as far as it matters.
    fn fits(&self, held: &dyn DevicePeer) -> bool;

    /// How `doctor` shows it.
    fn show(&self) -> String;

    /// For `fits`, to see `held` as the backend's own type.
    fn as_any(&self) -> &dyn Any;
}

/// One peer's state in the device `device` (an index, as a neighbour's).
#[derive(Debug, Clone)]
pub struct PeerEntry {
    pub device: u32,
    pub peer: Arc<dyn DevicePeer>,
}

impl PartialEq for PeerEntry {
    fn eq(&self, other: &PeerEntry) -> bool {
        self.device == other.device
            && self.peer.key() == other.peer.key()
            && self.peer.fits(other.peer.as_ref())
    }
}

impl Eq for PeerEntry {}

/// How the datapath programs a path to another node's subnet; backends say where the path
/// goes ([`Hop`]), the style says which kernel entries make it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RouteStyle {
    /// One route per subnet with its gateway and device.
    #[default]
    Plain,
    /// A nexthop object per path (the gateway and the device) and a route to the subnet
    /// through it. The kernel hashes such a route by the nexthop's id, so N of them cost N to
    /// program, where plain routes through one device cost N² (each is compared with every
    /// earlier one of the same device).
    Nexthop,
}

impl RouteStyle {
    pub fn name(self) -> &'static str {
        match self {
            RouteStyle::Plain => "plain",
            RouteStyle::Nexthop => "nexthop",
        }
    }
}

/// The first id of the nexthops of IPv4 paths: subnet n of the network (counting from the
/// network's first subnet) goes through nexthop `NEXTHOP_IDS_V4 + n`.
pub const NEXTHOP_IDS_V4: u32 = 4_000_000_000;
/// The first id of the nexthops of IPv6 paths, likewise.
pub const NEXTHOP_IDS_V6: u32 = 4_100_000_000;
/// How many ids each family has.
const IDS_PER_FAMILY: u32 = 100_000_000;

/// Whether `id` is in the ranges this daemon gives its nexthops.
pub fn is_our_nexthop_id(id: u32) -> bool {
    (NEXTHOP_IDS_V4..NEXTHOP_IDS_V6 + IDS_PER_FAMILY).contains(&id)
}

/// Whether a nexthop the kernel holds is this daemon's: an id of its ranges and the protocol
/// it marks its routes with. Any other is another program's and never touched.
pub fn owns_nexthop(nh: &Nexthop) -> bool {
    is_our_nexthop_id(nh.id) && nh.protocol == PROTOCOL_BOOT
}

/// The id of the nexthop of the path to `subnet` of `network`: the same in every life of the
/// daemon, and readable (`ip nexthop` shows 4000000258 for 10.1.2.0/24 of 10.0.0.0/8). None
/// when the subnet is not in the network or its number does not fit the family's range.
pub fn nexthop_id(network: IpNetwork, subnet: IpNetwork) -> Option<u32> {
    let (base, bits, net, sub) = match (network, subnet) {
        (IpNetwork::V4(n), IpNetwork::V4(s)) => (
            NEXTHOP_IDS_V4,
            32,
            u128::from(u32::from(n.network())),
            u128::from(u32::from(s.network())),
        ),
        (IpNetwork::V6(n), IpNetwork::V6(s)) => (
            NEXTHOP_IDS_V6,
            128,
            u128::from(n.network()),
            u128::from(s.network()),
        ),
        _ => return None,
    };
    if subnet.prefix() < network.prefix() || !network.contains(subnet.network()) {
        return None;
    }
    let n = (sub - net).checked_shr(bits - u32::from(subnet.prefix()))?;
    u32::try_from(n)
        .ok()
        .filter(|n| *n < IDS_PER_FAMILY)
        .map(|n| base + n)
}

/// What nexthop ids a computation of the wanted entries may give: each family's network, and
/// the ids another program's nexthops hold. A path that gets no id (its id taken, or given
/// already to a subnet of another length) gets a plain route.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NexthopIds {
    networks: Vec<IpNetwork>,
    taken: HashSet<u32>,
    given: HashSet<u32>,
}

impl NexthopIds {
    pub fn new(networks: Vec<IpNetwork>, taken: HashSet<u32>) -> NexthopIds {
        NexthopIds {
            networks,
            taken,
            given: HashSet::new(),
        }
    }

    fn give(&mut self, subnet: IpNetwork) -> Option<u32> {
        let id = self.networks.iter().find_map(|n| nexthop_id(*n, subnet))?;
        (!self.taken.contains(&id) && self.given.insert(id)).then_some(id)
    }
}

/// A path to another node's subnet: through `gw` on the device `dev`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hop {
    pub dst: IpNetwork,
    pub gw: IpAddr,
    pub dev: u32,
    /// Reach `gw` on `dev` even though no route says it is there (an overlay's peers).
    pub onlink: bool,
}

/// What the other nodes' leases call for, as the backends add it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Want {
    pub entries: Entries,
    style: RouteStyle,
    ids: NexthopIds,
}

impl Want {
    /// Room for `peers` routes (and nexthops), and for as many neighbours and FDB entries when
    /// the backend has devices: at thousands of leases, growing by doubling would hold up to
    /// twice the room.
    pub fn new(style: RouteStyle, ids: NexthopIds, peers: usize, devices: bool) -> Want {
        let mut entries = Entries::default();
        entries.routes.reserve_exact(peers);
        if style == RouteStyle::Nexthop {
            entries.nexthops.reserve_exact(peers);
        }
        if devices {
            entries.neighbours.reserve_exact(peers);
            entries.fdb.reserve_exact(peers);
        }
        Want {
            entries,
            style,
            ids,
        }
    }

    /// The path to a subnet, as the route style programs it.
    pub fn route(&mut self, hop: Hop) {
        let id = match self.style {
            RouteStyle::Plain => None,
            RouteStyle::Nexthop => self.ids.give(hop.dst),
        };
        match id {
            Some(id) => {
                self.entries.nexthops.push(Nexthop {
                    id,
                    gateway: hop.gw,
                    device: hop.dev,
                    onlink: hop.onlink,
                    protocol: PROTOCOL_BOOT,
                });
                self.entries.routes.push(Route::via_nexthop(hop.dst, id));
            }
            None => {
                let route = Route::new(hop.dst, Some(hop.gw), Some(hop.dev));
                self.entries
                    .routes
                    .push(if hop.onlink { route.onlink() } else { route });
            }
        }
    }

    pub fn neighbour(&mut self, n: Neighbour) {
        self.entries.neighbours.push(n);
    }

    pub fn fdb(&mut self, f: FdbEntry) {
        self.entries.fdb.push(f);
    }

    /// A peer's state that the device `device` holds itself.
    pub fn device_peer(&mut self, device: u32, peer: Arc<dyn DevicePeer>) {
        self.entries.peers.push(PeerEntry { device, peer });
    }
}

/// Device names for showing entries (`dev flannel.1`); an index it does not know shows as
/// `#<index>`.
pub trait Names {
    fn name(&self, index: u32) -> String;
}

impl<F: Fn(u32) -> Option<String>> Names for F {
    fn name(&self, index: u32) -> String {
        self(index).unwrap_or_else(|| format!("#{index}"))
    }
}

/// One kind of entry the datapath keeps.
pub trait Kind: PartialEq + fmt::Debug {
    /// How `flanneld doctor` names the kind.
    const NAME: &'static str;
    /// Whether writing an entry replaces whatever the kernel holds under its key; when not
    /// (an FDB entry is appended), a wrong one is removed before the right one is written.
    const SET_REPLACES: bool;
    type Key: Hash + Eq;

    /// What the kernel holds at most one of (in the usual case).
    fn key(&self) -> Self::Key;
    /// Whether `have`, held under this entry's key, is this entry as far as it matters.
    fn fits(&self, have: &Self) -> bool;
    fn show(&self, names: &dyn Names) -> String;
}

/// A kind of the kernel's tables: written and removed through netlink, in one batch.
pub trait Written: Kind {
    fn set(&self) -> Write<'_>;
    fn delete(&self) -> Write<'_>;
}

impl Written for Route {
    fn set(&self) -> Write<'_> {
        Write::SetRoute(self)
    }

    fn delete(&self) -> Write<'_> {
        Write::DeleteRoute(self)
    }
}

impl Kind for Route {
    const NAME: &'static str = "route";
    const SET_REPLACES: bool = true;
    type Key = (IpNetwork, u32);

    fn key(&self) -> Self::Key {
        (self.dst, self.table)
    }

    fn fits(&self, have: &Route) -> bool {
        self == have
    }

    fn show(&self, names: &dyn Names) -> String {
        let mut s = self.dst.to_string();
        if let Some(id) = self.nhid {
            let _ = write!(s, " nhid {id}");
        }
        if let Some(gw) = self.gw {
            let _ = write!(s, " via {gw}");
        }
        if let Some(o) = self.oif {
            let _ = write!(s, " dev {}", names.name(o));
        }
        if self.onlink {
            s.push_str(" onlink");
        }
        s
    }
}

impl Written for Neighbour {
    fn set(&self) -> Write<'_> {
        Write::SetNeighbour(self)
    }

    fn delete(&self) -> Write<'_> {
        Write::DeleteNeighbour(self)
    }
}

impl Kind for Neighbour {
    const NAME: &'static str = "neighbour";
    const SET_REPLACES: bool = true;
    type Key = (u32, IpAddr);

    fn key(&self) -> Self::Key {
        (self.device, self.ip)
    }

    fn fits(&self, have: &Neighbour) -> bool {
        have.mac == self.mac && have.permanent
    }

    fn show(&self, _: &dyn Names) -> String {
        format!("{} lladdr {}", self.ip, format_mac(&self.mac))
    }
}

impl Written for FdbEntry {
    fn set(&self) -> Write<'_> {
        Write::SetFdb(self)
    }

    fn delete(&self) -> Write<'_> {
        Write::DeleteFdb(self)
    }
}

impl Kind for FdbEntry {
    const NAME: &'static str = "fdb";
    const SET_REPLACES: bool = false;
    type Key = (u32, [u8; 6]);

    fn key(&self) -> Self::Key {
        (self.device, self.mac)
    }

    fn fits(&self, have: &FdbEntry) -> bool {
        have.dst == self.dst
    }

    fn show(&self, _: &dyn Names) -> String {
        let dst = self.dst.map(|d| d.to_string()).unwrap_or_default();
        format!("{} dst {dst}", format_mac(&self.mac))
    }
}

impl Written for Nexthop {
    fn set(&self) -> Write<'_> {
        Write::SetNexthop(self)
    }

    fn delete(&self) -> Write<'_> {
        Write::DeleteNexthop(self.id)
    }
}

impl Kind for Nexthop {
    const NAME: &'static str = "nexthop";
    const SET_REPLACES: bool = true;
    type Key = u32;

    fn key(&self) -> Self::Key {
        self.id
    }

    fn fits(&self, have: &Nexthop) -> bool {
        self == have
    }

    fn show(&self, names: &dyn Names) -> String {
        format!(
            "id {} via {} dev {}{}",
            self.id,
            self.gateway,
            names.name(self.device),
            if self.onlink { " onlink" } else { "" }
        )
    }
}

impl Kind for PeerEntry {
    const NAME: &'static str = "peer";
    const SET_REPLACES: bool = true;
    type Key = (u32, String);

    fn key(&self) -> Self::Key {
        (self.device, self.peer.key())
    }

    fn fits(&self, have: &PeerEntry) -> bool {
        self.peer.fits(have.peer.as_ref())
    }

    fn show(&self, names: &dyn Names) -> String {
        format!("{} dev {}", self.peer.show(), names.name(self.device))
    }
}

/// What to write (from the wanted entries) and what to remove (from the held ones) of one
/// kind, by reference: at thousands of nodes a copy of each entry would cost as much as the
/// table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KindPlan<'a, T> {
    pub put: Vec<&'a T>,
    pub remove: Vec<&'a T>,
}

impl<T> Default for KindPlan<'_, T> {
    fn default() -> Self {
        KindPlan {
            put: Vec::new(),
            remove: Vec::new(),
        }
    }
}

impl<T> KindPlan<'_, T> {
    pub fn is_empty(&self) -> bool {
        self.put.is_empty() && self.remove.is_empty()
    }
}

/// The difference in one kind; entries already right are in neither list. Of two wanted
/// entries with one key the last is wanted. A wrong entry under a wanted key is replaced in
/// place where the kind allows it, else removed first; a held entry under a key nobody wants,
/// or beside the right one under its key, is removed.
pub fn diff_kind<'a, T: Kind>(want: &'a [T], have: &'a [T]) -> KindPlan<'a, T> {
    // Per wanted key: its last wanted entry and what the kernel holds under it (nearly always
    // one entry, so the others are in a Vec that is empty, unallocated, almost everywhere).
    // One table looked up three times per entry: at 50,000 nodes the table is the diff's cost.
    struct Slot<'a, T> {
        want: &'a T,
        held: Option<&'a T>,
        more: Vec<&'a T>,
    }
    let mut slots: HashMap<T::Key, Slot<'a, T>> = HashMap::with_capacity(want.len());
    for w in want {
        match slots.entry(w.key()) {
            Entry::Occupied(mut e) => e.get_mut().want = w,
            Entry::Vacant(e) => {
                e.insert(Slot {
                    want: w,
                    held: None,
                    more: Vec::new(),
                });
            }
        }
    }
    let mut plan = KindPlan::default();
    for h in have {
        match slots.get_mut(&h.key()) {
            None => plan.remove.push(h),
            Some(s) if s.held.is_none() => s.held = Some(h),
            Some(s) => s.more.push(h),
        }
    }
    for w in want {
        let Some(slot) = slots.get(&w.key()).filter(|s| std::ptr::eq(s.want, w)) else {
            continue;
        };
        let held = || slot.held.into_iter().chain(slot.more.iter().copied());
        if held().any(|h| w.fits(h)) {
            plan.remove.extend(held().filter(|h| !w.fits(h)));
        } else {
            if !T::SET_REPLACES {
                plan.remove.extend(held());
            }
            plan.put.push(w);
        }
    }
    plan
}

/// What one look at the datapath's entries found to write and to remove.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan<'a> {
    pub routes: KindPlan<'a, Route>,
    pub neighbours: KindPlan<'a, Neighbour>,
    pub fdb: KindPlan<'a, FdbEntry>,
    pub nexthops: KindPlan<'a, Nexthop>,
    /// Written through their devices, not in the batch.
    pub peers: KindPlan<'a, PeerEntry>,
}

/// The difference between what is wanted and what the kernel holds, kind by kind.
pub fn diff<'a>(want: &'a Entries, have: &'a Entries) -> Plan<'a> {
    Plan {
        routes: diff_kind(&want.routes, &have.routes),
        neighbours: diff_kind(&want.neighbours, &have.neighbours),
        fdb: diff_kind(&want.fdb, &have.fdb),
        nexthops: diff_kind(&want.nexthops, &have.nexthops),
        peers: diff_kind(&want.peers, &have.peers),
    }
}

impl<'a> Plan<'a> {
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
            && self.neighbours.is_empty()
            && self.fdb.is_empty()
            && self.nexthops.is_empty()
            && self.peers.is_empty()
    }

    /// The writes in the order the kernel must take them, all in one batch: removals first (a
    /// wrong FDB entry goes before the right one is written), then the neighbours, FDB entries
    /// and nexthops before the routes that use them, and the nexthops nobody wants last. A
    /// nexthop goes after every route through it is removed or replaced: deleted earlier it
    /// would take a replaced route with it until the replacement is written (a switch of route
    /// style would drop traffic), and the kernel finds the routes it takes by walking its whole
    /// table. Only unwanted ids are removed (a wrong nexthop is replaced in place), so no
    /// route written here goes through one.
    pub fn writes(&self) -> Vec<Write<'a>> {
        let removals = (self.routes.remove.iter().map(|e| e.delete()))
            .chain(self.neighbours.remove.iter().map(|e| e.delete()))
            .chain(self.fdb.remove.iter().map(|e| e.delete()));
        let puts = (self.neighbours.put.iter().map(|e| e.set()))
            .chain(self.fdb.put.iter().map(|e| e.set()))
            .chain(self.nexthops.put.iter().map(|e| e.set()))
            .chain(self.routes.put.iter().map(|e| e.set()));
        let unwanted = self.nexthops.remove.iter().map(|e| e.delete());
        removals.chain(puts).chain(unwanted).collect()
    }

    /// Per kind (routes, neighbours, FDB entries, nexthops, device peers): how many it writes,
    /// and how many it removes.
    pub fn counts(&self) -> ([usize; 5], [usize; 5]) {
        (
            [
                self.routes.put.len(),
                self.neighbours.put.len(),
                self.fdb.put.len(),
                self.nexthops.put.len(),
                self.peers.put.len(),
            ],
            [
                self.routes.remove.len(),
                self.neighbours.remove.len(),
                self.fdb.remove.len(),
                self.nexthops.remove.len(),
                self.peers.remove.len(),
            ],
        )
    }
}

/// A write as its failure is logged, devices by name: `10.5.2.0/24 via 10.5.2.0 dev flannel.1
/// onlink`, `10.5.2.0 lladdr c6:d2:32:6f:8f:44 dev flannel.1`.
pub fn show_write(w: &Write<'_>, names: &dyn Names) -> String {
    match *w {
        Write::SetRoute(r) | Write::DeleteRoute(r) => r.show(names),
        Write::SetNeighbour(n) | Write::DeleteNeighbour(n) => {
            format!("{} dev {}", n.show(names), names.name(n.device))
        }
        Write::SetFdb(e) | Write::DeleteFdb(e) => {
            format!("{} dev {}", e.show(names), names.name(e.device))
        }
        Write::SetNexthop(nh) => nh.show(names),
        Write::DeleteNexthop(id) => format!("id {id}"),
    }
}

/// One kind as `flanneld doctor` reports it: each wanted entry ok, missing or wrong (the plan
/// writes it: `wrong` when something is held under its key), each held entry the plan
/// removes for no wanted entry of its key extra.
pub fn findings_kind<T: Kind>(
    want: &[T],
    have: &[T],
    plan: &KindPlan<'_, T>,
    names: &dyn Names,
) -> Vec<Finding> {
    let put: HashSet<T::Key> = plan.put.iter().map(|e| e.key()).collect();
    let held: HashSet<T::Key> = have.iter().map(|e| e.key()).collect();
    let mut out: Vec<Finding> = want
        .iter()
        .map(|w| {
            let k = w.key();
            let state = if !put.contains(&k) {
                "ok"
            } else if held.contains(&k) {
                "wrong"
            } else {
                "missing"
            };
            Finding::new(T::NAME, state, w.show(names))
        })
        .collect();
    out.extend(
        plan.remove
            .iter()
            .filter(|r| !put.contains(&r.key()))
            .map(|r| Finding::new(T::NAME, "extra", r.show(names))),
    );
    out
}

/// Every kind as `flanneld doctor` reports it: nexthops, routes, neighbours, FDB entries,
/// device peers.
pub fn findings(want: &Entries, have: &Entries, names: &dyn Names) -> Vec<Finding> {
    let plan = diff(want, have);
    let mut out = findings_kind(&want.nexthops, &have.nexthops, &plan.nexthops, names);
    out.extend(findings_kind(
        &want.routes,
        &have.routes,
        &plan.routes,
        names,
    ));
    out.extend(findings_kind(
        &want.neighbours,
        &have.neighbours,
        &plan.neighbours,
        names,
    ));
    out.extend(findings_kind(&want.fdb, &have.fdb, &plan.fdb, names));
    out.extend(findings_kind(&want.peers, &have.peers, &plan.peers, names));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: [u8; 6] = [0xc6, 0xd2, 0x32, 0x6f, 0x8f, 0x44];

    fn names(i: u32) -> Option<String> {
        (i == 10).then(|| "flannel.1".to_string())
    }

    fn table() -> Entries {
        let mut want = Want::new(RouteStyle::Plain, NexthopIds::default(), 2, true);
        for (i, node) in [(2u8, MAC), (3, [1, 2, 3, 4, 5, 7])] {
            let gw: IpAddr = format!("10.5.{i}.0").parse().unwrap();
            want.route(Hop {
                dst: format!("10.5.{i}.0/24").parse().unwrap(),
                gw,
                dev: 10,
                onlink: true,
            });
            want.neighbour(Neighbour::permanent(10, gw, node));
            want.fdb(FdbEntry::permanent(
                10,
                node,
                format!("192.168.0.{i}").parse().unwrap(),
            ));
        }
        want.entries
    }

    #[test]
    fn the_plain_style_makes_one_route_per_hop() {
        let mut want = Want::new(RouteStyle::Plain, NexthopIds::default(), 1, false);
        let hop = Hop {
            dst: "10.5.2.0/24".parse().unwrap(),
            gw: "192.168.0.2".parse().unwrap(),
            dev: 2,
            onlink: false,
        };
        want.route(hop);
        want.route(Hop {
            onlink: true,
            ..hop
        });
        assert_eq!(
            want.entries.routes,
            [
                Route::new(hop.dst, Some(hop.gw), Some(2)),
                Route::new(hop.dst, Some(hop.gw), Some(2)).onlink()
            ]
        );
    }

    fn nexthop_want(taken: &[u32]) -> Want {
        let ids = NexthopIds::new(
            vec!["10.0.0.0/8".parse().unwrap(), "fc00::/48".parse().unwrap()],
            taken.iter().copied().collect(),
        );
        Want::new(RouteStyle::Nexthop, ids, 4, false)
    }

    #[test]
    fn nexthop_ids_count_the_subnets_of_the_network_per_family() {
        let id = |n: &str, s: &str| nexthop_id(n.parse().unwrap(), s.parse().unwrap());
        assert_eq!(id("10.0.0.0/8", "10.0.0.0/24"), Some(4_000_000_000));
        assert_eq!(id("10.0.0.0/8", "10.1.2.0/24"), Some(4_000_000_258));
        assert_eq!(id("10.9.0.0/16", "10.9.3.0/24"), Some(4_000_000_003));
        assert_eq!(id("10.9.0.0/16", "10.9.3.64/26"), Some(4_000_000_013));
        assert_eq!(id("fc00::/48", "fc00:0:0:3::/64"), Some(4_100_000_003));
        assert_eq!(
            id("fc00::/48", "fc00:0:0:ffff::/64"),
            Some(4_100_000_000 + 0xffff)
        );
        // Outside the network, of the other family, wider than it, or past the range.
        assert_eq!(id("10.9.0.0/16", "10.10.3.0/24"), None);
        assert_eq!(id("10.9.0.0/16", "fc00::/64"), None);
        assert_eq!(id("10.9.0.0/16", "10.0.0.0/8"), None);
        assert_eq!(id("fc00::/16", "fc00:ffff:ffff:ffff::/64"), None);
        assert_eq!(id("0.0.0.0/0", "0.0.0.0/0"), Some(4_000_000_000));
        for ours in [4_000_000_000, 4_099_999_999, 4_100_000_000, 4_199_999_999] {
            assert!(is_our_nexthop_id(ours), "{ours}");
        }
        for other in [1, 3_999_999_999, 4_200_000_000, u32::MAX] {
            assert!(!is_our_nexthop_id(other), "{other}");
        }
        let mut nh = Nexthop::onlink(4_000_000_003, "10.9.3.0".parse().unwrap(), 3);
        assert!(owns_nexthop(&nh));
        nh.protocol = 0;
        assert!(!owns_nexthop(&nh), "one `ip nexthop add` made");
    }

    #[test]
    fn the_nexthop_style_makes_a_nexthop_and_a_route_through_it_per_hop() {
        let mut want = nexthop_want(&[]);
        let hop = Hop {
            dst: "10.5.2.0/24".parse().unwrap(),
            gw: "10.5.2.0".parse().unwrap(),
            dev: 10,
            onlink: true,
        };
        want.route(hop);
        want.route(Hop {
            dst: "fc00:0:0:2::/64".parse().unwrap(),
            gw: "fd00::2".parse().unwrap(),
            dev: 2,
            onlink: false,
        });
        assert_eq!(
            want.entries.nexthops,
            [
                Nexthop::onlink(4_000_001_282, hop.gw, 10),
                Nexthop {
                    onlink: false,
                    ..Nexthop::onlink(4_100_000_002, "fd00::2".parse().unwrap(), 2)
                }
            ]
        );
        assert_eq!(
            want.entries.routes,
            [
                Route::via_nexthop(hop.dst, 4_000_001_282),
                Route::via_nexthop("fc00:0:0:2::/64".parse().unwrap(), 4_100_000_002)
            ]
        );
        assert_eq!(
            want.entries.routes[0].show(&names),
            "10.5.2.0/24 nhid 4000001282"
        );
        assert_eq!(
            want.entries.nexthops[0].show(&names),
            "id 4000001282 via 10.5.2.0 dev flannel.1 onlink"
        );
    }

    #[test]
    fn a_path_without_an_id_of_its_own_gets_a_plain_route() {
        // Another program's nexthop holds 10.5.2.0/24's id; 10.0.1.0/24 and 10.0.0.128/25 are
        // both subnet 1 of their length; 192.168.0.0/24 is in no network.
        let mut want = nexthop_want(&[4_000_001_282]);
        for dst in [
            "10.5.2.0/24",
            "10.0.1.0/24",
            "10.0.0.128/25",
            "192.168.0.0/24",
        ] {
            let dst: IpNetwork = dst.parse().unwrap();
            want.route(Hop {
                dst,
                gw: dst.ip(),
                dev: 10,
                onlink: true,
            });
        }
        let nhids: Vec<Option<u32>> = want.entries.routes.iter().map(|r| r.nhid).collect();
        assert_eq!(nhids, [None, Some(4_000_000_001), None, None]);
        assert_eq!(want.entries.nexthops.len(), 1);
        assert_eq!(
            want.entries.routes[0],
            Route::new(
                "10.5.2.0/24".parse().unwrap(),
                "10.5.2.0".parse().ok(),
                Some(10)
            )
            .onlink()
        );
    }

    #[test]
    fn a_plain_route_is_replaced_in_place_by_one_through_a_nexthop_which_is_written_first() {
        let mut plain = Want::new(RouteStyle::Plain, NexthopIds::default(), 1, false);
        let mut nexthop = nexthop_want(&[]);
        let hop = Hop {
            dst: "10.5.2.0/24".parse().unwrap(),
            gw: "192.168.0.2".parse().unwrap(),
            dev: 2,
            onlink: false,
        };
        plain.route(hop);
        nexthop.route(hop);
        // Go's flanneld's route (or ours from before) for a leased subnet.
        let plan = diff(&nexthop.entries, &plain.entries);
        assert_eq!(plan.counts(), ([1, 0, 0, 1, 0], [0, 0, 0, 0, 0]));
        let writes = plan.writes();
        assert!(matches!(writes[0], Write::SetNexthop(_)), "{writes:?}");
        assert!(matches!(writes[1], Write::SetRoute(r) if r.nhid.is_some()));
        // And back: the route is replaced in place, then the nexthop goes (deleted first, it
        // would take the route with it until the plain one is written).
        let plan = diff(&plain.entries, &nexthop.entries);
        assert_eq!(plan.counts(), ([1, 0, 0, 0, 0], [0, 0, 0, 1, 0]));
        let writes = plan.writes();
        assert!(
            matches!(writes[0], Write::SetRoute(r) if r.nhid.is_none()),
            "{writes:?}"
        );
        assert!(matches!(writes[1], Write::DeleteNexthop(4_000_001_282)));
    }

    #[test]
    fn unleased_routes_go_before_their_nexthops() {
        let mut want = nexthop_want(&[]);
        for i in [2u8, 3] {
            let dst: IpNetwork = format!("10.5.{i}.0/24").parse().unwrap();
            want.route(Hop {
                dst,
                gw: dst.ip(),
                dev: 10,
                onlink: true,
            });
        }
        let none = Entries::default();
        let plan = diff(&none, &want.entries);
        assert_eq!(plan.counts(), ([0, 0, 0, 0, 0], [2, 0, 0, 2, 0]));
        let writes = plan.writes();
        assert!(matches!(writes[0], Write::DeleteRoute(_)));
        assert!(matches!(writes[1], Write::DeleteRoute(_)));
        assert!(matches!(writes[2], Write::DeleteNexthop(_)));
        // A nexthop moved elsewhere is replaced in place: its routes stay.
        let mut have = want.entries.clone();
        have.nexthops[0].gateway = "10.5.2.1".parse().unwrap();
        let plan = diff(&want.entries, &have);
        assert_eq!(plan.counts(), ([0, 0, 0, 1, 0], [0, 0, 0, 0, 0]));
    }

    #[test]
    fn what_is_right_is_left_alone() {
        let want = table();
        assert!(diff(&want, &want).is_empty());
        assert!(diff(&Entries::default(), &Entries::default()).is_empty());
    }

    #[test]
    fn missing_wrong_and_extra_entries_are_planned() {
        let want = table();
        let mut have = want.clone();
        // Node 2's route and node 3's neighbour are gone; a stale node 9 is still there.
        have.routes.remove(0);
        have.neighbours.remove(1);
        have.routes.push(
            Route::new(
                "10.5.9.0/24".parse().unwrap(),
                "10.5.9.0".parse().ok(),
                Some(10),
            )
            .onlink(),
        );
        have.fdb.push(FdbEntry::permanent(
            10,
            [1, 2, 3, 4, 5, 6],
            "192.168.0.9".parse().unwrap(),
        ));
        let plan = diff(&want, &have);
        assert_eq!(plan.routes.put, vec![&want.routes[0]]);
        assert_eq!(plan.routes.remove.len(), 1);
        assert_eq!(plan.routes.remove[0].dst.to_string(), "10.5.9.0/24");
        assert_eq!(plan.neighbours.put, vec![&want.neighbours[1]]);
        assert!(plan.neighbours.remove.is_empty());
        assert!(plan.fdb.put.is_empty());
        assert_eq!(plan.fdb.remove[0].mac, [1, 2, 3, 4, 5, 6]);
        assert_eq!(plan.counts(), ([1, 1, 0, 0, 0], [1, 0, 1, 0, 0]));
    }

    #[test]
    fn a_changed_route_is_replaced_in_place_and_a_wrong_fdb_entry_removed_first() {
        let want = table();
        let mut have = want.clone();
        have.routes[0].onlink = false;
        have.neighbours[0].mac = vec![9; 6];
        have.fdb[0].dst = "192.168.0.99".parse().ok();
        let plan = diff(&want, &have);
        assert_eq!((plan.routes.put.len(), plan.routes.remove.len()), (1, 0));
        assert_eq!(
            (plan.neighbours.put.len(), plan.neighbours.remove.len()),
            (1, 0)
        );
        assert_eq!(plan.fdb.put, vec![&want.fdb[0]]);
        assert_eq!(plan.fdb.remove, vec![&have.fdb[0]]);
        // Removals go first, the routes last.
        let writes = plan.writes();
        assert!(matches!(writes[0], Write::DeleteFdb(_)));
        assert!(matches!(writes.last(), Some(Write::SetRoute(_))));
    }

    #[test]
    fn of_two_wanted_entries_with_one_key_the_last_is_kept_so_that_passes_agree() {
        let mut want = table();
        want.fdb[1].mac = MAC;
        let have = Entries {
            fdb: vec![want.fdb[1].clone()],
            ..want.clone()
        };
        let plan = diff(&want, &have);
        assert!(plan.fdb.is_empty(), "{plan:?}");
    }

    #[test]
    fn each_entry_is_ok_missing_wrong_or_extra_with_devices_named() {
        let want = table();
        let states = |have: &Entries| -> Vec<(String, String)> {
            findings(&want, have, &names)
                .into_iter()
                .map(|f| (f.kind, f.state))
                .collect()
        };
        let s = |k: &str, st: &str| (k.to_string(), st.to_string());
        assert!(states(&want).iter().all(|(_, st)| st == "ok"));
        let mut have = want.clone();
        have.routes.remove(0);
        have.neighbours[0].mac = vec![9; 6];
        have.fdb.push(FdbEntry::permanent(
            10,
            [7; 6],
            "192.168.0.7".parse().unwrap(),
        ));
        assert_eq!(
            states(&have),
            vec![
                s("route", "missing"),
                s("route", "ok"),
                s("neighbour", "wrong"),
                s("neighbour", "ok"),
                s("fdb", "ok"),
                s("fdb", "ok"),
                s("fdb", "extra")
            ]
        );
        let shown = findings(&want, &have, &names);
        assert_eq!(
            shown[0].detail,
            "10.5.2.0/24 via 10.5.2.0 dev flannel.1 onlink"
        );
        assert_eq!(shown[2].detail, "10.5.2.0 lladdr c6:d2:32:6f:8f:44");
        assert_eq!(shown[6].detail, "07:07:07:07:07:07 dst 192.168.0.7");
        let unknown = Route::new("10.5.2.0/24".parse().unwrap(), None, Some(3));
        assert_eq!(unknown.show(&names), "10.5.2.0/24 dev #3");
    }

    /// A device's own per-peer state, as a backend of that kind would give it: a key and a
    /// setting.
    #[derive(Debug)]
    struct TestPeer(&'static str, u16);

    impl DevicePeer for TestPeer {
        fn key(&self) -> String {
            self.0.to_string()
        }
        fn fits(&self, held: &dyn DevicePeer) -> bool {
            held.as_any()
                .downcast_ref::<TestPeer>()
                .is_some_and(|h| h.1 == self.1)
        }
        fn show(&self) -> String {
            format!("{} port {}", self.0, self.1)
        }
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
    }

    #[test]
    fn device_peers_are_diffed_by_key_and_shown_with_their_device() {
        let entry = |key, port| PeerEntry {
            device: 10,
            peer: Arc::new(TestPeer(key, port)),
        };
        let want = Entries {
            peers: vec![entry("a", 1), entry("b", 2)],
            ..Entries::default()
        };
        let have = Entries {
            peers: vec![entry("b", 3), entry("c", 4)],
            ..Entries::default()
        };
        let plan = diff(&want, &have);
        let keys = |l: &[&PeerEntry]| -> Vec<String> { l.iter().map(|p| p.peer.show()).collect() };
        assert_eq!(keys(&plan.peers.put), ["a port 1", "b port 2"]);
        assert_eq!(keys(&plan.peers.remove), ["c port 4"]);
        assert!(plan.writes().is_empty(), "peers go through their device");
        let shown: Vec<(String, String)> = findings(&want, &have, &names)
            .into_iter()
            .map(|f| (f.state, f.detail))
            .collect();
        assert_eq!(
            shown,
            [
                ("missing".to_string(), "a port 1 dev flannel.1".to_string()),
                ("wrong".to_string(), "b port 2 dev flannel.1".to_string()),
                ("extra".to_string(), "c port 4 dev flannel.1".to_string()),
            ]
        );
        assert!(diff(&want, &want).is_empty());
    }
}
