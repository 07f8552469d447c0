//! DEL removes the veth, the address and the rules, also when the namespace is gone first
//! or not named at all (where the Go plugin leaks the rules), and a repeated DEL succeeds.

mod common;

use common::Node;
use serde_json::json;
use testkit::TestNs;

fn masq_conf(node: &Node, backend: &str) -> serde_json::Value {
    node.conf(
        "1.0.0",
        json!({"isGateway": true, "ipMasq": true, "ipMasqBackend": backend, "macspoofchk": true}),
    )
}

fn nft_leftovers(node: &Node, id: &str) -> bool {
    node.nft(&["table", "inet", "cni_plugins_masquerade"])
        .contains(&cni_bridge::masq::nft_instance_hash("testnet", "eth0", id))
        || node.nft(&["table", "bridge", "nat"]).contains(id)
}

#[test]
fn del_after_add_and_twice() {
    for backend in ["iptables", "nftables"] {
        let node = Node::new();
        let pod = TestNs::new("bp");
        let conf = masq_conf(&node, backend);
        node.add(&pod, "d1", &conf).ok();
        assert!(!node.reserved().is_empty());
        node.del(Some(&pod), "d1", &conf).ok();
        node.assert_clean();
        assert!(!nft_leftovers(&node, "d1"));
        assert!(pod.link("eth0").is_none());
        node.del(Some(&pod), "d1", &conf).ok();
        node.assert_clean();
    }
}

#[test]
fn del_after_the_namespace_is_gone() {
    for backend in ["iptables", "nftables"] {
        let node = Node::new();
        let pod = TestNs::new("bp");
        let path = pod.path_str();
        let conf = masq_conf(&node, backend);
        node.add(&pod, "gone", &conf).ok();
        drop(pod);
        let out = node
            .invocation("DEL", None, "gone")
            .netns(&path)
            .run_in_ns(&node.host, &conf);
        out.ok();
        node.assert_clean();
        assert!(!nft_leftovers(&node, "gone"));
    }
}

#[test]
fn del_without_a_namespace() {
    for backend in ["iptables", "nftables"] {
        let node = Node::new();
        let pod = TestNs::new("bp");
        let conf = masq_conf(&node, backend);
        node.add(&pod, "nons", &conf).ok();
        // The runtime removed the namespace and sends DEL with CNI_NETNS empty.
        drop(pod);
        node.del(None, "nons", &conf).ok();
        node.assert_clean();
        assert!(!nft_leftovers(&node, "nons"));
        node.del(None, "nons", &conf).ok();
    }
}

#[test]
fn del_of_what_was_never_added() {
    let node = Node::new();
    let pod = TestNs::new("bp");
    let conf = masq_conf(&node, "iptables");
    node.del(Some(&pod), "never", &conf).ok();
    node.del(None, "never", &conf).ok();
    node.assert_clean();
}

#[test]
fn del_removes_only_its_own_pod() {
    let node = Node::new();
    let (a, b) = (TestNs::new("bp"), TestNs::new("bp"));
    let conf = masq_conf(&node, "iptables");
    node.add(&a, "pod-a", &conf).ok();
    let rb = node.add(&b, "pod-b", &conf).ok();
    node.del(None, "pod-a", &conf).ok();
    assert_eq!(node.cni_nat_lines().len(), 4, "{}", node.nat());
    assert!(node.nat().contains("id: \\\"pod-b\\\""));
    assert_eq!(node.reserved().len(), 1);
    let ip_b = rb["ips"][0]["address"]
        .as_str()
        .unwrap()
        .split('/')
        .next()
        .unwrap();
    assert_eq!(node.reserved(), vec![ip_b.to_string()]);
    assert!(b.link("eth0").is_some());
    // a's veth stays: without a namespace DEL cannot tell which one it was.
    drop(a);
    node.del(Some(&b), "pod-b", &conf).ok();
    node.assert_clean();
}

