//! WireGuard's handshake (Noise_IKpsk2_25519_ChaChaPoly_BLAKE2s, as the WireGuard paper
//! specifies it): the initiation, the response, and the transport keys they derive. Pure
//! computation: no clocks read but the timestamp passed in, no sockets; the device decides
//! when to send and what a message means for its sessions.

use blake2::digest::{FixedOutput, KeyInit, Update};
use blake2::{Blake2s256, Blake2sMac, Digest};
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305};
use x25519_dalek::{PublicKey, StaticSecret};

pub const MSG_INITIATION: u8 = 1;
pub const MSG_RESPONSE: u8 = 2;
pub const MSG_COOKIE: u8 = 3;
pub const MSG_DATA: u8 = 4;
pub const INITIATION_LEN: usize = 148;
pub const RESPONSE_LEN: usize = 92;
pub const COOKIE_LEN: usize = 64;
/// A data message's header: type, receiver index, counter.
pub const DATA_HEADER_LEN: usize = 16;
pub const TAG_LEN: usize = 16;
/// Where mac1 and mac2 start in an initiation and a response.
pub const INITIATION_MAC1: usize = 116;
pub const RESPONSE_MAC1: usize = 60;

const CONSTRUCTION: &[u8] = b"Noise_IKpsk2_25519_ChaChaPoly_BLAKE2s";
const IDENTIFIER: &[u8] = b"WireGuard v1 zx2c4 Jason@zx2c4.com";
pub const LABEL_MAC1: &[u8] = b"mac1----";
pub const LABEL_COOKIE: &[u8] = b"cookie--";

pub type Hash = [u8; 32];

/// Why a handshake message was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// It did not decrypt: not for us, or forged.
    Decrypt,
    /// A Diffie-Hellman result of all zeros (a low-order point).
    WeakKey,
    /// Its timestamp is not newer than the last accepted from that peer (a replay).
    Replayed,
    /// A response to no initiation we have outstanding.
    Unexpected,
}

pub fn hash(parts: &[&[u8]]) -> Hash {
    let mut h = Blake2s256::new();
    for p in parts {
        Digest::update(&mut h, p);
    }
    h.finalize().into()
}

fn hmac(key: &[u8], parts: &[&[u8]]) -> Hash {
    let mut m = hmac::SimpleHmac::<Blake2s256>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
    for p in parts {
        m.update(p);
    }
    m.finalize_fixed().into()
}

/// The keyed BLAKE2s of mac1, mac2 and cookies: 16 bytes.
pub fn mac(key: &[u8], parts: &[&[u8]]) -> [u8; 16] {
    let mut m = Blake2sMac::<blake2::digest::consts::U16>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("keys here are 16 or 32 bytes"));
    for p in parts {
        m.update(p);
    }
    m.finalize_fixed().into()
}

/// HKDF with HMAC-BLAKE2s: the first `N` outputs from chaining key `key` and `input`.
fn kdf<const N: usize>(key: &Hash, input: &[u8]) -> [Hash; N] {
    let prk = hmac(key, &[input]);
    let mut out = [[0u8; 32]; N];
    let mut last: Hash = hmac(&prk, &[&[1]]);
    out[0] = last;
    for (i, slot) in out.iter_mut().enumerate().skip(1) {
        last = hmac(&prk, &[&last, &[i as u8 + 1]]);
        *slot = last;
    }
    out
}

fn aead_key(key: &Hash) -> LessSafeKey {
    LessSafeKey::new(
        UnboundKey::new(&CHACHA20_POLY1305, key)
            .unwrap_or_else(|_| unreachable!("ChaCha20-Poly1305 keys are 32 bytes")),
    )
}

/// The AEAD nonce of counter `n`: 32 zero bits, then the counter little-endian.
pub fn nonce(n: u64) -> Nonce {
    let mut b = [0u8; 12];
    b[4..].copy_from_slice(&n.to_le_bytes());
    Nonce::assume_unique_for_key(b)
}

/// Encrypts `plain` into `out` (its length plus 16) with counter 0 and `ad`.
fn seal(key: &Hash, ad: &[u8], plain: &[u8], out: &mut [u8]) {
    let n = plain.len();
    out[..n].copy_from_slice(plain);
    let tag = aead_key(key)
        .seal_in_place_separate_tag(nonce(0), Aad::from(ad), &mut out[..n])
        .unwrap_or_else(|_| unreachable!("handshake fields are far under the AEAD's limit"));
    out[n..n + TAG_LEN].copy_from_slice(tag.as_ref());
}

