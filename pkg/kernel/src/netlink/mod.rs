//! Netlink (rtnetlink) as named operations. The core is async ([`Conn`]: one connection per
//! namespace, many requests in flight on it, change notifications as a stream); the plugins'
//! blocking calls ([`Netlink`]) are a thin layer over it. What goes in and out is this module's
//! own plain types: no rtnetlink type crosses the crate's boundary.

mod conn;
mod events;
mod nexthop;
mod parse;
mod sync;
mod types;

pub use conn::{Conn, Write};
pub use events::{Event, Events};
pub use sync::Netlink;
pub use types::{
    format_mac, AddressInfo, BridgeSpec, FdbEntry, Link, LinkKind, LinkSpec, Neighbour, Nexthop,
    Route, RouteInfo, VethSpec, Vxlan, MAIN_TABLE, PROTOCOL_BOOT,
};
