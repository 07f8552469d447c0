//! Three nodes on one machine (testkit::cluster: node namespaces on an underlay bridge), flanneld
//! on each, two pods per node through the stock flannel conflist: what an operator checks on a
//! real cluster. Once against the embedded registry and once against a real etcd in the
//! underlay, for vxlan, host-gw and vxlan with DirectRouting; vxlan and host-gw also with
//! leases from Node objects (`--kube-subnet-mgr`, the API server stand-in in the underlay). Routes
//! go through nexthop objects; vxlan and host-gw run once more with plain routes
//! (`FLANNELD_NEXTHOPS=false`).

use std::path::Path;
use std::time::{Duration, Instant};
use testkit::cluster::{wait_for, Cluster, Family, Node, Registry};

const FLANNELD: &str = env!("CARGO_BIN_EXE_flanneld");
/// A ceiling for waits, a change in the leases reaching every other node's kernel included.
const T: Duration = Duration::from_secs(30);
const PORT: u16 = 7000;

#[derive(Clone, Copy, Debug)]
enum Backend {
    Vxlan,
    HostGw,
    DirectRouting,
}

impl Backend {
    fn config(self) -> &'static str {
        match self {
            Backend::Vxlan => r#"{"Network":"10.21.0.0/16","Backend":{"Type":"vxlan"}}"#,
            Backend::HostGw => r#"{"Network":"10.22.0.0/16","Backend":{"Type":"host-gw"}}"#,
            Backend::DirectRouting => {
                r#"{"Network":"10.23.0.0/16","Backend":{"Type":"vxlan","DirectRouting":true}}"#
            }
        }
    }

    /// FLANNEL_MTU on an underlay whose eth0 has 1500: vxlan takes 50 bytes of headers.
    fn mtu(self) -> u64 {
        match self {
            Backend::Vxlan | Backend::DirectRouting => 1450,
            Backend::HostGw => 1500,
        }
    }

    /// Routes to other nodes go over the vxlan device, or straight to their address on eth0
    /// (host-gw, and DirectRouting since every node shares the underlay's link).
    fn via_underlay(self) -> bool {
        !matches!(self, Backend::Vxlan)
    }
}

/// How flanneld programs the routes to the other nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Style {
    Nexthop,
    Plain,
}

impl Style {
    /// Sets node `index`'s flanneld to this style from its next start on.
    fn set(self, c: &mut Cluster, index: u8) {
        if self == Style::Plain {
            c.set_flanneld_env(index, "FLANNELD_NEXTHOPS", "false");
        }
    }
}

/// The cluster with flanneld running on every node and two pods per node.
fn cluster(prefix: &str, registry: Registry, config: &str, nodes: u8) -> Cluster {
    cluster_in(Style::Nexthop, prefix, registry, config, nodes)
}

fn cluster_in(style: Style, prefix: &str, registry: Registry, config: &str, nodes: u8) -> Cluster {
    let mut c = Cluster::new(prefix, 77, nodes, registry, config);
    for n in 1..=nodes {
        style.set(&mut c, n);
    }
    c.start_flanneld_everywhere(Path::new(FLANNELD), T);
    for n in 1..=nodes {
        c.add_pod(n);
        c.add_pod(n);
    }
    c
}

/// Every pod serves its name on PORT; every other pod connects and reads it.
fn assert_tcp_between_every_pair(c: &mut Cluster) {
    for i in 0..c.pods().len() {
        c.pod_mut(i).serve_tcp(PORT, &format!("pod{i}"));
    }
    for (i, from) in c.pods().iter().enumerate() {
        for (j, to) in c.pods().iter().enumerate() {
            if i == j {
                continue;
            }
            assert_eq!(
                from.tcp_read(&to.ip, PORT).as_deref(),
                Some(format!("pod{j}").as_str()),
                "TCP from pod {i} (node {}) to pod {j} (node {}, {}:{PORT})\n{}",
                from.node,
                to.node,
                to.ip,
                c.describe()
            );
        }
    }
}

fn flannel_mtu(node: &Node) -> u64 {
    let v = node.subnet_env("FLANNEL_MTU", T);
    v.parse()
        .unwrap_or_else(|e| panic!("FLANNEL_MTU={v} on node {}: {e}", node.index))
}

fn cidr_of_key(key: &str) -> String {
    key.replacen('-', "/", 1)
}

// ---- what works with leases alone -------------------------------------------------------

