//! One reconcile loop over the planes of the node's state (the datapath's netlink entries and
//! devices, subnet.env, the firewall rules). Each plane reads what is held, plans what it
//! should hold from the node's spec and the other nodes' leases, and applies only the
//! difference; the loop only decides when each looks again: on lease events, on netlink
//! notifications about what it owns, and on its own resync timer. Events are reasons to look,
//! never records to trust, so start, restart, repair and normal operation are one code path,
//! and `flanneld doctor` is the same look with nothing written.
//!
//! Triggers that come in a burst (a transaction's leases, a device's entries deleted
//! together) become one pass: a pass starts once its triggers have been quiet for [`QUIET`],
//! or [`SETTLE`] after the first; once [`BURST`] leases have come, [`BURST_SETTLE`] after the
//! first, so that a burst still arriving is one pass, not one and a second that reads the
//! kernel's tables again. Each plane's pass runs as a task of its own, so that a slow
//! one (the firewall tools) never holds up another; lease events keep being taken during a
//! pass, so that the registry's follower is never held up either.

use crate::planes::{DynPlane, Leases, Others};
use crate::view::Event;
use cni_kernel::netlink::{Event as NlEvent, Events};
use futures::stream::{FuturesUnordered, StreamExt};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::warn;

/// A pass starts once its triggers have been quiet this long...
pub const QUIET: Duration = Duration::from_millis(5);
/// ...or this long after the first of them, whichever comes first.
pub const SETTLE: Duration = Duration::from_millis(50);
/// Leases gathered in one window that make it a burst: thousands of Node events reach the
/// daemon over 30 to 170 ms as the load goes.
pub const BURST: usize = 256;
/// A burst's pass starts once its triggers have been quiet for QUIET, or this long after the
/// first of them.
pub const BURST_SETTLE: Duration = Duration::from_millis(250);

struct Slot {
    /// None while a pass has it.
    plane: Option<Box<dyn DynPlane>>,
    follows: bool,
    listens: bool,
    resync: Duration,
    /// It should look again.
    dirty: bool,
    /// When its timer asks next.
    due: Instant,
}

/// When the pass of the triggers gathered so far starts.
struct Settle {
    at: Instant,
    first: Instant,
    /// Leases that came in this window.
    leases: usize,
}

/// Starts the settle window, or extends it up to its deadline; `leases` came with the trigger.
fn touch(settle: &mut Option<Settle>, leases: usize) {
    let now = Instant::now();
    let s = settle.get_or_insert(Settle {
        at: now,
        first: now,
        leases: 0,
    });
    s.leases += leases;
    let cap = if s.leases >= BURST {
        BURST_SETTLE
    } else {
        SETTLE
    };
    s.at = (now + QUIET).min(s.first + cap);
}

