//! WireGuard's DoS defence: mac1 (proof the sender knows our public key) on every handshake
//! message, and under load mac2, keyed with a cookie we handed the sender's address in a
//! cookie reply, so that a flood from spoofed addresses costs us no Diffie-Hellman.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use chacha20poly1305::aead::{AeadInPlace, KeyInit};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};

use crate::noise::{self, Hash, COOKIE_LEN, LABEL_COOKIE, LABEL_MAC1};

/// How long a cookie, given or taken, serves.
pub const COOKIE_LIFETIME: Duration = Duration::from_secs(120);

/// The bytes a cookie is bound to: the sender's address and port.
fn address_bytes(src: &SocketAddr) -> Vec<u8> {
    let mut b = match src.ip() {
        std::net::IpAddr::V4(a) => a.octets().to_vec(),
        std::net::IpAddr::V6(a) => a.octets().to_vec(),
    };
    b.extend_from_slice(&src.port().to_be_bytes());
    b
}

/// The receiving side: checks macs on messages to us, and makes cookie replies.
pub struct Checker {
    mac1_key: Hash,
    cookie_key: Hash,
    secret: [u8; 32],
    secret_made: Instant,
}

/// What a handshake message's macs say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Macs {
    /// mac1 is wrong: drop it unanswered.
    Bad,
    /// mac1 right, mac2 absent or stale.
    Mac1,
    /// Both right: the sender has a cookie for its address.
    Both,
}

impl Checker {
    pub fn new(identity: &noise::Identity, secret: [u8; 32]) -> Checker {
        Checker {
            mac1_key: identity.mac1_key,
            cookie_key: identity.cookie_key,
            secret,
            secret_made: Instant::now(),
        }
    }

    /// Replaces the cookie secret when it is older than a cookie's lifetime (`fresh`:
    /// random bytes for the next one).
    pub fn rotate(&mut self, now: Instant, fresh: [u8; 32]) {
        if now.duration_since(self.secret_made) >= COOKIE_LIFETIME {
            self.secret = fresh;
            self.secret_made = now;
        }
    }

    fn cookie(&self, src: &SocketAddr) -> [u8; 16] {
        noise::mac(&self.secret, &[&address_bytes(src)])
    }

    /// Checks `msg` (an initiation or response; `mac1_at` where its mac1 starts).
    pub fn check(&self, msg: &[u8], mac1_at: usize, src: &SocketAddr) -> Macs {
        let mac2_at = mac1_at + 16;
        let mac1 = noise::mac(&self.mac1_key, &[&msg[..mac1_at]]);
        if !constant_time_eq(&mac1, &msg[mac1_at..mac2_at]) {
            return Macs::Bad;
        }
        let mac2 = noise::mac(&self.cookie(src), &[&msg[..mac2_at]]);
        if constant_time_eq(&mac2, &msg[mac2_at..mac2_at + 16]) {
            Macs::Both
        } else {
            Macs::Mac1
        }
    }

    /// The cookie reply to `msg` from `src` (its sender index at bytes 4..8), with `nonce`.
    pub fn reply(
        &self,
        msg: &[u8],
        mac1_at: usize,
        src: &SocketAddr,
        nonce: [u8; 24],
    ) -> [u8; COOKIE_LEN] {
        let mut out = [0u8; COOKIE_LEN];
        out[0] = noise::MSG_COOKIE;
        out[4..8].copy_from_slice(&msg[4..8]);
        out[8..32].copy_from_slice(&nonce);
        let mut cookie = self.cookie(src).to_vec();
        let cipher = XChaCha20Poly1305::new((&self.cookie_key).into());
        if cipher
            .encrypt_in_place(
                XNonce::from_slice(&nonce),
                &msg[mac1_at..mac1_at + 16],
                &mut cookie,
            )
            .is_ok()
        {
            out[32..64].copy_from_slice(&cookie);
        }
        out
    }
}

/// The sending side, one per peer: mac1 with the peer's key, mac2 with its cookie.
pub struct Stamper {
    mac1_key: Hash,
    cookie_key: Hash,
    cookie: Option<([u8; 16], Instant)>,
    /// The mac1 of the last message sent, which a cookie reply is bound to.
    last_mac1: Option<[u8; 16]>,
}

