//! Elements of nftables sets and verdict maps written straight through nfnetlink: every change
//! in one batch, committed whole or not at all, as one `nft -f` would. `nft` reads every set's
//! elements of the table before it adds or deletes one (a sixth of a second for a table of
//! tens of thousands of elements, however small the change); this writes only the change.
//!
//! An interval set's range is the kernel's pair of elements: its first address, and the one
//! after its last flagged as the interval's end (none when the range reaches the family's
//! last address), as `nft` writes them.

use crate::error::{Error, Result};
use crate::nft_commits::{
    family_number, nfnetlink_socket, NFGENMSG_LEN, NFNL_SUBSYS_NFTABLES, NLMSG_HDRLEN,
};
use nix::errno::Errno;
use nix::sys::socket::{recv, send, setsockopt, sockopt, MsgFlags};
use nix::sys::time::TimeVal;
use std::net::IpAddr;
use std::os::fd::AsRawFd;

const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFT_MSG_NEWSET: u16 = 9;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_DELSETELEM: u16 = 14;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_CREATE: u16 = 0x400;
const NLA_F_NESTED: u16 = 0x8000;
const NFTA_SET_TABLE: u16 = 1;
const NFTA_SET_NAME: u16 = 2;
const NFTA_SET_FLAGS: u16 = 3;
const NFTA_SET_KEY_TYPE: u16 = 4;
const NFTA_SET_KEY_LEN: u16 = 5;
/// A set's id in its batch, which the kernel wants of every new set.
const NFTA_SET_ID: u16 = 10;
const NFT_SET_INTERVAL: u32 = 0x4;
/// nft's data types of a key, as `nft` names them: ipv4_addr, ipv6_addr.
const TYPE_IPADDR: u32 = 7;
const TYPE_IP6ADDR: u32 = 8;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_DATA: u16 = 2;
const NFTA_SET_ELEM_FLAGS: u16 = 3;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;
const NFT_JUMP: i32 = -3;
const NFT_SET_ELEM_INTERVAL_END: u32 = 1;
/// An attribute's length is 16 bits: a message's list of elements stays below this.
const ELEMENTS_MAX: usize = 60_000;

/// One element as a set or map holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Element {
    /// An interval set's range of addresses, first and last, of one family.
    Range(IpAddr, IpAddr),
    /// A verdict map's address and the chain it jumps to (the chain is not read on delete).
    Jump(IpAddr, String),
}

fn key_bytes(a: &IpAddr) -> Vec<u8> {
    match a {
        IpAddr::V4(v) => v.octets().to_vec(),
        IpAddr::V6(v) => v.octets().to_vec(),
    }
}

/// The address after `a`; None for the family's last.
fn next_address(a: &IpAddr) -> Option<IpAddr> {
    match a {
        IpAddr::V4(v) => u32::from(*v).checked_add(1).map(|n| IpAddr::V4(n.into())),
        IpAddr::V6(v) => u128::from(*v).checked_add(1).map(|n| IpAddr::V6(n.into())),
    }
}

fn push_attr(buf: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    buf.extend(((4 + payload.len()) as u16).to_ne_bytes());
    buf.extend(kind.to_ne_bytes());
    buf.extend(payload);
    buf.resize(buf.len().next_multiple_of(4), 0);
}

/// Opens a nested attribute; `end_nest` writes its length.
fn begin_nest(buf: &mut Vec<u8>, kind: u16) -> usize {
    let at = buf.len();
    buf.extend([0, 0]);
    buf.extend((kind | NLA_F_NESTED).to_ne_bytes());
    at
}

fn end_nest(buf: &mut [u8], at: usize) {
    let len = (buf.len() - at) as u16;
    buf[at..at + 2].copy_from_slice(&len.to_ne_bytes());
}

fn cstr(s: &str) -> Vec<u8> {
    let mut b = s.as_bytes().to_vec();
    b.push(0);
    b
}

/// The kernel's elements of one element: (key, flags, jump target).
fn kernel_elements(e: &Element) -> Vec<(Vec<u8>, u32, Option<&str>)> {
    match e {
        Element::Range(lo, hi) => {
            let mut v = vec![(key_bytes(lo), 0, None)];
            if let Some(end) = next_address(hi) {
                v.push((key_bytes(&end), NFT_SET_ELEM_INTERVAL_END, None));
            }
            v
        }
        Element::Jump(a, chain) => vec![(key_bytes(a), 0, Some(chain.as_str()))],
    }
}

