//! The Go portmap (Debian's, in /usr/lib/cni) and ours on one node: the same nat table for the
//! same container, our CHECK passing on Go's rules, each DEL removing the other's.
//! The installed Go plugin predates its nftables backend, so this is the iptables backend's.

mod common;

use common::*;
use serde_json::{json, Value};
use testkit::unique_name;

/// The nat table of a family as iptables-save prints it, without timestamps and counters.
fn nat_rules(node: &Node, v6: bool) -> Vec<String> {
    node.nat(v6)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split(" [").next().unwrap_or(l).to_string())
        .collect()
}

fn assert_gone(node: &Node, pod: &Pod) {
    let rules = node.firewall();
    let chain = cni_portmap::names::dnat_chain(NETWORK, &pod.id);
    assert!(
        !rules.contains(&pod.id) && !rules.contains(&chain),
        "a rule still names {}:\n{rules}",
        pod.id
    );
}

fn configs() -> Vec<Value> {
    vec![
        json!({}),
        json!({"snat": false}),
        json!({"markMasqBit": 7, "conditionsV4": ["-s", "192.168.77.0/24"], "conditionsV6": ["!", "-s", "fd88::/64"]}),
    ]
}

fn mappings() -> Value {
    json!([
        {"hostPort": HTTP, "containerPort": 80, "protocol": "tcp"},
        {"hostPort": DNS, "containerPort": 53, "protocol": "udp"},
        {"hostPort": 8443, "containerPort": 443, "protocol": "tcp", "hostIP": HOST_V4},
        {"hostPort": 8443, "containerPort": 443, "protocol": "tcp", "hostIP": HOST_V6},
        {"hostPort": 9999, "containerPort": 9, "protocol": "sctp"},
    ])
}

#[test]
fn go_and_ours_write_the_same_nat_tables() {
    for options in configs() {
        let id = unique_name("ctr");
        let (go_node, our_node) = (Node::new(), Node::new());
        let (go_pod, our_pod) = (
            go_node.pod_with_id(true, &id),
            our_node.pod_with_id(true, &id),
        );
        assert_eq!(go_pod.result["ips"], our_pod.result["ips"]);
        let conf =
            |pod: &Pod| portmap_config("1.0.0", options.clone(), mappings(), Some(&pod.result));
        go_node.go_portmap("ADD", &go_pod, &conf(&go_pod)).ok();
        our_node.portmap("ADD", &our_pod, &conf(&our_pod)).ok();
        for v6 in [false, true] {
            assert_eq!(
                nat_rules(&our_node, v6),
                nat_rules(&go_node, v6),
                "options {options}, IPv{}",
                if v6 { 6 } else { 4 }
            );
        }
        // Ours passes on Go's rules. (The installed Go CHECK fails on its own rules whenever
        // ip6tables works: it looks for the IPv4 chain and rules in ip6tables too.)
        our_node.portmap("CHECK", &go_pod, &conf(&go_pod)).ok();
    }
}

#[test]
fn rules_written_by_the_go_plugin_are_removed_by_our_del() {
    let node = Node::new();
    let mut pod = node.pod(true);
    pod.serve();
    let mut neighbour = node.pod(true);
    neighbour.serve();
    let conf = portmap_config("1.0.0", json!({}), web_and_dns(), Some(&pod.result));
    let neighbour_conf = portmap_config(
        "1.0.0",
        json!({}),
        json!([{"hostPort": 9080, "containerPort": 80, "protocol": "tcp"}]),
        Some(&neighbour.result),
    );
    node.go_portmap("ADD", &pod, &conf).ok();
    node.go_portmap("ADD", &neighbour, &neighbour_conf).ok();
    assert!(reaches(&node.client, Proto::Tcp, HOST_V4, HTTP));
    assert!(reaches(&node.client, Proto::Udp, HOST_V6, DNS));
    node.portmap("CHECK", &pod, &conf).ok();

    let del = portmap_config("1.0.0", json!({}), web_and_dns(), None);
    node.portmap("DEL", &pod, &del).ok();
    assert_gone(&node, &pod);
    assert!(!reaches(&node.client, Proto::Tcp, HOST_V4, HTTP));
    assert!(!reaches(&node.client, Proto::Udp, HOST_V6, DNS));
    // The neighbour's rules, written by Go, stay and pass our CHECK.
    node.portmap("CHECK", &neighbour, &neighbour_conf).ok();
    assert!(reaches(&node.client, Proto::Tcp, HOST_V6, 9080));
    // Go's DEL after ours finds nothing to do and succeeds.
    node.go_portmap("DEL", &pod, &del).ok();
}

#[test]
fn rules_written_by_us_are_removed_by_the_go_del() {
    let node = Node::new();
    let mut pod = node.pod(true);
    pod.serve();
    let conf = portmap_config("1.0.0", json!({}), web_and_dns(), Some(&pod.result));
    node.portmap("ADD", &pod, &conf).ok();
    let del = portmap_config("1.0.0", json!({}), web_and_dns(), None);
    node.go_portmap("DEL", &pod, &del).ok();
    assert_gone(&node, &pod);
    assert!(!reaches(&node.client, Proto::Tcp, HOST_V4, HTTP));
    node.portmap("DEL", &pod, &del).ok();
}
