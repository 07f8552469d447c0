//! The datapath plane: the backend's devices, then the routes, neighbours, FDB entries and
//! nexthop objects the other nodes' leases call for. It reads what the kernel holds in the objects it owns,
//! computes the difference to what the spec and the leases call for, and writes only that, in
//! batches.

use crate::backend::api::Backend;
use crate::backend::api::DevicePeer;
use crate::entries::{self, diff, owns_nexthop, Entries, KindPlan, PeerEntry, RouteStyle};
use crate::family::IpFamily;
use crate::iface::{is_link_local, External};
use crate::lease::LeaseAttrs;
use crate::lease::SubnetKey;
use crate::metrics::{self, METRICS};
use crate::reconcile::{Leases, Others, Plane};
use crate::report::Finding;
use crate::spec::{DatapathSpec, Desired, DeviceIndex, DeviceSpec};
use cni_kernel::netlink::{Conn, Event as NlEvent, Link};
use cni_kernel::procsys::{self, Proto};
use futures::future::BoxFuture;
use serde_json::value::RawValue;
use std::collections::HashSet;
use std::time::{Duration, Instant};
use tracing::{debug, error, info, warn};

/// How often the datapath is looked at when nothing asks for it.
pub const RESYNC: Duration = Duration::from_secs(10);

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

/// Makes a device as it must be; whether anything changed, and the link.
async fn ensure_device(
    conn: &Conn,
    family: IpFamily,
    spec: &DeviceSpec,
) -> cni_kernel::Result<(Link, bool)> {
    let dev = &spec.dev;
    let held = conn.link_by_name(dev.name()).await?;
    let (link, mut changed) = match held {
        Some(l) if dev.differences(&l).is_empty() => (l, false),
        _ => {
            let link = dev.make(conn).await?;
            refuse_router_advertisements(dev.name());
            (link, true)
        }
    };
    if let Some(want) = spec.address {
        let have = conn.addresses(link.index).await?;
        for stale in have
            .iter()
            .filter(|a| **a != want && IpFamily::of(a.ip()) == family && !is_link_local(a.ip()))
        {
            // An address from another subnet (an earlier lease) would answer for it.
            if conn.del_address(link.index, *stale).await? {
                info!("removed stale address {stale} from {}", dev.name());
                changed = true;
            }
        }
        if !have.contains(&want) {
            conn.add_address(link.index, want).await?;
            changed = true;
        }
    }
    if !link.up {
        conn.set_up(link.index, true).await?;
        changed = true;
    }
    Ok((link, changed))
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
    /// The devices as last made or read.
    devs: DeviceIndex,
    /// Their links, by family.
    links: Vec<(IpFamily, Link)>,
    /// The leases outside the network last said so, so that each is said once.
    outside: HashSet<SubnetKey>,
}

/// What one pass changed, per kind: routes, neighbours, FDB entries, nexthops, device peers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Changes {
    device: bool,
    put: [usize; 5],
    removed: [usize; 5],
}

/// What the kernel holds of the datapath's, and the ids of the nexthops in its range that
/// another program made (left alone).
struct Held {
    entries: Entries,
    taken: HashSet<u32>,
}

impl NetlinkPlane {
    pub fn new(conn: Conn, spec: DatapathSpec) -> NetlinkPlane {
        NetlinkPlane {
            conn,
            spec,
            devs: DeviceIndex::default(),
            links: Vec::new(),
            outside: HashSet::new(),
        }
    }

    /// The devices as they must be; whether anything changed.
    async fn ensure_devices(&mut self) -> cni_kernel::Result<bool> {
        let mut changed = false;
        for i in 0..self.spec.families.len() {
            let f = &self.spec.families[i];
            let Some(dev) = &f.device else { continue };
            let family = f.family;
            let (link, c) = ensure_device(&self.conn, family, dev).await?;
            changed |= c;
            self.hold(family, link);
        }
        Ok(changed)
    }

    /// Takes `link` as the device of `family`.
    fn hold(&mut self, family: IpFamily, link: Link) {
        self.devs.0.retain(|(f, _)| *f != family);
        self.devs.0.push((family, link.index));
        self.links.retain(|(f, _)| *f != family);
        self.links.push((family, link));
    }

    /// Each device the kernel holds, with its link.
    fn held_devices(&self) -> impl Iterator<Item = (&DeviceSpec, &Link)> {
        self.links.iter().filter_map(|(family, link)| {
            let f = self.spec.families.iter().find(|f| f.family == *family)?;
            Some((f.device.as_ref()?, link))
        })
    }