fn encode_element(buf: &mut Vec<u8>, key: &[u8], flags: u32, jump: Option<&str>, add: bool) {
    let el = begin_nest(buf, NFTA_LIST_ELEM);
    let k = begin_nest(buf, NFTA_SET_ELEM_KEY);
    push_attr(buf, NFTA_DATA_VALUE, key);
    end_nest(buf, k);
    if flags != 0 {
        push_attr(buf, NFTA_SET_ELEM_FLAGS, &flags.to_be_bytes());
    }
    if let (Some(chain), true) = (jump, add) {
        let d = begin_nest(buf, NFTA_SET_ELEM_DATA);
        let v = begin_nest(buf, NFTA_DATA_VERDICT);
        push_attr(buf, NFTA_VERDICT_CODE, &NFT_JUMP.to_be_bytes());
        push_attr(buf, NFTA_VERDICT_CHAIN, &cstr(chain));
        end_nest(buf, v);
        end_nest(buf, d);
    }
    end_nest(buf, el);
}

/// Changes to the elements of one table's sets and maps, to be committed as one transaction.
pub struct Batch {
    family: u8,
    table: Vec<u8>,
    /// The messages between the batch's begin and end.
    buf: Vec<u8>,
    /// The set each message (by sequence number from 1) changes, for errors.
    sets: Vec<String>,
}

impl Batch {
    /// A batch for the table `table` of nftables family `family` (`inet`, `ip`, `ip6`).
    pub fn new(family: &str, table: &str) -> Result<Batch> {
        let family = family_number(family).ok_or_else(|| {
            Error::invalid(
                "writing",
                format!("table {family} {table}"),
                "no such family",
            )
        })?;
        Ok(Batch {
            family,
            table: cstr(table),
            buf: Vec::new(),
            sets: Vec::new(),
        })
    }

    pub fn is_empty(&self) -> bool {
        self.sets.is_empty()
    }

    /// Messages in the batch.
    pub fn messages(&self) -> usize {
        self.sets.len()
    }

    /// Makes the interval set of addresses `set` (IPv6 ones when `v6`), as `add set ... { type
    /// ipv4_addr; flags interval; }` does; its elements may follow in the same batch.
    pub fn add_interval_set(&mut self, set: &str, v6: bool) {
        self.sets.push(set.to_string());
        let start = header(
            &mut self.buf,
            NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_NEWSET,
            NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE,
            self.sets.len() as u32,
            self.family,
            0,
        );
        let (kind, len) = if v6 {
            (TYPE_IP6ADDR, 16u32)
        } else {
            (TYPE_IPADDR, 4)
        };
        push_attr(&mut self.buf, NFTA_SET_TABLE, &self.table);
        push_attr(&mut self.buf, NFTA_SET_NAME, &cstr(set));
        push_attr(
            &mut self.buf,
            NFTA_SET_FLAGS,
            &NFT_SET_INTERVAL.to_be_bytes(),
        );
        push_attr(&mut self.buf, NFTA_SET_KEY_TYPE, &kind.to_be_bytes());
        push_attr(&mut self.buf, NFTA_SET_KEY_LEN, &len.to_be_bytes());
        let id = self.sets.len() as u32;
        push_attr(&mut self.buf, NFTA_SET_ID, &id.to_be_bytes());
        end_message(&mut self.buf, start);
    }

    /// Adds `elements` to the set or map `set`.
    pub fn add(&mut self, set: &str, elements: &[Element]) {
        self.change(set, elements, true)
    }

    /// Deletes `elements` from the set or map `set`.
    pub fn delete(&mut self, set: &str, elements: &[Element]) {
        self.change(set, elements, false)
    }

    fn change(&mut self, set: &str, elements: &[Element], add: bool) {
        let mut open: Option<(usize, usize)> = None;
        for e in elements {
            for (key, flags, jump) in kernel_elements(e) {
                let (start, list) = match open {
                    Some((start, list)) if self.buf.len() - list < ELEMENTS_MAX => (start, list),
                    full => {
                        if let Some((start, list)) = full {
                            self.close(start, list);
                        }
                        self.open(set, add)
                    }
                };
                open = Some((start, list));
                encode_element(&mut self.buf, &key, flags, jump, add);
            }
        }
        if let Some((start, list)) = open {
            self.close(start, list);
        }
    }

