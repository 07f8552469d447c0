//! Connection tracking entries, through ctnetlink in the calling thread's network namespace.
//!
//! A UDP flow that conntrack saw before a port mapping existed keeps its old (un-NATed) entry
//! for as long as packets keep coming, so a new mapping only takes effect once that entry goes.

use crate::error::Error;
use crate::firewall::Family;
use nix::errno::Errno;
use nix::sys::socket::{
    bind, recv, send, socket, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol,
    SockType,
};
use std::os::fd::{AsRawFd, OwnedFd};

const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_NEW: u16 = 0;
const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLMSG_HDRLEN: usize = 16;
const NFGENMSG_LEN: usize = 4;
const NLA_HDRLEN: usize = 4;
const NLA_TYPE_MASK: u16 = 0x3fff;
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_ZONE: u16 = 18;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_DST_PORT: u16 = 3;

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

fn family_byte(family: Family) -> u8 {
    match family {
        Family::V4 => nix::libc::AF_INET as u8,
        Family::V6 => nix::libc::AF_INET6 as u8,
    }
}

/// One netlink attribute: its type, its payload, and its whole encoding (to send it back).
struct Attr<'a> {
    kind: u16,
    payload: &'a [u8],
    raw: &'a [u8],
}

fn attrs(mut buf: &[u8]) -> impl Iterator<Item = Attr<'_>> {
    std::iter::from_fn(move || {
        if buf.len() < NLA_HDRLEN {
            return None;
        }
        let len = u16::from_ne_bytes([buf[0], buf[1]]) as usize;
        let kind = u16::from_ne_bytes([buf[2], buf[3]]) & NLA_TYPE_MASK;
        if len < NLA_HDRLEN || len > buf.len() {
            return None;
        }
        let attr = Attr {
            kind,
            payload: &buf[NLA_HDRLEN..len],
            raw: &buf[..len],
        };
        buf = &buf[align4(len).min(buf.len())..];
        Some(attr)
    })
}

fn find<'a>(buf: &'a [u8], kind: u16) -> Option<Attr<'a>> {
    attrs(buf).find(|a| a.kind == kind)
}

/// One netlink message: type and body.
fn messages(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if buf.len() < NLMSG_HDRLEN {
            return None;
        }
        let len = u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        let kind = u16::from_ne_bytes([buf[4], buf[5]]);
        if len < NLMSG_HDRLEN || len > buf.len() {
            return None;
        }
        let body = &buf[NLMSG_HDRLEN..len];
        buf = &buf[align4(len).min(buf.len())..];
        Some((kind, body))
    })
}

/// The attributes that identify a dumped entry for deletion (its original tuple and zone),
/// when its original direction goes to one of `ports` over `protocol`.
fn deletion_key(entry: &[u8], protocol: u8, ports: &[u16]) -> Option<Vec<u8>> {
    let attrs_of_entry = entry.get(NFGENMSG_LEN..)?;
    let orig = find(attrs_of_entry, CTA_TUPLE_ORIG)?;
    let proto = find(orig.payload, CTA_TUPLE_PROTO)?;
    let num = *find(proto.payload, CTA_PROTO_NUM)?.payload.first()?;
    let port = find(proto.payload, CTA_PROTO_DST_PORT)?;
    let port = u16::from_be_bytes(port.payload.get(..2)?.try_into().ok()?);
    if num != protocol || !ports.contains(&port) {
        return None;
    }
    let mut key = orig.raw.to_vec();
    key.resize(align4(key.len()), 0);
    if let Some(zone) = find(attrs_of_entry, CTA_ZONE) {
        key.extend_from_slice(zone.raw);
        key.resize(align4(key.len()), 0);
    }
    Some(key)
}

fn request(msg: u16, flags: u16, seq: u32, family: u8, attrs: &[u8]) -> Vec<u8> {
    let len = NLMSG_HDRLEN + NFGENMSG_LEN + attrs.len();
    let mut buf = Vec::with_capacity(len);
    buf.extend_from_slice(&(len as u32).to_ne_bytes());
    buf.extend_from_slice(&((NFNL_SUBSYS_CTNETLINK << 8) | msg).to_ne_bytes());
    buf.extend_from_slice(&(NLM_F_REQUEST | flags).to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes());
    // nfgenmsg: family, version 0, resource id 0.
    buf.extend_from_slice(&[family, 0, 0, 0]);
    buf.extend_from_slice(attrs);
    buf
}

/// The errno of an NLMSG_ERROR body (0 for an acknowledgement).
fn error_code(body: &[u8]) -> i32 {
    body.get(..4)
        .map(|b| -i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        .unwrap_or(0)
}

struct Ctnetlink {
    fd: OwnedFd,
    buf: Vec<u8>,
}

impl Ctnetlink {
    fn open() -> Result<Ctnetlink, Error> {
        let fd = socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkNetFilter,
        )
        .map_err(|e| Error::os("opening", "a ctnetlink socket", e))?;
        bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0))
            .map_err(|e| Error::os("binding", "the ctnetlink socket", e))?;
        Ok(Ctnetlink {
            fd,
            buf: vec![0; 256 * 1024],
        })
    }

    fn send(&self, msg: &[u8]) -> Result<(), Error> {
        send(self.fd.as_raw_fd(), msg, MsgFlags::empty())
            .map(|_| ())
            .map_err(|e| Error::os("sending to", "ctnetlink", e))
    }

    fn receive(&mut self) -> Result<&[u8], Error> {
        let n = loop {
            match recv(self.fd.as_raw_fd(), &mut self.buf, MsgFlags::empty()) {
                Err(Errno::EINTR) => continue,
                other => break other,
            }
        }
        .map_err(|e| Error::os("reading from", "ctnetlink", e))?;
        Ok(&self.buf[..n])
    }
}

