//! One thin wrapper over rtnetlink: a socket bound to a namespace, and named operations on it.

use crate::netns::Netns;
use cni_protocol::CniError;
use futures::TryStreamExt;
use ipnetwork::IpNetwork;
use netlink_packet_route::address::AddressAttribute;
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkMessage};
use once_cell::sync::Lazy;
use rtnetlink::{Handle, LinkUnspec};
use std::future::Future;
use tokio::runtime::Runtime;

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
        let mut req = self
            .handle
            .link()
            .get()
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
                let ip = m.attributes.iter().find_map(|a| match a {
                    AddressAttribute::Address(ip) => Some(*ip),
                    _ => None,
                })?;
                IpNetwork::new(ip, m.header.prefix_len).ok()
            })
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
