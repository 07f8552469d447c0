//! The userspace WireGuard tunnel: a TUN device driven by our own threads, configured over
//! the standard UAPI socket so `wg` and flanneld talk to it as to wireguard-go.
//!
//! - `device`: the peers, their sessions, and the threads between TUN and the sockets.
//! - `allowed`: cryptokey routing, which peer an address belongs to.
//! - `udp`: the sockets of the listen port, both families.
//! - `server`: the UAPI socket, `get=1` and `set=1`.

pub mod allowed;
pub mod device;
pub mod server;
pub mod udp;

pub use device::Device;
