//! Where leases live, behind one lease-shaped trait, as flannel's `subnet.Manager` is: the
//! network config, this node's lease taken ([`Registry::acquire`]) and renewed, and the other
//! nodes' leases listed and watched. Three registries implement it: etcd v3 in flannel's schema
//! ([`etcd`]), the Kubernetes API's Node objects (`--kube-subnet-mgr`, [`kube`]), and, chosen
//! explicitly, an embedded directory shared by the daemons of one machine ([`dir`]). [`open`]
//! makes the one the settings choose, as one value; the daemon and `doctor` never know which
//! one they talk to. In etcd and the directory the node chooses a free subnet and creates its
//! lease ([`choose_and_create`]); in the Kubernetes API the cluster assigns it (the podCIDR).

pub mod dir;
pub mod etcd;
pub mod kube;

use crate::alloc::{self, Action, Node};
use crate::config::NetConfig;
use crate::iface::Wanted;
use crate::lease::{Annotated, Lease, LeaseAttrs, SubnetKey};
use crate::metrics::{self, METRICS};
use crate::retrying::Retrying;
use crate::view::{warn_skipped, BadEntry};
use etcd::{EtcdOptions, EtcdRegistry};
use futures::future::BoxFuture;
use kube::{KubeError, KubeOptions, KubeRegistry, NodeError};
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::mpsc;
use tracing::{error, info, warn};

/// One stored lease, undecoded: the key's last element and the value's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub key: String,
    pub value: Vec<u8>,
}

/// Every lease at one moment.
#[derive(Debug, Clone, Default)]
pub struct Listing {
    pub entries: Vec<Entry>,
    /// Entries the registry itself could not read (a truncated file), to be logged.
    pub bad: Vec<BadEntry>,
    /// Where a watch continues from (etcd's revision; 0 where there is none).
    pub revision: i64,
    /// The entries that never expire because an operator wrote them so (etcd keys without an
    /// etcd lease: reservations), by key; never deleted, never free, kept without expiry.
    pub reserved: Vec<String>,
}

/// What a watch reports.
#[derive(Debug, Clone)]
pub enum Change {
    Put(Entry),
    Delete(String),
    /// The whole set, where the registry cannot tell single changes apart.
    Snapshot(Listing),
}

/// Why a watch ended; the daemon lists again and watches anew.
#[derive(Debug)]
pub enum WatchEnd {
    /// The revision to resume from was compacted away.
    Compacted(i64),
    Broken(RegistryError),
    /// Nobody listens any more.
    Closed,
}

