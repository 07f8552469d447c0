//! Nexthop objects on the wire (RTM_NEWNEXTHOP, RTM_DELNEXTHOP, RTM_GETNEXTHOP: a `struct
//! nhmsg` and NHA_* attributes), which netlink-packet-route 0.34 does not know, and [`Rtnl`],
//! the message type of this module's sockets: rtnetlink's messages and these. Pure: tested
//! without root.

use super::parse::family_of;
use super::types::Nexthop;
use netlink_packet_route::RouteNetlinkMessage;
use rtnetlink::packet_core::{
    DecodeError, Emitable, NetlinkDeserializable, NetlinkHeader, NetlinkPayload,
    NetlinkSerializable, Nla, NlasIterator,
};
use std::net::IpAddr;

const RTM_NEWNEXTHOP: u16 = 104;
const RTM_DELNEXTHOP: u16 = 105;
const RTM_GETNEXTHOP: u16 = 106;

const NHA_ID: u16 = 1;
const NHA_GROUP: u16 = 2;
const NHA_BLACKHOLE: u16 = 4;
const NHA_OIF: u16 = 5;
const NHA_GATEWAY: u16 = 6;
const NHA_FDB: u16 = 11;

/// RTNH_F_ONLINK, in `nh_flags` as in a route's flags.
const ONLINK: u32 = 4;

/// `struct nhmsg`: family, scope, protocol, a reserved byte, flags (host order).
const HEADER_LEN: usize = 8;

/// A message of a NETLINK_ROUTE socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Rtnl {
    Route(RouteNetlinkMessage),
    NewNexthop(NexthopMessage),
    DelNexthop(NexthopMessage),
    GetNexthop(NexthopMessage),
}

impl From<RouteNetlinkMessage> for Rtnl {
    fn from(m: RouteNetlinkMessage) -> Rtnl {
        Rtnl::Route(m)
    }
}

impl From<Rtnl> for NetlinkPayload<Rtnl> {
    fn from(m: Rtnl) -> Self {
        NetlinkPayload::InnerMessage(m)
    }
}

impl NetlinkSerializable for Rtnl {
    fn message_type(&self) -> u16 {
        match self {
            Rtnl::Route(m) => m.message_type(),
            Rtnl::NewNexthop(_) => RTM_NEWNEXTHOP,
            Rtnl::DelNexthop(_) => RTM_DELNEXTHOP,
            Rtnl::GetNexthop(_) => RTM_GETNEXTHOP,
        }
    }

    fn buffer_len(&self) -> usize {
        match self {
            Rtnl::Route(m) => NetlinkSerializable::buffer_len(m),
            Rtnl::NewNexthop(m) | Rtnl::DelNexthop(m) | Rtnl::GetNexthop(m) => m.buffer_len(),
        }
    }

    fn serialize(&self, buffer: &mut [u8]) {
        match self {
            Rtnl::Route(m) => m.serialize(buffer),
            Rtnl::NewNexthop(m) | Rtnl::DelNexthop(m) | Rtnl::GetNexthop(m) => m.emit(buffer),
        }
    }
}

impl NetlinkDeserializable for Rtnl {
    type Error = DecodeError;

    fn deserialize(header: &NetlinkHeader, payload: &[u8]) -> Result<Rtnl, DecodeError> {
        Ok(match header.message_type {
            RTM_NEWNEXTHOP => Rtnl::NewNexthop(NexthopMessage::parse(payload)?),
            RTM_DELNEXTHOP => Rtnl::DelNexthop(NexthopMessage::parse(payload)?),
            RTM_GETNEXTHOP => Rtnl::GetNexthop(NexthopMessage::parse(payload)?),
            _ => Rtnl::Route(RouteNetlinkMessage::deserialize(header, payload)?),
        })
    }
}

/// One nexthop request or answer.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(super) struct NexthopMessage {
    pub family: u8,
    pub scope: u8,
    pub protocol: u8,
    pub flags: u32,
    pub attributes: Vec<Attribute>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Attribute {
    Id(u32),
    Oif(u32),
    Gateway(IpAddr),
    /// What this module does not model (a group, a blackhole, an FDB nexthop, ...), kept as
    /// the kernel sent it.
    Other(u16, Vec<u8>),
}

impl Nla for Attribute {
    fn value_len(&self) -> usize {
        match self {
            Attribute::Id(_) | Attribute::Oif(_) => 4,
            Attribute::Gateway(IpAddr::V4(_)) => 4,
            Attribute::Gateway(IpAddr::V6(_)) => 16,
            Attribute::Other(_, v) => v.len(),
        }
    }

