//! A lease key's last element as the daemon reads it from etcd or the directory registry
//! (`10.5.52.0-24`, `10.5.52.0-24&fc00:0:0:1::-64`). Property: a key that parses prints as a
//! key that parses to the same subnets and prints the same.
#![no_main]

use flanneld::lease::SubnetKey;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(key) = SubnetKey::parse(&text) {
        let printed = key.to_string();
        let again = SubnetKey::parse(&printed).unwrap_or_else(|e| {
            panic!("{text:?} printed as {printed:?}, which does not parse: {e}")
        });
        assert_eq!(key, again, "{text:?} printed as {printed:?}");
        assert_eq!(again.to_string(), printed, "{text:?} does not print stably");
    }
});
