//! 32 ADDs at once on a node whose bridge does not exist yet all succeed
//! (the Go plugin failed with "could not add IP address to cni0: file exists").

mod common;

use common::{addrs, Node};
use serde_json::json;
use std::collections::HashSet;
use testkit::TestNs;

const PODS: usize = 32;

#[test]
fn concurrent_adds_on_a_fresh_node_then_concurrent_dels() {
    let node = Node::new();
    let conf = node.conf("1.0.0", json!({"isDefaultGateway": true, "ipMasq": true}));
    let pods: Vec<TestNs> = (0..PODS).map(|_| TestNs::new("bp")).collect();
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = pods
            .iter()
            .enumerate()
            .map(|(i, pod)| {
                let (node, conf) = (&node, &conf);
                s.spawn(move || node.add(pod, &format!("conc-{i}"), conf))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let distinct: HashSet<String> = results
        .iter()
        .map(|out| out.ok()["ips"][0]["address"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(distinct.len(), PODS, "distinct addresses: {distinct:?}");
    for (pod, out) in pods.iter().zip(&results) {
        assert_eq!(
            addrs(pod, "eth0"),
            vec![out.ok()["ips"][0]["address"].as_str().unwrap().to_string()]
        );
    }
    assert_eq!(addrs(&node.host, "cni0"), vec!["10.88.0.1/16"]);
    assert_eq!(node.links_of_kind("bridge").len(), 1);
    assert_eq!(node.links_of_kind("veth").len(), PODS);
    assert_eq!(node.cni_nat_lines().len(), 4 * PODS);

    std::thread::scope(|s| {
        for (i, pod) in pods.iter().enumerate() {
            let (node, conf) = (&node, &conf);
            s.spawn(move || node.del(Some(pod), &format!("conc-{i}"), conf).ok());
        }
    });
    node.assert_clean();
}