/// Decrypts `sealed` (ciphertext and tag) with counter 0 and `ad` into `out`.
fn open(key: &Hash, ad: &[u8], sealed: &[u8], out: &mut [u8]) -> Result<(), Refused> {
    let mut buf = sealed.to_vec();
    let plain = aead_key(key)
        .open_in_place(nonce(0), Aad::from(ad), &mut buf)
        .map_err(|_| Refused::Decrypt)?;
    out.copy_from_slice(plain);
    Ok(())
}

fn dh(secret: &StaticSecret, public: &[u8; 32]) -> Result<[u8; 32], Refused> {
    let shared = secret.diffie_hellman(&PublicKey::from(*public));
    if !shared.was_contributory() {
        return Err(Refused::WeakKey);
    }
    Ok(shared.to_bytes())
}

/// The chaining key and hash every handshake starts from.
fn initial() -> (Hash, Hash) {
    let ck = hash(&[CONSTRUCTION]);
    let h = hash(&[&ck, IDENTIFIER]);
    (ck, h)
}

/// This device's static key pair.
pub struct Identity {
    pub secret: StaticSecret,
    pub public: [u8; 32],
    /// The key of mac1 on messages sent to us.
    pub mac1_key: Hash,
    /// The key cookie replies from us are encrypted with.
    pub cookie_key: Hash,
}

impl Identity {
    pub fn new(private: [u8; 32]) -> Identity {
        let secret = StaticSecret::from(private);
        let public = PublicKey::from(&secret).to_bytes();
        Identity {
            secret,
            public,
            mac1_key: hash(&[LABEL_MAC1, &public]),
            cookie_key: hash(&[LABEL_COOKIE, &public]),
        }
    }
}

/// What one peer's handshakes need of it.
pub struct PeerKeys {
    pub public: [u8; 32],
    pub psk: [u8; 32],
    /// DH(our static, its static), made at the first handshake (most of a large cluster's
    /// peers may never need one) and kept until our key changes.
    static_static: Option<Result<[u8; 32], Refused>>,
}

impl PeerKeys {
    pub fn new(public: [u8; 32], psk: [u8; 32]) -> PeerKeys {
        PeerKeys {
            public,
            psk,
            static_static: None,
        }
    }

    fn static_static(&mut self, id: &Identity) -> Result<[u8; 32], Refused> {
        *self
            .static_static
            .get_or_insert_with(|| dh(&id.secret, &self.public))
    }

    /// Forgets what was derived from our key, which changed.
    pub fn forget(&mut self) {
        self.static_static = None;
    }
}

/// An initiation sent and awaiting its response.
pub struct Pending {
    pub local_index: u32,
    ephemeral: StaticSecret,
    ck: Hash,
    h: Hash,
}

/// Session keys, this side's view.
pub struct SessionKeys {
    pub send: Hash,
    pub recv: Hash,
    pub local_index: u32,
    pub remote_index: u32,
}

/// TAI64N: seconds since 1970 above 2^62, then nanoseconds, big-endian; only ever compared
/// with the same peer's earlier ones.
pub fn tai64n(since_epoch: std::time::Duration) -> [u8; 12] {
    let mut t = [0u8; 12];
    t[..8].copy_from_slice(&(0x4000_0000_0000_000a_u64 + since_epoch.as_secs()).to_be_bytes());
    t[8..].copy_from_slice(&since_epoch.subsec_nanos().to_be_bytes());
    t
}

/// Builds an initiation to `peer` (mac1 and mac2 left zero) with ephemeral key
/// `ephemeral`, sender index `local_index` and timestamp `now`.
pub fn initiation(
    id: &Identity,
    peer: &mut PeerKeys,
    ephemeral: [u8; 32],
    local_index: u32,
    now: [u8; 12],
) -> Result<([u8; INITIATION_LEN], Pending), Refused> {
    let ss = peer.static_static(id)?;
    let (mut ck, mut h) = initial();
    h = hash(&[&h, &peer.public]);
    let e = StaticSecret::from(ephemeral);
    let e_pub = PublicKey::from(&e).to_bytes();
    let mut msg = [0u8; INITIATION_LEN];
    msg[0] = MSG_INITIATION;
    msg[4..8].copy_from_slice(&local_index.to_le_bytes());
    msg[8..40].copy_from_slice(&e_pub);
    [ck] = kdf::<1>(&ck, &e_pub);
    h = hash(&[&h, &e_pub]);
    let [c, k] = kdf::<2>(&ck, &dh(&e, &peer.public)?);
    ck = c;
    seal(&k, &h, &id.public, &mut msg[40..88]);
    h = hash(&[&h, &msg[40..88]]);
    let [c, k] = kdf::<2>(&ck, &ss);
    ck = c;
    seal(&k, &h, &now, &mut msg[88..116]);
    h = hash(&[&h, &msg[88..116]]);
    Ok((
        msg,
        Pending {
            local_index,
            ephemeral: e,
            ck,
            h,
        },
    ))
}

