//! One peer: its handshake state, its sessions (previous, current, next, as WireGuard keeps
//! them), its timers, where it is reached, the packets waiting for a session, its counters.
//! Each part behind its own lock, held briefly, so the threads of both directions and the
//! timers rarely meet.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime};

use ipnetwork::IpNetwork;
use wireguard::Key;

use crate::cookie::Stamper;
use crate::noise::{PeerKeys, Pending};
use crate::session::Session;
use crate::timers::Timers;

/// Packets held while a handshake runs; the oldest go first when more come.
pub const MAX_STAGED: usize = 1024;

pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub struct Handshake {
    pub keys: PeerKeys,
    pub stamper: Stamper,
    pub pending: Option<Pending>,
    /// The newest initiation timestamp accepted from the peer: older ones are replays.
    pub newest_timestamp: Option<[u8; 12]>,
    pub last_accepted: Option<Instant>,
    pub last_sent: Option<Instant>,
}

#[derive(Default)]
pub struct Sessions {
    pub previous: Option<Arc<Session>>,
    pub current: Option<Arc<Session>>,
    /// The responder's newest, used to send once the initiator has sent with it.
    pub next: Option<Arc<Session>>,
}

pub struct Settings {
    pub psk: Option<Key>,
    pub keepalive: u16,
    pub allowed_ips: Vec<IpNetwork>,
}

pub struct Peer {
    pub key: Key,
    pub handshake: Mutex<Handshake>,
    pub sessions: Mutex<Sessions>,
    pub timers: Mutex<Timers>,
    pub endpoint: Mutex<Option<SocketAddr>>,
    pub staged: Mutex<VecDeque<Vec<u8>>>,
    pub settings: Mutex<Settings>,
    pub rx_bytes: AtomicU64,
    pub tx_bytes: AtomicU64,
    pub last_handshake: Mutex<Option<SystemTime>>,
}

impl Peer {
    pub fn new(key: Key, settings: Settings) -> Peer {
        let psk = settings.psk.unwrap_or_default().0;
        Peer {
            key,
            handshake: Mutex::new(Handshake {
                keys: PeerKeys::new(key.0, psk),
                stamper: Stamper::new(&key.0),
                pending: None,
                newest_timestamp: None,
                last_accepted: None,
                last_sent: None,
            }),
            sessions: Mutex::new(Sessions::default()),
            timers: Mutex::new(Timers::default()),
            endpoint: Mutex::new(None),
            staged: Mutex::new(VecDeque::new()),
            settings: Mutex::new(settings),
            rx_bytes: AtomicU64::new(0),
            tx_bytes: AtomicU64::new(0),
            last_handshake: Mutex::new(None),
        }
    }

    /// The session to send with now, if it may still be used.
    pub fn sending_session(&self, now: Instant) -> Option<Arc<Session>> {
        lock(&self.sessions)
            .current
            .as_ref()
            .filter(|s| s.usable(now))
            .cloned()
    }

    /// Installs the initiator's new session as current; returns the sessions it retires.
    pub fn begin_as_initiator(&self, s: Arc<Session>) -> Vec<Arc<Session>> {
        let mut ss = lock(&self.sessions);
        let mut gone = Vec::new();
        if let Some(next) = ss.next.take() {
            gone.extend(ss.previous.replace(next));
            gone.extend(ss.current.take());
        } else {
            let current = ss.current.take();
            gone.extend(std::mem::replace(&mut ss.previous, current));
        }
        ss.current = Some(s);
        gone
    }

    /// Installs the responder's new session as next; returns the sessions it retires.
    pub fn begin_as_responder(&self, s: Arc<Session>) -> Vec<Arc<Session>> {
        let mut ss = lock(&self.sessions);
        let mut gone: Vec<Arc<Session>> = ss.next.replace(s).into_iter().collect();
        gone.extend(ss.previous.take());
        gone
    }

