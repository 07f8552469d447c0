//! flanneld: a subnet lease for this node from the cluster's registry (etcd v3 in flannel's
//! schema, the Kubernetes API's Node objects, or an embedded directory shared by the daemons of
//! one machine), subnet.env for the flannel CNI plugin, and the kernel's entries for the other
//! nodes' leases kept equal to them by one reconciler.

pub mod alloc;
pub mod annotation_prefix;
pub mod backend;
pub mod bringup;
pub mod config;
pub mod daemon;
pub mod doctor;
pub mod entries;
pub mod error;
pub mod family;
pub mod flags;
pub mod health;
pub mod iface;
pub mod lease;
pub mod masq;
pub mod metrics;
pub mod notify;
pub mod planes;
pub mod readiness;
pub mod reconcile;
pub mod registry;
pub mod report;
pub mod retrying;
pub mod settings;
pub mod spec;
pub mod view;
