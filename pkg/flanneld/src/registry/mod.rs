//! Where leases live, behind one trait: etcd v3 in flannel's schema, or a directory shared by
//! the daemons of one machine. The daemon never knows which one it talks to.

pub mod dir;
pub mod etcd;
pub mod kube;

use crate::lease::SubnetKey;
use crate::view::BadEntry;
use std::fmt;
use std::future::Future;
use std::time::{Duration, SystemTime};
use tokio::sync::mpsc;

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
    /// The lease's key is already held (the create lost a race).
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

pub trait Registry: Send + Sync + 'static {
    /// Where the registry is, for log lines.
    fn describe(&self) -> String;

    /// Where the network config is looked for, for log lines.
    fn config_location(&self) -> String;

    /// The network config's text, or None while there is none.
    fn config(&self) -> impl Future<Output = Result<Option<Vec<u8>>>> + Send;

    fn list(&self) -> impl Future<Output = Result<Listing>> + Send;

    /// Creates the lease only if its key is free; returns its expiry.
    fn create(
        &self,
        key: &SubnetKey,
        value: &str,
        ttl: Duration,
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
}
