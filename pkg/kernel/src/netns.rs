//! Network namespaces: opened by path, entered only for the length of a closure.

use cni_protocol::error::{CniError, UNKNOWN_CONTAINER};
use netns_rs::NetNs;
use std::path::Path;

pub struct Netns {
    inner: NetNs,
}

impl Netns {
    /// Opens the namespace at `path` (a bind mount or /proc/<pid>/ns/net).
    /// A missing one is error 3, unknown container.
    pub fn open(path: impl AsRef<Path>) -> Result<Netns, CniError> {
        let path = path.as_ref();
        netns_rs::get_from_path(path)
            .map(|inner| Netns { inner })
            .map_err(|e| {
                CniError::new(
                    UNKNOWN_CONTAINER,
                    format!("cannot open network namespace {}: {e}", path.display()),
                )
            })
    }

    /// Opens the namespace if it still exists: DEL's view, where a gone namespace is no error.
    pub fn open_if_exists(path: &str) -> Option<Netns> {
        if path.is_empty() {
            return None;
        }
        Self::open(path).ok()
    }

    /// The namespace of the calling thread.
    pub fn current() -> Result<Netns, CniError> {
        netns_rs::get_from_current_thread()
            .map(|inner| Netns { inner })
            .map_err(|e| CniError::io(format!("cannot open the current network namespace: {e}")))
    }

    pub fn path(&self) -> &Path {
        self.inner.path()
    }

    /// The namespace's file, for passing to the kernel (IFLA_NET_NS_FD, setns).
    pub fn file(&self) -> &std::fs::File {
        self.inner.file()
    }

    /// Runs `f` with the calling thread inside this namespace, then returns.
    pub fn run<T>(&self, f: impl FnOnce() -> T) -> Result<T, CniError> {
        self.inner.run(|_| f()).map_err(|e| {
            CniError::io(format!(
                "cannot enter network namespace {}: {e}",
                self.path().display()
            ))
        })
    }

    /// Whether two handles name the same namespace (same device and inode).
    pub fn same_as(&self, other: &Netns) -> bool {
        self.inner == other.inner
    }
}
