//! End-to-end harness: the suite installed on a throwaway "node" and driven by real container
//! runtimes (podman, containerd) from the distribution's packages.
//!
//! A [`Node`] is a host network namespace plus a private view of the filesystem: the paths the
//! runtimes and plugins use (`/etc/cni/net.d`, `/opt/cni/bin`, `/run/flannel`, `/var/lib/cni`,
//! `/run`) are temporary directories bind-mounted inside a private mount namespace, so the
//! machine's root namespace, `/etc/cni` and `/opt/cni` are never touched. A [`Session`] is one
//! bash script run in that namespace for the whole life of a container; it stops at `pause` so
//! the test can look at the node while the container runs.

pub mod checks;
pub mod cri;
pub mod cri_node;
pub mod daemon_soak;
pub mod daemonset;
pub mod image;
pub mod install;
pub mod node;
pub mod plugins;
pub mod root;
pub mod session;
pub mod soak;

pub use node::{Footprint, Node};
pub use plugins::PluginSet;
pub use root::RootSnapshot;
pub use session::{Session, Step, Transcript};
