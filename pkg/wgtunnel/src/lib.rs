//! The userspace WireGuard tunnel: a TUN device driven by our own threads, configured over
//! the standard UAPI socket so `wg` and flanneld talk to it as to wireguard-go.
//!
//! - `device`: the device, its threads, handshakes and timers; `tx` and `rx` its two
//!   directions, batched end to end over `tunio`; `config` its UAPI view.
//! - `noise`, `cookie`, `session`, `timers`: WireGuard's protocol: the handshake, the
//!   DoS cookies, the sessions with their counters and replay windows, the timers.
//! - `peer`: one peer's state; `allowed`: cryptokey routing.
//! - `pool`: the crypto threads a batch is split across.
//! - `udp`: the sockets of the listen port; `server`: the UAPI socket.

pub mod allowed;
pub mod config;
pub mod cookie;
pub mod device;
pub mod noise;
pub mod peer;
pub mod pool;
pub mod rx;
pub mod server;
pub mod session;
pub mod timers;
pub mod tx;
pub mod udp;

pub use device::Device;
