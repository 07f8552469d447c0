//! subnet.env as flanneld writes it (or a broken one). Property: a file that parses renders
//! a text that parses to the same values.
#![no_main]

use libfuzzer_sys::fuzz_target;
use subnetenv::{parse_entries, SubnetEnv};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = parse_entries(&text);
    if let Ok(env) = SubnetEnv::parse(&text) {
        let _ = env.subnet_network();
        let _ = env.ipv6_subnet_network();
        let rendered = env.render();
        let again = SubnetEnv::parse(&rendered)
            .unwrap_or_else(|e| panic!("the rendered file does not parse: {e}\n{rendered}"));
        assert_eq!(env, again, "render then parse changed {text:?}");
    }
});
