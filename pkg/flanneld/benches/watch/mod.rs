//! A netlink listener in a node's namespace that counts the kernel's notifications of datapath
//! entries, so that a benchmark times a burst until its last notification without dumping
//! tables (repeated dumps take CPU and the RTNL lock from what is being timed, and see the end
//! late).

use cni_kernel::netlink::{Event, Events};
use cni_kernel::Netns;
use futures::StreamExt;
use ipnetwork::Ipv4Network;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Notifications of one direction, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// IPv4 routes into the network.
    pub routes: usize,
    /// Permanent neighbours (added) or any (removed) for addresses in the network.
    pub neighbours: usize,
    /// A device's forwarding entries with a destination.
    pub fdb: usize,
    pub nexthops: usize,
}

impl Counts {
    /// Whether every kind has reached `want`'s count.
    fn reached(&self, want: &Counts) -> bool {
        self.routes >= want.routes
            && self.neighbours >= want.neighbours
            && self.fdb >= want.fdb
            && self.nexthops >= want.nexthops
    }
}

#[derive(Default)]
struct State {
    added: Counts,
    removed: Counts,
    /// When the last counted notification arrived.
    last: Option<Instant>,
    overflowed: bool,
}

/// The listener; it stops when dropped.
pub struct Watch {
    state: Arc<(Mutex<State>, Condvar)>,
    stop: Option<futures::channel::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// A receive buffer that holds the notifications of 50,000 nodes (three entries and a nexthop
/// each) should the listener fall behind.
const BUFFER: usize = 256 << 20;

impl Watch {
    /// Listens in the namespace at `ns_path`, counting entries that concern `network`.
    pub fn start(ns_path: &std::path::Path, network: Ipv4Network) -> Watch {
        let ns = Netns::open(ns_path).expect("the node's namespace");
        let state = Arc::new((Mutex::new(State::default()), Condvar::new()));
        let (stop, stopped) = futures::channel::oneshot::channel::<()>();
        let (ready_tx, ready) = std::sync::mpsc::channel();
        let shared = state.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the listener");
            rt.block_on(async move {
                let mut events = Events::subscribe_in_with_buffer(&ns, BUFFER)
                    .expect("listening to the node's netlink notifications");
                let _ = ready_tx.send(());
                let mut stopped = stopped;
                loop {
                    tokio::select! {
                        _ = &mut stopped => return,
                        e = events.next() => match e {
                            Some(e) => count(&shared, &e, network),
                            None => return,
                        },
                    }
                }
            });
        });
        ready
            .recv_timeout(Duration::from_secs(10))
            .expect("the listener subscribed within 10 s");
        Watch {
            state,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Forgets what was counted so far.
    pub fn reset(&self) {
        *self.state.0.lock().expect("the listener's state") = State::default();
    }

    /// Waits until at least `added` and `removed` have been announced since the last reset,
    /// and returns when the last of them arrived. Gives up after `timeout`, saying what it saw.
    pub fn wait(&self, added: Counts, removed: Counts, timeout: Duration) -> Instant {
        let (lock, changed) = &*self.state;
        let deadline = Instant::now() + timeout;
        let mut s = lock.lock().expect("the listener's state");
        loop {
            assert!(
                !s.overflowed,
                "the listener's buffer overflowed: notifications were lost"
            );
            if s.added.reached(&added) && s.removed.reached(&removed) {
                return s.last.expect("a counted notification has a time");
            }
            let now = Instant::now();
            assert!(
                now < deadline,
                "after {timeout:?} the kernel announced {:?} added and {:?} removed, not {added:?} and {removed:?}",
                s.added,
                s.removed
            );
            s = changed
                .wait_timeout(s, deadline - now)
                .expect("the listener's state")
                .0;
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Route,
    Neighbour,
    Fdb,
    Nexthop,
}

fn count(state: &(Mutex<State>, Condvar), e: &Event, network: Ipv4Network) {
    let inside = |ip: &IpAddr| match ip {
        IpAddr::V4(v4) => network.contains(*v4),
        IpAddr::V6(_) => false,
    };
    let (lock, changed) = state;
    let (kind, removed) = match e {
        Event::Route { route, removed } if inside(&route.dst.ip()) && route.dst.prefix() > 0 => {
            (Kind::Route, *removed)
        }
        Event::Neighbour { neighbour, removed }
            if inside(&neighbour.ip) && (*removed || neighbour.permanent) =>
        {
            (Kind::Neighbour, *removed)
        }
        Event::Fdb { entry, removed } if entry.dst.is_some() => (Kind::Fdb, *removed),
        Event::Nexthop { removed, .. } => (Kind::Nexthop, *removed),
        Event::Overflow => {
            lock.lock().expect("the listener's state").overflowed = true;
            changed.notify_all();
            return;
        }
        _ => return,
    };
    let mut s = lock.lock().expect("the listener's state");
    let c = if removed {
        &mut s.removed
    } else {
        &mut s.added
    };
    match kind {
        Kind::Route => c.routes += 1,
        Kind::Neighbour => c.neighbours += 1,
        Kind::Fdb => c.fdb += 1,
        Kind::Nexthop => c.nexthops += 1,
    }
    s.last = Some(Instant::now());
    changed.notify_all();
}

/// Node `i`'s subnet (10.1.0.0/24 upwards), public address (172.16.0.2 upwards; a bench that
/// routes via it puts it on the node's eth0 link) and VtepMAC: the remote nodes of the benches.
pub fn peer(i: usize) -> (Ipv4Addr, Ipv4Addr, String) {
    let i = i as u32;
    (
        Ipv4Addr::from(0x0a01_0000 + (i << 8)),
        Ipv4Addr::from(0xac10_0002 + i),
        format!(
            "02:00:00:{:02x}:{:02x}:{:02x}",
            (i >> 16) & 0xff,
            (i >> 8) & 0xff,
            i & 0xff
        ),
    )
}
