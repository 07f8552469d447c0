//! The flannel meta-plugin's decisions: it reads the fabric daemon's subnet.env, builds a
//! delegate config (bridge + host-local unless told otherwise), saves it per container so
//! DEL undoes exactly what ADD did, and hands it to the delegate.

pub mod config;
pub mod delegate;
pub mod store;
pub mod subnet;

pub use config::NetConf;
pub use delegate::{build_delegate, delegate_type};
pub use store::{Saved, Store};
pub use subnet::{read_subnet_env, subnet_env_status, wait_for_subnet_env};
