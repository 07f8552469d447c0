//! The kernel's WireGuard through its generic netlink family `wireguard`
//! (include/uapi/linux/wireguard.h): the messages `wg` sends, encoded and decoded here, and a
//! socket to send them. Link creation (kind "wireguard") is rtnetlink's, in cni_kernel.

use std::collections::HashMap;
use std::io;
use std::mem;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use ipnetwork::IpNetwork;

use crate::key::{Key, KEY_LEN};
use crate::uapi::{DeviceConfig, DeviceState, PeerConfig, PeerState};

pub const WG_GENL_NAME: &str = "wireguard";
pub const WG_GENL_VERSION: u8 = 1;

pub const WG_CMD_GET_DEVICE: u8 = 0;
pub const WG_CMD_SET_DEVICE: u8 = 1;

pub const WGDEVICE_F_REPLACE_PEERS: u32 = 1 << 0;

pub const WGDEVICE_A_IFINDEX: u16 = 1;
pub const WGDEVICE_A_IFNAME: u16 = 2;
pub const WGDEVICE_A_PRIVATE_KEY: u16 = 3;
pub const WGDEVICE_A_PUBLIC_KEY: u16 = 4;
pub const WGDEVICE_A_FLAGS: u16 = 5;
pub const WGDEVICE_A_LISTEN_PORT: u16 = 6;
pub const WGDEVICE_A_FWMARK: u16 = 7;
pub const WGDEVICE_A_PEERS: u16 = 8;

pub const WGPEER_F_REMOVE_ME: u32 = 1 << 0;
pub const WGPEER_F_REPLACE_ALLOWEDIPS: u32 = 1 << 1;
pub const WGPEER_F_UPDATE_ONLY: u32 = 1 << 2;

pub const WGPEER_A_PUBLIC_KEY: u16 = 1;
pub const WGPEER_A_PRESHARED_KEY: u16 = 2;
pub const WGPEER_A_FLAGS: u16 = 3;
pub const WGPEER_A_ENDPOINT: u16 = 4;
pub const WGPEER_A_PERSISTENT_KEEPALIVE_INTERVAL: u16 = 5;
pub const WGPEER_A_LAST_HANDSHAKE_TIME: u16 = 6;
pub const WGPEER_A_RX_BYTES: u16 = 7;
pub const WGPEER_A_TX_BYTES: u16 = 8;
pub const WGPEER_A_ALLOWEDIPS: u16 = 9;
pub const WGPEER_A_PROTOCOL_VERSION: u16 = 10;

pub const WGALLOWEDIP_A_FAMILY: u16 = 1;
pub const WGALLOWEDIP_A_IPADDR: u16 = 2;
pub const WGALLOWEDIP_A_CIDR_MASK: u16 = 3;

// linux/netlink.h and linux/genetlink.h
const NLA_F_NESTED: u16 = 1 << 15;
const NLA_TYPE_MASK: u16 = !(NLA_F_NESTED | (1 << 14));
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_MULTI: u16 = 0x2;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
const NLMSG_HDRLEN: usize = 16;
const GENL_HDRLEN: usize = 4;

/// Above this a set is split into several messages, as `wg` splits one (the kernel takes a
/// set of peers in parts: only the first may replace them).
const MESSAGE_BUDGET: usize = 32 * 1024;

fn align(n: usize) -> usize {
    (n + 3) & !3
}

/// Netlink attributes being written: type-length-value, each padded to 4 bytes.
#[derive(Default)]
struct Attrs(Vec<u8>);

impl Attrs {
    fn put(&mut self, kind: u16, value: &[u8]) {
        let len = 4 + value.len();
        self.0.extend_from_slice(&(len as u16).to_ne_bytes());
        self.0.extend_from_slice(&kind.to_ne_bytes());
        self.0.extend_from_slice(value);
        self.0.resize(align(self.0.len()), 0);
    }

    fn nest(&mut self, kind: u16, inner: Attrs) {
        self.put(kind | NLA_F_NESTED, &inner.0);
    }
}