    /// Starts a message for `set`: where it starts, and where its list of elements does.
    fn open(&mut self, set: &str, add: bool) -> (usize, usize) {
        self.sets.push(set.to_string());
        let (kind, flags) = if add {
            (NFT_MSG_NEWSETELEM, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE)
        } else {
            (NFT_MSG_DELSETELEM, NLM_F_REQUEST | NLM_F_ACK)
        };
        let start = header(
            &mut self.buf,
            NFNL_SUBSYS_NFTABLES << 8 | kind,
            flags,
            self.sets.len() as u32,
            self.family,
            0,
        );
        push_attr(&mut self.buf, NFTA_SET_ELEM_LIST_TABLE, &self.table);
        push_attr(&mut self.buf, NFTA_SET_ELEM_LIST_SET, &cstr(set));
        let list = begin_nest(&mut self.buf, NFTA_SET_ELEM_LIST_ELEMENTS);
        (start, list)
    }

    fn close(&mut self, start: usize, list: usize) {
        end_nest(&mut self.buf, list);
        end_message(&mut self.buf, start);
    }

    /// The whole batch as sent: begin, the messages, end.
    fn bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.buf.len() + 2 * (NLMSG_HDRLEN + NFGENMSG_LEN));
        let begin = header(
            &mut out,
            NFNL_MSG_BATCH_BEGIN,
            NLM_F_REQUEST,
            0,
            0,
            NFNL_SUBSYS_NFTABLES,
        );
        end_message(&mut out, begin);
        out.extend(&self.buf);
        let end_seq = self.sets.len() as u32 + 1;
        let end = header(
            &mut out,
            NFNL_MSG_BATCH_END,
            NLM_F_REQUEST,
            end_seq,
            0,
            NFNL_SUBSYS_NFTABLES,
        );
        end_message(&mut out, end);
        out
    }

    /// Commits the batch in this thread's network namespace; the id the kernel announces the
    /// commit with (this thread's).
    pub fn commit(&self) -> Result<u32> {
        let what = "nf_tables set elements";
        let fd = nfnetlink_socket(what)?;
        let bytes = self.bytes();
        // The batch goes in one message, or the kernel sees no end to it.
        setsockopt(&fd, sockopt::SndBufForce, &(bytes.len() + 4096))
            .map_err(|e| Error::os("sizing the send buffer for", what, e))?;
        let _ = setsockopt(&fd, sockopt::RcvBufForce, &(1 << 20));
        let _ = setsockopt(&fd, sockopt::ReceiveTimeout, &TimeVal::new(10, 0));
        let sent = send(fd.as_raw_fd(), &bytes, MsgFlags::empty())
            .map_err(|e| Error::os("sending", what, e))?;
        if sent != bytes.len() {
            return Err(Error::failed("sending", what, "the batch went in part"));
        }
        let mut acked = 0;
        let mut buf = vec![0u8; 1 << 16];
        while acked < self.sets.len() {
            let n = recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty())
                .map_err(|e| Error::os("reading the kernel's answer to", what, e))?;
            for (seq, errno) in acks(&buf[..n]) {
                if errno != 0 {
                    let set = self.sets.get(seq.wrapping_sub(1) as usize);
                    let object = format!(
                        "elements of table {} {}",
                        String::from_utf8_lossy(&self.table[..self.table.len() - 1]),
                        set.map(String::as_str).unwrap_or("?")
                    );
                    return Err(Error::os("writing", object, Errno::from_raw(errno)));
                }
                acked += 1;
            }
        }
        Ok(nix::unistd::gettid().as_raw() as u32)
    }
}

/// Writes a message header and its nfgenmsg; where the message starts (its length is 0 yet).
fn header(buf: &mut Vec<u8>, kind: u16, flags: u16, seq: u32, family: u8, res_id: u16) -> usize {
    let at = buf.len();
    buf.extend(0u32.to_ne_bytes());
    buf.extend(kind.to_ne_bytes());
    buf.extend(flags.to_ne_bytes());
    buf.extend(seq.to_ne_bytes());
    buf.extend(0u32.to_ne_bytes());
    buf.extend([family, 0]);
    buf.extend(res_id.to_be_bytes());
    at
}

/// Writes the length of the message that starts at `at` and ends the buffer.
fn end_message(buf: &mut [u8], at: usize) {
    let len = (buf.len() - at) as u32;
    buf[at..at + 4].copy_from_slice(&len.to_ne_bytes());
}

