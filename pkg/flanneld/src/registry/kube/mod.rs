//! Leases from Kubernetes Node objects, kept as kube-flannel keeps them (`--kube-subnet-mgr`):
//! a node's subnet is its `spec.podCIDR(s)`, assigned by the cluster; what other nodes need to
//! reach it lives in its annotations under `--kube-annotation-prefix`. This node writes its own
//! annotations with a strategic-merge PATCH of `nodes/<name>/status` and follows everyone
//! else's through a list and a watch.
//!
//! The decisions are pure and tested beside their code: `node` reads a Node (the annotation
//! names, this node's subnet, another node's lease), `patch` writes this node's status, `watch`
//! keeps the other nodes' leases from a list through its watch. The `kube-lite` crate carries
//! them to the API server; `KubeRegistry`, here, joins them behind the `Registry` trait and
//! retries what fails. Per node only what a lease needs is kept, never the Node object.

#[cfg(test)]
mod fixtures;
mod node;
mod patch;
mod watch;

pub use kube_lite::KubeError;
pub use node::{
    node_entry, node_lease, node_public_ips, own_attrs, own_subnet, pod_cidrs, Annotations,
    Families, NodeError, NodeMeta, NodeObject, NodeSpec, DEFAULT_PREFIX,
};
pub use patch::{annotation_patch, network_available_patch};
pub use watch::{Delivery, NodeWatch};

use crate::config::NetConfig;
use crate::lease::{Annotated, LeaseAttrs, SubnetKey};
use crate::metrics::{self, METRICS};
use crate::registry::{
    Acquired, Change, LeaseRequest, Listing, Registry, RegistryError, Result as RegResult, WatchEnd,
};
use crate::retrying::Retrying;
use crate::view::warn_skipped;

use futures::future::BoxFuture;
use futures::StreamExt;
use kube_lite::{Followed, KubeClient, NodeEnv, Patch, Selector, Source, NODES};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::{info, warn};

/// `--kube-subnet-mgr` and its flags.
#[derive(Debug, Clone)]
pub struct KubeOptions {
    pub api_url: Option<String>,
    pub kubeconfig: Option<PathBuf>,
    pub annotation_prefix: String,
    pub set_node_network_unavailable: bool,
    /// `--net-config-path`: the network config, as kube-flannel's ConfigMap mounts it.
    pub net_config: PathBuf,
}

/// The Kubernetes API as the daemon's registry of leases: this node's name, the watch's state
/// and where the network config is.
pub struct KubeRegistry {
    client: KubeClient,
    node_name: String,
    names: Annotations,
    net_conf_path: PathBuf,
    set_node_network_unavailable: bool,
    watch: Mutex<Option<NodeWatch>>,
    /// The network's families, from the config the node runs with.
    families: Mutex<Option<Families>>,
    /// Whether the other nodes are listed and watched: not for the `alloc` backend, which
    /// programs nothing (as Go's flanneld skips its node informer then, flannel#1617).
    follows_others: AtomicBool,
}

/// Retries of a failed request wait from 200 ms up to this, besides the client's own pace.
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// The rights flanneld asks for, said beside a refusal.
const RIGHTS: &str =
    "flanneld needs get, list and watch on nodes, patch on nodes/status and get on pods";

impl KubeRegistry {
    pub fn new(
        client: KubeClient,
        node_name: String,
        names: Annotations,
        net_conf_path: PathBuf,
        set_node_network_unavailable: bool,
    ) -> KubeRegistry {
        KubeRegistry {
            client,
            node_name,
            names,
            net_conf_path,
            set_node_network_unavailable,
            watch: Mutex::new(None),
            families: Mutex::new(None),
            follows_others: AtomicBool::new(true),
        }
    }