impl Stamper {
    pub fn new(peer_public: &[u8; 32]) -> Stamper {
        Stamper {
            mac1_key: noise::hash(&[LABEL_MAC1, peer_public]),
            cookie_key: noise::hash(&[LABEL_COOKIE, peer_public]),
            cookie: None,
            last_mac1: None,
        }
    }

    /// Fills in mac1 and (with a fresh cookie) mac2 of `msg`.
    pub fn stamp(&mut self, msg: &mut [u8], mac1_at: usize, now: Instant) {
        let mac2_at = mac1_at + 16;
        let mac1 = noise::mac(&self.mac1_key, &[&msg[..mac1_at]]);
        msg[mac1_at..mac2_at].copy_from_slice(&mac1);
        self.last_mac1 = Some(mac1);
        let mac2 = match self.cookie {
            Some((c, at)) if now.duration_since(at) < COOKIE_LIFETIME => {
                noise::mac(&c, &[&msg[..mac2_at]])
            }
            _ => [0; 16],
        };
        msg[mac2_at..mac2_at + 16].copy_from_slice(&mac2);
    }

    /// Takes a cookie reply to our last message; false when it does not open.
    pub fn take_reply(&mut self, reply: &[u8], now: Instant) -> bool {
        let Some(mac1) = self.last_mac1 else {
            return false;
        };
        if reply.len() != COOKIE_LEN {
            return false;
        }
        let mut cookie = reply[32..64].to_vec();
        let cipher = XChaCha20Poly1305::new((&self.cookie_key).into());
        if cipher
            .decrypt_in_place(XNonce::from_slice(&reply[8..32]), &mac1, &mut cookie)
            .is_err()
        {
            return false;
        }
        let mut c = [0u8; 16];
        c.copy_from_slice(&cookie);
        self.cookie = Some((c, now));
        true
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::noise::{Identity, INITIATION_LEN, INITIATION_MAC1};

    #[test]
    fn mac1_proves_the_key_and_a_cookie_earns_mac2_from_that_address_only() {
        let us = Identity::new([3; 32]);
        let mut checker = Checker::new(&us, [7; 32]);
        let mut stamper = Stamper::new(&us.public);
        let src: SocketAddr = "192.0.2.1:51820".parse().unwrap();
        let now = Instant::now();
        let mut msg = [0u8; INITIATION_LEN];
        msg[0] = 1;
        msg[4..8].copy_from_slice(&9u32.to_le_bytes());
        stamper.stamp(&mut msg, INITIATION_MAC1, now);
        assert_eq!(checker.check(&msg, INITIATION_MAC1, &src), Macs::Mac1);
        let mut wrong = msg;
        wrong[20] ^= 1;
        assert_eq!(checker.check(&wrong, INITIATION_MAC1, &src), Macs::Bad);

        let reply = checker.reply(&msg, INITIATION_MAC1, &src, [5; 24]);
        assert_eq!(&reply[4..8], &9u32.to_le_bytes(), "to the message's sender");
        assert!(stamper.take_reply(&reply, now));
        stamper.stamp(&mut msg, INITIATION_MAC1, now);
        assert_eq!(checker.check(&msg, INITIATION_MAC1, &src), Macs::Both);
        let elsewhere: SocketAddr = "192.0.2.2:51820".parse().unwrap();
        assert_eq!(checker.check(&msg, INITIATION_MAC1, &elsewhere), Macs::Mac1);
        // A stale cookie is not used; a rotated secret no longer matches.
        stamper.stamp(&mut msg, INITIATION_MAC1, now + COOKIE_LIFETIME);
        assert_eq!(checker.check(&msg, INITIATION_MAC1, &src), Macs::Mac1);
        stamper.stamp(&mut msg, INITIATION_MAC1, now);
        checker.rotate(now + COOKIE_LIFETIME * 2, [8; 32]);
        assert_eq!(checker.check(&msg, INITIATION_MAC1, &src), Macs::Mac1);
        // A reply bound to another message does not open.
        let mut tampered = reply;
        tampered[40] ^= 1;
        assert!(!stamper.take_reply(&tampered, now));
    }
}
