//! The seam between leases and the kernel: the datapath receives the other nodes' lease events
//! and keeps the kernel equal to them (vxlan, host-gw; flannel's `alloc` programs nothing).

pub mod datapath;
pub mod desired;
pub mod mode;

pub use datapath::Datapath;
