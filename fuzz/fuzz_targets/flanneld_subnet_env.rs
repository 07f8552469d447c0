//! subnet.env as the daemon reads it back at start (an earlier run's, or an operator's edit):
//! the subnet it asks for again, and the old networks and subnets whose masquerade rules it
//! removes. Properties: the two readers agree on the subnets; and a subnet the file names, with
//! room for a first address, comes back unchanged from the subnet.env the daemon writes for it.
#![no_main]

use flanneld::bringup::previous_key_in;
use flanneld::config;
use flanneld::masq;
use flanneld::spec::subnet_env;
use libfuzzer_sys::fuzz_target;

const CONFIG: &str = r#"{"Network":"10.0.0.0/8","EnableIPv6":true,"IPv6Network":"fc00::/16"}"#;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let key = previous_key_in(&text);
    let (v4, v6) = masq::previous(&text);
    if let Some((_, subnet)) = v4 {
        assert_eq!(
            key.and_then(|k| k.ipv4).map(|n| (n.network(), n.prefix())),
            Some((subnet.network(), subnet.prefix())),
            "the two readers disagree on {text:?}"
        );
    }
    if let Some((_, subnet)) = v6 {
        assert_eq!(
            key.and_then(|k| k.ipv6).map(|n| (n.network(), n.prefix())),
            Some((subnet.network(), subnet.prefix())),
            "the two readers disagree on {text:?}"
        );
    }
    let Some(key) = key else {
        return;
    };
    let roomy =
        key.ipv4.is_none_or(|n| n.prefix() < 32) && key.ipv6.is_none_or(|n| n.prefix() < 128);
    if roomy {
        let cfg = config::parse(CONFIG).expect("the fixed config parses");
        let written = subnet_env(&cfg, &key, 1450, true).render();
        assert_eq!(
            previous_key_in(&written),
            Some(key),
            "{text:?} names {key}, whose subnet.env reads back otherwise:\n{written}"
        );
    }
});
