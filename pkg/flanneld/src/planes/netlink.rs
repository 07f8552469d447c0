//! The datapath plane: the backend's devices, then the routes, neighbours, FDB entries, nexthop
//! objects and device peers the other nodes' leases call for. Its plan reads what the kernel
//! holds of what it owns (the devices by name, their addresses, the entries) and what the spec
//! and the leases call for; applying it makes or mends the devices, then writes the entries'
//! difference in one batch.

use super::{Leases, Others, PassError, Plan, Plane};
use crate::backend::api::{Backend, DevicePeer};
use crate::entries::{self, diff, owns_nexthop, Entries, KindPlan, PeerEntry, RouteStyle};
use crate::family::IpFamily;
use crate::iface::{is_link_local, External};
use crate::lease::{LeaseAttrs, SubnetKey};
use crate::metrics::{self, METRICS};
use crate::report::Finding;
use crate::spec::{DatapathSpec, Desired, DeviceIndex, DeviceSpec};
use cni_kernel::netlink::{Conn, Event as NlEvent, Link};
use cni_kernel::procsys::{self, Proto};
use ipnetwork::IpNetwork;
use serde_json::value::RawValue;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{debug, error, info, warn};

/// How often the datapath is looked at when nothing asks for it.
pub const RESYNC: Duration = Duration::from_secs(10);

/// How long the external interface, made again, may lack its addresses before a warning.
const LACKING_WARNING: Duration = Duration::from_secs(5);

/// The route style this node uses, and why, as the first log lines say it: through nexthop
/// objects unless `wanted` is false (`--nexthops=false`) or the kernel has none (before 5.3).
/// Asked once, at start.
pub async fn route_style(conn: &Conn, wanted: bool) -> (RouteStyle, String) {
    if !wanted {
        return (
            RouteStyle::Plain,
            "plain routes: nexthop objects switched off (--nexthops=false)".into(),
        );
    }
    match conn.supports_nexthops().await {
        Ok(true) => (
            RouteStyle::Nexthop,
            format!(
                "routes through nexthop objects (ids from {} for IPv4, {} for IPv6, protocol boot)",
                entries::NEXTHOP_IDS_V4,
                entries::NEXTHOP_IDS_V6
            ),
        ),
        Ok(false) => (
            RouteStyle::Plain,
            "plain routes: this kernel has no nexthop objects (they came with 5.3)".into(),
        ),
        Err(e) => (
            RouteStyle::Plain,
            format!("plain routes: asking the kernel for nexthop objects failed: {e}"),
        ),
    }
}

/// Router advertisements must not give a device of ours addresses of its own.
fn refuse_router_advertisements(name: &str) {
    if let Err(e) = procsys::set(Proto::Ipv6, name, "accept_ra", "0") {
        debug!("{e}");
    }
}

/// Makes the backend's devices before this node's lease is taken, so that what identifies
/// them (the VtepMAC) goes into the lease: each keeps the identity it has when it fits, else
/// the one this node's earlier lease announced, else a new one. Returns the lease's backend
/// data per family.
pub async fn prepare(
    conn: &Conn,
    backend: &dyn Backend,
    ext: &External,
    families: &[IpFamily],
    earlier: Option<&LeaseAttrs>,
) -> cni_kernel::Result<Vec<(IpFamily, Option<Box<RawValue>>)>> {
    let mut data = Vec::new();
    for &family in families {
        let Some(dev) = backend.device(family, ext, None) else {
            continue;
        };
        let announced = dev
            .establish(conn, earlier.and_then(|a| a.backend_data_of(family)))
            .await?;
        refuse_router_advertisements(dev.name());
        if let Some(link) = conn.link_by_name(dev.name()).await? {
            if !link.up {
                conn.set_up(link.index, true).await?;
            }
        }
        data.push((family, announced));
    }
    Ok(data)
}

pub struct NetlinkPlane {
    conn: Conn,
    spec: DatapathSpec,
    /// The devices as last read or made.
    devs: DeviceIndex,
    /// The leases outside the network last said so, so that each is said once.
    outside: HashSet<SubnetKey>,
    /// The external interface's link made again, not yet holding its addresses: its index,
    /// since when, and whether that was warned of.
    returning: Option<(u32, Instant, bool)>,
}

