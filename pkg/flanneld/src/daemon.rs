//! The daemon's life: the network config, the external interface, this node's lease (taken,
//! renewed), what the node should be (`NodeSpec`), subnet.env, and the other nodes' leases
//! followed through watches and resyncs into the reconciler of the node's kernel state.

use crate::bringup::{prepare, Level, Note, Purpose};
use crate::error::{LeaseLost, StartError};
use crate::iface::Interfaces;
use crate::lease::{Lease, SubnetKey};
use crate::metrics::{self, METRICS};
use crate::reconcile::Reconciler;
use crate::registry::{list_until_ok, Change, Registry, WatchEnd};
use crate::settings::Settings;
use crate::view::{warn_skipped, LeaseView, Outcome};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::mpsc;
use tracing::{info, warn};

/// How the daemon ended.
#[derive(Debug)]
pub enum Exit {
    /// Asked to stop: leases and the datapath stay for the next start.
    Stopped,
    /// A bad network config, external interface or backend at start: exit status 2.
    BadStart(StartError),
    /// This node's lease was deleted by someone else: exit status 1.
    LeaseLost(LeaseLost),
}

/// When to renew a lease that expires at `expiry`: the margin before, or a third of the
/// lifetime before when the lifetime is shorter than three margins (tests).
pub fn renew_at(expiry: SystemTime, ttl: Duration, margin: Duration) -> SystemTime {
    let lead = margin.min(ttl / 3);
    expiry.checked_sub(lead).unwrap_or(expiry)
}

/// How long to wait before retrying a failed renewal.
pub fn renew_retry(ttl: Duration) -> Duration {
    Duration::from_secs(60)
        .min(ttl / 4)
        .max(Duration::from_millis(200))
}

fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Renews the lease before it expires, forever.
async fn renew_forever(
    reg: Arc<dyn Registry>,
    lease: Lease,
    mut expiry: SystemTime,
    ttl: Duration,
    margin: Duration,
) {
    loop {
        let wait = renew_at(expiry, ttl, margin)
            .duration_since(SystemTime::now())
            .unwrap_or_default();
        tokio::time::sleep(wait).await;
        let mut trouble = crate::retrying::Retrying::default();
        loop {
            let key = lease.key;
            match reg.renew(&lease, ttl).await {
                Ok(e) => {
                    expiry = e;
                    metrics::set(&METRICS.lease_expiry, unix_secs(e));
                    info!("renewed lease {key}");
                    break;
                }
                Err(e) => {
                    metrics::inc(&METRICS.registry_errors);
                    let retry = renew_retry(ttl);
                    let e = e.to_string();
                    if trouble.failed(&e) {
                        warn!("renewing lease {key}: {e}; retrying every {retry:?}");
                    }
                    tokio::time::sleep(retry).await;
                }
            }
        }
    }
}

