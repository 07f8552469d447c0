//! The external interface and this node's public addresses, chosen as flanneld chooses them:
//! `--iface` (names or addresses, in order), else `--iface-regex`, else `--iface-can-reach`,
//! else the interface of the default route. The choice is pure; `gather` reads the kernel.

use crate::family::IpFamily;
use ipnetwork::IpNetwork;
use regex::Regex;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why no external interface fits the flags: a bad start, naming the flag that found nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IfaceError {
    /// `--iface`: none of these names or addresses.
    NoSuchIface(Vec<String>),
    /// `--iface-regex`: no name or address matches.
    NoMatch(Vec<String>),
    /// `--iface-can-reach`: no route to it.
    Unreachable(IpAddr),
    NoDefaultRoute,
    /// The interface has no address of a family the network needs.
    NoAddress {
        iface: String,
        family: IpFamily,
    },
}

impl fmt::Display for IfaceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IfaceError::NoSuchIface(names) => write!(
                f,
                "--iface {}: no interface of that name or address",
                names.join(",")
            ),
            IfaceError::NoMatch(res) => write!(
                f,
                "--iface-regex {}: no interface name or address matches",
                res.join(",")
            ),
            IfaceError::Unreachable(dst) => {
                write!(f, "--iface-can-reach {dst}: no route reaches it")
            }
            IfaceError::NoDefaultRoute => f.write_str(
                "no default route to find the external interface by; name one with --iface",
            ),
            IfaceError::NoAddress { iface, family } => {
                let flag = match family {
                    IpFamily::V4 => "--public-ip",
                    IpFamily::V6 => "--public-ipv6",
                };
                write!(
                    f,
                    "interface {iface} has no {} address; give one with {flag}",
                    family.name()
                )
            }
        }
    }
}

impl std::error::Error for IfaceError {}

/// What the kernel says about one link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkFacts {
    pub index: u32,
    pub name: String,
    pub mtu: u32,
    pub addrs: Vec<IpNetwork>,
}

/// A route of the main table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub dst: IpNetwork,
    pub oif: Option<u32>,
}

/// The links and the main table, as the kernel told them before the daemon started.
#[derive(Debug, Clone, Default)]
pub struct Interfaces {
    pub links: Vec<LinkFacts>,
    pub routes: Vec<Route>,
}

#[derive(Debug, Clone, Default)]
pub struct Wanted {
    pub iface: Vec<String>,
    pub iface_regex: Vec<Regex>,
    pub iface_can_reach: Option<IpAddr>,
    pub public_ip: Option<Ipv4Addr>,
    pub public_ipv6: Option<Ipv6Addr>,
    pub ipv4: bool,
    pub ipv6: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct External {
    pub index: u32,
    pub name: String,
    pub mtu: u32,
    /// The interface's own addresses (what host-gw and vxlan bind to).
    pub iface_ip: Option<Ipv4Addr>,
    pub iface_ipv6: Option<Ipv6Addr>,
    /// What goes into the lease: `--public-ip` or the interface's address.
    pub public_ip: Option<Ipv4Addr>,
    pub public_ipv6: Option<Ipv6Addr>,
    /// The interface's addresses with their prefixes.
    pub addrs: Vec<IpNetwork>,
}

impl External {
    /// The interface's own address of one family.
    pub fn iface_ip(&self, family: IpFamily) -> Option<IpAddr> {
        match family {
            IpFamily::V4 => self.iface_ip.map(IpAddr::V4),
            IpFamily::V6 => self.iface_ipv6.map(IpAddr::V6),
        }
    }

    /// The address of one family that goes into the lease.
    pub fn public(&self, family: IpFamily) -> Option<IpAddr> {
        match family {
            IpFamily::V4 => self.public_ip.map(IpAddr::V4),
            IpFamily::V6 => self.public_ipv6.map(IpAddr::V6),
        }
    }
}

#[cfg(test)]
impl External {
    /// eth0 (index 2, MTU 1500) at 192.168.0.1/24 and fd00::1, its own public addresses: the
    /// node of the unit tests.
    pub fn example() -> External {
        External {
            index: 2,
            name: "eth0".into(),
            mtu: 1500,
            iface_ip: "192.168.0.1".parse().ok(),
            iface_ipv6: "fd00::1".parse().ok(),
            public_ip: "192.168.0.1".parse().ok(),
            public_ipv6: "fd00::1".parse().ok(),
            addrs: vec!["192.168.0.1/24".parse().unwrap()],
        }
    }
}

/// A link-local address (169.254/16, fe80::/10): never a node's public one, never stale.
pub fn is_link_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(ip) => ip.is_link_local(),
        IpAddr::V6(ip) => (ip.segments()[0] & 0xffc0) == 0xfe80,
    }
}

