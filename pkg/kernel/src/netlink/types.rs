//! The netlink layer's own plain types: what goes in and out of its operations. Nothing of
//! rtnetlink's crosses the crate's boundary.

use crate::netns::Netns;
use ipnetwork::IpNetwork;
use std::net::IpAddr;

/// A link as the kernel describes it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Link {
    pub index: u32,
    pub name: String,
    /// `bridge`, `veth`, `vxlan`, ...; None for a device without one (a physical NIC, `lo`).
    pub kind: Option<String>,
    pub mac: Vec<u8>,
    pub mtu: Option<u32>,
    /// Administratively up.
    pub up: bool,
    /// Operationally up (a veth is once both ends are).
    pub oper_up: bool,
    /// The operational state as the kernel names it (`up`, `down`, `lowerlayerdown`, ...).
    pub oper_state: String,
    pub promisc: bool,
    /// The bridge a port is on.
    pub controller: Option<u32>,
    /// IFLA_LINK: a veth's peer (an index in the peer's namespace), a vxlan's... nothing.
    pub peer_index: Option<u32>,
    /// The vxlan attributes, for a vxlan device.
    pub vxlan: Option<Vxlan>,
}

impl Link {
    pub fn is_bridge(&self) -> bool {
        self.kind.as_deref() == Some("bridge")
    }

    pub fn is_veth(&self) -> bool {
        self.kind.as_deref() == Some("veth")
    }

    pub fn is_vxlan(&self) -> bool {
        self.kind.as_deref() == Some("vxlan")
    }

    /// The MAC as `aa:bb:cc:dd:ee:ff`, or empty.
    pub fn mac_string(&self) -> String {
        format_mac(&self.mac)
    }
}

/// `aa:bb:cc:dd:ee:ff`.
pub fn format_mac(mac: &[u8]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// A bridge to create when it is missing. Everything is in the one RTM_NEWLINK, so that a
/// concurrent ADD finding it already there never sees it half configured.
pub struct BridgeSpec<'a> {
    pub name: &'a str,
    pub mtu: Option<u32>,
    pub promisc: bool,
    pub vlan_filtering: bool,
    /// A fixed address, so that the bridge's MAC does not follow its ports.
    pub mac: [u8; 6],
}

/// A veth pair made by one RTM_NEWLINK: this end in the connection's namespace, the peer
/// created directly inside `peer_ns` (it never appears in this namespace).
pub struct VethSpec<'a> {
    pub name: &'a str,
    pub mtu: Option<u32>,
    /// The bridge this end joins at creation.
    pub controller: Option<u32>,
    pub up: bool,
    pub peer_name: &'a str,
    pub peer_ns: &'a Netns,
    pub peer_mac: Option<[u8; 6]>,
}

/// The vxlan attributes that make a device fit for an overlay, as they are compared.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Vxlan {
    pub vni: u32,
    /// The UDP destination port (0: the kernel's default, 8472).
    pub port: u16,
    pub local: Option<IpAddr>,
    /// The underlay device (IFLA_VXLAN_LINK).
    pub device: Option<u32>,
    pub learning: bool,
    /// Group Based Policy extension.
    pub gbp: bool,
}

/// A link to make or keep, of any kind RTM_NEWLINK makes, everything in the one message so
/// that it is never seen half made. A kind without attributes of its own is
/// [`LinkKind::Named`]: a new one of those needs nothing here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkSpec {
    pub name: String,
    pub kind: LinkKind,
    pub mtu: Option<u32>,
    pub mac: Option<[u8; 6]>,
}

/// A link's kind, with the attributes of the kinds that have their own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkKind {
    /// A kind the kernel makes from its name alone (`wireguard`, `dummy`, `ifb`).
    Named(&'static str),
    Vxlan(Vxlan),
}

impl LinkKind {
    /// The kind as the kernel names it ([`Link::kind`]).
    pub fn name(&self) -> &'static str {
        match self {
            LinkKind::Named(kind) => kind,
            LinkKind::Vxlan(_) => "vxlan",
        }
    }

    /// The attributes of its kind that `have` differs in, as (what, wanted, held).
    fn differences(&self, have: &Link) -> Vec<(&'static str, String, String)> {
        let LinkKind::Vxlan(want) = self else {
            return Vec::new();
        };
        let v = have.vxlan.clone().unwrap_or_default();
        // Port 0 asks for the kernel's default, which a device reports as 8472.
        let port = |p: u16| if p == 0 { 8472 } else { p };
        vec![
            ("VNI", want.vni.to_string(), v.vni.to_string()),
            (
                "port",
                port(want.port).to_string(),
                port(v.port).to_string(),
            ),
            (
                "local address",
                format!("{:?}", want.local),
                format!("{:?}", v.local),
            ),
            (
                "device",
                format!("{:?}", want.device),
                format!("{:?}", v.device),
            ),
            (
                "learning",
                want.learning.to_string(),
                v.learning.to_string(),
            ),
            ("GBP", want.gbp.to_string(), v.gbp.to_string()),
        ]
        .into_iter()
        .filter(|(_, w, h)| w != h)
        .collect()
    }
}

