//! Address families through the library's public API, without root: IPv6 listed first in the
//! network config or in a Node's podCIDRs (flannel-io/flannel#1985 and #1629 panicked on them),
//! flannel's key forms for dual-stack and IPv6-only leases, and the entries wanted when a lease
//! or this node lacks a family (flannel-io/flannel#1789 dereferenced a missing one).
//!
//! Written against the public API while pkg/flanneld/src is being restructured; they belong in
//! the test sections of config.rs, lease.rs, alloc.rs and the backend's desired state, and move
//! there once it settles. `desired_for` and `env_for` are the only places that know how the
//! daemon's pieces are put together.

use clap::Parser;
use cni_kernel::netlink::Route;
use flanneld::alloc::{self, Action};
use flanneld::backend::select;
use flanneld::config::{self, NetConfig};
use flanneld::entries::RouteStyle;
use flanneld::family::IpFamily;
use flanneld::flags::Flags;
use flanneld::iface::{External, Source};
use flanneld::lease::{Lease, LeaseAttrs, SubnetKey};
use flanneld::registry::kube::{self, NodeObject};
use flanneld::settings::Settings;
use flanneld::spec::{DatapathSpec, Desired, DeviceIndex, Firewall, Ground, NodeSpec};
use serde_json::value::RawValue;
use std::net::IpAddr;

const DUAL_V4_FIRST: &str = r#"{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fc00::/48","Backend":{"Type":"vxlan"}}"#;
const DUAL_V6_FIRST: &str = r#"{"EnableIPv6":true,"IPv6Network":"fc00::/48","EnableIPv4":true,"Network":"10.5.0.0/16","Backend":{"Type":"vxlan"}}"#;
const V6_ONLY: &str = r#"{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fc00::/48","Backend":{"Type":"vxlan"}}"#;
const V4_ONLY: &str = r#"{"Network":"10.5.0.0/16","Backend":{"Type":"vxlan"}}"#;

/// The devices' indices and the external interface's in `desired_for`'s node.
const DEV4: u32 = 10;
const DEV6: u32 = 11;
const EXT: u32 = 2;