/// One device as the plan found it.
struct DeviceLook {
    family: IpFamily,
    spec: DeviceSpec,
    /// The kernel's link of its name, if any.
    held: Option<Link>,
    /// How that link differs from the device (empty: it fits).
    differences: Vec<String>,
    /// Addresses of its family the link has that are not this node's (an earlier lease's).
    stale: Vec<IpNetwork>,
    /// The per-peer state the link holds itself (WireGuard's peers).
    peers: Vec<Arc<dyn DevicePeer>>,
    /// This node's address is not on it.
    address_missing: bool,
}

impl DeviceLook {
    fn make(&self) -> bool {
        self.held.is_none() || !self.differences.is_empty()
    }

    fn is_right(&self) -> bool {
        !self.make()
            && self.stale.is_empty()
            && !self.address_missing
            && self.held.as_ref().is_some_and(|l| l.up)
    }

    fn finding(&self) -> Finding {
        let name = self.spec.dev.name();
        let Some(held) = &self.held else {
            return Finding::new("device", "missing", name);
        };
        let mut problems = self.differences.clone();
        if let Some(want) = self.spec.address.filter(|_| self.address_missing) {
            problems.push(format!("address {want} missing"));
        }
        problems.extend(self.stale.iter().map(|a| format!("stale address {a}")));
        if !held.up {
            problems.push("down".into());
        }
        let mut detail = self.spec.dev.show(held);
        for p in &problems {
            detail.push_str("; ");
            detail.push_str(p);
        }
        let state = if problems.is_empty() { "ok" } else { "wrong" };
        Finding::new("device", state, detail)
    }
}

/// What the kernel holds of the datapath's entries, what the leases call for, and the ids of
/// the nexthops in our range that another program made (left alone).
struct EntriesLook {
    want: Desired,
    held: Entries,
    leases: usize,
}

/// Device names by index: the external interface's and the devices'.
#[derive(Debug, Clone, Default)]
struct Names(Vec<(u32, String)>);

impl Names {
    fn of(&self, index: u32) -> Option<String> {
        self.0
            .iter()
            .find(|(i, _)| *i == index)
            .map(|(_, n)| n.clone())
    }
}

/// One look at the datapath: its devices, and the entries once the leases are known.
pub struct DatapathPlan {
    started: Instant,
    devices: Vec<DeviceLook>,
    entries: Option<EntriesLook>,
    names: Names,
    /// The leases changed since the last pass: what this writes is no repair.
    changed: bool,
}

impl DatapathPlan {
    fn devices_right(&self) -> bool {
        self.devices.iter().all(DeviceLook::is_right)
    }
}

impl Plan for DatapathPlan {
    fn is_empty(&self) -> bool {
        self.devices_right()
            && self
                .entries
                .as_ref()
                .is_none_or(|e| diff(&e.want.want.entries, &e.held).is_empty())
    }

    fn findings(&self) -> Vec<Finding> {
        let mut out: Vec<Finding> = self.devices.iter().map(DeviceLook::finding).collect();
        let Some(e) = &self.entries else { return out };
        for (key, subnet, network) in &e.want.outside {
            out.push(Finding::new(
                "lease",
                "ok",
                format!("{key} skipped: {subnet} is outside the network {network}"),
            ));
        }
        for (key, why) in &e.want.skipped {
            out.push(Finding::new(
                "lease",
                "ok",
                format!("{key} gives no entry: {why}"),
            ));
        }
        out.extend(entries::findings(&e.want.want.entries, &e.held, &|i| {
            self.names.of(i)
        }));
        out
    }
}

/// What one pass changed, per kind: routes, neighbours, FDB entries, nexthops, device peers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Changes {
    device: bool,
    put: [usize; 5],
    removed: [usize; 5],
}

impl NetlinkPlane {
    pub fn new(conn: Conn, spec: DatapathSpec) -> NetlinkPlane {
        NetlinkPlane {
            conn,
            spec,
            devs: DeviceIndex::default(),
            outside: HashSet::new(),
            returning: None,
        }
    }