    /// Connects as the flags say and finds this node's name (through its pod when NODE_NAME
    /// is unset), waiting while the API server does not answer; Err for what waiting does not
    /// mend (no configuration, no name, a refusal).
    pub async fn open(opts: &KubeOptions) -> std::result::Result<KubeRegistry, KubeError> {
        let names = Annotations::new(&opts.annotation_prefix)
            .map_err(|e| KubeError::Config(format!("--kube-annotation-prefix {e}")))?;
        let client = KubeClient::connect(&Source {
            api_url: opts.api_url.as_deref(),
            kubeconfig: opts.kubeconfig.as_deref(),
            api_url_flag: "--kube-api-url",
            kubeconfig_flag: "--kubeconfig-file",
        })
        .await?
        .needing(RIGHTS);
        let env = NodeEnv::from_env();
        let mut trouble = Retrying::default();
        let node_name = loop {
            match client.node_name(&env).await {
                Ok(n) => break n,
                Err(e @ (KubeError::Unavailable(_) | KubeError::Unauthenticated(_))) => {
                    let e = e.to_string();
                    if trouble.failed(&e) {
                        warn!("finding this node's name: {e}; retrying");
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(e) => return Err(e),
            }
        };
        info!(
            "this node is {node_name:?} in the Kubernetes API at {}",
            client.server()
        );
        Ok(KubeRegistry::new(
            client,
            node_name,
            names,
            opts.net_config.clone(),
            opts.set_node_network_unavailable,
        ))
    }

    /// Puts the addresses a user annotated this node with (`node-public-ip`,
    /// `node-public-ipv6`) in place of `--public-ip` and `--public-ipv6`, as flanneld does
    /// before it looks for the interface. A node that cannot be read at once keeps the flags'.
    pub async fn apply_public_ips(&self, wanted: &mut crate::iface::Wanted) {
        let read = tokio::time::timeout(Duration::from_secs(5), self.annotated_public_ips()).await;
        match read {
            Ok(Ok((v4, v6))) => {
                let names = [&self.names.node_public_ip, &self.names.node_public_ipv6];
                let ips = [v4.map(IpAddr::V4), v6.map(IpAddr::V6)];
                for (ip, name) in ips.into_iter().zip(names) {
                    let Some(ip) = ip else { continue };
                    info!("public address {ip} from annotation {name}");
                    wanted.set_public(ip, name.clone());
                }
            }
            Ok(Err(RegistryError::Kube(KubeError::NotFound(_)))) => {}
            Ok(Err(e)) => warn!(
                "reading node {:?}'s public address annotations: {e}",
                self.node_name
            ),
            Err(_) => warn!(
                "reading node {:?}'s public address annotations: no answer within 5 s",
                self.node_name
            ),
        }
    }

    pub fn client(&self) -> &KubeClient {
        &self.client
    }

    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    pub fn names(&self) -> &Annotations {
        &self.names
    }

    pub fn net_conf_path(&self) -> &Path {
        &self.net_conf_path
    }

    pub fn sets_node_network_unavailable(&self) -> bool {
        self.set_node_network_unavailable
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<NodeWatch>> {
        self.watch.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// This node's lease: its podCIDR, waited for while it has none; then its annotations
    /// written as flanneld writes them, then (`--set-node-network-unavailable`) its condition.
    /// Requests that fail are retried with backoff, logged when their cause changes; Err only
    /// for a podCIDR the network config cannot hold, which waiting does not change.
    pub async fn take_lease(
        &self,
        cfg: &NetConfig,
        attrs: &LeaseAttrs,
        annotated: Annotated,
    ) -> RegResult<SubnetKey> {
        let name = self.node_name.as_str();
        let mut waiting = Retrying::default();
        let mut failing = Retrying::default();
        let mut delay = Duration::from_millis(200);
        let mut fail = |what: String, delay: &mut Duration| {
            metrics::inc(&METRICS.registry_errors);
            if failing.failed(&what) {
                warn!("{what}; retrying");
            }
            let d = *delay;
            *delay = (*delay * 2).min(MAX_BACKOFF);
            d
        };
        'again: loop {
            let node = match self.node(name).await {
                Ok(n) => n,
                Err(KubeError::NotFound(_)) => {
                    if waiting.failed("absent") {
                        info!("node {name:?} is not in the Kubernetes API yet; waiting for it");
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
                Err(e) => {
                    let d = fail(format!("reading node {name:?}: {e}"), &mut delay);
                    tokio::time::sleep(d).await;
                    continue;
                }
            };
            let key = match own_subnet(&node, cfg)? {
                Some(k) => k,
                None => {
                    if waiting.failed("no podCIDR") {
                        info!(
                            "node {name:?} has no podCIDR yet; waiting for the cluster to assign \
                             one (the controller manager's --allocate-node-cidrs)"
                        );
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            if let Some(patch) = annotation_patch(&node, attrs, annotated, &self.names) {
                loop {
                    match self.patch_status(name, &patch).await {
                        Ok(()) => break,
                        Err(KubeError::NotFound(_)) => continue 'again,
                        Err(e) => {
                            let d = fail(
                                format!("writing node {name:?}'s annotations: {e}"),
                                &mut delay,
                            );
                            tokio::time::sleep(d).await;
                        }
                    }
                }
                let written: Vec<&str> = patch["metadata"]["annotations"]
                    .as_object()
                    .map(|m| m.keys().map(String::as_str).collect())
                    .unwrap_or_default();
                info!("wrote node {name:?}'s annotations {}", written.join(", "));
            }
            if self.set_node_network_unavailable {
                loop {
                    let patch = network_available_patch(k8s_openapi::chrono::Utc::now());
                    match self.patch_status(name, &patch).await {
                        Ok(()) => break,
                        Err(KubeError::NotFound(_)) => continue 'again,
                        Err(e) => {
                            let d = fail(
                                format!(
                                    "setting node {name:?}'s NetworkUnavailable condition: {e}"
                                ),
                                &mut delay,
                            );
                            tokio::time::sleep(d).await;
                        }
                    }
                }
                info!("set node {name:?}'s condition NetworkUnavailable=False (FlannelIsUp)");
            }
            return Ok(key);
        }
    }

    /// What this node's annotations say of it, for the VtepMAC to keep (flannel#1795);
    /// None when the node cannot be read at once or carries no backend data.
    pub async fn earlier_attrs(&self) -> Option<LeaseAttrs> {
        let node = tokio::time::timeout(Duration::from_secs(5), self.node(&self.node_name))
            .await
            .ok()?
            .ok()?;
        own_attrs(&node, &self.names)
    }

    /// The addresses a user set for this node (`node-public-ip`, `node-public-ipv6`), which
    /// take the place of `--public-ip` and `--public-ipv6`.
    pub async fn annotated_public_ips(&self) -> RegResult<(Option<Ipv4Addr>, Option<Ipv6Addr>)> {
        let node = self.node(&self.node_name).await?;
        Ok(node_public_ips(&node, &self.names)?)
    }

    /// Every node that is a lease, listed anew; the watch resumes from this listing. Without
    /// following the other nodes (`alloc`), only this node's own, read by its name.
    pub async fn list_leases(&self, families: Families) -> std::result::Result<Listing, KubeError> {
        if !self.follows_others.load(Ordering::Relaxed) {
            let own = self.node(&self.node_name).await?;
            let (entries, bad) = match node_entry(&own, &self.names, families) {
                Ok(e) => (e.into_iter().collect(), Vec::new()),
                Err(reason) => (
                    Vec::new(),
                    vec![crate::view::BadEntry {
                        key: format!("node {}", self.node_name),
                        reason: reason.to_string(),
                    }],
                ),
            };
            return Ok(Listing {
                entries,
                bad,
                ..Listing::default()
            });
        }
        let listed = self
            .client
            .list::<NodeObject>(NODES, &Selector::all())
            .await?;
        let mut guard = self.lock();
        let w = guard.get_or_insert_with(|| NodeWatch::new(self.names.clone(), families));
        let d = w.listed(listed.items, listed.resource_version);
        Ok(Listing {
            entries: w.entries().cloned().collect(),
            bad: d.bad,
            ..Listing::default()
        })
    }

    /// Follows the nodes from the last listing, sending every lease change, until the
    /// server says the resourceVersion is too old (410, as the watch's answer or as an ERROR
    /// event in it: `Compacted`, for a new listing) or nobody listens. A watch the server ends
    /// (its timeout, a replica restarting) is watched again from the last resourceVersion,
    /// which bookmarks keep moving; a broken connection, a 429 or 5xx too, as often as the
    /// client's pace allows. A failure is logged when its cause changes.
    pub async fn follow(&self, tx: mpsc::Sender<Change>) -> WatchEnd {
        if !self.follows_others.load(Ordering::Relaxed) {
            tx.closed().await;
            return WatchEnd::Closed;
        }
        let Some(rv) = self
            .lock()
            .as_ref()
            .map(|w| w.resource_version().to_string())
        else {
            return WatchEnd::Broken(RegistryError::WatchEnded(
                "the nodes were never listed".into(),
            ));
        };
        let mut trouble = Retrying::default();
        let events = self
            .client
            .follow::<NodeObject>(NODES, &Selector::all(), &rv);
        let mut events = std::pin::pin!(events);
        while let Some(item) = events.next().await {
            let step = match item {
                Ok(Followed::Expired(m)) => {
                    info!("the watch on the nodes from resourceVersion {rv} on is too old ({m}); listing them again");
                    return WatchEnd::Compacted(0);
                }
                Ok(followed) => followed,
                Err(e) => {
                    metrics::inc(&METRICS.registry_errors);
                    let why = e.to_string();
                    if trouble.failed(&why) {
                        warn!("watching the nodes: {why}; retrying");
                    }
                    continue;
                }
            };
            if let Some((t, n)) = trouble.passed() {
                info!(
                    "watching the nodes at {} again, after {n} failed attempts in {} s",
                    self.client.server(),
                    t.as_secs()
                );
            }
            let d = {
                let mut guard = self.lock();
                let Some(w) = guard.as_mut() else {
                    return WatchEnd::Broken(RegistryError::WatchEnded(
                        "the nodes were never listed".into(),
                    ));
                };
                match &step {
                    Followed::Applied(n) => w.applied(n),
                    Followed::Deleted(n) => w.deleted(n),
                    Followed::Bookmark | Followed::Expired(_) => Delivery::default(),
                }
            };
            for b in &d.bad {
                warn_skipped(b, &self.describe());
            }
            for c in d.changes {
                if tx.send(c).await.is_err() {
                    return WatchEnd::Closed;
                }
            }
        }
        WatchEnd::Closed
    }

    async fn node(&self, name: &str) -> Result<NodeObject, KubeError> {
        self.client.get(NODES, None, name).await
    }

    /// A strategic-merge PATCH of `nodes/<name>/status`.
    async fn patch_status(&self, name: &str, body: &serde_json::Value) -> Result<(), KubeError> {
        let patch = Patch::Strategic(body.clone());
        self.client
            .patch(NODES, None, name, Some("status"), &patch)
            .await
            .map(drop)
    }
}

impl KubeRegistry {
    /// The families of the network config, for reading other nodes' annotations: IPv4 until
    /// the registry is told the config.
    fn families(&self) -> Families {
        let known = *self.families.lock().unwrap_or_else(|e| e.into_inner());
        known.unwrap_or(Families {
            ipv4: true,
            ipv6: false,
        })
    }

    /// The network config is a file (the ConfigMap's net-conf.json), as in flanneld's kube
    /// mode.
    async fn read_config(&self) -> RegResult<Option<Vec<u8>>> {
        match std::fs::read(&self.net_conf_path) {
            Ok(t) => Ok(Some(t)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(RegistryError::File {
                what: "reading",
                path: self.net_conf_path.clone(),
                source,
            }),
        }
    }
}

impl Registry for KubeRegistry {
    fn describe(&self) -> String {
        format!(
            "the Kubernetes API at {} (node {:?})",
            self.client.server(),
            self.node_name
        )
    }

    fn config_location(&self) -> String {
        self.net_conf_path.display().to_string()
    }

    fn config(&self) -> BoxFuture<'_, RegResult<Option<Vec<u8>>>> {
        Box::pin(self.read_config())
    }

    fn use_config(&self, cfg: &NetConfig) {
        *self.families.lock().unwrap_or_else(|e| e.into_inner()) = Some(Families::of(cfg));
        let follows = cfg.backend_type != "alloc";
        if !follows && self.follows_others.swap(false, Ordering::Relaxed) {
            info!(
                "the alloc backend programs nothing: the other nodes are neither listed nor \
                 watched"
            );
        }
        self.follows_others.store(follows, Ordering::Relaxed);
    }

    /// This node's own annotations, found by its name (its public address may be a user's
    /// overwrite).
    fn public_ips<'a>(&'a self, wanted: &'a mut crate::iface::Wanted) -> BoxFuture<'a, ()> {
        Box::pin(self.apply_public_ips(wanted))
    }

    fn earlier_lease<'a>(
        &'a self,
        _: &'a NetConfig,
        _: &'a crate::alloc::Node,
    ) -> BoxFuture<'a, Option<LeaseAttrs>> {
        Box::pin(self.earlier_attrs())
    }

    /// This node's podCIDR, its annotations written: the cluster assigned the subnet, and it
    /// does not expire.
    fn acquire<'a>(&'a self, req: &'a LeaseRequest<'a>) -> BoxFuture<'a, RegResult<Acquired>> {
        Box::pin(async move {
            let key = self
                .take_lease(req.config, req.attrs, req.annotated)
                .await?;
            Ok(Acquired { key, expiry: None })
        })
    }

    fn list(&self) -> BoxFuture<'_, RegResult<Listing>> {
        Box::pin(async move { Ok(self.list_leases(self.families()).await?) })
    }

    fn watch(&self, _revision: i64, tx: mpsc::Sender<Change>) -> BoxFuture<'_, WatchEnd> {
        Box::pin(self.follow(tx))
    }
}
