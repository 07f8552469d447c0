//! Coalescing before packets enter TUN (GRO): consecutive TCP segments of one flow joined
//! into one super-packet that the kernel takes in a single write, as its own GRO would have
//! joined them off a network card. Everything else is written as it came.
//!
//! The plan names packets and byte ranges; nothing is copied until the write, which gathers
//! the header and the payloads straight from the caller's buffers.

use std::ops::Range;

use crate::csum;
use crate::ip::{self, IpHdr};
use crate::vnet::{self, VnetHdr};

/// The most an IP packet can hold, and so a super-packet.
const MAX_TOTAL: usize = 65_535;
/// Segments per super-packet, well under what a write may gather.
const MAX_SEGMENTS: usize = 64;
/// Flows held open at once; the oldest is closed to make room.
const MAX_OPEN: usize = 16;

/// One write to TUN: a packet as it came, or segments joined under the first's headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    /// The packet whose headers lead.
    pub head: usize,
    /// Its network and transport headers' length (0 for a packet written whole).
    hdr_len: usize,
    /// (packet, byte range) of each part, in order: the payloads when joined, else the
    /// whole packet.
    pub parts: Vec<(usize, Range<usize>)>,
    mss: usize,
    payload: usize,
    /// The last segment asked to push: the super-packet keeps PSH.
    push: bool,
}

impl Write {
    /// Whether it joins more than one packet.
    pub fn is_joined(&self) -> bool {
        self.parts.len() > 1
    }
}

/// What makes segments of one flow joinable: addresses, ports, and every header field that
/// must match (IP's TOS/TTL or traffic class/hop limit, TCP's ack, window and options).
#[derive(Debug, Clone, PartialEq, Eq)]
struct FlowKey {
    v6: bool,
    /// The network header with its length, ID and checksum zeroed.
    ip: [u8; 40],
    /// The TCP header with its sequence number, flags and checksum zeroed.
    tcp: [u8; 60],
    tcp_len: usize,
}

struct Open {
    key: FlowKey,
    write: usize,
    next_seq: u32,
    next_id: u16,
    /// The last segment was short or pushed: nothing may follow it.
    closed: bool,
}

/// Plans the writes for a batch of packets; reused from batch to batch (the writes of the
/// last batch keep their room).
#[derive(Default)]
pub struct Coalescer {
    writes: Vec<Write>,
    used: usize,
    open: Vec<Open>,
}

/// What a segment brings to a flow, if it is one that may join.
struct Segment {
    key: FlowKey,
    hdr_len: usize,
    seq: u32,
    id: u16,
    push: bool,
    payload: Range<usize>,
}

fn segment(pkt: &[u8]) -> Option<Segment> {
    let h = IpHdr::parse(pkt)?;
    if h.proto != ip::PROTO_TCP || h.total != pkt.len() {
        return None;
    }
    if !h.v6 && (h.len != 20 || u16::from_be_bytes([pkt[6], pkt[7]]) & 0x3fff != 0) {
        return None; // options or a fragment
    }
    let t = pkt.get(h.len..)?;
    let tcp_len = ((*t.get(12)? >> 4) as usize) * 4;
    if tcp_len < 20 || t.len() <= tcp_len {
        return None; // no payload: an ACK alone is written as it is
    }
    let flags = t[13];
    if flags & !(ip::TCP_ACK | ip::TCP_PSH) != 0 || flags & ip::TCP_ACK == 0 {
        return None;
    }
    let mut key = FlowKey {
        v6: h.v6,
        ip: [0; 40],
        tcp: [0; 60],
        tcp_len,
    };
    key.ip[..h.len].copy_from_slice(&pkt[..h.len]);
    if h.v6 {
        key.ip[4..6].fill(0);
    } else {
        key.ip[2..6].fill(0);
        key.ip[10..12].fill(0);
    }
    key.tcp[..tcp_len].copy_from_slice(&t[..tcp_len]);
    key.tcp[4..8].fill(0);
    key.tcp[13] = 0;
    key.tcp[16..18].fill(0);
    Some(Segment {
        key,
        hdr_len: h.len + tcp_len,
        seq: u32::from_be_bytes([t[4], t[5], t[6], t[7]]),
        id: u16::from_be_bytes([pkt[4], pkt[5]]),
        push: flags & ip::TCP_PSH != 0,
        payload: h.len + tcp_len..pkt.len(),
    })
}

impl Coalescer {
    /// Plans the writes of `packets`, in an order that keeps each flow's own.
    pub fn plan<P: AsRef<[u8]>>(&mut self, packets: &[P]) -> &[Write] {
        self.used = 0;
        self.open.clear();
        for (i, pkt) in packets.iter().enumerate() {
            let pkt = pkt.as_ref();
            let Some(seg) = segment(pkt) else {
                self.whole(i, pkt.len());
                continue;
            };
            if let Some(pos) = self.open.iter().position(|o| o.key == seg.key) {
                if self.join(pos, i, &seg) {
                    continue;
                }
                self.open.remove(pos);
            }
            self.start(i, seg);
        }
        &self.writes[..self.used]
    }