    fn kind(&self) -> u16 {
        match self {
            Attribute::Id(_) => NHA_ID,
            Attribute::Oif(_) => NHA_OIF,
            Attribute::Gateway(_) => NHA_GATEWAY,
            Attribute::Other(k, _) => *k,
        }
    }

    fn emit_value(&self, buffer: &mut [u8]) {
        match self {
            Attribute::Id(v) | Attribute::Oif(v) => buffer.copy_from_slice(&v.to_ne_bytes()),
            Attribute::Gateway(IpAddr::V4(a)) => buffer.copy_from_slice(&a.octets()),
            Attribute::Gateway(IpAddr::V6(a)) => buffer.copy_from_slice(&a.octets()),
            Attribute::Other(_, v) => buffer.copy_from_slice(v),
        }
    }
}

impl NexthopMessage {
    fn parse(payload: &[u8]) -> Result<NexthopMessage, DecodeError> {
        let Some((header, rest)) = payload.split_first_chunk::<HEADER_LEN>() else {
            return Err(format!("a nexthop message of {} bytes", payload.len()).into());
        };
        let mut m = NexthopMessage {
            family: header[0],
            scope: header[1],
            protocol: header[2],
            flags: u32::from_ne_bytes([header[4], header[5], header[6], header[7]]),
            attributes: Vec::new(),
        };
        for nla in NlasIterator::new(rest) {
            let nla = nla?;
            let value = nla.value();
            let u32_of = |what: &str| {
                <[u8; 4]>::try_from(value)
                    .map(u32::from_ne_bytes)
                    .map_err(|_| DecodeError::from(format!("{what} of {} bytes", value.len())))
            };
            m.attributes.push(match nla.kind() {
                NHA_ID => Attribute::Id(u32_of("NHA_ID")?),
                NHA_OIF => Attribute::Oif(u32_of("NHA_OIF")?),
                NHA_GATEWAY => Attribute::Gateway(match value.len() {
                    4 => IpAddr::from(<[u8; 4]>::try_from(value).unwrap_or_default()),
                    16 => IpAddr::from(<[u8; 16]>::try_from(value).unwrap_or_default()),
                    n => return Err(format!("NHA_GATEWAY of {n} bytes").into()),
                }),
                kind => Attribute::Other(kind, value.to_vec()),
            });
        }
        Ok(m)
    }

    fn buffer_len(&self) -> usize {
        HEADER_LEN + self.attributes.as_slice().buffer_len()
    }

    fn emit(&self, buffer: &mut [u8]) {
        buffer[0] = self.family;
        buffer[1] = self.scope;
        buffer[2] = self.protocol;
        buffer[3] = 0;
        buffer[4..HEADER_LEN].copy_from_slice(&self.flags.to_ne_bytes());
        self.attributes.as_slice().emit(&mut buffer[HEADER_LEN..]);
    }

    fn id(&self) -> Option<u32> {
        self.attributes.iter().find_map(|a| match a {
            Attribute::Id(id) => Some(*id),
            _ => None,
        })
    }
}

/// The message that sets (or, as a key, deletes) `nh`.
pub(super) fn message(nh: &Nexthop) -> NexthopMessage {
    NexthopMessage {
        family: family_of(nh.gateway).into(),
        scope: 0,
        protocol: nh.protocol,
        flags: if nh.onlink { ONLINK } else { 0 },
        attributes: vec![
            Attribute::Id(nh.id),
            Attribute::Gateway(nh.gateway),
            Attribute::Oif(nh.device),
        ],
    }
}

/// The request naming the nexthop `id` alone (to delete or get it).
pub(super) fn by_id(id: u32) -> NexthopMessage {
    NexthopMessage {
        attributes: vec![Attribute::Id(id)],
        ..Default::default()
    }
}

/// The request listing every nexthop (the header must be zero).
pub(super) fn dump() -> NexthopMessage {
    NexthopMessage::default()
}