impl LinkSpec {
    /// How `have` differs from this spec, one entry per attribute (empty: it fits). A link of
    /// another kind differs in its kind.
    pub fn differences(&self, have: &Link) -> Vec<String> {
        let kind = self.kind.name();
        if have.kind.as_deref() != Some(kind) {
            return vec![format!(
                "kind is {:?}, not {kind}",
                have.kind.as_deref().unwrap_or("none")
            )];
        }
        let mut out: Vec<String> = self
            .kind
            .differences(have)
            .into_iter()
            .map(|(what, w, h)| format!("{what} is {h}, wanted {w}"))
            .collect();
        if let Some(mtu) = self.mtu.filter(|m| have.mtu != Some(*m)) {
            out.push(format!("MTU is {}, wanted {mtu}", have.mtu.unwrap_or(0)));
        }
        if let Some(mac) = self.mac.filter(|m| have.mac != m.as_slice()) {
            out.push(format!(
                "MAC is {}, wanted {}",
                have.mac_string(),
                format_mac(&mac)
            ));
        }
        out
    }

    /// Whether `have` differs at most in MTU and MAC, which can be set in place; the kernel
    /// changes no link's kind and no vxlan's VNI, port or addresses, so any other difference
    /// means making it again.
    pub fn mendable(&self, have: &Link) -> bool {
        have.kind.as_deref() == Some(self.kind.name()) && self.kind.differences(have).is_empty()
    }
}

/// An address with its kernel flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressInfo {
    pub address: IpNetwork,
    pub tentative: bool,
    pub dad_failed: bool,
    /// An IPv6 privacy address (RFC 4941), replaced as it ages.
    pub temporary: bool,
    /// Past its preferred lifetime: kept for the connections using it, never chosen for new.
    pub deprecated: bool,
    /// Added by hand, with no lifetime; false for SLAAC and DHCP addresses.
    pub permanent: bool,
}

impl AddressInfo {
    pub fn tentative(&self) -> bool {
        self.tentative
    }
    pub fn dad_failed(&self) -> bool {
        self.dad_failed
    }
}

/// A route of one table: either through a gateway and/or a device of its own, or through a
/// nexthop object (`nhid`), which then holds the gateway and the device.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Route {
    pub dst: IpNetwork,
    pub gw: Option<IpAddr>,
    pub oif: Option<u32>,
    /// Reach the gateway on `oif` even though no route says it is there (a vxlan overlay's
    /// peers).
    pub onlink: bool,
    /// The routing table (254 is main).
    pub table: u32,
    /// The nexthop object the route goes through. Such a route has no `gw`, `oif` or
    /// `onlink` of its own: read back, those the kernel repeats from the nexthop are left out.
    pub nhid: Option<u32>,
}

/// The main routing table.
pub const MAIN_TABLE: u32 = 254;

impl Route {
    /// A route of the main table.
    pub fn new(dst: IpNetwork, gw: Option<IpAddr>, oif: Option<u32>) -> Route {
        Route {
            dst,
            gw,
            oif,
            onlink: false,
            table: MAIN_TABLE,
            nhid: None,
        }
    }

    /// A route of the main table through the nexthop object `id`.
    pub fn via_nexthop(dst: IpNetwork, id: u32) -> Route {
        Route {
            nhid: Some(id),
            ..Route::new(dst, None, None)
        }
    }

    pub fn onlink(mut self) -> Route {
        self.onlink = true;
        self
    }
}

/// A nexthop object (kernel 5.3 and later): a gateway on a device, kept once and named by
/// its id in any number of routes (`ip nexthop add id 7 via 10.5.3.0 dev flannel.1 onlink`,
/// then `ip route add 10.5.3.0/24 nhid 7`). Deleting it deletes the routes through it.
/// Groups, blackholes and FDB nexthops are not modelled: listings leave them out.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Nexthop {
    /// 1 to 2^32-1, chosen by whoever makes it.
    pub id: u32,
    /// Its family is the nexthop's.
    pub gateway: IpAddr,
    pub device: u32,
    /// Reach the gateway on `device` even though no route says it is there.
    pub onlink: bool,
    /// Who made it, as routes mark it (`RTPROT_*`: [`PROTOCOL_BOOT`] is what `ip` writes).
    pub protocol: u8,
}

/// RTPROT_BOOT: the protocol `ip route` and `ip nexthop` mark their entries with by default,
/// and that this module writes routes with.
pub const PROTOCOL_BOOT: u8 = 3;

impl Nexthop {
    /// A gateway reached on `device` without a route to it (an overlay's peer), marked boot.
    pub fn onlink(id: u32, gateway: IpAddr, device: u32) -> Nexthop {
        Nexthop {
            id,
            gateway,
            device,
            onlink: true,
            protocol: PROTOCOL_BOOT,
        }
    }
}

/// The kept form of [`Route`] a plugin reads (main table, both families).
pub type RouteInfo = Route;

/// A neighbour (ARP or NDP) entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Neighbour {
    pub device: u32,
    pub ip: IpAddr,
    /// Empty for an entry without one (incomplete).
    pub mac: Vec<u8>,
    pub permanent: bool,
}

impl Neighbour {
    /// A permanent entry: what an overlay programs for its peers.
    pub fn permanent(device: u32, ip: IpAddr, mac: [u8; 6]) -> Neighbour {
        Neighbour {
            device,
            ip,
            mac: mac.to_vec(),
            permanent: true,
        }
    }
}

/// A bridge forwarding database entry of a device itself (NTF_SELF), as a vxlan device has
/// for each peer: frames to `mac` go to the underlay address `dst`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FdbEntry {
    pub device: u32,
    pub mac: [u8; 6],
    pub dst: Option<IpAddr>,
    pub permanent: bool,
}

impl FdbEntry {
    pub fn permanent(device: u32, mac: [u8; 6], dst: IpAddr) -> FdbEntry {
        FdbEntry {
            device,
            mac,
            dst: Some(dst),
            permanent: true,
        }
    }
}