/// A sockaddr_in or sockaddr_in6 as the kernel reads WGPEER_A_ENDPOINT: family in host
/// order, port big-endian.
fn endpoint_bytes(addr: &SocketAddr) -> Vec<u8> {
    let mut b = Vec::with_capacity(28);
    match addr {
        SocketAddr::V4(a) => {
            b.extend_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
            b.extend_from_slice(&a.port().to_be_bytes());
            b.extend_from_slice(&a.ip().octets());
            b.extend_from_slice(&[0; 8]);
        }
        SocketAddr::V6(a) => {
            b.extend_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
            b.extend_from_slice(&a.port().to_be_bytes());
            b.extend_from_slice(&a.flowinfo().to_be_bytes());
            b.extend_from_slice(&a.ip().octets());
            b.extend_from_slice(&a.scope_id().to_ne_bytes());
        }
    }
    b
}

fn parse_endpoint(b: &[u8]) -> Option<SocketAddr> {
    let family = u16::from_ne_bytes(b.get(0..2)?.try_into().ok()?) as i32;
    let port = u16::from_be_bytes(b.get(2..4)?.try_into().ok()?);
    match family {
        libc::AF_INET => {
            let ip: [u8; 4] = b.get(4..8)?.try_into().ok()?;
            Some(SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::from(ip), port)))
        }
        libc::AF_INET6 => {
            let flow = u32::from_be_bytes(b.get(4..8)?.try_into().ok()?);
            let ip: [u8; 16] = b.get(8..24)?.try_into().ok()?;
            let scope = u32::from_ne_bytes(b.get(24..28)?.try_into().ok()?);
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(ip),
                port,
                flow,
                scope,
            )))
        }
        _ => None,
    }
}

fn peer_attrs(p: &PeerConfig) -> Attrs {
    let mut a = Attrs::default();
    a.put(WGPEER_A_PUBLIC_KEY, &p.public_key.0);
    let mut flags = 0;
    if p.remove {
        flags |= WGPEER_F_REMOVE_ME;
    }
    if p.update_only {
        flags |= WGPEER_F_UPDATE_ONLY;
    }
    if p.replace_allowed_ips {
        flags |= WGPEER_F_REPLACE_ALLOWEDIPS;
    }
    if flags != 0 {
        a.put(WGPEER_A_FLAGS, &flags.to_ne_bytes());
    }
    if p.remove {
        return a;
    }
    if let Some(k) = &p.preshared_key {
        a.put(WGPEER_A_PRESHARED_KEY, &k.0);
    }
    if let Some(e) = &p.endpoint {
        a.put(WGPEER_A_ENDPOINT, &endpoint_bytes(e));
    }
    if let Some(k) = p.persistent_keepalive {
        a.put(WGPEER_A_PERSISTENT_KEEPALIVE_INTERVAL, &k.to_ne_bytes());
    }
    if !p.allowed_ips.is_empty() {
        let mut list = Attrs::default();
        for net in &p.allowed_ips {
            let mut one = Attrs::default();
            let (family, addr) = match net.ip() {
                IpAddr::V4(ip) => (libc::AF_INET as u16, ip.octets().to_vec()),
                IpAddr::V6(ip) => (libc::AF_INET6 as u16, ip.octets().to_vec()),
            };
            one.put(WGALLOWEDIP_A_FAMILY, &family.to_ne_bytes());
            one.put(WGALLOWEDIP_A_IPADDR, &addr);
            one.put(WGALLOWEDIP_A_CIDR_MASK, &[net.prefix()]);
            list.nest(0, one);
        }
        a.nest(WGPEER_A_ALLOWEDIPS, list);
    }
    a
}

fn message(family: u16, flags: u16, seq: u32, cmd: u8, attrs: &Attrs) -> Vec<u8> {
    let len = NLMSG_HDRLEN + GENL_HDRLEN + attrs.0.len();
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&(len as u32).to_ne_bytes());
    m.extend_from_slice(&family.to_ne_bytes());
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(&[cmd, WG_GENL_VERSION, 0, 0]);
    m.extend_from_slice(&attrs.0);
    m
}