    /// A new write, its room reused from an earlier batch when there is one.
    fn push(&mut self, head: usize, hdr_len: usize, part: Range<usize>, push: bool) {
        let n = part.len();
        if self.used == self.writes.len() {
            self.writes.push(Write {
                head,
                hdr_len,
                parts: Vec::new(),
                mss: n,
                payload: n,
                push,
            });
        }
        let w = &mut self.writes[self.used];
        w.parts.clear();
        w.parts.push((head, part));
        (w.head, w.hdr_len, w.mss, w.payload, w.push) = (head, hdr_len, n, n, push);
        self.used += 1;
    }

    fn whole(&mut self, i: usize, len: usize) {
        self.push(i, 0, 0..len, false);
    }

    fn start(&mut self, i: usize, seg: Segment) {
        if self.open.len() == MAX_OPEN {
            self.open.remove(0);
        }
        let n = seg.payload.len();
        self.push(i, seg.hdr_len, seg.payload.clone(), seg.push);
        self.open.push(Open {
            key: seg.key,
            write: self.used - 1,
            next_seq: seg.seq.wrapping_add(n as u32),
            next_id: seg.id.wrapping_add(1),
            closed: seg.push,
        });
    }

    /// Appends `seg` (packet `i`) to open flow `pos` if it continues it.
    fn join(&mut self, pos: usize, i: usize, seg: &Segment) -> bool {
        let o = &mut self.open[pos];
        let w = &mut self.writes[o.write];
        let n = seg.payload.len();
        let fits = !o.closed
            && seg.seq == o.next_seq
            && (o.key.v6 || seg.id == o.next_id || seg.id == o.next_id.wrapping_sub(1))
            && n <= w.mss
            && w.hdr_len + w.payload + n <= MAX_TOTAL
            && w.parts.len() < MAX_SEGMENTS;
        if !fits {
            return false;
        }
        w.parts.push((i, seg.payload.clone()));
        w.payload += n;
        w.push = seg.push;
        o.next_seq = o.next_seq.wrapping_add(n as u32);
        o.next_id = seg.id.wrapping_add(1);
        o.closed = seg.push || n < w.mss;
        true
    }

    /// Writes into `out` the virtio-net header and, for a joined write, the super-packet's
    /// network and transport headers (from `head`'s, lengths and flags adjusted, the TCP
    /// checksum left partial for the kernel); returns their length. The payloads follow.
    pub fn header(w: &Write, head: &[u8], out: &mut [u8; HEADER_MAX]) -> usize {
        if !w.is_joined() {
            // A segment that joined nothing goes as it came: its own headers, then its payload.
            out[..vnet::HDR_LEN].copy_from_slice(&VnetHdr::default().encode());
            out[vnet::HDR_LEN..vnet::HDR_LEN + w.hdr_len].copy_from_slice(&head[..w.hdr_len]);
            return vnet::HDR_LEN + w.hdr_len;
        }
        let h = match IpHdr::parse(head) {
            Some(h) => h,
            None => return 0,
        };
        let hl = w.hdr_len;
        let total = hl + w.payload;
        let hdr = VnetHdr {
            flags: vnet::F_NEEDS_CSUM,
            gso_type: if h.v6 {
                vnet::GSO_TCPV6
            } else {
                vnet::GSO_TCPV4
            },
            hdr_len: hl as u16,
            gso_size: w.mss as u16,
            csum_start: h.len as u16,
            csum_offset: ip::TCP_CSUM_OFFSET as u16,
        };
        out[..vnet::HDR_LEN].copy_from_slice(&hdr.encode());
        let sp = &mut out[vnet::HDR_LEN..vnet::HDR_LEN + hl];
        sp.copy_from_slice(&head[..hl]);
        h.set_total(sp, total);
        let tcp = &mut sp[h.len..];
        if w.push {
            tcp[13] |= ip::TCP_PSH;
        }
        let pseudo = csum::fold(h.pseudo_sum(&head[..hl], ip::PROTO_TCP, total - h.len));
        tcp[16..18].copy_from_slice(&pseudo.to_be_bytes());
        vnet::HDR_LEN + hl
    }
}

