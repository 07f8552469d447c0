//! The userspace WireGuard device: a TUN device, UDP sockets, and the peers between them.
//!
//! Threads: one reader per TUN queue (read a burst, encrypt, sendmmsg), one reader per UDP
//! socket (recvmmsg a burst, decrypt, write to TUN), one for timers. A packet is never
//! allocated: each thread owns its buffers; a peer's Noise state is behind its own mutex.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use boringtun::noise::handshake::parse_handshake_anon;
use boringtun::noise::rate_limiter::RateLimiter;
use boringtun::noise::{Packet, Tunn, TunnResult};
use boringtun::x25519::{PublicKey, StaticSecret};
use ipnetwork::IpNetwork;
use tunio::{RecvBatch, Run, SendScratch, Tun, TunOptions, UdpSock};

use crate::allowed::{canonical, AllowedIps};
use crate::udp::Sockets;
use wireguard::uapi::{DeviceConfig, DeviceState, PeerConfig, PeerState, UapiError};
use wireguard::Key;

/// The largest packet TUN gives, plus room for WireGuard's header and tag.
const BUF_LEN: usize = 65_535 + 64;
/// Handshakes a second before senders must prove their address with a cookie.
const HANDSHAKE_RATE_LIMIT: u64 = 1000;
const TIMER_TICK: Duration = Duration::from_millis(250);
/// Packets read from TUN before they are sent as one batch.
const BATCH: usize = 32;

struct Identity {
    secret: StaticSecret,
    public: PublicKey,
    key: Key,
}

struct State {
    identity: Option<Identity>,
    fwmark: u32,
    peers: HashMap<Key, Arc<Peer>>,
    by_index: HashMap<u32, Arc<Peer>>,
    allowed: AllowedIps<Arc<Peer>>,
    rate_limiter: Arc<RateLimiter>,
}

struct PeerSettings {
    psk: Option<Key>,
    keepalive: u16,
    allowed_ips: Vec<IpNetwork>,
}

struct Peer {
    key: Key,
    index: u32,
    /// Made at the peer's first packet (or at once when it keeps a connection alive): a
    /// Noise state is 11 KiB, and most of a large cluster's peers may never carry traffic.
    tunn: Mutex<Option<Box<Tunn>>>,
    endpoint: Mutex<Option<SocketAddr>>,
    settings: Mutex<PeerSettings>,
    rx_bytes: AtomicU64,
    tx_bytes: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Peer {
    /// The peer's Noise state, made now if it has none yet.
    fn tunn<'a>(&'a self, state: &State) -> std::sync::MutexGuard<'a, Option<Box<Tunn>>> {
        let mut guard = lock(&self.tunn);
        if guard.is_none() {
            *guard = self.new_tunn(state.identity.as_ref(), &state.rate_limiter);
        }
        guard
    }

    /// Remakes the Noise state after a change of key, PSK or keepalive, if it has one or
    /// must keep the connection alive.
    fn renew_tunn(&self, state: &State) {
        let mut guard = lock(&self.tunn);
        if guard.is_some() || lock(&self.settings).keepalive > 0 {
            *guard = self.new_tunn(state.identity.as_ref(), &state.rate_limiter);
        }
    }

    fn new_tunn(
        &self,
        identity: Option<&Identity>,
        limiter: &Arc<RateLimiter>,
    ) -> Option<Box<Tunn>> {
        let id = identity?;
        let s = lock(&self.settings);
        Some(Box::new(Tunn::new(
            id.secret.clone(),
            PublicKey::from(self.key.0),
            s.psk.map(|k| k.0),
            (s.keepalive > 0).then_some(s.keepalive),
            self.index,
            Some(limiter.clone()),
        )))
    }
}

/// The sockets in use, and whether readers of an older set should stop.
struct Bound {
    sockets: Arc<Sockets>,
    generation: u64,
}

