//! Where leases live, behind one trait: etcd v3 in flannel's schema, or a directory shared by
//! the daemons of one machine. The daemon never knows which one it talks to: how this node's
//! lease is taken is the registry's too ([`Registry::acquire`]; etcd and the directory choose
//! a free subnet and create its lease, a registry that assigns subnets itself returns the
//! one it was given).

pub mod cause;
pub mod dir;
pub mod etcd;
pub mod kube;

use crate::alloc::{self, Action, Node};
use crate::config::NetConfig;
use crate::lease::{Lease, LeaseAttrs, SubnetKey};
use crate::metrics::{self, METRICS};
use crate::view::BadEntry;
use std::fmt;
use std::future::Future;
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
#[derive(Debug, Clone)]
pub enum WatchEnd {
    /// The revision to resume from was compacted away.
    Compacted(i64),
    Broken(String),
    /// Nobody listens any more.
    Closed,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistryError {
    /// The lease's key, or one of its subnets, is already held (the create lost a race).
    Exists(SubnetKey),
    Failed(String),
}

impl fmt::Display for RegistryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegistryError::Exists(k) => write!(f, "subnet {k} is already leased"),
            RegistryError::Failed(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for RegistryError {}

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
    pub ttl: Duration,
}

pub trait Registry: Send + Sync + 'static {
    /// Where the registry is, for log lines.
    fn describe(&self) -> String;

    /// Where the network config is looked for, for log lines.
    fn config_location(&self) -> String;

    /// The network config's text, or None while there is none.
    fn config(&self) -> impl Future<Output = Result<Option<Vec<u8>>>> + Send;

    fn list(&self) -> impl Future<Output = Result<Listing>> + Send;

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
    fn renew(
        &self,
        key: &SubnetKey,
        value: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<SystemTime>> + Send;

    fn delete(&self, key: &SubnetKey) -> impl Future<Output = Result<()>> + Send;

    /// Sends every change after `revision` until the watch breaks; says why it ended.
    fn watch(
        &self,
        revision: i64,
        tx: mpsc::Sender<Change>,
    ) -> impl Future<Output = WatchEnd> + Send;

    /// Takes a lease for this node, retrying until one is held; returns its key and expiry,
    /// or why no lease can serve this network config (which retrying does not change). By
    /// default the node chooses: its own earlier lease, else a free subnet, created only if
    /// its key is still free.
    fn acquire(
        &self,
        req: &LeaseRequest<'_>,
    ) -> impl Future<Output = std::result::Result<(SubnetKey, SystemTime), String>> + Send
    where
        Self: Sized,
    {
        async move { Ok(choose_and_create(self, req).await) }
    }

    /// Puts the public addresses the registry holds for this node in place of the flags'
    /// (the kube mode's `node-public-ip` annotations); by default there are none.
    fn public_ips(&self, _wanted: &mut crate::iface::Wanted) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// What this node's earlier lease said of it (its devices' MACs are kept), if the
    /// registry answers at once. By default the lease that carries the node's public address.
    fn earlier_lease(
        &self,
        cfg: &NetConfig,
        node: &Node,
    ) -> impl Future<Output = Option<LeaseAttrs>> + Send
    where
        Self: Sized,
    {
        async move {
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
        }
    }
}

/// Lists until the registry answers, logging a failure when its cause changes.
pub async fn list_until_ok<R: Registry>(reg: &R) -> Listing {
    let mut trouble = cause::Retrying::default();
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
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(2));
    }
}

/// [`Registry::acquire`] of a registry where the node chooses its subnet.
pub async fn choose_and_create<R: Registry>(
    reg: &R,
    req: &LeaseRequest<'_>,
) -> (SubnetKey, SystemTime) {
    let value = req.attrs.encode();
    loop {
        let listing = list_until_ok(reg).await;
        let mut leases = Vec::new();
        for e in &listing.entries {
            match Lease::decode(&e.key, &e.value) {
                Ok(l) => leases.push(l),
                Err(reason) => warn!("skipping lease {} in {}: {reason}", e.key, reg.describe()),
            }
        }
        for b in &listing.bad {
            warn!(
                "skipping lease {} in {}: {}",
                b.key,
                reg.describe(),
                b.reason
            );
        }
        let plan = match alloc::choose(req.config, &leases, &req.node, req.previous, &mut |n| {
            fastrand::usize(..n)
        }) {
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
        let (key, result) = match plan.action {
            Action::Reuse(k) => (k, reg.renew(&k, &value, req.ttl).await),
            Action::Create(k) => (k, reg.create(&k, &value, req.ttl, listing.revision).await),
        };
        match result {
            Ok(expiry) => return (key, expiry),
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
