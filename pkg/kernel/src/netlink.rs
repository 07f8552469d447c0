//! One thin wrapper over rtnetlink: a socket bound to a namespace, and named operations on it.

use crate::netns::Netns;
use cni_protocol::CniError;
use futures::{StreamExt, TryStreamExt};
use ipnetwork::IpNetwork;
use netlink_packet_route::address::{
    AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage,
};
use netlink_packet_route::link::{
    AfSpecBridge, BridgeVlanInfoFlags, InfoData, InfoKind, InfoVeth, LinkAttribute, LinkExtentMask,
    LinkFlags, LinkInfo, State,
};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteProtocol, RouteScope};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use once_cell::sync::Lazy;
use rtnetlink::packet_core::{
    NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_REQUEST,
};
use rtnetlink::{
    Handle, LinkBridge, LinkBridgePort, LinkBridgeVlan, LinkMessageBuilder, LinkUnspec, LinkVeth,
    RouteMessageBuilder,
};
use std::future::Future;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;

/// A link as the kernel describes it.
pub use netlink_packet_route::link::LinkMessage;

/// One single-threaded runtime per process drives every netlink socket.
static RUNTIME: Lazy<Runtime> = Lazy::new(|| {
    tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .expect("a current-thread tokio runtime")
});

/// A netlink socket bound to the namespace it was opened in.
#[derive(Clone)]
pub struct Netlink {
    handle: Handle,
}

pub fn nl_err(what: impl std::fmt::Display) -> impl FnOnce(rtnetlink::Error) -> CniError {
    move |e| CniError::io(format!("{what}: {e}"))
}

impl Netlink {
    /// A socket in the calling thread's namespace.
    pub fn open() -> Result<Netlink, CniError> {
        let _ctx = RUNTIME.enter();
        let (conn, handle, _) = rtnetlink::new_connection()
            .map_err(|e| CniError::io(format!("opening a netlink socket: {e}")))?;
        RUNTIME.spawn(conn);
        Ok(Netlink { handle })
    }

    /// A socket inside `ns`: it stays bound there after the thread returns.
    pub fn open_in(ns: &Netns) -> Result<Netlink, CniError> {
        ns.run(Self::open)?
    }

    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    /// Runs netlink work to completion; for callers that overlap several requests.
    pub fn block_on<F: Future>(&self, f: F) -> F::Output {
        RUNTIME.block_on(f)
    }

    /// The link called `name`, or None.
    pub fn link_by_name(&self, name: &str) -> Result<Option<LinkMessage>, CniError> {
        // Without the counters, which nothing here reads: less for the kernel to fill.
        let mut req = self
            .handle
            .link()
            .get()
            .set_filter_mask(AddressFamily::Unspec, vec![LinkExtentMask::SkipStats])
            .match_name(name.to_string())
            .execute();
        match self.block_on(req.try_next()) {
            Ok(link) => Ok(link),
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc_enodev() => Ok(None),
            Err(e) => Err(CniError::io(format!("looking up link {name}: {e}"))),
        }
    }

    pub fn set_up(&self, index: u32, up: bool) -> Result<(), CniError> {
        let builder = LinkUnspec::new_with_index(index);
        let msg = if up { builder.up() } else { builder.down() }.build();
        self.block_on(self.handle.link().set(msg).execute())
            .map_err(nl_err(format!(
                "setting link {index} {}",
                if up { "up" } else { "down" }
            )))
    }

    /// The addresses on a link, with their prefix lengths.
    pub fn addresses(&self, index: u32) -> Result<Vec<IpNetwork>, CniError> {
        Ok(self
            .address_infos(index)?
            .into_iter()
            .map(|a| a.address)
            .collect())
    }
}

fn libc_enodev() -> i32 {
    nix::errno::Errno::ENODEV as i32
}

/// Whether the link is administratively up.
pub fn is_up(link: &LinkMessage) -> bool {
    link.header.flags.contains(LinkFlags::Up)
}

