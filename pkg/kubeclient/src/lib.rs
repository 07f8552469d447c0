//! The Kubernetes API as a node agent uses it (flanneld's `--kube-subnet-mgr`, the
//! NetworkPolicy enforcer): where the API server is (a kubeconfig, a URL, the in-cluster
//! service account), any kind of object read, listed in pages and followed by watches, a
//! PATCH, and what an error answer means.
//!
//! ```ignore
//! let client = KubeClient::connect(&source).await?;
//! // Every pod of this node, listed then followed; a relist on 410 is an Event::Listed again.
//! let pods = client.watcher::<serde_json::Value>(PODS, &Selector::fields("spec.nodeName=n1"));
//! ```
//!
//! What it does as client-go does: pages of 500 with a continue token (a list whose token
//! expires starts again), watches resumed from the last resourceVersion with bookmarks, a
//! resourceVersion too old (410, as an answer or an ERROR event) answered by a new list, a
//! watch that ends at once counted as a failure, and requests paced while they fail: a 429 or
//! 503 with `Retry-After` is asked again when it says (up to 30 s) and grows no backoff; other
//! failures back off from 0.5 s doubling to 30 s with jitter (to 3 s while the server does not
//! answer at all); a success ends the waiting. A failed connection is named by its cause (a
//! certificate, a name, a refused port).
//! Each answer is parsed as it arrives: a list of thousands of large objects never sits whole
//! in memory, only what the caller's type takes of each.

mod client;
mod config;
mod error;
mod follow;
mod pace;
mod page;
mod resource;

pub use client::{KubeClient, Listed, NodeEnv};
pub use config::{in_cluster_kubeconfig, NotInCluster, Source, SERVICE_ACCOUNT_DIR};
pub use error::{classify, KubeError, Op};
pub use follow::{Event, Followed};
pub use kube::api::Patch;
pub use kube::core::WatchEvent;
pub use resource::{
    null_as_default, Kind, Object, Selector, NAMESPACES, NETWORK_POLICIES, NODES, PODS,
};
