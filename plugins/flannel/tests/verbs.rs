//! flannel's verbs against a recording delegate (`fake` on CNI_PATH): what it is handed,
//! what is saved and removed, and the error codes. No kernel state is made here.

mod common;

use common::{error_message, read_json, Node, Stack, NETWORK};
use serde_json::{json, Value};
use std::time::Duration;

const NETNS: &str = "/var/run/netns/not-opened-by-flannel";

fn fake_result() -> Value {
    json!({
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "eth0", "mac": "0a:58:0a:f4:01:05", "sandbox": NETNS}],
        "ips": [{"address": "10.244.1.5/24", "gateway": "10.244.1.1", "interface": 0}],
        "routes": [{"dst": "10.244.0.0/16"}]
    })
}

fn node() -> Node {
    let node = Node::new(Stack::Ours);
    node.install_fake_delegate(&fake_result());
    node
}

/// A flannel config whose delegate is the recording fake.
fn config(node: &Node, version: &str) -> Value {
    node.flannel_config(version, json!({"delegate": {"type": "fake"}}))
}

/// What flannel builds from testdata/subnet-ipv4.env for `config`.
fn expected_delegate(node: &Node, version: &str) -> Value {
    json!({
        "cniVersion": version,
        "name": NETWORK,
        "type": "fake",
        "ipMasq": false,
        "mtu": 1450,
        "ipam": {
            "type": "host-local",
            "dataDir": node.ipam_dir(),
            "ranges": [[{"subnet": "10.244.1.0/24"}]],
            "routes": [{"dst": "10.244.0.0/16"}]
        }
    })
}

#[test]
fn add_saves_the_delegate_runs_it_and_prints_its_result_in_the_configs_version() {
    let node = node();
    node.write_subnet_env("subnet-ipv4.env");
    let out = node
        .flannel("ADD")
        .container_id("c1")
        .netns(NETNS)
        .run(&config(&node, "0.3.1"))
        .ok();
    assert_eq!(
        out,
        json!({
            "cniVersion": "0.3.1",
            "interfaces": [{"name": "eth0", "mac": "0a:58:0a:f4:01:05", "sandbox": NETNS}],
            "ips": [{"version": "4", "address": "10.244.1.5/24", "gateway": "10.244.1.1", "interface": 0}],
            "routes": [{"dst": "10.244.0.0/16"}]
        })
    );
    let expected = expected_delegate(&node, "0.3.1");
    assert_eq!(node.fake_call("ADD").unwrap(), expected);
    assert_eq!(read_json(&node.saved("c1")), expected);
    let env = node.fake_env("ADD");
    for line in [
        "CNI_COMMAND=ADD",
        "CNI_CONTAINERID=c1",
        &format!("CNI_NETNS={NETNS}"),
        "CNI_IFNAME=eth0",
    ] {
        assert!(env.lines().any(|l| l == line), "{line} not in {env}");
    }
}

#[test]
fn subnet_env_written_during_the_wait_lets_add_succeed() {
    let node = node();
    let conf = node.flannel_config(
        "1.0.0",
        json!({"delegate": {"type": "fake"}, "subnetFileWait": 30}),
    );
    let subnet_file = node.subnet_file();
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        let env = subnetenv::SubnetEnv::read(&common::testdata("subnet-ipv4.env")).unwrap();
        env.write(&subnet_file).unwrap();
    });
    let out = node
        .flannel("ADD")
        .container_id("c1")
        .netns(NETNS)
        .run(&conf)
        .ok();
    writer.join().unwrap();
    assert_eq!(out["ips"][0]["address"], "10.244.1.5/24");
    assert_eq!(
        read_json(&node.saved("c1"))["ipam"]["ranges"][0][0]["subnet"],
        "10.244.1.0/24"
    );
}

#[test]
fn subnet_env_never_written_is_code_11_naming_the_file_and_the_daemon() {
    let node = node();
    let conf = node.flannel_config(
        "1.0.0",
        json!({"delegate": {"type": "fake"}, "subnetFileWait": 0.2}),
    );
    let out = node
        .flannel("ADD")
        .container_id("c1")
        .netns(NETNS)
        .run(&conf);
    let msg = error_message(&out, 11);
    assert!(
        msg.contains(&node.subnet_file().display().to_string()),
        "{msg}"
    );
    assert!(
        msg.contains("fabric daemon") && msg.contains("has not written it"),
        "{msg}"
    );
    assert!(node.fake_call("ADD").is_none());
    assert!(!node.saved("c1").exists());
}