/// An initiation read as far as its sender's static key: who sent it.
pub struct InitiationHalf {
    pub peer_public: [u8; 32],
    remote_index: u32,
    e_pub: [u8; 32],
    ck: Hash,
    h: Hash,
}

/// Reads who sent initiation `msg` (INITIATION_LEN bytes, macs already checked).
pub fn initiation_sender(id: &Identity, msg: &[u8]) -> Result<InitiationHalf, Refused> {
    let (mut ck, mut h) = initial();
    h = hash(&[&h, &id.public]);
    let e_pub: [u8; 32] = msg[8..40].try_into().map_err(|_| Refused::Decrypt)?;
    [ck] = kdf::<1>(&ck, &e_pub);
    h = hash(&[&h, &e_pub]);
    let [c, k] = kdf::<2>(&ck, &dh(&id.secret, &e_pub)?);
    ck = c;
    let mut peer_public = [0u8; 32];
    open(&k, &h, &msg[40..88], &mut peer_public)?;
    h = hash(&[&h, &msg[40..88]]);
    Ok(InitiationHalf {
        peer_public,
        remote_index: u32::from_le_bytes([msg[4], msg[5], msg[6], msg[7]]),
        e_pub,
        ck,
        h,
    })
}

/// An initiation accepted from a known peer, ready to be answered.
pub struct Accepted {
    pub timestamp: [u8; 12],
    remote_index: u32,
    e_pub: [u8; 32],
    ck: Hash,
    h: Hash,
}

/// Finishes reading initiation `msg` from `peer`, refusing a timestamp not after `newest`.
pub fn accept_initiation(
    id: &Identity,
    half: InitiationHalf,
    peer: &mut PeerKeys,
    msg: &[u8],
    newest: Option<[u8; 12]>,
) -> Result<Accepted, Refused> {
    let ss = peer.static_static(id)?;
    let [ck, k] = kdf::<2>(&half.ck, &ss);
    let mut timestamp = [0u8; 12];
    open(&k, &half.h, &msg[88..116], &mut timestamp)?;
    if newest.is_some_and(|n| timestamp <= n) {
        return Err(Refused::Replayed);
    }
    Ok(Accepted {
        timestamp,
        remote_index: half.remote_index,
        e_pub: half.e_pub,
        ck,
        h: hash(&[&half.h, &msg[88..116]]),
    })
}

/// Builds the response to `accepted` (mac1 and mac2 left zero) and the responder's keys.
pub fn response(
    peer: &PeerKeys,
    accepted: &Accepted,
    ephemeral: [u8; 32],
    local_index: u32,
) -> Result<([u8; RESPONSE_LEN], SessionKeys), Refused> {
    let e = StaticSecret::from(ephemeral);
    let e_pub = PublicKey::from(&e).to_bytes();
    let mut msg = [0u8; RESPONSE_LEN];
    msg[0] = MSG_RESPONSE;
    msg[4..8].copy_from_slice(&local_index.to_le_bytes());
    msg[8..12].copy_from_slice(&accepted.remote_index.to_le_bytes());
    msg[12..44].copy_from_slice(&e_pub);
    let [mut ck] = kdf::<1>(&accepted.ck, &e_pub);
    let mut h = hash(&[&accepted.h, &e_pub]);
    [ck] = kdf::<1>(&ck, &dh(&e, &accepted.e_pub)?);
    [ck] = kdf::<1>(&ck, &dh(&e, &peer.public)?);
    let [c, tau, k] = kdf::<3>(&ck, &peer.psk);
    ck = c;
    h = hash(&[&h, &tau]);
    seal(&k, &h, &[], &mut msg[44..60]);
    let [recv, send] = kdf::<2>(&ck, &[]);
    Ok((
        msg,
        SessionKeys {
            send,
            recv,
            local_index,
            remote_index: accepted.remote_index,
        },
    ))
}

