//! A UDP flow that conntrack saw before its port was mapped keeps its un-NATed entry while
//! packets keep coming; ADD drops those entries so that the mapping takes effect at once.

mod common;

use common::*;
use serde_json::json;

/// The host's conntrack entries for UDP to `port`, one a line.
fn udp_flows(node: &Node, port: u16) -> String {
    let out = node.host.try_run(
        "conntrack",
        &["-L", "-p", "udp", "--orig-port-dst", &port.to_string()],
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_new_udp_mapping_takes_over_flows_conntrack_already_tracks() {
    for (backend, family_dst) in [("iptables", HOST_V4), ("nftables", HOST_V6)] {
        let node = Node::new();
        let mut pod = node.pod(true);
        pod.serve();
        // Conntrack runs in the host namespace once it has NAT rules: another pod's mapping.
        let other = node.pod(true);
        let other_conf = portmap_config(
            "1.0.0",
            json!({"backend": backend}),
            json!([{"hostPort": 9053, "containerPort": 53, "protocol": "udp"}]),
            Some(&other.result),
        );
        node.portmap("ADD", &other, &other_conf).ok();

        // The client talks to 5353 before it is mapped: refused, and remembered without NAT.
        assert!(!udp_reaches_from(&node.client, 40053, family_dst, DNS));
        let stale = udp_flows(&node, DNS);
        assert!(
            stale.contains("sport=40053"),
            "{backend}: no tracked flow:\n{stale}"
        );

        let conf = portmap_config(
            "1.0.0",
            json!({"backend": backend}),
            web_and_dns(),
            Some(&pod.result),
        );
        node.portmap("ADD", &pod, &conf).ok();
        assert!(
            udp_reaches_from(&node.client, 40053, family_dst, DNS),
            "{backend}: the same flow reaches the pod right after ADD"
        );
        let flows = udp_flows(&node, DNS);
        assert!(
            flows.contains(&format!("src={}", pod.ip(family_dst.contains(':')))),
            "{backend}: {flows}"
        );
    }
}

#[test]
fn del_drops_the_udp_flows_still_natted_to_the_container() {
    for (backend, family_dst) in [("iptables", HOST_V4), ("nftables", HOST_V6)] {
        let node = Node::new();
        let mut pod = node.pod(true);
        pod.serve();
        let conf = portmap_config(
            "1.0.0",
            json!({"backend": backend}),
            web_and_dns(),
            Some(&pod.result),
        );
        node.portmap("ADD", &pod, &conf).ok();
        assert!(
            udp_reaches_from(&node.client, 40054, family_dst, DNS),
            "{backend}: the mapping works"
        );
        let flows = udp_flows(&node, DNS);
        assert!(
            flows.contains(&format!("src={}", pod.ip(family_dst.contains(':')))),
            "{backend}: no flow NATed to the pod:\n{flows}"
        );

        node.portmap("DEL", &pod, &conf).ok();
        let left = udp_flows(&node, DNS);
        assert!(
            !left.contains("dport="),
            "{backend}: DEL left flows to port {DNS}:\n{left}"
        );
    }
}
