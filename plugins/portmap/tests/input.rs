//! What portmap does with its input: bad mappings and configs refused with code 7 naming
//! what is wrong and leaving nothing behind, the chained-plugin rule, no mappings, and every
//! spec version's prevResult.

mod common;

use common::*;
use serde_json::{json, Value};

fn assert_nothing_made(node: &Node, pod: &Pod) {
    let rules = node.firewall();
    assert!(
        !rules.contains("CNI-") && !rules.contains("cni_hostport") && !rules.contains(&pod.id),
        "rules were left behind:\n{rules}"
    );
}

#[test]
fn every_bad_mapping_is_refused_naming_it_and_nothing_is_made() {
    let node = Node::new();
    let pod = node.pod(false);
    let good = json!({"hostPort": 8080, "containerPort": 80, "protocol": "tcp"});
    let cases: [(Value, &str); 8] = [
        (
            json!({"hostPort": 0, "containerPort": 80, "protocol": "tcp"}),
            "hostPort 0 is outside 1-65535",
        ),
        (
            json!({"hostPort": 70000, "containerPort": 80, "protocol": "tcp"}),
            "hostPort 70000 is outside 1-65535",
        ),
        (
            json!({"hostPort": 8081, "containerPort": 0, "protocol": "tcp"}),
            "containerPort 0 is outside 1-65535",
        ),
        (
            json!({"hostPort": 8081, "containerPort": 70000, "protocol": "udp"}),
            "containerPort 70000",
        ),
        (
            json!({"hostPort": 8081, "containerPort": 80, "protocol": "icmp"}),
            "protocol \"icmp\"",
        ),
        (
            json!({"hostPort": 8081, "containerPort": 80, "protocol": "tcp", "hostIP": "localhost"}),
            "hostIP \"localhost\" is not an IP address",
        ),
        (
            json!({"hostPort": 8081, "containerPort": 80, "protocol": "tcp", "hostIP": "2001:db8::1"}),
            "hostIP 2001:db8::1 is IPv6",
        ),
        (
            json!({"hostPort": 8081, "containerPort": 80, "protocol": "tcp", "hostIP": "::"}),
            "hostIP :: is IPv6",
        ),
    ];
    for backend in ["iptables", "nftables"] {
        for (bad, want) in &cases {
            let conf = portmap_config(
                "1.0.0",
                json!({"backend": backend}),
                json!([good, bad]),
                Some(&pod.result),
            );
            let out = node.portmap("ADD", &pod, &conf);
            out.err(7);
            let msg = out.msg();
            assert!(
                msg.contains("runtimeConfig.portMappings[1]") && msg.contains(want),
                "{backend}: {msg:?} should name the mapping and say {want:?}"
            );
            assert_nothing_made(&node, &pod);
        }
    }
}

#[test]
fn a_mapping_of_the_wrong_type_is_a_decode_error_naming_the_field() {
    let node = Node::new();
    let pod = node.pod(false);
    let conf = portmap_config(
        "1.0.0",
        json!({}),
        json!([{"hostPort": "8080", "containerPort": 80, "protocol": "tcp"}]),
        Some(&pod.result),
    );
    let out = node.portmap("ADD", &pod, &conf);
    out.err(6);
    assert!(
        out.msg().contains("runtimeConfig.portMappings[0].hostPort"),
        "{}",
        out.msg()
    );
    assert_nothing_made(&node, &pod);
}

#[test]
fn add_without_prev_result_is_refused() {
    let node = Node::new();
    let pod = node.pod(false);
    for mappings in [web_and_dns(), json!([])] {
        let conf = portmap_config("1.0.0", json!({}), mappings, None);
        let out = node.portmap("ADD", &pod, &conf);
        out.err(7);
        assert!(
            out.msg().contains("must be called as a chained plugin"),
            "{}",
            out.msg()
        );
    }
    let out = node.portmap(
        "CHECK",
        &pod,
        &portmap_config("1.0.0", json!({}), web_and_dns(), None),
    );
    out.err(7);
    assert_nothing_made(&node, &pod);
}

#[test]
fn without_mappings_the_prev_result_passes_through_and_nothing_is_made() {
    let node = Node::new();
    let pod = node.pod(true);
    for conf in [
        portmap_config("1.0.0", json!({}), json!([]), Some(&pod.result)),
        json!({"cniVersion": "1.0.0", "name": NETWORK, "type": "portmap", "prevResult": pod.result}),
    ] {
        assert_eq!(
            node.portmap("ADD", &pod, &conf).ok(),
            without_empty_dns(&pod.result)
        );
        node.portmap("CHECK", &pod, &conf).ok();
        node.portmap("DEL", &pod, &conf).ok();
    }
    assert_nothing_made(&node, &pod);
}

/// The pod's result in the shape of an older spec version.
fn prev_result_as(version: &str, pod: &Pod) -> Value {
    let v4 = pod.result["ips"][0]["address"].clone();
    match version {
        "0.1.0" | "0.2.0" => json!({"cniVersion": version, "ip4": {"ip": v4}}),
        _ => {
            let mut r = pod.result.clone();
            r["cniVersion"] = json!(version);
            if version.starts_with("0.") {
                for ip in r["ips"].as_array_mut().unwrap() {
                    ip["version"] = json!("4");
                }
            }
            r
        }
    }
}

#[test]
fn every_spec_version_is_forwarded_and_printed_back_in_its_version() {
    let node = Node::new();
    let mut pod = node.pod(false);
    pod.serve();
    let chain = cni_portmap::names::dnat_chain(NETWORK, &pod.id);
    let pod_ip = pod.ip(false);
    for version in [
        "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
    ] {
        let prev = prev_result_as(version, &pod);
        let conf = portmap_config(version, json!({}), web_and_dns(), Some(&prev));
        let printed = node.portmap("ADD", &pod, &conf).ok();
        assert_eq!(printed["cniVersion"], version);
        match version {
            "0.1.0" | "0.2.0" => assert_eq!(printed["ip4"]["ip"], prev["ip4"]["ip"]),
            _ => assert_eq!(printed["ips"][0]["address"], prev["ips"][0]["address"]),
        }
        assert!(
            node.nat(false).contains(&format!(
                "-A {chain} -p tcp -m tcp --dport 8080 -j DNAT --to-destination {pod_ip}:80"
            )),
            "{version}"
        );
        assert!(
            reaches(&node.client, Proto::Tcp, HOST_V4, HTTP),
            "{version}"
        );
        if !matches!(version, "0.1.0" | "0.2.0" | "0.3.0" | "0.3.1") {
            node.portmap("CHECK", &pod, &conf).ok();
        }
        node.portmap("DEL", &pod, &conf).ok();
        assert!(!node.nat(false).contains(&chain), "{version}");
    }
}

#[test]
fn a_host_interface_named_all_in_prev_result_is_refused_and_nothing_is_made() {
    let node = Node::new();
    let pod = node.pod(false);
    let mut prev = pod.result.clone();
    let host_if = prev["interfaces"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|i| i.get("sandbox").is_none())
        .expect("the pod's result names its host-side interface");
    host_if["name"] = json!("all");
    let conf = portmap_config("1.0.0", json!({}), web_and_dns(), Some(&prev));
    let out = node.portmap("ADD", &pod, &conf);
    out.err(7);
    assert!(out.msg().contains("\"all\""), "{}", out.msg());
    assert_eq!(
        node.host.sysctl("net.ipv4.conf.all.route_localnet"),
        "0",
        "route_localnet of every interface stays off"
    );
    assert_nothing_made(&node, &pod);
}