#[test]
fn an_incomplete_subnet_env_lists_every_missing_key() {
    let node = node();
    std::fs::create_dir_all(node.subnet_file().parent().unwrap()).unwrap();
    std::fs::write(
        node.subnet_file(),
        "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_MTU=1450\n",
    )
    .unwrap();
    let out = node
        .flannel("ADD")
        .container_id("c1")
        .netns(NETNS)
        .run(&config(&node, "1.0.0"));
    let msg = error_message(&out, 6);
    assert!(
        msg.contains("FLANNEL_SUBNET, FLANNEL_IPV6_SUBNET, FLANNEL_IPMASQ"),
        "{msg}"
    );
    assert!(out.json()["details"]
        .as_str()
        .unwrap()
        .contains("fabric daemon"));
    assert!(!node.saved("c1").exists());
}

#[test]
fn a_delegate_with_name_or_ipam_is_code_7_before_any_wait() {
    let node = node();
    // No subnet.env and the default 5 s wait: a config error must not wait for it.
    for (delegate, field) in [
        (json!({"type": "fake", "name": "x"}), "delegate.name"),
        (json!({"type": "fake", "ipam": {}}), "delegate.ipam"),
        (json!({"type": ["bridge"]}), "delegate.type"),
    ] {
        let conf = node.flannel_config("1.0.0", json!({ "delegate": delegate }));
        let out = node
            .flannel("ADD")
            .container_id("c1")
            .netns(NETNS)
            .run(&conf);
        let msg = error_message(&out, 7);
        assert!(msg.contains(field), "{msg}");
    }
    assert!(node.fake_call("ADD").is_none());
}

#[test]
fn a_failing_delegate_is_undone_and_nothing_is_saved() {
    let node = node();
    node.write_subnet_env("subnet-ipv4.env");
    node.fail_fake("ADD");
    let out = node
        .flannel("ADD")
        .container_id("c1")
        .netns(NETNS)
        .run(&config(&node, "1.0.0"));
    let msg = error_message(&out, 42);
    assert!(msg.contains("fake delegate refuses ADD"), "{msg}");
    // The delegate's DEL ran with the config its ADD got, and the saved file is gone.
    assert_eq!(
        node.fake_call("DEL").unwrap(),
        node.fake_call("ADD").unwrap()
    );
    assert!(!node.saved("c1").exists());
    assert_eq!(std::fs::read_dir(node.data_dir()).unwrap().count(), 0);
}

#[test]
fn del_runs_the_saved_config_then_forgets_it_and_succeeds_again() {
    let node = node();
    node.write_subnet_env("subnet-ipv4.env");
    let conf = config(&node, "1.0.0");
    node.flannel("ADD")
        .container_id("c1")
        .netns(NETNS)
        .run(&conf)
        .ok();
    let saved = read_json(&node.saved("c1"));
    // A changed subnet.env must not change what DEL undoes.
    node.write_subnet_env("subnet-ipv6.env");
    node.flannel("DEL")
        .container_id("c1")
        .netns(NETNS)
        .run(&conf)
        .ok();
    assert_eq!(node.fake_call("DEL").unwrap(), saved);
    assert!(!node.saved("c1").exists());
    std::fs::remove_file(node.root().join("calls/DEL.json")).unwrap();
    node.flannel("DEL")
        .container_id("c1")
        .netns(NETNS)
        .run(&conf)
        .ok();
    assert!(
        node.fake_call("DEL").is_none(),
        "no saved file: nothing to run"
    );
}

#[test]
fn del_without_netns_or_subnet_env_still_runs_the_saved_config() {
    let node = node();
    node.write_subnet_env("subnet-ipv4.env");
    let conf = config(&node, "1.0.0");
    node.flannel("ADD")
        .container_id("c1")
        .netns(NETNS)
        .run(&conf)
        .ok();
    std::fs::remove_file(node.subnet_file()).unwrap();
    node.flannel("DEL")
        .container_id("c1")
        .unset("CNI_NETNS")
        .run(&conf)
        .ok();
    assert!(node.fake_call("DEL").is_some());
    assert!(!node.saved("c1").exists());
}

#[test]
fn a_failing_delegate_del_keeps_the_saved_file_for_the_retry() {
    let node = node();
    node.write_subnet_env("subnet-ipv4.env");
    let conf = config(&node, "1.0.0");
    node.flannel("ADD")
        .container_id("c1")
        .netns(NETNS)
        .run(&conf)
        .ok();
    node.fail_fake("DEL");
    let out = node
        .flannel("DEL")
        .container_id("c1")
        .netns(NETNS)
        .run(&conf);
    error_message(&out, 42);
    assert!(node.saved("c1").exists());
}