    /// Follows the external interface by its name when it was made again with another index
    /// (a VLAN or bond deleted and added, a driver reloaded; the kernel deleted the devices on
    /// top of it): once the new link holds the addresses the lease announces, the devices and
    /// entries are planned over it. Until then nothing changes; a link that goes on lacking
    /// them is warned of once.
    async fn follow_external(&mut self) -> cni_kernel::Result<()> {
        let ext = &self.spec.ext;
        let Some(link) = self.conn.link_by_name(&ext.name).await? else {
            return Ok(());
        };
        if link.index == ext.index {
            self.returning = None;
            return Ok(());
        }
        let addrs = self.conn.addresses(link.index).await?;
        let mtu = link.mtu.unwrap_or(ext.mtu);
        let (ext, lost) = ext.rebound(link.index, mtu, &addrs);
        if !lost.is_empty() {
            if self.returning.is_none_or(|(i, ..)| i != link.index) {
                self.returning = Some((link.index, Instant::now(), false));
            }
            if let Some((_, since, warned @ false)) = &mut self.returning {
                if since.elapsed() >= LACKING_WARNING {
                    *warned = true;
                    let lost: Vec<String> = lost.iter().map(|ip| ip.to_string()).collect();
                    warn!(
                        "external interface {} is back with index {} but without {}, which the lease announces: waiting for it (a new address needs a restart of flanneld)",
                        ext.name,
                        ext.index,
                        lost.join(" ")
                    );
                }
            }
            return Ok(());
        }
        info!(
            "external interface {} is back with index {} (was {}): the datapath follows it",
            ext.name, ext.index, self.spec.ext.index
        );
        self.returning = None;
        self.spec = self.spec.over(ext);
        Ok(())
    }

    /// Each device of the spec against the kernel's link of its name, and what that holds.
    async fn look_at_devices(&self) -> cni_kernel::Result<Vec<DeviceLook>> {
        let mut out = Vec::new();
        for f in &self.spec.families {
            let Some(spec) = &f.device else { continue };
            let held = self.conn.link_by_name(spec.dev.name()).await?;
            let mut look = DeviceLook {
                family: f.family,
                spec: spec.clone(),
                differences: Vec::new(),
                held,
                stale: Vec::new(),
                peers: Vec::new(),
                address_missing: false,
            };
            if let Some(link) = &look.held {
                let inside = spec.dev.inspect(link).await?;
                look.differences = spec.dev.differences(link);
                look.differences.extend(inside.differences);
                look.peers = inside.peers;
            }
            if let (Some(want), Some(link)) = (spec.address, &look.held) {
                let have = self.conn.addresses(link.index).await?;
                look.stale = have
                    .iter()
                    .filter(|a| {
                        **a != want && IpFamily::of(a.ip()) == f.family && !is_link_local(a.ip())
                    })
                    .copied()
                    .collect();
                look.address_missing = !have.contains(&want);
            }
            out.push(look);
        }
        Ok(out)
    }

    /// The device indices and names the devices found give.
    fn hold(&mut self, devices: &[DeviceLook]) -> Names {
        self.devs = DeviceIndex(
            devices
                .iter()
                .filter_map(|d| Some((d.family, d.held.as_ref()?.index)))
                .collect(),
        );
        let mut names = vec![(self.spec.ext.index, self.spec.ext.name.clone())];
        names.extend(
            devices
                .iter()
                .filter_map(|d| Some((d.held.as_ref()?.index, d.spec.dev.name().to_string()))),
        );
        Names(names)
    }

    /// What the kernel holds of what this datapath owns, and what the leases call for. Its
    /// nexthops are read whatever the style, so that ours left from a life with the other
    /// style are found and removed.
    async fn look_at_entries(
        &self,
        devices: &[DeviceLook],
        leases: &Leases,
    ) -> cni_kernel::Result<EntriesLook> {
        let mut taken = HashSet::new();
        let mut held = Entries {
            routes: self
                .conn
                .routes()
                .await?
                .into_iter()
                .filter(|r| self.spec.owns_route(&self.devs, r))
                .collect(),
            ..Entries::default()
        };
        for nh in self.conn.nexthops().await? {
            if owns_nexthop(&nh) {
                held.nexthops.push(nh);
            } else if entries::is_our_nexthop_id(nh.id) {
                taken.insert(nh.id);
            }
        }
        for &(_, dev) in &self.devs.0 {
            let neighbours = self.conn.neighbours(dev).await?;
            held.neighbours
                .extend(neighbours.into_iter().filter(|n| n.permanent));
            let fdb = self.conn.fdb(dev).await?;
            held.fdb.extend(fdb.into_iter().filter(|f| f.dst.is_some()));
        }
        for d in devices {
            let Some(link) = &d.held else { continue };
            held.peers.extend(d.peers.iter().map(|peer| PeerEntry {
                device: link.index,
                peer: peer.clone(),
            }));
        }
        let want = self
            .spec
            .desired(&self.devs, &taken, leases.values().map(|l| &**l));
        Ok(EntriesLook {
            want,
            held,
            leases: leases.len(),
        })
    }

