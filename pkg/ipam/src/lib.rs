//! host-local IPAM: the allocator and the store behind the `host-local` plugin.
//!
//! `config`, `range`, `allocator` and `dns` are pure; `store` is the only code
//! that touches the files under the dataDir.

pub mod allocator;
pub mod config;
pub mod dns;
pub mod ip;
pub mod range;
pub mod store;

pub use allocator::{allocate, Key, Reservations};
pub use config::{IpamConfig, StoreConfig};