/// The WG_CMD_SET_DEVICE messages applying `config` to device `ifname`, in order: the first
/// carries the device's own attributes (and REPLACE_PEERS), peers fill as many as they need.
pub fn set_device_messages(
    family: u16,
    ifname: &str,
    config: &DeviceConfig,
    seq: u32,
) -> Vec<Vec<u8>> {
    let ifname_z = [ifname.as_bytes(), &[0]].concat();
    let head = |first: bool| {
        let mut a = Attrs::default();
        a.put(WGDEVICE_A_IFNAME, &ifname_z);
        if first {
            if let Some(k) = &config.private_key {
                a.put(WGDEVICE_A_PRIVATE_KEY, &k.0);
            }
            if let Some(p) = config.listen_port {
                a.put(WGDEVICE_A_LISTEN_PORT, &p.to_ne_bytes());
            }
            if let Some(m) = config.fwmark {
                a.put(WGDEVICE_A_FWMARK, &m.to_ne_bytes());
            }
            if config.replace_peers {
                a.put(WGDEVICE_A_FLAGS, &WGDEVICE_F_REPLACE_PEERS.to_ne_bytes());
            }
        }
        a
    };
    let flags = NLM_F_REQUEST | NLM_F_ACK;
    let mut out = Vec::new();
    let mut attrs = head(true);
    let mut peers = Attrs::default();
    for p in &config.peers {
        let one = peer_attrs(p);
        if !peers.0.is_empty() && attrs.0.len() + peers.0.len() + one.0.len() + 8 > MESSAGE_BUDGET {
            attrs.nest(WGDEVICE_A_PEERS, std::mem::take(&mut peers));
            out.push(message(
                family,
                flags,
                seq + out.len() as u32,
                WG_CMD_SET_DEVICE,
                &attrs,
            ));
            attrs = head(false);
        }
        peers.nest(0, one);
    }
    if !peers.0.is_empty() {
        attrs.nest(WGDEVICE_A_PEERS, peers);
    }
    out.push(message(
        family,
        flags,
        seq + out.len() as u32,
        WG_CMD_SET_DEVICE,
        &attrs,
    ));
    out
}

/// The WG_CMD_GET_DEVICE dump request for device `ifname`.
pub fn get_device_message(family: u16, ifname: &str, seq: u32) -> Vec<u8> {
    let mut a = Attrs::default();
    a.put(WGDEVICE_A_IFNAME, &[ifname.as_bytes(), &[0]].concat());
    message(
        family,
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_DUMP,
        seq,
        WG_CMD_GET_DEVICE,
        &a,
    )
}

/// The controller's CTRL_CMD_GETFAMILY request for the `wireguard` family.
pub fn get_family_message(seq: u32) -> Vec<u8> {
    let mut a = Attrs::default();
    a.put(
        CTRL_ATTR_FAMILY_NAME,
        &[WG_GENL_NAME.as_bytes(), &[0]].concat(),
    );
    let mut m = message(
        GENL_ID_CTRL,
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        CTRL_CMD_GETFAMILY,
        &a,
    );
    // The controller's own version is 2; the kernel ignores it, as `wg` relies on.
    m[NLMSG_HDRLEN + 1] = 2;
    m
}

/// The attributes in `b`: (type without flags, value).
fn attributes(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if b.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([b[0], b[1]]) as usize;
        let kind = u16::from_ne_bytes([b[2], b[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > b.len() {
            return None;
        }
        let value = &b[4..len];
        b = &b[align(len).min(b.len())..];
        Some((kind, value))
    })
}

fn u16_of(v: &[u8]) -> Option<u16> {
    Some(u16::from_ne_bytes(v.get(..2)?.try_into().ok()?))
}

fn u64_of(v: &[u8]) -> Option<u64> {
    Some(u64::from_ne_bytes(v.get(..8)?.try_into().ok()?))
}

fn key_of(v: &[u8]) -> Option<Key> {
    Some(Key(v.get(..KEY_LEN)?.try_into().ok()?))
}

fn parse_allowed(v: &[u8]) -> Option<IpNetwork> {
    let (mut family, mut addr, mut cidr) = (None, None, None);
    for (k, v) in attributes(v) {
        match k {
            WGALLOWEDIP_A_FAMILY => family = u16_of(v),
            WGALLOWEDIP_A_IPADDR => addr = Some(v),
            WGALLOWEDIP_A_CIDR_MASK => cidr = v.first().copied(),
            _ => {}
        }
    }
    let ip = match (family? as i32, addr?) {
        (libc::AF_INET, a) => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(a.get(..4)?).ok()?)),
        (libc::AF_INET6, a) => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(a.get(..16)?).ok()?)),
        _ => return None,
    };
    IpNetwork::new(ip, cidr?).ok()
}