/// What went wrong in a registry: the etcd client's, the kube client's and the file system's
/// errors as they came, with what was being done.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The lease's key, or one of its subnets, is already held (the create lost a race).
    #[error("subnet {0} is already leased")]
    Exists(SubnetKey),
    /// etcd refused `what`; `cause` says why as the operator fixes it.
    #[error("{what}: {cause}")]
    Etcd {
        what: String,
        cause: String,
        #[source]
        source: etcd_client::Error,
    },
    /// `what` had no answer in time.
    #[error("{what}: no answer within {after:?}")]
    Timeout { what: String, after: Duration },
    #[error(transparent)]
    Kube(#[from] KubeError),
    /// This node's Node cannot give it a lease (a podCIDR outside the network config).
    #[error(transparent)]
    Node(#[from] NodeError),
    /// `what` (`reading`, `writing`, ...) on a file or directory of the registry.
    #[error("{what} {}: {source}", path.display())]
    File {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The directory's lock.
    #[error("locking {}: {source}", path.display())]
    Lock {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
    /// A lease value that is not JSON, to be written.
    #[error("lease value for {key}: {source}")]
    Value {
        key: SubnetKey,
        #[source]
        source: serde_json::Error,
    },
    /// `--etcd-certfile` without `--etcd-keyfile`, or the other way round.
    #[error("--etcd-certfile and --etcd-keyfile go together")]
    CertWithoutKey,
    /// The blocking task a request ran in ended without an answer.
    #[error("registry task: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// A watch the registry ended or cancelled (`why`, in its words), or one that could not
    /// go on.
    #[error("{0}")]
    WatchEnded(String),
    /// A lease of a registry whose leases do not expire was to be renewed.
    #[error("the leases of {0} do not expire")]
    DoesNotExpire(String),
}

pub type Result<T> = std::result::Result<T, RegistryError>;

/// What this node asks of the registry for its lease.
#[derive(Debug, Clone)]
pub struct LeaseRequest<'a> {
    pub config: &'a NetConfig,
    /// This node's public addresses, by which its earlier lease is found.
    pub node: Node,
    /// The subnet of the subnet.env an earlier run wrote, if it can be had again.
    pub previous: Option<SubnetKey>,
    /// The lease's value: this node's addresses and its backend's data.
    pub attrs: &'a LeaseAttrs,
    /// Which of its families a Node's annotations carry.
    pub annotated: Annotated,
    pub ttl: Duration,
}

/// The lease a node holds: its subnets, and when it expires unless renewed (None: never, as a
/// podCIDR, which the cluster assigned).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acquired {
    pub key: SubnetKey,
    pub expiry: Option<SystemTime>,
}

/// Where leases live, as the daemon and `doctor` use it.
pub trait Registry: Send + Sync {
    /// Where the registry is, for log lines.
    fn describe(&self) -> String;

    /// Where the network config is looked for, for log lines.
    fn config_location(&self) -> String;

    /// The network config's text, or None while there is none.
    fn config(&self) -> BoxFuture<'_, Result<Option<Vec<u8>>>>;

    /// Told the network config the node runs with, parsed once: a registry that reads the
    /// leases by its families (the kube mode's annotations) keeps them. By default nothing.
    fn use_config(&self, _cfg: &NetConfig) {}

    /// Puts the public addresses the registry holds for this node in place of the flags'
    /// (the kube mode's `node-public-ip` annotations); by default there are none.
    fn public_ips<'a>(&'a self, _wanted: &'a mut Wanted) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }

    /// What this node's earlier lease said of it (its devices' MACs are kept), if the
    /// registry answers at once. By default the listed lease that carries the node's public
    /// address.
    fn earlier_lease<'a>(
        &'a self,
        cfg: &'a NetConfig,
        node: &'a Node,
    ) -> BoxFuture<'a, Option<LeaseAttrs>> {
        Box::pin(async move {
            let listing = tokio::time::timeout(Duration::from_secs(5), self.list())
                .await
                .ok()?
                .ok()?;
            listing
                .entries
                .iter()
                .filter_map(|e| Lease::decode(&e.key, &e.value).ok())
                .find(|l| alloc::is_mine(cfg, node, l))
                .map(|l| l.attrs)
        })
    }

    /// Takes a lease for this node, retrying until one is held; or why no lease can serve
    /// this network config, which retrying does not change.
    fn acquire<'a>(&'a self, req: &'a LeaseRequest<'a>) -> BoxFuture<'a, Result<Acquired>>;

    /// Renews this node's lease, before the expiry `acquire` gave; its new expiry. Only a
    /// lease that expires is renewed: a registry whose leases do not (a podCIDR stays until
    /// its Node goes, as in flannel's kube subnet manager) is never asked, and keeps this.
    fn renew<'a>(&'a self, _lease: &'a Lease, _ttl: Duration) -> BoxFuture<'a, Result<SystemTime>> {
        Box::pin(async move { Err(RegistryError::DoesNotExpire(self.describe())) })
    }

    /// Every lease at one moment.
    fn list(&self) -> BoxFuture<'_, Result<Listing>>;

    /// Sends every change after `revision` (a listing's) until the watch breaks; says why it
    /// ended.
    fn watch(&self, revision: i64, tx: mpsc::Sender<Change>) -> BoxFuture<'_, WatchEnd>;
}

/// A registry where the node chooses its own subnet and creates its lease, as the key-value
/// stores (etcd, the directory) keep them. Such a registry is a [`Registry`]: it acquires by
/// [`choose_and_create`] and renews by writing the lease again.
pub trait KeyValue: Send + Sync {
    /// Where the registry is, for log lines.
    fn describe(&self) -> String;

    /// Where the network config is looked for, for log lines.
    fn config_location(&self) -> String;

    /// The network config's text, or None while there is none.
    fn config(&self) -> impl Future<Output = Result<Option<Vec<u8>>>> + Send;

    fn list(&self) -> impl Future<Output = Result<Listing>> + Send;

    /// Sends every change after `revision` until the watch breaks; says why it ended.
    fn watch(
        &self,
        revision: i64,
        tx: mpsc::Sender<Change>,
    ) -> impl Future<Output = WatchEnd> + Send;

