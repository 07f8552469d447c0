//! Link, address, route, neighbour and nexthop changes as the kernel announces them, as a
//! stream. An
//! event is a reason to look again, not a record to trust: a listener that falls behind
//! loses some, and is then told so by [`Event::Overflow`].

use super::nexthop::{self, Rtnl};
use super::parse;
use super::types::{FdbEntry, Link, Neighbour, Nexthop, Route};
use crate::error::{Error, Result};
use crate::netns::Netns;
use futures::channel::mpsc::UnboundedReceiver;
use futures::{Future, Stream};
use ipnetwork::IpNetwork;
use netlink_packet_route::RouteNetlinkMessage;
use rtnetlink::packet_core::{NetlinkMessage, NetlinkPayload};
use rtnetlink::sys::{protocols::NETLINK_ROUTE, AsyncSocket, SocketAddr};
use rtnetlink::MulticastGroup;
use std::pin::Pin;
use std::task::{Context, Poll};

/// One change; `removed` tells a deletion from an addition or change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Link {
        link: Link,
        removed: bool,
    },
    Address {
        index: u32,
        address: IpNetwork,
        removed: bool,
    },
    Route {
        route: Route,
        removed: bool,
    },
    Neighbour {
        neighbour: Neighbour,
        removed: bool,
    },
    Fdb {
        entry: FdbEntry,
        removed: bool,
    },
    /// A nexthop object. Deleting one deletes the routes through it, and the kernel announces
    /// only the nexthop's deletion for the IPv4 ones.
    Nexthop {
        nexthop: Nexthop,
        removed: bool,
    },
    /// The kernel dropped notifications its socket buffer could not hold: anything may have
    /// changed.
    Overflow,
}

/// The stream of changes in one namespace, for as long as it is kept.
///
/// The socket is read only while the stream is polled. A listener busy elsewhere (writing
/// thousands of entries, each of which comes back as a notification) lets the kernel's
/// buffer fill and drop the rest, which it learns as one [`Event::Overflow`], instead of
/// the notifications piling up in memory.
pub struct Events {
    conn: rtnetlink::proto::Connection<Rtnl>,
    conn_done: bool,
    messages: UnboundedReceiver<(NetlinkMessage<Rtnl>, SocketAddr)>,
}

const GROUPS: &[MulticastGroup] = &[
    MulticastGroup::Link,
    MulticastGroup::Neigh,
    MulticastGroup::Ipv4Ifaddr,
    MulticastGroup::Ipv6Ifaddr,
    MulticastGroup::Ipv4Route,
    MulticastGroup::Ipv6Route,
    MulticastGroup::Nexthop,
];

impl Events {
    /// Listens in the calling thread's namespace; must be called inside a tokio runtime (the
    /// socket registers with its reactor).
    pub fn subscribe() -> Result<Events> {
        tokio::runtime::Handle::try_current()
            .map_err(|e| Error::failed("listening to", "netlink notifications", e))?;
        let fail = |e: std::io::Error| Error::io("listening to", "netlink notifications", &e);
        let (mut conn, _handle, messages) =
            rtnetlink::proto::new_connection::<Rtnl>(NETLINK_ROUTE).map_err(fail)?;
        let socket = conn.socket_mut().socket_mut();
        // The groups from 32 on (nexthops are 32) are joined one by one, the others by the
        // bind's mask.
        let (low, high): (Vec<u32>, Vec<u32>) =
            GROUPS.iter().map(|g| *g as u32).partition(|g| *g < 32);
        let mask = low.iter().fold(0u32, |m, g| m | 1 << (g - 1));
        socket.bind(&SocketAddr::new(0, mask)).map_err(fail)?;
        for g in high {
            socket.add_membership(g).map_err(fail)?;
        }
        Ok(Events {
            conn,
            conn_done: false,
            messages,
        })
    }

    /// Listens inside `ns`.
    pub fn subscribe_in(ns: &Netns) -> Result<Events> {
        ns.run(Self::subscribe)?
    }

    /// Listens inside `ns` with a receive buffer of `bytes` (forced past
    /// `net.core.rmem_max`, which takes CAP_NET_ADMIN): for a listener that must see every
    /// notification of a burst, such as a benchmark counting them. The kernel charges each
    /// notification about a kilobyte, whatever its size.
    pub fn subscribe_in_with_buffer(ns: &Netns, bytes: usize) -> Result<Events> {
        let mut events = Self::subscribe_in(ns)?;
        let socket = events.conn.socket_mut().socket_mut();
        nix::sys::socket::setsockopt(&*socket, nix::sys::socket::sockopt::RcvBufForce, &bytes)
            .map_err(|e| Error::os("sizing the receive buffer of", "a netlink listener", e))?;
        Ok(events)
    }
}

impl Stream for Events {
    type Item = Event;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        let this = self.get_mut();
        if !this.conn_done && Pin::new(&mut this.conn).poll(cx).is_ready() {
            this.conn_done = true;
        }
        loop {
            match Pin::new(&mut this.messages).poll_next(cx) {
                Poll::Ready(Some((msg, _))) => match msg.payload {
                    NetlinkPayload::InnerMessage(m) => {
                        if let Some(e) = event(&m) {
                            return Poll::Ready(Some(e));
                        }
                    }
                    NetlinkPayload::Overrun(_) => return Poll::Ready(Some(Event::Overflow)),
                    _ => {}
                },
                Poll::Ready(None) => return Poll::Ready(None),
                // The socket is gone and everything it gave has been read.
                Poll::Pending if this.conn_done => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// The event a notification tells of, if it is one this module models.
fn event(m: &Rtnl) -> Option<Event> {
    use RouteNetlinkMessage as M;
    let m = match m {
        Rtnl::Route(m) => m,
        Rtnl::NewNexthop(n) | Rtnl::DelNexthop(n) => {
            return Some(Event::Nexthop {
                nexthop: nexthop::nexthop(n)?,
                removed: matches!(m, Rtnl::DelNexthop(_)),
            })
        }
        Rtnl::GetNexthop(_) => return None,
    };
    Some(match m {
        M::NewLink(l) | M::DelLink(l) => Event::Link {
            link: parse::link(l),
            removed: matches!(m, M::DelLink(_)),
        },
        M::NewAddress(a) | M::DelAddress(a) => Event::Address {
            index: a.header.index,
            address: parse::address(a)?.address,
            removed: matches!(m, M::DelAddress(_)),
        },
        M::NewRoute(r) | M::DelRoute(r) => Event::Route {
            route: parse::route(r)?,
            removed: matches!(m, M::DelRoute(_)),
        },
        M::NewNeighbour(n) | M::DelNeighbour(n) => {
            let removed = matches!(m, M::DelNeighbour(_));
            match parse::fdb_entry(n) {
                Some(entry) => Event::Fdb { entry, removed },
                None => Event::Neighbour {
                    neighbour: parse::neighbour(n)?,
                    removed,
                },
            }
        }
        _ => return None,
    })
}