/// Folds the genetlink payloads (after the genl header) of a GET_DEVICE dump into one
/// device: the kernel splits a long peer list over messages, repeating a peer's key when
/// its allowed IPs continue.
pub fn parse_device(payloads: &[&[u8]]) -> DeviceState {
    let mut state = DeviceState::default();
    let mut index: HashMap<Key, usize> = HashMap::new();
    for payload in payloads {
        for (kind, value) in attributes(payload) {
            match kind {
                WGDEVICE_A_PRIVATE_KEY => {
                    state.private_key = key_of(value).filter(|k| !k.is_zero())
                }
                WGDEVICE_A_LISTEN_PORT => state.listen_port = u16_of(value).unwrap_or(0),
                WGDEVICE_A_FWMARK => {
                    state.fwmark = value
                        .get(..4)
                        .map_or(0, |b| u32::from_ne_bytes(b.try_into().unwrap_or_default()))
                }
                WGDEVICE_A_PEERS => {
                    for (_, peer) in attributes(value) {
                        parse_peer(peer, &mut state, &mut index);
                    }
                }
                _ => {}
            }
        }
    }
    state
}

fn parse_peer(v: &[u8], state: &mut DeviceState, index: &mut HashMap<Key, usize>) {
    let Some(key) = attributes(v)
        .find(|(k, _)| *k == WGPEER_A_PUBLIC_KEY)
        .and_then(|(_, v)| key_of(v))
    else {
        return;
    };
    let i = *index.entry(key).or_insert_with(|| {
        state.peers.push(PeerState::new(key));
        state.peers.len() - 1
    });
    let p = &mut state.peers[i];
    for (kind, value) in attributes(v) {
        match kind {
            WGPEER_A_PRESHARED_KEY => p.preshared_key = key_of(value).filter(|k| !k.is_zero()),
            WGPEER_A_ENDPOINT => p.endpoint = parse_endpoint(value),
            WGPEER_A_PERSISTENT_KEEPALIVE_INTERVAL => {
                p.persistent_keepalive = u16_of(value).unwrap_or(0)
            }
            WGPEER_A_LAST_HANDSHAKE_TIME => {
                let secs = value.get(..8).and_then(u64_of).unwrap_or(0);
                let nanos = value.get(8..16).and_then(u64_of).unwrap_or(0) as u32;
                p.last_handshake = (secs != 0 || nanos != 0).then(|| Duration::new(secs, nanos));
            }
            WGPEER_A_RX_BYTES => p.rx_bytes = u64_of(value).unwrap_or(0),
            WGPEER_A_TX_BYTES => p.tx_bytes = u64_of(value).unwrap_or(0),
            WGPEER_A_ALLOWEDIPS => {
                p.allowed_ips
                    .extend(attributes(value).filter_map(|(_, a)| parse_allowed(a)));
            }
            _ => {}
        }
    }
}

/// A generic netlink socket talking to the kernel's `wireguard` family, in the network
/// namespace of the thread that opened it.
pub struct KernelWireguard {
    fd: OwnedFd,
    family: u16,
    seq: u32,
}

/// What happened to one netlink request.
fn os_error(op: &str, errno: i32) -> io::Error {
    let e = io::Error::from_raw_os_error(errno);
    io::Error::new(e.kind(), format!("{op}: {e}"))
}

