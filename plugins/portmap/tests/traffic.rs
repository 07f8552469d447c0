//! Real traffic through the mapped ports, for both backends and both families: a pod behind
//! the bridge serves TCP 80 and UDP 53; with host ports 8080 and 5353 mapped, a client on the
//! underlay, the host itself (127.0.0.1 and its address) and a second pod on the bridge
//! (hairpin) reach it; after DEL none of them does and no rule names the container.

mod common;

use common::*;
use serde_json::json;
use testkit::TestNs;

/// Every way in: (who, from where, to which address).
fn paths<'a>(
    node: &'a Node,
    other_pod: &'a Pod,
    v6: bool,
) -> Vec<(&'static str, &'a TestNs, &'static str)> {
    if v6 {
        vec![
            ("client over the underlay", &node.client, HOST_V6),
            ("host to its own address", &node.host, HOST_V6),
            (
                "second pod to the host address (hairpin)",
                &other_pod.ns,
                HOST_V6,
            ),
        ]
    } else {
        vec![
            ("client over the underlay", &node.client, HOST_V4),
            ("host to 127.0.0.1", &node.host, "127.0.0.1"),
            ("host to its own address", &node.host, HOST_V4),
            (
                "second pod to the host address (hairpin)",
                &other_pod.ns,
                HOST_V4,
            ),
        ]
    }
}

fn assert_reachability(node: &Node, other_pod: &Pod, want: bool) {
    for v6 in [false, true] {
        for (who, from, dst) in paths(node, other_pod, v6) {
            for (proto, port) in [(Proto::Tcp, HTTP), (Proto::Udp, DNS)] {
                assert_eq!(
                    reaches(from, proto, dst, port),
                    want,
                    "{who}: {proto:?} to {dst}:{port} should {}succeed",
                    if want { "" } else { "not " }
                );
            }
        }
    }
}

fn round_trip(backend: &str) {
    let node = Node::new();
    let mut pod = node.pod(true);
    pod.serve();
    let other_pod = node.pod(true);
    let options = json!({"backend": backend});
    assert_reachability(&node, &other_pod, false);

    let add = portmap_config("1.0.0", options.clone(), web_and_dns(), Some(&pod.result));
    let printed = node.portmap("ADD", &pod, &add).ok();
    assert_eq!(
        printed,
        without_empty_dns(&pod.result),
        "ADD prints the prevResult unchanged"
    );
    assert_eq!(
        node.host
            .sysctl(&format!("net.ipv4.conf.{}.route_localnet", node.bridge)),
        "1",
        "route_localnet on the bridge"
    );
    assert!(node.firewall().contains(&pod.id));

    assert_reachability(&node, &other_pod, true);
    node.portmap("CHECK", &pod, &add).ok();

    // DEL as a runtime sends it: the mappings, no prevResult.
    let del = portmap_config("1.0.0", options, web_and_dns(), None);
    node.portmap("DEL", &pod, &del).ok();
    assert_reachability(&node, &other_pod, false);
    let rules = node.firewall();
    let chain = cni_portmap::names::dnat_chain(NETWORK, &pod.id);
    assert!(
        !rules.contains(&pod.id) && !rules.contains(&chain),
        "a rule still names {}:\n{rules}",
        pod.id
    );
    node.portmap("DEL", &pod, &del).ok();
}

#[test]
fn iptables_forwards_both_families_from_everywhere_until_del() {
    round_trip("iptables");
}

#[test]
fn nftables_forwards_both_families_from_everywhere_until_del() {
    round_trip("nftables");
}

/// `result` as a plugin of `version` without `interfaces` prints it: 0.1.0 and 0.2.0 have no
/// such field, and a later result need not name the host side.
fn without_interfaces(result: &serde_json::Value, version: &str) -> serde_json::Value {
    let ip = &result["ips"][0];
    if version < "0.3.0" {
        json!({"cniVersion": version, "ip4": {"ip": ip["address"], "gateway": ip["gateway"]}})
    } else {
        json!({"cniVersion": version, "ips": [{"address": ip["address"], "gateway": ip["gateway"]}]})
    }
}

#[test]
fn localhost_reaches_the_pod_when_the_result_names_no_host_interface() {
    for version in ["0.1.0", "0.2.0", "1.0.0"] {
        let node = Node::new();
        let mut pod = node.pod(false);
        pod.serve();
        let prev = without_interfaces(&pod.result, version);
        let add = portmap_config(version, json!({}), web_and_dns(), Some(&prev));
        node.portmap("ADD", &pod, &add).ok();
        assert_eq!(
            node.host
                .sysctl(&format!("net.ipv4.conf.{}.route_localnet", node.bridge)),
            "1",
            "{version}: route_localnet on the bridge the route to the pod leaves by"
        );
        for (proto, port) in [(Proto::Tcp, HTTP), (Proto::Udp, DNS)] {
            assert!(
                reaches(&node.host, proto, "127.0.0.1", port),
                "{version}: {proto:?} from the host to 127.0.0.1:{port}"
            );
        }
        let del = portmap_config(version, json!({}), web_and_dns(), None);
        node.portmap("DEL", &pod, &del).ok();
        assert!(
            !reaches(&node.host, Proto::Tcp, "127.0.0.1", HTTP),
            "{version}: after DEL"
        );
    }
}