#[test]
fn a_file_saved_by_the_go_plugin_is_honoured() {
    let node = node();
    // Byte for byte what the Go plugin writes for the stock conflist (json.Marshal of its map).
    let go = r#"{"cniVersion":"0.3.1","hairpinMode":true,"ipMasq":false,"ipam":{"ranges":[[{"subnet":"10.244.1.0/24"}]],"routes":[{"dst":"10.244.0.0/16"}],"type":"host-local"},"isDefaultGateway":true,"isGateway":true,"mtu":1450,"name":"cbr0","type":"fake"}"#;
    std::fs::create_dir_all(node.data_dir()).unwrap();
    std::fs::write(node.saved("0123456789abcdef"), go).unwrap();
    node.flannel("DEL")
        .container_id("0123456789abcdef")
        .netns(NETNS)
        .run(&config(&node, "0.3.1"))
        .ok();
    assert_eq!(
        node.fake_call("DEL").unwrap(),
        serde_json::from_str::<Value>(go).unwrap()
    );
    assert!(!node.saved("0123456789abcdef").exists());
}

#[test]
fn a_torn_saved_file_is_undone_with_the_delegate_built_now() {
    let node = node();
    node.write_subnet_env("subnet-ipv4.env");
    std::fs::create_dir_all(node.data_dir()).unwrap();
    std::fs::write(node.saved("c1"), "").unwrap();
    let conf = config(&node, "1.0.0");
    node.flannel("DEL")
        .container_id("c1")
        .netns(NETNS)
        .run(&conf)
        .ok();
    assert_eq!(
        node.fake_call("DEL").unwrap(),
        expected_delegate(&node, "1.0.0")
    );
    assert!(!node.saved("c1").exists());
    // Torn and no subnet.env either: nothing can be run, the useless file goes.
    std::fs::write(node.saved("c2"), "{\"ty").unwrap();
    std::fs::remove_file(node.subnet_file()).unwrap();
    node.flannel("DEL")
        .container_id("c2")
        .netns(NETNS)
        .run(&conf)
        .ok();
    assert!(!node.saved("c2").exists());
}

#[test]
fn check_runs_the_delegates_check_with_the_saved_config_and_prev_result() {
    let node = node();
    node.write_subnet_env("subnet-ipv4.env");
    let conf = config(&node, "1.0.0");
    let result = node
        .flannel("ADD")
        .container_id("c1")
        .netns(NETNS)
        .run(&conf)
        .ok();
    let mut check_conf = conf.clone();
    check_conf["prevResult"] = result.clone();
    node.flannel("CHECK")
        .container_id("c1")
        .netns(NETNS)
        .run(&check_conf)
        .ok();
    let mut expected = expected_delegate(&node, "1.0.0");
    expected["prevResult"] = result;
    assert_eq!(node.fake_call("CHECK").unwrap(), expected);
    // The delegate's verdict is flannel's.
    node.fail_fake("CHECK");
    let out = node
        .flannel("CHECK")
        .container_id("c1")
        .netns(NETNS)
        .run(&check_conf);
    error_message(&out, 42);
}

#[test]
fn check_of_a_container_flannel_never_added_is_code_3() {
    let node = node();
    node.write_subnet_env("subnet-ipv4.env");
    let out = node
        .flannel("CHECK")
        .container_id("nobody")
        .netns(NETNS)
        .run(&config(&node, "1.0.0"));
    let msg = error_message(&out, 3);
    assert!(
        msg.contains(&node.saved("nobody").display().to_string()),
        "{msg}"
    );
    assert!(node.fake_call("CHECK").is_none());
}

#[test]
fn status_is_50_while_subnet_env_is_missing_or_invalid_else_the_delegates() {
    let node = node();
    let conf = config(&node, "1.1.0");
    let status = || node.flannel("STATUS").unset("CNI_CONTAINERID").run(&conf);
    let msg = error_message(&status(), 50);
    assert!(
        msg.contains("subnet.env") && msg.contains("has not written it"),
        "{msg}"
    );
    std::fs::create_dir_all(node.subnet_file().parent().unwrap()).unwrap();
    std::fs::write(node.subnet_file(), "FLANNEL_NETWORK=10.244.0.0/16\n").unwrap();
    let msg = error_message(&status(), 50);
    assert!(msg.contains("FLANNEL_MTU"), "{msg}");
    assert!(node.fake_call("STATUS").is_none());

    node.write_subnet_env("subnet-ipv4.env");
    status().ok();
    assert_eq!(
        node.fake_call("STATUS").unwrap(),
        expected_delegate(&node, "1.1.0")
    );
    node.fail_fake("STATUS");
    error_message(&status(), 42);
}

