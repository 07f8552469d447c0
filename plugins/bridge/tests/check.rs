//! CHECK finds what ADD made, and notices when part of it is gone.

mod common;

use common::Node;
use serde_json::{json, Value};
use testkit::TestNs;

fn with_prev(conf: &Value, prev: &Value) -> Value {
    let mut c = conf.clone();
    c["prevResult"] = prev.clone();
    c
}

#[test]
fn check_passes_after_add_and_fails_when_state_is_gone() {
    let node = Node::new();
    let pod = TestNs::new("bp");
    let conf = node.conf(
        "1.0.0",
        json!({"isDefaultGateway": true, "ipMasq": true, "ipam": {"routes": [{"dst": "10.200.0.0/16"}]}}),
    );
    let prev = node.add(&pod, "chk", &conf).ok();
    let check = |c: &Value| {
        node.invocation("CHECK", Some(&pod), "chk")
            .run_in_ns(&node.host, c)
    };
    check(&with_prev(&conf, &prev)).ok();

    // Without the prevResult, CHECK cannot say anything.
    check(&conf).err(7);

    // A route of the result removed from the pod.
    pod.ip(&["route", "del", "10.200.0.0/16"]);
    let e = check(&with_prev(&conf, &prev)).err(999);
    assert!(e["msg"].as_str().unwrap().contains("10.200.0.0/16"), "{e}");
    pod.ip(&["route", "add", "10.200.0.0/16", "via", "10.88.0.1"]);
    check(&with_prev(&conf, &prev)).ok();

    // The container's MAC changed.
    pod.ip(&["link", "set", "eth0", "address", "0a:00:00:00:00:99"]);
    let e = check(&with_prev(&conf, &prev)).err(999);
    assert!(e["msg"].as_str().unwrap().contains("MAC"), "{e}");

    // The address gone.
    let addr = prev["ips"][0]["address"].as_str().unwrap();
    pod.ip(&["addr", "del", addr, "dev", "eth0"]);
    node.del(Some(&pod), "chk", &conf).ok();
    let e = check(&with_prev(&conf, &prev)).err(999);
    assert!(!e["msg"].as_str().unwrap().is_empty());
    node.assert_clean();
}

#[test]
fn check_notices_a_promisc_mismatch_and_a_missing_bridge() {
    let node = Node::new();
    let pod = TestNs::new("bp");
    let conf = node.conf("0.4.0", json!({"isGateway": true}));
    let prev = node.add(&pod, "chk2", &conf).ok();
    let check = |c: &Value| {
        node.invocation("CHECK", Some(&pod), "chk2")
            .run_in_ns(&node.host, c)
    };
    check(&with_prev(&conf, &prev)).ok();
    let promisc = node.conf("0.4.0", json!({"isGateway": true, "promiscMode": true}));
    let e = check(&with_prev(&promisc, &prev)).err(999);
    assert!(e["msg"].as_str().unwrap().contains("promiscuous"), "{e}");
    node.host.ip(&["link", "del", "cni0"]);
    let e = check(&with_prev(&conf, &prev)).err(999);
    assert!(e["msg"].as_str().unwrap().contains("cni0"), "{e}");
    node.del(Some(&pod), "chk2", &conf).ok();
}
