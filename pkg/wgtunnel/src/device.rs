//! The userspace WireGuard device: a TUN device, the UDP sockets of its listen port, and
//! the peers between them.
//!
//! Threads: a reader per TUN queue (`tx`: a burst of super-packets cut, sealed and sent as
//! GSO runs), a reader per socket (`rx`: a burst of GRO messages opened, checked and written
//! to TUN joined), the timers, the UAPI server, and the crypto pool both readers split their
//! batches over. A packet is never allocated on the way: each reader owns its buffers.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tunio::{Run, SendScratch, Tun, TunOptions};

use crate::allowed::AllowedIps;
use crate::cookie::Checker;
use crate::noise::{self, Identity, INITIATION_MAC1, RESPONSE_MAC1};
use crate::peer::{lock, Peer};
use crate::pool::Pool;
use crate::session::{Session, REJECT_AFTER_TIME};
use crate::timers::{Due, JITTER_MAX_MS, KEEPALIVE_TIMEOUT, REKEY_TIMEOUT};
use crate::udp::Sockets;
use wireguard::Key;

const TIMER_TICK: Duration = Duration::from_millis(100);
/// Initiations a second past which senders must prove their address with a cookie.
const UNDER_LOAD_HANDSHAKES: u32 = 128;
/// The least time between two initiations accepted from one peer.
const INITIATION_RATE: Duration = Duration::from_millis(20);

pub(crate) struct State {
    pub identity: Option<Arc<Identity>>,
    pub checker: Option<Mutex<Checker>>,
    pub fwmark: u32,
    pub peers: HashMap<Key, Arc<Peer>>,
    pub allowed: AllowedIps<Arc<Peer>>,
}

/// What a receiver index names: a peer's handshake in progress, or one of its sessions.
#[derive(Clone)]
pub(crate) struct Indexed {
    pub peer: Arc<Peer>,
    pub session: Option<Arc<Session>>,
}

/// The sockets in use, and whether readers of an older set should stop.
pub(crate) struct Bound {
    pub sockets: Arc<Sockets>,
    pub generation: u64,
}

pub struct Device {
    pub(crate) name: String,
    pub(crate) tun: Tun,
    pub(crate) state: RwLock<State>,
    pub(crate) bound: RwLock<Bound>,
    pub(crate) index: RwLock<HashMap<u32, Indexed>>,
    pub(crate) pool: Pool,
    /// The TUN device's MTU, read again each second: WireGuard pads up to it.
    pub(crate) mtu: AtomicUsize,
    handshakes: AtomicU32,
    loaded: AtomicBool,
    stop_reason: Mutex<Option<String>>,
    stopped: Condvar,
    pub(crate) is_stopped: AtomicBool,
}

/// `N` random bytes from the kernel.
pub(crate) fn random<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    let mut got = 0;
    while got < N {
        // SAFETY: writes at most N - got bytes into b's remaining room.
        let n = unsafe { libc::getrandom(b[got..].as_mut_ptr().cast(), N - got, 0) };
        if n > 0 {
            got += n as usize;
        }
    }
    b
}

fn jitter() -> Duration {
    let r = u64::from_le_bytes(random::<8>());
    Duration::from_millis(r % JITTER_MAX_MS)
}

