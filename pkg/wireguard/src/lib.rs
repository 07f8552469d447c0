//! WireGuard for flanneld's `wireguard` backend.
//!
//! - `key`: the private key file, base64/hex keys, PSK parsing.
//! - `uapi`: the cross-platform text protocol and a client of a device's socket.
//! - `genl`: the kernel's `wireguard` generic netlink family (the kernel path).
//! - `tunnel`: the userspace device over TUN, served on the UAPI socket.

pub mod key;
pub mod tunnel;
pub mod uapi;

pub use key::Key;
