//! Just enough of IPv4, IPv6, TCP and UDP headers to cut and join packets.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::csum;

pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;
pub const V6_HDR_LEN: usize = 40;
pub const UDP_HDR_LEN: usize = 8;
/// TCP flags, in the header's 14th byte.
pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_PSH: u8 = 0x08;
pub const TCP_ACK: u8 = 0x10;
pub const TCP_URG: u8 = 0x20;
pub const TCP_ECE: u8 = 0x40;
pub const TCP_CWR: u8 = 0x80;
/// Where a TCP and a UDP header keep their checksum.
pub const TCP_CSUM_OFFSET: usize = 16;
pub const UDP_CSUM_OFFSET: usize = 6;

/// An IP packet's network header, read from its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpHdr {
    pub v6: bool,
    /// The network header's length (IPv6: the fixed header; extension headers are not read).
    pub len: usize,
    /// The transport protocol (IPv6: the fixed header's next header).
    pub proto: u8,
    /// The packet's length as its header states it.
    pub total: usize,
}

impl IpHdr {
    /// The header of `pkt`, if it is IPv4 or IPv6 and no longer than `pkt`.
    pub fn parse(pkt: &[u8]) -> Option<IpHdr> {
        match pkt.first()? >> 4 {
            4 => {
                let len = ((pkt[0] & 0x0f) as usize) * 4;
                if len < 20 || pkt.len() < len {
                    return None;
                }
                let total = u16::from_be_bytes([pkt[2], pkt[3]]) as usize;
                (total >= len && total <= pkt.len()).then_some(IpHdr {
                    v6: false,
                    len,
                    proto: pkt[9],
                    total,
                })
            }
            6 if pkt.len() >= V6_HDR_LEN => {
                let total = V6_HDR_LEN + u16::from_be_bytes([pkt[4], pkt[5]]) as usize;
                (total <= pkt.len()).then_some(IpHdr {
                    v6: true,
                    len: V6_HDR_LEN,
                    proto: pkt[6],
                    total,
                })
            }
            _ => None,
        }
    }

    /// The bytes of the source and destination addresses in `pkt`.
    pub fn addrs<'a>(&self, pkt: &'a [u8]) -> (&'a [u8], &'a [u8]) {
        if self.v6 {
            (&pkt[8..24], &pkt[24..40])
        } else {
            (&pkt[12..16], &pkt[16..20])
        }
    }

    /// The pseudo-header's partial sum for a transport segment of `len` bytes in `pkt`.
    pub fn pseudo_sum(&self, pkt: &[u8], proto: u8, len: usize) -> u64 {
        let (s, d) = self.addrs(pkt);
        csum::pseudo(s, d, proto, len)
    }

    /// Writes a packet length of `total` into the header at the start of `pkt`, and for IPv4
    /// its header checksum again.
    pub fn set_total(&self, pkt: &mut [u8], total: usize) {
        if self.v6 {
            pkt[4..6].copy_from_slice(&((total - V6_HDR_LEN) as u16).to_be_bytes());
        } else {
            pkt[2..4].copy_from_slice(&(total as u16).to_be_bytes());
            set_v4_checksum(&mut pkt[..self.len]);
        }
    }
}

/// Recomputes an IPv4 header's checksum in place.
pub fn set_v4_checksum(hdr: &mut [u8]) {
    hdr[10] = 0;
    hdr[11] = 0;
    let c = csum::checksum(hdr, 0);
    hdr[10..12].copy_from_slice(&c.to_be_bytes());
}

fn addr(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => Some(IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(bytes).ok()?))),
        16 => Some(IpAddr::V6(Ipv6Addr::from(
            <[u8; 16]>::try_from(bytes).ok()?,
        ))),
        _ => None,
    }
}

/// The source address of an IP packet.
pub fn src_addr(pkt: &[u8]) -> Option<IpAddr> {
    let h = IpHdr::parse(pkt)?;
    addr(h.addrs(pkt).0)
}

/// The destination address of an IP packet.
pub fn dst_addr(pkt: &[u8]) -> Option<IpAddr> {
    let h = IpHdr::parse(pkt)?;
    addr(h.addrs(pkt).1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_of_both_families_are_read_and_short_ones_refused() {
        let mut v4 = vec![0u8; 60];
        v4[0] = 0x45;
        v4[2..4].copy_from_slice(&60u16.to_be_bytes());
        v4[9] = PROTO_TCP;
        v4[12..16].copy_from_slice(&[10, 0, 0, 1]);
        v4[16..20].copy_from_slice(&[10, 0, 0, 2]);
        let h = IpHdr::parse(&v4).unwrap();
        assert_eq!((h.v6, h.len, h.proto, h.total), (false, 20, PROTO_TCP, 60));
        assert_eq!(dst_addr(&v4), Some("10.0.0.2".parse().unwrap()));
        assert_eq!(IpHdr::parse(&v4[..40]), None, "shorter than it says");
        let mut v6 = vec![0u8; 48];
        v6[0] = 0x60;
        v6[4..6].copy_from_slice(&8u16.to_be_bytes());
        v6[6] = PROTO_UDP;
        v6[23] = 1;
        let h = IpHdr::parse(&v6).unwrap();
        assert_eq!((h.v6, h.len, h.proto, h.total), (true, 40, PROTO_UDP, 48));
        assert_eq!(src_addr(&v6), Some("::1".parse().unwrap()));
        assert_eq!(IpHdr::parse(&[0x10; 40]), None);
        assert_eq!(IpHdr::parse(&[]), None);
    }
}
