//! The datapath for the other nodes' leases, kept equal to them by one reconciler: it reads what
//! the kernel holds in the objects it owns, computes the difference to what the leases call for
//! (`desired`), and writes only that, in batches. Lease events, netlink notifications about
//! those objects and a timer all lead to the same pass, so start, restart, repair and normal
//! operation are one code path.

use super::desired::{self, diff, owns_route, Entries, Local, Plan};
use super::mode::{self, Mode, VxlanParams};
use crate::config::NetConfig;
use crate::iface::{is_link_local, External};
use crate::lease::{Lease, LeaseAttrs, SubnetKey};
use crate::metrics::{self, METRICS};
use crate::view::Event;
use cni_kernel::netlink::{format_mac, Conn, Event as NlEvent, Events, Vxlan, VxlanSpec, Write};
use cni_kernel::procsys::{self, Proto};
use futures::StreamExt;
use ipnetwork::IpNetwork;
use serde_json::value::RawValue;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// How often the datapath is checked when nothing asks for it.
pub const RESYNC: Duration = Duration::from_secs(10);
/// A pass starts once its triggers have been quiet this long, so that a burst (a
/// transaction's leases, a device's entries deleted together) becomes one pass...
const QUIET: Duration = Duration::from_millis(5);
/// ...or this long after the first of them, whichever comes first.
const SETTLE: Duration = Duration::from_millis(50);

/// vxlan's per-packet overhead over IPv4 and IPv6 underlays.
const VXLAN_OVERHEAD_V4: u32 = 50;
const VXLAN_OVERHEAD_V6: u32 = 70;

pub struct Datapath {
    conn: Conn,
    local: Local,
    vxlan: Option<VxlanParams>,
    ext: External,
    mtu: u32,
    vtep4: Option<[u8; 6]>,
    vtep6: Option<[u8; 6]>,
}

/// What one pass changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Changes {
    pub device: bool,
    pub put: (usize, usize, usize),
    pub removed: (usize, usize, usize),
}

impl Changes {
    pub fn any(&self) -> bool {
        self.device || self.put != (0, 0, 0) || self.removed != (0, 0, 0)
    }
}

/// The MTU of the vxlan device of one family: the underlay's less the encapsulation.
fn device_mtu(p: &VxlanParams, ext: &External, v6: bool) -> u32 {
    let overhead = if v6 {
        VXLAN_OVERHEAD_V6
    } else {
        VXLAN_OVERHEAD_V4
    };
    p.mtu.unwrap_or(ext.mtu).saturating_sub(overhead)
}