/// The link's MAC address as `aa:bb:cc:dd:ee:ff`, or empty.
pub fn mac_of(link: &LinkMessage) -> String {
    link.attributes
        .iter()
        .find_map(|a| match a {
            LinkAttribute::Address(bytes) => Some(
                bytes
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<Vec<_>>()
                    .join(":"),
            ),
            _ => None,
        })
        .unwrap_or_default()
}

pub fn name_of(link: &LinkMessage) -> String {
    link.attributes
        .iter()
        .find_map(|a| match a {
            LinkAttribute::IfName(n) => Some(n.clone()),
            _ => None,
        })
        .unwrap_or_default()
}

// ---- Links, addresses, routes and bridge ports: what a bridge plugin asks of the kernel. ----

/// The errno a netlink error carries, positive.
fn errno_of(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(m) => Some(-m.raw_code()),
        _ => None,
    }
}

const EEXIST: i32 = nix::errno::Errno::EEXIST as i32;
const ENODEV: i32 = nix::errno::Errno::ENODEV as i32;
const EADDRNOTAVAIL: i32 = nix::errno::Errno::EADDRNOTAVAIL as i32;
const ESRCH: i32 = nix::errno::Errno::ESRCH as i32;

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

/// A veth pair made by one RTM_NEWLINK: this end in the socket's namespace, the peer created
/// directly inside `peer_ns` (it never appears in this namespace).
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

/// An address with its kernel flags (tentative, DAD failed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressInfo {
    pub address: IpNetwork,
    pub flags: AddressFlags,
}

impl AddressInfo {
    pub fn tentative(&self) -> bool {
        self.flags.contains(AddressFlags::Tentative)
    }
    pub fn dad_failed(&self) -> bool {
        self.flags.contains(AddressFlags::Dadfailed)
    }
}

/// A route of the main table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteInfo {
    pub dst: IpNetwork,
    pub gw: Option<IpAddr>,
    pub oif: Option<u32>,
}

impl Netlink {
    /// Sends one request and waits for its acknowledgement.
    fn ack(&self, msg: RouteNetlinkMessage, flags: u16) -> Result<(), rtnetlink::Error> {
        let mut req = NetlinkMessage::from(msg);
        req.header.flags = flags;
        let mut handle = self.handle.clone();
        self.block_on(async move {
            let mut resp = handle.request(req)?;
            while let Some(m) = resp.next().await {
                if let NetlinkPayload::Error(e) = m.payload {
                    if e.code.is_some() {
                        return Err(rtnetlink::Error::NetlinkError(e));
                    }
                }
            }
            Ok(())
        })
    }

    /// The link with index `index`, or None.
    pub fn link_by_index(&self, index: u32) -> Result<Option<LinkMessage>, CniError> {
        let mut req = self
            .handle
            .link()
            .get()
            .set_filter_mask(AddressFamily::Unspec, vec![LinkExtentMask::SkipStats])
            .match_index(index)
            .execute();
        match self.block_on(req.try_next()) {
            Ok(link) => Ok(link),
            Err(e) if errno_of(&e) == Some(ENODEV) => Ok(None),
            Err(e) => Err(CniError::io(format!("looking up link {index}: {e}"))),
        }
    }

    /// Creates the bridge; false when a link of that name already exists.
    pub fn create_bridge(&self, spec: &BridgeSpec) -> Result<bool, CniError> {
        let mut b = LinkBridge::new(spec.name).address(spec.mac.to_vec());
        if let Some(mtu) = spec.mtu {
            b = b.mtu(mtu);
        }
        if spec.promisc {
            b = b.promiscuous(true);
        }
        if spec.vlan_filtering {
            b = b.vlan_filtering(true);
        }
        match self.block_on(self.handle.link().add(b.build()).execute()) {
            Ok(()) => Ok(true),
            Err(e) if errno_of(&e) == Some(EEXIST) => Ok(false),
            Err(e) => Err(CniError::io(format!("creating bridge {}: {e}", spec.name))),
        }
    }

