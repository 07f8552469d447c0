//! The three kinds the enforcer follows, each listed then watched through the suite's
//! Kubernetes client (a relist after 410, watches resumed, requests paced while they fail),
//! each change sent on to the enforcer's loop. A failure is said once when a kind's watch
//! starts failing and once when it works again; meanwhile what is known stays as it was.

use crate::enforcer::Update;
use crate::metrics::METRICS;
use crate::objects::Change;
use futures::StreamExt;
use kube_lite::{Event, Kind, KubeClient, Object, Selector, NAMESPACES, NETWORK_POLICIES, PODS};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;
use tracing::{info, warn};

/// What the loop hears: a change with when it came, or a commit to the table.
#[derive(Debug)]
pub enum Heard {
    Update(Box<Update>, Instant),
    /// Someone committed to the table (the committer's process id; None: announcements lost).
    Commit(Option<u32>),
}

/// Whether each kind's watch works now: namespaces, pods, policies.
static UP: [AtomicBool; 3] = [const { AtomicBool::new(false) }; 3];

fn set_up(i: usize, up: bool) {
    UP[i].store(up, Relaxed);
    let all = UP.iter().all(|u| u.load(Relaxed));
    METRICS.api_up.store(u64::from(all), Relaxed);
}

fn follow_kind<T: Object + Sync>(
    client: &KubeClient,
    kind: Kind,
    index: usize,
    wrap: fn(Change<T>) -> Update,
    tx: UnboundedSender<Heard>,
) {
    let mut events = Box::pin(client.watcher::<T>(kind, &Selector::all()));
    tokio::spawn(async move {
        let mut failing = false;
        while let Some(item) = events.next().await {
            let change = match item {
                Ok(Event::Listed(items)) => {
                    info!("listed {} {}", items.len(), kind.plural);
                    Change::Listed(items)
                }
                Ok(Event::Applied(o)) => Change::Applied(o),
                Ok(Event::Deleted(o)) => Change::Deleted(o),
                Err(e) => {
                    METRICS.api_errors.fetch_add(1, Relaxed);
                    if !failing {
                        warn!(
                            "watching {}: {e}; keeping what is enforced until it works again",
                            kind.plural
                        );
                    }
                    failing = true;
                    set_up(index, false);
                    continue;
                }
            };
            if failing {
                info!("watching {} works again", kind.plural);
                failing = false;
            }
            set_up(index, true);
            if tx
                .send(Heard::Update(Box::new(wrap(change)), Instant::now()))
                .is_err()
            {
                return;
            }
        }
    });
}

/// Lists and watches namespaces, pods and policies, sending every change to `tx`.
pub fn follow(client: &KubeClient, tx: UnboundedSender<Heard>) {
    follow_kind(client, NAMESPACES, 0, Update::Namespaces, tx.clone());
    follow_kind(client, PODS, 1, Update::Pods, tx.clone());
    follow_kind(client, NETWORK_POLICIES, 2, Update::Policies, tx);
}