/// The vxlan device of one family as it must be: the external interface's address as the
/// local source, the interface as its device.
fn vxlan_spec(p: &VxlanParams, ext: &External, v6: bool, mac: Option<[u8; 6]>) -> VxlanSpec {
    let local: Option<IpAddr> = if v6 {
        ext.iface_ipv6.or(ext.public_ipv6).map(IpAddr::V6)
    } else {
        ext.iface_ip.or(ext.public_ip).map(IpAddr::V4)
    };
    VxlanSpec {
        name: device_name(v6, p.vni),
        vxlan: Vxlan {
            vni: p.vni,
            port: p.port,
            local,
            device: Some(ext.index),
            learning: p.learning,
            gbp: p.gbp,
        },
        mtu: Some(device_mtu(p, ext, v6)),
        mac,
    }
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

pub fn device_name(v6: bool, vni: u32) -> String {
    if v6 {
        format!("flannel-v6.{vni}")
    } else {
        format!("flannel.{vni}")
    }
}

impl Datapath {
    /// Checks the backend's config against the node and makes the vxlan devices, so that their
    /// MACs can go into the lease. `previous` is this node's lease from before, if any.
    pub async fn new(
        cfg: &NetConfig,
        ext: &External,
        previous: Option<&LeaseAttrs>,
    ) -> Result<Datapath, String> {
        let mode = mode::mode(cfg).map_err(|e| e.to_string())?;
        let conn = Conn::open().map_err(|e| e.to_string())?;
        let vxlan = match &mode {
            Mode::Vxlan(p) => Some(p.clone()),
            _ => None,
        };
        // The pods' MTU: what fits through every device they may use (the IPv6 one is the
        // smaller when there is one).
        let mtu = match &vxlan {
            Some(p) => device_mtu(p, ext, cfg.ipv6.is_some()),
            None => ext.mtu,
        };
        if mode == Mode::HostGw {
            if cfg.ipv4.is_some() && ext.public_ip != ext.iface_ip {
                return Err(format!(
                    "host-gw needs the public address to be the external interface's: --public-ip {} is not an address of {}",
                    ext.public_ip.map(|a| a.to_string()).unwrap_or_default(),
                    ext.name
                ));
            }
            if cfg.ipv6.is_some() && ext.public_ipv6 != ext.iface_ipv6 {
                return Err(format!(
                    "host-gw needs the public address to be the external interface's: --public-ipv6 {} is not an address of {}",
                    ext.public_ipv6.map(|a| a.to_string()).unwrap_or_default(),
                    ext.name
                ));
            }
        }
        let mut dp = Datapath {
            conn,
            local: Local {
                mode,
                backend_type: cfg.backend_type.clone(),
                own: SubnetKey {
                    ipv4: None,
                    ipv6: None,
                },
                network4: cfg.ipv4.map(|f| f.network),
                network6: cfg.ipv6.map(|f| f.network),
                ext_index: ext.index,
                ext_nets: ext.addrs.clone(),
                dev4: None,
                dev6: None,
            },
            vxlan,
            ext: ext.clone(),
            mtu,
            vtep4: None,
            vtep6: None,
        };
        if let Some(p) = dp.vxlan.clone() {
            // The VtepMAC is chosen once: the existing device's, else the one in this node's
            // lease from before, else a new one.
            for v6 in [false, true] {
                let wanted = if v6 {
                    cfg.ipv6.is_some()
                } else {
                    cfg.ipv4.is_some()
                };
                if !wanted {
                    continue;
                }
                let name = device_name(v6, p.vni);
                let existing = dp
                    .conn
                    .link_by_name(&name)
                    .await
                    .ok()
                    .flatten()
                    .filter(|l| {
                        l.is_vxlan() && vxlan_spec(&p, ext, v6, None).differences(l).is_empty()
                    })
                    .and_then(|l| <[u8; 6]>::try_from(l.mac.as_slice()).ok());
                let from_lease = previous.and_then(|a| {
                    desired::vtep_mac(if v6 {
                        a.backend_v6_data.as_deref()
                    } else {
                        a.backend_data.as_deref()
                    })
                });
                let mac = existing.or(from_lease).unwrap_or_else(random_mac);
                if v6 {
                    dp.vtep6 = Some(mac);
                } else {
                    dp.vtep4 = Some(mac);
                }
            }
            dp.ensure_devices().await?;
        }
        Ok(dp)
    }

    /// The devices as they must be; whether anything changed.
    async fn ensure_devices(&mut self) -> Result<bool, String> {
        let Some(p) = self.vxlan.clone() else {
            return Ok(false);
        };
        let mut changed = false;
        for (v6, mac) in [(false, self.vtep4), (true, self.vtep6)] {
            let Some(mac) = mac else { continue };
            let spec = vxlan_spec(&p, &self.ext, v6, Some(mac));
            let (link, c) = self
                .conn
                .ensure_vxlan(&spec)
                .await
                .map_err(|e| e.to_string())?;
            if c {
                info!(
                    "vxlan device {} made or mended (VNI {}, VtepMAC {})",
                    spec.name,
                    spec.vxlan.vni,
                    format_mac(&mac)
                );
                // Router advertisements must not give the device addresses of their own.
                if let Err(e) = procsys::set(Proto::Ipv6, &spec.name, "accept_ra", "0") {
                    debug!("{e}");
                }
            }
            changed |= c;
            let own = if v6 {
                self.local.own.ipv6.map(IpNetwork::V6)
            } else {
                self.local.own.ipv4.map(IpNetwork::V4)
            };
            if let Some(own) = own {
                let want = IpNetwork::new(own.network(), if v6 { 128 } else { 32 })
                    .map_err(|e| e.to_string())?;
                let have = self
                    .conn
                    .addresses(link.index)
                    .await
                    .map_err(|e| e.to_string())?;
                for stale in have
                    .iter()
                    .filter(|a| **a != want && a.is_ipv4() != v6 && !is_link_local(a.ip()))
                {
                    // An address from another subnet (an earlier lease) would answer for it.
                    if self
                        .conn
                        .del_address(link.index, *stale)
                        .await
                        .map_err(|e| e.to_string())?
                    {
                        info!("removed stale address {stale} from {}", spec.name);
                        changed = true;
                    }
                }
                if !have.contains(&want) {
                    self.conn
                        .add_address(link.index, want)
                        .await
                        .map_err(|e| e.to_string())?;
                    changed = true;
                }
            }
            if !link.up {
                self.conn
                    .set_up(link.index, true)
                    .await
                    .map_err(|e| e.to_string())?;
                changed = true;
            }
            if v6 {
                self.local.dev6 = Some(link.index);
            } else {
                self.local.dev4 = Some(link.index);
            }
        }
        Ok(changed)
    }

    /// `BackendData` of this node's lease.
    pub fn backend_data(&self) -> Option<Box<RawValue>> {
        self.data(self.vtep4)
    }

    pub fn backend_v6_data(&self) -> Option<Box<RawValue>> {
        self.data(self.vtep6)
    }

    fn data(&self, mac: Option<[u8; 6]>) -> Option<Box<RawValue>> {
        let vni = self.vxlan.as_ref()?.vni;
        RawValue::from_string(format!(
            r#"{{"VNI":{vni},"VtepMAC":"{}"}}"#,
            format_mac(&mac?)
        ))
        .ok()
    }

    /// FLANNEL_MTU.
    pub fn mtu(&self) -> u32 {
        self.mtu
    }

    /// This node's lease is held: its subnet goes onto the devices.
    pub async fn set_own(&mut self, own: SubnetKey) -> Result<(), String> {
        self.local.own = own;
        self.ensure_devices().await?;
        Ok(())
    }

    async fn actual(&self) -> Result<Entries, String> {
        read_actual(&self.conn, &self.local).await
    }

    /// One pass: the devices, then every entry the leases call for; returns what changed.
    pub async fn reconcile<'a>(
        &mut self,
        others: impl IntoIterator<Item = &'a Lease>,
    ) -> Result<Changes, String> {
        let started = std::time::Instant::now();
        let mut changes = Changes {
            device: self.ensure_devices().await?,
            ..Changes::default()
        };
        let devices = started.elapsed();
        let want = desired::desired(&self.local, others);
        metrics::set(&METRICS.routes, want.entries.routes.len() as u64);
        metrics::set(&METRICS.neighbours, want.entries.neighbours.len() as u64);
        metrics::set(&METRICS.fdb, want.entries.fdb.len() as u64);
        for (key, why) in &want.skipped {
            debug!("lease {key} gives no entry: {why}");
        }
        let computed = started.elapsed();
        let have = self.actual().await?;
        let read = started.elapsed();
        let plan = diff(&want.entries, &have);
        let diffed = started.elapsed();
        if plan.is_empty() {
            return Ok(changes);
        }
        self.apply(&plan).await;
        debug!(
            "datapath pass: devices {devices:?}, desired {:?}, read {:?}, diff {:?}, write {:?}",
            computed - devices,
            read - computed,
            diffed - read,
            started.elapsed() - diffed
        );
        changes.put = (
            plan.put.routes.len(),
            plan.put.neighbours.len(),
            plan.put.fdb.len(),
        );
        changes.removed = (
            plan.remove.routes.len(),
            plan.remove.neighbours.len(),
            plan.remove.fdb.len(),
        );
        Ok(changes)
    }

    /// Writes a plan as one pipelined batch; an entry the kernel refuses is logged and the
    /// rest written. The plan comes from what was just read, so nothing is read again first.
    async fn apply(&self, plan: &Plan<'_>) {
        let (put, remove) = (&plan.put, &plan.remove);
        // Removals first (a wrong FDB entry goes before the right one is written); then, as
        // the kernel takes them in order, the neighbours and FDB entries before the routes
        // that use them.
        let writes: Vec<Write> = (remove.routes.iter().copied().map(Write::DeleteRoute))
            .chain(
                remove
                    .neighbours
                    .iter()
                    .copied()
                    .map(Write::DeleteNeighbour),
            )
            .chain(remove.fdb.iter().copied().map(Write::DeleteFdb))
            .chain(put.neighbours.iter().copied().map(Write::SetNeighbour))
            .chain(put.fdb.iter().copied().map(Write::SetFdb))
            .chain(put.routes.iter().copied().map(Write::SetRoute))
            .collect();
        for e in self.conn.write(&writes).await {
            warn!("{e}");
        }
    }

    /// Whether a netlink notification concerns what this datapath owns.
    fn concerns(&self, ev: &NlEvent) -> bool {
        let ours = |i: u32| {
            i == self.local.ext_index || Some(i) == self.local.dev4 || Some(i) == self.local.dev6
        };
        match ev {
            NlEvent::Link { link, .. } => {
                ours(link.index)
                    || self.vxlan.as_ref().is_some_and(|p| {
                        link.name == device_name(false, p.vni)
                            || link.name == device_name(true, p.vni)
                    })
            }
            NlEvent::Address { index, .. } => ours(*index),
            NlEvent::Route { route, .. } => {
                owns_route(&self.local, route) || route.oif.is_some_and(ours)
            }
            NlEvent::Neighbour { neighbour, .. } => ours(neighbour.device),
            NlEvent::Fdb { entry, .. } => ours(entry.device),
            NlEvent::Overflow => true,
        }
    }

    /// Follows the lease events until they end, reconciling on each batch, on each relevant
    /// netlink notification and every `RESYNC`.
    pub async fn run(mut self, mut events: mpsc::Receiver<Vec<Event>>) {
        let mut others: BTreeMap<SubnetKey, Arc<Lease>> = BTreeMap::new();
        let mut notes = if self.local.mode == Mode::Alloc {
            None
        } else {
            match Events::subscribe() {
                Ok(n) => Some(n),
                Err(e) => {
                    warn!("{e}: repairs wait for the {RESYNC:?} timer");
                    None
                }
            }
        };
        let mut timer = tokio::time::interval(RESYNC);
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let apply_batch = |others: &mut BTreeMap<SubnetKey, Arc<Lease>>, batch: Vec<Event>| {
            for e in batch {
                match e {
                    Event::Added(l) => {
                        others.insert(l.key, l);
                    }
                    Event::Removed(l) => {
                        others.remove(&l.key);
                    }
                }
            }
        };
        // Lease events that arrived during a pass, for the next.
        let mut waiting: Vec<Vec<Event>> = Vec::new();
        let mut ended = false;
        loop {
            // Entries written in a pass that no lease change asked for are repairs.
            let mut leases_changed = !waiting.is_empty();
            for b in waiting.drain(..) {
                apply_batch(&mut others, b);
            }
            if ended {
                return;
            }
            // Wait for a reason to look.
            if !leases_changed {
                tokio::select! {
                    b = events.recv() => match b {
                        Some(b) => {
                            apply_batch(&mut others, b);
                            leases_changed = true;
                        }
                        None => return,
                    },
                    n = next_note(&mut notes) => {
                        if !n.is_some_and(|n| self.concerns(&n)) {
                            continue;
                        }
                    }
                    _ = timer.tick() => {}
                }
            }
            // Gather what else arrives meanwhile into the same pass.
            let deadline = Instant::now() + SETTLE;
            let settle = tokio::time::sleep(QUIET.min(SETTLE));
            tokio::pin!(settle);
            loop {
                tokio::select! {
                    b = events.recv() => match b {
                        Some(b) => {
                            apply_batch(&mut others, b);
                            leases_changed = true;
                        }
                        None => return,
                    },
                    _ = next_note(&mut notes) => {}
                    _ = &mut settle => break,
                }
                settle
                    .as_mut()
                    .reset((Instant::now() + QUIET).min(deadline));
            }
            let started = std::time::Instant::now();
            // Lease events keep being taken during the pass, so that the follower (and the
            // registry's response it reads from) is never held up by it.
            let result = {
                let pass = self.reconcile(others.values().map(|l| &**l));
                tokio::pin!(pass);
                loop {
                    tokio::select! {
                        r = &mut pass => break r,
                        b = events.recv(), if !ended => match b {
                            Some(b) => waiting.push(b),
                            None => ended = true,
                        },
                    }
                }
            };
            metrics::inc(&METRICS.reconcile_runs);
            metrics::add(
                &METRICS.reconcile_micros,
                started.elapsed().as_micros() as u64,
            );
            if let (Ok(c), false) = (&result, leases_changed) {
                metrics::add(&METRICS.repaired_routes, c.put.0 as u64);
                metrics::add(&METRICS.repaired_neighbours, c.put.1 as u64);
                metrics::add(&METRICS.repaired_fdb, c.put.2 as u64);
            }
            match result {
                Ok(c) if c.any() => info!(
                    "datapath: {} leases; wrote {} routes, {} neighbours, {} FDB entries; removed {} routes, {} neighbours, {} FDB entries{}",
                    others.len(),
                    c.put.0,
                    c.put.1,
                    c.put.2,
                    c.removed.0,
                    c.removed.1,
                    c.removed.2,
                    if c.device { "; device mended" } else { "" }
                ),
                Ok(_) => {}
                Err(e) => warn!("datapath: {e}; trying again"),
            }
        }
    }
}

async fn next_note(notes: &mut Option<Events>) -> Option<NlEvent> {
    match notes {
        Some(n) => n.next().await,
        None => std::future::pending().await,
    }
}

/// What the kernel holds of what `local`'s datapath owns.
pub async fn read_actual(conn: &Conn, local: &Local) -> Result<Entries, String> {
    let mut have = Entries {
        routes: Vec::new(),
        neighbours: Vec::new(),
        fdb: Vec::new(),
    };
    have.routes = conn
        .routes()
        .await
        .map_err(|e| e.to_string())?
        .into_iter()
        .filter(|r| owns_route(local, r))
        .collect();
    for dev in [local.dev4, local.dev6].into_iter().flatten() {
        have.neighbours.extend(
            conn.neighbours(dev)
                .await
                .map_err(|e| e.to_string())?
                .into_iter()
                .filter(|n| n.permanent),
        );
        have.fdb.extend(
            conn.fdb(dev)
                .await
                .map_err(|e| e.to_string())?
                .into_iter()
                .filter(|f| f.dst.is_some()),
        );
    }
    Ok(have)
}
