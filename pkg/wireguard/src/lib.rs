//! WireGuard's controls for flanneld's `wireguard` backend; each module has its own error type.
//!
//! - `key`: the private key file, base64/hex keys, PSK parsing.
//! - `uapi`: the cross-platform text protocol and a client of a device's socket.
//! - `control`: kernel or userspace, chosen once; one handle to get and set either.
//! - `genl`: the kernel's `wireguard` generic netlink family.
//! - `supervise`: starts the userspace tunnel (`flannel-wireguard`, its own package) as a
//!   process of its own that outlives flanneld.

pub mod control;
pub mod genl;
pub mod key;
pub mod supervise;
pub mod uapi;

pub use key::Key;
