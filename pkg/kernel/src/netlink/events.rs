//! Link, address, route and neighbour changes as the kernel announces them, as a stream. An
//! event is a reason to look again, not a record to trust: a listener that falls behind
//! loses some (the kernel drops what its socket cannot hold).

use super::{parse, FdbEntry, Link, Neighbour, Route};
use crate::error::{Error, Result};
use crate::netns::Netns;
use futures::channel::mpsc::UnboundedReceiver;
use futures::Stream;
use ipnetwork::IpNetwork;
use netlink_packet_route::RouteNetlinkMessage;
use rtnetlink::packet_core::{NetlinkMessage, NetlinkPayload};
use rtnetlink::sys::SocketAddr;
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
}

/// The stream of changes in one namespace, for as long as it is kept.
pub struct Events {
    messages: UnboundedReceiver<(NetlinkMessage<RouteNetlinkMessage>, SocketAddr)>,
    driver: tokio::task::JoinHandle<()>,
}

const GROUPS: &[MulticastGroup] = &[
    MulticastGroup::Link,
    MulticastGroup::Neigh,
    MulticastGroup::Ipv4Ifaddr,
    MulticastGroup::Ipv6Ifaddr,
    MulticastGroup::Ipv4Route,
    MulticastGroup::Ipv6Route,
];

impl Events {
    /// Listens in the calling thread's namespace, driven by a task on the current tokio
    /// runtime.
    pub fn subscribe() -> Result<Events> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| Error::failed("listening to", "netlink notifications", e))?;
        let (conn, _handle, messages) = rtnetlink::new_multicast_connection(GROUPS)
            .map_err(|e| Error::io("listening to", "netlink notifications", &e))?;
        Ok(Events {
            messages,
            driver: runtime.spawn(conn),
        })
    }

    /// Listens inside `ns`.
    pub fn subscribe_in(ns: &Netns) -> Result<Events> {
        ns.run(Self::subscribe)?
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

impl Stream for Events {
    type Item = Event;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        loop {
            match Pin::new(&mut self.messages).poll_next(cx) {
                Poll::Ready(Some((msg, _))) => {
                    if let NetlinkPayload::InnerMessage(m) = msg.payload {
                        if let Some(e) = event(&m) {
                            return Poll::Ready(Some(e));
                        }
                    }
                }
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// The event a notification tells of, if it is one this module models.
fn event(m: &RouteNetlinkMessage) -> Option<Event> {
    use RouteNetlinkMessage as M;
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