fn leases_and_pods_within_a_node(prefix: &str, registry: Registry) {
    let mut c = cluster(
        prefix,
        registry,
        r#"{"Network":"10.20.0.0/16","Backend":{"Type":"vxlan"}}"#,
        3,
    );
    // One lease per node, each a different /24 of the network, each node's in its subnet.env.
    let keys: Vec<String> = c.nodes().iter().map(|n| n.lease_key(T)).collect();
    let mut sorted = keys.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), 3, "leases are not distinct: {keys:?}");
    assert_eq!(c.lease_keys(), sorted, "the registry's leases");
    for n in c.nodes() {
        assert_eq!(n.subnet_env("FLANNEL_NETWORK", T), "10.20.0.0/16");
        assert!(
            keys.iter()
                .all(|k| k.starts_with("10.20.") && k.ends_with("-24")),
            "{keys:?}"
        );
    }
    // Every node hears of every other node's lease, with the address it reaches it at.
    for n in c.nodes() {
        for other in c.nodes().iter().filter(|o| o.index != n.index) {
            let key = other.lease_key(T);
            n.wait_log(&format!("lease added: {key} public-ip {}", other.ip), T);
        }
    }
    // Pods get addresses in their node's subnet and the node's FLANNEL_MTU.
    for p in c.pods() {
        let node = c.node(p.node);
        let subnet = node.subnet_env("FLANNEL_SUBNET", T);
        let prefix3 = subnet.rsplit_once('.').map(|(a, _)| a).unwrap_or_default();
        assert!(
            p.ip.starts_with(&format!("{prefix3}.")),
            "pod {} on node {} is not in {subnet}",
            p.ip,
            p.node
        );
        assert_eq!(p.mtu(), flannel_mtu(node), "pod {} MTU", p.ip);
    }
    // The two pods of a node reach each other (ping and TCP), on every node.
    for i in 0..c.pods().len() {
        c.pod_mut(i).serve_tcp(PORT, &format!("pod{i}"));
    }
    for (i, a) in c.pods().iter().enumerate() {
        for (j, b) in c.pods().iter().enumerate() {
            if i == j || a.node != b.node {
                continue;
            }
            assert!(
                a.ping(&b.ip, 2),
                "pod {} cannot ping {} on node {}",
                a.ip,
                b.ip,
                a.node
            );
            assert_eq!(
                a.tcp_read(&b.ip, PORT).as_deref(),
                Some(format!("pod{j}").as_str()),
                "TCP from {} to {} on node {}",
                a.ip,
                b.ip,
                a.node
            );
        }
    }
    for i in 1..=3 {
        assert!(
            c.flanneld_running(i),
            "flanneld on node {i} exited:\n{}",
            c.node(i).log()
        );
    }
}

#[test]
fn embedded_registry_three_nodes_lease_subnets_and_pods_on_a_node_reach_each_other() {
    leases_and_pods_within_a_node("cle", Registry::Embedded);
}

#[test]
fn etcd_in_the_underlay_three_nodes_lease_subnets_and_pods_on_a_node_reach_each_other() {
    leases_and_pods_within_a_node("clx", Registry::Etcd);
}

// ---- what needs the backends ------------------------------------------------------------

/// Every pod reaches every other (ping and TCP), routes go where the backend sends them,
/// and pods carry FLANNEL_MTU.
fn every_pod_reaches_every_other(prefix: &str, registry: Registry, backend: Backend, style: Style) {
    let mut c = cluster_in(style, prefix, registry, backend.config(), 3);
    c.wait_every_pod_reaches_every_other(&[Family::V4], T);
    assert_tcp_between_every_pair(&mut c);
    for n in c.nodes() {
        assert_eq!(
            flannel_mtu(n),
            backend.mtu(),
            "FLANNEL_MTU on node {}",
            n.index
        );
        for other in c.nodes().iter().filter(|o| o.index != n.index) {
            let subnet = cidr_of_key(&other.lease_key(T));
            let routes = n.routes_to(Family::V4, &subnet);
            assert_eq!(
                routes.len(),
                1,
                "node {}: routes to {subnet}: {routes:?}",
                n.index
            );
            // Through a nexthop, `ip -j route` shows the nexthop's gateway and device too.
            assert_eq!(
                routes[0]["nhid"].is_u64(),
                style == Style::Nexthop,
                "node {}: {routes:?}",
                n.index
            );
            if backend.via_underlay() {
                assert_eq!(
                    routes[0]["gateway"],
                    other.ip.as_str(),
                    "node {}: {routes:?}",
                    n.index
                );
                assert_eq!(routes[0]["dev"], "eth0", "node {}: {routes:?}", n.index);
            } else {
                assert_eq!(
                    routes[0]["dev"], "flannel.1",
                    "node {}: {routes:?}",
                    n.index
                );
            }
        }
    }
    for p in c.pods() {
        assert_eq!(p.mtu(), backend.mtu(), "pod {} on node {}", p.ip, p.node);
    }
}