/// Follows every other node's lease into `events`, the first listing as one batch even when
/// it is empty; returns when this node's lease is gone.
async fn follow(
    reg: Arc<dyn Registry>,
    own: SubnetKey,
    events: mpsc::Sender<Vec<crate::view::Event>>,
) -> LeaseLost {
    let mut view = LeaseView::new(own);
    let where_ = reg.describe();
    let mut first = true;
    let mut first_listing = true;
    loop {
        if !std::mem::take(&mut first) {
            metrics::inc(&METRICS.resyncs);
        }
        let listing = list_until_ok(reg.as_ref()).await;
        let revision = listing.revision;
        let outcome = view.resync(
            listing
                .entries
                .iter()
                .map(|e| (e.key.as_str(), e.value.as_slice())),
        );
        for b in &listing.bad {
            warn_skipped(b, &where_);
        }
        let listed = std::mem::take(&mut first_listing);
        if let Some(lost) = deliver(outcome, &where_, own, &events, listed).await {
            return lost;
        }
        metrics::set(&METRICS.leases_known, view.len() as u64);
        let (tx, mut rx) = mpsc::channel(1024);
        let watcher = {
            let reg = reg.clone();
            tokio::spawn(async move { reg.watch(revision, tx).await })
        };
        while let Some(change) = rx.recv().await {
            let mut outcome = apply_change(&mut view, change, &where_);
            // What has arrived meanwhile (a transaction's thousands of leases) goes to the
            // backend as one batch.
            while let Ok(change) = rx.try_recv() {
                let more = apply_change(&mut view, change, &where_);
                outcome.events.extend(more.events);
                outcome.bad.extend(more.bad);
                outcome.own_removed |= more.own_removed;
            }
            if let Some(lost) = deliver(outcome, &where_, own, &events, false).await {
                watcher.abort();
                return lost;
            }
            metrics::set(&METRICS.leases_known, view.len() as u64);
        }
        // However the watch ended, the next round lists everything again and diffs.
        match watcher.await {
            Ok(WatchEnd::Compacted(0)) => {
                info!("the watch on {where_} fell behind; listing again");
            }
            Ok(WatchEnd::Compacted(rev)) => {
                info!("the watch on {where_} fell behind a compaction (revision {rev}); listing again");
            }
            Ok(WatchEnd::Broken(why)) => {
                metrics::inc(&METRICS.registry_errors);
                warn!("{why}; listing again");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Ok(WatchEnd::Closed) | Err(_) => {}
        }
    }
}

fn apply_change(view: &mut LeaseView, change: Change, where_: &str) -> Outcome {
    match change {
        Change::Put(e) => view.put(&e.key, &e.value),
        Change::Delete(k) => view.delete(&k),
        Change::Snapshot(l) => {
            for b in &l.bad {
                warn_skipped(b, where_);
            }
            view.resync(
                l.entries
                    .iter()
                    .map(|e| (e.key.as_str(), e.value.as_slice())),
            )
        }
    }
}

/// Logs and sends what changed (`always`: even nothing, for the first listing); says when this
/// node's lease is gone.
async fn deliver(
    outcome: Outcome,
    where_: &str,
    own: SubnetKey,
    events: &mpsc::Sender<Vec<crate::view::Event>>,
    always: bool,
) -> Option<LeaseLost> {
    for b in &outcome.bad {
        warn_skipped(b, where_);
    }
    for e in &outcome.events {
        match e {
            crate::view::Event::Added(l) => info!("lease added: {l}"),
            crate::view::Event::Removed(l) => info!("lease removed: {l}"),
        }
    }
    if always || !outcome.events.is_empty() {
        let _ = events.send(outcome.events).await;
    }
    outcome.own_removed.then(|| LeaseLost::Removed {
        own,
        where_: where_.to_string(),
    })
}

/// A step of the start, as its log line.
fn log_note(n: Note) {
    match n.level {
        Level::Fine => info!("{}", n.text),
        Level::Notice | Level::Wrong => warn!("{}", n.text),
    }
}

/// Runs until stopped or the lease is lost.
pub async fn run(
    reg: Arc<dyn Registry>,
    settings: &Settings,
    ifaces: Interfaces,
    ready: Arc<AtomicBool>,
) -> Exit {
    match serve(reg, settings, ifaces, ready).await {
        Ok(exit) => exit,
        Err(e) => Exit::BadStart(e),
    }
}

async fn serve(
    reg: Arc<dyn Registry>,
    settings: &Settings,
    ifaces: Interfaces,
    ready: Arc<AtomicBool>,
) -> Result<Exit, StartError> {
    let purpose = Purpose::Serve { ready };
    let up = prepare(settings, reg.as_ref(), &ifaces, &purpose, &mut log_note).await?;
    let mut reconciler = Reconciler::new(up.planes);
    // The node's own part (devices, firewall) before the plugin is told the subnet.
    reconciler.first_pass().await;
    let key = up.own.key;
    let renewer = up.expiry.map(|expiry| {
        tokio::spawn(renew_forever(
            reg.clone(),
            up.own,
            expiry,
            settings.ttl,
            settings.renew_margin,
        ))
    });
    let (tx, rx) = mpsc::channel::<Vec<crate::view::Event>>(64);
    let reconciling = tokio::spawn(reconciler.run(rx));
    let follower = tokio::spawn(follow(reg.clone(), key, tx));

    let exit = tokio::select! {
        s = stop_signal() => {
            info!("{s}: stopping; the lease and the datapath stay in place");
            Exit::Stopped
        }
        lost = follower => match lost {
            Ok(why) => Exit::LeaseLost(why),
            Err(e) => Exit::LeaseLost(LeaseLost::Follower(e)),
        },
    };
    if let Some(r) = renewer {
        r.abort();
    }
    reconciling.abort();
    Ok(exit)
}

async fn stop_signal() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without signal handlers the daemon still runs; a kill ends it.
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::registry::{Acquired, Entry, LeaseRequest, Listing, RegistryError};
    use futures::future::BoxFuture;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    /// A registry whose first watch falls behind a compaction, as etcd's does when a watcher
    /// lags (flannel-io/flannel#2470): the daemon must list once more and go on, not loop.
    struct Compacting {
        lists: AtomicUsize,
        watches: AtomicUsize,
        entries: Mutex<Vec<Entry>>,
    }

    const OTHER: &str = r#"{"PublicIP":"192.168.0.2","PublicIPv6":null,"BackendType":"vxlan"}"#;
    const LATE: &str = r#"{"PublicIP":"192.168.0.3","PublicIPv6":null,"BackendType":"vxlan"}"#;

    impl Registry for Compacting {
        fn describe(&self) -> String {
            "a compacting registry".into()
        }
        fn config_location(&self) -> String {
            "nowhere".into()
        }
        fn config(&self) -> BoxFuture<'_, crate::registry::Result<Option<Vec<u8>>>> {
            Box::pin(async { Ok(None) })
        }
        fn acquire<'a>(
            &'a self,
            _: &'a LeaseRequest<'a>,
        ) -> BoxFuture<'a, crate::registry::Result<Acquired>> {
            Box::pin(async { Err(RegistryError::DoesNotExpire(self.describe())) })
        }
        fn list(&self) -> BoxFuture<'_, crate::registry::Result<Listing>> {
            self.lists.fetch_add(1, Ordering::SeqCst);
            let entries = self.entries.lock().map(|e| e.clone()).unwrap_or_default();
            Box::pin(async move {
                Ok(Listing {
                    entries,
                    bad: Vec::new(),
                    revision: 7,
                    reserved: Vec::new(),
                })
            })
        }
        fn watch(&self, _: i64, tx: mpsc::Sender<Change>) -> BoxFuture<'_, WatchEnd> {
            Box::pin(async move {
                if self.watches.fetch_add(1, Ordering::SeqCst) == 0 {
                    // Meanwhile another node joined; the compacted watch never says so.
                    if let Ok(mut e) = self.entries.lock() {
                        e.push(Entry {
                            key: "10.5.3.0-24".into(),
                            value: LATE.as_bytes().to_vec(),
                        });
                    }
                    return WatchEnd::Compacted(9);
                }
                let _ = tx;
                std::future::pending().await
            })
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_compacted_watch_costs_one_resync_and_loses_no_lease() {
        let own = SubnetKey::parse("10.5.1.0-24").unwrap();
        let reg = Arc::new(Compacting {
            lists: AtomicUsize::new(0),
            watches: AtomicUsize::new(0),
            entries: Mutex::new(vec![
                Entry {
                    key: own.to_string(),
                    value: OTHER.replace("0.2", "0.1").into_bytes(),
                },
                Entry {
                    key: "10.5.2.0-24".into(),
                    value: OTHER.as_bytes().to_vec(),
                },
            ]),
        });
        let (tx, mut rx) = mpsc::channel(8);
        let task = tokio::spawn(follow(reg.clone(), own, tx));
        let mut added = Vec::new();
        while added.len() < 2 {
            let batch = tokio::time::timeout(Duration::from_secs(5), rx.recv())
                .await
                .expect("events within 5 s")
                .expect("the follower is running");
            for e in batch {
                if let crate::view::Event::Added(l) = e {
                    added.push(l.key.to_string());
                }
            }
        }
        assert_eq!(added, ["10.5.2.0-24", "10.5.3.0-24"]);
        // Give a looping follower time to show itself.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(
            reg.lists.load(Ordering::SeqCst),
            2,
            "one listing, one resync"
        );
        assert_eq!(reg.watches.load(Ordering::SeqCst), 2);
        task.abort();
    }

    #[test]
    fn renewal_comes_at_the_margin_or_a_third_of_a_short_lifetime() {
        let exp = SystemTime::UNIX_EPOCH + Duration::from_secs(100_000);
        let day = Duration::from_secs(86400);
        assert_eq!(
            renew_at(exp, day, Duration::from_secs(3600)),
            exp - Duration::from_secs(3600)
        );
        assert_eq!(
            renew_at(exp, Duration::from_secs(9), Duration::from_secs(3600)),
            exp - Duration::from_secs(3)
        );
        assert_eq!(renew_retry(day), Duration::from_secs(60));
        assert_eq!(renew_retry(Duration::from_secs(8)), Duration::from_secs(2));
    }

    #[test]
    fn the_previous_subnet_is_read_back() {
        use crate::bringup::previous_key;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("subnet.env");
        assert_eq!(previous_key(&path), None);
        std::fs::write(&path, "FLANNEL_NETWORK=10.5.0.0/16\nFLANNEL_SUBNET=10.5.52.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=false\n").unwrap();
        assert_eq!(previous_key(&path), SubnetKey::parse("10.5.52.0-24").ok());
        std::fs::write(&path, "garbage").unwrap();
        assert_eq!(previous_key(&path), None);
    }
}