fn usable(a: &IpNetwork) -> bool {
    !a.ip().is_loopback() && !is_link_local(a.ip())
}

fn first_v4(l: &LinkFacts) -> Option<Ipv4Addr> {
    l.addrs
        .iter()
        .filter(|a| usable(a))
        .find_map(|a| match a.ip() {
            IpAddr::V4(ip) => Some(ip),
            _ => None,
        })
}

fn first_v6(l: &LinkFacts) -> Option<Ipv6Addr> {
    l.addrs
        .iter()
        .filter(|a| usable(a))
        .find_map(|a| match a.ip() {
            IpAddr::V6(ip) => Some(ip),
            _ => None,
        })
}

/// The route a packet to `dst` takes: the longest matching prefix.
fn route_to(routes: &[Route], dst: IpAddr) -> Option<&Route> {
    routes
        .iter()
        .filter(|r| r.dst.contains(dst) && r.dst.is_ipv4() == dst.is_ipv4())
        .max_by_key(|r| r.dst.prefix())
}

/// Picks the external interface; the error says which flag found nothing.
pub fn choose(
    links: &[LinkFacts],
    routes: &[Route],
    want: &Wanted,
) -> Result<External, IfaceError> {
    let by_index = |i: u32| links.iter().find(|l| l.index == i);
    let link = if !want.iface.is_empty() {
        want.iface
            .iter()
            .find_map(|w| match w.parse::<IpAddr>() {
                Ok(ip) => links.iter().find(|l| l.addrs.iter().any(|a| a.ip() == ip)),
                Err(_) => links.iter().find(|l| &l.name == w),
            })
            .ok_or_else(|| IfaceError::NoSuchIface(want.iface.clone()))?
    } else if !want.iface_regex.is_empty() {
        want.iface_regex
            .iter()
            .find_map(|re| {
                links
                    .iter()
                    .find(|l| {
                        l.addrs
                            .iter()
                            .any(|a| usable(a) && re.is_match(&a.ip().to_string()))
                    })
                    .or_else(|| links.iter().find(|l| re.is_match(&l.name)))
            })
            .ok_or_else(|| {
                IfaceError::NoMatch(
                    want.iface_regex
                        .iter()
                        .map(|re| re.as_str().to_string())
                        .collect(),
                )
            })?
    } else if let Some(dst) = want.iface_can_reach {
        route_to(routes, dst)
            .and_then(|r| r.oif)
            .and_then(by_index)
            .ok_or(IfaceError::Unreachable(dst))?
    } else {
        let default: IpAddr = if want.ipv4 {
            Ipv4Addr::UNSPECIFIED.into()
        } else {
            Ipv6Addr::UNSPECIFIED.into()
        };
        routes
            .iter()
            .filter(|r| r.dst.prefix() == 0 && r.dst.is_ipv4() == default.is_ipv4())
            .find_map(|r| r.oif.and_then(by_index))
            .ok_or(IfaceError::NoDefaultRoute)?
    };
    let iface_ip = first_v4(link);
    let iface_ipv6 = first_v6(link);
    let public_ip = want.public_ip.or(iface_ip);
    let public_ipv6 = want.public_ipv6.or(iface_ipv6);
    for (wanted, found, family) in [
        (want.ipv4, public_ip.is_some(), IpFamily::V4),
        (want.ipv6, public_ipv6.is_some(), IpFamily::V6),
    ] {
        if wanted && !found {
            return Err(IfaceError::NoAddress {
                iface: link.name.clone(),
                family,
            });
        }
    }
    Ok(External {
        index: link.index,
        name: link.name.clone(),
        mtu: link.mtu,
        iface_ip,
        iface_ipv6,
        public_ip: if want.ipv4 { public_ip } else { None },
        public_ipv6: if want.ipv6 { public_ipv6 } else { None },
        addrs: link.addrs.iter().filter(|a| usable(a)).copied().collect(),
    })
}