fn apply_batch(leases: &mut Leases, batch: Vec<Event>) {
    for e in batch {
        match e {
            Event::Added(l) => {
                leases.insert(l.key, l);
            }
            Event::Removed(l) => {
                leases.remove(&l.key);
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

type Running = FuturesUnordered<JoinHandle<(usize, Box<dyn DynPlane>)>>;

pub struct Reconciler {
    slots: Vec<Slot>,
}

impl Reconciler {
    pub fn new(planes: Vec<Box<dyn DynPlane>>) -> Reconciler {
        let now = Instant::now();
        Reconciler {
            slots: planes
                .into_iter()
                .map(|p| Slot {
                    follows: p.follows_leases(),
                    listens: p.listens(),
                    resync: p.resync(),
                    plane: Some(p),
                    dirty: false,
                    due: now,
                })
                .collect(),
        }
    }

    /// One pass of each plane before the other nodes' leases are known: the start's, which
    /// puts the node's own part in place (devices, firewall) before subnet.env is written.
    pub async fn first_pass(&mut self) {
        for plane in self.slots.iter_mut().filter_map(|s| s.plane.as_mut()) {
            plane.pass(Others::Unknown).await;
        }
    }

    /// Marks the idle or busy planes `which` selects; whether any was.
    fn mark(&mut self, which: impl Fn(&Slot) -> bool) -> bool {
        let mut any = false;
        for s in self.slots.iter_mut().filter(|s| which(s)) {
            s.dirty = true;
            any = true;
        }
        any
    }

    /// Starts a pass of every plane that should look again and is not looking already; lease
    /// followers once the leases are known.
    fn start(&mut self, running: &Running, leases: &Arc<Leases>, known: bool, changed: &mut bool) {
        let mut followed = false;
        for (i, s) in self.slots.iter_mut().enumerate() {
            if !s.dirty || (s.follows && !known) {
                continue;
            }
            let Some(mut plane) = s.plane.take() else {
                continue;
            };
            s.dirty = false;
            followed |= s.follows;
            let others = Others::Known {
                leases: leases.clone(),
                changed: *changed,
            };
            running.push(tokio::spawn(async move {
                plane.pass(others).await;
                (i, plane)
            }));
        }
        if followed {
            *changed = false;
        }
    }

    /// Follows the lease events until they end, passing each plane when a trigger asks.
    pub async fn run(mut self, mut events: mpsc::Receiver<Vec<Event>>) {
        let mut leases: Arc<Leases> = Arc::default();
        // The first batch is the registry's listing (empty when no other node holds a lease):
        // lease followers do not look before it, so that a start never sees "no nodes".
        let mut known = false;
        let mut changed = false;
        let mut notes = if self.slots.iter().any(|s| s.listens) {
            match Events::subscribe() {
                Ok(n) => Some(n),
                Err(e) => {
                    warn!("{e}: repairs wait for the resync timers");
                    None
                }
            }
        } else {
            None
        };
        let now = Instant::now();
        for s in &mut self.slots {
            s.due = now + s.resync;
        }
        let mut waiting: Vec<Vec<Event>> = Vec::new();
        let mut settle: Option<Settle> = None;
        let mut running: Running = FuturesUnordered::new();
        loop {
            // Lease events wait while a pass reads the leases.
            let reading = self.slots.iter().any(|s| s.follows && s.plane.is_none());
            if !waiting.is_empty() && !reading {
                let map = Arc::make_mut(&mut leases);
                for b in waiting.drain(..) {
                    apply_batch(map, b);
                }
                known = true;
                changed = true;
                self.mark(|s| s.follows);
                touch(&mut settle, 0);
            }
            // Notifications are left unread while a listener writes: a burst of its own
            // overflows the socket (one "look again") instead of costing it time.
            let writing = self.slots.iter().any(|s| s.listens && s.plane.is_none());
            let next_due = self
                .slots
                .iter()
                .map(|s| s.due)
                .min()
                .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
            let settle_at = settle.as_ref().map(|s| s.at);
            tokio::select! {
                b = events.recv() => match b {
                    Some(b) => {
                        let n = b.len();
                        waiting.push(b);
                        touch(&mut settle, n);
                    }
                    None => return,
                },
                n = next_note(&mut notes), if !writing => match n {
                    Some(ev) => {
                        let concerned = self.mark(|s| {
                            s.listens && s.plane.as_ref().is_some_and(|p| p.concerns(&ev))
                        });
                        if concerned || settle.is_some() {
                            touch(&mut settle, 0);
                        }
                    }
                    None => {
                        warn!("the netlink notifications ended: repairs wait for the resync timers");
                        notes = None;
                    }
                },
                _ = tokio::time::sleep_until(next_due) => {
                    let now = Instant::now();
                    for s in self.slots.iter_mut().filter(|s| s.due <= now) {
                        s.dirty = true;
                        s.due = now + s.resync;
                    }
                    touch(&mut settle, 0);
                }
                _ = tokio::time::sleep_until(settle_at.unwrap_or(next_due)), if settle_at.is_some() => {
                    settle = None;
                    self.start(&running, &leases, known, &mut changed);
                }
                Some(done) = running.next() => match done {
                    Ok((i, plane)) => {
                        self.slots[i].plane = Some(plane);
                        if self.slots[i].dirty {
                            touch(&mut settle, 0);
                        }
                    }
                    Err(e) => std::panic::resume_unwind(e.into_panic()),
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::{Lease, SubnetKey};
    use crate::planes::Plane;
    use std::sync::Mutex;

    /// A plane that records each pass: whether it knew the leases, how many, and whether
    /// they had changed.
    struct Recorder {
        follows: bool,
        resync: Duration,
        passes: Log,
        /// How long a pass takes.
        busy: Duration,
    }

    /// What the recorder saw: whether it knew the leases, how many, and whether they had
    /// changed.
    struct Seen(Option<(usize, bool)>);

    impl crate::planes::Plan for Seen {
        fn is_empty(&self) -> bool {
            false
        }
        fn findings(&self) -> Vec<crate::report::Finding> {
            Vec::new()
        }
    }

    impl Plane for Recorder {
        type Plan = Seen;
        const KIND: &'static str = "recorder";

        fn resync(&self) -> Duration {
            self.resync
        }
        fn follows_leases(&self) -> bool {
            self.follows
        }
        async fn plan(&mut self, others: &Others) -> Result<Seen, crate::planes::PassError> {
            tokio::time::sleep(self.busy).await;
            Ok(Seen(match others {
                Others::Unknown => None,
                Others::Known { leases, changed } => Some((leases.len(), *changed)),
            }))
        }
        async fn apply(&mut self, seen: Seen, _: &Others) {
            if let Ok(mut p) = self.passes.lock() {
                p.push(seen.0);
            }
        }
        fn failed(&mut self, _: crate::planes::PassError, _: &Others) {}
    }

    fn lease(i: u8) -> Arc<Lease> {
        Arc::new(Lease {
            key: SubnetKey::parse(&format!("10.5.{i}.0-24")).unwrap(),
            attrs: crate::lease::LeaseAttrs::decode(
                br#"{"PublicIP":"192.168.0.2","BackendType":"vxlan"}"#,
            )
            .unwrap(),
        })
    }

    type Log = Arc<Mutex<Vec<Option<(usize, bool)>>>>;

    fn recorder(follows: bool, resync: Duration, busy: Duration) -> (Box<dyn DynPlane>, Log) {
        let passes: Log = Arc::default();
        (
            Box::new(Recorder {
                follows,
                resync,
                passes: passes.clone(),
                busy,
            }),
            passes,
        )
    }

    fn taken(log: &Log) -> Vec<Option<(usize, bool)>> {
        log.lock().map(|p| p.clone()).unwrap_or_default()
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_burst_is_one_pass_and_followers_wait_for_the_listing() {
        let (datapath, dp) = recorder(true, Duration::from_secs(10), Duration::ZERO);
        let (firewall, fw) = recorder(false, Duration::from_secs(5), Duration::ZERO);
        let mut r = Reconciler::new(vec![datapath, firewall]);
        r.first_pass().await;
        assert_eq!(taken(&dp), [None]);
        assert_eq!(taken(&fw), [None]);
        let (tx, rx) = mpsc::channel(8);
        let task = tokio::spawn(r.run(rx));
        // Past the datapath's timer without a listing: it does not look; the firewall does.
        tokio::time::sleep(Duration::from_secs(11)).await;
        assert_eq!(taken(&dp), [None]);
        assert_eq!(taken(&fw).len(), 3);
        // The listing, in three batches close together: one pass with all of them.
        for i in 1..=3 {
            tx.send(vec![Event::Added(lease(i))]).await.unwrap();
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(taken(&dp), [None, Some((3, true))]);
        // Its timer: a pass with nothing changed.
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(taken(&dp).last(), Some(&Some((3, false))));
        task.abort();
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_burst_still_arriving_past_the_settle_window_is_one_pass() {
        let (datapath, dp) = recorder(true, Duration::from_secs(10), Duration::ZERO);
        let r = Reconciler::new(vec![datapath]);
        let (tx, rx) = mpsc::channel(64);
        let task = tokio::spawn(r.run(rx));
        tx.send(Vec::new()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(taken(&dp), [Some((0, true))]);
        // 2,000 leases in twenty batches 4 ms apart: 76 ms, past SETTLE, under BURST_SETTLE.
        let mut i = 0u32;
        for _ in 0..20 {
            let batch = (0..100)
                .map(|_| {
                    i += 1;
                    Event::Added(Arc::new(Lease {
                        key: SubnetKey::parse(&format!("10.{}.{}.0-24", 6 + i / 256, i % 256))
                            .unwrap(),
                        attrs: lease(1).attrs.clone(),
                    }))
                })
                .collect();
            tx.send(batch).await.unwrap();
            tokio::time::sleep(Duration::from_millis(4)).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(taken(&dp), [Some((0, true)), Some((2000, true))]);
        // One lease alone is not held up by the burst's window.
        let sent = Instant::now();
        tx.send(vec![Event::Added(lease(1))]).await.unwrap();
        while taken(&dp).len() < 3 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(sent.elapsed() <= QUIET + Duration::from_millis(2));
        task.abort();
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn leases_that_arrive_during_a_pass_come_in_the_next_and_a_slow_plane_holds_up_no_other()
    {
        let (datapath, dp) = recorder(true, Duration::from_secs(10), Duration::from_millis(200));
        let (firewall, fw) = recorder(false, Duration::from_millis(300), Duration::from_secs(2));
        let r = Reconciler::new(vec![datapath, firewall]);
        let (tx, rx) = mpsc::channel(8);
        let task = tokio::spawn(r.run(rx));
        tx.send(Vec::new()).await.unwrap();
        // The firewall's first pass starts at 300 ms and takes 2 s.
        tokio::time::sleep(Duration::from_millis(310)).await;
        tx.send(vec![Event::Added(lease(1))]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        tx.send(vec![Event::Added(lease(2))]).await.unwrap();
        // The second batch waits for the first's pass, then gets its own at once.
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(
            taken(&dp),
            [Some((0, true)), Some((1, true)), Some((2, true))]
        );
        assert!(
            taken(&fw).is_empty(),
            "the firewall is still in its first pass"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(taken(&fw).len(), 1);
        task.abort();
    }
}