    /// Makes or mends each device the plan found wrong; whether any was.
    async fn apply_devices(&self, devices: &mut [DeviceLook]) -> cni_kernel::Result<bool> {
        let mut changed = false;
        for d in devices.iter_mut().filter(|d| !d.is_right()) {
            let dev = &d.spec.dev;
            let link = match d.held.take() {
                Some(l) if !d.make() => l,
                _ => {
                    let link = dev.make(&self.conn).await?;
                    refuse_router_advertisements(dev.name());
                    // What the device made holds is what its entries are diffed against.
                    d.peers = dev.inspect(&link).await?.peers;
                    changed = true;
                    link
                }
            };
            for stale in &d.stale {
                // An address from another subnet (an earlier lease) would answer for it.
                if self.conn.del_address(link.index, *stale).await? {
                    info!("removed stale address {stale} from {}", dev.name());
                    changed = true;
                }
            }
            if let Some(want) = d.spec.address {
                if !self.conn.addresses(link.index).await?.contains(&want) {
                    self.conn.add_address(link.index, want).await?;
                    changed = true;
                }
            }
            if !link.up {
                self.conn.set_up(link.index, true).await?;
                changed = true;
            }
            d.held = Some(link);
        }
        Ok(changed)
    }

    /// Writes the entries' difference; what it wrote and removed, per kind.
    async fn apply_entries(
        &self,
        look: &EntriesLook,
        devices: &[DeviceLook],
        names: &Names,
    ) -> Changes {
        let entries = &look.want.want.entries;
        let plan = diff(entries, &look.held);
        let mut changes = Changes::default();
        if plan.is_empty() {
            return changes;
        }
        // One pipelined batch; an entry the kernel refuses is logged and the rest written. The
        // plan comes from what was just read, so nothing is read again first.
        let writes = plan.writes();
        let shown = |i: u32| names.of(i);
        for (i, e) in self.conn.write_indexed(&writes).await {
            warn!("{}", e.with_object(entries::show_write(&writes[i], &shown)));
        }
        for e in write_peers(devices, &plan.peers).await {
            warn!("{e}");
        }
        (changes.put, changes.removed) = plan.counts();
        changes
    }

    /// Says once per lease that one is outside the network and is not programmed.
    fn tell_outside(&mut self, want: &Desired) {
        let now: HashSet<SubnetKey> = want.outside.iter().map(|(k, ..)| *k).collect();
        for (key, subnet, network) in &want.outside {
            if !self.outside.contains(key) {
                warn!(
                    "lease {key}: its subnet {subnet} is outside the network {network}; skipped, nothing is programmed for it"
                );
            }
        }
        self.outside = now;
    }

    /// What a pass with the leases known did, in the metrics and the log.
    fn tell(&mut self, plan: &DatapathPlan, look: &EntriesLook, c: Changes) {
        let entries = &look.want.want.entries;
        metrics::set(&METRICS.routes, entries.routes.len() as u64);
        metrics::set(&METRICS.neighbours, entries.neighbours.len() as u64);
        metrics::set(&METRICS.fdb, entries.fdb.len() as u64);
        metrics::set(&METRICS.nexthops, entries.nexthops.len() as u64);
        metrics::set(&METRICS.backend_peers, entries.peers.len() as u64);
        for (key, why) in &look.want.skipped {
            debug!("lease {key} gives no entry: {why}");
        }
        self.tell_outside(&look.want);
        metrics::inc(&METRICS.reconcile_runs);
        metrics::add(
            &METRICS.reconcile_micros,
            plan.started.elapsed().as_micros() as u64,
        );
        if !plan.changed {
            metrics::add(&METRICS.repaired_routes, c.put[0] as u64);
            metrics::add(&METRICS.repaired_neighbours, c.put[1] as u64);
            metrics::add(&METRICS.repaired_fdb, c.put[2] as u64);
            metrics::add(&METRICS.repaired_nexthops, c.put[3] as u64);
        }
        if c != Changes::default() {
            info!(
                "datapath: {} leases; wrote {}; removed {}{}",
                look.leases,
                tally(&c.put),
                tally(&c.removed),
                if c.device { "; device mended" } else { "" }
            );
        }
    }
}

