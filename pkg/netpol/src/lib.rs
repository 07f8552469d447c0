//! flannel-netpol: NetworkPolicy (networking.k8s.io/v1) for the pods of one node of a flannel
//! cluster, decided in the kernel: the policies compiled into nftables sets and verdict maps of
//! a table of its own, kept equal to what the cluster's objects say by writing the difference
//! at each change (its elements in one nfnetlink batch).

pub mod bridge;
pub mod compile;
pub mod daemon;
pub mod doctor;
pub mod enforcer;
pub mod flags;
pub mod flannel;
pub mod health;
pub mod kernel;
pub mod metrics;
pub mod model;
pub mod nft;
pub mod objects;
pub mod ranges;
pub mod selector;
pub mod watch;
