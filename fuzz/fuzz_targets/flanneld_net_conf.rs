//! The network config (net-conf.json, or `<prefix>/config` in etcd) as the daemon checks it at
//! start, then the backend's own keys. Property: a config that is accepted hands out subnets
//! that exist: SubnetLen at least the network's prefix, SubnetMin and SubnetMax inside the
//! network, on a subnet boundary, in order.
#![no_main]

use flanneld::backend::select;
use flanneld::config::{self, Family};
use ipnetwork::{Ipv4Network, Ipv6Network};
use libfuzzer_sys::fuzz_target;

fn check_v4(f: &Family<Ipv4Network>, text: &str) {
    let len = f.subnet_len;
    assert!(len >= f.network.prefix() && len <= 32, "{f:?} from {text}");
    for sn in [f.subnet_min, f.subnet_max] {
        assert_eq!(sn.prefix(), len, "{f:?} from {text}");
        assert!(f.network.contains(sn.network()), "{f:?} from {text}");
        let step = if len == 32 { 1 } else { 1u64 << (32 - len) };
        assert_eq!(
            u64::from(u32::from(sn.network())) % step,
            0,
            "{f:?} from {text}"
        );
    }
    assert!(
        f.subnet_min.network() <= f.subnet_max.network(),
        "{f:?} from {text}"
    );
}

fn check_v6(f: &Family<Ipv6Network>, text: &str) {
    let len = f.subnet_len;
    assert!(len >= f.network.prefix() && len <= 128, "{f:?} from {text}");
    for sn in [f.subnet_min, f.subnet_max] {
        assert_eq!(sn.prefix(), len, "{f:?} from {text}");
        assert!(f.network.contains(sn.network()), "{f:?} from {text}");
        let step = if len == 128 { 1 } else { 1u128 << (128 - len) };
        assert_eq!(u128::from(sn.network()) % step, 0, "{f:?} from {text}");
    }
    assert!(
        f.subnet_min.network() <= f.subnet_max.network(),
        "{f:?} from {text}"
    );
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let Ok(cfg) = config::parse(&text) else {
        return;
    };
    if let Some(f) = &cfg.ipv4 {
        check_v4(f, &text);
    }
    if let Some(f) = &cfg.ipv6 {
        check_v6(f, &text);
    }
    let _ = select(&cfg);
});