    /// Creates the lease only if no lease holds either of its subnets; returns its expiry.
    /// `listed` is the revision of the listing the subnet was chosen from: a registry that
    /// has revisions refuses the create when any lease was created after it, since a key
    /// names both families and two nodes may choose different keys that share one subnet.
    fn create(
        &self,
        key: &SubnetKey,
        value: &str,
        ttl: Duration,
        listed: i64,
    ) -> impl Future<Output = Result<SystemTime>> + Send;

    /// Writes the lease with a fresh TTL; returns its expiry.
    fn put(
        &self,
        key: &SubnetKey,
        value: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<SystemTime>> + Send;

    fn delete(&self, key: &SubnetKey) -> impl Future<Output = Result<()>> + Send;
}

impl<T: KeyValue> Registry for T {
    fn describe(&self) -> String {
        KeyValue::describe(self)
    }

    fn config_location(&self) -> String {
        KeyValue::config_location(self)
    }

    fn config(&self) -> BoxFuture<'_, Result<Option<Vec<u8>>>> {
        Box::pin(KeyValue::config(self))
    }

    fn acquire<'a>(&'a self, req: &'a LeaseRequest<'a>) -> BoxFuture<'a, Result<Acquired>> {
        Box::pin(async move { Ok(choose_and_create(self, req).await) })
    }

    fn renew<'a>(&'a self, lease: &'a Lease, ttl: Duration) -> BoxFuture<'a, Result<SystemTime>> {
        Box::pin(async move { self.put(&lease.key, &lease.attrs.encode(), ttl).await })
    }

    fn list(&self) -> BoxFuture<'_, Result<Listing>> {
        Box::pin(KeyValue::list(self))
    }

    fn watch(&self, revision: i64, tx: mpsc::Sender<Change>) -> BoxFuture<'_, WatchEnd> {
        Box::pin(KeyValue::watch(self, revision, tx))
    }
}

/// Which registry the flags choose, with its options.
#[derive(Debug, Clone)]
pub enum RegistryChoice {
    /// etcd v3; `defaulted` when no endpoint was named and flanneld's default is used.
    Etcd {
        options: EtcdOptions,
        defaulted: bool,
    },
    /// The embedded registry: a directory shared by the daemons of one machine
    /// (`--registry-dir`), the network config falling back to `--net-config-path`.
    Dir { root: PathBuf, net_config: PathBuf },
    /// The Kubernetes API (`--kube-subnet-mgr`): a node's subnet is its podCIDR, the network
    /// config is `--net-config-path`.
    Kube(KubeOptions),
}

impl RegistryChoice {
    /// The first log line: where leases live, and why there.
    pub fn describe(&self) -> String {
        match self {
            RegistryChoice::Dir { root, .. } => format!(
                "--registry-dir given: using the embedded registry in {}",
                root.display()
            ),
            RegistryChoice::Etcd {
                options,
                defaulted: true,
            } => format!(
                "no --etcd-endpoints or --registry-dir given: leases in etcd at flanneld's \
                 default endpoints {} under {}",
                options.endpoints.join(","),
                options.prefix
            ),
            RegistryChoice::Etcd { options, .. } => format!(
                "leases in etcd at {} under {}",
                options.endpoints.join(","),
                options.prefix
            ),
            RegistryChoice::Kube(k) => format!(
                "--kube-subnet-mgr given: leases from Node objects in the Kubernetes API ({}), \
                 annotations under {}",
                match (&k.api_url, &k.kubeconfig) {
                    (_, Some(path)) => format!("kubeconfig {}", path.display()),
                    (Some(url), None) => url.clone(),
                    (None, None) => "in-cluster configuration".into(),
                },
                k.annotation_prefix
            ),
        }
    }
}

impl RegistryChoice {
    /// What a start without a lease waits for, for systemd's status line.
    pub fn waited_for(&self) -> String {
        match self {
            RegistryChoice::Dir { root, .. } => format!("the network config in {}", root.display()),
            RegistryChoice::Etcd { options, .. } => {
                format!("etcd at {}", options.endpoints.join(","))
            }
            RegistryChoice::Kube(_) => {
                "the Kubernetes API (this node's Node and its podCIDR)".to_string()
            }
        }
    }
}

