//! flannel's saved delegate files (ours, the Go plugin's, or torn by a crash), as DEL and GC
//! read them from the dataDir.
#![no_main]

use cni_flannel::{delegate_type, Saved, Store};
use libfuzzer_sys::fuzz_target;
use std::collections::HashSet;

fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir_in("/dev/shm").expect("a temporary directory in /dev/shm");
    let store = Store::new(dir.path());
    std::fs::write(store.path("c1"), data).expect("writing the saved file");
    if let Ok(Saved::Config(c)) = store.load("c1") {
        let _ = delegate_type(&c);
    }
    let _ = store.remove_stale("cbr0", &HashSet::new());
});
