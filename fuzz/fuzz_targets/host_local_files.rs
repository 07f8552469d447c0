//! host-local's reservation files and index as DEL and GC meet them on disk: the input is
//! files (name NUL content NUL ...), the last one possibly the index. DEL releases a
//! container, GC keeps one; neither may panic whatever the files hold.
#![no_main]

use cni_ipam::store::Store;
use cni_ipam::Key;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir_in("/dev/shm").expect("a temporary directory in /dev/shm");
    let mut parts = data.split(|b| *b == 0);
    while let (Some(name), Some(content)) = (parts.next(), parts.next()) {
        let Ok(name) = std::str::from_utf8(name) else {
            continue;
        };
        if name.is_empty() || name.contains('/') || name == "." || name == ".." {
            continue;
        }
        let _ = std::fs::write(dir.path().join(name), content);
    }
    let Ok(mut store) = Store::open(dir.path()) else {
        return;
    };
    let _ = store.scan();
    let _ = store.release(&Key::new("c1", "eth0"));
    let _ = store.gc(&[Key::new("c2", "eth0")]);
    store.close();
});
