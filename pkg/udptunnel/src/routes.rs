//! The other nodes' subnets and where each is reached: the longest prefix that holds a
//! destination wins, looked up by prefix length (a cluster's leases share one, so that is one
//! hash lookup a packet).

use ipnetwork::Ipv4Network;
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddrV4};

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Routes {
    /// Per prefix length, longest first: the subnets' network addresses and their endpoints.
    by_len: Vec<(u8, HashMap<u32, SocketAddrV4>)>,
}

fn mask(len: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0)
}

impl Routes {
    /// Sends `subnet` to `to` from now on.
    pub fn put(&mut self, subnet: Ipv4Network, to: SocketAddrV4) {
        let len = subnet.prefix();
        let net = u32::from(subnet.network());
        match self.by_len.iter_mut().find(|(l, _)| *l == len) {
            Some((_, m)) => {
                m.insert(net, to);
            }
            None => {
                self.by_len.push((len, HashMap::from([(net, to)])));
                self.by_len.sort_by_key(|(len, _)| std::cmp::Reverse(*len));
            }
        }
    }

    /// Forgets `subnet`; whether it was there.
    pub fn remove(&mut self, subnet: Ipv4Network) -> bool {
        let len = subnet.prefix();
        let Some(i) = self.by_len.iter().position(|(l, _)| *l == len) else {
            return false;
        };
        let gone = self.by_len[i]
            .1
            .remove(&u32::from(subnet.network()))
            .is_some();
        if self.by_len[i].1.is_empty() {
            self.by_len.remove(i);
        }
        gone
    }

    /// Where a packet to `dst` goes.
    pub fn lookup(&self, dst: Ipv4Addr) -> Option<SocketAddrV4> {
        let ip = u32::from(dst);
        self.by_len
            .iter()
            .find_map(|(len, m)| m.get(&(ip & mask(*len))).copied())
    }

    /// Every route, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (Ipv4Network, SocketAddrV4)> + '_ {
        self.by_len.iter().flat_map(|(len, m)| {
            m.iter().filter_map(move |(net, to)| {
                Some((Ipv4Network::new(Ipv4Addr::from(*net), *len).ok()?, *to))
            })
        })
    }

    pub fn len(&self) -> usize {
        self.by_len.iter().map(|(_, m)| m.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> Ipv4Network {
        s.parse().unwrap()
    }

    fn at(s: &str) -> SocketAddrV4 {
        s.parse().unwrap()
    }

    #[test]
    fn the_longest_prefix_holding_the_destination_wins() {
        let mut r = Routes::default();
        r.put(net("10.5.0.0/16"), at("192.168.0.1:8285"));
        r.put(net("10.5.2.0/24"), at("192.168.0.2:8285"));
        r.put(net("10.5.3.0/24"), at("192.168.0.3:8285"));
        assert_eq!(
            r.lookup("10.5.2.9".parse().unwrap()),
            Some(at("192.168.0.2:8285"))
        );
        assert_eq!(
            r.lookup("10.5.9.9".parse().unwrap()),
            Some(at("192.168.0.1:8285"))
        );
        assert_eq!(r.lookup("10.6.0.1".parse().unwrap()), None);
        assert_eq!(r.len(), 3);
        // Put again: moved, not added.
        r.put(net("10.5.2.0/24"), at("192.168.0.9:8285"));
        assert_eq!(
            r.lookup("10.5.2.1".parse().unwrap()),
            Some(at("192.168.0.9:8285"))
        );
        assert_eq!(r.len(), 3);
        assert!(r.remove(net("10.5.2.0/24")));
        assert!(!r.remove(net("10.5.2.0/24")));
        assert_eq!(
            r.lookup("10.5.2.1".parse().unwrap()),
            Some(at("192.168.0.1:8285"))
        );
        assert!(r.remove(net("10.5.0.0/16")) && r.remove(net("10.5.3.0/24")));
        assert!(r.is_empty());
        r.put(net("0.0.0.0/0"), at("192.168.0.1:1"));
        assert_eq!(
            r.lookup("8.8.8.8".parse().unwrap()),
            Some(at("192.168.0.1:1"))
        );
    }

    #[test]
    fn every_route_is_listed() {
        let mut r = Routes::default();
        r.put(net("10.5.2.0/24"), at("192.168.0.2:8285"));
        r.put(net("10.5.0.0/16"), at("192.168.0.1:8285"));
        let mut all: Vec<_> = r.iter().collect();
        all.sort();
        assert_eq!(
            all,
            vec![
                (net("10.5.0.0/16"), at("192.168.0.1:8285")),
                (net("10.5.2.0/24"), at("192.168.0.2:8285"))
            ]
        );
    }
}