    /// Creates the veth pair; false when one of the two names is taken.
    pub fn create_veth(&self, spec: &VethSpec) -> Result<bool, CniError> {
        let mut peer = LinkMessageBuilder::<rtnetlink::LinkUnspec>::new()
            .name(spec.peer_name)
            .setns_by_fd(spec.peer_ns.file().as_raw_fd());
        if let Some(mtu) = spec.mtu {
            peer = peer.mtu(mtu);
        }
        if let Some(mac) = spec.peer_mac {
            peer = peer.address(mac.to_vec());
        }
        let mut b = LinkVeth::new(spec.name, spec.peer_name)
            .set_info_data(InfoData::Veth(InfoVeth::Peer(peer.build())));
        if let Some(mtu) = spec.mtu {
            b = b.mtu(mtu);
        }
        if let Some(master) = spec.controller {
            b = b.controller(master);
        }
        if spec.up {
            b = b.up();
        }
        match self.block_on(self.handle.link().add(b.build()).execute()) {
            Ok(()) => Ok(true),
            Err(e) if errno_of(&e) == Some(EEXIST) => Ok(false),
            Err(e) => Err(CniError::io(format!(
                "creating veth pair {} / {} (in {}): {e}",
                spec.name,
                spec.peer_name,
                spec.peer_ns.path().display()
            ))),
        }
    }

    pub fn set_promisc(&self, index: u32, on: bool) -> Result<(), CniError> {
        let msg = LinkUnspec::new_with_index(index).promiscuous(on).build();
        self.block_on(self.handle.link().set(msg).execute())
            .map_err(nl_err(format!("setting promiscuous mode on link {index}")))
    }

    pub fn set_mac(&self, index: u32, mac: &[u8]) -> Result<(), CniError> {
        let msg = LinkUnspec::new_with_index(index)
            .address(mac.to_vec())
            .build();
        self.block_on(self.handle.link().set(msg).execute())
            .map_err(nl_err(format!("setting the MAC of link {index}")))
    }

    /// Bridge port flags: hairpin (IFLA_BRPORT_MODE) and isolation (IFLA_BRPORT_ISOLATED).
    pub fn set_bridge_port(
        &self,
        index: u32,
        hairpin: bool,
        isolated: bool,
    ) -> Result<(), CniError> {
        let msg = LinkBridgePort::new(index)
            .hairpin(hairpin)
            .isolated(isolated)
            .build();
        self.block_on(self.handle.link().set_port(msg).execute())
            .map_err(nl_err(format!("setting bridge port flags of link {index}")))
    }

    /// The VLAN IDs a bridge port carries.
    pub fn bridge_vlans(&self, index: u32) -> Result<Vec<u16>, CniError> {
        let links: Vec<LinkMessage> = self
            .block_on(
                self.handle
                    .link()
                    .get()
                    .set_filter_mask(AddressFamily::Bridge, vec![LinkExtentMask::Brvlan])
                    .execute()
                    .try_collect(),
            )
            .map_err(nl_err(format!("listing the VLANs of bridge port {index}")))?;
        Ok(links
            .iter()
            .filter(|l| l.header.index == index)
            .flat_map(|l| l.attributes.iter())
            .filter_map(|a| match a {
                LinkAttribute::AfSpecBridge(specs) => Some(specs),
                _ => None,
            })
            .flatten()
            .filter_map(|s| match s {
                AfSpecBridge::VlanInfo(v) => Some(v.vid),
                _ => None,
            })
            .collect())
    }

