//! Kernel effects, each behind a small named operation. Nothing else in the suite
//! opens a netlink socket, enters a namespace, writes a sysctl or runs a firewall tool.

pub mod conntrack;
pub mod error;
pub mod ethtool;
pub mod firewall;
pub mod netlink;
pub mod netns;
pub mod nft_commits;
pub mod nft_elements;
pub mod procsys;
pub mod sysctl;

pub use error::{Error, Kind, Result};
pub use netlink::Netlink;
pub use netns::Netns;
