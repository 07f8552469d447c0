//! Kernel effects, each behind a small named operation. Nothing else in the suite
//! opens a netlink socket, enters a namespace, writes a sysctl or runs a firewall tool.

pub mod conntrack;
pub mod error;
pub mod firewall;
pub mod netlink;
pub mod netns;
pub mod procsys;
pub mod sysctl;

pub use error::{Error, Kind, Result};
pub use netlink::Netlink;
pub use netns::Netns;

/// Why `name` cannot be an interface name (1 to 15 bytes, not `.` or `..`, no `/`, `:` or
/// whitespace), or None when it can.
pub fn ifname_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("is empty")
    } else if name.len() > 15 {
        Some("is longer than 15 bytes")
    } else if name == "." || name == ".." {
        Some("is not a valid interface name")
    } else if name
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        Some("contains '/', ':' or whitespace")
    } else {
        None
    }
}
