//! The plugins' blocking calls: each runs one [`Conn`] operation to completion on a
//! single-threaded runtime that drives the connection's socket. Connections opened by one
//! thread share that runtime while any of them lives (a plugin's host and pod connections pay
//! for one); there is no process-wide runtime. Called from inside an async runtime (where
//! blocking on another would panic), a call blocks on a thread of its own instead.

use super::conn::Conn;
use super::types::{
    AddressInfo, BridgeSpec, FdbEntry, Link, LinkSpec, Neighbour, Nexthop, Route, VethSpec,
};
use crate::error::{Error, Result};
use crate::netns::Netns;
use ipnetwork::IpNetwork;
use netlink_packet_route::link::LinkMessage;
use netlink_packet_route::RouteNetlinkMessage;
use rtnetlink::packet_core::{NetlinkMessage, NLM_F_ACK, NLM_F_REQUEST};
use std::cell::RefCell;
use std::future::Future;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;

/// The runtime that drives one connection's socket.
struct Driver(Option<Runtime>);

impl Drop for Driver {
    fn drop(&mut self) {
        // Never waits, so that dropping a connection inside an async task does not panic.
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// A blocking netlink connection bound to the namespace it was opened in. Clones share it.
#[derive(Clone)]
pub struct Netlink {
    conn: Conn,
    driver: Arc<Driver>,
}

thread_local! {
    /// The runtime of the connections this thread opened, while one of them lives.
    static SHARED: RefCell<Weak<Driver>> = const { RefCell::new(Weak::new()) };
}

/// The calling thread's runtime for connections, started when it has none.
fn thread_driver() -> Result<Arc<Driver>> {
    if let Some(d) = SHARED.with(|s| s.borrow().upgrade()) {
        return Ok(d);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(|e| Error::io("starting", "a runtime for netlink", &e))?;
    let d = Arc::new(Driver(Some(rt)));
    SHARED.with(|s| *s.borrow_mut() = Arc::downgrade(&d));
    Ok(d)
}

impl Netlink {
    /// A connection in the calling thread's namespace.
    pub fn open() -> Result<Netlink> {
        let driver = thread_driver()?;
        let Some(rt) = driver.0.as_ref() else {
            unreachable!("the runtime lives as long as the connection")
        };
        let conn = {
            let _ctx = rt.enter();
            let (conn, task) = Conn::connect()?;
            rt.spawn(task);
            conn
        };
        Ok(Netlink { conn, driver })
    }

    /// A connection inside `ns`: it stays bound there after the thread returns.
    pub fn open_in(ns: &Netns) -> Result<Netlink> {
        ns.run(Self::open)?
    }

    /// The async connection under this one, for work that overlaps many requests; run it
    /// with [`Netlink::block_on`].
    pub fn conn(&self) -> &Conn {
        &self.conn
    }

    /// Runs async work on this connection to completion.
    pub fn block_on<F>(&self, f: F) -> F::Output
    where
        F: Future + Send,
        F::Output: Send,
    {
        let Some(rt) = self.driver.0.as_ref() else {
            unreachable!("the runtime lives as long as the connection")
        };
        if tokio::runtime::Handle::try_current().is_err() {
            return rt.block_on(f);
        }
        std::thread::scope(|s| {
            s.spawn(|| rt.block_on(f))
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
    }
}

/// Each listed operation of [`Conn`], blocking.
macro_rules! blocking {
    ($( $(#[$doc:meta])* fn $name:ident(&self $(, $arg:ident : $ty:ty)*) -> $ret:ty; )*) => {
        impl Netlink {
            $(
                $(#[$doc])*
                pub fn $name(&self $(, $arg: $ty)*) -> Result<$ret> {
                    self.block_on(self.conn.$name($($arg),*))
                }
            )*
        }
    };
}

blocking! {
    /// The link called `name`, or None.
    fn link_by_name(&self, name: &str) -> Option<Link>;
    /// The link with index `index`, or None.
    fn link_by_index(&self, index: u32) -> Option<Link>;
    /// Every link of the namespace.
    fn links(&self) -> Vec<Link>;
    fn set_up(&self, index: u32, up: bool) -> ();
    fn set_promisc(&self, index: u32, on: bool) -> ();
    fn set_mac(&self, index: u32, mac: &[u8]) -> ();
    fn set_mtu(&self, index: u32, mtu: u32) -> ();
    /// Creates the bridge; false when a link of that name already exists.
    fn create_bridge(&self, spec: &BridgeSpec<'_>) -> bool;
    /// Creates the veth pair; false when one of the two names is taken.
    fn create_veth(&self, spec: &VethSpec<'_>) -> bool;
    /// Makes the link `spec` says; false when a link of that name already exists.
    fn create_link(&self, spec: &LinkSpec) -> bool;
    /// The link as `spec` says, and whether anything had to change.
    fn ensure_link(&self, spec: &LinkSpec) -> (Link, bool);
    /// Deletes a link (and a veth's peer with it); false when it was already gone.
    fn delete_link(&self, index: u32) -> bool;
    /// Bridge port flags: hairpin and isolation.
    fn set_bridge_port(&self, index: u32, hairpin: bool, isolated: bool) -> ();
    /// The VLAN IDs a bridge port carries.
    fn bridge_vlans(&self, index: u32) -> Vec<u16>;
    /// Adds VLANs to a bridge port: `access` makes them untagged PVIDs, else tagged.
    fn add_bridge_vlans(&self, index: u32, vids: &[u16], access: bool) -> ();
    /// Removes VLANs from a bridge port.
    fn del_bridge_vlans(&self, index: u32, vids: &[u16]) -> ();
    /// Adds an address; false when the link already has it.
    fn add_address(&self, index: u32, addr: IpNetwork) -> bool;
    /// Removes an address; false when it was already gone.
    fn del_address(&self, index: u32, addr: IpNetwork) -> bool;
    /// The addresses on a link with their flags.
    fn address_infos(&self, index: u32) -> Vec<AddressInfo>;
    /// The addresses on a link, with their prefix lengths.
    fn addresses(&self, index: u32) -> Vec<IpNetwork>;
    /// Adds a route through `index` as the plugins do; already there is fine.
    fn add_route(&self, index: u32, dst: IpNetwork, gw: Option<IpAddr>) -> ();
    /// The main table's routes of both families.
    fn routes(&self) -> Vec<Route>;
    /// The unicast routes of `table`, both families.
    fn table_routes(&self, table: u32) -> Vec<Route>;
    /// The route a packet to `ip` would take; None when unreachable or local.
    fn route_get(&self, ip: IpAddr) -> Option<Route>;
    /// Creates a route; false when its destination is already routed in its table.
    fn create_route(&self, route: &Route) -> bool;
    /// Sets one route, replacing any other to the same destination; true when it changed.
    fn replace_route(&self, route: &Route) -> bool;
    /// Sets many routes, pipelined; true for each that changed.
    fn replace_routes(&self, routes: &[Route]) -> Vec<bool>;
    /// Deletes a route; false when there was none.
    fn delete_route(&self, route: &Route) -> bool;
    /// Deletes many routes, pipelined; false for each that was not there.
    fn delete_routes(&self, routes: &[Route]) -> Vec<bool>;
    /// Whether the kernel has nexthop objects.
    fn supports_nexthops(&self) -> bool;
    /// Every nexthop object that is a gateway on a device.
    fn nexthops(&self) -> Vec<Nexthop>;
    /// The nexthop `id`, or None.
    fn nexthop(&self, id: u32) -> Option<Nexthop>;
    /// Sets the nexthop in place; false when it was already exactly so.
    fn set_nexthop(&self, nh: &Nexthop) -> bool;
    /// Deletes the nexthop and the routes through it; false when there was none.
    fn delete_nexthop(&self, id: u32) -> bool;
    /// The neighbour entries of `device`.
    fn neighbours(&self, device: u32) -> Vec<Neighbour>;
    /// The entry for `ip` on `device`, or None.
    fn neighbour(&self, device: u32, ip: IpAddr) -> Option<Neighbour>;
    /// Adds a neighbour entry; false when there is one for that address already.
    fn create_neighbour(&self, n: &Neighbour) -> bool;
    /// Sets a neighbour entry; false when it was already exactly so.
    fn replace_neighbour(&self, n: &Neighbour) -> bool;
    /// Sets many neighbour entries, pipelined; true for each that changed.
    fn replace_neighbours(&self, entries: &[Neighbour]) -> Vec<bool>;
    /// Deletes the entry for `ip` on `device`; false when there was none.
    fn delete_neighbour(&self, device: u32, ip: IpAddr) -> bool;
    /// The device's own forwarding entries.
    fn fdb(&self, device: u32) -> Vec<FdbEntry>;
    /// The device's entry for `mac`, or None.
    fn fdb_entry(&self, device: u32, mac: [u8; 6]) -> Option<FdbEntry>;
    /// Sets the entry for the MAC to its destination; false when it was already so.
    fn add_fdb(&self, e: &FdbEntry) -> bool;
    /// Sets many forwarding entries, pipelined; true for each that changed.
    fn add_fdbs(&self, entries: &[FdbEntry]) -> Vec<bool>;
    /// Deletes the entry for the MAC and destination; false when there was none.
    fn delete_fdb(&self, e: &FdbEntry) -> bool;
}

impl Netlink {
    /// Waits until the link's operational state is up (a veth is once both ends are up). Polls
    /// with the thread's own sleeps: the runtime's timer counts whole milliseconds, and a port
    /// is usually up within a few hundred microseconds.
    pub fn wait_oper_up(&self, index: u32, timeout: Duration) -> Result<Link> {
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_micros(200);
        loop {
            let link = self
                .link_by_index(index)?
                .ok_or_else(|| Error::failed("waiting for link", index, "it disappeared"))?;
            if link.oper_up {
                return Ok(link);
            }
            if Instant::now() >= deadline {
                return Err(Error::failed(
                    "waiting for link",
                    format!("{} ({index})", link.name),
                    format!(
                        "it is not operationally up after {timeout:?}: {}",
                        link.oper_state
                    ),
                ));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }

    /// Deletes a link of the namespace `ns` (this connection's) and returns as soon as it is
    /// gone from it: unlisted, its name free, off its bridge, its addresses and routes flushed.
    /// What the kernel does after that (an RCU barrier and the final free, about 20 ms for a
    /// veth pair) is waited for by a detached child process that holds none of the caller's
    /// descriptors, so the runtime does not wait for it. False when the link was already gone.
    pub fn delete_link_detached(&self, ns: &Netns, index: u32) -> Result<bool> {
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
            .map_err(|e| Error::os("opening", "a netlink socket", e))?;
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
}
