//! Segmentation before a packet leaves the tunnel: a super-packet from TUN (TSO or USO) cut
//! into the packets the wire carries, each with its headers and checksums complete, as the
//! kernel's own GSO would cut it; a plain packet with a partial checksum completed.
//!
//! A `Plan` is made once per packet read; each segment is then written on its own
//! (`Plan::write`), so segments can be written in parallel, each into its own buffer.

use std::fmt;

use crate::csum;
use crate::ip::{self, IpHdr};
use crate::vnet::{self, VnetHdr};

/// Why a packet read from TUN cannot be cut; it is dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub &'static str);

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed packet from TUN: {}", self.0)
    }
}

impl std::error::Error for Malformed {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// One packet, its transport checksum completed when partial.
    Whole {
        csum: Option<(usize, usize)>,
    },
    Tcp,
    Udp,
}

/// How one packet read from TUN becomes the packets the wire carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    kind: Kind,
    ip: IpHdr,
    /// The transport header's length.
    l4_len: usize,
    /// Payload bytes per segment.
    mss: usize,
    /// Payload bytes in all.
    payload: usize,
    count: usize,
}

impl Plan {
    /// The plan for `pkt`, read with the virtio-net header `hdr`.
    pub fn new(hdr: &VnetHdr, pkt: &[u8]) -> Result<Plan, Malformed> {
        let ip = IpHdr::parse(pkt).ok_or(Malformed("not an IPv4 or IPv6 packet"))?;
        if ip.total != pkt.len() {
            return Err(Malformed("its length is not the one its IP header states"));
        }
        let csum = (hdr.flags & vnet::F_NEEDS_CSUM != 0)
            .then_some((hdr.csum_start as usize, hdr.csum_offset as usize));
        if let Some((start, offset)) = csum {
            if start + offset + 2 > pkt.len() {
                return Err(Malformed("its checksum lies beyond its end"));
            }
        }
        let kind = hdr.gso_kind();
        if kind == vnet::GSO_NONE || hdr.gso_size == 0 {
            return Ok(Plan {
                kind: Kind::Whole { csum },
                ip,
                l4_len: 0,
                mss: pkt.len(),
                payload: pkt.len(),
                count: 1,
            });
        }
        // The transport header starts where the checksum does: after any IPv6 extensions.
        let l4 = csum.map_or(ip.len, |(start, _)| start);
        let (kind, l4_len) = match kind {
            vnet::GSO_TCPV4 | vnet::GSO_TCPV6 => {
                if (kind == vnet::GSO_TCPV6) != ip.v6 {
                    return Err(Malformed("its TSO type is not its IP version"));
                }
                let doff = pkt
                    .get(l4 + 12)
                    .map(|b| ((b >> 4) as usize) * 4)
                    .ok_or(Malformed("its TCP header is cut short"))?;
                (Kind::Tcp, doff)
            }
            vnet::GSO_UDP_L4 => (Kind::Udp, ip::UDP_HDR_LEN),
            _ => return Err(Malformed("an unknown GSO type")),
        };
        if l4_len < 8 || l4 + l4_len > pkt.len() || (kind == Kind::Tcp && l4_len < 20) {
            return Err(Malformed("its transport header is cut short"));
        }
        let ip = IpHdr { len: l4, ..ip };
        let payload = pkt.len() - l4 - l4_len;
        let mss = hdr.gso_size as usize;
        Ok(Plan {
            kind,
            ip,
            l4_len,
            mss,
            payload,
            count: payload.div_ceil(mss).max(1),
        })
    }

    /// How many packets the wire carries for this one.
    pub fn count(&self) -> usize {
        self.count
    }

    /// The length of segment `i`.
    pub fn segment_len(&self, i: usize) -> usize {
        match self.kind {
            Kind::Whole { .. } => self.payload,
            _ => self.ip.len + self.l4_len + self.segment_payload(i).1,
        }
    }

    fn segment_payload(&self, i: usize) -> (usize, usize) {
        let start = i * self.mss;
        (start, self.mss.min(self.payload.saturating_sub(start)))
    }