    /// `s` was received with: if it is the next session, it becomes current. Returns whether
    /// it did (the handshake is then complete) and the session it retired.
    pub fn confirm(&self, s: &Arc<Session>) -> (bool, Option<Arc<Session>>) {
        let mut ss = lock(&self.sessions);
        if !ss.next.as_ref().is_some_and(|n| Arc::ptr_eq(n, s)) {
            return (false, None);
        }
        let next = ss.next.take();
        s.confirmed.store(true, Ordering::Relaxed);
        let current = std::mem::replace(&mut ss.current, next);
        (true, std::mem::replace(&mut ss.previous, current))
    }

    /// Every session dropped; returns them.
    pub fn drop_sessions(&self) -> Vec<Arc<Session>> {
        let mut ss = lock(&self.sessions);
        [ss.previous.take(), ss.current.take(), ss.next.take()]
            .into_iter()
            .flatten()
            .collect()
    }

    /// Holds a packet until a session exists.
    pub fn stage(&self, packet: Vec<u8>) {
        let mut q = lock(&self.staged);
        if q.len() == MAX_STAGED {
            q.pop_front();
        }
        q.push_back(packet);
    }

    pub fn set_endpoint(&self, src: SocketAddr) {
        let mut ep = lock(&self.endpoint);
        if *ep != Some(src) {
            *ep = Some(src);
        }
    }

    pub fn endpoint(&self) -> Option<SocketAddr> {
        *lock(&self.endpoint)
    }

    pub fn keepalive(&self) -> u16 {
        lock(&self.settings).keepalive
    }

    pub fn add_tx(&self, bytes: usize) {
        self.tx_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::noise::SessionKeys;

    fn session(index: u32) -> Arc<Session> {
        let k = SessionKeys {
            send: [1; 32],
            recv: [2; 32],
            local_index: index,
            remote_index: index + 100,
        };
        Arc::new(Session::new(&k, false, Instant::now()))
    }

    fn peer() -> Peer {
        Peer::new(
            Key([9; 32]),
            Settings {
                psk: None,
                keepalive: 0,
                allowed_ips: Vec::new(),
            },
        )
    }

    fn indices(p: &Peer) -> [Option<u32>; 3] {
        let ss = lock(&p.sessions);
        [&ss.previous, &ss.current, &ss.next].map(|s| s.as_ref().map(|s| s.local_index))
    }

    #[test]
    fn sessions_rotate_as_the_protocol_rotates_them() {
        let p = peer();
        assert!(p.begin_as_initiator(session(1)).is_empty());
        assert_eq!(indices(&p), [None, Some(1), None]);
        // The responder's session waits as next until the initiator sends with it.
        assert!(p.begin_as_responder(session(2)).is_empty());
        assert_eq!(indices(&p), [None, Some(1), Some(2)]);
        let other = session(9);
        assert!(!p.confirm(&other).0);
        let two = lock(&p.sessions).next.clone().unwrap();
        let (done, gone) = p.confirm(&two);
        assert!(done && gone.is_none());
        assert_eq!(indices(&p), [Some(1), Some(2), None]);
        // A new initiator session retires the previous one.
        let gone = p.begin_as_initiator(session(3));
        assert_eq!(gone.iter().map(|s| s.local_index).collect::<Vec<_>>(), [1]);
        assert_eq!(indices(&p), [Some(2), Some(3), None]);
        // The responder's new session retires the previous; then, with a next pending, a new
        // initiator session makes the next previous, and the current goes.
        let gone = p.begin_as_responder(session(4));
        assert_eq!(gone.iter().map(|s| s.local_index).collect::<Vec<_>>(), [2]);
        let gone = p.begin_as_initiator(session(5));
        assert_eq!(gone.iter().map(|s| s.local_index).collect::<Vec<_>>(), [3]);
        assert_eq!(indices(&p), [Some(4), Some(5), None]);
        assert_eq!(p.drop_sessions().len(), 2);
    }

    #[test]
    fn staged_packets_keep_the_newest() {
        let p = peer();
        for i in 0..MAX_STAGED + 5 {
            p.stage(vec![i as u8]);
        }
        let q = lock(&p.staged);
        assert_eq!(q.len(), MAX_STAGED);
        assert_eq!(q[0], vec![5u8]);
    }
}
