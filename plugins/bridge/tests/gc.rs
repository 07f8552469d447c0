//! GC (1.1.0): what no valid attachment holds goes, the rest stays.

mod common;

use common::Node;
use serde_json::json;
use testkit::TestNs;

#[test]
fn gc_removes_the_rules_and_addresses_of_gone_attachments() {
    for backend in ["iptables", "nftables"] {
        let node = Node::new();
        let (a, b) = (TestNs::new("bp"), TestNs::new("bp"));
        let conf = node.conf(
            "1.1.0",
            json!({"isGateway": true, "ipMasq": true, "ipMasqBackend": backend}),
        );
        let ra = node.add(&a, "gc-a", &conf).ok();
        node.add(&b, "gc-b", &conf).ok();
        // The runtime lost track of pod b: its namespace is gone and no DEL came.
        drop(b);

        let mut gc = conf.clone();
        gc["cni.dev/valid-attachments"] = json!([{"containerID": "gc-a", "ifname": "eth0"}]);
        // An edit that ADD would now refuse must not stop the cleanup.
        gc["mtu"] = json!(10);
        node.invocation("GC", None, "")
            .unset("CNI_CONTAINERID")
            .unset("CNI_IFNAME")
            .unset("CNI_NETNS")
            .run_in_ns(&node.host, &gc)
            .ok();

        let ip_a = ra["ips"][0]["address"]
            .as_str()
            .unwrap()
            .split('/')
            .next()
            .unwrap();
        assert_eq!(node.reserved(), vec![ip_a.to_string()], "{backend}");
        match backend {
            "iptables" => {
                let lines = node.cni_nat_lines();
                assert_eq!(lines.len(), 4, "{backend}: {lines:?}");
                assert!(lines.iter().all(|l| !l.contains("gc-b")), "{lines:?}");
            }
            _ => {
                let table = node.nft(&["table", "inet", "cni_plugins_masquerade"]);
                assert!(table.contains(&format!("ip saddr {ip_a} ")), "{table}");
                assert_eq!(table.matches("masquerade comment").count(), 1, "{table}");
            }
        }
        node.del(Some(&a), "gc-a", &conf).ok();
        node.assert_clean();
    }
}
