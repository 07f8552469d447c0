//! Batched packet I/O for a userspace tunnel, whatever it puts around its packets: the TUN
//! side and the UDP side, each moving many packets per system call.
//!
//! - `tun`: a TUN device with virtio-net headers and offloads (TSO, USO where the kernel has
//!   it): a read gives a super-packet of up to 64 KiB; `write_packets` joins a batch's TCP
//!   segments per flow (`gro`) and writes each join in one call.
//! - `gso`: a super-packet read from TUN cut into the packets the wire carries, checksums
//!   complete, each segment written on its own so a batch can be cut in parallel.
//! - `gro`: the plan of which packets join, before a write to TUN.
//! - `udp`: UDP sockets that send runs of equal datagrams as GSO messages and receive GRO
//!   messages, `sendmmsg`/`recvmmsg` batches of them, each offload falling back (said once)
//!   where the kernel refuses it.
//! - `csum`, `ip`, `vnet`: checksums, the IP/TCP/UDP header fields this needs, the
//!   virtio-net header.
//!
//! A tunnel's loop, outbound: `Tun::read` → `gso::Plan` → its own framing per segment →
//! `UdpSock::send_runs`; inbound: `RecvBatch::recv` → `Message::datagrams` → its own
//! unframing → `Tun::write_packets`.

pub mod csum;
pub mod gro;
pub mod gso;
pub mod ip;
pub mod tun;
pub mod udp;
pub mod vnet;

pub use gro::Coalescer;
pub use gso::Plan;
pub use tun::{Tun, TunOptions};
pub use udp::{RecvBatch, Run, SendScratch, UdpSock};
pub use vnet::VnetHdr;