#[test]
fn gc_hands_the_valid_attachments_to_the_delegate_and_forgets_the_rest() {
    let node = node();
    node.write_subnet_env("subnet-ipv4.env");
    let conf = config(&node, "1.1.0");
    for id in ["keep", "stale"] {
        node.flannel("ADD")
            .container_id(id)
            .netns(NETNS)
            .run(&conf)
            .ok();
    }
    // A file of another network sharing the directory is not this GC's to remove.
    std::fs::write(
        node.saved("elsewhere"),
        r#"{"name":"other","type":"bridge"}"#,
    )
    .unwrap();
    let attachments = json!([{"containerID": "keep", "ifname": "eth0"}]);
    let mut gc_conf = conf.clone();
    gc_conf["cni.dev/valid-attachments"] = attachments.clone();
    node.flannel("GC")
        .unset("CNI_CONTAINERID")
        .run(&gc_conf)
        .ok();

    let mut expected = expected_delegate(&node, "1.1.0");
    expected["cni.dev/valid-attachments"] = attachments;
    assert_eq!(node.fake_call("GC").unwrap(), expected);
    assert!(node.saved("keep").exists());
    assert!(!node.saved("stale").exists());
    assert!(node.saved("elsewhere").exists());
}

#[test]
fn a_failing_delegate_gc_forgets_nothing() {
    let node = node();
    node.write_subnet_env("subnet-ipv4.env");
    let conf = config(&node, "1.1.0");
    node.flannel("ADD")
        .container_id("stale")
        .netns(NETNS)
        .run(&conf)
        .ok();
    node.fail_fake("GC");
    let mut gc_conf = conf.clone();
    gc_conf["cni.dev/valid-attachments"] = json!([]);
    error_message(&node.flannel("GC").run(&gc_conf), 42);
    assert!(node.saved("stale").exists());
}

#[test]
fn status_and_gc_need_cni_version_1_1_0() {
    let node = node();
    node.write_subnet_env("subnet-ipv4.env");
    for verb in ["STATUS", "GC"] {
        error_message(&node.flannel(verb).run(&config(&node, "1.0.0")), 1);
    }
}

#[test]
fn a_delegate_missing_from_cni_path_is_code_4_naming_the_type_and_the_path() {
    let node = node();
    node.write_subnet_env("subnet-ipv4.env");
    let conf = node.flannel_config("1.0.0", json!({"delegate": {"type": "no-such-plugin"}}));
    let out = node
        .flannel("ADD")
        .container_id("c9")
        .netns(NETNS)
        .run(&conf);
    let e = out.err(4);
    let msg = e["msg"].as_str().unwrap();
    assert!(
        msg.contains("failed to find plugin \"no-such-plugin\""),
        "{msg}"
    );
    assert!(
        msg.contains(&node.cni_path().display().to_string()),
        "{msg}"
    );
    assert!(
        !node.saved("c9").exists(),
        "no saved delegate is left behind"
    );
}

#[test]
fn an_id_too_long_for_a_file_name_is_refused_at_add_and_del_and_gc_succeed() {
    let node = node();
    node.write_subnet_env("subnet-ipv4.env");
    let conf = config(&node, "1.1.0");
    let (longest, too_long, huge) = ("a".repeat(255), "b".repeat(256), "c".repeat(1000));

    // The longest file name works end to end.
    node.flannel("ADD")
        .container_id(&longest)
        .netns(NETNS)
        .run(&conf)
        .ok();
    assert!(node.saved(&longest).exists());

    for id in [&too_long, &huge] {
        let e = node
            .flannel("ADD")
            .container_id(id)
            .netns(NETNS)
            .run(&conf)
            .err(4);
        let msg = e["msg"].as_str().unwrap();
        assert!(
            msg.contains("CNI_CONTAINERID") && msg.contains("255"),
            "{msg}"
        );
        // Nothing was made for it, so DEL has nothing to undo and succeeds, as often as asked.
        for _ in 0..2 {
            node.flannel("DEL")
                .container_id(id)
                .netns(NETNS)
                .run(&conf)
                .ok();
        }
        node.flannel("CHECK")
            .container_id(id)
            .netns(NETNS)
            .run(&conf)
            .err(3);
    }
    assert!(node.fake_call("ADD").unwrap()["name"] == NETWORK);
    assert!(node.fake_call("DEL").is_none(), "no delegate DEL ran");

    // GC keeps what the list names, however long its IDs, whatever CNI_CONTAINERID holds.
    let mut gc_conf = conf.clone();
    gc_conf["cni.dev/valid-attachments"] = json!([
        {"containerID": longest, "ifname": "eth0"},
        {"containerID": huge, "ifname": "eth0"}
    ]);
    node.flannel("GC").container_id(&huge).run(&gc_conf).ok();
    assert!(node.saved(&longest).exists());
    node.flannel("DEL")
        .container_id(&longest)
        .netns(NETNS)
        .run(&conf)
        .ok();
    assert!(!node.saved(&longest).exists());
}
