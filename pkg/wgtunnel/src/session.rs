//! A session (WireGuard's keypair): the two transport keys of one handshake, the counter
//! that numbers what this side sends, and the window that refuses what was received before.
//! Sealing and opening take `&self`: any thread encrypts or decrypts for any session at
//! once; only the counter (an atomic) and the window (a short lock, taken in order after
//! decryption) are shared.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ring::aead::{Aad, LessSafeKey, Tag, UnboundKey, CHACHA20_POLY1305};

use crate::noise::{self, SessionKeys, DATA_HEADER_LEN, MSG_DATA, TAG_LEN};

/// Past this many messages a session is renewed; past the second it is not used.
pub const REKEY_AFTER_MESSAGES: u64 = 1 << 60;
pub const REJECT_AFTER_MESSAGES: u64 = u64::MAX - (1 << 13);
/// Past this age the initiator renews a session; past the second no side uses it.
pub const REKEY_AFTER_TIME: Duration = Duration::from_secs(120);
pub const REJECT_AFTER_TIME: Duration = Duration::from_secs(180);

/// Counters received, as a ring of 64-bit words: how far behind the newest a message may
/// arrive (reordered on the way, or decrypted out of order) and still be taken once.
const WORDS: usize = 128;
const WINDOW: u64 = ((WORDS - 1) * 64) as u64;

#[derive(Clone)]
pub struct Replay {
    newest: u64,
    ring: [u64; WORDS],
    any: bool,
}

impl Default for Replay {
    fn default() -> Self {
        Replay {
            newest: 0,
            ring: [0; WORDS],
            any: false,
        }
    }
}

impl Replay {
    /// Whether `counter` may still be taken (checked before the cost of decrypting).
    pub fn may_take(&self, counter: u64) -> bool {
        if counter >= REJECT_AFTER_MESSAGES {
            return false;
        }
        if !self.any || counter > self.newest {
            return true;
        }
        if self.newest - counter >= WINDOW {
            return false;
        }
        self.ring[((counter >> 6) as usize) % WORDS] & (1 << (counter & 63)) == 0
    }

    /// Takes `counter`: false when it was taken before or is too old.
    pub fn take(&mut self, counter: u64) -> bool {
        if !self.may_take(counter) {
            return false;
        }
        let block = counter >> 6;
        if !self.any || counter > self.newest {
            let from = if self.any { (self.newest >> 6) + 1 } else { 0 };
            let clear = (block + 1).saturating_sub(from).min(WORDS as u64);
            for i in 0..clear {
                self.ring[((block - i) as usize) % WORDS] = 0;
            }
            self.newest = counter;
            self.any = true;
        }
        self.ring[(block as usize) % WORDS] |= 1 << (counter & 63);
        true
    }
}

pub struct Session {
    pub local_index: u32,
    pub remote_index: u32,
    send: LessSafeKey,
    recv: LessSafeKey,
    next_counter: AtomicU64,
    replay: Mutex<Replay>,
    pub created: Instant,
    /// This side sent the initiation: it renews the session when it ages.
    pub initiator: bool,
    /// Received with, or ours as initiator: the responder sends with it only then.
    pub confirmed: AtomicBool,
}

fn key(k: &[u8; 32]) -> LessSafeKey {
    LessSafeKey::new(
        UnboundKey::new(&CHACHA20_POLY1305, k)
            .unwrap_or_else(|_| unreachable!("ChaCha20-Poly1305 keys are 32 bytes")),
    )
}

/// A data message's plaintext padded to 16 bytes, as WireGuard pads it, but never past the
/// device's MTU.
pub fn padded(len: usize, mtu: usize) -> usize {
    let p = (len + 15) & !15;
    if p > mtu.max(len) {
        len.max(mtu)
    } else {
        p
    }
}

impl Session {
    pub fn new(keys: &SessionKeys, initiator: bool, now: Instant) -> Session {
        Session {
            local_index: keys.local_index,
            remote_index: keys.remote_index,
            send: key(&keys.send),
            recv: key(&keys.recv),
            next_counter: AtomicU64::new(0),
            replay: Mutex::new(Replay::default()),
            created: now,
            initiator,
            confirmed: AtomicBool::new(initiator),
        }
    }

    /// Reserves `n` consecutive counters; None once the session may send no more.
    pub fn reserve(&self, n: u64) -> Option<u64> {
        let first = self.next_counter.fetch_add(n, Ordering::Relaxed);
        (first.checked_add(n)? < REJECT_AFTER_MESSAGES).then_some(first)
    }

    /// Counters used so far.
    pub fn sent(&self) -> u64 {
        self.next_counter.load(Ordering::Relaxed)
    }

    /// Whether this side may still send with it.
    pub fn usable(&self, now: Instant) -> bool {
        now.duration_since(self.created) < REJECT_AFTER_TIME && self.sent() < REJECT_AFTER_MESSAGES
    }