/// The acknowledgements in what the kernel answered: (sequence number, errno; 0 for success).
fn acks(mut msgs: &[u8]) -> Vec<(u32, i32)> {
    let mut out = Vec::new();
    while msgs.len() >= NLMSG_HDRLEN {
        let len = u32::from_ne_bytes([msgs[0], msgs[1], msgs[2], msgs[3]]) as usize;
        let len = len.clamp(NLMSG_HDRLEN, msgs.len());
        let kind = u16::from_ne_bytes([msgs[4], msgs[5]]);
        if kind == NLMSG_ERROR && len >= NLMSG_HDRLEN + 4 + NLMSG_HDRLEN {
            let b = &msgs[NLMSG_HDRLEN..];
            let error = i32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
            let seq = u32::from_ne_bytes([b[12], b[13], b[14], b[15]]);
            out.push((seq, -error));
        }
        msgs = &msgs[len.next_multiple_of(4).min(msgs.len())..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_range_is_its_start_and_the_end_after_it_but_none_past_the_last_address() {
        let els = |e: Element| -> Vec<(Vec<u8>, u32)> {
            kernel_elements(&e)
                .into_iter()
                .map(|(k, f, _)| (k, f))
                .collect()
        };
        assert_eq!(
            els(Element::Range(ip("10.0.0.5"), ip("10.0.0.9"))),
            [(vec![10, 0, 0, 5], 0), (vec![10, 0, 0, 10], 1)]
        );
        assert_eq!(
            els(Element::Range(ip("255.255.255.0"), ip("255.255.255.255"))),
            [(vec![255, 255, 255, 0], 0)]
        );
        let v6 = els(Element::Range(ip("fd00::1"), ip("fd00::1")));
        assert_eq!(v6[1].0[15], 2);
        assert_eq!(v6[1].1, NFT_SET_ELEM_INTERVAL_END);
    }

    #[test]
    fn a_batch_is_begin_messages_end_and_long_lists_are_split() {
        let mut b = Batch::new("inet", "t").unwrap();
        let many: Vec<Element> = (0..3000u32)
            .map(|i| {
                let a = IpAddr::V4((0x0a00_0000 + 4 * i).into());
                Element::Range(a, a)
            })
            .collect();
        b.add("s", &many);
        b.delete(
            "m",
            &[Element::Jump(ip("10.0.0.1"), "ingress-x".to_string())],
        );
        assert!(b.messages() > 2, "{} messages", b.messages());
        let bytes = b.bytes();
        // Walk the messages: lengths add up, kinds and sequence numbers in order.
        let mut at = 0;
        let mut kinds = Vec::new();
        while at < bytes.len() {
            let len = u32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
            assert!(len >= NLMSG_HDRLEN + NFGENMSG_LEN && len.is_multiple_of(4));
            let kind = u16::from_ne_bytes([bytes[at + 4], bytes[at + 5]]);
            let seq = u32::from_ne_bytes(bytes[at + 8..at + 12].try_into().unwrap());
            kinds.push((kind, seq));
            at += len;
        }
        assert_eq!(at, bytes.len());
        let n = b.messages() as u32;
        assert_eq!(kinds.first(), Some(&(NFNL_MSG_BATCH_BEGIN, 0)));
        assert_eq!(kinds.last(), Some(&(NFNL_MSG_BATCH_END, n + 1)));
        assert_eq!(
            kinds[n as usize],
            (NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_DELSETELEM, n)
        );
        assert!(kinds[1..n as usize]
            .iter()
            .enumerate()
            .all(|(i, k)| *k == (NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_NEWSETELEM, i as u32 + 1)));
    }

    #[test]
    fn acks_and_errors_are_read_by_sequence_number() {
        let msg = |seq: u32, error: i32| {
            let mut m = ((NLMSG_HDRLEN + 4 + NLMSG_HDRLEN) as u32)
                .to_ne_bytes()
                .to_vec();
            m.extend(NLMSG_ERROR.to_ne_bytes());
            m.extend([0u8; 10]);
            m.extend(error.to_ne_bytes());
            m.extend([0u8; 8]);
            m.extend(seq.to_ne_bytes());
            m.extend([0u8; 4]);
            m
        };
        let mut both = msg(1, 0);
        both.extend(msg(2, -17));
        assert_eq!(acks(&both), [(1, 0), (2, 17)]);
    }
}
