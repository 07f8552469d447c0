//! The external interface and this node's public addresses, chosen as flanneld chooses them.
//! Without `--iface`, `--iface-regex` and `--iface-can-reach`: the interface that holds the
//! public address (`--public-ip`, else `--public-ipv6`), else the one of the default route.
//! With them: each `--iface` (a name or an address) in order, then each `--iface-regex`, then
//! `--iface-can-reach`; the first that gives an interface with an address of every family the
//! network uses. The address an interface was found by is its address of that family. The
//! choice is pure; `gather` reads the kernel.

use crate::family::IpFamily;
use cni_kernel::netlink::AddressInfo;
use ipnetwork::IpNetwork;
use regex::Regex;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why no external interface fits the flags: a bad start, naming the flag that found nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IfaceError {
    /// `--iface`, `--iface-regex`, `--iface-can-reach`: each one tried (the flag and its
    /// value), and why it did not fit.
    NoneFits(Vec<(String, Unfit)>),
    /// Without those flags the interface is the one holding the public address, and none does.
    PublicNotHere {
        ip: IpAddr,
        source: Source,
    },
    NoDefaultRoute,
    /// The interface has no address of a family the network needs (`ipv6_off`: IPv6 is
    /// disabled on it, or the kernel has none).
    NoAddress {
        iface: String,
        family: IpFamily,
        ipv6_off: bool,
    },
}

impl fmt::Display for IfaceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IfaceError::NoneFits(tried) => {
                f.write_str("no external interface fits: ")?;
                for (i, (flag, why)) in tried.iter().enumerate() {
                    write!(f, "{}{flag}: {why}", if i == 0 { "" } else { "; " })?;
                }
                Ok(())
            }
            IfaceError::PublicNotHere { ip, source } => {
                let family = IpFamily::of(*ip);
                write!(
                    f,
                    "{} is not an address of this host, and without --iface, --iface-regex or \
                     --iface-can-reach the external interface is the one that holds it; name \
                     the interface with --iface",
                    source.describe(*ip)
                )?;
                match source {
                    Source::Annotation(_) => write!(
                        f,
                        ", or announce an address that is not this host's (NAT) with the {} \
                         annotation instead",
                        match family {
                            IpFamily::V4 => "public-ip-overwrite",
                            IpFamily::V6 => "public-ipv6-overwrite",
                        }
                    ),
                    _ => f.write_str(" to announce an address that is not this host's (NAT)"),
                }
            }
            IfaceError::NoDefaultRoute => f.write_str(
                "no default route to find the external interface by; name one with --iface",
            ),
            IfaceError::NoAddress {
                iface,
                family: IpFamily::V6,
                ipv6_off: true,
            } => write!(
                f,
                "interface {iface} has no IPv6 address: IPv6 is off on it \
                 (net.ipv6.conf.{iface}.disable_ipv6 is 1, or the kernel has no IPv6); turn it \
                 on, or take EnableIPv6 out of the network config"
            ),
            IfaceError::NoAddress { iface, family, .. } => write!(
                f,
                "interface {iface} has no {} address; give one with {}",
                family.name(),
                public_flag(*family)
            ),
        }
    }
}

impl std::error::Error for IfaceError {}

/// Why one `--iface`, `--iface-regex` or `--iface-can-reach` found no interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unfit {
    /// An address of a family the network does not use.
    OtherFamily(IpFamily),
    NoSuchAddress,
    NoSuchName,
    NoMatch,
    NoRoute,
    /// It found one, which has not what the network needs.
    Found(Box<IfaceError>),
}

impl fmt::Display for Unfit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unfit::OtherFamily(family) => write!(
                f,
                "an {} address, and the network has no {}",
                family.name(),
                family.name()
            ),
            Unfit::NoSuchAddress => f.write_str("no interface has this address"),
            Unfit::NoSuchName => f.write_str("no interface of this name"),
            Unfit::NoMatch => f.write_str("no interface name or address matches"),
            Unfit::NoRoute => f.write_str("no route reaches it"),
            Unfit::Found(e) => e.fmt(f),
        }
    }
}

fn public_flag(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "--public-ip",
        IpFamily::V6 => "--public-ipv6",
    }
}

/// Where a public address came from, so that a message names what the user wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The external interface's own address.
    Interface,
    /// `--public-ip` / `--public-ipv6`.
    Flag,
    /// The Node annotation that took the flag's place (`node-public-ip`, `node-public-ipv6`).
    Annotation(String),
}

impl Source {
    /// `ip` as coming from here: `--public-ip 10.0.0.9`, `annotation <name> 10.0.0.9`, or the
    /// bare address.
    pub fn describe(&self, ip: IpAddr) -> String {
        match self {
            Source::Interface => ip.to_string(),
            Source::Flag => format!("{} {ip}", public_flag(IpFamily::of(ip))),
            Source::Annotation(name) => format!("annotation {name} {ip}"),
        }
    }
}