    /// Seals a data message in place: `msg` holds 16 bytes of header room, the plaintext
    /// (`plain` bytes, zero-padded to `msg.len() - 32`), and 16 bytes for the tag.
    pub fn seal(&self, counter: u64, msg: &mut [u8]) {
        let (head, rest) = msg.split_at_mut(DATA_HEADER_LEN);
        head[..4].copy_from_slice(&[MSG_DATA, 0, 0, 0]);
        head[4..8].copy_from_slice(&self.remote_index.to_le_bytes());
        head[8..16].copy_from_slice(&counter.to_le_bytes());
        let body = rest.len() - TAG_LEN;
        let (plain, tag_room) = rest.split_at_mut(body);
        let tag: Tag = self
            .send
            .seal_in_place_separate_tag(noise::nonce(counter), Aad::empty(), plain)
            .unwrap_or_else(|_| unreachable!("a datagram is far under the AEAD's limit"));
        tag_room.copy_from_slice(tag.as_ref());
    }

    /// Opens data message `msg` (header included) in place; the plaintext's length (padding
    /// included), or None when it is forged or not for this session.
    pub fn open(&self, counter: u64, msg: &mut [u8]) -> Option<usize> {
        let body = msg.get_mut(DATA_HEADER_LEN..)?;
        let plain = self
            .recv
            .open_in_place(noise::nonce(counter), Aad::empty(), body)
            .ok()?;
        Some(plain.len())
    }

    /// Whether `counter` may still be received (before decrypting).
    pub fn may_receive(&self, counter: u64) -> bool {
        self.replay
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .may_take(counter)
    }

    /// Takes `counter` as received (after decrypting): false for a replay.
    pub fn receive(&self, counter: u64) -> bool {
        self.replay
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take(counter)
    }
}

/// Reads a data message's receiver index and counter.
pub fn data_header(msg: &[u8]) -> Option<(u32, u64)> {
    if msg.len() < DATA_HEADER_LEN + TAG_LEN || msg[..4] != [MSG_DATA, 0, 0, 0] {
        return None;
    }
    let index = u32::from_le_bytes([msg[4], msg[5], msg[6], msg[7]]);
    let counter = u64::from_le_bytes(msg[8..16].try_into().ok()?);
    Some((index, counter))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_takes_each_counter_once_in_any_order_within_it() {
        let mut r = Replay::default();
        assert!(r.take(0));
        assert!(!r.take(0), "a replay");
        assert!(r.take(5));
        assert!(r.take(2), "late but within the window");
        assert!(!r.take(2));
        assert!(r.take(1000));
        assert!(r.take(999));
        assert!(r.take(10_000));
        assert!(!r.take(10_000 - WINDOW), "too far behind");
        assert!(r.take(10_000 - WINDOW + 1));
        assert!(!r.take(10_000 - WINDOW + 1));
        // A jump far ahead forgets the whole ring.
        assert!(r.take(1 << 40));
        assert!(r.take((1 << 40) - 1));
        assert!(!r.take(REJECT_AFTER_MESSAGES));
    }

    #[test]
    fn a_window_that_slid_a_block_forgets_what_was_there() {
        let mut r = Replay::default();
        for c in 0..64 * WORDS as u64 * 2 {
            assert!(r.take(c), "{c}");
        }
        let newest = 64 * WORDS as u64 * 2 - 1;
        assert!(!r.take(newest - 100));
        assert!(!r.may_take(newest));
    }

    #[test]
    fn what_one_side_seals_the_other_opens_once_and_padding_stops_at_the_mtu() {
        let keys = SessionKeys {
            send: [1; 32],
            recv: [2; 32],
            local_index: 5,
            remote_index: 6,
        };
        let back = SessionKeys {
            send: [2; 32],
            recv: [1; 32],
            local_index: 6,
            remote_index: 5,
        };
        let now = Instant::now();
        let (a, b) = (
            Session::new(&keys, true, now),
            Session::new(&back, false, now),
        );
        let first = a.reserve(3).unwrap();
        assert_eq!(a.reserve(1), Some(first + 3));
        let mut msg = vec![0u8; 16 + 48 + 16];
        msg[16..16 + 40].copy_from_slice(&[9; 40]);
        a.seal(first + 1, &mut msg);
        let (index, counter) = data_header(&msg).unwrap();
        assert_eq!((index, counter), (6, first + 1));
        assert!(b.may_receive(counter));
        let n = b.open(counter, &mut msg.clone()).unwrap();
        assert_eq!(n, 48);
        assert!(b.receive(counter) && !b.receive(counter));
        let mut forged = msg.clone();
        forged[30] ^= 1;
        assert_eq!(b.open(counter, &mut forged), None);
        assert_eq!(padded(40, 1420), 48);
        assert_eq!(padded(1419, 1420), 1420);
        assert_eq!(padded(1420, 1420), 1420);
        assert_eq!(padded(1500, 1420), 1500);
        assert_eq!(padded(0, 1420), 0);
    }
}
