//! The enforcer's loop: changes and commits heard, passes run once they settle, the table
//! read back at each resync; until SIGTERM, which leaves the table as it is, so that a restart
//! neither opens nor closes anything.

use crate::enforcer::{Enforcer, Pass};
use crate::flags::Flags;
use crate::kernel::Nft;
use crate::metrics::METRICS;
use crate::nft::TABLE;
use crate::watch::{self, Heard};
use cni_kernel::nft_commits::{Commit, TableCommits};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};
use tokio::time::Instant;
use tracing::{error, info, warn};

/// A pass starts once its triggers have been quiet this long...
const QUIET: Duration = Duration::from_millis(5);
/// ...or this long after the first of them, whichever comes first.
const SETTLE: Duration = Duration::from_millis(50);
/// After a failed pass the next waits from this, doubling...
const FIRST_RETRY: Duration = Duration::from_millis(500);
/// ...up to this.
const MAX_RETRY: Duration = Duration::from_secs(30);

/// Hears the kernel's announcements of commits to the table, on a thread of its own.
fn hear_commits(tx: UnboundedSender<Heard>) -> Result<(), String> {
    let mut commits = TableCommits::subscribe("inet", TABLE)
        .map_err(|e| format!("listening for commits: {e}"))?;
    std::thread::Builder::new()
        .name("nft-commits".into())
        .spawn(move || loop {
            let heard = match commits.wait() {
                Ok(Commit::By(pid)) => Heard::Commit(Some(pid)),
                Ok(Commit::Lost) => Heard::Commit(None),
                Err(e) => {
                    warn!("{e}; changes to the table are found at the resyncs only");
                    return;
                }
            };
            if tx.send(heard).is_err() {
                return;
            }
        })
        .map(|_| ())
        .map_err(|e| format!("starting the commits' thread: {e}"))
}

/// When the pass of the triggers so far starts.
struct Settle {
    at: Instant,
    deadline: Instant,
}

fn touch(settle: &mut Option<Settle>) {
    let now = Instant::now();
    match settle {
        Some(s) => s.at = (now + QUIET).min(s.deadline),
        None => {
            *settle = Some(Settle {
                at: now + QUIET,
                deadline: now + SETTLE,
            })
        }
    }
}

fn said(pass: &Pass, e: &Enforcer, repair: bool) {
    for p in &pass.new_problems {
        warn!("{p}: enforced as allowing nothing");
    }
    let s = e.sizes();
    METRICS.set_sizes(&s);
    METRICS.passes.fetch_add(1, Relaxed);
    if pass.wrote == 0 {
        return;
    }
    METRICS.transactions.fetch_add(1, Relaxed);
    if repair {
        METRICS.repairs.fetch_add(1, Relaxed);
    }
    info!(
        "{} table inet {TABLE}: {} lines; {} policies, {} pods here, isolated {} for ingress and {} for egress, {} set elements; compiled in {:.1?}, {}written in {:.1?}",
        if repair { "repaired" } else { "wrote" },
        pass.wrote,
        s.policies,
        s.local_pods,
        s.isolated_ingress,
        s.isolated_egress,
        s.elements,
        pass.compiled_in,
        if pass.read { format!("read back in {:.1?}, ", pass.read_in) } else { String::new() },
        pass.written_in
    );
}

/// Runs until SIGTERM or SIGINT; the exit status.
pub async fn run(flags: &Flags, node: String, client: kube_lite::KubeClient) -> u8 {
    let (tx, mut rx) = unbounded_channel();
    if let Err(e) = hear_commits(tx.clone()) {
        warn!("{e}; changes to the table are found at the resyncs only");
    }
    watch::follow(&client, tx);
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            error!("listening for SIGTERM: {e}");
            return 1;
        }
    };
    let resync = (flags.resync > 0).then(|| Duration::from_secs(flags.resync));
    let mut next_resync = resync.map(|r| Instant::now() + r);
    let mut enforcer = Some(Enforcer::new(&node));
    let mut settle: Option<Settle> = None;
    let mut retry = FIRST_RETRY;
    let mut repair = false;
    let mut announced = false;
    loop {
        let wake = settle.as_ref().map(|s| s.at);
        tokio::select! {
            heard = rx.recv() => {
                let Some(heard) = heard else { return 1 };
                let e = enforcer.as_mut().expect("the enforcer is back after each pass");
                match heard {
                    Heard::Update(u, at) => {
                        if e.update(*u, at) {
                            touch(&mut settle);
                        } else if settle.is_none() && announced {
                            // Nothing to write for it, nothing else pending: the kernel holds it.
                            METRICS.applied_version.store(e.seen_version(), Relaxed);
                        }
                    }
                    Heard::Commit(pid) => {
                        if e.committed(pid, std::time::Instant::now()) {
                            match pid {
                                Some(p) => info!("table inet {TABLE} changed by process {p}: reading it back"),
                                None => info!("announcements of changes to table inet {TABLE} were lost: reading it back"),
                            }
                            repair = true;
                            touch(&mut settle);
                        }
                    }
                }
            }
            _ = tokio::time::sleep_until(wake.unwrap_or_else(Instant::now)), if wake.is_some() => {
                let mut e = enforcer.take().expect("the enforcer is back after each pass");
                if !e.knows_the_cluster() {
                    enforcer = Some(e);
                    settle = None;
                    continue;
                }
                if !announced {
                    let o = e.objects();
                    info!(
                        "the cluster is known ({} namespaces, {} pods, {} policies): enforcing for the pods of node {}",
                        o.namespaces.len(), o.pods.len(), o.policies.len(), e.node()
                    );
                    announced = true;
                }
                let version = e.seen_version();
                let (e, result) = tokio::task::spawn_blocking(move || {
                    let r = e.pass(&mut Nft);
                    (e, r)
                })
                .await
                .unwrap_or_else(|p| std::panic::resume_unwind(p.into_panic()));
                enforcer = Some(e);
                let e = enforcer.as_mut().expect("just put back");
                match result {
                    Ok(pass) => {
                        said(&pass, e, repair && pass.read);
                        METRICS.applied_version.store(version, Relaxed);
                        repair = false;
                        if let Some(t) = e.take_pending_since() {
                            METRICS.event_applied(t.elapsed());
                        }
                        retry = FIRST_RETRY;
                        settle = None;
                    }
                    Err(err) => {
                        METRICS.write_errors.fetch_add(1, Relaxed);
                        error!("{err}; trying again in {retry:?}");
                        let at = Instant::now() + retry;
                        settle = Some(Settle { at, deadline: at });
                        retry = (retry * 2).min(MAX_RETRY);
                    }
                }
            }
            _ = tokio::time::sleep_until(next_resync.unwrap_or_else(Instant::now)), if next_resync.is_some() => {
                next_resync = resync.map(|r| Instant::now() + r);
                if let Some(e) = enforcer.as_mut() {
                    e.forget_table();
                    repair = true;
                    touch(&mut settle);
                }
            }
            _ = term.recv() => {
                info!("SIGTERM: stopping; table inet {TABLE} stays as it is");
                return 0;
            }
            _ = tokio::signal::ctrl_c() => {
                info!("SIGINT: stopping; table inet {TABLE} stays as it is");
                return 0;
            }
        }
    }
}