/// What the kernel says about one link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkFacts {
    pub index: u32,
    pub name: String,
    pub mtu: u32,
    pub addrs: Vec<IpNetwork>,
    /// Addresses never taken as the interface's own: IPv6 privacy addresses (replaced under a
    /// running cluster), deprecated ones, and those whose duplicate address detection is not
    /// done or failed (flannel-io/flannel#2293, #2295).
    pub unfit: Vec<IpAddr>,
    /// Addresses with a lifetime (SLAAC, DHCP): taken after those added by hand, as flanneld
    /// orders them.
    pub dynamic: Vec<IpAddr>,
    /// IPv6 is disabled on it (`disable_ipv6`), or the kernel has no IPv6.
    pub ipv6_off: bool,
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
    /// The Node annotations that gave `public_ip` / `public_ipv6` in place of the flags.
    pub public_ip_annotation: Option<String>,
    pub public_ipv6_annotation: Option<String>,
    pub ipv4: bool,
    pub ipv6: bool,
}

impl Wanted {
    fn uses(&self, family: IpFamily) -> bool {
        match family {
            IpFamily::V4 => self.ipv4,
            IpFamily::V6 => self.ipv6,
        }
    }

    /// The public address of one family that was asked for, if the network uses that family.
    fn public(&self, family: IpFamily) -> Option<IpAddr> {
        let ip = match family {
            IpFamily::V4 => self.public_ip.map(IpAddr::V4),
            IpFamily::V6 => self.public_ipv6.map(IpAddr::V6),
        };
        ip.filter(|_| self.uses(family))
    }

    /// Who asked for the public address of one family.
    fn source(&self, family: IpFamily) -> Source {
        let annotation = match family {
            IpFamily::V4 => &self.public_ip_annotation,
            IpFamily::V6 => &self.public_ipv6_annotation,
        };
        match (self.public(family), annotation) {
            (None, _) => Source::Interface,
            (Some(_), Some(name)) => Source::Annotation(name.clone()),
            (Some(_), None) => Source::Flag,
        }
    }

    fn families(&self) -> Vec<IpFamily> {
        IpFamily::BOTH
            .into_iter()
            .filter(|&f| self.uses(f))
            .collect()
    }

