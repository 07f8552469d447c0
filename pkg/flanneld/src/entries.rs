//! The kernel entries the datapath keeps for the other nodes (routes, neighbours, FDB entries),
//! how a backend asks for them, and the difference between what is wanted and what the kernel
//! holds: pure, so that start, restart, repair, normal operation and `flanneld doctor` are one
//! computation.
//!
//! Each kind of entry says how it is keyed, when a held entry is the wanted one, how it is
//! written and removed, and how `doctor` shows it ([`Kind`]); the diff, the write order and
//! the doctor's findings are written once over any kind. A new kind is a field of [`Entries`]
//! and of [`Plan`], an impl of [`Kind`], and a line in [`diff`], [`Plan::writes`] (its place in
//! the order), [`Plan::counts`] and [`findings`].

use crate::report::Finding;
use cni_kernel::netlink::{format_mac, FdbEntry, Neighbour, Route, Write};
use ipnetwork::IpNetwork;
use std::collections::{HashMap, HashSet};
use std::fmt::{self, Write as _};
use std::hash::Hash;
use std::net::IpAddr;

/// The entries of a desired or an actual table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Entries {
    pub routes: Vec<Route>,
    pub neighbours: Vec<Neighbour>,
    pub fdb: Vec<FdbEntry>,
}

/// How the datapath programs a path to another node's subnet; backends say where the path
/// goes ([`Hop`]), the style says which kernel entries make it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RouteStyle {
    /// One route per subnet with its gateway and device.
    #[default]
    Plain,
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
}

impl Want {
    /// Room for `peers` routes, and for as many neighbours and FDB entries when the backend
    /// has devices: at thousands of leases, growing by doubling would hold up to twice the room.
    pub fn new(style: RouteStyle, peers: usize, devices: bool) -> Want {
        let mut entries = Entries::default();
        entries.routes.reserve_exact(peers);
        if devices {
            entries.neighbours.reserve_exact(peers);
            entries.fdb.reserve_exact(peers);
        }
        Want { entries, style }
    }

    /// The path to a subnet, as the route style programs it.
    pub fn route(&mut self, hop: Hop) {
        match self.style {
            RouteStyle::Plain => {
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

/// One kind of kernel entry the datapath keeps.
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
    fn set(&self) -> Write<'_>;
    fn delete(&self) -> Write<'_>;
    fn show(&self, names: &dyn Names) -> String;
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

    fn set(&self) -> Write<'_> {
        Write::SetRoute(self)
    }

    fn delete(&self) -> Write<'_> {
        Write::DeleteRoute(self)
    }

    fn show(&self, names: &dyn Names) -> String {
        let mut s = self.dst.to_string();
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

    fn set(&self) -> Write<'_> {
        Write::SetNeighbour(self)
    }

    fn delete(&self) -> Write<'_> {
        Write::DeleteNeighbour(self)
    }

    fn show(&self, _: &dyn Names) -> String {
        format!("{} lladdr {}", self.ip, format_mac(&self.mac))
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

    fn set(&self) -> Write<'_> {
        Write::SetFdb(self)
    }

    fn delete(&self) -> Write<'_> {
        Write::DeleteFdb(self)
    }

    fn show(&self, _: &dyn Names) -> String {
        let dst = self.dst.map(|d| d.to_string()).unwrap_or_default();
        format!("{} dst {dst}", format_mac(&self.mac))
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
    let mut held: HashMap<T::Key, Vec<&T>> = HashMap::with_capacity(have.len());
    for h in have {
        held.entry(h.key()).or_default().push(h);
    }
    let wanted: HashMap<T::Key, &T> = want.iter().map(|w| (w.key(), w)).collect();
    let mut plan = KindPlan::default();
    for w in want {
        let key = w.key();
        if !wanted.get(&key).is_some_and(|last| std::ptr::eq(*last, w)) {
            continue;
        }
        match held.get(&key) {
            None => plan.put.push(w),
            Some(hs) if hs.iter().any(|h| w.fits(h)) => {
                plan.remove.extend(hs.iter().filter(|h| !w.fits(h)));
            }
            Some(hs) => {
                if !T::SET_REPLACES {
                    plan.remove.extend(hs.iter());
                }
                plan.put.push(w);
            }
        }
    }
    plan.remove
        .extend(have.iter().filter(|h| !wanted.contains_key(&h.key())));
    plan
}

/// What one look at the datapath's entries found to write and to remove.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan<'a> {
    pub routes: KindPlan<'a, Route>,
    pub neighbours: KindPlan<'a, Neighbour>,
    pub fdb: KindPlan<'a, FdbEntry>,
}

/// The difference between what is wanted and what the kernel holds, kind by kind.
pub fn diff<'a>(want: &'a Entries, have: &'a Entries) -> Plan<'a> {
    Plan {
        routes: diff_kind(&want.routes, &have.routes),
        neighbours: diff_kind(&want.neighbours, &have.neighbours),
        fdb: diff_kind(&want.fdb, &have.fdb),
    }
}

impl<'a> Plan<'a> {
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty() && self.neighbours.is_empty() && self.fdb.is_empty()
    }

    /// The writes in the order the kernel must take them: removals first (a wrong FDB entry
    /// goes before the right one is written, a route before what it uses), then the
    /// neighbours and FDB entries before the routes that use them.
    pub fn writes(&self) -> Vec<Write<'a>> {
        let removals = (self.routes.remove.iter().map(|e| e.delete()))
            .chain(self.neighbours.remove.iter().map(|e| e.delete()))
            .chain(self.fdb.remove.iter().map(|e| e.delete()));
        let puts = (self.neighbours.put.iter().map(|e| e.set()))
            .chain(self.fdb.put.iter().map(|e| e.set()))
            .chain(self.routes.put.iter().map(|e| e.set()));
        removals.chain(puts).collect()
    }

    /// Per kind (routes, neighbours, FDB): how many it writes, and how many it removes.
    pub fn counts(&self) -> ([usize; 3], [usize; 3]) {
        (
            [
                self.routes.put.len(),
                self.neighbours.put.len(),
                self.fdb.put.len(),
            ],
            [
                self.routes.remove.len(),
                self.neighbours.remove.len(),
                self.fdb.remove.len(),
            ],
        )
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

/// Every kind as `flanneld doctor` reports it, in the plan's order of kinds.
pub fn findings(want: &Entries, have: &Entries, names: &dyn Names) -> Vec<Finding> {
    let plan = diff(want, have);
    let mut out = findings_kind(&want.routes, &have.routes, &plan.routes, names);
    out.extend(findings_kind(
        &want.neighbours,
        &have.neighbours,
        &plan.neighbours,
        names,
    ));
    out.extend(findings_kind(&want.fdb, &have.fdb, &plan.fdb, names));
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
        let mut want = Want::new(RouteStyle::Plain, 2, true);
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
        let mut want = Want::new(RouteStyle::Plain, 1, false);
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
        assert_eq!(plan.counts(), ([1, 1, 0], [1, 0, 1]));
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
}