    /// Adds VLANs to a bridge port in one request: `access` makes them untagged PVIDs (an
    /// access port has one), else they are tagged (a trunk).
    pub fn add_bridge_vlans(&self, index: u32, vids: &[u16], access: bool) -> Result<(), CniError> {
        let flags = if access {
            BridgeVlanInfoFlags::Pvid | BridgeVlanInfoFlags::Untagged
        } else {
            BridgeVlanInfoFlags::empty()
        };
        let msg = vids
            .iter()
            .fold(LinkBridgeVlan::new(index), |b, vid| b.vlan(*vid, flags))
            .build();
        self.block_on(self.handle.link().set(msg).execute())
            .map_err(nl_err(format!(
                "adding VLANs {vids:?} to bridge port {index}"
            )))
    }

    /// Removes VLANs from a bridge port in one request.
    pub fn del_bridge_vlans(&self, index: u32, vids: &[u16]) -> Result<(), CniError> {
        let msg = vids
            .iter()
            .fold(LinkBridgeVlan::new(index), |b, vid| {
                b.vlan(*vid, BridgeVlanInfoFlags::empty())
            })
            .build();
        self.block_on(self.handle.link().del_with_message(msg).execute())
            .map_err(nl_err(format!(
                "removing VLANs {vids:?} from bridge port {index}"
            )))
    }

    /// Adds an address; false when the link already has it.
    pub fn add_address(&self, index: u32, addr: IpNetwork) -> Result<bool, CniError> {
        let req = self.handle.address().add(index, addr.ip(), addr.prefix());
        match self.block_on(req.execute()) {
            Ok(()) => Ok(true),
            Err(e) if errno_of(&e) == Some(EEXIST) => Ok(false),
            Err(e) => Err(CniError::io(format!(
                "adding address {addr} to link {index}: {e}"
            ))),
        }
    }

    /// Removes an address; already gone is no error.
    pub fn del_address(&self, index: u32, addr: IpNetwork) -> Result<(), CniError> {
        let mut msg = AddressMessage::default();
        msg.header.index = index;
        msg.header.prefix_len = addr.prefix();
        msg.header.family = if addr.is_ipv4() {
            AddressFamily::Inet
        } else {
            AddressFamily::Inet6
        };
        msg.attributes.push(AddressAttribute::Local(addr.ip()));
        msg.attributes.push(AddressAttribute::Address(addr.ip()));
        match self.block_on(self.handle.address().del(msg).execute()) {
            Ok(()) => Ok(()),
            Err(e) if errno_of(&e) == Some(EADDRNOTAVAIL) => Ok(()),
            Err(e) => Err(CniError::io(format!(
                "removing address {addr} from link {index}: {e}"
            ))),
        }
    }

    /// The addresses on a link with their flags.
    pub fn address_infos(&self, index: u32) -> Result<Vec<AddressInfo>, CniError> {
        let msgs: Vec<_> = self
            .block_on(
                self.handle
                    .address()
                    .get()
                    .set_link_index_filter(index)
                    .execute()
                    .try_collect::<Vec<_>>(),
            )
            .map_err(nl_err(format!("listing addresses of link {index}")))?;
        Ok(msgs
            .iter()
            .filter(|m| m.header.index == index)
            .filter_map(|m| {
                let mut ip = None;
                let mut flags = AddressFlags::from_bits_retain(u32::from(
                    AddressHeaderFlags::bits(&m.header.flags),
                ));
                for a in &m.attributes {
                    match a {
                        AddressAttribute::Address(a) if ip.is_none() => ip = Some(*a),
                        AddressAttribute::Local(a) => ip = Some(*a),
                        AddressAttribute::Flags(f) => flags = *f,
                        _ => {}
                    }
                }
                Some(AddressInfo {
                    address: IpNetwork::new(ip?, m.header.prefix_len).ok()?,
                    flags,
                })
            })
            .collect())
    }