    /// Takes `ip` as the public address of its family, as the annotation `annotation` gives it
    /// in place of the flag.
    pub fn set_public(&mut self, ip: IpAddr, annotation: String) {
        match ip {
            IpAddr::V4(a) => {
                self.public_ip = Some(a);
                self.public_ip_annotation = Some(annotation);
            }
            IpAddr::V6(a) => {
                self.public_ipv6 = Some(a);
                self.public_ipv6_annotation = Some(annotation);
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct External {
    pub index: u32,
    pub name: String,
    pub mtu: u32,
    /// The interface's own addresses (what host-gw and vxlan bind to): the address it was
    /// found by, else its first one.
    pub iface_ip: Option<Ipv4Addr>,
    pub iface_ipv6: Option<Ipv6Addr>,
    /// What goes into the lease: `--public-ip` (or the annotation in its place) or the
    /// interface's address.
    pub public_ip: Option<Ipv4Addr>,
    pub public_ipv6: Option<Ipv6Addr>,
    pub public_ip_source: Source,
    pub public_ipv6_source: Source,
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

    /// Where the public address of one family came from.
    pub fn source(&self, family: IpFamily) -> &Source {
        match family {
            IpFamily::V4 => &self.public_ip_source,
            IpFamily::V6 => &self.public_ipv6_source,
        }
    }

    /// Whether `ip` is an address of the interface.
    pub fn holds(&self, ip: IpAddr) -> bool {
        self.iface_ip(IpFamily::of(ip)) == Some(ip) || self.addrs.iter().any(|a| a.ip() == ip)
    }

    /// This interface as the link of its name is after it was made again (a VLAN or bond
    /// deleted and added, a driver reloaded): its new index and MTU and the addresses it holds
    /// now. Its own and public addresses stay, as the lease announces them; those of its own
    /// the new link does not hold are returned, for a warning.
    pub fn rebound(&self, index: u32, mtu: u32, addrs: &[IpNetwork]) -> (External, Vec<IpAddr>) {
        let ext = External {
            index,
            mtu,
            addrs: addrs.iter().filter(|a| usable(a)).copied().collect(),
            ..self.clone()
        };
        let lost = IpFamily::BOTH
            .into_iter()
            .filter_map(|f| self.iface_ip(f))
            .filter(|ip| !addrs.iter().any(|a| a.ip() == *ip))
            .collect();
        (ext, lost)
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
            public_ip_source: Source::Interface,
            public_ipv6_source: Source::Interface,
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

/// The link's usable addresses of one family, those added by hand first, else in the kernel's
/// order.
fn usable_of(l: &LinkFacts, family: IpFamily) -> impl Iterator<Item = IpAddr> + '_ {
    let mut found: Vec<IpAddr> = l
        .addrs
        .iter()
        .filter(|a| usable(a) && !l.unfit.contains(&a.ip()))
        .map(|a| a.ip())
        .filter(|ip| IpFamily::of(*ip) == family)
        .collect();
    found.sort_by_key(|ip| l.dynamic.contains(ip));
    found.into_iter()
}

/// The route a packet to `dst` takes: the longest matching prefix.
fn route_to(routes: &[Route], dst: IpAddr) -> Option<&Route> {
    routes
        .iter()
        .filter(|r| r.dst.contains(dst) && r.dst.is_ipv4() == dst.is_ipv4())
        .max_by_key(|r| r.dst.prefix())
}

/// An interface, and the addresses it was found by (by `--iface <address>`, a regex that
/// matched an address, or the public address).
struct Found<'a> {
    link: &'a LinkFacts,
    by: Vec<IpAddr>,
}

impl<'a> Found<'a> {
    fn link(link: &'a LinkFacts) -> Found<'a> {
        Found { link, by: vec![] }
    }

    fn by(&self, family: IpFamily) -> Option<IpAddr> {
        self.by
            .iter()
            .copied()
            .find(|ip| IpFamily::of(*ip) == family)
    }
}

/// The link that has the address `ip`.
fn holder(links: &[LinkFacts], ip: IpAddr) -> Option<Found<'_>> {
    links
        .iter()
        .find(|l| l.addrs.iter().any(|a| a.ip() == ip))
        .map(|link| Found { link, by: vec![ip] })
}

/// `--iface <name>` or `--iface <address>`; an address of a family the network does not use
/// finds nothing, as in flanneld.
fn by_iface<'a>(links: &'a [LinkFacts], w: &str, want: &Wanted) -> Result<Found<'a>, Unfit> {
    match w.parse::<IpAddr>() {
        Ok(ip) if !want.uses(IpFamily::of(ip)) => Err(Unfit::OtherFamily(IpFamily::of(ip))),
        Ok(ip) => holder(links, ip).ok_or(Unfit::NoSuchAddress),
        Err(_) => links
            .iter()
            .find(|l| l.name == w)
            .map(Found::link)
            .ok_or(Unfit::NoSuchName),
    }
}

/// `--iface-regex`: the first interface with a matching address of every family the network
/// uses, else the first whose name matches (flanneld's two passes), else the first with a
/// matching address of one family (where flanneld finds none in dual-stack).
fn by_regex<'a>(links: &'a [LinkFacts], re: &Regex, want: &Wanted) -> Result<Found<'a>, Unfit> {
    let families = want.families();
    let matching = |l: &'a LinkFacts| -> Vec<IpAddr> {
        families
            .iter()
            .filter_map(|&f| usable_of(l, f).find(|ip| re.is_match(&ip.to_string())))
            .collect()
    };
    let by_addresses = |every: bool| {
        links.iter().find_map(|link| {
            let by = matching(link);
            let fits = if every {
                by.len() == families.len()
            } else {
                !by.is_empty()
            };
            fits.then_some(Found { link, by })
        })
    };
    by_addresses(true)
        .or_else(|| links.iter().find(|l| re.is_match(&l.name)).map(Found::link))
        .or_else(|| by_addresses(false))
        .ok_or(Unfit::NoMatch)
}

/// `--iface-can-reach`: the interface of the route to `dst`; where `dst` is on a subnet of one
/// of its addresses, that address, as the kernel's source for it (flanneld takes the route's
/// source).
fn by_route<'a>(links: &'a [LinkFacts], routes: &[Route], dst: IpAddr) -> Result<Found<'a>, Unfit> {
    route_to(routes, dst)
        .and_then(|r| r.oif)
        .and_then(|i| links.iter().find(|l| l.index == i))
        .map(|link| Found {
            link,
            by: usable_of(link, IpFamily::of(dst))
                .find(|ip| link.addrs.iter().any(|a| a.ip() == *ip && a.contains(dst)))
                .into_iter()
                .collect(),
        })
        .ok_or(Unfit::NoRoute)
}

/// Without interface flags: the interface holding the public address (IPv4's first), else
/// the one of the default route (IPv4's, or IPv6's for an IPv6-only network).
fn by_public_or_default<'a>(
    links: &'a [LinkFacts],
    routes: &[Route],
    want: &Wanted,
) -> Result<Found<'a>, IfaceError> {
    let public = IpFamily::BOTH
        .into_iter()
        .find_map(|f| want.public(f).map(|ip| (ip, want.source(f))));
    if let Some((ip, source)) = public {
        return holder(links, ip).ok_or(IfaceError::PublicNotHere { ip, source });
    }
    let v4 = want.ipv4;
    routes
        .iter()
        .filter(|r| r.dst.prefix() == 0 && r.dst.is_ipv4() == v4)
        .find_map(|r| r.oif.and_then(|i| links.iter().find(|l| l.index == i)))
        .map(Found::link)
        .ok_or(IfaceError::NoDefaultRoute)
}

