//! Address and port arithmetic, pure: addresses of a family as disjoint ranges (a CIDR, its
//! `except` taken out, pods' addresses merged), and the boxes of what rules allow (addresses x
//! protocols x ports) cut into the disjoint elements an nftables interval set holds, one way
//! only, so that what is wanted and what the kernel holds compare element by element.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub const BOTH: [Family; 2] = [Family::V4, Family::V6];

    pub fn of(ip: &IpAddr) -> Family {
        match ip {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    pub fn bits(self) -> u32 {
        match self {
            Family::V4 => 32,
            Family::V6 => 128,
        }
    }

    pub fn max(self) -> u128 {
        match self {
            Family::V4 => u128::from(u32::MAX),
            Family::V6 => u128::MAX,
        }
    }

    /// `4` or `6`, as set and map names end.
    pub fn digit(self) -> char {
        match self {
            Family::V4 => '4',
            Family::V6 => '6',
        }
    }

    /// The address of `v` in this family.
    pub fn addr(self, v: u128) -> IpAddr {
        match self {
            Family::V4 => IpAddr::V4(Ipv4Addr::from(v as u32)),
            Family::V6 => IpAddr::V6(Ipv6Addr::from(v)),
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
    }
}

pub fn addr_value(ip: &IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(u32::from(*a)),
        IpAddr::V6(a) => u128::from(*a),
    }
}

/// A CIDR's family and its first and last address. Host bits set below the prefix are
/// cleared, as the API server's parser does.
pub fn parse_cidr(text: &str) -> Result<(Family, u128, u128), String> {
    let (addr, len) = text
        .split_once('/')
        .ok_or_else(|| format!("{text:?} is not a CIDR (no /prefix)"))?;
    let ip: IpAddr = addr
        .parse()
        .map_err(|_| format!("{text:?} is not a CIDR: {addr:?} is not an address"))?;
    let family = Family::of(&ip);
    let len: u32 = len
        .parse()
        .ok()
        .filter(|l| *l <= family.bits())
        .ok_or_else(|| format!("{text:?} is not a CIDR: bad prefix length {len:?}"))?;
    let host_bits = family.bits() - len;
    let host = if host_bits == 128 {
        u128::MAX
    } else {
        (1u128 << host_bits) - 1
    };
    let lo = addr_value(&ip) & !host & family.max();
    Ok((family, lo, lo | host))
}

/// Addresses of one family: sorted, disjoint, non-adjacent inclusive ranges.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ranges(Vec<(u128, u128)>);

impl Ranges {
    pub fn new() -> Ranges {
        Ranges(Vec::new())
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (u128, u128)> + '_ {
        self.0.iter().copied()
    }

    pub fn contains(&self, v: u128) -> bool {
        let i = self.0.partition_point(|(_, hi)| *hi < v);
        self.0.get(i).is_some_and(|(lo, _)| *lo <= v)
    }

    /// Adds `lo..=hi`, merging what it touches.
    pub fn insert(&mut self, lo: u128, hi: u128) {
        if lo > hi {
            return;
        }
        // Ranges ending before lo - 1 stay before it; those starting after hi + 1 after it.
        let start = self.0.partition_point(|(_, h)| h.saturating_add(1) < lo);
        let end = self.0.partition_point(|(l, _)| *l <= hi.saturating_add(1));
        let (mut nlo, mut nhi) = (lo, hi);
        if start < end {
            nlo = nlo.min(self.0[start].0);
            nhi = nhi.max(self.0[end - 1].1);
        }
        self.0.splice(start..end, [(nlo, nhi)]);
    }

    pub fn union(&mut self, other: &Ranges) {
        for (lo, hi) in other.iter() {
            self.insert(lo, hi);
        }
    }

    /// Takes `lo..=hi` out.
    pub fn remove(&mut self, lo: u128, hi: u128) {
        let mut out = Vec::with_capacity(self.0.len() + 1);
        for &(a, b) in &self.0 {
            if b < lo || a > hi {
                out.push((a, b));
                continue;
            }
            if a < lo {
                out.push((a, lo - 1));
            }
            if b > hi {
                out.push((hi + 1, b));
            }
        }
        self.0 = out;
    }
}

/// Protocols and destination ports: inclusive ranges of each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Service {
    pub proto: (u8, u8),
    pub port: (u16, u16),
}

impl Service {
    /// Every protocol, every port: what a rule without ports allows.
    pub const ANY: Service = Service {
        proto: (0, 255),
        port: (0, 65535),
    };

    pub fn ports(proto: u8, lo: u16, hi: u16) -> Service {
        Service {
            proto: (proto, proto),
            port: (lo, hi),
        }
    }
}

