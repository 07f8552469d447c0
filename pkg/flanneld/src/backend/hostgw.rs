//! `host-gw`: a route to each other node's subnet via its public address on the external
//! interface, which therefore must be on one link with every node.

use super::api::{Backend, Here, Peer};
use crate::entries::{Hop, Want};
use crate::family::IpFamily;
use crate::iface::External;
use std::net::IpAddr;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostGw;

impl Backend for HostGw {
    fn name(&self) -> &'static str {
        "host-gw"
    }

    /// The other nodes route to this node via its public address on their link, so it must
    /// be an address of the external interface (flanneld asks for its first one).
    fn check(&self, ext: &External, families: &[IpFamily]) -> Result<(), String> {
        for &family in families {
            let Some(public) = ext.public(family).filter(|ip| !ext.holds(*ip)) else {
                continue;
            };
            let mut own: Vec<IpAddr> = ext.addrs.iter().map(|a| a.ip()).collect();
            own.extend(ext.iface_ip(family).filter(|ip| !own.contains(ip)));
            own.retain(|ip| IpFamily::of(*ip) == family);
            return Err(format!(
                "host-gw: the other nodes route to this node via its public address, which \
                 must therefore be an address of the external interface: {} is not one of \
                 {}'s {} addresses ({})",
                ext.source(family).describe(public),
                ext.name,
                family.name(),
                if own.is_empty() {
                    "it has none".to_string()
                } else {
                    own.iter()
                        .map(|ip| ip.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            ));
        }
        Ok(())
    }

    fn peer(&self, here: &Here<'_>, peer: &Peer<'_>, want: &mut Want) -> Result<(), String> {
        want.route(Hop {
            dst: peer.subnet,
            gw: peer.public,
            dev: here.ext.index,
            onlink: false,
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iface::Source;

    const BOTH: &[IpFamily] = &[IpFamily::V4, IpFamily::V6];

    /// eth0 at 192.168.0.1/24, 192.168.0.7/24 and fd00::1/64.
    fn ext() -> External {
        External {
            addrs: vec![
                "192.168.0.1/24".parse().unwrap(),
                "192.168.0.7/24".parse().unwrap(),
                "fd00::1/64".parse().unwrap(),
            ],
            ..External::example()
        }
    }

    #[test]
    fn any_address_of_the_interface_is_a_public_address_it_routes_to() {
        assert_eq!(HostGw.check(&ext(), BOTH), Ok(()));
        // A second address of eth0, though eth0's own address is its first (--iface eth0).
        let e = External {
            public_ip: "192.168.0.7".parse().ok(),
            public_ip_source: Source::Flag,
            ..ext()
        };
        assert_eq!(HostGw.check(&e, BOTH), Ok(()));
    }

    #[test]
    fn another_address_is_refused_naming_where_it_came_from_and_what_it_was_compared_with() {
        let e = External {
            public_ip: "203.0.113.7".parse().ok(),
            public_ip_source: Source::Flag,
            ..ext()
        };
        let why = HostGw.check(&e, &[IpFamily::V4]).unwrap_err();
        assert!(
            why.ends_with(
                "--public-ip 203.0.113.7 is not one of eth0's IPv4 addresses \
                 (192.168.0.1, 192.168.0.7)"
            ),
            "{why}"
        );
        let e = External {
            public_ip_source: Source::Annotation("flannel.alpha.coreos.com/node-public-ip".into()),
            ..e
        };
        let why = HostGw.check(&e, &[IpFamily::V4]).unwrap_err();
        assert!(
            why.contains("annotation flannel.alpha.coreos.com/node-public-ip 203.0.113.7 is not"),
            "{why}"
        );
        let e = External {
            public_ipv6: "fd09::7".parse().ok(),
            public_ipv6_source: Source::Flag,
            ..ext()
        };
        assert_eq!(HostGw.check(&e, &[IpFamily::V4]), Ok(()));
        let why = HostGw.check(&e, BOTH).unwrap_err();
        assert!(
            why.ends_with("--public-ipv6 fd09::7 is not one of eth0's IPv6 addresses (fd00::1)"),
            "{why}"
        );
    }
}