fn parse(text: &str) -> NetConfig {
    config::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn key(text: &str) -> SubnetKey {
    SubnetKey::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

/// The first subnet the allocator hands a node with both public addresses in an empty registry.
fn first_key(cfg: &NetConfig) -> SubnetKey {
    let node = alloc::Node {
        public_ip: "192.168.0.1".parse().ok(),
        public_ipv6: "fd00::1".parse().ok(),
    };
    let plan = alloc::choose(cfg, &[], &[], &node, None, &mut |_| 0).expect("a free subnet");
    match plan.action {
        Action::Create(k) => k,
        other => panic!("{other:?}"),
    }
}

/// subnet.env as this node writes it for `own`.
fn env_for(cfg: &NetConfig, own: &SubnetKey) -> String {
    flanneld::spec::subnet_env(cfg, own, 1430, true).render()
}

/// What this node (192.168.0.1/24 and fd00::1/64 on its external interface, its devices of
/// the config's families) wants in the kernel for `leases` under the network config `text`.
fn desired_for(text: &str, own: &str, leases: &[Lease]) -> Desired {
    let (spec, devs) = local_for(text, own);
    spec.desired(&devs, &Default::default(), leases)
}

/// This node's datapath as the daemon derives it, and its devices' indices.
fn local_for(text: &str, own: &str) -> (DatapathSpec, DeviceIndex) {
    let cfg = parse(text);
    let settings = Settings::from_flags(&Flags::try_parse_from(["flanneld"]).unwrap());
    let ext = External {
        index: EXT,
        name: "eth0".into(),
        mtu: 1500,
        iface_ip: "192.168.0.1".parse().ok(),
        iface_ipv6: "fd00::1".parse().ok(),
        public_ip: "192.168.0.1".parse().ok(),
        public_ipv6: "fd00::1".parse().ok(),
        public_ip_source: Source::Interface,
        public_ipv6_source: Source::Interface,
        addrs: vec![
            "192.168.0.1/24".parse().unwrap(),
            "fd00::1/64".parse().unwrap(),
        ],
    };
    let own = Lease {
        key: key(own),
        attrs: LeaseAttrs {
            public_ip: ext.public_ip,
            public_ipv6: ext.public_ipv6,
            backend_type: cfg.backend_type.clone(),
            backend_data: None,
            backend_v6_data: None,
        },
    };
    // The datapath only: no firewall rules.
    let no_rules = Firewall {
        backend: None,
        note: None,
    };
    let ground = Ground {
        backend: select(&cfg).unwrap_or_else(|e| panic!("{text}: {e}")),
        cfg: cfg.clone(),
        ext,
        firewall: no_rules,
        masq: settings.masq,
        style: RouteStyle::Plain,
    };
    let spec = NodeSpec::derive(&ground, &own);
    let devs = DeviceIndex(
        [
            (IpFamily::V4, cfg.ipv4.map(|_| DEV4)),
            (IpFamily::V6, cfg.ipv6.map(|_| DEV6)),
        ]
        .into_iter()
        .filter_map(|(f, d)| Some((f, d?)))
        .collect(),
    );
    (spec.datapath, devs)
}

fn raw(json: &str) -> Option<Box<RawValue>> {
    RawValue::from_string(json.to_string()).ok()
}

/// Another node's lease: `key`, its public addresses of each family (empty: none), vxlan data
/// for the families given a MAC.
fn lease(key_text: &str, ip: &str, ip6: &str, mac4: Option<&str>, mac6: Option<&str>) -> Lease {
    let data =
        |mac: Option<&str>| mac.and_then(|m| raw(&format!(r#"{{"VNI":1,"VtepMAC":"{m}"}}"#)));
    Lease {
        key: key(key_text),
        attrs: LeaseAttrs {
            public_ip: ip.parse().ok(),
            public_ipv6: ip6.parse().ok(),
            backend_type: "vxlan".into(),
            backend_data: data(mac4),
            backend_v6_data: data(mac6),
        },
    }
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

/// (destination, gateway, device) of each wanted route.
fn routes(d: &Desired) -> Vec<(String, Option<IpAddr>, Option<u32>)> {
    d.want
        .entries
        .routes
        .iter()
        .map(|r| (r.dst.to_string(), r.gw, r.oif))
        .collect()
}

// ---- the order of families in the config --------------------------------------------------

#[test]
fn ipv6_listed_first_in_the_config_is_the_same_network() {
    assert_eq!(parse(DUAL_V6_FIRST), parse(DUAL_V4_FIRST));
    assert_eq!(
        parse(
            r#"{"Backend":{"Type":"vxlan"},"IPv6Network":"fc00::/48","EnableIPv6":true,"EnableIPv4":false}"#
        ),
        parse(V6_ONLY)
    );
    let cfg = parse(DUAL_V6_FIRST);
    assert_eq!(
        cfg.ipv4.map(|f| f.network.to_string()).as_deref(),
        Some("10.5.0.0/16")
    );
    assert_eq!(
        cfg.ipv6.map(|f| f.network.to_string()).as_deref(),
        Some("fc00::/48")
    );
}

#[test]
fn ipv6_listed_first_still_gives_the_ipv4_part_first_in_the_key_and_in_subnet_env() {
    let cfg = parse(DUAL_V6_FIRST);
    let own = first_key(&cfg);
    assert_eq!(own.to_string(), "10.5.1.0-24&fc00:0:0:1::-64");
    assert_eq!(
        env_for(&cfg, &own),
        "FLANNEL_NETWORK=10.5.0.0/16\nFLANNEL_SUBNET=10.5.1.1/24\n\
         FLANNEL_IPV6_NETWORK=fc00::/48\nFLANNEL_IPV6_SUBNET=fc00:0:0:1::1/64\n\
         FLANNEL_MTU=1430\nFLANNEL_IPMASQ=true\n"
    );
}

#[test]
fn ipv6_only_gives_the_empty_ipv4_part_and_no_ipv4_lines() {
    let cfg = parse(V6_ONLY);
    let own = first_key(&cfg);
    assert_eq!(own.to_string(), "0.0.0.0-0&fc00:0:0:1::-64");
    assert_eq!(
        env_for(&cfg, &own),
        "FLANNEL_IPV6_NETWORK=fc00::/48\nFLANNEL_IPV6_SUBNET=fc00:0:0:1::1/64\n\
         FLANNEL_MTU=1430\nFLANNEL_IPMASQ=true\n"
    );
    // The lease is this node's by its IPv6 address, the first enabled family's.
    let mine = Lease {
        key: own,
        attrs: LeaseAttrs {
            public_ip: None,
            public_ipv6: "fd00::1".parse().ok(),
            backend_type: "vxlan".into(),
            backend_data: None,
            backend_v6_data: None,
        },
    };
    let node = alloc::Node {
        public_ip: None,
        public_ipv6: "fd00::1".parse().ok(),
    };
    assert!(alloc::is_mine(&cfg, &node, &mine));
}

/// A Node as the API server sends it, with `podCIDRs` in the order given and flannel's
/// annotations for both families.
fn kube_node(name: &str, cidrs: &[&str]) -> NodeObject {
    let a = "flannel.alpha.coreos.com";
    let node = serde_json::json!({
        "metadata": {"name": name, "annotations": {
            format!("{a}/kube-subnet-manager"): "true",
            format!("{a}/backend-type"): "vxlan",
            format!("{a}/backend-data"): format!(r#"{{"VNI":1,"VtepMAC":"{MAC4}"}}"#),
            format!("{a}/backend-v6-data"): format!(r#"{{"VNI":1,"VtepMAC":"{MAC6}"}}"#),
            format!("{a}/public-ip"): "192.168.0.2",
            format!("{a}/public-ipv6"): "fd00::2",
        }},
        "spec": {"podCIDR": cidrs[0], "podCIDRs": cidrs},
    });
    serde_json::from_value(node).unwrap()
}

#[test]
fn ipv6_first_in_pod_cidrs_gives_the_same_keys_as_ipv4_first() {
    let names = kube::Annotations::new("flannel.alpha.coreos.com").unwrap();
    for (text, want) in [
        (DUAL_V6_FIRST, "10.5.2.0-24&fc00:0:0:2::-64"),
        (V6_ONLY, "0.0.0.0-0&fc00:0:0:2::-64"),
    ] {
        let cfg = parse(text);
        for cidrs in [
            ["fc00:0:0:2::/64", "10.5.2.0/24"],
            ["10.5.2.0/24", "fc00:0:0:2::/64"],
        ] {
            let node = kube_node("n2", &cidrs);
            let own = kube::own_subnet(&node, &cfg).unwrap().unwrap();
            assert_eq!(own.to_string(), want, "{text} {cidrs:?}");
            let lease = kube::node_lease(&node, &names, kube::Families::of(&cfg))
                .unwrap()
                .unwrap();
            assert_eq!(lease.key.to_string(), want, "{text} {cidrs:?}");
            assert_eq!(lease.attrs.public_ipv6, "fd00::2".parse().ok());
        }
    }
}

// ---- the key forms --------------------------------------------------------------------------

#[test]
fn dual_stack_and_ipv6_only_keys_are_read_and_written_as_flannel_does() {
    let k = key("10.5.52.0-24&fc00:0:0:1::-64");
    assert_eq!(
        k.ipv4.map(|n| n.to_string()).as_deref(),
        Some("10.5.52.0/24")
    );
    assert_eq!(
        k.ipv6.map(|n| n.to_string()).as_deref(),
        Some("fc00:0:0:1::/64")
    );
    assert_eq!(k.to_string(), "10.5.52.0-24&fc00:0:0:1::-64");

    let k = key("0.0.0.0-0&fc00:0:0:1::-64");
    assert_eq!(k.ipv4, None);
    assert_eq!(
        k.ipv6.map(|n| n.to_string()).as_deref(),
        Some("fc00:0:0:1::/64")
    );
    assert_eq!(k.to_string(), "0.0.0.0-0&fc00:0:0:1::-64");

    // An IPv6-only lease's value: Go writes PublicIP 0.0.0.0, which reads as none.
    let value = r#"{"PublicIP":"0.0.0.0","PublicIPv6":"fd00::3","BackendType":"vxlan","BackendV6Data":{"VNI":1,"VtepMAC":"aa:bb:cc:dd:ee:ff"}}"#;
    let l = Lease::decode("0.0.0.0-0&fc00:0:0:1::-64", value.as_bytes()).unwrap();
    assert_eq!(
        (l.attrs.public_ip, l.attrs.public_ipv6),
        (None, "fd00::3".parse().ok())
    );
    assert_eq!(l.attrs.encode(), value);
}

#[test]
fn keys_with_the_families_swapped_or_with_no_subnet_are_refused() {
    for bad in [
        "fc00:0:0:1::-64&10.5.52.0-24",
        "fc00:0:0:1::-64",
        "0.0.0.0-0",
        "0.0.0.0-0&",
        "10.5.52.0-24&",
        "10.5.52.0-24&fc00:0:0:1::1-64",
        "10.5.52.0-24&10.5.53.0-24",
    ] {
        assert!(SubnetKey::parse(bad).is_err(), "{bad:?} accepted");
    }
}

#[test]
fn a_lease_fits_only_a_config_of_the_same_families() {
    let dual = key("10.5.1.0-24&fc00:0:0:1::-64");
    let v4 = key("10.5.1.0-24");
    let v6 = key("0.0.0.0-0&fc00:0:0:1::-64");
    let cases = [
        (DUAL_V6_FIRST, [true, false, false]),
        (V4_ONLY, [false, true, false]),
        (V6_ONLY, [false, false, true]),
    ];
    for (text, want) in cases {
        let cfg = parse(text);
        let got = [&dual, &v4, &v6].map(|k| alloc::fits(&cfg, k));
        assert_eq!(got, want, "{text}");
    }
}

// ---- the desired state with one family absent -------------------------------------------

const MAC4: &str = "02:00:00:00:00:04";
const MAC6: &str = "02:00:00:00:00:06";
const OWN_DUAL: &str = "10.5.1.0-24&fc00:0:0:1::-64";

#[test]
fn a_dual_stack_peer_gets_a_route_a_neighbour_and_an_fdb_entry_per_family() {
    let peer = lease(
        "10.5.2.0-24&fc00:0:0:2::-64",
        "192.168.9.2",
        "fd09::2",
        Some(MAC4),
        Some(MAC6),
    );
    let d = desired_for(DUAL_V6_FIRST, OWN_DUAL, &[peer]);
    assert!(d.skipped.is_empty(), "{:?}", d.skipped);
    assert_eq!(
        routes(&d),
        vec![
            ("10.5.2.0/24".into(), Some(ip("10.5.2.0")), Some(DEV4)),
            (
                "fc00:0:0:2::/64".into(),
                Some(ip("fc00:0:0:2::")),
                Some(DEV6)
            ),
        ]
    );
    let fdb: Vec<_> = d
        .want
        .entries
        .fdb
        .iter()
        .map(|f| (f.device, f.dst))
        .collect();
    assert_eq!(
        fdb,
        vec![(DEV4, Some(ip("192.168.9.2"))), (DEV6, Some(ip("fd09::2")))]
    );
    let neigh: Vec<_> = d
        .want
        .entries
        .neighbours
        .iter()
        .map(|n| (n.device, n.ip))
        .collect();
    assert_eq!(
        neigh,
        vec![(DEV4, ip("10.5.2.0")), (DEV6, ip("fc00:0:0:2::"))]
    );
}

#[test]
fn a_peer_without_ipv6_in_a_dual_stack_network_gets_its_ipv4_entries_only() {
    // Its key has no IPv6 part (a node still on an IPv4-only config).
    let peer = lease("10.5.2.0-24", "192.168.9.2", "", Some(MAC4), None);
    let d = desired_for(DUAL_V6_FIRST, OWN_DUAL, &[peer]);
    assert_eq!(
        routes(&d),
        vec![("10.5.2.0/24".into(), Some(ip("10.5.2.0")), Some(DEV4))]
    );
    assert_eq!(
        (d.want.entries.neighbours.len(), d.want.entries.fdb.len()),
        (1, 1)
    );
    assert!(d.skipped.is_empty(), "{:?}", d.skipped);
}

#[test]
fn a_peer_with_an_ipv6_subnet_but_no_ipv6_address_or_mac_is_skipped_for_ipv6_alone() {
    let no_address = lease(
        "10.5.2.0-24&fc00:0:0:2::-64",
        "192.168.9.2",
        "",
        Some(MAC4),
        Some(MAC6),
    );
    let no_mac = lease(
        "10.5.3.0-24&fc00:0:0:3::-64",
        "192.168.9.3",
        "fd09::3",
        Some(MAC4),
        None,
    );
    let d = desired_for(DUAL_V6_FIRST, OWN_DUAL, &[no_address, no_mac]);
    let dsts: Vec<String> = routes(&d).into_iter().map(|r| r.0).collect();
    assert_eq!(dsts, vec!["10.5.2.0/24", "10.5.3.0/24"]);
    assert_eq!(d.skipped.len(), 2, "{:?}", d.skipped);
    assert!(
        d.skipped[0]
            .1
            .to_string()
            .contains("no public address for fc00:0:0:2::/64"),
        "{:?}",
        d.skipped
    );
    assert!(
        d.skipped[1]
            .1
            .to_string()
            .contains("no VtepMAC for fc00:0:0:3::/64"),
        "{:?}",
        d.skipped
    );
}

#[test]
fn an_ipv4_only_node_ignores_the_ipv6_half_of_dual_stack_leases() {
    let peer = lease(
        "10.5.2.0-24&fc00:0:0:2::-64",
        "192.168.9.2",
        "fd09::2",
        Some(MAC4),
        Some(MAC6),
    );
    let d = desired_for(V4_ONLY, "10.5.1.0-24", &[peer]);
    assert_eq!(
        routes(&d),
        vec![("10.5.2.0/24".into(), Some(ip("10.5.2.0")), Some(DEV4))]
    );
    assert!(d.want.entries.fdb.iter().all(|f| f.device == DEV4));
    assert!(d.skipped.is_empty(), "{:?}", d.skipped);
}

#[test]
fn an_ipv6_only_node_programs_ipv6_peers_and_nothing_for_ipv4_only_ones() {
    let v6_peer = lease("0.0.0.0-0&fc00:0:0:2::-64", "", "fd09::2", None, Some(MAC6));
    let v4_peer = lease("10.5.3.0-24", "192.168.9.3", "", Some(MAC4), None);
    let d = desired_for(V6_ONLY, "0.0.0.0-0&fc00:0:0:1::-64", &[v6_peer, v4_peer]);
    assert_eq!(
        routes(&d),
        vec![(
            "fc00:0:0:2::/64".into(),
            Some(ip("fc00:0:0:2::")),
            Some(DEV6)
        )]
    );
    let fdb: Vec<_> = d
        .want
        .entries
        .fdb
        .iter()
        .map(|f| (f.device, f.dst))
        .collect();
    assert_eq!(fdb, vec![(DEV6, Some(ip("fd09::2")))]);
    assert_eq!(d.want.entries.neighbours.len(), 1);
}

#[test]
fn host_gw_routes_each_family_via_that_familys_public_address() {
    let cfg = |text: &str| text.replace(r#""Type":"vxlan""#, r#""Type":"host-gw""#);
    let mut peer = lease(
        "10.5.2.0-24&fc00:0:0:2::-64",
        "192.168.0.2",
        "fd00::2",
        None,
        None,
    );
    peer.attrs.backend_type = "host-gw".into();
    let d = desired_for(&cfg(DUAL_V6_FIRST), OWN_DUAL, std::slice::from_ref(&peer));
    assert_eq!(
        routes(&d),
        vec![
            ("10.5.2.0/24".into(), Some(ip("192.168.0.2")), Some(EXT)),
            ("fc00:0:0:2::/64".into(), Some(ip("fd00::2")), Some(EXT)),
        ]
    );
    assert!(d.want.entries.neighbours.is_empty() && d.want.entries.fdb.is_empty());
    let d = desired_for(&cfg(V6_ONLY), "0.0.0.0-0&fc00:0:0:1::-64", &[peer]);
    assert_eq!(
        routes(&d),
        vec![("fc00:0:0:2::/64".into(), Some(ip("fd00::2")), Some(EXT))]
    );
}

#[test]
fn direct_routing_decides_per_family_whether_the_peer_is_on_the_link() {
    // The peer shares this node's IPv4 link but its IPv6 address is elsewhere.
    let text = DUAL_V6_FIRST.replace(
        r#""Type":"vxlan""#,
        r#""Type":"vxlan","DirectRouting":true"#,
    );
    let peer = lease(
        "10.5.2.0-24&fc00:0:0:2::-64",
        "192.168.0.2",
        "fd09::2",
        Some(MAC4),
        Some(MAC6),
    );
    let d = desired_for(&text, OWN_DUAL, &[peer]);
    assert_eq!(
        routes(&d),
        vec![
            ("10.5.2.0/24".into(), Some(ip("192.168.0.2")), Some(EXT)),
            (
                "fc00:0:0:2::/64".into(),
                Some(ip("fc00:0:0:2::")),
                Some(DEV6)
            ),
        ]
    );
    let fdb: Vec<_> = d
        .want
        .entries
        .fdb
        .iter()
        .map(|f| (f.device, f.dst))
        .collect();
    assert_eq!(fdb, vec![(DEV6, Some(ip("fd09::2")))]);
}

#[test]
fn the_kernels_route_to_the_ipv6_devices_own_address_is_not_the_datapaths() {
    // IPv6 adds `fc00:0:0:1:: dev flannel-v6.1 proto kernel metric 256` with the address; IPv4
    // adds no such route for flannel.1's /32.
    let (spec, devs) = local_for(DUAL_V6_FIRST, OWN_DUAL);
    let kernels = Route::new("fc00:0:0:1::/128".parse().unwrap(), None, Some(DEV6));
    assert!(!spec.owns_route(&devs, &kernels));
}
