//! The virtio-net header a TUN device opened with `IFF_VNET_HDR` puts before each packet it
//! gives, and expects before each packet it is given: whether the packet's checksum is left
//! to complete, and whether it is a super-packet to segment (GSO) and how.

/// Its size on the wire: the legacy header, which TUN uses unless told otherwise.
pub const HDR_LEN: usize = 10;

/// The transport checksum is partial: sum from `csum_start` and store at `+ csum_offset`.
pub const F_NEEDS_CSUM: u8 = 1;

pub const GSO_NONE: u8 = 0;
pub const GSO_TCPV4: u8 = 1;
pub const GSO_TCPV6: u8 = 4;
/// UDP segmentation (USO), each segment a datagram of its own.
pub const GSO_UDP_L4: u8 = 5;
/// Set with a TCP type when the flow uses ECN (its segments keep CWR on the first only).
pub const GSO_ECN: u8 = 0x80;

/// One packet's header, in host order (TUN's, unless TUNSETVNETLE/BE says otherwise).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VnetHdr {
    pub flags: u8,
    pub gso_type: u8,
    /// The length of the headers before the payload (a hint; checked, not trusted).
    pub hdr_len: u16,
    /// The payload of each segment: the MSS, or the datagram size for USO.
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
}

impl VnetHdr {
    /// The header at the start of `bytes`; None when they are shorter than one.
    pub fn decode(bytes: &[u8]) -> Option<VnetHdr> {
        let b = bytes.get(..HDR_LEN)?;
        let word = |i: usize| u16::from_ne_bytes([b[i], b[i + 1]]);
        Some(VnetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: word(2),
            gso_size: word(4),
            csum_start: word(6),
            csum_offset: word(8),
        })
    }

    pub fn encode(&self) -> [u8; HDR_LEN] {
        let mut b = [0u8; HDR_LEN];
        b[0] = self.flags;
        b[1] = self.gso_type;
        b[2..4].copy_from_slice(&self.hdr_len.to_ne_bytes());
        b[4..6].copy_from_slice(&self.gso_size.to_ne_bytes());
        b[6..8].copy_from_slice(&self.csum_start.to_ne_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_ne_bytes());
        b
    }

    /// The GSO type without the ECN bit.
    pub fn gso_kind(&self) -> u8 {
        self.gso_type & !GSO_ECN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_reads_back_as_written() {
        let h = VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: GSO_TCPV4 | GSO_ECN,
            hdr_len: 52,
            gso_size: 1380,
            csum_start: 20,
            csum_offset: 16,
        };
        assert_eq!(VnetHdr::decode(&h.encode()), Some(h));
        assert_eq!(h.gso_kind(), GSO_TCPV4);
        assert_eq!(VnetHdr::decode(&[0; 9]), None);
    }
}
