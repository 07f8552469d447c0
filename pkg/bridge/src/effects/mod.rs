//! What the plugin does with the decisions: the host's links (bridge, veth pair, port flags
//! and VLANs, gateways), the pod's interface, the firewall rules, IPAM in a thread of its own,
//! the undo record of a failing ADD, and CHECK's reading of what the kernel has. Kernel effects go through cni-kernel only.

pub mod check;
pub mod ipam;
pub mod links;
pub mod pod;
pub mod rules;
pub mod undo;