    /// Adds a route through `index` (ECMP-append as the Go plugin does); already there is fine.
    pub fn add_route(
        &self,
        index: u32,
        dst: IpNetwork,
        gw: Option<IpAddr>,
    ) -> Result<(), CniError> {
        let what = || match gw {
            Some(g) => format!("adding route {dst} via {g} dev {index}"),
            None => format!("adding route {dst} dev {index}"),
        };
        let mut b = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(dst.network(), dst.prefix())
            .map_err(|e| CniError::invalid_config(format!("{}: {e}", what())))?
            .output_interface(index)
            .protocol(RouteProtocol::Boot);
        b = match gw {
            Some(g) => b
                .gateway(g)
                .map_err(|e| CniError::invalid_config(format!("{}: {e}", what())))?,
            None => b.scope(RouteScope::Link),
        };
        match self.ack(
            RouteNetlinkMessage::NewRoute(b.build()),
            NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE,
        ) {
            Ok(()) => Ok(()),
            Err(e) if errno_of(&e) == Some(EEXIST) => Ok(()),
            Err(e) => Err(CniError::io(format!("{}: {e}", what()))),
        }
    }

    /// The main table's routes of both families.
    pub fn routes(&self) -> Result<Vec<RouteInfo>, CniError> {
        let mut out = Vec::new();
        for msg in [
            RouteMessageBuilder::<std::net::Ipv4Addr>::new().build(),
            RouteMessageBuilder::<std::net::Ipv6Addr>::new().build(),
        ] {
            let routes: Vec<_> = self
                .block_on(
                    self.handle
                        .route()
                        .get(msg)
                        .execute()
                        .try_collect::<Vec<_>>(),
                )
                .map_err(nl_err("listing routes"))?;
            for r in routes {
                let mut table = u32::from(r.header.table);
                let (mut dst, mut gw, mut oif) = (None, None, None);
                for a in &r.attributes {
                    match a {
                        RouteAttribute::Destination(d) => dst = route_ip(d),
                        RouteAttribute::Gateway(g) => gw = route_ip(g),
                        RouteAttribute::Oif(i) => oif = Some(*i),
                        RouteAttribute::Table(t) => table = *t,
                        _ => {}
                    }
                }
                if table != u32::from(netlink_packet_route::route::RouteHeader::RT_TABLE_MAIN) {
                    continue;
                }
                let dst = match (dst, r.header.address_family) {
                    (Some(d), _) => d,
                    (None, AddressFamily::Inet) => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
                    (None, _) => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
                };
                if let Ok(dst) = IpNetwork::new(dst, r.header.destination_prefix_length) {
                    out.push(RouteInfo { dst, gw, oif });
                }
            }
        }
        Ok(out)
    }

    /// Deletes a link (and a veth's peer with it); false when it was already gone.
    pub fn delete_link(&self, index: u32) -> Result<bool, CniError> {
        match self.block_on(self.handle.link().del(index).execute()) {
            Ok(()) => Ok(true),
            Err(e) if matches!(errno_of(&e), Some(ENODEV) | Some(ESRCH)) => Ok(false),
            Err(e) => Err(CniError::io(format!("deleting link {index}: {e}"))),
        }
    }