/// A fourth node joins and is reached without restarting anyone; then the third node dies and
/// its lease is deleted: its routes, neighbours and FDB entries leave every other node.
fn a_node_joins_and_another_leaves(
    prefix: &str,
    registry: Registry,
    backend: Backend,
    style: Style,
) {
    let mut c = cluster_in(style, prefix, registry, backend.config(), 3);
    c.wait_every_pod_reaches_every_other(&[Family::V4], T);

    let four = c.add_node();
    style.set(&mut c, four);
    c.start_flanneld(four, Path::new(FLANNELD), &[]);
    c.node(four).wait_subnet_env(T);
    c.add_pod(four);
    c.add_pod(four);
    c.wait_every_pod_reaches_every_other(&[Family::V4], T);

    let gone = c.node(3);
    let (gone_ip, key) = (gone.ip.clone(), gone.lease_key(T));
    let subnet = cidr_of_key(&key);
    let vtep = key.split('-').next().unwrap_or_default().to_string();
    let others = [1, 2, four];
    for &i in &others {
        let n = c.node(i);
        assert_eq!(
            n.routes_to(Family::V4, &subnet).len(),
            1,
            "node {i} before the removal"
        );
        if !backend.via_underlay() {
            assert!(
                n.neighbours()
                    .lines()
                    .any(|l| l.starts_with(&format!("{vtep} "))),
                "node {i} has no neighbour entry for {vtep} before the removal:\n{}",
                n.neighbours()
            );
            assert!(
                n.fdb().contains(&format!("dst {gone_ip} ")),
                "node {i} has no FDB entry towards {gone_ip} before the removal:\n{}",
                n.fdb()
            );
        }
    }
    c.stop_flanneld(3);
    c.delete_lease(&key);
    let left = |n: &Node| {
        n.routes_to(Family::V4, &subnet).is_empty()
            && !n
                .neighbours()
                .lines()
                .any(|l| l.starts_with(&format!("{vtep} ")))
            && !n.fdb().contains(&format!("dst {gone_ip} "))
    };
    let start = Instant::now();
    while !others.iter().all(|&i| left(c.node(i))) {
        if start.elapsed() > T {
            panic!(
                "{T:?} after lease {key} of node 3 ({gone_ip}) was deleted, entries for it remain:\n{}",
                c.describe()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // The rest still reach each other.
    let staying: Vec<usize> = (0..c.pods().len())
        .filter(|&i| c.pods()[i].node != 3)
        .collect();
    for &i in &staying {
        for &j in &staying {
            if i != j {
                let (a, b) = (&c.pods()[i], &c.pods()[j]);
                assert!(
                    a.ping(&b.ip, 2),
                    "pod {} -> {} after node 3 left",
                    a.ip,
                    b.ip
                );
            }
        }
    }
}

macro_rules! backend_tests {
    ($($module:ident, $prefix:literal: $registry:expr, $backend:expr, $style:expr;)*) => {$(
        mod $module {
            use super::*;

            #[test]
            fn every_pod_reaches_every_other_pod_by_ping_and_tcp() {
                every_pod_reaches_every_other(
                    concat!($prefix, "m"),
                    $registry,
                    $backend,
                    $style,
                );
            }

            #[test]
            fn a_node_added_later_is_reached_and_a_deleted_lease_leaves_every_node() {
                a_node_joins_and_another_leaves(
                    concat!($prefix, "j"),
                    $registry,
                    $backend,
                    $style,
                );
            }
        }
    )*};
}

backend_tests! {
    vxlan_embedded, "cve": Registry::Embedded, Backend::Vxlan, Style::Nexthop;
    vxlan_etcd, "cvx": Registry::Etcd, Backend::Vxlan, Style::Nexthop;
    host_gw_embedded, "che": Registry::Embedded, Backend::HostGw, Style::Nexthop;
    host_gw_etcd, "chx": Registry::Etcd, Backend::HostGw, Style::Nexthop;
    direct_routing_embedded, "cde": Registry::Embedded, Backend::DirectRouting, Style::Nexthop;
    direct_routing_etcd, "cdx": Registry::Etcd, Backend::DirectRouting, Style::Nexthop;
    vxlan_kube, "cvk": Registry::Kube, Backend::Vxlan, Style::Nexthop;
    host_gw_kube, "chk": Registry::Kube, Backend::HostGw, Style::Nexthop;
    vxlan_plain_routes, "cvp": Registry::Embedded, Backend::Vxlan, Style::Plain;
    host_gw_plain_routes, "chp": Registry::Embedded, Backend::HostGw, Style::Plain;
}

// ---- the external interface found by the public address ------------------------------------

/// Node 3 has a second port on the underlay, eth1 at 192.168.77.103 beside eth0's .3, and its
/// flanneld gets no --iface but that address as its public one: `--public-ip`, or with the
/// kube registry the `node-public-ip` annotation, which takes the flag's place. As in
/// flanneld, eth1 (the interface holding it) is the external interface, at that address: the
/// others send node 3's traffic there, node 3 sends from there, and pods reach each other.
fn a_node_is_reached_at_its_public_ip_on_a_second_interface(
    prefix: &str,
    registry: Registry,
    backend: Backend,
) {
    const PUBLIC: &str = "192.168.77.103";
    let mut c = Cluster::new(prefix, 77, 3, registry, backend.config());
    c.add_port(3, "eth1", &[&format!("{PUBLIC}/24")]);
    c.set_flanneld_iface(3, None);
    let mut extra = vec![];
    if registry == Registry::Kube {
        let ann = serde_json::json!({"metadata": {"annotations": {
            "flannel.alpha.coreos.com/node-public-ip": PUBLIC,
        }}});
        c.kube()
            .patch_node(&testkit::cluster::kube_node_name(3), false, &ann)
            .unwrap();
    } else {
        extra = vec!["--public-ip", PUBLIC];
    }
    for i in 1..=2 {
        c.start_flanneld(i, Path::new(FLANNELD), &[]);
    }
    c.start_flanneld(3, Path::new(FLANNELD), &extra);
    for i in 1..=3 {
        c.node(i).wait_subnet_env(T);
    }
    c.node(3).wait_log(
        &format!("external interface eth1 (mtu 1500), public address {PUBLIC}"),
        T,
    );

    let subnet = cidr_of_key(&c.node(3).lease_key(T));
    for i in 1..=2 {
        let n = c.node(i);
        // host-gw: a route via the address; vxlan: the FDB entry of node 3's VTEP names it.
        let reached = || match backend {
            Backend::HostGw => n
                .routes_to(Family::V4, &subnet)
                .iter()
                .any(|r| r["gateway"] == PUBLIC && r["dev"] == "eth0"),
            _ => n.fdb().contains(&format!(" dst {PUBLIC} ")),
        };
        wait_for(
            &format!("node {i}'s entries to node 3's {subnet} at {PUBLIC}"),
            T,
            || reached().then_some(()),
        );
    }
    // Node 3 sends from eth1: host-gw's routes go out of it, vxlan's device is bound to it.
    let three = c.node(3);
    match backend {
        Backend::HostGw => {
            for other in [1, 2] {
                let to = cidr_of_key(&c.node(other).lease_key(T));
                wait_for(
                    &format!("node 3's route to node {other}'s {to} out of eth1"),
                    T,
                    || {
                        three
                            .routes_to(Family::V4, &to)
                            .iter()
                            .any(|r| r["dev"] == "eth1")
                            .then_some(())
                    },
                );
            }
        }
        _ => {
            let dev = three.ns.ip(&["-d", "link", "show", "flannel.1"]);
            assert!(
                dev.contains(&format!("local {PUBLIC} dev eth1 ")),
                "node 3's flannel.1:\n{dev}"
            );
        }
    }
    for i in 1..=3 {
        c.add_pod(i);
    }
    c.wait_every_pod_reaches_every_other(&[Family::V4], T);
}

#[test]
fn host_gw_a_node_is_reached_at_its_public_ip_on_a_second_interface() {
    a_node_is_reached_at_its_public_ip_on_a_second_interface(
        "cih",
        Registry::Embedded,
        Backend::HostGw,
    );
}

#[test]
fn vxlan_kube_a_node_is_reached_at_its_node_public_ip_on_a_second_interface() {
    a_node_is_reached_at_its_public_ip_on_a_second_interface("civ", Registry::Kube, Backend::Vxlan);
}