/// One element of an allow set: a range of addresses, of protocols and of ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Elem {
    pub addr: (u128, u128),
    pub proto: (u8, u8),
    pub port: (u16, u16),
}

/// What a rule allows in one family: `services` toward (or from) `addrs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowBox {
    pub addrs: Ranges,
    pub services: Vec<Service>,
}

/// The elementary segments the intervals cut `u32` space into, those covered by at least one.
fn segments(intervals: &[(u32, u32)]) -> Vec<(u32, u32)> {
    let mut cuts: Vec<u32> = intervals
        .iter()
        .flat_map(|&(lo, hi)| [lo, hi + 1])
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    cuts.windows(2)
        .map(|w| (w[0], w[1] - 1))
        .filter(|&(lo, hi)| intervals.iter().any(|&(a, b)| a <= lo && hi <= b))
        .collect()
}

/// A port segment and the addresses allowed on it.
type Cell = ((u32, u32), Ranges);

/// The boxes' union as disjoint elements: protocol and port ranges cut where the boxes'
/// edges are, each piece holding the union of the addresses of the boxes over it, adjacent
/// pieces with the same addresses merged again. The same union always gives the same
/// elements.
pub fn disjoint(boxes: &[AllowBox]) -> Vec<Elem> {
    let flat: Vec<(&Service, &Ranges)> = boxes
        .iter()
        .filter(|b| !b.addrs.is_empty())
        .flat_map(|b| b.services.iter().map(move |s| (s, &b.addrs)))
        .collect();
    let protos: Vec<(u32, u32)> = flat
        .iter()
        .map(|(s, _)| (u32::from(s.proto.0), u32::from(s.proto.1)))
        .collect();
    // Per protocol segment: its port segments with their addresses.
    let mut columns: Vec<((u32, u32), Vec<Cell>)> = Vec::new();
    for pseg in segments(&protos) {
        let over: Vec<&(&Service, &Ranges)> = flat
            .iter()
            .filter(|(s, _)| u32::from(s.proto.0) <= pseg.0 && pseg.1 <= u32::from(s.proto.1))
            .collect();
        let ports: Vec<(u32, u32)> = over
            .iter()
            .map(|(s, _)| (u32::from(s.port.0), u32::from(s.port.1)))
            .collect();
        let mut cells: Vec<Cell> = Vec::new();
        for qseg in segments(&ports) {
            let mut addrs = Ranges::new();
            for (s, a) in &over {
                if u32::from(s.port.0) <= qseg.0 && qseg.1 <= u32::from(s.port.1) {
                    addrs.union(a);
                }
            }
            match cells.last_mut() {
                Some((last, prev)) if last.1 + 1 == qseg.0 && *prev == addrs => last.1 = qseg.1,
                _ => cells.push((qseg, addrs)),
            }
        }
        match columns.last_mut() {
            Some((last, prev)) if last.1 + 1 == pseg.0 && *prev == cells => last.1 = pseg.1,
            _ => columns.push((pseg, cells)),
        }
    }
    let mut out = Vec::new();
    for (pseg, cells) in columns {
        for (qseg, addrs) in cells {
            for addr in addrs.iter() {
                out.push(Elem {
                    addr,
                    proto: (pseg.0 as u8, pseg.1 as u8),
                    port: (qseg.0 as u16, qseg.1 as u16),
                });
            }
        }
    }
    out.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(s: &str) -> u128 {
        addr_value(&s.parse().unwrap())
    }

    fn ranges(list: &[(&str, &str)]) -> Ranges {
        let mut r = Ranges::new();
        for (a, b) in list {
            r.insert(v4(a), v4(b));
        }
        r
    }

    #[test]
    fn cidrs_are_their_first_and_last_address() {
        assert_eq!(
            parse_cidr("10.5.0.0/16").unwrap(),
            (Family::V4, v4("10.5.0.0"), v4("10.5.255.255"))
        );
        // Host bits are cleared, as the API server's parser clears them.
        assert_eq!(parse_cidr("10.5.1.7/24").unwrap().1, v4("10.5.1.0"));
        assert_eq!(parse_cidr("0.0.0.0/0").unwrap().2, u128::from(u32::MAX));
        assert_eq!(parse_cidr("::/0").unwrap(), (Family::V6, 0, u128::MAX));
        let (f, lo, hi) = parse_cidr("fd00::5/128").unwrap();
        assert_eq!(
            (f, lo, hi),
            (Family::V6, 0xfd00 << 112 | 5, 0xfd00 << 112 | 5)
        );
        for bad in ["10.5.0.0", "10.5.0.0/33", "banana/8", "10.5.0.0/x"] {
            assert!(parse_cidr(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ranges_merge_touching_ones_and_split_around_what_is_removed() {
        let mut r = ranges(&[("10.0.0.5", "10.0.0.5"), ("10.0.0.7", "10.0.0.9")]);
        r.insert(v4("10.0.0.6"), v4("10.0.0.6"));
        assert_eq!(r, ranges(&[("10.0.0.5", "10.0.0.9")]));
        r.insert(v4("10.0.0.20"), v4("10.0.0.30"));
        r.remove(v4("10.0.0.7"), v4("10.0.0.25"));
        assert_eq!(
            r,
            ranges(&[("10.0.0.5", "10.0.0.6"), ("10.0.0.26", "10.0.0.30")])
        );
        assert!(r.contains(v4("10.0.0.6")) && !r.contains(v4("10.0.0.7")));
        let mut all = Ranges::new();
        all.insert(0, Family::V4.max());
        all.remove(0, 0);
        all.remove(Family::V4.max(), Family::V4.max());
        assert_eq!(all.iter().collect::<Vec<_>>(), [(1, Family::V4.max() - 1)]);
    }

    #[test]
    fn overlapping_boxes_become_disjoint_elements_the_same_way_each_time() {
        let a = AllowBox {
            addrs: ranges(&[("10.0.0.1", "10.0.0.1")]),
            services: vec![Service::ports(6, 80, 81)],
        };
        let b = AllowBox {
            addrs: ranges(&[("10.0.0.2", "10.0.0.2")]),
            services: vec![Service::ports(6, 81, 90), Service::ports(17, 53, 53)],
        };
        let c = AllowBox {
            addrs: ranges(&[("10.0.0.1", "10.0.0.2")]),
            services: vec![Service::ports(6, 85, 85)],
        };
        let got = disjoint(&[a.clone(), b.clone(), c.clone()]);
        let e = |lo: &str, hi: &str, proto: u8, port: (u16, u16)| Elem {
            addr: (v4(lo), v4(hi)),
            proto: (proto, proto),
            port,
        };
        let mut want = vec![
            e("10.0.0.1", "10.0.0.1", 6, (80, 80)),
            e("10.0.0.1", "10.0.0.2", 6, (81, 81)),
            e("10.0.0.2", "10.0.0.2", 6, (82, 84)),
            e("10.0.0.1", "10.0.0.2", 6, (85, 85)),
            e("10.0.0.2", "10.0.0.2", 6, (86, 90)),
            e("10.0.0.2", "10.0.0.2", 17, (53, 53)),
        ];
        want.sort();
        assert_eq!(got, want);
        assert_eq!(
            disjoint(&[c, b, a]),
            want,
            "the order of the boxes does not matter"
        );
    }

    #[test]
    fn any_protocol_covers_the_ports_of_each() {
        let any = AllowBox {
            addrs: ranges(&[("10.0.0.1", "10.0.0.1")]),
            services: vec![Service::ANY],
        };
        let tcp = AllowBox {
            addrs: ranges(&[("10.0.0.2", "10.0.0.2")]),
            services: vec![Service::ports(6, 80, 80)],
        };
        let got = disjoint(&[any.clone(), tcp]);
        // Every piece is disjoint from every other.
        for (i, x) in got.iter().enumerate() {
            for y in &got[i + 1..] {
                let apart = x.addr.1 < y.addr.0
                    || y.addr.1 < x.addr.0
                    || x.proto.1 < y.proto.0
                    || y.proto.1 < x.proto.0
                    || x.port.1 < y.port.0
                    || y.port.1 < x.port.0;
                assert!(apart, "{x:?} overlaps {y:?}");
            }
        }
        let covers = |a: &str, proto: u8, port: u16| {
            got.iter().any(|e| {
                e.addr.0 <= v4(a)
                    && v4(a) <= e.addr.1
                    && e.proto.0 <= proto
                    && proto <= e.proto.1
                    && e.port.0 <= port
                    && port <= e.port.1
            })
        };
        assert!(covers("10.0.0.1", 1, 0) && covers("10.0.0.1", 6, 80) && covers("10.0.0.1", 17, 9));
        assert!(covers("10.0.0.2", 6, 80) && !covers("10.0.0.2", 6, 81));
        assert!(!covers("10.0.0.2", 17, 80) && !covers("10.0.0.3", 6, 80));
        assert_eq!(disjoint(std::slice::from_ref(&any)).len(), 1);
        assert!(disjoint(&[]).is_empty());
    }
}
