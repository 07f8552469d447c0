//! Cryptokey routing: which peer an address belongs to, by longest prefix.

use std::collections::HashMap;
use std::net::IpAddr;

use ipnetwork::IpNetwork;

/// Prefixes of one family, grouped by length, longest first: a lookup costs one hash probe
/// per distinct length (flannel's peers all hold subnets of one or two lengths).
#[derive(Debug)]
struct Table<T> {
    by_len: Vec<(u8, HashMap<u128, T>)>,
}

impl<T> Default for Table<T> {
    fn default() -> Self {
        Table { by_len: Vec::new() }
    }
}

fn mask(bits: u8, len: u8, addr: u128) -> u128 {
    if len == 0 {
        0
    } else {
        let shift = u32::from(bits - len);
        (addr >> shift) << shift
    }
}

impl<T> Table<T> {
    fn insert(&mut self, bits: u8, len: u8, addr: u128, value: T) -> Option<T> {
        let key = mask(bits, len, addr);
        let pos = match self.by_len.iter().position(|(l, _)| *l <= len) {
            Some(p) if self.by_len[p].0 == len => p,
            Some(p) => {
                self.by_len.insert(p, (len, HashMap::new()));
                p
            }
            None => {
                self.by_len.push((len, HashMap::new()));
                self.by_len.len() - 1
            }
        };
        self.by_len[pos].1.insert(key, value)
    }

    fn remove(&mut self, bits: u8, len: u8, addr: u128) -> Option<T> {
        let pos = self.by_len.iter().position(|(l, _)| *l == len)?;
        let old = self.by_len[pos].1.remove(&mask(bits, len, addr));
        if self.by_len[pos].1.is_empty() {
            self.by_len.remove(pos);
        }
        old
    }

    fn lookup(&self, bits: u8, addr: u128) -> Option<&T> {
        self.by_len
            .iter()
            .find_map(|(len, m)| m.get(&mask(bits, *len, addr)))
    }
}

/// The allowed-IPs table of a device: prefix to peer.
#[derive(Debug)]
pub struct AllowedIps<T> {
    v4: Table<T>,
    v6: Table<T>,
}

impl<T> Default for AllowedIps<T> {
    fn default() -> Self {
        AllowedIps {
            v4: Table::default(),
            v6: Table::default(),
        }
    }
}

/// The network's address with host bits cleared, as WireGuard stores an allowed IP.
pub fn canonical(net: IpNetwork) -> IpNetwork {
    match net {
        IpNetwork::V4(n) => {
            IpNetwork::V4(ipnetwork::Ipv4Network::new(n.network(), n.prefix()).unwrap_or(n))
        }
        IpNetwork::V6(n) => {
            IpNetwork::V6(ipnetwork::Ipv6Network::new(n.network(), n.prefix()).unwrap_or(n))
        }
    }
}

impl<T> AllowedIps<T> {
    /// Maps `net` to `value`, returning the value it displaced.
    pub fn insert(&mut self, net: IpNetwork, value: T) -> Option<T> {
        match net {
            IpNetwork::V4(n) => self
                .v4
                .insert(32, n.prefix(), u32::from(n.ip()) as u128, value),
            IpNetwork::V6(n) => self.v6.insert(128, n.prefix(), u128::from(n.ip()), value),
        }
    }

    pub fn remove(&mut self, net: IpNetwork) -> Option<T> {
        match net {
            IpNetwork::V4(n) => self.v4.remove(32, n.prefix(), u32::from(n.ip()) as u128),
            IpNetwork::V6(n) => self.v6.remove(128, n.prefix(), u128::from(n.ip())),
        }
    }

    /// The value of the longest prefix holding `addr`.
    pub fn lookup(&self, addr: IpAddr) -> Option<&T> {
        match addr {
            IpAddr::V4(a) => self.v4.lookup(32, u32::from(a) as u128),
            IpAddr::V6(a) => self.v6.lookup(128, u128::from(a)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNetwork {
        s.parse().unwrap()
    }

    #[test]
    fn longest_prefix_wins_per_family() {
        let mut t = AllowedIps::default();
        t.insert(net("10.5.0.0/16"), "wide");
        t.insert(net("10.5.1.0/24"), "node1");
        t.insert(net("0.0.0.0/0"), "default");
        t.insert(net("fd00:5:1::/64"), "node1v6");
        assert_eq!(t.lookup("10.5.1.9".parse().unwrap()), Some(&"node1"));
        assert_eq!(t.lookup("10.5.2.9".parse().unwrap()), Some(&"wide"));
        assert_eq!(t.lookup("192.0.2.1".parse().unwrap()), Some(&"default"));
        assert_eq!(t.lookup("fd00:5:1::9".parse().unwrap()), Some(&"node1v6"));
        assert_eq!(t.lookup("fd00:5:2::9".parse().unwrap()), None);
    }

    #[test]
    fn host_bits_are_ignored_and_removal_frees_the_prefix() {
        let mut t = AllowedIps::default();
        assert_eq!(t.insert(net("10.5.1.7/24"), 1), None);
        assert_eq!(t.insert(net("10.5.1.0/24"), 2), Some(1));
        assert_eq!(t.remove(net("10.5.1.200/24")), Some(2));
        assert_eq!(t.lookup("10.5.1.9".parse().unwrap()), None);
        assert_eq!(canonical(net("10.5.1.7/24")), net("10.5.1.0/24"));
        assert_eq!(canonical(net("fd00::7/64")), net("fd00::/64"));
    }

    #[test]
    fn host_routes_and_zero_length_prefixes() {
        let mut t = AllowedIps::default();
        t.insert(net("::/0"), 0);
        t.insert(net("fd00::1/128"), 1);
        assert_eq!(t.lookup("fd00::1".parse().unwrap()), Some(&1));
        assert_eq!(t.lookup("fd00::2".parse().unwrap()), Some(&0));
    }
}