/// Reads the links, their addresses and the main table from the kernel (this thread's
/// namespace); called before the async runtime starts.
pub fn gather() -> Result<Interfaces, cni_kernel::Error> {
    let nl = cni_kernel::Netlink::open()?;
    let mut links = Vec::new();
    for l in nl.links()? {
        links.push(LinkFacts {
            index: l.index,
            addrs: nl.addresses(l.index)?,
            name: l.name,
            mtu: l.mtu.unwrap_or(1500),
        });
    }
    let routes = nl
        .routes()?
        .into_iter()
        .map(|r| Route {
            dst: r.dst,
            oif: r.oif,
        })
        .collect();
    Ok(Interfaces { links, routes })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn links() -> Vec<LinkFacts> {
        vec![
            LinkFacts {
                index: 1,
                name: "lo".into(),
                mtu: 65536,
                addrs: vec!["127.0.0.1/8".parse().unwrap()],
            },
            LinkFacts {
                index: 2,
                name: "eth0".into(),
                mtu: 1500,
                addrs: vec![
                    "192.168.0.9/24".parse().unwrap(),
                    "fd00::9/64".parse().unwrap(),
                ],
            },
            LinkFacts {
                index: 3,
                name: "eth1".into(),
                mtu: 9000,
                addrs: vec!["172.16.0.9/16".parse().unwrap()],
            },
        ]
    }

    fn routes() -> Vec<Route> {
        vec![
            Route {
                dst: "0.0.0.0/0".parse().unwrap(),
                oif: Some(2),
            },
            Route {
                dst: "192.168.0.0/24".parse().unwrap(),
                oif: Some(2),
            },
            Route {
                dst: "172.16.0.0/16".parse().unwrap(),
                oif: Some(3),
            },
        ]
    }

    fn want() -> Wanted {
        Wanted {
            ipv4: true,
            ..Wanted::default()
        }
    }

    #[test]
    fn the_default_route_names_the_interface() {
        let e = choose(&links(), &routes(), &want()).unwrap();
        assert_eq!((e.name.as_str(), e.mtu), ("eth0", 1500));
        assert_eq!(e.public_ip, Some(Ipv4Addr::new(192, 168, 0, 9)));
        assert_eq!(e.public_ipv6, None);
    }

    #[test]
    fn iface_by_name_or_address_in_order() {
        let w = Wanted {
            iface: vec!["nope".into(), "eth1".into()],
            ..want()
        };
        assert_eq!(choose(&links(), &routes(), &w).unwrap().name, "eth1");
        let w = Wanted {
            iface: vec!["172.16.0.9".into()],
            ..want()
        };
        assert_eq!(choose(&links(), &routes(), &w).unwrap().name, "eth1");
        let w = Wanted {
            iface: vec!["nope".into()],
            ..want()
        };
        assert!(choose(&links(), &routes(), &w)
            .unwrap_err()
            .to_string()
            .contains("--iface nope"));
    }

    #[test]
    fn iface_regex_and_can_reach() {
        let w = Wanted {
            iface_regex: vec![Regex::new("^eth1$").unwrap()],
            ..want()
        };
        assert_eq!(choose(&links(), &routes(), &w).unwrap().name, "eth1");
        let w = Wanted {
            iface_regex: vec![Regex::new(r"^172\.16\.").unwrap()],
            ..want()
        };
        assert_eq!(choose(&links(), &routes(), &w).unwrap().name, "eth1");
        let w = Wanted {
            iface_can_reach: Some("172.16.5.5".parse().unwrap()),
            ..want()
        };
        assert_eq!(choose(&links(), &routes(), &w).unwrap().name, "eth1");
        let w = Wanted {
            iface_can_reach: Some("8.8.8.8".parse().unwrap()),
            ..want()
        };
        assert_eq!(choose(&links(), &routes(), &w).unwrap().name, "eth0");
    }

    #[test]
    fn public_ip_overrides_the_interfaces_address() {
        let w = Wanted {
            public_ip: Some(Ipv4Addr::new(1, 2, 3, 4)),
            ..want()
        };
        let e = choose(&links(), &routes(), &w).unwrap();
        assert_eq!(e.public_ip, Some(Ipv4Addr::new(1, 2, 3, 4)));
        assert_eq!(e.iface_ip, Some(Ipv4Addr::new(192, 168, 0, 9)));
    }

    #[test]
    fn no_default_route_or_no_address_is_an_error_naming_the_fix() {
        let e = choose(&links(), &routes()[1..], &want()).unwrap_err();
        assert!(e.to_string().contains("--iface"), "{e}");
        let w = Wanted {
            iface: vec!["eth1".into()],
            ipv6: true,
            ..want()
        };
        assert!(choose(&links(), &routes(), &w)
            .unwrap_err()
            .to_string()
            .contains("--public-ipv6"));
    }
}
