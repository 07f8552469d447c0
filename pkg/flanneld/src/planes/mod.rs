//! The planes of the node's kernel state that the reconciler keeps: the datapath's netlink
//! entries and the firewall's rules.

pub mod firewall;
pub mod netlink;
