//! What policies see with and without flanneld's --ip-masq. With it (kube-flannel's way) pods'
//! own addresses survive between nodes. Without it the flannel CNI plugin has the bridge plugin
//! masquerade each pod's traffic leaving its node's subnet (ipMasq in the delegate, as Go's
//! plugin does): a pod of another node arrives from that node's flannel address, so selectors
//! no longer match it, while pods of the same node keep their addresses. Either way the node's
//! own traffic to its pods is allowed, and another node's comes from its flannel address.

mod common;

use common::*;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::time::Duration;
use testkit::cluster::{Family, Underlay};
use testkit::probe::{probe_all, Probe, Proto::Tcp};

const VXLAN: &str = r#"{"Type":"vxlan"}"#;

/// Probes of x/a's port 80 from the host of nodes 1, 2 and 3.
fn from_nodes(w: &World) -> Vec<bool> {
    let probes: Vec<Probe> = (1..=3)
        .map(|n| Probe {
            from: w.cluster.node(n).ns.path().to_path_buf(),
            proto: Tcp,
            to: SocketAddr::new(w.addr("x/a", Family::V4), 80),
        })
        .collect();
    probe_all(&probes, Duration::from_secs(2))
}

/// Node 2's flannel address: its subnet's first, flannel.1's.
fn flannel_address(w: &World, node: u8) -> String {
    let subnet = w.cluster.node(node).subnet(Family::V4, T).unwrap();
    subnet.split('/').next().unwrap().to_string()
}

/// x/a (node 1) admits x/b (node 2) and y/a (node 1) by selector, and `blocks`.
fn admit(w: &World, blocks: &[String]) {
    let mut peers: Vec<Value> = vec![
        json!({"podSelector": {"matchLabels": {"pod": "b"}}}),
        json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "y"}},
               "podSelector": {"matchLabels": {"pod": "a"}}}),
    ];
    peers.extend(
        blocks
            .iter()
            .map(|b| json!({"ipBlock": {"cidr": format!("{b}/32")}})),
    );
    w.policy(
        "x",
        "guard",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
        "ingress": [{"from": peers}]}),
    );
}

fn guarded() -> Reach {
    Reach::all(true).peer("*", "x/a", false)
}

#[test]
fn with_ip_masq_pods_keep_their_addresses_between_nodes() {
    let w = World::new("npm", 133, VXLAN, Underlay::V4, &[]);
    assert!(w.log(1).contains("FLANNEL_IPMASQ=true"), "{}", w.log(1));
    let flannel2 = flannel_address(&w, 2);
    admit(&w, std::slice::from_ref(&flannel2));
    w.expect(
        "x/b and y/a by selector",
        Tcp,
        80,
        &guarded().peer("x/b", "x/a", true).peer("y/a", "x/a", true),
    );
    assert_eq!(
        from_nodes(&w),
        [true, true, false],
        "node 1 itself; node 2 from {flannel2}"
    );
    admit(&w, &[w.cluster.node(2).ip.clone()]);
    assert_eq!(
        from_nodes(&w),
        [true, false, false],
        "node 2 not from its own address"
    );
}

#[test]
fn without_ip_masq_pods_of_other_nodes_come_from_their_node_s_flannel_address() {
    let w = World::without_masq("npq", 134, VXLAN, Underlay::V4);
    for n in 1..=3 {
        w.wait_log(n, "FLANNEL_IPMASQ=false (flanneld without --ip-masq)");
    }
    w.expect("without a policy", Tcp, 80, &Reach::all(true));
    admit(&w, &[]);
    w.expect(
        "y/a (the same node) by selector; x/b (node 2) masqueraded",
        Tcp,
        80,
        &guarded().peer("y/a", "x/a", true),
    );
    let flannel2 = flannel_address(&w, 2);
    admit(&w, std::slice::from_ref(&flannel2));
    w.expect(
        "node 2's flannel address: all of node 2's pods",
        Tcp,
        80,
        &guarded().peer("y/a", "x/a", true).peer("*/b", "x/a", true),
    );
    assert_eq!(
        from_nodes(&w),
        [true, true, false],
        "node 1 itself; node 2 from {flannel2}"
    );
}
