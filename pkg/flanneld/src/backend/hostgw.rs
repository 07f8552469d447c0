//! `host-gw`: a route to each other node's subnet via its public address on the external
//! interface, which therefore must be on one link with every node.

use super::api::{Backend, Peer, Refusal, Skip};
use crate::entries::{Hop, Want};
use crate::family::IpFamily;
use crate::iface::External;
use crate::lease::{Annotated, Ipv6Annotated};
use std::fmt;
use std::net::IpAddr;

/// The public address of a family is not one of the external interface's, so the other nodes'
/// routes via it would lead nowhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotOnInterface {
    /// Where the address came from, and the address (`--public-ip 203.0.113.7`).
    pub public: String,
    pub iface: String,
    pub family: IpFamily,
    /// The interface's addresses of the family.
    pub own: Vec<IpAddr>,
}

impl fmt::Display for NotOnInterface {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "host-gw: the other nodes route to this node via its public address, which must \
             therefore be an address of the external interface: {} is not one of {}'s {} \
             addresses (",
            self.public,
            self.iface,
            self.family.name()
        )?;
        if self.own.is_empty() {
            f.write_str("it has none")?;
        }
        for (i, ip) in self.own.iter().enumerate() {
            write!(f, "{}{ip}", if i == 0 { "" } else { ", " })?;
        }
        f.write_str(")")
    }
}

impl std::error::Error for NotOnInterface {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostGw;

impl Backend for HostGw {
    fn name(&self) -> &'static str {
        "host-gw"
    }

    /// The other nodes route to this node via its public address on their link, so it must
    /// be an address of the external interface (flanneld asks for its first one).
    fn check(&self, ext: &External, families: &[IpFamily]) -> Result<(), Refusal> {
        for &family in families {
            let Some(public) = ext.public(family).filter(|ip| !ext.holds(*ip)) else {
                continue;
            };
            let mut own: Vec<IpAddr> = ext.addrs.iter().map(|a| a.ip()).collect();
            own.extend(ext.iface_ip(family).filter(|ip| !own.contains(ip)));
            own.retain(|ip| IpFamily::of(*ip) == family);
            return Err(Box::new(NotOnInterface {
                public: ext.source(family).describe(public),
                iface: ext.name.clone(),
                family,
                own,
            }));
        }
        Ok(())
    }

    /// IPv6's with an IPv6 public address: host-gw has no backend data.
    fn annotated(&self) -> Annotated {
        Annotated {
            ipv4_needs_data: false,
            ipv6: Ipv6Annotated::WithAddress,
        }
    }

    fn peer(&self, ext: &External, peer: &Peer<'_>, want: &mut Want) -> Vec<Skip> {
        for f in &peer.families {
            want.route(Hop {
                dst: f.subnet,
                gw: f.public,
                dev: ext.index,
                onlink: false,
            });
        }
        Vec::new()
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
        assert!(HostGw.check(&ext(), BOTH).is_ok());
        // A second address of eth0, though eth0's own address is its first (--iface eth0).
        let e = External {
            public_ip: "192.168.0.7".parse().ok(),
            public_ip_source: Source::Flag,
            ..ext()
        };
        assert!(HostGw.check(&e, BOTH).is_ok());
    }

    #[test]
    fn another_address_is_refused_naming_where_it_came_from_and_what_it_was_compared_with() {
        let e = External {
            public_ip: "203.0.113.7".parse().ok(),
            public_ip_source: Source::Flag,
            ..ext()
        };
        let why = HostGw.check(&e, &[IpFamily::V4]).unwrap_err().to_string();
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
        let why = HostGw.check(&e, &[IpFamily::V4]).unwrap_err().to_string();
        assert!(
            why.contains("annotation flannel.alpha.coreos.com/node-public-ip 203.0.113.7 is not"),
            "{why}"
        );
        let e = External {
            public_ipv6: "fd09::7".parse().ok(),
            public_ipv6_source: Source::Flag,
            ..ext()
        };
        assert!(HostGw.check(&e, &[IpFamily::V4]).is_ok());
        let why = HostGw.check(&e, BOTH).unwrap_err().to_string();
        assert!(
            why.ends_with("--public-ipv6 fd09::7 is not one of eth0's IPv6 addresses (fd00::1)"),
            "{why}"
        );
    }
}
