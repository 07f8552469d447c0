//! Either implementation removes what the other made: a node can switch over in place.

mod common;

use common::Node;
use serde_json::json;
use testkit::{go_plugins_available, TestNs, GO_PLUGINS};

fn conf(node: &Node) -> serde_json::Value {
    node.conf(
        "0.4.0",
        json!({"isGateway": true, "ipMasq": true, "hairpinMode": true}),
    )
}

#[test]
fn a_pod_added_by_go_is_deleted_by_ours() {
    if !testkit::runs_here(go_plugins_available(), GO_PLUGINS) {
        return;
    }
    let node = Node::new();
    let pod = TestNs::new("bp");
    let conf = conf(&node);
    let r = node
        .go("ADD", Some(&pod), "go-1")
        .run_in_ns(&node.host, &conf)
        .ok();
    assert_eq!(node.cni_nat_lines().len(), 4, "{}", node.nat());
    assert_eq!(r["ips"][0]["address"], common::addrs(&pod, "eth0")[0]);
    node.del(Some(&pod), "go-1", &conf).ok();
    node.assert_clean();
    assert!(pod.link("eth0").is_none());
}

#[test]
fn a_pod_added_by_ours_is_deleted_by_go() {
    if !testkit::runs_here(go_plugins_available(), GO_PLUGINS) {
        return;
    }
    let node = Node::new();
    let pod = TestNs::new("bp");
    let conf = conf(&node);
    node.add(&pod, "rs-1", &conf).ok();
    node.go("DEL", Some(&pod), "rs-1")
        .run_in_ns(&node.host, &conf)
        .ok();
    node.assert_clean();
    assert!(pod.link("eth0").is_none());
}

#[test]
fn ours_removes_the_rules_go_leaks_when_the_namespace_is_gone() {
    if !testkit::runs_here(go_plugins_available(), GO_PLUGINS) {
        return;
    }
    let node = Node::new();
    let conf = conf(&node);
    // What the Go plugin leaves when DEL comes after the namespace is gone
    // (containernetworking/plugins#810): every rule.
    let pod = TestNs::new("bp");
    node.go("ADD", Some(&pod), "leak")
        .run_in_ns(&node.host, &conf)
        .ok();
    let path = pod.path_str();
    drop(pod);
    node.go("DEL", None, "leak")
        .netns(&path)
        .run_in_ns(&node.host, &conf)
        .ok();
    assert_eq!(node.cni_nat_lines().len(), 4, "the Go plugin leaked them");
    // Ours, asked again, finds them by the chain name and comment.
    node.del(None, "leak", &conf).ok();
    node.assert_clean();
}
