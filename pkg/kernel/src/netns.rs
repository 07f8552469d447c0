//! Network namespaces: opened by path, entered only for the length of a closure.

use crate::error::{Error, Kind};
use netns_rs::NetNs;
use std::path::Path;

pub struct Netns {
    inner: NetNs,
}

impl Netns {
    /// Opens the namespace at `path` (a bind mount or /proc/<pid>/ns/net).
    /// A missing one is an error of kind `NoNamespace`.
    pub fn open(path: impl AsRef<Path>) -> Result<Netns, Error> {
        let path = path.as_ref();
        netns_rs::get_from_path(path)
            .map(|inner| Netns { inner })
            .map_err(|e| {
                Error::failed("opening network namespace", path.display(), e)
                    .with_kind(Kind::NoNamespace)
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
    pub fn current() -> Result<Netns, Error> {
        netns_rs::get_from_current_thread()
            .map(|inner| Netns { inner })
            .map_err(|e| Error::failed("opening the current network namespace", "", e))
    }

    pub fn path(&self) -> &Path {
        self.inner.path()
    }

    /// The namespace's file, for passing to the kernel (IFLA_NET_NS_FD, setns).
    pub fn file(&self) -> &std::fs::File {
        self.inner.file()
    }

    /// Runs `f` with the calling thread inside this namespace, then returns.
    pub fn run<T>(&self, f: impl FnOnce() -> T) -> Result<T, Error> {
        self.inner
            .run(|_| f())
            .map_err(|e| Error::failed("entering network namespace", self.path().display(), e))
    }

    /// Whether two handles name the same namespace (same device and inode).
    pub fn same_as(&self, other: &Netns) -> bool {
        self.inner == other.inner
    }
}