    /// What the kernel holds of what this datapath owns. Its nexthops are read whatever the
    /// style, so that ours left from a life with the other style are found and removed.
    async fn read(&self) -> cni_kernel::Result<Held> {
        let mut taken = HashSet::new();
        let mut have = Entries {
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
                have.nexthops.push(nh);
            } else if entries::is_our_nexthop_id(nh.id) {
                taken.insert(nh.id);
            }
        }
        for &(_, dev) in &self.devs.0 {
            have.neighbours.extend(
                self.conn
                    .neighbours(dev)
                    .await?
                    .into_iter()
                    .filter(|n| n.permanent),
            );
            have.fdb.extend(
                self.conn
                    .fdb(dev)
                    .await?
                    .into_iter()
                    .filter(|f| f.dst.is_some()),
            );
        }
        for (dev, link) in self.held_devices() {
            have.peers.extend(
                dev.dev
                    .held_peers(link)
                    .await?
                    .into_iter()
                    .map(|peer| PeerEntry {
                        device: link.index,
                        peer,
                    }),
            );
        }
        Ok(Held {
            entries: have,
            taken,
        })
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

    /// One pass: the devices, then, with the leases known, every entry they call for.
    async fn pass(&mut self, leases: Option<&Leases>) -> cni_kernel::Result<Changes> {
        let started = Instant::now();
        let mut changes = Changes {
            device: self.ensure_devices().await?,
            ..Changes::default()
        };
        let Some(leases) = leases else {
            return Ok(changes);
        };
        let devices = started.elapsed();
        let held = self.read().await?;
        let read = started.elapsed();
        let want = self
            .spec
            .desired(&self.devs, &held.taken, leases.values().map(|l| &**l));
        let entries = &want.want.entries;
        metrics::set(&METRICS.routes, entries.routes.len() as u64);
        metrics::set(&METRICS.neighbours, entries.neighbours.len() as u64);
        metrics::set(&METRICS.fdb, entries.fdb.len() as u64);
        metrics::set(&METRICS.nexthops, entries.nexthops.len() as u64);
        for (key, why) in &want.skipped {
            debug!("lease {key} gives no entry: {why}");
        }
        self.tell_outside(&want);
        let computed = started.elapsed();
        let plan = diff(entries, &held.entries);
        let diffed = started.elapsed();
        if plan.is_empty() {
            return Ok(changes);
        }
        // One pipelined batch; an entry the kernel refuses is logged and the rest written. The
        // plan comes from what was just read, so nothing is read again first.
        for e in self.conn.write(&plan.writes()).await {
            warn!("{e}");
        }
        for e in self.write_peers(&plan.peers).await {
            warn!("{e}");
        }
        debug!(
            "datapath pass: devices {devices:?}, read {:?}, desired {:?}, diff {:?}, write {:?}",
            read - devices,
            computed - read,
            diffed - computed,
            started.elapsed() - diffed
        );
        (changes.put, changes.removed) = plan.counts();
        Ok(changes)
    }

