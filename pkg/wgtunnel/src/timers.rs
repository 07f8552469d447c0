//! A peer's timers, as WireGuard's protocol runs them: retransmitting an unanswered
//! initiation, a keepalive owed after data received, a new handshake when the peer went
//! silent after we sent, the keys erased when no handshake renews them, and the persistent
//! keepalive. Pure: events set deadlines, `due` says what a tick must do.

use std::time::{Duration, Instant};

use crate::session::REJECT_AFTER_TIME;

pub const REKEY_TIMEOUT: Duration = Duration::from_secs(5);
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// Initiations retried for REKEY_ATTEMPT_TIME (90 s) before giving up.
pub const MAX_HANDSHAKE_ATTEMPTS: u32 = 90 / 5;
/// The most a timer is pushed back, so peers do not act in step.
pub const JITTER_MAX_MS: u64 = 333;

/// What a tick must do for a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// Send an initiation; `retry`: the same handshake attempted again.
    Initiate {
        retry: bool,
    },
    /// Stop trying: drop the packets waiting for a session.
    GiveUp,
    Keepalive,
    /// Erase every session and the handshake in progress.
    ZeroKeys,
}

#[derive(Debug, Default, Clone)]
pub struct Timers {
    retransmit: Option<Instant>,
    keepalive: Option<Instant>,
    new_handshake: Option<Instant>,
    zero_keys: Option<Instant>,
    persistent: Option<Instant>,
    /// Initiations sent for the current handshake after the first.
    pub attempts: u32,
    another_keepalive: bool,
    /// The initiator already renewed a session about to expire on receipt.
    pub last_minute_handshake: bool,
}

impl Timers {
    /// Data sent: unless it is already waiting, a new handshake is due if nothing comes back.
    pub fn data_sent(&mut self, now: Instant, jitter: Duration) {
        if self.new_handshake.is_none() {
            self.new_handshake = Some(now + KEEPALIVE_TIMEOUT + REKEY_TIMEOUT + jitter);
        }
    }

    /// Data received: a keepalive is owed unless something is sent first.
    pub fn data_received(&mut self, now: Instant) {
        if self.keepalive.is_none() {
            self.keepalive = Some(now + KEEPALIVE_TIMEOUT);
        } else {
            self.another_keepalive = true;
        }
    }

    /// Any authenticated packet sent (data, keepalive, handshake): it serves as the keepalive.
    pub fn any_sent(&mut self) {
        self.keepalive = None;
    }

    /// Any authenticated packet received: the peer is alive.
    pub fn any_received(&mut self) {
        self.new_handshake = None;
    }

    pub fn handshake_initiated(&mut self, now: Instant, jitter: Duration) {
        self.retransmit = Some(now + REKEY_TIMEOUT + jitter);
    }

    pub fn handshake_complete(&mut self) {
        self.retransmit = None;
        self.attempts = 0;
        self.last_minute_handshake = false;
    }

    pub fn session_derived(&mut self, now: Instant) {
        self.zero_keys = Some(now + REJECT_AFTER_TIME * 3);
    }

    /// Any authenticated packet either way: the persistent keepalive starts again.
    pub fn traversal(&mut self, now: Instant, persistent: u16) {
        self.persistent =
            (persistent > 0).then(|| now + Duration::from_secs(u64::from(persistent)));
    }

    /// Every timer stopped (the peer removed, the device's key changed).
    pub fn stop(&mut self) {
        *self = Timers::default();
    }

    /// Fires the timers due by `now`, in the order the protocol gives them.
    pub fn due(&mut self, now: Instant, persistent: u16, out: &mut Vec<Due>) {
        let fired = |t: &mut Option<Instant>| {
            if t.is_some_and(|at| at <= now) {
                *t = None;
                true
            } else {
                false
            }
        };
        if fired(&mut self.retransmit) {
            if self.attempts > MAX_HANDSHAKE_ATTEMPTS {
                self.keepalive = None;
                if self.zero_keys.is_none() {
                    self.zero_keys = Some(now + REJECT_AFTER_TIME * 3);
                }
                out.push(Due::GiveUp);
            } else {
                self.attempts += 1;
                out.push(Due::Initiate { retry: true });
            }
        }
        if fired(&mut self.keepalive) {
            out.push(Due::Keepalive);
            if self.another_keepalive {
                self.another_keepalive = false;
                self.keepalive = Some(now + KEEPALIVE_TIMEOUT);
            }
        }
        if fired(&mut self.new_handshake) {
            out.push(Due::Initiate { retry: false });
        }
        if fired(&mut self.zero_keys) {
            out.push(Due::ZeroKeys);
        }
        if fired(&mut self.persistent) && persistent > 0 {
            out.push(Due::Keepalive);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn due(t: &mut Timers, at: Instant) -> Vec<Due> {
        let mut v = Vec::new();
        t.due(at, 0, &mut v);
        v
    }

    #[test]
    fn an_unanswered_initiation_is_retried_then_given_up() {
        let (mut t, t0) = (Timers::default(), Instant::now());
        t.handshake_initiated(t0, Duration::ZERO);
        assert!(due(&mut t, t0 + Duration::from_secs(4)).is_empty());
        let mut at = t0;
        for _ in 0..=MAX_HANDSHAKE_ATTEMPTS {
            at += REKEY_TIMEOUT;
            assert_eq!(due(&mut t, at), [Due::Initiate { retry: true }]);
            t.handshake_initiated(at, Duration::ZERO);
        }
        at += REKEY_TIMEOUT;
        assert_eq!(due(&mut t, at), [Due::GiveUp]);
        // A completed handshake stops the retries.
        t.handshake_initiated(at, Duration::ZERO);
        t.handshake_complete();
        assert!(due(&mut t, at + REKEY_TIMEOUT).is_empty());
        assert_eq!(t.attempts, 0);
    }

    #[test]
    fn a_keepalive_is_owed_after_data_unless_something_was_sent() {
        let (mut t, t0) = (Timers::default(), Instant::now());
        t.data_received(t0);
        assert_eq!(due(&mut t, t0 + KEEPALIVE_TIMEOUT), [Due::Keepalive]);
        t.data_received(t0);
        t.any_sent();
        assert!(due(&mut t, t0 + KEEPALIVE_TIMEOUT).is_empty());
    }

    #[test]
    fn silence_after_sending_asks_for_a_new_handshake() {
        let (mut t, t0) = (Timers::default(), Instant::now());
        t.data_sent(t0, Duration::ZERO);
        let later = t0 + KEEPALIVE_TIMEOUT + REKEY_TIMEOUT;
        assert_eq!(due(&mut t, later), [Due::Initiate { retry: false }]);
        t.data_sent(t0, Duration::ZERO);
        t.any_received();
        assert!(due(&mut t, later).is_empty());
    }

    #[test]
    fn keys_are_erased_after_three_reject_times_and_the_persistent_keepalive_repeats() {
        let (mut t, t0) = (Timers::default(), Instant::now());
        t.session_derived(t0);
        assert_eq!(due(&mut t, t0 + REJECT_AFTER_TIME * 3), [Due::ZeroKeys]);
        t.traversal(t0, 25);
        let mut v = Vec::new();
        t.due(t0 + Duration::from_secs(25), 25, &mut v);
        assert_eq!(v, [Due::Keepalive]);
        t.traversal(t0, 0);
        assert!(due(&mut t, t0 + Duration::from_secs(60)).is_empty());
    }
}