    /// Deletes a link of the namespace `ns` (this socket's) and returns as soon as it is gone
    /// from it: unlisted, its name free, off its bridge, its addresses and routes flushed.
    /// What the kernel does after that (an RCU barrier and the final free, about 20 ms for a
    /// veth pair) is waited for by a detached child process that holds none of the caller's
    /// descriptors, so the runtime does not wait for it. False when the link was already gone.
    pub fn delete_link_detached(&self, ns: &Netns, index: u32) -> Result<bool, CniError> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        let mut req = NetlinkMessage::from(RouteNetlinkMessage::DelLink(msg));
        req.header.flags = NLM_F_REQUEST | NLM_F_ACK;
        req.finalize();
        let mut bytes = vec![0u8; req.buffer_len()];
        req.serialize(&mut bytes);
        let sock = ns
            .run(|| {
                nix::sys::socket::socket(
                    nix::sys::socket::AddressFamily::Netlink,
                    nix::sys::socket::SockType::Raw,
                    nix::sys::socket::SockFlag::SOCK_CLOEXEC,
                    nix::sys::socket::SockProtocol::NetlinkRoute,
                )
            })?
            .map_err(|e| CniError::io(format!("opening a netlink socket: {e}")))?;
        // SAFETY: the child only makes raw system calls (dup2, close_range, send, _exit) on
        // memory prepared before the fork, as a child of a multithreaded process may.
        let child = match unsafe { nix::unistd::fork() } {
            Ok(nix::unistd::ForkResult::Child) => unsafe {
                use nix::libc;
                libc::dup2(sock.as_raw_fd(), 0);
                libc::syscall(libc::SYS_close_range, 1u32, u32::MAX, 0u32);
                libc::send(0, bytes.as_ptr().cast(), bytes.len(), 0);
                libc::_exit(0)
            },
            Ok(nix::unistd::ForkResult::Parent { child }) => child,
            // No child: delete here and wait for the kernel.
            Err(_) => return self.delete_link(index),
        };
        drop(sock);
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut pause = Duration::from_micros(100);
        loop {
            if self.link_by_index(index)?.is_none() {
                return Ok(true);
            }
            let exited = !matches!(
                nix::sys::wait::waitpid(child, Some(nix::sys::wait::WaitPidFlag::WNOHANG)),
                Ok(nix::sys::wait::WaitStatus::StillAlive)
            );
            if exited || Instant::now() >= deadline {
                // The child is done (or stuck) and the link is still there: delete it here,
                // which reports why it cannot go.
                return self.delete_link(index);
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(5));
        }
    }

    /// Waits until the link's operational state is up (a veth is once both ends are up).
    pub fn wait_oper_up(&self, index: u32, timeout: Duration) -> Result<LinkMessage, CniError> {
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_micros(200);
        loop {
            let link = self
                .link_by_index(index)?
                .ok_or_else(|| CniError::io(format!("link {index} disappeared")))?;
            if is_oper_up(&link) {
                return Ok(link);
            }
            if Instant::now() >= deadline {
                return Err(CniError::io(format!(
                    "link {} ({index}) is not operationally up after {timeout:?}: {:?}",
                    name_of(&link),
                    oper_state(&link)
                )));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }
}

fn route_ip(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

/// The link's kind (`bridge`, `veth`, ...), if it has one.
pub fn kind_of(link: &LinkMessage) -> Option<&InfoKind> {
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::LinkInfo(infos) => infos.iter().find_map(|i| match i {
            LinkInfo::Kind(k) => Some(k),
            _ => None,
        }),
        _ => None,
    })
}

pub fn is_bridge(link: &LinkMessage) -> bool {
    matches!(kind_of(link), Some(InfoKind::Bridge))
}

pub fn is_veth(link: &LinkMessage) -> bool {
    matches!(kind_of(link), Some(InfoKind::Veth))
}

/// The master (bridge) index of a port.
pub fn controller_of(link: &LinkMessage) -> Option<u32> {
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::Controller(i) => Some(*i),
        _ => None,
    })
}

/// A veth's peer index (IFLA_LINK), valid in the peer's namespace.
pub fn peer_index_of(link: &LinkMessage) -> Option<u32> {
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::Link(i) => Some(*i),
        _ => None,
    })
}

pub fn oper_state(link: &LinkMessage) -> Option<State> {
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::OperState(s) => Some(*s),
        _ => None,
    })
}

pub fn is_oper_up(link: &LinkMessage) -> bool {
    oper_state(link) == Some(State::Up)
}

pub fn is_promisc(link: &LinkMessage) -> bool {
    link.header.flags.contains(LinkFlags::Promisc)
}

/// The link's MAC address bytes, if it has one.
pub fn mac_bytes(link: &LinkMessage) -> Option<&[u8]> {
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::Address(b) => Some(b.as_slice()),
        _ => None,
    })
}
