//! The built `loopback` binary against the real kernel, once per spec version.

use serde_json::{json, Value};
use testkit::{Invocation, TestNs};

const VERSIONS: [&str; 7] = [
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
];

fn conf(version: &str) -> Value {
    json!({"cniVersion": version, "name": "lo-net", "type": "loopback"})
}

fn lo_is_up(pod: &TestNs) -> bool {
    let link = pod.link("lo").expect("lo exists");
    link["flags"].as_array().unwrap().iter().any(|f| f == "UP")
}

fn expected_add_result(version: &str, netns: &str) -> Value {
    match version {
        "0.1.0" | "0.2.0" => {
            json!({"cniVersion": version, "ip4": {"ip": "127.0.0.1/8"}, "ip6": {"ip": "::1/128"}})
        }
        "0.3.0" | "0.3.1" | "0.4.0" => json!({
            "cniVersion": version,
            "interfaces": [{"name": "lo", "mac": "00:00:00:00:00:00", "sandbox": netns}],
            "ips": [
                {"version": "4", "interface": 0, "address": "127.0.0.1/8"},
                {"version": "6", "interface": 0, "address": "::1/128"}
            ]
        }),
        _ => json!({
            "cniVersion": version,
            "interfaces": [{"name": "lo", "mac": "00:00:00:00:00:00", "sandbox": netns}],
            "ips": [
                {"interface": 0, "address": "127.0.0.1/8"},
                {"interface": 0, "address": "::1/128"}
            ]
        }),
    }
}

#[test]
fn every_verb_in_every_spec_version() {
    for version in VERSIONS {
        let pod = TestNs::new("lo");
        pod.ip(&["link", "set", "lo", "down"]);
        let netns = pod.path_str();
        let c = conf(version);
        let call = |cmd: &str| {
            Invocation::new("loopback", cmd)
                .netns(&netns)
                .ifname("eth7")
                .run(&c)
        };

        let v = Invocation::new("loopback", "VERSION").run(&c).ok();
        assert_eq!(v["supportedVersions"], json!(VERSIONS), "{version}");

        let result = call("ADD").ok();
        assert_eq!(result, expected_add_result(version, &netns), "{version}");
        assert!(lo_is_up(&pod), "{version}: lo is up after ADD");

        let check = call("CHECK");
        if version >= "0.4.0" {
            check.ok();
            pod.ip(&["link", "set", "lo", "down"]);
            let e = call("CHECK").err(999);
            assert!(e["msg"].as_str().unwrap().contains("down"), "{e}");
            pod.ip(&["link", "set", "lo", "up"]);
        } else {
            let e = check.err(1);
            assert!(e["msg"].as_str().unwrap().contains(version), "{e}");
        }

        for cmd in ["STATUS", "GC"] {
            let out = call(cmd);
            if version == "1.1.0" {
                out.ok();
            } else {
                let e = out.err(1);
                assert!(e["msg"].as_str().unwrap().contains(cmd), "{e}");
            }
        }

        assert_eq!(
            call("DEL").ok(),
            Value::Null,
            "{version}: DEL prints nothing"
        );
        assert!(!lo_is_up(&pod), "{version}: lo is down after DEL");
        call("DEL").ok();
    }
}

#[test]
fn del_succeeds_when_the_namespace_is_gone_or_not_given() {
    let pod = TestNs::new("lo");
    let netns = pod.path_str();
    let c = conf("1.0.0");
    Invocation::new("loopback", "ADD")
        .netns(&netns)
        .run(&c)
        .ok();
    drop(pod);
    Invocation::new("loopback", "DEL")
        .netns(&netns)
        .run(&c)
        .ok();
    Invocation::new("loopback", "DEL").netns("").run(&c).ok();
}

#[test]
fn add_passes_prev_result_through() {
    let pod = TestNs::new("lo");
    let prev = json!({"cniVersion": "0.3.1", "interfaces": [{"name": "eth0", "sandbox": pod.path_str()}],
                      "ips": [{"version": "4", "interface": 0, "address": "10.1.2.3/24", "gateway": "10.1.2.1"}]});
    let mut c = conf("0.3.1");
    c["prevResult"] = prev.clone();
    let out = Invocation::new("loopback", "ADD")
        .netns(&pod.path_str())
        .run(&c)
        .ok();
    assert_eq!(out, prev);
    assert!(lo_is_up(&pod));
}

#[test]
fn add_in_a_missing_namespace_is_unknown_container() {
    let e = Invocation::new("loopback", "ADD")
        .netns("/run/netns/does-not-exist-xyz")
        .run(&conf("1.0.0"))
        .err(3);
    assert!(
        e["msg"]
            .as_str()
            .unwrap()
            .contains("/run/netns/does-not-exist-xyz"),
        "{e}"
    );
}