/// The interface's addresses and the public ones. Of each family: the address the interface
/// was found by; else, when it was found by an address, the public address if the interface
/// holds it (flanneld's dual-stack lookup); else its first usable one.
fn fit(found: &Found<'_>, want: &Wanted) -> Result<External, IfaceError> {
    let link = found.link;
    let own = |family| {
        found
            .by(family)
            .or_else(|| {
                want.public(family)
                    .filter(|ip| !found.by.is_empty() && link.addrs.iter().any(|a| a.ip() == *ip))
            })
            .or_else(|| usable_of(link, family).next())
    };
    let (iface_ip, iface_ipv6) = (own(IpFamily::V4), own(IpFamily::V6));
    let public = |family, own: Option<IpAddr>| {
        if !want.uses(family) {
            return Ok(None);
        }
        match want.public(family).or(own) {
            Some(ip) => Ok(Some(ip)),
            None => Err(IfaceError::NoAddress {
                iface: link.name.clone(),
                family,
                ipv6_off: link.ipv6_off,
            }),
        }
    };
    let (public_ip, public_ipv6) = (
        public(IpFamily::V4, iface_ip)?,
        public(IpFamily::V6, iface_ipv6)?,
    );
    let v4 = |ip: Option<IpAddr>| match ip {
        Some(IpAddr::V4(a)) => Some(a),
        _ => None,
    };
    let v6 = |ip: Option<IpAddr>| match ip {
        Some(IpAddr::V6(a)) => Some(a),
        _ => None,
    };
    Ok(External {
        index: link.index,
        name: link.name.clone(),
        mtu: link.mtu,
        iface_ip: v4(iface_ip),
        iface_ipv6: v6(iface_ipv6),
        public_ip: v4(public_ip),
        public_ipv6: v6(public_ipv6),
        public_ip_source: want.source(IpFamily::V4),
        public_ipv6_source: want.source(IpFamily::V6),
        addrs: link.addrs.iter().filter(|a| usable(a)).copied().collect(),
    })
}

/// Picks the external interface; the error says which flag found nothing and why.
pub fn choose(
    links: &[LinkFacts],
    routes: &[Route],
    want: &Wanted,
) -> Result<External, IfaceError> {
    if want.iface.is_empty() && want.iface_regex.is_empty() && want.iface_can_reach.is_none() {
        return fit(&by_public_or_default(links, routes, want)?, want);
    }
    let ifaces = want
        .iface
        .iter()
        .map(|w| (format!("--iface {w}"), by_iface(links, w, want)));
    let regexes = want.iface_regex.iter().map(|re| {
        (
            format!("--iface-regex {}", re.as_str()),
            by_regex(links, re, want),
        )
    });
    let reach = want.iface_can_reach.map(|dst| {
        (
            format!("--iface-can-reach {dst}"),
            by_route(links, routes, dst),
        )
    });
    let mut tried = Vec::new();
    for (flag, found) in ifaces.chain(regexes).chain(reach) {
        match found.and_then(|f| fit(&f, want).map_err(|e| Unfit::Found(Box::new(e)))) {
            Ok(ext) => return Ok(ext),
            Err(why) => tried.push((flag, why)),
        }
    }
    Err(IfaceError::NoneFits(tried))
}