    /// Writes segment `i` of `pkt` into `out` (at least `segment_len(i)` long), headers and
    /// checksums complete; returns its length.
    pub fn write(&self, pkt: &[u8], i: usize, out: &mut [u8]) -> usize {
        let hl = self.ip.len + self.l4_len;
        match self.kind {
            Kind::Whole { csum } => {
                let out = &mut out[..pkt.len()];
                out.copy_from_slice(pkt);
                if let Some((start, offset)) = csum {
                    // The field holds the pseudo-header's sum: summing over it completes it.
                    let c = csum::checksum(&out[start..], 0);
                    let c = if c == 0 && self.ip.proto == ip::PROTO_UDP {
                        0xffff
                    } else {
                        c
                    };
                    out[start + offset..start + offset + 2].copy_from_slice(&c.to_be_bytes());
                }
                pkt.len()
            }
            Kind::Tcp | Kind::Udp => {
                let (from, n) = self.segment_payload(i);
                let len = hl + n;
                let out = &mut out[..len];
                out[..hl].copy_from_slice(&pkt[..hl]);
                out[hl..].copy_from_slice(&pkt[hl + from..hl + from + n]);
                self.fix_ip(out, i, len);
                let l4 = self.ip.len;
                let csum_at = if self.kind == Kind::Tcp {
                    self.fix_tcp(&mut out[l4..], i, from);
                    l4 + ip::TCP_CSUM_OFFSET
                } else {
                    out[l4 + 4..l4 + 6].copy_from_slice(&((len - l4) as u16).to_be_bytes());
                    l4 + ip::UDP_CSUM_OFFSET
                };
                out[csum_at] = 0;
                out[csum_at + 1] = 0;
                let proto = if self.kind == Kind::Tcp {
                    ip::PROTO_TCP
                } else {
                    ip::PROTO_UDP
                };
                let pseudo = self.ip.pseudo_sum(out, proto, len - l4);
                let mut c = csum::checksum(&out[l4..], pseudo);
                if c == 0 && proto == ip::PROTO_UDP {
                    c = 0xffff;
                }
                out[csum_at..csum_at + 2].copy_from_slice(&c.to_be_bytes());
                len
            }
        }
    }

    fn fix_ip(&self, out: &mut [u8], i: usize, len: usize) {
        if !self.ip.v6 {
            // Each segment's ID one more than the last, as the kernel's TSO numbers them.
            let id = u16::from_be_bytes([out[4], out[5]]).wrapping_add(i as u16);
            out[4..6].copy_from_slice(&id.to_be_bytes());
        }
        self.ip.set_total(out, len);
    }