/// Room for a virtio-net header and the largest IPv6 and TCP headers joined.
pub const HEADER_MAX: usize = vnet::HDR_LEN + 40 + 60;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gso::tests::{checksums_hold, tcp_packet};
    use crate::gso::Plan;

    fn data(n: usize, salt: u8) -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(7) ^ salt).collect()
    }

    /// The super-packet a write puts into TUN, then cut again as the kernel would.
    fn rebuilt(w: &Write, pkts: &[Vec<u8>]) -> Vec<Vec<u8>> {
        let mut head = [0u8; HEADER_MAX];
        let n = Coalescer::header(w, &pkts[w.head], &mut head);
        let mut bytes = head[vnet::HDR_LEN..n].to_vec();
        for (p, r) in &w.parts {
            bytes.extend_from_slice(&pkts[*p][r.clone()]);
        }
        let hdr = VnetHdr::decode(&head).unwrap();
        let plan = Plan::new(&hdr, &bytes).unwrap();
        (0..plan.count())
            .map(|i| {
                let mut out = vec![0u8; plan.segment_len(i)];
                plan.write(&bytes, i, &mut out);
                out
            })
            .collect()
    }

    #[test]
    fn a_flow_s_segments_join_and_cut_back_to_what_they_were() {
        for v6 in [false, true] {
            let mut pkts = Vec::new();
            let mut seq = 100u32;
            for i in 0..5 {
                let len = if i == 4 { 300 } else { 1000 };
                let flags = if i == 4 {
                    ip::TCP_ACK | ip::TCP_PSH
                } else {
                    ip::TCP_ACK
                };
                let mut p = tcp_packet(v6, seq, flags, &data(len, i as u8));
                if !v6 {
                    p[4..6].copy_from_slice(&(0x1234 + i as u16).to_be_bytes());
                    ip::set_v4_checksum(&mut p[..20]);
                }
                seq += len as u32;
                pkts.push(p);
            }
            let mut c = Coalescer::default();
            let writes = c.plan(&pkts).to_vec();
            assert_eq!(writes.len(), 1, "v6 {v6}: {writes:?}");
            let back = rebuilt(&writes[0], &pkts);
            assert_eq!(back, pkts, "v6 {v6}");
            assert!(back.iter().all(|p| checksums_hold(p)));
        }
    }

    #[test]
    fn what_may_not_join_is_written_as_it_came_in_flow_order() {
        let mut c = Coalescer::default();
        let a0 = tcp_packet(false, 0, ip::TCP_ACK, &data(1000, 1));
        // Out of sequence: starts a new write after the first.
        let a1 = tcp_packet(false, 5000, ip::TCP_ACK, &data(1000, 2));
        // A SYN, a bare ACK, a longer segment than the first: never joined.
        let syn = tcp_packet(false, 0, ip::TCP_SYN, &[]);
        let ack = tcp_packet(false, 0, ip::TCP_ACK, &[]);
        let a2 = tcp_packet(false, 6000, ip::TCP_ACK, &data(1200, 3));
        let pkts = vec![a0, a1, syn, ack, a2];
        let writes = c.plan(&pkts).to_vec();
        let heads: Vec<usize> = writes.iter().map(|w| w.head).collect();
        assert_eq!(heads, [0, 1, 2, 3, 4]);
        assert!(writes.iter().all(|w| !w.is_joined()));
        for w in &writes {
            assert_eq!(
                rebuilt(w, &pkts),
                [pkts[w.head].clone()],
                "written as it came"
            );
        }
        let mut head = [0u8; HEADER_MAX];
        assert_eq!(
            Coalescer::header(&writes[2], &pkts[2], &mut head),
            vnet::HDR_LEN
        );
        assert_eq!(writes[2].parts, [(2, 0..pkts[2].len())]);
    }

    #[test]
    fn after_a_short_or_pushed_segment_the_flow_starts_a_new_write() {
        let mut c = Coalescer::default();
        let p0 = tcp_packet(false, 0, ip::TCP_ACK, &data(1000, 1));
        let p1 = tcp_packet(false, 1000, ip::TCP_ACK, &data(500, 2));
        let p2 = tcp_packet(false, 1500, ip::TCP_ACK, &data(1000, 3));
        let p3 = tcp_packet(false, 2500, ip::TCP_ACK | ip::TCP_PSH, &data(1000, 4));
        let p4 = tcp_packet(false, 3500, ip::TCP_ACK, &data(1000, 5));
        let writes = c.plan(&[p0, p1, p2, p3, p4]).to_vec();
        let parts: Vec<usize> = writes.iter().map(|w| w.parts.len()).collect();
        assert_eq!(parts, [2, 2, 1]);
    }

    #[test]
    fn two_flows_interleaved_each_join_their_own() {
        let mut c = Coalescer::default();
        let mut pkts = Vec::new();
        for i in 0..6u32 {
            let mut p = tcp_packet(false, (i / 2) * 1000, ip::TCP_ACK, &data(1000, i as u8));
            if i % 2 == 1 {
                p[16..20].copy_from_slice(&[10, 0, 0, 3]);
                ip::set_v4_checksum(&mut p[..20]);
            }
            p[4..6].copy_from_slice(&(0x1234 + (i / 2) as u16).to_be_bytes());
            ip::set_v4_checksum(&mut p[..20]);
            pkts.push(p);
        }
        let writes = c.plan(&pkts).to_vec();
        assert_eq!(writes.len(), 2);
        for w in &writes {
            assert_eq!(w.parts.len(), 3);
        }
    }
}