/// Deletes the conntrack entries of `family` whose original direction goes to one of `ports`
/// over `protocol` (IANA number: 17 for UDP), and returns how many went.
pub fn delete_by_dst_port(family: Family, protocol: u8, ports: &[u16]) -> Result<usize, Error> {
    if ports.is_empty() {
        return Ok(0);
    }
    let fam = family_byte(family);
    let mut nl = Ctnetlink::open()?;
    nl.send(&request(IPCTNL_MSG_CT_GET, NLM_F_DUMP, 1, fam, &[]))?;
    let mut doomed = Vec::new();
    'dump: loop {
        for (kind, body) in messages(nl.receive()?) {
            match kind {
                NLMSG_DONE => break 'dump,
                NLMSG_ERROR if error_code(body) != 0 => {
                    return Err(Error::os(
                        "listing",
                        "conntrack entries",
                        Errno::from_raw(error_code(body)),
                    ))
                }
                k if k == (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_NEW => {
                    doomed.extend(deletion_key(body, protocol, ports));
                }
                _ => {}
            }
        }
    }
    let mut deleted = 0;
    for (seq, key) in (2..).zip(&doomed) {
        nl.send(&request(IPCTNL_MSG_CT_DELETE, NLM_F_ACK, seq, fam, key))?;
        let code = messages(nl.receive()?)
            .find(|(kind, _)| *kind == NLMSG_ERROR)
            .map_or(0, |(_, body)| error_code(body));
        match code {
            0 => deleted += 1,
            // Gone on its own in the meantime.
            c if c == Errno::ENOENT as i32 => {}
            c => {
                return Err(Error::os(
                    "deleting",
                    "a conntrack entry",
                    Errno::from_raw(c),
                ))
            }
        }
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(kind: u16, payload: &[u8]) -> Vec<u8> {
        let mut a = Vec::new();
        a.extend_from_slice(&((NLA_HDRLEN + payload.len()) as u16).to_ne_bytes());
        a.extend_from_slice(&kind.to_ne_bytes());
        a.extend_from_slice(payload);
        a.resize(align4(a.len()), 0);
        a
    }

    fn nested(kind: u16, parts: &[Vec<u8>]) -> Vec<u8> {
        attr(kind | 0x8000, &parts.concat())
    }

    /// A dumped entry as the kernel sends it (nfgenmsg, then attributes).
    fn entry(proto: u8, dport: u16, zone: Option<u16>) -> Vec<u8> {
        let ip = nested(1, &[attr(1, &[10, 0, 0, 1]), attr(2, &[10, 0, 0, 2])]);
        let l4 = nested(
            CTA_TUPLE_PROTO,
            &[
                attr(CTA_PROTO_NUM, &[proto]),
                attr(2, &40000u16.to_be_bytes()),
                attr(CTA_PROTO_DST_PORT, &dport.to_be_bytes()),
            ],
        );
        let mut e = vec![2, 0, 0, 0];
        e.extend(nested(CTA_TUPLE_ORIG, &[ip.clone(), l4.clone()]));
        e.extend(nested(2, &[ip, l4]));
        if let Some(z) = zone {
            e.extend(attr(CTA_ZONE, &z.to_be_bytes()));
        }
        e
    }

    #[test]
    fn entries_to_the_ports_are_picked_with_their_tuple() {
        let e = entry(17, 5353, None);
        let key = deletion_key(&e, 17, &[53, 5353]).unwrap();
        let orig = find(&e[4..], CTA_TUPLE_ORIG).unwrap();
        assert_eq!(key, orig.raw);
        assert!(deletion_key(&e, 6, &[5353]).is_none());
        assert!(deletion_key(&e, 17, &[53]).is_none());
        assert!(deletion_key(&e[..3], 17, &[5353]).is_none());
    }

    #[test]
    fn the_zone_goes_with_the_tuple() {
        let e = entry(17, 53, Some(7));
        let key = deletion_key(&e, 17, &[53]).unwrap();
        let kinds: Vec<u16> = attrs(&key).map(|a| a.kind).collect();
        assert_eq!(kinds, [CTA_TUPLE_ORIG, CTA_ZONE]);
    }

    #[test]
    fn requests_and_replies_frame_as_netlink() {
        let r = request(
            IPCTNL_MSG_CT_DELETE,
            NLM_F_ACK,
            9,
            10,
            &attr(5, &[1, 2, 3, 4]),
        );
        assert_eq!(r.len(), 16 + 4 + 8);
        let msgs: Vec<(u16, &[u8])> = messages(&r).collect();
        assert_eq!(msgs.len(), 1);
        assert_eq!(msgs[0].0, 0x102);
        assert_eq!(msgs[0].1[0], 10);
        assert_eq!(error_code(&(-2i32).to_ne_bytes()), 2);
        assert_eq!(error_code(&[]), 0);
    }
}
