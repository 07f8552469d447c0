//! The userspace WireGuard tunnel: a TUN device driven by our own threads, configured over
//! the standard UAPI socket so `wg` and flanneld talk to it as to wireguard-go.

pub mod allowed;
pub mod device;
pub mod server;
pub mod udp;

pub use device::Device;
