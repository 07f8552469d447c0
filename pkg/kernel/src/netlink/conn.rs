//! The async core: one rtnetlink connection, bound to the namespace it was opened in, with
//! named operations on it. Any number of operations may be in flight at once on one
//! connection; the kernel answers each by its sequence number.

use super::nexthop::{self, Rtnl};
use super::parse;
use super::types::{
    format_mac, AddressInfo, BridgeSpec, FdbEntry, Link, LinkKind, LinkSpec, Neighbour, Nexthop,
    Route, VethSpec, Vxlan, MAIN_TABLE,
};
use crate::error::{Error, Result};
use crate::netns::Netns;
use futures::{Future, StreamExt};
use ipnetwork::IpNetwork;
use netlink_packet_route::address::AddressMessage;
use netlink_packet_route::link::{
    AfSpecBridge, BridgeVlanInfoFlags, InfoData, InfoKind, InfoVeth, LinkAttribute, LinkExtentMask,
    LinkMessage,
};
use netlink_packet_route::neighbour::NeighbourMessage;
use netlink_packet_route::route::{RouteMessage, RouteProtocol};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use nix::errno::Errno;
use rtnetlink::packet_core::{
    NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REPLACE,
    NLM_F_REQUEST,
};
use rtnetlink::proto::ConnectionHandle;
use rtnetlink::sys::{protocols::NETLINK_ROUTE, SocketAddr};
use rtnetlink::{
    LinkBridge, LinkBridgePort, LinkBridgeVlan, LinkMessageBuilder, LinkUnspec, LinkVeth, LinkVxlan,
};
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::task::{Context, Poll};

/// How many requests one bulk operation keeps in flight: enough to keep the kernel busy, few
/// enough that their answers fit the socket's receive buffer.
const WINDOW: usize = 128;

/// How many requests [`Conn::write`] puts in one datagram: the kernel handles them all in
/// one system call, and the connection's task wakes once for their answers.
const BATCH: usize = 64;

/// A connection to the kernel's routing subsystem in one namespace. Clones share it.
#[derive(Clone)]
pub struct Conn {
    handle: ConnectionHandle<Rtnl>,
}

/// The future that reads and writes a connection's socket; it must be polled (spawned) for
/// any request on the connection to complete, and ends when every `Conn` clone is gone.
pub struct Driver(rtnetlink::proto::Connection<Rtnl>);

impl Future for Driver {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        Pin::new(&mut self.0).poll(cx)
    }
}

/// Why a request failed, before it is said what the request was.
pub(super) enum Fail {
    Errno(Errno),
    Closed,
}

impl Fail {
    fn errno(&self) -> Option<Errno> {
        match self {
            Fail::Errno(e) => Some(*e),
            Fail::Closed => None,
        }
    }

    fn into_error(self, op: &str, object: impl std::fmt::Display) -> Error {
        match self {
            Fail::Errno(e) => Error::os(op, object, e),
            Fail::Closed => Error::failed(op, object, "the netlink connection is closed"),
        }
    }
}

/// `Ok(true)` when the request went through, `Ok(false)` when it failed with `quiet` (the
/// kernel saying there was nothing to do), the error otherwise.
fn changed(
    r: Result<(), Fail>,
    quiet: &[Errno],
    op: &str,
    object: impl std::fmt::Display,
) -> Result<bool> {
    match r {
        Ok(()) => Ok(true),
        Err(f) if f.errno().is_some_and(|e| quiet.contains(&e)) => Ok(false),
        Err(f) => Err(f.into_error(op, object)),
    }
}

fn ip_of(net: IpNetwork) -> String {
    net.to_string()
}

impl Conn {
    /// A connection in the calling thread's namespace and the future that drives it. Must be
    /// called inside a tokio runtime (its socket registers with the runtime's reactor).
    pub fn connect() -> Result<(Conn, Driver)> {
        let (conn, handle, _) = rtnetlink::proto::new_connection::<Rtnl>(NETLINK_ROUTE)
            .map_err(|e| Error::io("opening", "a netlink socket", &e))?;
        Ok((Conn { handle }, Driver(conn)))
    }