    /// Each device's peers as planned, written through the device.
    async fn write_peers(&self, plan: &KindPlan<'_, PeerEntry>) -> Vec<cni_kernel::Error> {
        let mut failed = Vec::new();
        if plan.is_empty() {
            return failed;
        }
        for (dev, link) in self.held_devices() {
            fn of<'p>(list: &[&'p PeerEntry], device: u32) -> Vec<&'p dyn DevicePeer> {
                list.iter()
                    .filter(|p| p.device == device)
                    .map(|p| p.peer.as_ref())
                    .collect()
            }
            let (put, remove) = (of(&plan.put, link.index), of(&plan.remove, link.index));
            if !put.is_empty() || !remove.is_empty() {
                failed.extend(dev.dev.write_peers(link, &put, &remove).await);
            }
        }
        failed
    }

    /// The names `doctor` shows devices by.
    fn name_of(&self, index: u32) -> Option<String> {
        if index == self.spec.ext.index {
            return Some(self.spec.ext.name.clone());
        }
        let family = self.devs.0.iter().find(|(_, i)| *i == index)?.0;
        let f = self.spec.families.iter().find(|f| f.family == family)?;
        f.device.as_ref().map(|d| d.dev.name().to_string())
    }

    /// The MTU of the first device as `examine` found it (the MTU chain's middle).
    pub fn device_mtu(&self) -> Option<u32> {
        self.links.first().and_then(|(_, l)| l.mtu)
    }

    /// Each device against what it must be, read only.
    async fn examine_devices(&mut self) -> Vec<Finding> {
        let mut out = Vec::new();
        self.devs = DeviceIndex::default();
        self.links.clear();
        for f in &self.spec.families {
            let Some(spec) = &f.device else { continue };
            let name = spec.dev.name();
            let link = match self.conn.link_by_name(name).await {
                Ok(Some(l)) => l,
                Ok(None) => {
                    out.push(Finding::new("device", "missing", name));
                    continue;
                }
                Err(e) => {
                    out.push(Finding::new("device", "wrong", format!("{name}: {e}")));
                    continue;
                }
            };
            let mut problems = spec.dev.differences(&link);
            if let Some(want) = spec.address {
                match self.conn.addresses(link.index).await {
                    Ok(have) if have.contains(&want) => {}
                    Ok(_) => problems.push(format!("address {want} missing")),
                    Err(e) => problems.push(e.to_string()),
                }
            }
            if !link.up {
                problems.push("down".into());
            }
            let mut detail = spec.dev.show(&link);
            for p in &problems {
                detail.push_str("; ");
                detail.push_str(p);
            }
            let state = if problems.is_empty() { "ok" } else { "wrong" };
            out.push(Finding::new("device", state, detail));
            let family = f.family;
            self.devs.0.push((family, link.index));
            self.links.push((family, link));
        }
        out
    }
}

impl Plane for NetlinkPlane {
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
        let ours = |i: u32| i == self.spec.ext.index || self.devs.contains(i);
        let device_named = |name: &str| {
            self.spec
                .families
                .iter()
                .filter_map(|f| f.device.as_ref())
                .any(|d| d.dev.name() == name)
        };
        match ev {
            NlEvent::Link { link, .. } => ours(link.index) || device_named(&link.name),
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

    fn repair(&mut self, others: Others) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let (leases, changed) = match &others {
                Others::Unknown => (None, false),
                Others::Known { leases, changed } => (Some(&**leases), *changed),
            };
            let started = Instant::now();
            let result = self.pass(leases).await;
            let Some(leases) = leases else {
                if let Err(e) = result {
                    // The reconciler keeps trying; the plugin may already use the subnet.
                    error!("setting up the datapath for {}: {e}", self.spec.own);
                }
                return;
            };
            metrics::inc(&METRICS.reconcile_runs);
            metrics::add(
                &METRICS.reconcile_micros,
                started.elapsed().as_micros() as u64,
            );
            match result {
                Ok(c) => {
                    if !changed {
                        metrics::add(&METRICS.repaired_routes, c.put[0] as u64);
                        metrics::add(&METRICS.repaired_neighbours, c.put[1] as u64);
                        metrics::add(&METRICS.repaired_fdb, c.put[2] as u64);
                        metrics::add(&METRICS.repaired_nexthops, c.put[3] as u64);
                    }
                    if c != Changes::default() {
                        info!(
                            "datapath: {} leases; wrote {}; removed {}{}",
                            leases.len(),
                            tally(&c.put),
                            tally(&c.removed),
                            if c.device { "; device mended" } else { "" }
                        );
                    }
                }
                Err(e) => warn!("datapath: {e}; trying again"),
            }
        })
    }

    fn examine<'a>(&'a mut self, leases: &'a Leases) -> BoxFuture<'a, Vec<Finding>> {
        Box::pin(async move {
            let mut out = self.examine_devices().await;
            let held = match self.read().await {
                Ok(held) => Some(held),
                Err(e) => {
                    out.push(Finding::new("kernel", "wrong", e.to_string()));
                    None
                }
            };
            let taken = held.as_ref().map(|h| h.taken.clone()).unwrap_or_default();
            let want = self
                .spec
                .desired(&self.devs, &taken, leases.values().map(|l| &**l));
            for (key, subnet, network) in &want.outside {
                out.push(Finding::new(
                    "lease",
                    "ok",
                    format!("{key} skipped: {subnet} is outside the network {network}"),
                ));
            }
            for (key, why) in &want.skipped {
                out.push(Finding::new(
                    "lease",
                    "ok",
                    format!("{key} gives no entry: {why}"),
                ));
            }
            if let Some(held) = held {
                out.extend(entries::findings(&want.want.entries, &held.entries, &|i| {
                    self.name_of(i)
                }));
            }
            out
        })
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