/// A directory of stand-in tools, put first on the plugin's PATH.
fn fake_tools(tools: &[(&str, &str)]) -> (tempfile::TempDir, String) {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::TempDir::new().unwrap();
    for (name, script) in tools {
        let p = dir.path().join(name);
        std::fs::write(&p, script).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let path = format!(
        "{}:{}",
        dir.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    (dir, path)
}

const UNUSABLE: &str = "#!/bin/sh\necho \"$0: no kernel support (test)\" >&2\nexit 1\n";

#[test]
fn del_with_an_unusable_iptables_family_removes_the_other() {
    let node = Node::new();
    let pod = TestNs::new("bp");
    let netns = pod.path_str();
    let conf = masq_conf(&node, "iptables");
    node.add(&pod, "half", &conf).ok();
    drop(pod);
    let del = |path: &str| {
        node.invocation("DEL", None, "half")
            .netns(&netns)
            .env("PATH", path)
            .run_in_ns(&node.host, &conf)
    };
    // Neither family readable: DEL cannot know the rules are gone.
    let (_both, path) = fake_tools(&[("iptables-save", UNUSABLE), ("ip6tables-save", UNUSABLE)]);
    let out = del(&path);
    out.err(5);
    assert!(out.msg().contains("no iptables family"), "{}", out.msg());
    assert!(!node.cni_nat_lines().is_empty());
    // Only ip6tables unusable: it holds no rules, the IPv4 ones go.
    let (_v6, path) = fake_tools(&[("ip6tables-save", UNUSABLE)]);
    let out = del(&path);
    out.ok();
    assert!(out.stderr.contains("ip6tables-save"), "{}", out.stderr);
    node.assert_clean();
}

#[test]
fn del_fails_on_an_nft_listing_it_cannot_read() {
    let node = Node::new();
    let pod = TestNs::new("bp");
    let conf = masq_conf(&node, "nftables");
    node.add(&pod, "garbled", &conf).ok();
    let nft = std::env::split_paths(&std::env::var_os("PATH").unwrap())
        .map(|d| d.join("nft"))
        .find(|p| p.is_file())
        .expect("nft on PATH");
    let garbling = format!(
        "#!/bin/sh\nif [ \"$1\" = -j ]; then echo 'table inet {{'; exit 0; fi\nexec {} \"$@\"\n",
        nft.display()
    );
    let (_tools, path) = fake_tools(&[("nft", &garbling)]);
    let out = node
        .invocation("DEL", Some(&pod), "garbled")
        .env("PATH", &path)
        .run_in_ns(&node.host, &conf);
    out.err(5);
    assert!(out.msg().contains("nft -j list"), "{}", out.msg());
    assert!(out.msg().contains("not JSON"), "{}", out.msg());
    assert!(nft_leftovers(&node, "garbled"), "the rules are still there");
    node.del(Some(&pod), "garbled", &conf).ok();
    node.assert_clean();
    assert!(!nft_leftovers(&node, "garbled"));
}

#[test]
fn del_cleans_up_after_the_config_became_invalid() {
    let node = Node::new();
    let pod = TestNs::new("bp");
    let conf = masq_conf(&node, "iptables");
    node.add(&pod, "edited", &conf).ok();
    // The operator edits the config after ADD into one ADD refuses.
    let mut broken = conf.clone();
    common::merge(&mut broken, json!({"mtu": 10, "ipMasqBackend": "pf"}));
    let other = TestNs::new("bp");
    node.add(&other, "refused", &broken).err(7);
    let out = node.del(Some(&pod), "edited", &broken);
    out.ok();
    assert!(out.stderr.contains("mtu"), "{}", out.stderr);
    node.assert_clean();
    assert!(!nft_leftovers(&node, "edited"));
    assert!(pod.link("eth0").is_none());
}

#[test]
fn a_long_container_id_is_added_and_deleted_but_cannot_have_macspoofchk() {
    let long = "a".repeat(1000);
    for backend in ["iptables", "nftables"] {
        let node = Node::new();
        let pod = TestNs::new("bp");
        let conf = node.conf(
            "1.0.0",
            json!({"isGateway": true, "ipMasq": true, "ipMasqBackend": backend}),
        );
        node.add(&pod, &long, &conf).ok();
        assert_eq!(common::addrs(&pod, "eth0").len(), 1, "{backend}");
        assert_eq!(node.reserved().len(), 1, "{backend}");
        for _ in 0..2 {
            node.del(Some(&pod), &long, &conf).ok();
            node.assert_clean();
            assert!(!nft_leftovers(&node, &long), "{backend}");
        }
    }
    // macspoofchk's nftables comments carry the ID: refused before anything is made.
    let node = Node::new();
    let pod = TestNs::new("bp");
    let conf = masq_conf(&node, "iptables");
    let e = node.add(&pod, &long, &conf).err(7);
    assert!(e["msg"].as_str().unwrap().contains("macspoofchk"), "{e}");
    assert!(pod.link("eth0").is_none());
    node.assert_clean();
    node.del(Some(&pod), &long, &conf).ok();
    node.assert_clean();
}
