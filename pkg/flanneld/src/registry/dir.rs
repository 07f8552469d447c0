//! The embedded registry: the network config and one file per lease in a directory that the
//! daemons of one machine share, as nodes share an etcd. Each lease file holds flannel's lease
//! value and its expiry; writes go through a temporary file and a rename under an exclusive
//! lock, and whoever reads an expired lease removes it.

use super::{Change, Entry, KeyValue, Listing, RegistryError, Result, WatchEnd};
use crate::lease::SubnetKey;
use crate::view::BadEntry;
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;

/// How often a watch looks at the directory.
pub const POLL: Duration = Duration::from_millis(200);

#[derive(Serialize, Deserialize)]
struct LeaseFile {
    /// Seconds since the epoch.
    #[serde(rename = "Expiration")]
    expiration: u64,
    #[serde(rename = "Lease")]
    lease: Box<RawValue>,
}

#[derive(Debug, Clone)]
pub struct DirRegistry {
    root: PathBuf,
    /// The network config when the directory holds none.
    fallback_config: PathBuf,
    /// Opened to read (`doctor`): nothing made, expired leases left to the daemons.
    read_only: bool,
}

/// `what` on `path` failed.
fn file(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> RegistryError {
    let path = path.to_path_buf();
    move |source| RegistryError::File { what, path, source }
}

/// Why a file of the directory is no lease file: outside data, logged and skipped.
#[derive(Debug, thiserror::Error)]
enum BadLeaseFile {
    #[error(transparent)]
    Read(#[from] std::io::Error),
    #[error("not a lease file: {0}")]
    Json(#[from] serde_json::Error),
}

fn epoch_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl DirRegistry {
    /// Creates the directory layout if needed.
    pub fn open(root: &Path, fallback_config: &Path) -> Result<DirRegistry> {
        let reg = DirRegistry {
            read_only: false,
            ..DirRegistry::reader(root, fallback_config)
        };
        let subnets = reg.subnets();
        fs::create_dir_all(&subnets)
            .map_err(file("creating the --registry-dir directory", &subnets))?;
        Ok(reg)
    }

    /// The directory to read only: a directory not made yet holds no lease.
    pub fn reader(root: &Path, fallback_config: &Path) -> DirRegistry {
        DirRegistry {
            root: root.to_path_buf(),
            fallback_config: fallback_config.to_path_buf(),
            read_only: true,
        }
    }

    fn subnets(&self) -> PathBuf {
        self.root.join("subnets")
    }

    fn lock(&self) -> Result<Flock<File>> {
        let path = self.root.join("lock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o644)
            .open(&path)
            .map_err(file("opening", &path))?;
        Flock::lock(file, FlockArg::LockExclusive)
            .map_err(|(_, source)| RegistryError::Lock { path, source })
    }

    fn read_lease(path: &Path) -> std::result::Result<LeaseFile, BadLeaseFile> {
        Ok(serde_json::from_slice(&fs::read(path)?)?)
    }

    fn write_lease(&self, key: &SubnetKey, value: &str, ttl: Duration) -> Result<SystemTime> {
        let expires = SystemTime::now() + ttl;
        let bad_value = |source| RegistryError::Value { key: *key, source };
        let lease = RawValue::from_string(value.to_string()).map_err(bad_value)?;
        let body = serde_json::to_vec(&LeaseFile {
            expiration: epoch_secs(expires),
            lease,
        })
        .map_err(bad_value)?;
        let path = self.subnets().join(key.to_string());
        let tmp = self.subnets().join(format!(".{key}.tmp"));
        let write = || -> std::io::Result<()> {
            let mut f = OpenOptions::new()
                .create(true)
                .truncate(true)
                .write(true)
                .mode(0o644)
                .open(&tmp)?;
            f.write_all(&body)?;
            f.sync_all()?;
            fs::rename(&tmp, &path)
        };
        write().map_err(file("writing", &path))?;
        Ok(expires)
    }

    fn list_now(&self) -> Result<Listing> {
        let dir = self.subnets();
        let mut listing = Listing::default();
        let rd = match fs::read_dir(&dir) {
            Err(e) if self.read_only && e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(listing)
            }
            rd => rd.map_err(file("listing", &dir))?,
        };
        let now = epoch_secs(SystemTime::now());
        let mut expired = Vec::new();
        for ent in rd.flatten() {
            let name = ent.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            match Self::read_lease(&ent.path()) {
                Ok(f) if f.expiration <= now => expired.push(ent.path()),
                Ok(f) => listing.entries.push(Entry {
                    key: name,
                    value: f.lease.get().as_bytes().to_vec(),
                }),
                Err(reason) => listing.bad.push(BadEntry {
                    key: ent.path().display().to_string(),
                    reason: reason.to_string(),
                }),
            }
        }
        if !expired.is_empty() && !self.read_only {
            let _lock = self.lock()?;
            for path in expired {
                // Renewed meanwhile? Then it stays.
                if let Ok(f) = Self::read_lease(&path) {
                    if f.expiration <= now {
                        let _ = fs::remove_file(&path);
                    }
                }
            }
        }
        listing.entries.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(listing)
    }

    fn create_now(&self, key: &SubnetKey, value: &str, ttl: Duration) -> Result<SystemTime> {
        let _lock = self.lock()?;
        let now = epoch_secs(SystemTime::now());
        let dir = self.subnets();
        let rd = fs::read_dir(&dir).map_err(file("listing", &dir))?;
        // Any live lease sharing either subnet, under its own key or another one.
        for ent in rd.flatten() {
            let name = ent.file_name().to_string_lossy().into_owned();
            let Ok(held) = SubnetKey::parse(&name) else {
                continue;
            };
            if !held.shares_a_subnet_with(key) {
                continue;
            }
            match Self::read_lease(&ent.path()) {
                Ok(f) if f.expiration <= now => {}
                _ => return Err(RegistryError::Exists(*key)),
            }
        }
        self.write_lease(key, value, ttl)
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(DirRegistry) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || f(me)).await?
    }
}

impl DirRegistry {
    async fn read_config(&self) -> Result<Option<Vec<u8>>> {
        for path in [self.root.join("config"), self.fallback_config.clone()] {
            match tokio::fs::read(&path).await {
                Ok(b) => return Ok(Some(b)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(file("reading", &path)(e)),
            }
        }
        Ok(None)
    }

    async fn list_leases(&self) -> Result<Listing> {
        self.blocking(|r| r.list_now()).await
    }

    /// Polls the directory and sends the whole set whenever a lease's value changed, one
    /// appeared, or one went (deleted or expired).
    async fn follow(&self, tx: mpsc::Sender<Change>) -> WatchEnd {
        let mut last: Option<BTreeMap<String, Vec<u8>>> = None;
        let mut ticker = tokio::time::interval(POLL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let listing = match self.list_leases().await {
                Ok(l) => l,
                Err(e) => return WatchEnd::Broken(e),
            };
            // Unreadable files count too, so that a new one is reported.
            let now: BTreeMap<String, Vec<u8>> = listing
                .entries
                .iter()
                .map(|e| (e.key.clone(), e.value.clone()))
                .chain(
                    listing
                        .bad
                        .iter()
                        .map(|b| (b.key.clone(), b.reason.clone().into_bytes())),
                )
                .collect();
            // The first look is sent too: it covers what changed since the caller listed.
            if last.as_ref() != Some(&now) {
                if tx.send(Change::Snapshot(listing)).await.is_err() {
                    return WatchEnd::Closed;
                }
                last = Some(now);
            }
        }
    }
}

impl KeyValue for DirRegistry {
    fn describe(&self) -> String {
        format!("the embedded registry in {}", self.root.display())
    }

    fn config_location(&self) -> String {
        format!(
            "{} or {}",
            self.root.join("config").display(),
            self.fallback_config.display()
        )
    }

    async fn config(&self) -> Result<Option<Vec<u8>>> {
        self.read_config().await
    }

    async fn list(&self) -> Result<Listing> {
        self.list_leases().await
    }

    async fn watch(&self, _revision: i64, tx: mpsc::Sender<Change>) -> WatchEnd {
        self.follow(tx).await
    }

    /// The directory has no revisions: the lock makes a create and the check that no lease
    /// shares its subnets one step.
    async fn create(
        &self,
        key: &SubnetKey,
        value: &str,
        ttl: Duration,
        _listed: i64,
    ) -> Result<SystemTime> {
        let (key, value) = (*key, value.to_string());
        self.blocking(move |r| r.create_now(&key, &value, ttl))
            .await
    }

    async fn put(&self, key: &SubnetKey, value: &str, ttl: Duration) -> Result<SystemTime> {
        let (key, value) = (*key, value.to_string());
        self.blocking(move |r| {
            let _lock = r.lock()?;
            r.write_lease(&key, &value, ttl)
        })
        .await
    }

    async fn delete(&self, key: &SubnetKey) -> Result<()> {
        let path = self.subnets().join(key.to_string());
        self.blocking(move |r| {
            let _lock = r.lock()?;
            match fs::remove_file(&path) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(file("removing", &path)(e)),
            }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_sharing_either_subnet_of_a_live_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let reg = DirRegistry::open(dir.path(), &dir.path().join("none")).unwrap();
        let k = |t: &str| SubnetKey::parse(t).unwrap();
        let ttl = Duration::from_secs(60);
        let value = r#"{"PublicIP":"192.168.0.2","BackendType":"alloc"}"#;
        reg.create_now(&k("10.5.1.0-24&fc00:0:0:1::-64"), value, ttl)
            .unwrap();
        for taken in [
            "10.5.1.0-24&fc00:0:0:1::-64",
            "10.5.2.0-24&fc00:0:0:1::-64",
            "10.5.1.0-24&fc00:0:0:2::-64",
        ] {
            assert!(
                matches!(reg.create_now(&k(taken), value, ttl), Err(RegistryError::Exists(e)) if e == k(taken))
            );
        }
        reg.create_now(&k("10.5.2.0-24&fc00:0:0:2::-64"), value, ttl)
            .unwrap();
        // An expired lease holds nothing.
        reg.write_lease(&k("10.5.3.0-24&fc00:0:0:3::-64"), value, Duration::ZERO)
            .unwrap();
        reg.create_now(&k("10.5.4.0-24&fc00:0:0:3::-64"), value, ttl)
            .unwrap();
    }

    #[test]
    fn a_reader_makes_nothing_and_leaves_expired_leases() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("reg");
        let none = dir.path().join("none");
        let listing = DirRegistry::reader(&root, &none).list_now().unwrap();
        assert!(listing.entries.is_empty() && !root.exists());
        let reg = DirRegistry::open(&root, &none).unwrap();
        let key = SubnetKey::parse("10.5.3.0-24").unwrap();
        let value = r#"{"PublicIP":"192.168.0.2","BackendType":"alloc"}"#;
        reg.write_lease(&key, value, Duration::ZERO).unwrap();
        let listing = DirRegistry::reader(&root, &none).list_now().unwrap();
        assert!(listing.entries.is_empty());
        assert!(root.join("subnets/10.5.3.0-24").exists());
        assert!(!root.join("lock").exists());
        reg.list_now().unwrap();
        assert!(!root.join("subnets/10.5.3.0-24").exists());
    }
}
