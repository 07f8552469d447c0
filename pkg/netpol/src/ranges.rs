//! Address and port arithmetic, pure: addresses of a family as disjoint ranges (a CIDR, its
//! `except` taken out, pods' addresses merged), and the boxes of what rules allow (addresses x
//! protocols x ports) cut into the disjoint elements an nftables interval set holds, one way
//! only, so that what is wanted and what the kernel holds compare element by element.

use std::collections::{BTreeMap, HashMap};
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

/// Inclusive ranges in any order, overlapping or not: what `Ranges::from_unsorted` takes.
pub type Bounds = Vec<(u128, u128)>;

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

    /// The union of `ranges`, given in any order, overlapping or not: sorted once, then merged
    /// (inserting them one by one would shift the vector at each).
    pub fn from_unsorted(mut ranges: Bounds) -> Ranges {
        ranges.retain(|(lo, hi)| lo <= hi);
        ranges.sort_unstable();
        let mut out: Vec<(u128, u128)> = Vec::with_capacity(ranges.len());
        for (lo, hi) in ranges {
            match out.last_mut() {
                Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
                _ => out.push((lo, hi)),
            }
        }
        Ranges(out)
    }

    pub fn union(&mut self, other: &Ranges) {
        let mut all = std::mem::take(&mut self.0);
        all.extend_from_slice(&other.0);
        *self = Ranges::from_unsorted(all);
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

/// A protocol segment and its port ranges.
type Column = ((u32, u32), Vec<(u32, u32)>);

/// The union of services as disjoint ones, one way only: protocol ranges cut where the
/// services' edges are, each piece's ports merged, adjacent pieces with the same ports merged
/// again.
pub fn normalise(services: &[Service]) -> Vec<Service> {
    let protos: Vec<(u32, u32)> = services
        .iter()
        .map(|s| (u32::from(s.proto.0), u32::from(s.proto.1)))
        .collect();
    let mut columns: Vec<Column> = Vec::new();
    for pseg in segments(&protos) {
        let mut ports: Vec<(u32, u32)> = services
            .iter()
            .filter(|s| u32::from(s.proto.0) <= pseg.0 && pseg.1 <= u32::from(s.proto.1))
            .map(|s| (u32::from(s.port.0), u32::from(s.port.1)))
            .collect();
        ports.sort_unstable();
        let mut merged: Vec<(u32, u32)> = Vec::new();
        for (lo, hi) in ports {
            match merged.last_mut() {
                Some(last) if lo <= last.1 + 1 => last.1 = last.1.max(hi),
                _ => merged.push((lo, hi)),
            }
        }
        match columns.last_mut() {
            Some((last, prev)) if last.1 + 1 == pseg.0 && *prev == merged => last.1 = pseg.1,
            _ => columns.push((pseg, merged)),
        }
    }
    columns
        .into_iter()
        .flat_map(|(p, ports)| {
            ports.into_iter().map(move |q| Service {
                proto: (p.0 as u8, p.1 as u8),
                port: (q.0 as u16, q.1 as u16),
            })
        })
        .collect()
}

/// The boxes' union as disjoint elements, one way only: boxes of the same services joined,
/// addresses cut where the boxes' edges are, each piece holding the union of the services of
/// the boxes over it (made disjoint by [`normalise`]), adjacent pieces with the same services
/// merged again. Addresses are the many, services the few: pods' addresses with the same ports
/// become one range.
pub fn disjoint(boxes: &[AllowBox]) -> Vec<Elem> {
    // Boxes with the same services are one box.
    let mut raw: Vec<(Vec<Service>, Bounds)> = Vec::new();
    for b in boxes.iter().filter(|b| !b.addrs.is_empty()) {
        let key = normalise(&b.services);
        if key.is_empty() {
            continue;
        }
        match raw.iter_mut().find(|(k, _)| *k == key) {
            Some((_, r)) => r.extend(b.addrs.iter()),
            None => raw.push((key, b.addrs.iter().collect())),
        }
    }
    let groups: Vec<(Vec<Service>, Ranges)> = raw
        .into_iter()
        .map(|(k, r)| (k, Ranges::from_unsorted(r)))
        .collect();
    // A sweep over the addresses: where a group's ranges start and end.
    let mut edges: Vec<(u128, bool, usize)> = Vec::new();
    for (g, (_, ranges)) in groups.iter().enumerate() {
        for (lo, hi) in ranges.iter() {
            edges.push((lo, true, g));
            if let Some(after) = hi.checked_add(1) {
                edges.push((after, false, g));
            }
        }
    }
    edges.sort_unstable();
    let mut active = vec![false; groups.len()];
    // Each set of groups over a piece, and each distinct union of services, computed once:
    // pieces name their union by its index, so equal unions merge as before.
    let mut memo: HashMap<Vec<bool>, usize> = HashMap::new();
    let mut unions: Vec<Vec<Service>> = Vec::new();
    let mut pieces: Vec<((u128, u128), usize)> = Vec::new();
    let mut i = 0;
    while i < edges.len() {
        let at = edges[i].0;
        while i < edges.len() && edges[i].0 == at {
            active[edges[i].2] = edges[i].1;
            i += 1;
        }
        if !active.contains(&true) {
            continue;
        }
        let end = edges.get(i).map(|e| e.0 - 1).unwrap_or(u128::MAX);
        let services = match memo.get(&active) {
            Some(u) => *u,
            None => {
                let all: Vec<Service> = groups
                    .iter()
                    .zip(&active)
                    .filter(|(_, on)| **on)
                    .flat_map(|((s, _), _)| s.iter().copied())
                    .collect();
                let union = normalise(&all);
                let u = match unions.iter().position(|x| *x == union) {
                    Some(u) => u,
                    None => {
                        unions.push(union);
                        unions.len() - 1
                    }
                };
                memo.insert(active.clone(), u);
                u
            }
        };
        match pieces.last_mut() {
            Some((range, prev)) if range.1.checked_add(1) == Some(at) && *prev == services => {
                range.1 = end
            }
            _ => pieces.push(((at, end), services)),
        }
    }
    let mut out: Vec<Elem> = pieces
        .into_iter()
        .flat_map(|(addr, u)| {
            unions[u].iter().map(move |s| Elem {
                addr,
                proto: s.proto,
                port: s.port,
            })
        })
        .collect();
    out.sort_unstable();
    out
}

/// Disjoint elements grouped by what they allow: each set of services (as `normalise` makes
/// it) with the addresses allowed exactly it. Two lookups answer what one element lookup did:
/// the address in the group's addresses, and the protocol and port in its services.
pub fn by_services(elems: &[Elem]) -> Vec<(Vec<Service>, Ranges)> {
    let mut pieces: BTreeMap<(u128, u128), Vec<Service>> = BTreeMap::new();
    for e in elems {
        pieces.entry(e.addr).or_default().push(Service {
            proto: e.proto,
            port: e.port,
        });
    }
    let mut groups: BTreeMap<Vec<Service>, Bounds> = BTreeMap::new();
    for (addr, services) in pieces {
        groups.entry(normalise(&services)).or_default().push(addr);
    }
    groups
        .into_iter()
        .map(|(k, r)| (k, Ranges::from_unsorted(r)))
        .collect()
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
    fn ranges_from_any_order_are_the_ones_inserted_one_by_one() {
        let raw = [
            (9, 12),
            (1, 1),
            (3, 4),
            (2, 2),
            (20, 30),
            (13, 13),
            (25, 40),
            (7, 6),
        ];
        let mut one_by_one = Ranges::new();
        for (lo, hi) in raw {
            one_by_one.insert(lo, hi);
        }
        assert_eq!(Ranges::from_unsorted(raw.to_vec()), one_by_one);
        assert_eq!(
            one_by_one.iter().collect::<Vec<_>>(),
            [(1, 4), (9, 13), (20, 40)]
        );
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
            e("10.0.0.1", "10.0.0.1", 6, (80, 81)),
            e("10.0.0.1", "10.0.0.1", 6, (85, 85)),
            e("10.0.0.2", "10.0.0.2", 6, (81, 90)),
            e("10.0.0.2", "10.0.0.2", 17, (53, 53)),
        ];
        want.sort();
        assert_eq!(got, want);
        assert_eq!(
            disjoint(&[c, b, a]),
            want,
            "the order of the boxes does not matter"
        );
        // Pods' addresses with the same ports become one range.
        let pods: Vec<AllowBox> = (1..=4)
            .map(|i| AllowBox {
                addrs: ranges(&[(&format!("10.0.1.{i}"), &format!("10.0.1.{i}"))]),
                services: vec![Service::ports(6, 80, 80)],
            })
            .collect();
        assert_eq!(disjoint(&pods), [e("10.0.1.1", "10.0.1.4", 6, (80, 80))]);
    }

    /// Whether the elements hold (address, protocol, port).
    fn holds(elems: &[Elem], a: u128, proto: u8, port: u16) -> bool {
        elems.iter().any(|e| {
            e.addr.0 <= a
                && a <= e.addr.1
                && e.proto.0 <= proto
                && proto <= e.proto.1
                && e.port.0 <= port
                && port <= e.port.1
        })
    }

    #[test]
    fn the_elements_hold_exactly_the_union_of_the_boxes_and_never_overlap() {
        // Small worlds: addresses 0-15, a few protocols and ports, boxes from a fixed seed.
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let protos = [0u8, 1, 6, 17, 132, 255];
        let ports = [0u16, 1, 79, 80, 81, 82, 65535];
        for _ in 0..200 {
            let boxes: Vec<AllowBox> = (0..1 + next(4))
                .map(|_| {
                    let mut addrs = Ranges::new();
                    for _ in 0..1 + next(3) {
                        let lo = u128::from(next(16));
                        addrs.insert(lo, lo + u128::from(next(4)));
                    }
                    let services = (0..1 + next(3))
                        .map(|_| match next(3) {
                            0 => Service::ANY,
                            _ => {
                                let p = protos[next(6) as usize];
                                let lo = ports[next(7) as usize];
                                Service::ports(p, lo, lo.saturating_add(next(3) as u16))
                            }
                        })
                        .collect();
                    AllowBox { addrs, services }
                })
                .collect();
            let elems = disjoint(&boxes);
            for (i, x) in elems.iter().enumerate() {
                for y in &elems[i + 1..] {
                    let apart = x.addr.1 < y.addr.0
                        || y.addr.1 < x.addr.0
                        || x.proto.1 < y.proto.0
                        || y.proto.1 < x.proto.0
                        || x.port.1 < y.port.0
                        || y.port.1 < x.port.0;
                    assert!(apart, "{x:?} overlaps {y:?} from {boxes:?}");
                }
            }
            for a in 0..20u128 {
                for p in protos {
                    for q in ports {
                        let want = boxes.iter().any(|b| {
                            b.addrs.contains(a)
                                && b.services.iter().any(|s| {
                                    s.proto.0 <= p
                                        && p <= s.proto.1
                                        && s.port.0 <= q
                                        && q <= s.port.1
                                })
                        });
                        assert_eq!(holds(&elems, a, p, q), want, "{a} {p} {q} in {boxes:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn elements_group_by_their_services() {
        let e = |lo: &str, hi: &str, s: Service| Elem {
            addr: (v4(lo), v4(hi)),
            proto: s.proto,
            port: s.port,
        };
        let elems = [
            e("10.0.0.1", "10.0.0.1", Service::ports(6, 80, 80)),
            e("10.0.0.1", "10.0.0.1", Service::ports(17, 53, 53)),
            e("10.0.0.5", "10.0.0.9", Service::ANY),
            e("10.0.0.3", "10.0.0.3", Service::ports(6, 80, 80)),
            e("10.0.0.3", "10.0.0.3", Service::ports(17, 53, 53)),
        ];
        let groups = by_services(&elems);
        assert_eq!(
            groups,
            [
                (vec![Service::ANY], ranges(&[("10.0.0.5", "10.0.0.9")])),
                (
                    vec![Service::ports(6, 80, 80), Service::ports(17, 53, 53)],
                    ranges(&[("10.0.0.1", "10.0.0.1"), ("10.0.0.3", "10.0.0.3")])
                ),
            ]
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
