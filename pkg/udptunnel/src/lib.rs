//! The tunnel of flanneld's `udp` backend, wire-compatible with Go's flanneld: each IP packet
//! of the pods goes whole, as one UDP datagram, to port 8285 (`Backend.Port`) of the node whose
//! subnet holds its destination; what arrives is handed to the TUN device (`flannel0`) as it
//! came. Go's proxy moves one packet per system call; this one reads TCP super-packets from
//! TUN, cuts them into the wire's packets and sends each run as one UDP GSO message, and
//! joins what UDP GRO received before each TUN write (`tunio`).
//!
//! - `routes`: the other nodes' subnets and where each is reached.
//! - `control`: the text protocol flanneld speaks to the tunnel over its unix socket.
//! - `proxy`: the threads that move the packets.

pub mod control;
pub mod proxy;
pub mod routes;