    /// A connection in the calling thread's namespace, driven by a task spawned on the
    /// current tokio runtime.
    pub fn open() -> Result<Conn> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| Error::failed("opening", "a netlink connection", e))?;
        let (conn, driver) = Self::connect()?;
        runtime.spawn(driver);
        Ok(conn)
    }

    /// A connection inside `ns`: its socket stays bound there whatever thread uses it.
    pub fn open_in(ns: &Netns) -> Result<Conn> {
        ns.run(Self::open)?
    }

    /// Sends one request and collects what comes back, failing with the kernel's errno.
    async fn request(
        &self,
        msg: RouteNetlinkMessage,
        flags: u16,
    ) -> Result<Vec<RouteNetlinkMessage>, Fail> {
        self.request_map(msg, flags, Some).await
    }

    /// Sends one request and keeps what `keep` makes of each of rtnetlink's answers as it
    /// arrives (a dump of thousands of entries is never held whole in the kernel's form).
    async fn request_map<T>(
        &self,
        msg: RouteNetlinkMessage,
        flags: u16,
        mut keep: impl FnMut(RouteNetlinkMessage) -> Option<T>,
    ) -> Result<Vec<T>, Fail> {
        self.exchange(msg.into(), flags, |m| match m {
            Rtnl::Route(m) => keep(m),
            _ => None,
        })
        .await
    }

    /// Sends one request of any kind and keeps what `keep` makes of each answer.
    async fn exchange<T>(
        &self,
        msg: Rtnl,
        flags: u16,
        mut keep: impl FnMut(Rtnl) -> Option<T>,
    ) -> Result<Vec<T>, Fail> {
        let mut req = NetlinkMessage::from(msg);
        req.header.flags = flags;
        let mut resp = self
            .handle
            .request(req, SocketAddr::new(0, 0))
            .map_err(|_| Fail::Closed)?;
        let mut out = Vec::new();
        while let Some(m) = resp.next().await {
            match m.payload {
                NetlinkPayload::Error(e) => {
                    if let Some(code) = e.code {
                        return Err(Fail::Errno(Errno::from_raw(-code.get())));
                    }
                }
                NetlinkPayload::InnerMessage(m) => out.extend(keep(m)),
                _ => {}
            }
        }
        Ok(out)
    }

    /// A request the kernel acknowledges; `flags` beyond REQUEST and ACK.
    async fn ack(&self, msg: impl Into<Rtnl>, flags: u16) -> Result<(), Fail> {
        self.exchange(
            msg.into(),
            NLM_F_REQUEST | NLM_F_ACK | flags,
            |_| None::<()>,
        )
        .await
        .map(|_| ())
    }

    async fn dump(&self, msg: RouteNetlinkMessage) -> Result<Vec<RouteNetlinkMessage>, Fail> {
        self.request(msg, NLM_F_REQUEST | NLM_F_DUMP).await
    }

    async fn dump_map<T>(
        &self,
        msg: RouteNetlinkMessage,
        keep: impl FnMut(RouteNetlinkMessage) -> Option<T>,
    ) -> Result<Vec<T>, Fail> {
        self.request_map(msg, NLM_F_REQUEST | NLM_F_DUMP, keep)
            .await
    }

    /// One object by its key; None when the kernel has none (`absent`).
    async fn get(
        &self,
        msg: RouteNetlinkMessage,
        absent: &[Errno],
    ) -> Result<Option<RouteNetlinkMessage>, Fail> {
        match self.request(msg, NLM_F_REQUEST).await {
            Ok(mut v) => Ok(v.pop()),
            Err(Fail::Errno(e)) if absent.contains(&e) => Ok(None),
            Err(f) => Err(f),
        }
    }

    // ---- Links ----

    async fn get_link(&self, mut msg: LinkMessage, what: &str) -> Result<Option<Link>> {
        // Without the counters, which nothing here reads: less for the kernel to fill.
        msg.attributes
            .push(LinkAttribute::ExtMask(vec![LinkExtentMask::SkipStats]));
        match self
            .get(RouteNetlinkMessage::GetLink(msg), &[Errno::ENODEV])
            .await
        {
            Ok(Some(RouteNetlinkMessage::NewLink(l))) => Ok(Some(parse::link(&l))),
            Ok(_) => Ok(None),
            Err(f) => Err(f.into_error("looking up link", what)),
        }
    }

    /// The link called `name`, or None.
    pub async fn link_by_name(&self, name: &str) -> Result<Option<Link>> {
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        self.get_link(msg, name).await
    }

    /// The link with index `index`, or None.
    pub async fn link_by_index(&self, index: u32) -> Result<Option<Link>> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        self.get_link(msg, &index.to_string()).await
    }

    /// Every link of the namespace.
    pub async fn links(&self) -> Result<Vec<Link>> {
        let mut msg = LinkMessage::default();
        msg.attributes
            .push(LinkAttribute::ExtMask(vec![LinkExtentMask::SkipStats]));
        let msgs = self
            .dump(RouteNetlinkMessage::GetLink(msg))
            .await
            .map_err(|f| f.into_error("listing", "links"))?;
        Ok(msgs
            .iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => Some(parse::link(l)),
                _ => None,
            })
            .collect())
    }

    async fn set_link(&self, msg: LinkMessage, op: &str, index: u32) -> Result<()> {
        self.ack(RouteNetlinkMessage::SetLink(msg), 0)
            .await
            .map_err(|f| f.into_error(op, format!("of link {index}")))
    }

    pub async fn set_up(&self, index: u32, up: bool) -> Result<()> {
        let b = LinkUnspec::new_with_index(index);
        let msg = if up { b.up() } else { b.down() }.build();
        let op = if up { "setting up" } else { "setting down" };
        self.ack(RouteNetlinkMessage::SetLink(msg), 0)
            .await
            .map_err(|f| f.into_error(op, format!("link {index}")))
    }

    pub async fn set_promisc(&self, index: u32, on: bool) -> Result<()> {
        let msg = LinkUnspec::new_with_index(index).promiscuous(on).build();
        self.set_link(msg, "setting the promiscuous mode", index)
            .await
    }

    pub async fn set_mac(&self, index: u32, mac: &[u8]) -> Result<()> {
        let msg = LinkUnspec::new_with_index(index)
            .address(mac.to_vec())
            .build();
        self.set_link(msg, "setting the MAC", index).await
    }

    pub async fn set_mtu(&self, index: u32, mtu: u32) -> Result<()> {
        let msg = LinkUnspec::new_with_index(index).mtu(mtu).build();
        self.set_link(msg, "setting the MTU", index).await
    }

    async fn new_link(&self, msg: LinkMessage, op: &str, object: &str) -> Result<bool> {
        let r = self
            .ack(RouteNetlinkMessage::NewLink(msg), NLM_F_CREATE | NLM_F_EXCL)
            .await;
        changed(r, &[Errno::EEXIST], op, object)
    }

    /// Creates the bridge; false when a link of that name already exists.
    pub async fn create_bridge(&self, spec: &BridgeSpec<'_>) -> Result<bool> {
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
        self.new_link(b.build(), "creating bridge", spec.name).await
    }

    /// Creates the veth pair; false when one of the two names is taken.
    pub async fn create_veth(&self, spec: &VethSpec<'_>) -> Result<bool> {
        let mut peer = LinkMessageBuilder::<LinkUnspec>::new()
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
        let object = format!(
            "{} / {} (in {})",
            spec.name,
            spec.peer_name,
            spec.peer_ns.path().display()
        );
        self.new_link(b.build(), "creating veth pair", &object)
            .await
    }

    /// Makes the link `spec` says, everything in one message; false when a link of that name
    /// already exists. A kernel without the kind refuses with EOPNOTSUPP.
    pub async fn create_link(&self, spec: &LinkSpec) -> Result<bool> {
        fn with_common<T>(mut b: LinkMessageBuilder<T>, spec: &LinkSpec) -> LinkMessage {
            if let Some(mtu) = spec.mtu {
                b = b.mtu(mtu);
            }
            if let Some(mac) = spec.mac {
                b = b.address(mac.to_vec());
            }
            b.build()
        }
        let msg = match &spec.kind {
            LinkKind::Named(kind) => with_common(
                LinkMessageBuilder::<LinkUnspec>::new_with_info_kind(InfoKind::from(*kind))
                    .name(spec.name.clone()),
                spec,
            ),
            LinkKind::Vxlan(v) => with_common(vxlan_link(&spec.name, v), spec),
        };
        let op = format!("creating {} device", spec.kind.name());
        self.new_link(msg, &op, &spec.name).await
    }

    /// The link as `spec` says, and whether anything had to change: made when missing, its
    /// MTU and MAC set when only they differ, deleted and made again when the attributes of
    /// its kind differ. A link of that name of another kind is left alone and refused.
    pub async fn ensure_link(&self, spec: &LinkSpec) -> Result<(Link, bool)> {
        let op = format!("making {} device", spec.kind.name());
        let mut changed = false;
        if let Some(have) = self.link_by_name(&spec.name).await? {
            if spec.differences(&have).is_empty() {
                return Ok((have, false));
            }
            if have.kind.as_deref() != Some(spec.kind.name()) {
                return Err(Error::invalid(
                    &op,
                    &spec.name,
                    format!(
                        "a link of that name exists and is a {} device",
                        have.kind.as_deref().unwrap_or("plain")
                    ),
                ));
            }
            if spec.mendable(&have) {
                if let Some(mtu) = spec.mtu.filter(|m| have.mtu != Some(*m)) {
                    self.set_mtu(have.index, mtu).await?;
                }
                if let Some(mac) = spec.mac.filter(|m| have.mac != m.as_slice()) {
                    self.set_mac(have.index, &mac).await?;
                }
                let now = self.link_by_name(&spec.name).await?;
                return now
                    .map(|l| (l, true))
                    .ok_or_else(|| Error::failed(&op, &spec.name, "it vanished"));
            }
            self.delete_link(have.index).await?;
            changed = true;
        }
        changed |= self.create_link(spec).await?;
        let made = self
            .link_by_name(&spec.name)
            .await?
            .ok_or_else(|| Error::failed(&op, &spec.name, "it vanished after creation"))?;
        Ok((made, changed))
    }

    /// Deletes a link (and a veth's peer with it); false when it was already gone.
    pub async fn delete_link(&self, index: u32) -> Result<bool> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        let r = self.ack(RouteNetlinkMessage::DelLink(msg), 0).await;
        changed(r, &[Errno::ENODEV, Errno::ESRCH], "deleting link", index)
    }

    // ---- Bridge ports ----

    /// Bridge port flags: hairpin (IFLA_BRPORT_MODE) and isolation (IFLA_BRPORT_ISOLATED).
    pub async fn set_bridge_port(&self, index: u32, hairpin: bool, isolated: bool) -> Result<()> {
        let msg = LinkBridgePort::new(index)
            .hairpin(hairpin)
            .isolated(isolated)
            .build();
        self.ack(RouteNetlinkMessage::NewLink(msg), 0)
            .await
            .map_err(|f| f.into_error("setting the bridge port flags", format!("of link {index}")))
    }

    /// The VLAN IDs a bridge port carries.
    pub async fn bridge_vlans(&self, index: u32) -> Result<Vec<u16>> {
        let mut msg = LinkMessage::default();
        msg.header.interface_family = AddressFamily::Bridge;
        msg.attributes
            .push(LinkAttribute::ExtMask(vec![LinkExtentMask::Brvlan]));
        let links = self
            .dump(RouteNetlinkMessage::GetLink(msg))
            .await
            .map_err(|f| f.into_error("listing the VLANs", format!("of bridge port {index}")))?;
        Ok(links
            .iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) if l.header.index == index => Some(l),
                _ => None,
            })
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
    pub async fn add_bridge_vlans(&self, index: u32, vids: &[u16], access: bool) -> Result<()> {
        let flags = if access {
            BridgeVlanInfoFlags::Pvid | BridgeVlanInfoFlags::Untagged
        } else {
            BridgeVlanInfoFlags::empty()
        };
        let msg = vids
            .iter()
            .fold(LinkBridgeVlan::new(index), |b, vid| b.vlan(*vid, flags))
            .build();
        self.ack(RouteNetlinkMessage::SetLink(msg), 0)
            .await
            .map_err(|f| f.into_error("adding VLANs", format!("{vids:?} to bridge port {index}")))
    }

    /// Removes VLANs from a bridge port in one request.
    pub async fn del_bridge_vlans(&self, index: u32, vids: &[u16]) -> Result<()> {
        let msg = vids
            .iter()
            .fold(LinkBridgeVlan::new(index), |b, vid| {
                b.vlan(*vid, BridgeVlanInfoFlags::empty())
            })
            .build();
        self.ack(RouteNetlinkMessage::DelLink(msg), 0)
            .await
            .map_err(|f| {
                f.into_error(
                    "removing VLANs",
                    format!("{vids:?} from bridge port {index}"),
                )
            })
    }

    // ---- Addresses ----

    /// Adds an address; false when the link already has it.
    pub async fn add_address(&self, index: u32, addr: IpNetwork) -> Result<bool> {
        let msg = parse::address_message(index, addr, true);
        let r = self
            .ack(
                RouteNetlinkMessage::NewAddress(msg),
                NLM_F_CREATE | NLM_F_EXCL,
            )
            .await;
        changed(
            r,
            &[Errno::EEXIST],
            "adding address",
            format!("{addr} to link {index}"),
        )
    }

    /// Removes an address; false when it was already gone.
    pub async fn del_address(&self, index: u32, addr: IpNetwork) -> Result<bool> {
        let msg = parse::address_message(index, addr, false);
        let r = self.ack(RouteNetlinkMessage::DelAddress(msg), 0).await;
        changed(
            r,
            &[Errno::EADDRNOTAVAIL],
            "removing address",
            format!("{addr} from link {index}"),
        )
    }

    /// The addresses on a link with their flags.
    pub async fn address_infos(&self, index: u32) -> Result<Vec<AddressInfo>> {
        let mut msg = AddressMessage::default();
        msg.header.index = index;
        let msgs = self
            .dump(RouteNetlinkMessage::GetAddress(msg))
            .await
            .map_err(|f| f.into_error("listing addresses", format!("of link {index}")))?;
        Ok(msgs
            .iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewAddress(a) if a.header.index == index => parse::address(a),
                _ => None,
            })
            .collect())
    }

    /// The addresses on a link, with their prefix lengths.
    pub async fn addresses(&self, index: u32) -> Result<Vec<IpNetwork>> {
        Ok(self
            .address_infos(index)
            .await?
            .into_iter()
            .map(|a| a.address)
            .collect())
    }

    // ---- Routes ----

    /// Adds a route through `index` as the plugins do (`ip route add`, appended beside an
    /// IPv6 route to the same place); already there is fine.
    pub async fn add_route(&self, index: u32, dst: IpNetwork, gw: Option<IpAddr>) -> Result<()> {
        let route = Route::new(dst, gw, Some(index));
        if gw.is_some_and(|g| g.is_ipv4() != dst.is_ipv4()) {
            return Err(Error::invalid(
                "adding route",
                route_name(&route),
                "the gateway is not of the destination's family",
            ));
        }
        let msg = parse::route_message(&route, RouteProtocol::Boot);
        let r = self
            .ack(RouteNetlinkMessage::NewRoute(msg), NLM_F_CREATE)
            .await;
        changed(r, &[Errno::EEXIST], "adding route", route_name(&route)).map(|_| ())
    }

    /// The main table's routes of both families.
    pub async fn routes(&self) -> Result<Vec<Route>> {
        self.table_routes(MAIN_TABLE).await
    }

    /// The unicast routes of `table`, both families.
    pub async fn table_routes(&self, table: u32) -> Result<Vec<Route>> {
        let mut out = Vec::new();
        for family in [AddressFamily::Inet, AddressFamily::Inet6] {
            let mut msg = RouteMessage::default();
            msg.header.address_family = family;
            let routes = self
                .dump_map(RouteNetlinkMessage::GetRoute(msg), |m| match m {
                    RouteNetlinkMessage::NewRoute(r) => {
                        parse::route(&r).filter(|r| r.table == table)
                    }
                    _ => None,
                })
                .await
                .map_err(|f| f.into_error("listing", "routes"))?;
            out.extend(routes);
        }
        Ok(out)
    }

    /// The destinations of the main table's blackhole routes, both families.
    pub async fn blackholes(&self) -> Result<Vec<IpNetwork>> {
        let mut out = Vec::new();
        for family in [AddressFamily::Inet, AddressFamily::Inet6] {
            let mut msg = RouteMessage::default();
            msg.header.address_family = family;
            let found = self
                .dump_map(RouteNetlinkMessage::GetRoute(msg), |m| match m {
                    RouteNetlinkMessage::NewRoute(r) => parse::blackhole(&r, MAIN_TABLE),
                    _ => None,
                })
                .await
                .map_err(|f| f.into_error("listing", "blackhole routes"))?;
            out.extend(found);
        }
        Ok(out)
    }

    /// Adds a blackhole route to `dst` in the main table; false when a route to `dst` is there
    /// already, of whatever kind (a bridge's own route to its subnet, say).
    pub async fn add_blackhole(&self, dst: IpNetwork) -> Result<bool> {
        let msg = parse::blackhole_message(dst, MAIN_TABLE);
        let r = self
            .ack(
                RouteNetlinkMessage::NewRoute(msg),
                NLM_F_CREATE | NLM_F_EXCL,
            )
            .await;
        changed(r, &[Errno::EEXIST], "adding blackhole route", dst)
    }

    /// The route the kernel would send a packet to `ip` by, as `ip route get` asks it (rules
    /// and every table considered); None when `ip` is unreachable or local.
    pub async fn route_get(&self, ip: IpAddr) -> Result<Option<Route>> {
        let msg = RouteNetlinkMessage::GetRoute(parse::route_query(ip));
        let absent = [Errno::ENETUNREACH, Errno::EHOSTUNREACH, Errno::ESRCH];
        match self.get(msg, &absent).await {
            Ok(Some(RouteNetlinkMessage::NewRoute(r))) => Ok(parse::route(&r)),
            Ok(_) => Ok(None),
            Err(f) => Err(f.into_error("looking up the route to", ip)),
        }
    }

    /// Creates a route; false when one to the same destination is already in its table.
    pub async fn create_route(&self, route: &Route) -> Result<bool> {
        let msg = parse::route_message(route, RouteProtocol::Boot);
        let r = self
            .ack(
                RouteNetlinkMessage::NewRoute(msg),
                NLM_F_CREATE | NLM_F_EXCL,
            )
            .await;
        changed(r, &[Errno::EEXIST], "adding route", route_name(route))
    }

    /// Sets each route, replacing any other to the same destination in its table; true for
    /// each one that was not there already. Many at once, pipelined.
    pub async fn replace_routes(&self, routes: &[Route]) -> Result<Vec<bool>> {
        let mut tables: Vec<u32> = routes.iter().map(|r| r.table).collect();
        tables.sort_unstable();
        tables.dedup();
        let mut have = std::collections::HashSet::new();
        for t in tables {
            have.extend(self.table_routes(t).await?);
        }
        let ops: Vec<_> = routes
            .iter()
            .map(|r| self.replace_route_given(&have, r))
            .collect();
        pipelined(ops).await
    }

    /// Sets `route` unless it is among `have`, the routes already there.
    async fn replace_route_given(
        &self,
        have: &std::collections::HashSet<Route>,
        route: &Route,
    ) -> Result<bool> {
        self.write_unless(have.contains(route), Write::SetRoute(route))
            .await
    }

    /// Sets one route, replacing any other to the same destination; true when it changed.
    pub async fn replace_route(&self, route: &Route) -> Result<bool> {
        Ok(self.replace_routes(std::slice::from_ref(route)).await?[0])
    }

    /// Deletes a route (matched by destination and table, and by gateway and device where
    /// given); false when there was none.
    pub async fn delete_route(&self, route: &Route) -> Result<bool> {
        let r = self.ack(route_deletion(route), 0).await;
        changed(r, &[Errno::ESRCH], "deleting route", route_name(route))
    }

    /// Deletes many routes, pipelined; false for each that was not there.
    pub async fn delete_routes(&self, routes: &[Route]) -> Result<Vec<bool>> {
        let ops: Vec<_> = routes.iter().map(|r| self.delete_route(r)).collect();
        pipelined(ops).await
    }

    // ---- Nexthop objects ----

    /// Whether the kernel has nexthop objects (5.3 and later): it answers a question about
    /// one instead of refusing the message type. Meant to be asked once.
    pub async fn supports_nexthops(&self) -> Result<bool> {
        let r = self
            .exchange(
                Rtnl::GetNexthop(nexthop::by_id(u32::MAX)),
                NLM_F_REQUEST,
                |_| None::<()>,
            )
            .await;
        match r {
            Ok(_) | Err(Fail::Errno(Errno::ENOENT)) => Ok(true),
            Err(Fail::Errno(Errno::EOPNOTSUPP | Errno::EINVAL | Errno::EAFNOSUPPORT)) => Ok(false),
            Err(f) => Err(f.into_error("asking whether the kernel has", "nexthop objects")),
        }
    }

    /// Every nexthop object that is a gateway on a device, both families; none on a kernel
    /// without nexthop objects.
    pub async fn nexthops(&self) -> Result<Vec<Nexthop>> {
        let r = self
            .exchange(
                Rtnl::GetNexthop(nexthop::dump()),
                NLM_F_REQUEST | NLM_F_DUMP,
                |m| match m {
                    Rtnl::NewNexthop(n) => nexthop::nexthop(&n),
                    _ => None,
                },
            )
            .await;
        match r {
            Ok(found) => Ok(found),
            Err(Fail::Errno(Errno::EOPNOTSUPP)) => Ok(Vec::new()),
            Err(f) => Err(f.into_error("listing", "nexthops")),
        }
    }

    /// The nexthop `id`, or None (also when it is a kind [`Nexthop`] does not model).
    pub async fn nexthop(&self, id: u32) -> Result<Option<Nexthop>> {
        let r = self
            .exchange(
                Rtnl::GetNexthop(nexthop::by_id(id)),
                NLM_F_REQUEST,
                |m| match m {
                    Rtnl::NewNexthop(n) => nexthop::nexthop(&n),
                    _ => None,
                },
            )
            .await;
        match r {
            Ok(mut found) => Ok(found.pop()),
            Err(Fail::Errno(Errno::ENOENT)) => Ok(None),
            Err(f) => Err(f.into_error("looking up nexthop", id)),
        }
    }

    /// Sets the nexthop, replacing what has its id in place (the routes through it stay and
    /// follow); false when it was already exactly so.
    pub async fn set_nexthop(&self, nh: &Nexthop) -> Result<bool> {
        if self.nexthop(nh.id).await?.is_some_and(|have| have == *nh) {
            return Ok(false);
        }
        self.ack(
            Rtnl::NewNexthop(nexthop::message(nh)),
            NLM_F_CREATE | NLM_F_REPLACE,
        )
        .await
        .map_err(|f| f.into_error("setting nexthop", nexthop_name(nh)))?;
        Ok(true)
    }

    /// Deletes the nexthop `id`, and with it every route through it; false when there was
    /// none.
    pub async fn delete_nexthop(&self, id: u32) -> Result<bool> {
        let r = self.ack(Rtnl::DelNexthop(nexthop::by_id(id)), 0).await;
        changed(r, &[Errno::ENOENT], "deleting nexthop", id)
    }

    // ---- Neighbours ----

    /// The neighbour entries (both families) of `device`.
    pub async fn neighbours(&self, device: u32) -> Result<Vec<Neighbour>> {
        let mut out = Vec::new();
        for family in [AddressFamily::Inet, AddressFamily::Inet6] {
            let mut msg = NeighbourMessage::default();
            msg.header.family = family;
            msg.header.ifindex = device;
            let entries = self
                .dump_map(RouteNetlinkMessage::GetNeighbour(msg), |m| match m {
                    RouteNetlinkMessage::NewNeighbour(n) if n.header.ifindex == device => {
                        parse::neighbour(&n)
                    }
                    _ => None,
                })
                .await
                .map_err(|f| f.into_error("listing neighbours", format!("of link {device}")))?;
            out.extend(entries);
        }
        Ok(out)
    }

    /// The entry for `ip` on `device`, or None.
    pub async fn neighbour(&self, device: u32, ip: IpAddr) -> Result<Option<Neighbour>> {
        let key = Neighbour {
            device,
            ip,
            mac: Vec::new(),
            permanent: false,
        };
        let mut msg = parse::neighbour_message(&key);
        msg.header.state = Default::default();
        match self
            .get(RouteNetlinkMessage::GetNeighbour(msg), &[Errno::ENOENT])
            .await
        {
            Ok(Some(RouteNetlinkMessage::NewNeighbour(n))) => Ok(parse::neighbour(&n)),
            Ok(_) => Ok(None),
            Err(f) => Err(f.into_error("looking up neighbour", format!("{ip} on link {device}"))),
        }
    }

    /// Adds a neighbour entry; false when there is one for that address already.
    pub async fn create_neighbour(&self, n: &Neighbour) -> Result<bool> {
        let r = self
            .ack(
                RouteNetlinkMessage::NewNeighbour(parse::neighbour_message(n)),
                NLM_F_CREATE | NLM_F_EXCL,
            )
            .await;
        changed(r, &[Errno::EEXIST], "adding neighbour", neighbour_name(n))
    }

    /// Sets a neighbour entry, replacing what is there for that address; false when it was
    /// already exactly so.
    pub async fn replace_neighbour(&self, n: &Neighbour) -> Result<bool> {
        let already = self
            .neighbour(n.device, n.ip)
            .await?
            .is_some_and(|have| have == *n);
        self.write_unless(already, Write::SetNeighbour(n)).await
    }

    /// Sets many neighbour entries, pipelined; true for each that changed.
    pub async fn replace_neighbours(&self, entries: &[Neighbour]) -> Result<Vec<bool>> {
        let ops: Vec<_> = entries.iter().map(|n| self.replace_neighbour(n)).collect();
        pipelined(ops).await
    }

    /// Deletes the entry for `ip` on `device`; false when there was none.
    pub async fn delete_neighbour(&self, device: u32, ip: IpAddr) -> Result<bool> {
        let r = self.ack(neighbour_deletion(device, ip), 0).await;
        changed(
            r,
            &[Errno::ENOENT],
            "deleting neighbour",
            format!("{ip} on link {device}"),
        )
    }

    // ---- Forwarding database ----

    /// The device's own forwarding entries (NTF_SELF), as `bridge fdb show dev` lists them.
    pub async fn fdb(&self, device: u32) -> Result<Vec<FdbEntry>> {
        let mut msg = NeighbourMessage::default();
        msg.header.family = AddressFamily::Bridge;
        msg.header.ifindex = device;
        self.dump_map(RouteNetlinkMessage::GetNeighbour(msg), |m| match m {
            RouteNetlinkMessage::NewNeighbour(n) if n.header.ifindex == device => {
                parse::fdb_entry(&n)
            }
            _ => None,
        })
        .await
        .map_err(|f| {
            f.into_error(
                "listing the forwarding entries",
                format!("of link {device}"),
            )
        })
    }

    /// The device's entry for `mac` (its first destination), or None.
    pub async fn fdb_entry(&self, device: u32, mac: [u8; 6]) -> Result<Option<FdbEntry>> {
        let key = FdbEntry {
            device,
            mac,
            dst: None,
            permanent: false,
        };
        let mut msg = parse::fdb_message(&key);
        msg.header.state = Default::default();
        match self
            .get(RouteNetlinkMessage::GetNeighbour(msg), &[Errno::ENOENT])
            .await
        {
            Ok(Some(RouteNetlinkMessage::NewNeighbour(n))) => Ok(parse::fdb_entry(&n)),
            Ok(_) => Ok(None),
            Err(f) => Err(f.into_error(
                "looking up the forwarding entry",
                format!("{} on link {device}", format_mac(&mac)),
            )),
        }
    }

    /// Sets the entry for the MAC to the one destination given (an overlay has one per peer);
    /// false when it was already exactly so.
    pub async fn add_fdb(&self, e: &FdbEntry) -> Result<bool> {
        let r = self
            .ack(
                RouteNetlinkMessage::NewNeighbour(parse::fdb_message(e)),
                NLM_F_CREATE | NLM_F_EXCL,
            )
            .await;
        if changed(
            r,
            &[Errno::EEXIST],
            "adding the forwarding entry",
            fdb_name(e),
        )? {
            return Ok(true);
        }
        let already = self
            .fdb_entry(e.device, e.mac)
            .await?
            .is_some_and(|have| have == *e);
        self.write_unless(already, Write::SetFdb(e)).await
    }

    /// Sets many forwarding entries, pipelined; true for each that changed.
    pub async fn add_fdbs(&self, entries: &[FdbEntry]) -> Result<Vec<bool>> {
        let ops: Vec<_> = entries.iter().map(|e| self.add_fdb(e)).collect();
        pipelined(ops).await
    }

    /// Deletes the entry for the MAC and destination; false when there was none.
    pub async fn delete_fdb(&self, e: &FdbEntry) -> Result<bool> {
        let r = self
            .ack(RouteNetlinkMessage::DelNeighbour(parse::fdb_message(e)), 0)
            .await;
        changed(
            r,
            &[Errno::ENOENT],
            "deleting the forwarding entry",
            fdb_name(e),
        )
    }

    // ---- Batches ----

    /// Makes the writes in the order given, many in flight and many to a datagram, without
    /// reading anything first: for a caller that has just read what is there and knows what
    /// differs. Every write is tried; the failures come back, each naming its entry. Deleting
    /// what is already gone is no failure.
    pub async fn write(&self, writes: &[Write<'_>]) -> Vec<Error> {
        self.write_indexed(writes)
            .await
            .into_iter()
            .map(|(_, e)| e)
            .collect()
    }

    /// [`Conn::write`], each failure with the position of its write in `writes`, for a caller
    /// that names the entry its own way.
    pub async fn write_indexed(&self, writes: &[Write<'_>]) -> Vec<(usize, Error)> {
        let mut batches = writes.chunks(BATCH).enumerate();
        let mut in_flight = futures::stream::FuturesOrdered::new();
        let mut failed = Vec::new();
        loop {
            while in_flight.len() < WINDOW / BATCH {
                match batches.next() {
                    Some((i, b)) => in_flight.push_back(self.write_batch(i * BATCH, b)),
                    None => break,
                }
            }
            match in_flight.next().await {
                Some(f) => failed.extend(f),
                None => return failed,
            }
        }
    }

    /// One datagram of writes. The kernel answers only those it refuses, and those answers
    /// do not say which write they are for; so a batch with any refusal is tried again one
    /// write at a time (each write is idempotent, and a deletion done the first time finds
    /// nothing the second), which names each failure.
    async fn write_batch(&self, first: usize, batch: &[Write<'_>]) -> Vec<(usize, Error)> {
        let messages = batch.iter().map(|w| {
            let (msg, flags) = w.message();
            let mut req = NetlinkMessage::from(msg);
            req.header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
            req
        });
        let Ok(mut answers) = self.handle.request_batch(messages, SocketAddr::new(0, 0)) else {
            return batch
                .iter()
                .enumerate()
                .map(|(i, w)| (first + i, Fail::Closed.into_error(w.op(), w.object())))
                .collect();
        };
        let mut refused = false;
        while let Some(m) = answers.next().await {
            if let NetlinkPayload::Error(e) = m.payload {
                refused |= e.code.is_some();
            }
        }
        let mut failed = Vec::new();
        if refused {
            for (i, w) in batch.iter().enumerate() {
                if let Err(e) = self.write_one(*w).await {
                    failed.push((first + i, e));
                }
            }
        }
        failed
    }

    /// The last step of every idempotent set: the write, unless what was read (`already`)
    /// shows the kernel holds it so; true when it wrote.
    async fn write_unless(&self, already: bool, w: Write<'_>) -> Result<bool> {
        if already {
            return Ok(false);
        }
        self.write_one(w).await.map(|()| true)
    }

    async fn write_one(&self, w: Write<'_>) -> Result<()> {
        let (msg, flags) = w.message();
        match self.ack(msg, flags).await {
            Ok(()) => Ok(()),
            Err(Fail::Errno(e)) if w.quiet(e) => Ok(()),
            Err(f) => Err(f.into_error(w.op(), w.object())),
        }
    }
}

/// One change of a batch for [`Conn::write`].
#[derive(Debug, Clone, Copy)]
pub enum Write<'a> {
    /// Sets the route, replacing any other to its destination in its table.
    SetRoute(&'a Route),
    DeleteRoute(&'a Route),
    /// Sets the neighbour entry, replacing what is there for its address.
    SetNeighbour(&'a Neighbour),
    /// Deletes the entry for the neighbour's address, whatever its MAC.
    DeleteNeighbour(&'a Neighbour),
    /// Sets the entry for the MAC to the one destination given.
    SetFdb(&'a FdbEntry),
    DeleteFdb(&'a FdbEntry),
    /// Sets the nexthop, replacing what has its id in place. Put it before the routes that
    /// go through it: the kernel refuses a route through a nexthop it does not have.
    SetNexthop(&'a Nexthop),
    /// Deletes the nexthop of this id, and with it every route through it.
    DeleteNexthop(u32),
}

impl Write<'_> {
    /// The request and its flags beyond REQUEST and ACK.
    fn message(&self) -> (Rtnl, u16) {
        let set = NLM_F_CREATE | NLM_F_REPLACE;
        let (msg, flags) = match *self {
            Write::SetRoute(r) => (
                RouteNetlinkMessage::NewRoute(parse::route_message(r, RouteProtocol::Boot)),
                set,
            ),
            Write::DeleteRoute(r) => (route_deletion(r), 0),
            Write::SetNeighbour(n) => (
                RouteNetlinkMessage::NewNeighbour(parse::neighbour_message(n)),
                set,
            ),
            Write::DeleteNeighbour(n) => (neighbour_deletion(n.device, n.ip), 0),
            Write::SetFdb(e) => (
                RouteNetlinkMessage::NewNeighbour(parse::fdb_message(e)),
                set,
            ),
            Write::DeleteFdb(e) => (RouteNetlinkMessage::DelNeighbour(parse::fdb_message(e)), 0),
            Write::SetNexthop(nh) => return (Rtnl::NewNexthop(nexthop::message(nh)), set),
            Write::DeleteNexthop(id) => return (Rtnl::DelNexthop(nexthop::by_id(id)), 0),
        };
        (msg.into(), flags)
    }

    fn op(&self) -> &'static str {
        match self {
            Write::SetRoute(_) => "replacing route",
            Write::DeleteRoute(_) => "deleting route",
            Write::SetNeighbour(_) => "setting neighbour",
            Write::DeleteNeighbour(_) => "deleting neighbour",
            Write::SetFdb(_) => "setting the forwarding entry",
            Write::DeleteFdb(_) => "deleting the forwarding entry",
            Write::SetNexthop(_) => "setting nexthop",
            Write::DeleteNexthop(_) => "deleting nexthop",
        }
    }

    fn object(&self) -> String {
        match self {
            Write::SetRoute(r) | Write::DeleteRoute(r) => route_name(r),
            Write::SetNeighbour(n) => neighbour_name(n),
            Write::DeleteNeighbour(n) => format!("{} on link {}", n.ip, n.device),
            Write::SetFdb(e) | Write::DeleteFdb(e) => fdb_name(e),
            Write::SetNexthop(nh) => nexthop_name(nh),
            Write::DeleteNexthop(id) => id.to_string(),
        }
    }

    /// The kernel saying a deletion had nothing to delete.
    fn quiet(&self, errno: Errno) -> bool {
        match self {
            Write::DeleteRoute(_) => errno == Errno::ESRCH,
            Write::DeleteNeighbour(_) | Write::DeleteFdb(_) | Write::DeleteNexthop(_) => {
                errno == Errno::ENOENT
            }
            _ => false,
        }
    }
}

/// Runs the operations with up to WINDOW of them in flight on the connection; their results in
/// order, or the first error.
async fn pipelined<T, F>(ops: Vec<F>) -> Result<Vec<T>>
where
    F: Future<Output = Result<T>>,
{
    let mut out = Vec::new();
    let mut first_error = None;
    let mut results = futures::stream::iter(ops).buffered(WINDOW);
    while let Some(r) = results.next().await {
        match r {
            Ok(v) => out.push(v),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// The request deleting a route (matched by destination and table, and by gateway and
/// device where given).
fn route_deletion(route: &Route) -> RouteNetlinkMessage {
    let mut msg = parse::route_message(route, RouteProtocol::Unspec);
    msg.header.scope = netlink_packet_route::route::RouteScope::NoWhere;
    RouteNetlinkMessage::DelRoute(msg)
}

/// The request deleting the neighbour entry for `ip` on `device`, whatever its MAC.
fn neighbour_deletion(device: u32, ip: IpAddr) -> RouteNetlinkMessage {
    let key = Neighbour {
        device,
        ip,
        mac: Vec::new(),
        permanent: false,
    };
    let mut msg = parse::neighbour_message(&key);
    msg.header.state = Default::default();
    RouteNetlinkMessage::DelNeighbour(msg)
}

fn route_name(r: &Route) -> String {
    let mut s = ip_of(r.dst);
    if let Some(g) = r.gw {
        s += &format!(" via {g}");
    }
    if let Some(i) = r.oif {
        s += &format!(" dev {i}");
    }
    if r.onlink {
        s += " onlink";
    }
    if let Some(id) = r.nhid {
        s += &format!(" nhid {id}");
    }
    if r.table != MAIN_TABLE {
        s += &format!(" table {}", r.table);
    }
    s
}

fn nexthop_name(nh: &Nexthop) -> String {
    format!(
        "id {} via {} dev {}{}",
        nh.id,
        nh.gateway,
        nh.device,
        if nh.onlink { " onlink" } else { "" }
    )
}

fn neighbour_name(n: &Neighbour) -> String {
    format!(
        "{} lladdr {} on link {}",
        n.ip,
        format_mac(&n.mac),
        n.device
    )
}

fn fdb_name(e: &FdbEntry) -> String {
    match e.dst {
        Some(d) => format!("{} dst {d} on link {}", format_mac(&e.mac), e.device),
        None => format!("{} on link {}", format_mac(&e.mac), e.device),
    }
}

/// A vxlan link's message with its attributes.
fn vxlan_link(name: &str, v: &Vxlan) -> LinkMessageBuilder<LinkVxlan> {
    let mut b = LinkVxlan::new(name, v.vni).learning(v.learning);
    if v.port != 0 {
        b = b.port(v.port);
    }
    b = match v.local {
        Some(IpAddr::V4(a)) => b.local(a),
        Some(IpAddr::V6(a)) => b.local6(a),
        None => b,
    };
    if let Some(dev) = v.device {
        b = b.dev(dev);
    }
    if v.gbp {
        b = b.gbp();
    }
    b
}