/// Each device's peers as planned, written through the device.
async fn write_peers(
    devices: &[DeviceLook],
    plan: &KindPlan<'_, PeerEntry>,
) -> Vec<cni_kernel::Error> {
    fn of<'p>(list: &[&'p PeerEntry], device: u32) -> Vec<&'p dyn DevicePeer> {
        list.iter()
            .filter(|p| p.device == device)
            .map(|p| p.peer.as_ref())
            .collect()
    }
    let mut failed = Vec::new();
    if plan.is_empty() {
        return failed;
    }
    for d in devices {
        let Some(link) = &d.held else { continue };
        let (put, remove) = (of(&plan.put, link.index), of(&plan.remove, link.index));
        if !put.is_empty() || !remove.is_empty() {
            failed.extend(d.spec.dev.write_peers(link, &put, &remove).await);
        }
    }
    failed
}

impl Plane for NetlinkPlane {
    type Plan = DatapathPlan;
    const KIND: &'static str = "kernel";

    fn resync(&self) -> Duration {
        RESYNC
    }

    fn follows_leases(&self) -> bool {
        true
    }

    fn listens(&self) -> bool {
        true
    }

    fn concerns(&self, ev: &NlEvent) -> bool {
        let ours = |i: u32| {
            i == self.spec.ext.index
                || self.devs.contains(i)
                || self.returning.is_some_and(|(r, ..)| r == i)
        };
        let device_named = |name: &str| {
            self.spec
                .families
                .iter()
                .filter_map(|f| f.device.as_ref())
                .any(|d| d.dev.name() == name)
        };
        match ev {
            NlEvent::Link { link, .. } => {
                ours(link.index) || device_named(&link.name) || link.name == self.spec.ext.name
            }
            NlEvent::Address { index, .. } => ours(*index),
            NlEvent::Route { route, .. } => {
                self.spec.owns_route(&self.devs, route) || route.oif.is_some_and(ours)
            }
            NlEvent::Neighbour { neighbour, .. } => ours(neighbour.device),
            NlEvent::Fdb { entry, .. } => ours(entry.device),
            // Deleting one of ours deletes its routes too, of which the kernel announces
            // nothing (IPv4).
            NlEvent::Nexthop { nexthop, .. } => owns_nexthop(nexthop),
            NlEvent::Overflow => true,
        }
    }

    /// The devices, then, with the leases known, every entry they call for.
    async fn plan(&mut self, others: &Others) -> Result<DatapathPlan, PassError> {
        let started = Instant::now();
        self.follow_external().await?;
        let devices = self.look_at_devices().await?;
        let names = self.hold(&devices);
        let entries = match others.leases() {
            Some(leases) => Some(self.look_at_entries(&devices, leases).await?),
            None => None,
        };
        debug!("datapath look: {:?}", started.elapsed());
        Ok(DatapathPlan {
            started,
            devices,
            entries,
            names,
            changed: matches!(others, Others::Known { changed: true, .. }),
        })
    }

    async fn apply(&mut self, mut plan: DatapathPlan, others: &Others) {
        let device = match self.apply_devices(&mut plan.devices).await {
            Ok(changed) => changed,
            Err(e) => return self.failed(e.into(), others),
        };
        if device {
            // A device made anew has a new index: what its entries are is read again.
            plan.names = self.hold(&plan.devices);
            if let Some(leases) = others.leases() {
                match self.look_at_entries(&plan.devices, leases).await {
                    Ok(e) => plan.entries = Some(e),
                    Err(e) => return self.failed(e.into(), others),
                }
            }
        }
        let Some(look) = plan.entries.take() else {
            return;
        };
        let mut changes = self.apply_entries(&look, &plan.devices, &plan.names).await;
        changes.device = device;
        self.tell(&plan, &look, changes);
    }

    fn failed(&mut self, e: PassError, others: &Others) {
        match others {
            // The reconciler keeps trying; the plugin may already use the subnet.
            Others::Unknown => error!("setting up the datapath for {}: {e}", self.spec.own),
            Others::Known { .. } => {
                metrics::inc(&METRICS.reconcile_runs);
                warn!("datapath: {e}; trying again");
            }
        }
    }
}

/// `3 routes, 3 neighbours, 3 FDB entries, 3 nexthops` (and `, 3 device peers` where there
/// are any), from [`Changes`]' counts.
fn tally(counts: &[usize; 5]) -> String {
    let [routes, neighbours, fdb, nexthops, peers] = counts;
    let mut s =
        format!("{routes} routes, {neighbours} neighbours, {fdb} FDB entries, {nexthops} nexthops");
    if *peers > 0 {
        s.push_str(&format!(", {peers} device peers"));
    }
    s
}