    fn fix_tcp(&self, tcp: &mut [u8], i: usize, from: usize) {
        let seq = u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]).wrapping_add(from as u32);
        tcp[4..8].copy_from_slice(&seq.to_be_bytes());
        if i + 1 != self.count {
            tcp[13] &= !(ip::TCP_FIN | ip::TCP_PSH);
        }
        if i != 0 {
            tcp[13] &= !ip::TCP_CWR;
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A TCP packet from 10.0.0.1:1000 to 10.0.0.2:2000 (or fd00::1 to fd00::2) with
    /// `payload`, sequence `seq`, `flags`, and the timestamp option.
    pub fn tcp_packet(v6: bool, seq: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
        let ip_len = if v6 { 40 } else { 20 };
        let tcp_len = 32;
        let total = ip_len + tcp_len + payload.len();
        let mut p = vec![0u8; total];
        if v6 {
            p[0] = 0x60;
            p[4..6].copy_from_slice(&((total - 40) as u16).to_be_bytes());
            p[6] = ip::PROTO_TCP;
            p[7] = 64;
            p[8] = 0xfd;
            p[23] = 1;
            p[24] = 0xfd;
            p[39] = 2;
        } else {
            p[0] = 0x45;
            p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
            p[4..6].copy_from_slice(&0x1234u16.to_be_bytes());
            p[6] = 0x40;
            p[8] = 64;
            p[9] = ip::PROTO_TCP;
            p[12..16].copy_from_slice(&[10, 0, 0, 1]);
            p[16..20].copy_from_slice(&[10, 0, 0, 2]);
            ip::set_v4_checksum(&mut p[..20]);
        }
        let t = &mut p[ip_len..];
        t[0..2].copy_from_slice(&1000u16.to_be_bytes());
        t[2..4].copy_from_slice(&2000u16.to_be_bytes());
        t[4..8].copy_from_slice(&seq.to_be_bytes());
        t[8..12].copy_from_slice(&77u32.to_be_bytes());
        t[12] = 8 << 4;
        t[13] = flags;
        t[14..16].copy_from_slice(&500u16.to_be_bytes());
        t[20..32].copy_from_slice(&[1, 1, 8, 10, 0, 0, 0, 9, 0, 0, 0, 7]);
        t[32..].copy_from_slice(payload);
        let h = IpHdr::parse(&p).unwrap();
        let pseudo = h.pseudo_sum(&p, ip::PROTO_TCP, total - ip_len);
        let c = csum::checksum(&p[ip_len..], pseudo);
        p[ip_len + 16..ip_len + 18].copy_from_slice(&c.to_be_bytes());
        p
    }

    /// Whether `pkt`'s IPv4 header and transport checksums are right.
    pub fn checksums_hold(pkt: &[u8]) -> bool {
        let h = IpHdr::parse(pkt).unwrap();
        let ip_ok = h.v6 || csum::checksum(&pkt[..h.len], 0) == 0;
        let pseudo = h.pseudo_sum(pkt, h.proto, h.total - h.len);
        ip_ok && csum::checksum(&pkt[h.len..h.total], pseudo) == 0
    }

    fn payload(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 13 + i / 256) as u8).collect()
    }

    /// What TUN gives for a TSO super-packet: one header, the pseudo-header's sum in the
    /// TCP checksum, the virtio-net header saying how to cut it.
    fn super_packet(v6: bool, mss: u16, data: &[u8], flags: u8) -> (VnetHdr, Vec<u8>) {
        let mut p = tcp_packet(v6, 1_000_000, flags, data);
        let h = IpHdr::parse(&p).unwrap();
        let pseudo = h.pseudo_sum(&p, ip::PROTO_TCP, h.total - h.len);
        p[h.len + 16..h.len + 18].copy_from_slice(&csum::fold(pseudo).to_be_bytes());
        let hdr = VnetHdr {
            flags: vnet::F_NEEDS_CSUM,
            gso_type: if v6 { vnet::GSO_TCPV6 } else { vnet::GSO_TCPV4 },
            hdr_len: (h.len + 32) as u16,
            gso_size: mss,
            csum_start: h.len as u16,
            csum_offset: 16,
        };
        (hdr, p)
    }

    #[test]
    fn a_tso_super_packet_is_cut_as_the_kernel_cuts_it() {
        for v6 in [false, true] {
            let data = payload(5000);
            let flags = ip::TCP_ACK | ip::TCP_PSH | ip::TCP_FIN | ip::TCP_CWR;
            let (hdr, sp) = super_packet(v6, 1400, &data, flags);
            let plan = Plan::new(&hdr, &sp).unwrap();
            assert_eq!(plan.count(), 4);
            let mut joined = Vec::new();
            let mut buf = vec![0u8; 2000];
            for i in 0..plan.count() {
                let n = plan.write(&sp, i, &mut buf);
                assert_eq!(n, plan.segment_len(i));
                let seg = &buf[..n];
                assert!(checksums_hold(seg), "v6 {v6} segment {i}");
                let h = IpHdr::parse(seg).unwrap();
                assert_eq!(h.total, n);
                let t = &seg[h.len..];
                let seq = u32::from_be_bytes([t[4], t[5], t[6], t[7]]);
                assert_eq!(seq, 1_000_000 + 1400 * i as u32);
                let last = i == 3;
                assert_eq!(t[13] & ip::TCP_FIN != 0, last, "FIN on the last only");
                assert_eq!(t[13] & ip::TCP_PSH != 0, last, "PSH on the last only");
                assert_eq!(t[13] & ip::TCP_CWR != 0, i == 0, "CWR on the first only");
                if !v6 {
                    assert_eq!(u16::from_be_bytes([seg[4], seg[5]]), 0x1234 + i as u16);
                }
                joined.extend_from_slice(&t[32..]);
            }
            assert_eq!(plan.segment_len(3), if v6 { 40 } else { 20 } + 32 + 800);
            assert_eq!(joined, data);
        }
    }

    #[test]
    fn a_uso_super_packet_becomes_datagrams_of_their_own() {
        let data = payload(3000);
        let total = 20 + 8 + data.len();
        let mut p = vec![0u8; total];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        p[8] = 64;
        p[9] = ip::PROTO_UDP;
        p[12..16].copy_from_slice(&[10, 0, 0, 1]);
        p[16..20].copy_from_slice(&[10, 0, 0, 2]);
        p[20..22].copy_from_slice(&53u16.to_be_bytes());
        p[22..24].copy_from_slice(&5353u16.to_be_bytes());
        p[28..].copy_from_slice(&data);
        let hdr = VnetHdr {
            flags: vnet::F_NEEDS_CSUM,
            gso_type: vnet::GSO_UDP_L4,
            hdr_len: 28,
            gso_size: 1200,
            csum_start: 20,
            csum_offset: 6,
        };
        let plan = Plan::new(&hdr, &p).unwrap();
        assert_eq!(plan.count(), 3);
        let mut buf = vec![0u8; 1500];
        let mut joined = Vec::new();
        for i in 0..3 {
            let n = plan.write(&p, i, &mut buf);
            let seg = &buf[..n];
            assert!(checksums_hold(seg), "datagram {i}");
            assert_eq!(
                u16::from_be_bytes([seg[24], seg[25]]) as usize,
                n - 20,
                "the UDP length"
            );
            joined.extend_from_slice(&seg[28..]);
        }
        assert_eq!(joined, data);
    }

    #[test]
    fn a_plain_packet_has_its_partial_checksum_completed() {
        let mut p = tcp_packet(false, 5, ip::TCP_ACK, &payload(100));
        let pseudo = IpHdr::parse(&p)
            .unwrap()
            .pseudo_sum(&p, ip::PROTO_TCP, p.len() - 20);
        p[36..38].copy_from_slice(&csum::fold(pseudo).to_be_bytes());
        assert!(!checksums_hold(&p));
        let hdr = VnetHdr {
            flags: vnet::F_NEEDS_CSUM,
            csum_start: 20,
            csum_offset: 16,
            ..VnetHdr::default()
        };
        let plan = Plan::new(&hdr, &p).unwrap();
        assert_eq!(plan.count(), 1);
        let mut out = vec![0u8; p.len()];
        assert_eq!(plan.write(&p, 0, &mut out), p.len());
        assert!(checksums_hold(&out));
        // Without the flag the packet is taken as it is.
        let plan = Plan::new(&VnetHdr::default(), &p).unwrap();
        plan.write(&p, 0, &mut out);
        assert_eq!(out, p);
    }

    #[test]
    fn packets_that_lie_about_themselves_are_refused() {
        let p = tcp_packet(false, 5, ip::TCP_ACK, &payload(100));
        let (hdr6, _) = super_packet(true, 1000, &payload(10), ip::TCP_ACK);
        assert!(
            Plan::new(&hdr6, &p).is_err(),
            "TSO for IPv6 on an IPv4 packet"
        );
        let far = VnetHdr {
            flags: vnet::F_NEEDS_CSUM,
            csum_start: 150,
            csum_offset: 16,
            ..VnetHdr::default()
        };
        assert!(Plan::new(&far, &p).is_err());
        assert!(Plan::new(&VnetHdr::default(), &p[..p.len() - 1]).is_err());
        assert!(Plan::new(&VnetHdr::default(), &[0x99; 30]).is_err());
    }
}