pub struct Device {
    name: String,
    state: RwLock<State>,
    bound: RwLock<Bound>,
    tun: Tun,
    next_index: AtomicU32,
    stop_reason: Mutex<Option<String>>,
    stopped: Condvar,
    is_stopped: AtomicBool,
}

fn new_limiter(public: &PublicKey) -> Arc<RateLimiter> {
    Arc::new(RateLimiter::new(public, HANDSHAKE_RATE_LIMIT))
}

impl Device {
    /// Makes TUN device `name` with `queues` queues, binds a free port, and starts the threads.
    pub fn start(name: &str, queues: usize) -> std::io::Result<Arc<Device>> {
        let tun = Tun::open(
            name,
            &TunOptions {
                queues,
                offloads: false,
            },
        )?;
        let sockets = Arc::new(Sockets::bind(0, 0)?);
        let dev = Arc::new(Device {
            name: name.to_string(),
            state: RwLock::new(State {
                identity: None,
                fwmark: 0,
                peers: HashMap::new(),
                by_index: HashMap::new(),
                allowed: AllowedIps::default(),
                rate_limiter: new_limiter(&PublicKey::from([0u8; 32])),
            }),
            bound: RwLock::new(Bound {
                sockets: sockets.clone(),
                generation: 0,
            }),
            tun,
            next_index: AtomicU32::new(1),
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

    fn read_state(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write_state(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    fn sockets(&self) -> (Arc<Sockets>, u64) {
        let b = self.bound.read().unwrap_or_else(|e| e.into_inner());
        (b.sockets.clone(), b.generation)
    }

    fn spawn_socket_readers(
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

    fn run_tun_reader(self: Arc<Self>, queue: usize) {
        let mut inbufs: Vec<Vec<u8>> = (0..BATCH).map(|_| vec![0u8; BUF_LEN]).collect();
        let mut inlens = [0usize; BATCH];
        let mut outbufs: Vec<Vec<u8>> = (0..BATCH).map(|_| vec![0u8; BUF_LEN]).collect();
        let mut out: Vec<(SocketAddr, usize, usize)> = Vec::with_capacity(BATCH);
        let mut scratch = SendScratch::default();
        while !self.is_stopped.load(Ordering::Relaxed) {
            let mut n = 0;
            while n < BATCH {
                match self.tun.read(queue, &mut inbufs[n]) {
                    Ok(Some((_, range))) => {
                        inlens[n] = range.end;
                        n += 1;
                    }
                    Ok(None) => break,
                    Err(e) => {
                        return self.stop(format!("reading TUN device {}: {e}", self.name));
                    }
                }
            }
            if n == 0 {
                if let Err(e) = tunio::tun::wait(self.tun.queue(queue), libc::POLLIN, 1000) {
                    return self.stop(format!("waiting on TUN device {}: {e}", self.name));
                }
                continue;
            }
            out.clear();
            {
                let state = self.read_state();
                for i in 0..n {
                    let packet = &inbufs[i][..inlens[i]];
                    let Some(dst) = Tunn::dst_address(packet) else {
                        continue;
                    };
                    let Some(peer) = state.allowed.lookup(dst) else {
                        continue;
                    };
                    let Some(endpoint) = *lock(&peer.endpoint) else {
                        continue;
                    };
                    let slot = out.len();
                    let mut guard = peer.tunn(&state);
                    let Some(tunn) = guard.as_mut() else {
                        continue;
                    };
                    if let TunnResult::WriteToNetwork(sealed) =
                        tunn.encapsulate(packet, &mut outbufs[slot])
                    {
                        let len = sealed.len();
                        peer.tx_bytes.fetch_add(len as u64, Ordering::Relaxed);
                        out.push((endpoint, slot, len));
                    }
                }
            }
            let (sockets, _) = self.sockets();
            for (sock, v4) in [(Some(&sockets.v4), true), (sockets.v6.as_ref(), false)] {
                let Some(sock) = sock else { continue };
                let runs: Vec<Run> = out
                    .iter()
                    .filter(|(a, _, _)| a.is_ipv4() == v4)
                    .map(|(a, i, l)| Run {
                        dst: *a,
                        data: &outbufs[*i][..*l],
                        seg: *l,
                    })
                    .collect();
                sock.send_runs(&mut scratch, &runs);
            }
        }
    }

    fn run_socket_reader(self: Arc<Self>, sock: &UdpSock, queue: usize, generation: u64) {
        let mut batch = RecvBatch::for_socket(sock);
        let mut plain = vec![0u8; BUF_LEN];
        loop {
            let received = batch.recv(sock);
            if self.is_stopped.load(Ordering::Relaxed) || self.sockets().1 != generation {
                return;
            }
            let n = match received {
                Ok(n) => n,
                Err(e) => {
                    eprintln!("{}: receiving on {:?}: {e}", self.name, sock.local_addr());
                    thread::sleep(Duration::from_millis(10));
                    continue;
                }
            };
            let state = self.read_state();
            for mut m in batch.messages(n) {
                let src = m.src;
                for datagram in m.datagrams() {
                    if let Err(e) = self.receive(&state, sock, queue, src, datagram, &mut plain) {
                        drop(state);
                        return self.stop(format!("writing to TUN device {}: {e}", self.name));
                    }
                }
            }
        }
    }

    /// One datagram from `src`: a handshake answered, or a packet decrypted and delivered.
    fn receive(
        &self,
        state: &State,
        sock: &UdpSock,
        queue: usize,
        src: SocketAddr,
        datagram: &[u8],
        plain: &mut [u8],
    ) -> std::io::Result<()> {
        let peer = match Tunn::parse_incoming_packet(datagram) {
            Ok(Packet::HandshakeInit(p)) => {
                let Some(id) = &state.identity else {
                    return Ok(());
                };
                let Ok(half) = parse_handshake_anon(&id.secret, &id.public, &p) else {
                    return Ok(());
                };
                state.peers.get(&Key(half.peer_static_public))
            }
            Ok(Packet::HandshakeResponse(p)) => state.by_index.get(&(p.receiver_idx >> 8)),
            Ok(Packet::PacketCookieReply(p)) => state.by_index.get(&(p.receiver_idx >> 8)),
            Ok(Packet::PacketData(p)) => state.by_index.get(&(p.receiver_idx >> 8)),
            Err(_) => None,
        };
        let Some(peer) = peer else {
            return Ok(());
        };
        let is_init = matches!(datagram.first(), Some(1));
        // The plain packet is delivered after the peer's lock is released, so the thread
        // encrypting towards this peer never waits on a TUN write.
        let mut deliver_span = None;
        let authentic = {
            let mut guard = if is_init {
                peer.tunn(state)
            } else {
                lock(&peer.tunn)
            };
            let Some(tunn) = guard.as_mut() else {
                return Ok(());
            };
            let base = plain.as_ptr() as usize;
            match tunn.decapsulate(Some(src.ip()), datagram, plain) {
                TunnResult::WriteToNetwork(reply) => {
                    let _ = sock.socket().send_to(reply, src);
                    // A finished handshake releases the packets queued while it ran.
                    let mut queued = vec![0u8; BUF_LEN];
                    while let TunnResult::WriteToNetwork(p) =
                        tunn.decapsulate(None, &[], &mut queued)
                    {
                        let _ = sock.socket().send_to(p, src);
                    }
                    true
                }
                TunnResult::WriteToTunnelV4(packet, from) => {
                    deliver_span = Some((
                        packet.as_ptr() as usize - base,
                        packet.len(),
                        IpAddr::V4(from),
                    ));
                    true
                }
                TunnResult::WriteToTunnelV6(packet, from) => {
                    deliver_span = Some((
                        packet.as_ptr() as usize - base,
                        packet.len(),
                        IpAddr::V6(from),
                    ));
                    true
                }
                TunnResult::Done => true,
                TunnResult::Err(_) => false,
            }
        };
        if let Some((offset, len, from)) = deliver_span {
            deliver(
                state,
                peer,
                &self.tun,
                queue,
                &plain[offset..offset + len],
                from,
            )?;
        }
        if authentic {
            peer.rx_bytes
                .fetch_add(datagram.len() as u64, Ordering::Relaxed);
            let mut ep = lock(&peer.endpoint);
            if *ep != Some(src) {
                *ep = Some(src);
            }
        }
        Ok(())
    }

    fn run_timers(self: Arc<Self>) {
        let mut buf = vec![0u8; BUF_LEN];
        let mut last_reset = Instant::now();
        while !self.is_stopped.load(Ordering::Relaxed) {
            thread::sleep(TIMER_TICK);
            let state = self.read_state();
            if last_reset.elapsed() >= Duration::from_secs(1) {
                state.rate_limiter.reset_count();
                last_reset = Instant::now();
            }
            let (sockets, _) = self.sockets();
            for peer in state.peers.values() {
                let endpoint = *lock(&peer.endpoint);
                let mut guard = lock(&peer.tunn);
                let Some(tunn) = guard.as_mut() else {
                    continue;
                };
                if let TunnResult::WriteToNetwork(p) = tunn.update_timers(&mut buf) {
                    if let Some(ep) = endpoint {
                        if let Some(s) = sockets.for_addr(&ep) {
                            let _ = s.socket().send_to(p, ep);
                        }
                    }
                }
            }
        }
    }

    /// Applies a `set=1` operation.
    pub fn apply(self: &Arc<Self>, config: &DeviceConfig) -> Result<(), UapiError> {
        let mut state = self.write_state();
        if let Some(port) = config.listen_port {
            let (current, generation) = self.sockets();
            if current.port != port || port == 0 {
                let fresh = Sockets::bind(port, state.fwmark).map_err(|e| UapiError {
                    errno: e.raw_os_error().unwrap_or(libc::EIO),
                    message: format!("binding UDP port {port}: {e}"),
                })?;
                let fresh = Arc::new(fresh);
                {
                    let mut b = self.bound.write().unwrap_or_else(|e| e.into_inner());
                    b.sockets = fresh.clone();
                    b.generation = generation + 1;
                }
                current.shutdown();
                self.spawn_socket_readers(&fresh, generation + 1)
                    .map_err(|e| UapiError {
                        errno: libc::EIO,
                        message: format!("starting readers: {e}"),
                    })?;
            }
        }
        if let Some(mark) = config.fwmark {
            state.fwmark = mark;
            self.sockets().0.set_fwmark(mark).map_err(|e| UapiError {
                errno: e.raw_os_error().unwrap_or(libc::EIO),
                message: format!("setting fwmark {mark}: {e}"),
            })?;
        }
        // The same key again (a restarted flanneld configuring the tunnel it left) keeps the
        // sessions, as the kernel's WireGuard does.
        let current = state.identity.as_ref().map(|i| i.key);
        if let Some(key) = config
            .private_key
            .filter(|k| Some(*k) != current && !(k.is_zero() && current.is_none()))
        {
            let identity = (!key.is_zero()).then(|| {
                let secret = StaticSecret::from(key.0);
                let public = PublicKey::from(&secret);
                Identity {
                    secret,
                    public,
                    key,
                }
            });
            if let Some(id) = &identity {
                state.rate_limiter = new_limiter(&id.public);
            }
            state.identity = identity;
            let st = &*state;
            for peer in st.peers.values() {
                peer.renew_tunn(st);
            }
        }
        if config.replace_peers {
            state.peers.clear();
            state.by_index.clear();
            state.allowed = AllowedIps::default();
        }
        for p in &config.peers {
            self.apply_peer(&mut state, p);
        }
        Ok(())
    }

    fn apply_peer(&self, state: &mut State, p: &PeerConfig) {
        if p.remove {
            if let Some(peer) = state.peers.remove(&p.public_key) {
                state.by_index.remove(&peer.index);
                for net in lock(&peer.settings).allowed_ips.drain(..) {
                    state.allowed.remove(net);
                }
            }
            return;
        }
        let peer = match state.peers.get(&p.public_key) {
            Some(peer) => peer.clone(),
            None if p.update_only => return,
            None => {
                let index = loop {
                    let i = self.next_index.fetch_add(1, Ordering::Relaxed) & 0x00ff_ffff;
                    if i != 0 && !state.by_index.contains_key(&i) {
                        break i;
                    }
                };
                let peer = Arc::new(Peer {
                    key: p.public_key,
                    index,
                    tunn: Mutex::new(None),
                    endpoint: Mutex::new(None),
                    settings: Mutex::new(PeerSettings {
                        psk: p.preshared_key.filter(|k| !k.is_zero()),
                        keepalive: p.persistent_keepalive.unwrap_or(0),
                        allowed_ips: Vec::new(),
                    }),
                    rx_bytes: AtomicU64::new(0),
                    tx_bytes: AtomicU64::new(0),
                });
                peer.renew_tunn(state);
                state.peers.insert(p.public_key, peer.clone());
                state.by_index.insert(index, peer.clone());
                peer
            }
        };
        let rebuild = {
            let mut s = lock(&peer.settings);
            let mut changed = false;
            if let Some(psk) = p.preshared_key {
                let psk = (!psk.is_zero()).then_some(psk);
                changed |= s.psk != psk;
                s.psk = psk;
            }
            if let Some(k) = p.persistent_keepalive {
                changed |= s.keepalive != k;
                s.keepalive = k;
            }
            changed
        };
        if rebuild {
            peer.renew_tunn(state);
        }
        if let Some(ep) = p.endpoint {
            *lock(&peer.endpoint) = Some(ep);
        }
        if p.replace_allowed_ips {
            for net in lock(&peer.settings).allowed_ips.drain(..) {
                state.allowed.remove(net);
            }
        }
        for net in &p.allowed_ips {
            let net = canonical(*net);
            if let Some(previous) = state.allowed.insert(net, peer.clone()) {
                if !Arc::ptr_eq(&previous, &peer) {
                    lock(&previous.settings).allowed_ips.retain(|n| *n != net);
                }
            }
            let mut s = lock(&peer.settings);
            if !s.allowed_ips.contains(&net) {
                s.allowed_ips.push(net);
            }
        }
    }

    /// What the device holds, for `get=1`.
    pub fn state(&self) -> DeviceState {
        let state = self.read_state();
        let (sockets, _) = self.sockets();
        let now = SystemTime::now();
        let mut peers: Vec<PeerState> = state
            .peers
            .values()
            .map(|peer| {
                let s = lock(&peer.settings);
                let since = lock(&peer.tunn)
                    .as_ref()
                    .and_then(|t| t.time_since_last_handshake());
                PeerState {
                    public_key: peer.key,
                    preshared_key: s.psk,
                    endpoint: *lock(&peer.endpoint),
                    persistent_keepalive: s.keepalive,
                    allowed_ips: s.allowed_ips.clone(),
                    last_handshake: since
                        .and_then(|d| now.checked_sub(d))
                        .and_then(|t| t.duration_since(UNIX_EPOCH).ok()),
                    rx_bytes: peer.rx_bytes.load(Ordering::Relaxed),
                    tx_bytes: peer.tx_bytes.load(Ordering::Relaxed),
                }
            })
            .collect();
        peers.sort_by_key(|p| p.public_key);
        DeviceState {
            private_key: state.identity.as_ref().map(|i| i.key),
            listen_port: sockets.port,
            fwmark: state.fwmark,
            peers,
        }
    }
}

/// Writes a decrypted packet to TUN if its source is one the peer may send from.
fn deliver(
    state: &State,
    peer: &Arc<Peer>,
    tun: &Tun,
    queue: usize,
    packet: &[u8],
    from: IpAddr,
) -> std::io::Result<()> {
    match state.allowed.lookup(from) {
        Some(owner) if Arc::ptr_eq(owner, peer) => tun.write(queue, packet),
        _ => Ok(()),
    }
}