/// A gateway on a device; None for what this module does not model (groups, blackholes, FDB
/// nexthops, a device without a gateway).
pub(super) fn nexthop(m: &NexthopMessage) -> Option<Nexthop> {
    let (mut gateway, mut device) = (None, None);
    for a in &m.attributes {
        match a {
            Attribute::Gateway(g) => gateway = Some(*g),
            Attribute::Oif(d) => device = Some(*d),
            Attribute::Other(NHA_GROUP | NHA_BLACKHOLE | NHA_FDB, _) => return None,
            _ => {}
        }
    }
    Some(Nexthop {
        id: m.id()?,
        gateway: gateway?,
        device: device?,
        onlink: m.flags & ONLINK != 0,
        protocol: m.protocol,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_route::route::RouteMessage;

    fn bytes(m: &Rtnl) -> Vec<u8> {
        let mut b = vec![0; m.buffer_len()];
        m.serialize(&mut b);
        b
    }

    fn header(message_type: u16) -> NetlinkHeader {
        let mut h = NetlinkHeader::default();
        h.message_type = message_type;
        h
    }

    fn back(m: &Rtnl) -> Rtnl {
        Rtnl::deserialize(&header(m.message_type()), &bytes(m)).unwrap()
    }

    #[test]
    fn nexthops_go_out_and_come_back_the_same() {
        let v4 = Nexthop::onlink(7, "10.5.3.0".parse().unwrap(), 4);
        let m = Rtnl::NewNexthop(message(&v4));
        // nhmsg, then NHA_ID, NHA_GATEWAY and NHA_OIF as `ip nexthop` sends them.
        assert_eq!(
            bytes(&m),
            [
                2, 0, 3, 0, 4, 0, 0, 0, //
                8, 0, 1, 0, 7, 0, 0, 0, //
                8, 0, 6, 0, 10, 5, 3, 0, //
                8, 0, 5, 0, 4, 0, 0, 0,
            ]
        );
        let Rtnl::NewNexthop(parsed) = back(&m) else {
            panic!("not a nexthop")
        };
        assert_eq!(nexthop(&parsed), Some(v4));

        let v6 = Nexthop {
            onlink: false,
            protocol: 99,
            ..Nexthop::onlink(u32::MAX, "fd00::1".parse().unwrap(), 9)
        };
        let Rtnl::DelNexthop(parsed) = back(&Rtnl::DelNexthop(message(&v6))) else {
            panic!("not a nexthop")
        };
        assert_eq!(parsed.family, 10);
        assert_eq!(nexthop(&parsed), Some(v6));
        assert_eq!(parsed.id(), Some(u32::MAX));
    }

    #[test]
    fn what_is_not_a_gateway_on_a_device_is_left_out() {
        let group = NexthopMessage {
            attributes: vec![Attribute::Id(3), Attribute::Other(NHA_GROUP, vec![0; 8])],
            ..Default::default()
        };
        let Rtnl::NewNexthop(parsed) = back(&Rtnl::NewNexthop(group)) else {
            panic!("not a nexthop")
        };
        assert_eq!(
            parsed.attributes[1],
            Attribute::Other(NHA_GROUP, vec![0; 8])
        );
        assert_eq!(nexthop(&parsed), None);
        assert_eq!(parsed.id(), Some(3));
        let device_only = NexthopMessage {
            family: 2,
            attributes: vec![Attribute::Id(4), Attribute::Oif(2)],
            ..Default::default()
        };
        assert_eq!(nexthop(&device_only), None);
    }

    #[test]
    fn bad_nexthop_messages_are_refused_and_others_pass_through() {
        assert!(Rtnl::deserialize(&header(RTM_NEWNEXTHOP), &[2, 0, 3]).is_err());
        // NHA_ID of 2 bytes.
        let short = [2, 0, 3, 0, 0, 0, 0, 0, 6, 0, 1, 0, 7, 0, 0, 0];
        assert!(Rtnl::deserialize(&header(RTM_NEWNEXTHOP), &short).is_err());
        // An attribute longer than the message.
        let long = [2, 0, 3, 0, 0, 0, 0, 0, 40, 0, 1, 0, 7, 0, 0, 0];
        assert!(Rtnl::deserialize(&header(RTM_NEWNEXTHOP), &long).is_err());
        let route = Rtnl::Route(RouteNetlinkMessage::NewRoute(RouteMessage::default()));
        assert_eq!(back(&route), route);
        assert_eq!(back(&Rtnl::GetNexthop(dump())), Rtnl::GetNexthop(dump()));
        assert_eq!(bytes(&Rtnl::GetNexthop(dump())), [0; 8]);
        assert_eq!(
            back(&Rtnl::DelNexthop(by_id(12))),
            Rtnl::DelNexthop(by_id(12))
        );
    }
}