/// Reads the links, their addresses and the main table from the kernel (this thread's
/// namespace); called before the async runtime starts.
pub fn gather() -> Result<Interfaces, cni_kernel::Error> {
    let nl = cni_kernel::Netlink::open()?;
    let mut links = Vec::new();
    for l in nl.links()? {
        let disable_ipv6 = format!("/proc/sys/net/ipv6/conf/{}/disable_ipv6", l.name);
        let infos = nl.address_infos(l.index)?;
        let ips = |keep: fn(&AddressInfo) -> bool| -> Vec<IpAddr> {
            infos
                .iter()
                .filter(|a| keep(a))
                .map(|a| a.address.ip())
                .collect()
        };
        links.push(LinkFacts {
            index: l.index,
            addrs: infos.iter().map(|a| a.address).collect(),
            unfit: ips(|a| a.temporary || a.deprecated || a.tentative || a.dad_failed),
            dynamic: ips(|a| !a.permanent),
            ipv6_off: std::fs::read_to_string(disable_ipv6).map_or(true, |v| v.trim() != "0"),
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

    fn net(a: &str) -> IpNetwork {
        a.parse().unwrap()
    }

    fn link(index: u32, name: &str, mtu: u32, addrs: &[&str]) -> LinkFacts {
        LinkFacts {
            index,
            name: name.into(),
            mtu,
            addrs: addrs.iter().map(|a| net(a)).collect(),
            unfit: Vec::new(),
            dynamic: Vec::new(),
            ipv6_off: false,
        }
    }

    /// eth0 has the default routes and two addresses of each family; eth1 two of each, on
    /// other prefixes; eth2 IPv6 only.
    fn links() -> Vec<LinkFacts> {
        vec![
            link(1, "lo", 65536, &["127.0.0.1/8", "::1/128"]),
            link(
                2,
                "eth0",
                1500,
                &[
                    "192.168.0.9/24",
                    "192.168.0.99/24",
                    "fe80::9/64",
                    "fd00::9/64",
                    "fd00::99/64",
                ],
            ),
            link(
                3,
                "eth1",
                9000,
                &[
                    "172.16.0.9/16",
                    "172.16.0.10/16",
                    "fd01::9/64",
                    "fd01::10/64",
                ],
            ),
            link(4, "eth2", 1400, &["fd02::9/64"]),
        ]
    }

    fn routes() -> Vec<Route> {
        let route = |dst: &str, oif| Route {
            dst: net(dst),
            oif: Some(oif),
        };
        vec![
            route("0.0.0.0/0", 2),
            route("::/0", 2),
            route("192.168.0.0/24", 2),
            route("172.16.0.0/16", 3),
            route("fd02::/64", 4),
        ]
    }

    fn v4() -> Wanted {
        Wanted {
            ipv4: true,
            ..Wanted::default()
        }
    }

    fn v6() -> Wanted {
        Wanted {
            ipv6: true,
            ..Wanted::default()
        }
    }

    fn dual() -> Wanted {
        Wanted {
            ipv4: true,
            ipv6: true,
            ..Wanted::default()
        }
    }

    fn ip(a: &str) -> IpAddr {
        a.parse().unwrap()
    }

    fn ok(w: &Wanted) -> External {
        choose(&links(), &routes(), w).unwrap()
    }

    fn err(w: &Wanted) -> String {
        choose(&links(), &routes(), w).unwrap_err().to_string()
    }

    /// The interface's name, its addresses and the public ones, of the families asked for.
    fn summary(e: &External) -> (String, Vec<String>, Vec<String>) {
        let some = |ips: [Option<IpAddr>; 2]| ips.iter().flatten().map(|a| a.to_string()).collect();
        (
            e.name.clone(),
            some([e.iface_ip.map(IpAddr::V4), e.iface_ipv6.map(IpAddr::V6)]),
            some([e.public(IpFamily::V4), e.public(IpFamily::V6)]),
        )
    }

    fn is(name: &str, iface: &[&str], public: &[&str]) -> (String, Vec<String>, Vec<String>) {
        let s = |v: &[&str]| v.iter().map(|a| a.to_string()).collect();
        (name.into(), s(iface), s(public))
    }

    #[test]
    fn iface_can_reach_takes_the_address_on_the_destinations_subnet() {
        let links = vec![link(2, "eth0", 1500, &["192.168.0.5/24", "10.1.0.5/16"])];
        let routes = vec![
            Route {
                dst: net("0.0.0.0/0"),
                oif: Some(2),
            },
            Route {
                dst: net("10.1.0.0/16"),
                oif: Some(2),
            },
        ];
        let reach = |dst: &str| {
            let w = Wanted {
                iface_can_reach: Some(ip(dst)),
                ..v4()
            };
            summary(&choose(&links, &routes, &w).unwrap())
        };
        assert_eq!(reach("10.1.0.1"), is("eth0", &["10.1.0.5"], &["10.1.0.5"]));
        // Through a gateway: the interface's first address.
        assert_eq!(
            reach("8.8.8.8"),
            is("eth0", &["192.168.0.5"], &["192.168.0.5"])
        );
    }

    #[test]
    fn the_default_route_names_the_interface_and_its_first_addresses() {
        let e = ok(&v4());
        assert_eq!((e.name.as_str(), e.mtu), ("eth0", 1500));
        // The link-local address is never the interface's address.
        assert_eq!(
            summary(&e),
            is("eth0", &["192.168.0.9", "fd00::9"], &["192.168.0.9"])
        );
        assert_eq!(e.public_ip_source, Source::Interface);
        assert_eq!(
            summary(&ok(&v6())),
            is("eth0", &["192.168.0.9", "fd00::9"], &["fd00::9"])
        );
        let e = choose(&links(), &routes()[2..], &v4()).unwrap_err();
        assert_eq!(e, IfaceError::NoDefaultRoute);
        assert!(e.to_string().contains("--iface"), "{e}");
    }

    #[test]
    fn public_ip_without_iface_picks_the_interface_that_holds_it_as_its_address() {
        // A second address of another link: that link, at that address.
        let w = Wanted {
            public_ip: "172.16.0.10".parse().ok(),
            ..v4()
        };
        let e = ok(&w);
        assert_eq!(
            summary(&e),
            is("eth1", &["172.16.0.10", "fd01::9"], &["172.16.0.10"])
        );
        assert_eq!((e.index, e.mtu), (3, 9000));
        assert_eq!(e.public_ip_source, Source::Flag);
        // A second address of the default route's link: that address, not the link's first.
        let w = Wanted {
            public_ip: "192.168.0.99".parse().ok(),
            ..v4()
        };
        assert_eq!(ok(&w).iface_ip, "192.168.0.99".parse().ok());
        // The node-public-ip annotation in the flag's place does the same.
        let w = Wanted {
            public_ip: "172.16.0.9".parse().ok(),
            public_ip_annotation: Some("flannel.alpha.coreos.com/node-public-ip".into()),
            ..v4()
        };
        let e = ok(&w);
        assert_eq!(
            summary(&e),
            is("eth1", &["172.16.0.9", "fd01::9"], &["172.16.0.9"])
        );
        assert_eq!(
            e.public_ip_source,
            Source::Annotation("flannel.alpha.coreos.com/node-public-ip".into())
        );
    }

    #[test]
    fn a_public_ip_of_no_interface_here_needs_iface() {
        let w = Wanted {
            public_ip: "203.0.113.7".parse().ok(),
            ..v4()
        };
        let e = choose(&links(), &routes(), &w).unwrap_err();
        assert_eq!(
            e,
            IfaceError::PublicNotHere {
                ip: ip("203.0.113.7"),
                source: Source::Flag
            }
        );
        let text = e.to_string();
        assert!(
            text.starts_with("--public-ip 203.0.113.7 is not an address of this host")
                && text.contains("name the interface with --iface"),
            "{text}"
        );
        let w = Wanted {
            public_ip_annotation: Some("example.com/node-public-ip".into()),
            ..w
        };
        let text = err(&w);
        assert!(
            text.starts_with("annotation example.com/node-public-ip 203.0.113.7 is not")
                && text.contains("public-ip-overwrite annotation"),
            "{text}"
        );
        // With --iface it is announced as it is (a node behind NAT), from eth0's address.
        let w = Wanted {
            iface: vec!["eth0".into()],
            ..w
        };
        assert_eq!(
            summary(&ok(&w)),
            is("eth0", &["192.168.0.9", "fd00::9"], &["203.0.113.7"])
        );
    }

    #[test]
    fn iface_by_address_is_the_interfaces_address() {
        let w = Wanted {
            iface: vec!["172.16.0.10".into()],
            ..v4()
        };
        assert_eq!(
            summary(&ok(&w)),
            is("eth1", &["172.16.0.10", "fd01::9"], &["172.16.0.10"])
        );
        // --public-ip beside it is announced; the interface's address stays the one named.
        let w = Wanted {
            public_ip: "172.16.0.9".parse().ok(),
            ..w
        };
        assert_eq!(
            summary(&ok(&w)),
            is("eth1", &["172.16.0.10", "fd01::9"], &["172.16.0.9"])
        );
        // By name, the interface's address is its first one, whatever --public-ip is.
        let w = Wanted {
            iface: vec!["eth1".into()],
            ..w
        };
        assert_eq!(
            summary(&ok(&w)),
            is("eth1", &["172.16.0.9", "fd01::9"], &["172.16.0.9"])
        );
    }

    #[test]
    fn iface_then_regex_then_can_reach_the_first_that_fits() {
        // eth2 has no IPv4 address: the next --iface is tried, as flanneld does.
        let w = Wanted {
            iface: vec!["nope".into(), "eth2".into(), "eth1".into()],
            ..v4()
        };
        assert_eq!(ok(&w).name, "eth1");
        // With --public-ip, eth2 fits: the address need not be the interface's.
        let w = Wanted {
            public_ip: "203.0.113.7".parse().ok(),
            ..w
        };
        assert_eq!(ok(&w).name, "eth2");
        let w = Wanted {
            iface: vec!["nope".into()],
            iface_regex: vec![Regex::new("^eth1$").unwrap()],
            ..v4()
        };
        assert_eq!(ok(&w).name, "eth1");
        let w = Wanted {
            iface: vec!["nope".into()],
            iface_regex: vec![Regex::new("^wlan").unwrap()],
            iface_can_reach: Some(ip("172.16.5.5")),
            ..v4()
        };
        assert_eq!(ok(&w).name, "eth1");
        let w = Wanted {
            iface: vec![
                "nope".into(),
                "eth2".into(),
                "10.0.0.1".into(),
                "fd00::9".into(),
            ],
            iface_regex: vec![Regex::new("^wlan").unwrap()],
            iface_can_reach: Some(ip("10.9.9.9")),
            ..v4()
        };
        // No default route: nothing reaches 10.9.9.9.
        let e = choose(&links(), &routes()[2..], &w)
            .unwrap_err()
            .to_string();
        for why in [
            "--iface nope: no interface of this name",
            "--iface eth2: interface eth2 has no IPv4 address; give one with --public-ip",
            "--iface 10.0.0.1: no interface has this address",
            "--iface fd00::9: an IPv6 address, and the network has no IPv6",
            "--iface-regex ^wlan: no interface name or address matches",
            "--iface-can-reach 10.9.9.9: no route reaches it",
        ] {
            assert!(e.contains(why), "{why} in {e}");
        }
        assert!(
            e.starts_with("no external interface fits: --iface nope"),
            "{e}"
        );
    }

    #[test]
    fn iface_regex_matches_addresses_then_names_and_uses_the_matched_address() {
        let w = Wanted {
            iface_regex: vec![Regex::new(r"^172\.16\.0\.1").unwrap()],
            ..v4()
        };
        assert_eq!(ok(&w).iface_ip, "172.16.0.10".parse().ok());
        // An address of a family the network does not use matches nothing: the name does.
        let w = Wanted {
            iface_regex: vec![Regex::new("^fd02|^eth0").unwrap()],
            ..v4()
        };
        assert_eq!(ok(&w).name, "eth0");
        // Dual-stack: an interface matching in both families comes first, then names, then
        // one family alone.
        let both = Regex::new(r"^192\.168\.0\.99$|^fd01::10$|^172|^fd00::99$").unwrap();
        let w = Wanted {
            iface_regex: vec![both],
            ..dual()
        };
        assert_eq!(
            summary(&ok(&w)),
            is(
                "eth0",
                &["192.168.0.99", "fd00::99"],
                &["192.168.0.99", "fd00::99"]
            )
        );
        let w = Wanted {
            iface_regex: vec![Regex::new("^fd01::10$|^eth0$").unwrap()],
            ..dual()
        };
        assert_eq!(ok(&w).name, "eth0");
        let w = Wanted {
            iface_regex: vec![Regex::new("^fd01::10$").unwrap()],
            ..dual()
        };
        assert_eq!(
            summary(&ok(&w)),
            is(
                "eth1",
                &["172.16.0.9", "fd01::10"],
                &["172.16.0.9", "fd01::10"]
            )
        );
    }

    #[test]
    fn can_reach_takes_the_longest_prefix_of_the_family() {
        let w = Wanted {
            iface_can_reach: Some(ip("172.16.5.5")),
            ..v4()
        };
        assert_eq!(ok(&w).name, "eth1");
        let w = Wanted {
            iface_can_reach: Some(ip("8.8.8.8")),
            ..v4()
        };
        assert_eq!(ok(&w).name, "eth0");
    }

    #[test]
    fn an_interface_made_again_keeps_its_addresses_with_its_new_index() {
        let old = External::example();
        let (ext, lost) = old.rebound(7, 9000, &[net("192.168.0.1/24"), net("fe80::1/64")]);
        assert_eq!((ext.index, ext.mtu, ext.name.as_str()), (7, 9000, "eth0"));
        assert_eq!(ext.addrs, vec![net("192.168.0.1/24")]);
        assert_eq!(
            (ext.public_ip, ext.iface_ipv6),
            (old.public_ip, old.iface_ipv6)
        );
        assert_eq!(lost, vec![ip("fd00::1")]);
    }

    #[test]
    fn privacy_deprecated_and_tentative_addresses_are_never_taken_hand_made_ones_first() {
        // The kernel lists the privacy address first, as it does once one is made.
        let mut eth0 = link(
            2,
            "eth0",
            1500,
            &[
                "fd00::7:1/64",
                "fd00::de:1/64",
                "fd00::7e:1/64",
                "fd00::5/64",
                "fd00::9/64",
                "192.168.0.9/24",
            ],
        );
        eth0.unfit = ["fd00::7:1", "fd00::de:1", "fd00::7e:1"].map(ip).to_vec();
        eth0.dynamic = ["fd00::7:1", "fd00::de:1", "fd00::5"].map(ip).to_vec();
        let routes = vec![Route {
            dst: net("::/0"),
            oif: Some(2),
        }];
        let found = |w: &Wanted| choose(&[eth0.clone()], &routes, w).unwrap();
        // The stable one added by hand, ahead of the stable SLAAC one the kernel lists first.
        assert_eq!(found(&v6()).public_ipv6, "fd00::9".parse().ok());
        let regex = Wanted {
            iface_regex: vec![Regex::new("^fd00::").unwrap()],
            ..v6()
        };
        assert_eq!(found(&regex).iface_ipv6, "fd00::9".parse().ok());
        let reach = Wanted {
            iface_can_reach: Some(ip("fd00::1")),
            ..v6()
        };
        assert_eq!(found(&reach).iface_ipv6, "fd00::9".parse().ok());
        // An address asked for by name is taken whatever its state.
        let asked = Wanted {
            iface: vec!["fd00::7:1".into()],
            ..v6()
        };
        assert_eq!(found(&asked).public_ipv6, "fd00::7:1".parse().ok());
        // With only unfit ones there is none to take.
        let unfit = eth0.unfit.clone();
        eth0.addrs
            .retain(|a| unfit.contains(&a.ip()) || a.is_ipv4());
        assert!(choose(&[eth0], &routes, &v6()).is_err());
    }

    #[test]
    fn ipv6_addresses_find_the_interface_as_ipv4_ones_do() {
        // IPv6-only: --public-ipv6 finds its interface and is its address; --public-ip plays
        // no part.
        let w = Wanted {
            public_ip: "192.168.0.9".parse().ok(),
            public_ipv6: "fd01::10".parse().ok(),
            ..v6()
        };
        assert_eq!(
            summary(&ok(&w)),
            is("eth1", &["172.16.0.9", "fd01::10"], &["fd01::10"])
        );
        let w = Wanted {
            iface: vec!["fd00::99".into()],
            ..v6()
        };
        assert_eq!(
            summary(&ok(&w)),
            is("eth0", &["192.168.0.9", "fd00::99"], &["fd00::99"])
        );
        // IPv4-only: --public-ipv6 plays no part.
        let w = Wanted {
            public_ipv6: "fd01::10".parse().ok(),
            ..v4()
        };
        assert_eq!(ok(&w).name, "eth0");
        let w = Wanted {
            public_ipv6: "fd09::1".parse().ok(),
            ..v6()
        };
        assert!(err(&w).starts_with("--public-ipv6 fd09::1 is not an address"));
    }

    #[test]
    fn dual_stack_public_addresses_found_together() {
        // --public-ip finds the interface; --public-ipv6 there is its IPv6 address.
        let w = Wanted {
            public_ip: "172.16.0.10".parse().ok(),
            public_ipv6: "fd01::10".parse().ok(),
            ..dual()
        };
        assert_eq!(
            summary(&ok(&w)),
            is(
                "eth1",
                &["172.16.0.10", "fd01::10"],
                &["172.16.0.10", "fd01::10"]
            )
        );
        // --public-ipv6 alone finds it; the IPv4 address is the interface's first.
        let w = Wanted {
            public_ipv6: "fd01::10".parse().ok(),
            ..dual()
        };
        assert_eq!(
            summary(&ok(&w)),
            is(
                "eth1",
                &["172.16.0.9", "fd01::10"],
                &["172.16.0.9", "fd01::10"]
            )
        );
        // --iface by IPv4 address: --public-ipv6 of that interface is its IPv6 address...
        let w = Wanted {
            iface: vec!["192.168.0.99".into()],
            public_ipv6: "fd00::99".parse().ok(),
            ..dual()
        };
        assert_eq!(
            summary(&ok(&w)),
            is(
                "eth0",
                &["192.168.0.99", "fd00::99"],
                &["192.168.0.99", "fd00::99"]
            )
        );
        // ...one of another interface is only announced (flanneld refuses it).
        let w = Wanted {
            public_ipv6: "fd01::10".parse().ok(),
            ..w
        };
        assert_eq!(
            summary(&ok(&w)),
            is(
                "eth0",
                &["192.168.0.99", "fd00::9"],
                &["192.168.0.99", "fd01::10"]
            )
        );
        // --iface by IPv6 address: that interface, its first IPv4 address.
        let w = Wanted {
            iface: vec!["fd01::10".into()],
            ..dual()
        };
        assert_eq!(
            summary(&ok(&w)),
            is(
                "eth1",
                &["172.16.0.9", "fd01::10"],
                &["172.16.0.9", "fd01::10"]
            )
        );
        // An interface without an address of one family fits only with that public address.
        let w = Wanted {
            iface: vec!["eth2".into()],
            ..dual()
        };
        assert!(err(&w).contains("interface eth2 has no IPv4 address; give one with --public-ip"));
        let w = Wanted {
            public_ip: "203.0.113.7".parse().ok(),
            ..w
        };
        assert_eq!(
            summary(&ok(&w)),
            is("eth2", &["fd02::9"], &["203.0.113.7", "fd02::9"])
        );
    }

    #[test]
    fn without_ipv6_on_the_interface_an_ipv6_network_names_the_setting() {
        let mut links = links();
        links[1].addrs.retain(|a| a.is_ipv4());
        links[1].ipv6_off = true;
        let e = choose(&links, &routes(), &dual()).unwrap_err().to_string();
        assert!(
            e.contains("interface eth0 has no IPv6 address: IPv6 is off on it (net.ipv6.conf.eth0.disable_ipv6 is 1")
                && e.contains("take EnableIPv6 out of the network config"),
            "{e}"
        );
    }
}