/// The registry `choice` names, as one value. Err for a registry set up wrong (an unreadable
/// TLS file, no kubeconfig, no node name): what waiting does not mend. A registry that does
/// not answer yet is no error here: its requests say so, and the daemon waits for it.
pub async fn open(choice: &RegistryChoice) -> Result<Arc<dyn Registry>> {
    Ok(match choice {
        RegistryChoice::Dir { root, net_config } => {
            Arc::new(dir::DirRegistry::open(root, net_config)?)
        }
        RegistryChoice::Etcd { options, .. } => {
            Arc::new(EtcdRegistry::connect(options.clone()).await?)
        }
        RegistryChoice::Kube(options) => Arc::new(KubeRegistry::open(options).await?),
    })
}

/// The registry `choice` names, to read only (`doctor`): the embedded registry's directory is
/// neither made nor rid of expired leases; etcd and the Kubernetes API are only read anyway.
pub async fn open_to_read(choice: &RegistryChoice) -> Result<Arc<dyn Registry>> {
    match choice {
        RegistryChoice::Dir { root, net_config } => {
            Ok(Arc::new(dir::DirRegistry::reader(root, net_config)))
        }
        _ => open(choice).await,
    }
}

/// Lists until the registry answers, logging a failure when its cause changes.
pub async fn list_until_ok(reg: &dyn Registry) -> Listing {
    let mut trouble = Retrying::default();
    let mut delay = Duration::from_millis(200);
    loop {
        match reg.list().await {
            Ok(l) => {
                if trouble.passed().is_some() {
                    info!("reached {} again", reg.describe());
                }
                return l;
            }
            Err(e) => {
                metrics::inc(&METRICS.registry_errors);
                let e = e.to_string();
                if trouble.failed(&e) {
                    warn!("listing leases in {}: {e}; retrying", reg.describe());
                }
            }
        }
        // Short: a registry that cannot answer fails fast (etcd's members without a leader do),
        // and the listing after its return must come within a fraction of a second.
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(500));
    }
}

/// The leases of a listing that decode, the others said and skipped.
fn decoded(listing: &Listing, where_: &str) -> Vec<Lease> {
    let mut leases = Vec::new();
    for e in &listing.entries {
        match Lease::decode(&e.key, &e.value) {
            Ok(l) => leases.push(l),
            Err(reason) => warn_skipped(
                &BadEntry {
                    key: e.key.clone(),
                    reason: reason.to_string(),
                },
                where_,
            ),
        }
    }
    for b in &listing.bad {
        warn_skipped(b, where_);
    }
    leases
}

/// [`Registry::acquire`] of a registry where the node chooses its subnet: its own earlier
/// lease, else a free subnet, created only if its key is still free.
pub async fn choose_and_create<R: KeyValue>(reg: &R, req: &LeaseRequest<'_>) -> Acquired {
    let value = req.attrs.encode();
    loop {
        let listing = list_until_ok(reg).await;
        let leases = decoded(&listing, &KeyValue::describe(reg));
        let reserved: Vec<SubnetKey> = listing
            .reserved
            .iter()
            .filter_map(|k| SubnetKey::parse(k).ok())
            .collect();
        let plan = match alloc::choose(
            req.config,
            &leases,
            &reserved,
            &req.node,
            req.previous,
            &mut |n| fastrand::usize(..n),
        ) {
            Ok(p) => p,
            Err(e) => {
                error!("{e}; retrying in 5 s");
                tokio::time::sleep(Duration::from_secs(5)).await;
                continue;
            }
        };
        for stale in &plan.stale {
            info!("deleting this node's lease {stale}: it does not fit the network config");
            if let Err(e) = reg.delete(stale).await {
                warn!("deleting lease {stale}: {e}");
            }
        }
        for kept in &plan.kept {
            warn!("this node's reservation {kept} does not fit the network config: left as it is");
        }
        let (key, result) = match plan.action {
            Action::Reuse(k) => {
                if reserved.contains(&k) {
                    info!("subnet {k} is reserved for this node (no etcd lease): it stays a reservation");
                }
                (k, reg.put(&k, &value, req.ttl).await)
            }
            Action::Create(k) => (k, reg.create(&k, &value, req.ttl, listing.revision).await),
        };
        match result {
            Ok(expiry) => {
                return Acquired {
                    key,
                    expiry: Some(expiry),
                }
            }
            Err(RegistryError::Exists(k)) => {
                info!("subnet {k}: another node took a lease meanwhile; choosing again");
                tokio::time::sleep(Duration::from_millis(fastrand::u64(10..200))).await;
            }
            Err(e) => {
                metrics::inc(&METRICS.registry_errors);
                warn!("taking lease {key}: {e}; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}