impl KernelWireguard {
    /// Opens the socket and resolves the family; Ok(None) when the kernel has no WireGuard
    /// loaded (the family appears with the module, which creating a link loads).
    pub fn open() -> io::Result<Option<KernelWireguard>> {
        // SAFETY: plain socket(2); the descriptor is owned at once.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_GENERIC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is fresh and ours.
        let mut s = KernelWireguard {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            family: 0,
            seq: 1,
        };
        let seq = s.next_seq();
        match s.request(&get_family_message(seq), seq) {
            Ok(payloads) => {
                let id = payloads
                    .iter()
                    .flat_map(|p| attributes(p).collect::<Vec<_>>())
                    .find(|(k, _)| *k == CTRL_ATTR_FAMILY_ID)
                    .and_then(|(_, v)| u16_of(v));
                match id {
                    Some(id) => {
                        s.family = id;
                        Ok(Some(s))
                    }
                    None => Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "the controller named no family id",
                    )),
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    pub fn get(&mut self, ifname: &str) -> io::Result<DeviceState> {
        let seq = self.next_seq();
        let payloads = self.request(&get_device_message(self.family, ifname, seq), seq)?;
        let refs: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
        Ok(parse_device(&refs))
    }

    pub fn set(&mut self, ifname: &str, config: &DeviceConfig) -> io::Result<()> {
        let seq = self.seq.wrapping_add(1);
        let messages = set_device_messages(self.family, ifname, config, seq);
        self.seq = seq.wrapping_add(messages.len() as u32);
        for (i, m) in messages.iter().enumerate() {
            self.request(m, seq.wrapping_add(i as u32))?;
        }
        Ok(())
    }

    /// Sends one request and collects the genl payloads of its answer up to the ack or DONE.
    fn request(&mut self, msg: &[u8], seq: u32) -> io::Result<Vec<Vec<u8>>> {
        // SAFETY: sockaddr_nl is plain data; zero means the kernel.
        let mut kernel: libc::sockaddr_nl = unsafe { mem::zeroed() };
        kernel.nl_family = libc::AF_NETLINK as u16;
        // SAFETY: msg and kernel are valid for the lengths given.
        let n = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                msg.as_ptr().cast(),
                msg.len(),
                0,
                (&kernel as *const libc::sockaddr_nl).cast(),
                mem::size_of::<libc::sockaddr_nl>() as u32,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut out = Vec::new();
        let mut buf = vec![0u8; 1 << 16];
        loop {
            // SAFETY: buf is valid for writes of its length.
            let n =
                unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            let mut b = &buf[..n as usize];
            while b.len() >= NLMSG_HDRLEN {
                let len = u32::from_ne_bytes(b[0..4].try_into().unwrap_or_default()) as usize;
                let kind = u16::from_ne_bytes([b[4], b[5]]);
                let flags = u16::from_ne_bytes([b[6], b[7]]);
                let mseq = u32::from_ne_bytes(b[8..12].try_into().unwrap_or_default());
                if len < NLMSG_HDRLEN || len > b.len() {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "a truncated netlink message",
                    ));
                }
                let body = &b[NLMSG_HDRLEN..len];
                b = &b[align(len).min(b.len())..];
                if mseq != seq {
                    continue;
                }
                match kind {
                    NLMSG_ERROR => {
                        let errno = i32::from_ne_bytes(
                            body.get(..4)
                                .and_then(|s| s.try_into().ok())
                                .unwrap_or_default(),
                        );
                        if errno != 0 {
                            return Err(os_error("wireguard generic netlink", -errno));
                        }
                        return Ok(out);
                    }
                    NLMSG_DONE => {
                        // A dump ends with DONE and, asked for, an ack after it.
                        if flags & NLM_F_MULTI == 0 {
                            return Ok(out);
                        }
                        continue;
                    }
                    _ => out.push(body.get(GENL_HDRLEN..).unwrap_or_default().to_vec()),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs_of(m: &[u8]) -> Vec<(u16, u16, Vec<u8>)> {
        let mut out = Vec::new();
        let mut b = m;
        while b.len() >= 4 {
            let len = u16::from_ne_bytes([b[0], b[1]]) as usize;
            let raw = u16::from_ne_bytes([b[2], b[3]]);
            out.push((raw & NLA_TYPE_MASK, raw & NLA_F_NESTED, b[4..len].to_vec()));
            b = &b[align(len).min(b.len())..];
        }
        out
    }

    #[test]
    fn constants_are_the_uapi_header_s() {
        // include/uapi/linux/wireguard.h, counted from the enums' UNSPEC = 0.
        assert_eq!((WG_CMD_GET_DEVICE, WG_CMD_SET_DEVICE), (0, 1));
        assert_eq!(
            [
                WGDEVICE_A_IFINDEX,
                WGDEVICE_A_IFNAME,
                WGDEVICE_A_PRIVATE_KEY,
                WGDEVICE_A_PUBLIC_KEY,
                WGDEVICE_A_FLAGS,
                WGDEVICE_A_LISTEN_PORT,
                WGDEVICE_A_FWMARK,
                WGDEVICE_A_PEERS
            ],
            [1, 2, 3, 4, 5, 6, 7, 8]
        );
        assert_eq!(
            [
                WGPEER_A_PUBLIC_KEY,
                WGPEER_A_PRESHARED_KEY,
                WGPEER_A_FLAGS,
                WGPEER_A_ENDPOINT,
                WGPEER_A_PERSISTENT_KEEPALIVE_INTERVAL,
                WGPEER_A_LAST_HANDSHAKE_TIME,
                WGPEER_A_RX_BYTES,
                WGPEER_A_TX_BYTES,
                WGPEER_A_ALLOWEDIPS,
                WGPEER_A_PROTOCOL_VERSION
            ],
            [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
        );
        assert_eq!(
            [
                WGALLOWEDIP_A_FAMILY,
                WGALLOWEDIP_A_IPADDR,
                WGALLOWEDIP_A_CIDR_MASK
            ],
            [1, 2, 3]
        );
        assert_eq!(
            (
                WGPEER_F_REMOVE_ME,
                WGPEER_F_REPLACE_ALLOWEDIPS,
                WGPEER_F_UPDATE_ONLY
            ),
            (1, 2, 4)
        );
        assert_eq!(WGDEVICE_F_REPLACE_PEERS, 1);
    }

    fn sample() -> DeviceConfig {
        let mut peer = PeerConfig::new(Key([2; 32]));
        peer.preshared_key = Some(Key([3; 32]));
        peer.endpoint = Some("192.0.2.7:51820".parse().unwrap());
        peer.persistent_keepalive = Some(25);
        peer.replace_allowed_ips = true;
        peer.allowed_ips = vec![
            "10.5.7.0/24".parse().unwrap(),
            "fd00:5:7::/64".parse().unwrap(),
        ];
        let mut gone = PeerConfig::new(Key([4; 32]));
        gone.remove = true;
        DeviceConfig {
            private_key: Some(Key([1; 32])),
            listen_port: Some(51820),
            fwmark: None,
            replace_peers: true,
            peers: vec![peer, gone],
        }
    }

    #[test]
    fn set_device_is_encoded_as_the_uapi_lays_it_out() {
        let msgs = set_device_messages(0x1d, "flannel-wg", &sample(), 7);
        assert_eq!(msgs.len(), 1);
        let m = &msgs[0];
        // nlmsghdr: length, the family's id as type, REQUEST|ACK, seq, port 0.
        assert_eq!(
            u32::from_ne_bytes(m[0..4].try_into().unwrap()) as usize,
            m.len()
        );
        assert_eq!(u16::from_ne_bytes([m[4], m[5]]), 0x1d);
        assert_eq!(u16::from_ne_bytes([m[6], m[7]]), NLM_F_REQUEST | NLM_F_ACK);
        assert_eq!(u32::from_ne_bytes(m[8..12].try_into().unwrap()), 7);
        // genlmsghdr: SET_DEVICE, version 1.
        assert_eq!(&m[16..20], &[1, 1, 0, 0]);
        let dev = attrs_of(&m[20..]);
        let kinds: Vec<u16> = dev.iter().map(|a| a.0).collect();
        assert_eq!(
            kinds,
            vec![
                WGDEVICE_A_IFNAME,
                WGDEVICE_A_PRIVATE_KEY,
                WGDEVICE_A_LISTEN_PORT,
                WGDEVICE_A_FLAGS,
                WGDEVICE_A_PEERS
            ]
        );
        assert_eq!(dev[0].2, b"flannel-wg\0");
        assert_eq!(dev[1].2, vec![1; 32]);
        assert_eq!(dev[2].2, 51820u16.to_ne_bytes());
        assert_eq!(dev[3].2, 1u32.to_ne_bytes());
        assert_eq!(dev[4].1, NLA_F_NESTED, "PEERS is a nest");
        let peers = attrs_of(&dev[4].2);
        assert_eq!(peers.len(), 2);
        assert!(
            peers.iter().all(|p| p.0 == 0 && p.1 == NLA_F_NESTED),
            "peers are an array of nests"
        );
        let p = attrs_of(&peers[0].2);
        let kinds: Vec<u16> = p.iter().map(|a| a.0).collect();
        assert_eq!(
            kinds,
            vec![
                WGPEER_A_PUBLIC_KEY,
                WGPEER_A_FLAGS,
                WGPEER_A_PRESHARED_KEY,
                WGPEER_A_ENDPOINT,
                WGPEER_A_PERSISTENT_KEEPALIVE_INTERVAL,
                WGPEER_A_ALLOWEDIPS
            ]
        );
        assert_eq!(p[1].2, WGPEER_F_REPLACE_ALLOWEDIPS.to_ne_bytes());
        // sockaddr_in: AF_INET in host order, port big-endian, address, 8 bytes of zero.
        let mut sin = (libc::AF_INET as u16).to_ne_bytes().to_vec();
        sin.extend_from_slice(&[0xca, 0x6c, 192, 0, 2, 7, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(p[3].2, sin);
        assert_eq!(p[4].2, 25u16.to_ne_bytes());
        assert_eq!(p[5].1, NLA_F_NESTED);
        let ips = attrs_of(&p[5].2);
        assert_eq!(ips.len(), 2);
        let v6 = attrs_of(&ips[1].2);
        assert_eq!(
            v6[0],
            (
                WGALLOWEDIP_A_FAMILY,
                0,
                (libc::AF_INET6 as u16).to_ne_bytes().to_vec()
            )
        );
        assert_eq!(v6[1].2.len(), 16);
        assert_eq!(v6[2], (WGALLOWEDIP_A_CIDR_MASK, 0, vec![64]));
        // A removal carries only the key and REMOVE_ME.
        let gone = attrs_of(&peers[1].2);
        assert_eq!(gone.len(), 2);
        assert_eq!(
            gone[1],
            (WGPEER_A_FLAGS, 0, WGPEER_F_REMOVE_ME.to_ne_bytes().to_vec())
        );
    }

    #[test]
    fn a_large_set_is_split_and_only_the_first_part_replaces_peers() {
        let mut config = sample();
        config.peers = (0..2000u16)
            .map(|i| {
                let mut k = [0u8; 32];
                k[..2].copy_from_slice(&i.to_be_bytes());
                let mut p = PeerConfig::new(Key(k));
                p.endpoint = Some(SocketAddr::from(([192, 0, 2, 1], 51820)));
                p.allowed_ips = vec![IpNetwork::new(
                    IpAddr::V4(Ipv4Addr::new(10, (i >> 8) as u8, i as u8, 0)),
                    24,
                )
                .unwrap()];
                p
            })
            .collect();
        let msgs = set_device_messages(0x1d, "flannel-wg", &config, 100);
        assert!(msgs.len() > 1);
        let mut seen = 0;
        for (i, m) in msgs.iter().enumerate() {
            assert!(
                m.len() <= MESSAGE_BUDGET + 256,
                "message {i}: {} bytes",
                m.len()
            );
            assert_eq!(
                u32::from_ne_bytes(m[8..12].try_into().unwrap()),
                100 + i as u32
            );
            let dev = attrs_of(&m[20..]);
            let has_flags = dev.iter().any(|a| a.0 == WGDEVICE_A_FLAGS);
            let has_key = dev.iter().any(|a| a.0 == WGDEVICE_A_PRIVATE_KEY);
            assert_eq!(has_flags, i == 0);
            assert_eq!(has_key, i == 0);
            assert_eq!(dev[0].2, b"flannel-wg\0", "every part names the device");
            seen += dev
                .iter()
                .filter(|a| a.0 == WGDEVICE_A_PEERS)
                .map(|a| attrs_of(&a.2).len())
                .sum::<usize>();
        }
        assert_eq!(seen, 2000);
    }

    #[test]
    fn a_device_dump_split_over_messages_folds_into_one() {
        // As the kernel answers GET_DEVICE: the set encoding is the same attribute layout,
        // plus the read-only attributes; a peer continued in a second message.
        let mut first = Attrs::default();
        first.put(WGDEVICE_A_PRIVATE_KEY, &[1; 32]);
        first.put(WGDEVICE_A_LISTEN_PORT, &51820u16.to_ne_bytes());
        let mut p = peer_attrs(&sample().peers[0]);
        let mut ts = 1_700_000_000u64.to_ne_bytes().to_vec();
        ts.extend_from_slice(&5u64.to_ne_bytes());
        p.put(WGPEER_A_LAST_HANDSHAKE_TIME, &ts);
        p.put(WGPEER_A_RX_BYTES, &10u64.to_ne_bytes());
        p.put(WGPEER_A_TX_BYTES, &20u64.to_ne_bytes());
        let mut list = Attrs::default();
        list.nest(0, p);
        first.nest(WGDEVICE_A_PEERS, list);
        let mut more = PeerConfig::new(Key([2; 32]));
        more.allowed_ips = vec!["10.6.0.0/16".parse().unwrap()];
        let mut second = Attrs::default();
        let mut list = Attrs::default();
        list.nest(0, peer_attrs(&more));
        second.nest(WGDEVICE_A_PEERS, list);
        let state = parse_device(&[&first.0, &second.0]);
        assert_eq!(state.private_key, Some(Key([1; 32])));
        assert_eq!(state.listen_port, 51820);
        assert_eq!(state.peers.len(), 1);
        let p = &state.peers[0];
        assert_eq!(p.endpoint, Some("192.0.2.7:51820".parse().unwrap()));
        assert_eq!(p.preshared_key, Some(Key([3; 32])));
        assert_eq!(p.persistent_keepalive, 25);
        assert_eq!(p.last_handshake, Some(Duration::new(1_700_000_000, 5)));
        assert_eq!((p.rx_bytes, p.tx_bytes), (10, 20));
        let want: Vec<IpNetwork> = ["10.5.7.0/24", "fd00:5:7::/64", "10.6.0.0/16"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        assert_eq!(p.allowed_ips, want);
    }

    #[test]
    fn ipv6_endpoints_are_sockaddr_in6() {
        let addr: SocketAddr = "[2001:db8::1]:51821".parse().unwrap();
        let b = endpoint_bytes(&addr);
        assert_eq!(b.len(), mem::size_of::<libc::sockaddr_in6>());
        assert_eq!(u16::from_ne_bytes([b[0], b[1]]) as i32, libc::AF_INET6);
        assert_eq!(&b[2..4], &51821u16.to_be_bytes());
        assert_eq!(parse_endpoint(&b), Some(addr));
    }

    #[test]
    fn the_family_request_asks_the_controller_for_wireguard() {
        let m = get_family_message(3);
        assert_eq!(u16::from_ne_bytes([m[4], m[5]]), GENL_ID_CTRL);
        assert_eq!(m[16], CTRL_CMD_GETFAMILY);
        let a = attrs_of(&m[20..]);
        assert_eq!(a, vec![(CTRL_ATTR_FAMILY_NAME, 0, b"wireguard\0".to_vec())]);
        let g = get_device_message(0x1d, "flannel-wg", 4);
        assert_eq!(
            u16::from_ne_bytes([g[6], g[7]]),
            NLM_F_REQUEST | NLM_F_ACK | NLM_F_DUMP
        );
        assert_eq!(g[16], WG_CMD_GET_DEVICE);
    }
}
