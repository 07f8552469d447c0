//! Leases as the daemon takes them from etcd (a watch event or a listing: the key's last element
//! and the value's bytes), one per line as `<key> <value>`; a line with a key alone deletes it.
//! Each goes into the lease view, then every lease it holds into the vxlan and host-gw
//! datapaths' wanted entries (plain routes and routes through nexthop objects, one id of which
//! another program holds) and into the subnet choice of a starting node. Property: a value that
//! decodes re-encodes to a value that decodes to an equal lease, and that encoding is stable.
#![no_main]

use flanneld::alloc::{self, Node};
use flanneld::backend::select;
use flanneld::config;
use flanneld::entries::RouteStyle;
use flanneld::family::IpFamily;
use flanneld::iface::{External, Source};
use flanneld::lease::{Lease, LeaseAttrs, SubnetKey};
use flanneld::spec::{DatapathSpec, DeviceIndex, FamilySpec};
use flanneld::view::LeaseView;
use libfuzzer_sys::fuzz_target;
use std::collections::HashSet;

const VXLAN: &str = r#"{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fc00::/48",
"Backend":{"Type":"vxlan","DirectRouting":true}}"#;
const HOST_GW: &str = r#"{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fc00::/48",
"Backend":{"Type":"host-gw"}}"#;
const OWN: &str = "10.5.1.0-24&fc00:0:0:1::-64";

/// This node's datapath under the config `text`, on eth0 (192.168.64.1/24, fd00::1/64).
fn datapath(text: &str, own: SubnetKey, style: RouteStyle) -> DatapathSpec {
    let cfg = config::parse(text).expect("the fixed config parses");
    let families = cfg
        .families()
        .into_iter()
        .filter_map(|family| {
            Some(FamilySpec {
                family,
                network: cfg.network(family)?,
                device: None,
            })
        })
        .collect();
    DatapathSpec {
        backend: select(&cfg).expect("the fixed config's backend"),
        ext: External {
            index: 2,
            name: "eth0".into(),
            mtu: 1500,
            iface_ip: Some("192.168.64.1".parse().expect("an address")),
            iface_ipv6: Some("fd00::1".parse().expect("an address")),
            public_ip: Some("192.168.64.1".parse().expect("an address")),
            public_ipv6: Some("fd00::1".parse().expect("an address")),
            public_ip_source: Source::Interface,
            public_ipv6_source: Source::Interface,
            addrs: vec![
                "192.168.64.1/24".parse().expect("a network"),
                "fd00::1/64".parse().expect("a network"),
            ],
        },
        own,
        families,
        style,
    }
}

fuzz_target!(|data: &[u8]| {
    let own = SubnetKey::parse(OWN).expect("the fixed key parses");
    let mut view = LeaseView::new(own);
    for line in data.split(|b| *b == b'\n') {
        let (key, value) = match line.iter().position(|b| *b == b' ') {
            Some(i) => (&line[..i], Some(&line[i + 1..])),
            None => (line, None),
        };
        let key = String::from_utf8_lossy(key);
        let Some(value) = value else {
            let _ = view.delete(&key);
            continue;
        };
        if let Ok(attrs) = LeaseAttrs::decode(value) {
            let encoded = attrs.encode();
            let again = LeaseAttrs::decode(encoded.as_bytes())
                .unwrap_or_else(|e| panic!("the re-encoded value does not decode: {e}\n{encoded}"));
            assert_eq!(attrs, again, "decode, encode, decode changed {value:?}");
            assert_eq!(
                again.encode(),
                encoded,
                "the encoding of {value:?} is not stable"
            );
        }
        let _ = view.put(&key, value);
    }

    let devs = DeviceIndex(vec![(IpFamily::V4, 3), (IpFamily::V6, 4)]);
    // Another program holds the nexthop id 10.5.2.0/24 would get.
    let taken = HashSet::from([4_000_000_002]);
    for (text, style) in [
        (VXLAN, RouteStyle::Plain),
        (VXLAN, RouteStyle::Nexthop),
        (HOST_GW, RouteStyle::Plain),
        (HOST_GW, RouteStyle::Nexthop),
    ] {
        let dp = datapath(text, own, style);
        for lease in view.leases() {
            for family in [IpFamily::V4, IpFamily::V6] {
                let _ = dp
                    .backend
                    .device(family, &dp.ext, lease.attrs.backend_data_of(family));
            }
        }
        let _ = dp.desired(&devs, &taken, view.leases());
    }
    let cfg = config::parse(VXLAN).expect("the fixed config parses");
    let leases: Vec<Lease> = view.leases().cloned().collect();
    let node = Node {
        public_ip: Some("192.168.64.1".parse().expect("an address")),
        public_ipv6: None,
    };
    // The first lease stands for an operator's reservation, so the reserved paths run too.
    let reserved: Vec<_> = leases.iter().take(1).map(|l| l.key).collect();
    let _ = alloc::choose(&cfg, &leases, &reserved, &node, Some(own), &mut |n| n / 2);
});
