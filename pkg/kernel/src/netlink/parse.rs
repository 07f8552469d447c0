//! Between rtnetlink's messages and this module's types, both ways. Pure: tested without root.

use super::types::{AddressInfo, FdbEntry, Link, Neighbour, Route, Vxlan};
use ipnetwork::IpNetwork;
use netlink_packet_route::address::{
    AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage,
};
use netlink_packet_route::link::{
    InfoData, InfoVxlan, LinkAttribute, LinkFlags, LinkInfo, LinkMessage, State,
};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteFlags, RouteHeader, RouteMessage, RouteProtocol, RouteScope,
    RouteType,
};
use netlink_packet_route::AddressFamily;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub(super) fn link(msg: &LinkMessage) -> Link {
    let mut l = Link {
        index: msg.header.index,
        up: msg.header.flags.contains(LinkFlags::Up),
        promisc: msg.header.flags.contains(LinkFlags::Promisc),
        ..Default::default()
    };
    for a in &msg.attributes {
        match a {
            LinkAttribute::IfName(n) => l.name = n.clone(),
            LinkAttribute::Address(m) => l.mac = m.clone(),
            LinkAttribute::Mtu(m) => l.mtu = Some(*m),
            LinkAttribute::Controller(c) => l.controller = Some(*c),
            LinkAttribute::Link(p) => l.peer_index = Some(*p),
            LinkAttribute::OperState(s) => {
                l.oper_up = *s == State::Up;
                l.oper_state = format!("{s:?}").to_lowercase();
            }
            LinkAttribute::LinkInfo(infos) => {
                for i in infos {
                    match i {
                        LinkInfo::Kind(k) => l.kind = Some(k.to_string()),
                        LinkInfo::Data(InfoData::Vxlan(v)) => l.vxlan = Some(vxlan(v)),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    l
}

fn vxlan(attrs: &[InfoVxlan]) -> Vxlan {
    let mut v = Vxlan::default();
    for a in attrs {
        match a {
            InfoVxlan::Id(id) => v.vni = *id,
            InfoVxlan::Port(p) => v.port = *p,
            InfoVxlan::Local(ip) => v.local = Some(IpAddr::V4(*ip)),
            InfoVxlan::Local6(ip) => v.local = Some(IpAddr::V6(*ip)),
            InfoVxlan::Link(dev) if *dev != 0 => v.device = Some(*dev),
            InfoVxlan::Learning(on) => v.learning = *on,
            InfoVxlan::Gbp => v.gbp = true,
            _ => {}
        }
    }
    v
}

pub(super) fn address(m: &AddressMessage) -> Option<AddressInfo> {
    let mut ip = None;
    let mut flags =
        AddressFlags::from_bits_retain(u32::from(AddressHeaderFlags::bits(&m.header.flags)));
    for a in &m.attributes {
        match a {
            AddressAttribute::Address(a) if ip.is_none() => ip = Some(*a),
            AddressAttribute::Local(a) => ip = Some(*a),
            AddressAttribute::Flags(f) => flags = *f,
            _ => {}
        }
    }
    let address = IpNetwork::new(ip?, m.header.prefix_len).ok()?;
    Some(AddressInfo {
        address,
        tentative: flags.contains(AddressFlags::Tentative),
        dad_failed: flags.contains(AddressFlags::Dadfailed),
        // IFA_F_TEMPORARY is IFA_F_SECONDARY's bit: for IPv4 it means a secondary address.
        temporary: address.is_ipv6() && flags.contains(AddressFlags::Secondary),
        deprecated: flags.contains(AddressFlags::Deprecated),
        permanent: flags.contains(AddressFlags::Permanent),
    })
}

/// `broadcast`: with the IPv4 broadcast address, as `ip address add` sets it.
pub(super) fn address_message(index: u32, addr: IpNetwork, broadcast: bool) -> AddressMessage {
    let mut msg = AddressMessage::default();
    msg.header.index = index;
    msg.header.prefix_len = addr.prefix();
    msg.header.family = family_of(addr.ip());
    msg.attributes.push(AddressAttribute::Local(addr.ip()));
    msg.attributes.push(AddressAttribute::Address(addr.ip()));
    if let (IpNetwork::V4(v4), true) = (addr, broadcast) {
        if v4.prefix() < 31 {
            msg.attributes
                .push(AddressAttribute::Broadcast(v4.broadcast()));
        }
    }
    msg
}

pub(super) fn family_of(ip: IpAddr) -> AddressFamily {
    match ip {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    }
}

fn route_ip(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

fn route_address(ip: IpAddr) -> RouteAddress {
    match ip {
        IpAddr::V4(v4) => RouteAddress::Inet(v4),
        IpAddr::V6(v6) => RouteAddress::Inet6(v6),
    }
}

/// The question `ip route get <ip>` asks: which route the kernel would send a packet by.
pub(super) fn route_query(ip: IpAddr) -> RouteMessage {
    let mut m = RouteMessage::default();
    m.header.address_family = family_of(ip);
    m.header.destination_prefix_length = if ip.is_ipv4() { 32 } else { 128 };
    m.attributes
        .push(RouteAttribute::Destination(route_address(ip)));
    m
}

/// A unicast route of any table; None for what this module does not model (multicast, local,
/// broadcast, routes of other families).
pub(super) fn route(r: &RouteMessage) -> Option<Route> {
    if r.header.kind != RouteType::Unicast {
        return None;
    }
    let mut table = u32::from(r.header.table);
    let (mut dst, mut gw, mut oif, mut nhid) = (None, None, None, None);
    for a in &r.attributes {
        match a {
            RouteAttribute::Destination(d) => dst = route_ip(d),
            RouteAttribute::Gateway(g) => gw = route_ip(g),
            RouteAttribute::Oif(i) => oif = Some(*i),
            RouteAttribute::Table(t) => table = *t,
            RouteAttribute::NhId(id) => nhid = Some(*id),
            _ => {}
        }
    }
    // The kernel repeats the nexthop's gateway and device (net.ipv4.nexthop_compat_mode):
    // they are the nexthop's, not the route's.
    let onlink = nhid.is_none() && r.header.flags.contains(RouteFlags::Onlink);
    if nhid.is_some() {
        (gw, oif) = (None, None);
    }
    let dst = match (dst, r.header.address_family) {
        (Some(d), _) => d,
        (None, AddressFamily::Inet) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        (None, AddressFamily::Inet6) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        (None, _) => return None,
    };
    Some(Route {
        dst: IpNetwork::new(dst, r.header.destination_prefix_length).ok()?,
        gw,
        oif,
        onlink,
        table,
        nhid,
    })
}

/// The destination of a blackhole route of `table`; None for any other route.
pub(super) fn blackhole(r: &RouteMessage, table: u32) -> Option<IpNetwork> {
    if r.header.kind != RouteType::BlackHole {
        return None;
    }
    let mut in_table = u32::from(r.header.table);
    let mut dst = None;
    for a in &r.attributes {
        match a {
            RouteAttribute::Destination(d) => dst = route_ip(d),
            RouteAttribute::Table(t) => in_table = *t,
            _ => {}
        }
    }
    let dst = match (dst, r.header.address_family) {
        (Some(d), _) => d,
        (None, AddressFamily::Inet) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        (None, AddressFamily::Inet6) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        (None, _) => return None,
    };
    (in_table == table)
        .then(|| IpNetwork::new(dst, r.header.destination_prefix_length).ok())
        .flatten()
}

/// The message that adds a blackhole route to `dst` in `table` (`ip route add blackhole`).
pub(super) fn blackhole_message(dst: IpNetwork, table: u32) -> RouteMessage {
    let mut m = RouteMessage::default();
    m.header.address_family = family_of(dst.ip());
    m.header.destination_prefix_length = dst.prefix();
    m.header.kind = RouteType::BlackHole;
    m.header.protocol = RouteProtocol::Boot;
    m.header.scope = RouteScope::Universe;
    if table < 256 {
        m.header.table = table as u8;
    } else {
        m.header.table = RouteHeader::RT_TABLE_UNSPEC;
        m.attributes.push(RouteAttribute::Table(table));
    }
    if dst.prefix() > 0 {
        m.attributes
            .push(RouteAttribute::Destination(route_address(dst.network())));
    }
    m
}

/// The message that adds, replaces or deletes `r`. `protocol` marks who made it (boot, as
/// `ip route` does, for the plugins' routes).
pub(super) fn route_message(r: &Route, protocol: RouteProtocol) -> RouteMessage {
    let mut m = RouteMessage::default();
    m.header.address_family = family_of(r.dst.ip());
    m.header.destination_prefix_length = r.dst.prefix();
    m.header.kind = RouteType::Unicast;
    m.header.protocol = protocol;
    m.header.scope = if r.gw.is_none() && r.oif.is_some() {
        RouteScope::Link
    } else {
        RouteScope::Universe
    };
    if r.table < 256 {
        m.header.table = r.table as u8;
    } else {
        m.header.table = RouteHeader::RT_TABLE_UNSPEC;
        m.attributes.push(RouteAttribute::Table(r.table));
    }
    if r.onlink {
        m.header.flags |= RouteFlags::Onlink;
    }
    if r.dst.prefix() > 0 {
        m.attributes
            .push(RouteAttribute::Destination(route_address(r.dst.network())));
    }
    if let Some(gw) = r.gw {
        m.attributes
            .push(RouteAttribute::Gateway(route_address(gw)));
    }
    if let Some(oif) = r.oif {
        m.attributes.push(RouteAttribute::Oif(oif));
    }
    if let Some(id) = r.nhid {
        m.attributes.push(RouteAttribute::NhId(id));
    }
    m
}

fn neighbour_ip(a: &NeighbourAddress) -> Option<IpAddr> {
    match a {
        NeighbourAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        NeighbourAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        // An AF_BRIDGE entry's destination is not parsed by family.
        NeighbourAddress::Other(b) => match b.len() {
            4 => <[u8; 4]>::try_from(b.as_slice()).ok().map(IpAddr::from),
            16 => <[u8; 16]>::try_from(b.as_slice()).ok().map(IpAddr::from),
            _ => None,
        },
        _ => None,
    }
}

fn neighbour_address(ip: IpAddr) -> NeighbourAddress {
    match ip {
        IpAddr::V4(v4) => NeighbourAddress::Inet(v4),
        IpAddr::V6(v6) => NeighbourAddress::Inet6(v6),
    }
}

fn is_permanent(state: NeighbourState) -> bool {
    state == NeighbourState::Permanent
}

pub(super) fn neighbour(m: &NeighbourMessage) -> Option<Neighbour> {
    if m.header.family == AddressFamily::Bridge {
        return None;
    }
    let mut ip = None;
    let mut mac = Vec::new();
    for a in &m.attributes {
        match a {
            NeighbourAttribute::Destination(d) => ip = neighbour_ip(d),
            NeighbourAttribute::LinkLayerAddress(l) => mac = l.clone(),
            _ => {}
        }
    }
    Some(Neighbour {
        device: m.header.ifindex,
        ip: ip?,
        mac,
        permanent: is_permanent(m.header.state),
    })
}

pub(super) fn neighbour_message(n: &Neighbour) -> NeighbourMessage {
    let mut m = NeighbourMessage::default();
    m.header.family = family_of(n.ip);
    m.header.ifindex = n.device;
    m.header.state = if n.permanent {
        NeighbourState::Permanent
    } else {
        NeighbourState::Reachable
    };
    m.attributes
        .push(NeighbourAttribute::Destination(neighbour_address(n.ip)));
    if !n.mac.is_empty() {
        m.attributes
            .push(NeighbourAttribute::LinkLayerAddress(n.mac.clone()));
    }
    m
}

/// A device's own forwarding entry (NTF_SELF), not one a bridge learnt on a port.
pub(super) fn fdb_entry(m: &NeighbourMessage) -> Option<FdbEntry> {
    if m.header.family != AddressFamily::Bridge || !m.header.flags.contains(NeighbourFlags::Own) {
        return None;
    }
    let mut mac = None;
    let mut dst = None;
    for a in &m.attributes {
        match a {
            NeighbourAttribute::LinkLayerAddress(l) => mac = <[u8; 6]>::try_from(l.as_slice()).ok(),
            NeighbourAttribute::Destination(d) => dst = neighbour_ip(d),
            _ => {}
        }
    }
    Some(FdbEntry {
        device: m.header.ifindex,
        mac: mac?,
        dst,
        permanent: is_permanent(m.header.state),
    })
}

pub(super) fn fdb_message(e: &FdbEntry) -> NeighbourMessage {
    let mut m = NeighbourMessage::default();
    m.header.family = AddressFamily::Bridge;
    m.header.ifindex = e.device;
    m.header.flags = NeighbourFlags::Own;
    m.header.state = if e.permanent {
        NeighbourState::Permanent
    } else {
        NeighbourState::Reachable
    };
    m.attributes
        .push(NeighbourAttribute::LinkLayerAddress(e.mac.to_vec()));
    if let Some(dst) = e.dst {
        m.attributes
            .push(NeighbourAttribute::Destination(neighbour_address(dst)));
    }
    m
}

#[cfg(test)]
mod tests {
    use super::super::types::MAIN_TABLE;
    use super::*;

    #[test]
    fn blackhole_routes_go_out_and_come_back_and_nothing_else_reads_as_one() {
        for dst in ["10.244.3.0/24", "fd00:10:244:3::/64", "0.0.0.0/0"] {
            let dst: IpNetwork = dst.parse().unwrap();
            for table in [MAIN_TABLE, 1000] {
                let m = blackhole_message(dst, table);
                assert_eq!(m.header.kind, RouteType::BlackHole);
                assert_eq!(blackhole(&m, table), Some(dst), "{dst} in {table}");
                assert_eq!(blackhole(&m, table + 1), None, "{dst} in another table");
                // Not a unicast route: the route listings leave it out.
                assert_eq!(route(&m), None);
            }
        }
        let unicast = route_message(
            &Route::new("10.244.3.0/24".parse().unwrap(), None, Some(4)),
            RouteProtocol::Boot,
        );
        assert_eq!(blackhole(&unicast, MAIN_TABLE), None);
    }

    #[test]
    fn routes_go_out_and_come_back_the_same() {
        let r = Route::new(
            "10.5.0.0/24".parse().unwrap(),
            Some("10.5.0.0".parse().unwrap()),
            Some(7),
        )
        .onlink();
        let m = route_message(&r, RouteProtocol::Boot);
        assert!(m.header.flags.contains(RouteFlags::Onlink));
        assert_eq!(m.header.scope, RouteScope::Universe);
        assert_eq!(route(&m), Some(r));
        let default = Route::new("::/0".parse().unwrap(), None, Some(3));
        let m = route_message(&default, RouteProtocol::Boot);
        assert_eq!(m.header.scope, RouteScope::Link);
        assert_eq!(route(&m), Some(default));
        let big = Route {
            table: 1000,
            ..Route::new("10.0.0.0/8".parse().unwrap(), None, Some(1))
        };
        assert_eq!(route(&route_message(&big, RouteProtocol::Boot)), Some(big));
        let through = Route::via_nexthop("fd00:5::/64".parse().unwrap(), 70_000);
        let mut m = route_message(&through, RouteProtocol::Boot);
        assert_eq!(m.header.scope, RouteScope::Universe);
        assert_eq!(route(&m), Some(through.clone()));
        // As a dump shows it: with the nexthop's gateway, device and flags repeated.
        m.header.flags |= RouteFlags::Onlink;
        m.attributes.push(RouteAttribute::Gateway(route_address(
            "fd00:5::".parse().unwrap(),
        )));
        m.attributes.push(RouteAttribute::Oif(4));
        assert_eq!(route(&m), Some(through));
    }

    #[test]
    fn neighbours_and_fdb_entries_go_out_and_come_back_the_same() {
        let n = Neighbour::permanent(4, "10.5.1.0".parse().unwrap(), [2, 0, 0, 0, 0, 1]);
        assert_eq!(neighbour(&neighbour_message(&n)), Some(n.clone()));
        assert_eq!(fdb_entry(&neighbour_message(&n)), None);
        let f = FdbEntry::permanent(4, [2, 0, 0, 0, 0, 1], "fd00::1".parse().unwrap());
        let m = fdb_message(&f);
        assert_eq!(neighbour(&m), None);
        // Parsed back from bytes, the destination of a bridge entry is not typed by family.
        let mut m2 = m.clone();
        for a in &mut m2.attributes {
            if let NeighbourAttribute::Destination(_) = a {
                *a = NeighbourAttribute::Destination(NeighbourAddress::Other(
                    "fd00::1".parse::<Ipv6Addr>().unwrap().octets().to_vec(),
                ));
            }
        }
        assert_eq!(fdb_entry(&m2), Some(f.clone()));
        assert_eq!(fdb_entry(&m), Some(f));
    }
}