/// Reads response `msg` to our `pending` initiation: the initiator's keys.
pub fn accept_response(
    id: &Identity,
    peer: &PeerKeys,
    pending: &Pending,
    msg: &[u8],
) -> Result<SessionKeys, Refused> {
    let receiver = u32::from_le_bytes([msg[8], msg[9], msg[10], msg[11]]);
    if receiver != pending.local_index {
        return Err(Refused::Unexpected);
    }
    let e_pub: [u8; 32] = msg[12..44].try_into().map_err(|_| Refused::Decrypt)?;
    let [mut ck] = kdf::<1>(&pending.ck, &e_pub);
    let mut h = hash(&[&pending.h, &e_pub]);
    [ck] = kdf::<1>(&ck, &dh(&pending.ephemeral, &e_pub)?);
    [ck] = kdf::<1>(&ck, &dh(&id.secret, &e_pub)?);
    let [c, tau, k] = kdf::<3>(&ck, &peer.psk);
    ck = c;
    h = hash(&[&h, &tau]);
    open(&k, &h, &msg[44..60], &mut [])?;
    let [send, recv] = kdf::<2>(&ck, &[]);
    Ok(SessionKeys {
        send,
        recv,
        local_index: pending.local_index,
        remote_index: u32::from_le_bytes([msg[4], msg[5], msg[6], msg[7]]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> [u8; 32] {
        let mut k = [b; 32];
        k[0] ^= 0x55;
        k
    }

    #[test]
    fn the_initial_chaining_key_and_hash_are_the_protocol_s() {
        // Published with the WireGuard protocol (and in every implementation's constants).
        let (ck, h) = initial();
        assert_eq!(&ck[..4], &[0x60, 0xe2, 0x6d, 0xae]);
        assert_eq!(&h[..4], &[0x22, 0x11, 0xb3, 0x61]);
    }

    #[test]
    fn a_handshake_gives_both_sides_crossed_keys_and_refuses_replays_and_strangers() {
        let (ia, ib) = (Identity::new(key(1)), Identity::new(key(2)));
        let psk = key(9);
        let mut a_sees_b = PeerKeys::new(ib.public, psk);
        let mut b_sees_a = PeerKeys::new(ia.public, psk);
        let t1 = tai64n(std::time::Duration::from_secs(1000));
        let (init, pending) = initiation(&ia, &mut a_sees_b, key(3), 77, t1).unwrap();
        assert_eq!(init[0], MSG_INITIATION);
        let half = initiation_sender(&ib, &init).unwrap();
        assert_eq!(half.peer_public, ia.public);
        let accepted = accept_initiation(&ib, half, &mut b_sees_a, &init, None).unwrap();
        let (resp, b_keys) = response(&b_sees_a, &accepted, key(4), 88).unwrap();
        let a_keys = accept_response(&ia, &a_sees_b, &pending, &resp).unwrap();
        assert_eq!(a_keys.send, b_keys.recv);
        assert_eq!(a_keys.recv, b_keys.send);
        assert_ne!(a_keys.send, a_keys.recv);
        assert_eq!((a_keys.local_index, a_keys.remote_index), (77, 88));
        assert_eq!((b_keys.local_index, b_keys.remote_index), (88, 77));

        // The same initiation again: its timestamp is not newer.
        let half = initiation_sender(&ib, &init).unwrap();
        let again = accept_initiation(&ib, half, &mut b_sees_a, &init, Some(accepted.timestamp));
        assert_eq!(again.err(), Some(Refused::Replayed));
        // Another PSK on one side: the response does not open.
        let mut other = PeerKeys::new(ib.public, key(8));
        let (_, p2) = initiation(&ia, &mut other, key(5), 78, t1).unwrap();
        let mut forged = resp;
        forged[8..12].copy_from_slice(&78u32.to_le_bytes());
        assert_eq!(
            accept_response(&ia, &other, &p2, &forged).err(),
            Some(Refused::Decrypt)
        );
        // An initiation to someone else does not open here.
        let ic = Identity::new(key(6));
        let (to_c, _) = initiation(&ia, &mut PeerKeys::new(ic.public, psk), key(7), 1, t1).unwrap();
        assert_eq!(initiation_sender(&ib, &to_c).err(), Some(Refused::Decrypt));
    }

    #[test]
    fn timestamps_order_as_time_does() {
        let a = tai64n(std::time::Duration::new(5, 999_999_999));
        let b = tai64n(std::time::Duration::new(6, 0));
        assert!(a < b);
    }
}
