//! portmap's decisions, all pure: the config and its mappings validated, the container's
//! addresses picked from the previous result, the Go plugin's chain names, and the rule text
//! of ADD, DEL and CHECK for both backends (`iptables-restore` documents and `nft` scripts),
//! computed from what the kernel holds now, handed to the firewall driver (`rules`), which reads
//! that state and applies the text.

pub mod config;
pub mod container;
pub mod iptables;
pub mod names;
pub mod nftables;
pub mod rules;

pub use config::{Backend, Config, Mapping, MarkChain, Protocol};
pub use container::{host_interface, ContainerAddrs};
