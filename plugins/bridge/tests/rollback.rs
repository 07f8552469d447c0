//! A failing ADD takes back everything it made: veth, rules, spoof-check, the address.

mod common;

use common::Node;
use serde_json::json;
use testkit::TestNs;

#[test]
fn a_failing_ipam_leaves_nothing() {
    let node = Node::new();
    let pod = TestNs::new("bp");
    let conf = node.conf(
        "1.0.0",
        json!({"isGateway": true, "ipMasq": true, "macspoofchk": true, "ipam": {"type": "failing-ipam"}}),
    );
    let e = node.add(&pod, "ipamfail", &conf).err(11);
    assert!(
        e["msg"].as_str().unwrap().contains("no addresses left"),
        "{e}"
    );
    node.assert_clean();
    assert!(pod.link("eth0").is_none());
    assert!(!node.nft(&["table", "bridge", "nat"]).contains("ipamfail"));
}

#[test]
fn a_failure_after_the_veth_and_the_address_exist_leaves_nothing() {
    let node = Node::new();
    let pod = TestNs::new("bp");
    // IPAM succeeds, and the rules are being written, when a route through an unreachable
    // gateway fails.
    node.static_result(json!({
        "cniVersion": "1.0.0",
        "ips": [{"address": "10.88.0.5/16", "gateway": "10.88.0.1"}],
        "routes": [{"dst": "10.200.0.0/16", "gw": "192.168.77.1"}]
    }));
    let conf = node.conf(
        "1.0.0",
        json!({"isGateway": true, "ipMasq": true, "macspoofchk": true, "ipam": {"type": "static-ipam"}}),
    );
    let e = node.add(&pod, "late", &conf).err(5);
    assert!(e["msg"].as_str().unwrap().contains("10.200.0.0/16"), "{e}");
    node.assert_clean();
    assert!(pod.link("eth0").is_none());
    assert!(!node.nft(&["table", "bridge", "nat"]).contains("late"));
    assert_eq!(
        node.static_calls(),
        "ADD late\nDEL late\n",
        "IPAM gave the address back"
    );
}

#[test]
fn an_empty_ipam_result_is_refused_and_released() {
    let node = Node::new();
    let pod = TestNs::new("bp");
    node.static_result(json!({"cniVersion": "1.0.0"}));
    let conf = node.conf("1.0.0", json!({"ipam": {"type": "static-ipam"}}));
    let e = node.add(&pod, "empty", &conf).err(999);
    assert!(
        e["msg"].as_str().unwrap().contains("no IP configuration"),
        "{e}"
    );
    node.assert_clean();
    assert_eq!(node.static_calls(), "ADD empty\nDEL empty\n");
}