impl Device {
    /// Makes TUN device `name` with `queues` queues, binds a free port, and starts the
    /// threads; `workers` crypto threads besides the readers.
    pub fn start(name: &str, queues: usize, workers: usize) -> std::io::Result<Arc<Device>> {
        let tun = Tun::open(
            name,
            &TunOptions {
                queues,
                offloads: true,
            },
        )?;
        let mtu = tun.mtu().unwrap_or(1420);
        let sockets = Arc::new(Sockets::bind(0, 0)?);
        let dev = Arc::new(Device {
            name: name.to_string(),
            tun,
            state: RwLock::new(State {
                identity: None,
                checker: None,
                fwmark: 0,
                peers: HashMap::new(),
                allowed: AllowedIps::default(),
            }),
            bound: RwLock::new(Bound {
                sockets: sockets.clone(),
                generation: 0,
            }),
            index: RwLock::new(HashMap::new()),
            pool: Pool::new(workers)?,
            mtu: AtomicUsize::new(mtu),
            handshakes: AtomicU32::new(0),
            loaded: AtomicBool::new(false),
            stop_reason: Mutex::new(None),
            stopped: Condvar::new(),
            is_stopped: AtomicBool::new(false),
        });
        for q in 0..dev.tun.queues() {
            let d = dev.clone();
            thread::Builder::new()
                .name(format!("tun-{q}"))
                .spawn(move || d.run_tun_reader(q))?;
        }
        dev.spawn_socket_readers(&sockets, 0)?;
        let d = dev.clone();
        thread::Builder::new()
            .name("timers".into())
            .spawn(move || d.run_timers())?;
        Ok(dev)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The TUN offloads the kernel granted (TUNSETOFFLOAD flags).
    pub fn offloads(&self) -> u32 {
        self.tun.offloads()
    }

    /// Ends the device's work; `wait` returns the reason.
    pub fn stop(&self, reason: String) {
        let mut r = lock(&self.stop_reason);
        if r.is_none() {
            *r = Some(reason);
        }
        self.is_stopped.store(true, Ordering::SeqCst);
        self.stopped.notify_all();
    }

    /// Blocks until the device stops, and says why.
    pub fn wait(&self) -> String {
        let mut r = lock(&self.stop_reason);
        loop {
            if let Some(reason) = r.as_ref() {
                return reason.clone();
            }
            r = self.stopped.wait(r).unwrap_or_else(|e| e.into_inner());
        }
    }

    pub(crate) fn read_state(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn write_state(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn sockets(&self) -> (Arc<Sockets>, u64) {
        let b = self.bound.read().unwrap_or_else(|e| e.into_inner());
        (b.sockets.clone(), b.generation)
    }

    pub(crate) fn spawn_socket_readers(
        self: &Arc<Self>,
        sockets: &Arc<Sockets>,
        generation: u64,
    ) -> std::io::Result<()> {
        let families = [Some(0usize), sockets.v6.as_ref().map(|_| 1)];
        for (i, family) in families.into_iter().flatten().enumerate() {
            let d = self.clone();
            let s = sockets.clone();
            let queue = i % self.tun.queues();
            thread::Builder::new()
                .name(format!("udp-{}", if family == 0 { "v4" } else { "v6" }))
                .spawn(move || {
                    let sock = if family == 0 {
                        &s.v4
                    } else {
                        s.v6.as_ref().unwrap_or(&s.v4)
                    };
                    d.run_socket_reader(sock, queue, generation)
                })?;
        }
        Ok(())
    }

    /// Sends handshake or keepalive bytes to `dst` through the socket of its family.
    pub(crate) fn send_one(&self, dst: SocketAddr, bytes: &[u8]) {
        let (sockets, _) = self.sockets();
        if let Some(s) = sockets.for_addr(&dst) {
            let _ = s.socket().send_to(bytes, dst);
        }
    }

    /// A receiver index not in use, registered for `peer`'s handshake.
    fn new_index(&self, peer: &Arc<Peer>) -> u32 {
        let mut index = self.index.write().unwrap_or_else(|e| e.into_inner());
        loop {
            let i = u32::from_le_bytes(random::<4>());
            if i != 0 && !index.contains_key(&i) {
                index.insert(
                    i,
                    Indexed {
                        peer: peer.clone(),
                        session: None,
                    },
                );
                return i;
            }
        }
    }

    pub(crate) fn forget_indices(&self, indices: impl IntoIterator<Item = u32>) {
        let mut index = self.index.write().unwrap_or_else(|e| e.into_inner());
        for i in indices {
            index.remove(&i);
        }
    }

    fn register_session(&self, peer: &Arc<Peer>, s: &Arc<Session>) {
        let mut index = self.index.write().unwrap_or_else(|e| e.into_inner());
        index.insert(
            s.local_index,
            Indexed {
                peer: peer.clone(),
                session: Some(s.clone()),
            },
        );
    }

    pub(crate) fn lookup(&self, i: u32) -> Option<Indexed> {
        self.index
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&i)
            .cloned()
    }

    /// Every session and handshake of `peer` dropped (its keys erased, or it is removed).
    pub(crate) fn zero_keys(&self, peer: &Peer) {
        let mut gone: Vec<u32> = peer.drop_sessions().iter().map(|s| s.local_index).collect();
        gone.extend(lock(&peer.handshake).pending.take().map(|p| p.local_index));
        self.forget_indices(gone);
    }

    /// Sends an initiation to `peer` unless one went less than REKEY_TIMEOUT ago; `retry`:
    /// the same handshake attempted again.
    pub(crate) fn initiate(&self, state: &State, peer: &Arc<Peer>, retry: bool) {
        if !retry {
            lock(&peer.timers).attempts = 0;
        }
        let (Some(id), Some(dst)) = (&state.identity, peer.endpoint()) else {
            return;
        };
        let now = Instant::now();
        let msg = {
            let mut hs = lock(&peer.handshake);
            if hs
                .last_sent
                .is_some_and(|t| now.duration_since(t) < REKEY_TIMEOUT)
            {
                return;
            }
            let local_index = self.new_index(peer);
            let wall = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            let made =
                noise::initiation(id, &mut hs.keys, random(), local_index, noise::tai64n(wall));
            let Ok((mut msg, pending)) = made else {
                self.forget_indices([local_index]);
                return;
            };
            hs.stamper.stamp(&mut msg, INITIATION_MAC1, now);
            if let Some(old) = hs.pending.replace(pending) {
                self.forget_indices([old.local_index]);
            }
            hs.last_sent = Some(now);
            msg
        };
        self.send_one(dst, &msg);
        let mut t = lock(&peer.timers);
        t.traversal(now, peer.keepalive());
        t.any_sent();
        t.handshake_initiated(now, jitter());
    }

    /// Whether initiations come so fast that senders must show a cookie first.
    fn under_load(&self) -> bool {
        self.loaded.load(Ordering::Relaxed)
            || self.handshakes.load(Ordering::Relaxed) >= UNDER_LOAD_HANDSHAKES
    }

    /// A handshake message (initiation, response, cookie reply) from `src`.
    pub(crate) fn handshake_message(&self, state: &State, src: SocketAddr, msg: &[u8]) {
        let Some(id) = state.identity.clone() else {
            return;
        };
        let now = Instant::now();
        let mac1_at = match (msg[0], msg.len()) {
            (noise::MSG_INITIATION, noise::INITIATION_LEN) => INITIATION_MAC1,
            (noise::MSG_RESPONSE, noise::RESPONSE_LEN) => RESPONSE_MAC1,
            (noise::MSG_COOKIE, noise::COOKIE_LEN) => {
                let receiver = u32::from_le_bytes([msg[4], msg[5], msg[6], msg[7]]);
                if let Some(e) = self.lookup(receiver) {
                    lock(&e.peer.handshake).stamper.take_reply(msg, now);
                }
                return;
            }
            _ => return,
        };
        if msg[0] == noise::MSG_INITIATION {
            self.handshakes.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(checker) = &state.checker {
            let checker = lock(checker);
            match checker.check(msg, mac1_at, &src) {
                crate::cookie::Macs::Bad => return,
                crate::cookie::Macs::Mac1 if self.under_load() => {
                    let reply = checker.reply(msg, mac1_at, &src, random());
                    drop(checker);
                    self.send_one(src, &reply);
                    return;
                }
                _ => {}
            }
        }
        if msg[0] == noise::MSG_INITIATION {
            self.accept_initiation(state, &id, src, msg, now);
        } else {
            self.accept_response(state, &id, src, msg, now);
        }
    }

    fn accept_initiation(
        &self,
        state: &State,
        id: &Identity,
        src: SocketAddr,
        msg: &[u8],
        now: Instant,
    ) {
        let Ok(half) = noise::initiation_sender(id, msg) else {
            return;
        };
        let Some(peer) = state.peers.get(&Key(half.peer_public)).cloned() else {
            return;
        };
        let (mut reply, keys) = {
            let mut hs = lock(&peer.handshake);
            if hs
                .last_accepted
                .is_some_and(|t| now.duration_since(t) < INITIATION_RATE)
            {
                return;
            }
            let newest = hs.newest_timestamp;
            let Ok(accepted) = noise::accept_initiation(id, half, &mut hs.keys, msg, newest) else {
                return;
            };
            hs.newest_timestamp = Some(accepted.timestamp);
            hs.last_accepted = Some(now);
            let local_index = self.new_index(&peer);
            let Ok(made) = noise::response(&hs.keys, &accepted, random(), local_index) else {
                self.forget_indices([local_index]);
                return;
            };
            // Answering supersedes an initiation of ours still waiting.
            if let Some(old) = hs.pending.take() {
                self.forget_indices([old.local_index]);
            }
            made
        };
        lock(&peer.handshake)
            .stamper
            .stamp(&mut reply, RESPONSE_MAC1, now);
        let session = Arc::new(Session::new(&keys, false, now));
        self.register_session(&peer, &session);
        let gone = peer.begin_as_responder(session);
        self.forget_indices(gone.iter().map(|s| s.local_index));
        peer.set_endpoint(src);
        self.send_one(src, &reply);
        let mut t = lock(&peer.timers);
        t.session_derived(now);
        t.traversal(now, peer.keepalive());
        t.any_sent();
    }

    fn accept_response(
        &self,
        state: &State,
        id: &Identity,
        src: SocketAddr,
        msg: &[u8],
        now: Instant,
    ) {
        let receiver = u32::from_le_bytes([msg[8], msg[9], msg[10], msg[11]]);
        let Some(Indexed { peer, .. }) = self.lookup(receiver) else {
            return;
        };
        let keys = {
            let mut hs = lock(&peer.handshake);
            let Some(pending) = hs.pending.take() else {
                return;
            };
            match noise::accept_response(id, &hs.keys, &pending, msg) {
                Ok(k) => k,
                Err(_) => {
                    hs.pending = Some(pending);
                    return;
                }
            }
        };
        let session = Arc::new(Session::new(&keys, true, now));
        self.register_session(&peer, &session);
        let gone = peer.begin_as_initiator(session);
        self.forget_indices(gone.iter().map(|s| s.local_index));
        peer.set_endpoint(src);
        *lock(&peer.last_handshake) = Some(SystemTime::now());
        {
            let mut t = lock(&peer.timers);
            t.session_derived(now);
            t.handshake_complete();
            t.any_received();
            t.traversal(now, peer.keepalive());
        }
        // The new session confirmed at once: with a keepalive unless data is waiting.
        if lock(&peer.staged).is_empty() {
            peer.stage(Vec::new());
        }
        self.send_staged(state, &peer);
    }

    /// Sends what `peer` has waiting, or starts a handshake when it has no session to send
    /// with. An empty packet is a keepalive.
    pub(crate) fn send_staged(&self, state: &State, peer: &Arc<Peer>) {
        let now = Instant::now();
        let (Some(session), Some(dst)) = (peer.sending_session(now), peer.endpoint()) else {
            self.initiate(state, peer, false);
            return;
        };
        let packets: Vec<Vec<u8>> = lock(&peer.staged).drain(..).collect();
        if packets.is_empty() {
            return;
        }
        let Some(first) = session.reserve(packets.len() as u64) else {
            self.initiate(state, peer, false);
            return;
        };
        let mtu = self.mtu.load(Ordering::Relaxed);
        let mut wire = Vec::new();
        let mut spans = Vec::with_capacity(packets.len());
        for (i, p) in packets.iter().enumerate() {
            let len =
                noise::DATA_HEADER_LEN + crate::session::padded(p.len(), mtu) + noise::TAG_LEN;
            let at = wire.len();
            wire.resize(at + len, 0);
            wire[at + noise::DATA_HEADER_LEN..][..p.len()].copy_from_slice(p);
            session.seal(first + i as u64, &mut wire[at..at + len]);
            spans.push(at..at + len);
        }
        let runs: Vec<Run> = spans
            .iter()
            .map(|r| Run {
                dst,
                data: &wire[r.clone()],
                seg: r.len(),
            })
            .collect();
        let (sockets, _) = self.sockets();
        if let Some(sock) = sockets.for_addr(&dst) {
            sock.send_runs(&mut SendScratch::default(), &runs);
        }
        peer.add_tx(wire.len());
        let mut t = lock(&peer.timers);
        t.any_sent();
        t.traversal(now, peer.keepalive());
        if packets.iter().any(|p| !p.is_empty()) {
            t.data_sent(now, jitter());
        }
    }

    /// After sending data with `session`: the initiator renews a session that is old.
    pub(crate) fn keep_fresh_sending(&self, state: &State, peer: &Arc<Peer>, s: &Session) {
        let old = s.created.elapsed() >= crate::session::REKEY_AFTER_TIME
            || s.sent() >= crate::session::REKEY_AFTER_MESSAGES;
        if s.initiator && old {
            self.initiate(state, peer, false);
        }
    }

    /// After receiving with the current session: the initiator renews it once, shortly
    /// before it expires, if the peer has not.
    pub(crate) fn keep_fresh_receiving(&self, state: &State, peer: &Arc<Peer>) {
        let Some(s) = lock(&peer.sessions).current.clone() else {
            return;
        };
        let late = REJECT_AFTER_TIME - KEEPALIVE_TIMEOUT - REKEY_TIMEOUT;
        if !s.initiator || s.created.elapsed() < late {
            return;
        }
        {
            let mut t = lock(&peer.timers);
            if t.last_minute_handshake {
                return;
            }
            t.last_minute_handshake = true;
        }
        self.initiate(state, peer, false);
    }

    pub(crate) fn jitter(&self) -> Duration {
        jitter()
    }

    fn run_timers(self: Arc<Self>) {
        let mut second = Instant::now();
        let mut due = Vec::new();
        while !self.is_stopped.load(Ordering::Relaxed) {
            thread::sleep(TIMER_TICK);
            let now = Instant::now();
            let state = self.read_state();
            if now.duration_since(second) >= Duration::from_secs(1) {
                second = now;
                let last = self.handshakes.swap(0, Ordering::Relaxed);
                self.loaded
                    .store(last >= UNDER_LOAD_HANDSHAKES, Ordering::Relaxed);
                if let Some(c) = &state.checker {
                    lock(c).rotate(now, random());
                }
                if let Ok(mtu) = self.tun.mtu() {
                    self.mtu.store(mtu, Ordering::Relaxed);
                }
            }
            for peer in state.peers.values() {
                due.clear();
                let keepalive = peer.keepalive();
                lock(&peer.timers).due(now, keepalive, &mut due);
                for d in &due {
                    match d {
                        Due::Initiate { retry } => self.initiate(&state, peer, *retry),
                        Due::GiveUp => lock(&peer.staged).clear(),
                        Due::Keepalive => {
                            if lock(&peer.staged).is_empty() {
                                peer.stage(Vec::new());
                            }
                            self.send_staged(&state, peer);
                        }
                        Due::ZeroKeys => self.zero_keys(peer),
                    }
                }
            }
        }
    }
}
