//! The dispatcher in-process: verbs reached, gates applied, results printed in the config's
//! version, and an unprintable ADD result undone by DEL.

use cni_protocol::skel::{dispatch, Outcome};
use cni_protocol::{CniError, CniResult, IpConfig, Plugin, Request};
use serde_json::{json, Value};
use std::cell::RefCell;
use std::collections::HashMap;

#[derive(Default)]
struct Recorder {
    calls: RefCell<Vec<String>>,
    addresses: Vec<&'static str>,
}

impl Plugin for Recorder {
    fn about(&self) -> &'static str {
        "recorder"
    }
    fn add(&self, req: &Request) -> Result<CniResult, CniError> {
        self.calls.borrow_mut().push(format!("ADD {}", req.version));
        Ok(CniResult {
            ips: self
                .addresses
                .iter()
                .map(|a| IpConfig {
                    address: a.parse().unwrap(),
                    gateway: None,
                    interface: None,
                })
                .collect(),
            ..Default::default()
        })
    }
    fn del(&self, _req: &Request) -> Result<(), CniError> {
        self.calls.borrow_mut().push("DEL".into());
        Ok(())
    }
    fn check(&self, _req: &Request) -> Result<(), CniError> {
        self.calls.borrow_mut().push("CHECK".into());
        Ok(())
    }
    fn status(&self, _req: &Request) -> Result<(), CniError> {
        self.calls.borrow_mut().push("STATUS".into());
        Ok(())
    }
    fn gc(&self, req: &Request) -> Result<(), CniError> {
        let keep = req.valid_attachments()?;
        self.calls.borrow_mut().push(format!("GC {}", keep.len()));
        Ok(())
    }
}

fn run(p: &Recorder, command: &str, conf: &Value) -> (Outcome, Value) {
    run_as(p, command, "c1", conf)
}

fn run_as(p: &Recorder, command: &str, container_id: &str, conf: &Value) -> (Outcome, Value) {
    let env: HashMap<&str, String> = HashMap::from([
        ("CNI_COMMAND", command.to_string()),
        ("CNI_CONTAINERID", container_id.to_string()),
        ("CNI_NETNS", "/run/netns/x".to_string()),
        ("CNI_IFNAME", "eth0".to_string()),
        ("CNI_PATH", "/opt/cni/bin".to_string()),
    ]);
    let get = move |k: &str| env.get(k).cloned();
    let stdin = conf.to_string();
    let out = dispatch(p, &get, &mut stdin.as_bytes());
    let v = if out.stdout.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&out.stdout).unwrap()
    };
    (out, v)
}

#[test]
fn add_result_is_printed_in_the_config_version() {
    let p = Recorder {
        addresses: vec!["10.0.0.2/24"],
        ..Default::default()
    };
    let (out, v) = run(&p, "ADD", &json!({"cniVersion": "0.2.0", "name": "n"}));
    assert_eq!(out.exit_code, 0);
    assert_eq!(
        v,
        json!({"cniVersion": "0.2.0", "ip4": {"ip": "10.0.0.2/24"}})
    );
    let (_, v) = run(&p, "ADD", &json!({"cniVersion": "0.4.0", "name": "n"}));
    assert_eq!(
        v,
        json!({"cniVersion": "0.4.0", "ips": [{"version": "4", "address": "10.0.0.2/24"}]})
    );
    assert_eq!(*p.calls.borrow(), vec!["ADD 0.2.0", "ADD 0.4.0"]);
}

#[test]
fn a_missing_cni_version_means_0_1_0() {
    let p = Recorder {
        addresses: vec!["10.0.0.2/24"],
        ..Default::default()
    };
    let (_, v) = run(&p, "ADD", &json!({"name": "n"}));
    assert_eq!(v["cniVersion"], "0.1.0");
}

#[test]
fn an_unprintable_add_result_is_undone() {
    let p = Recorder {
        addresses: vec!["10.0.0.2/24", "10.0.1.2/24"],
        ..Default::default()
    };
    let (out, v) = run(&p, "ADD", &json!({"cniVersion": "0.2.0", "name": "n"}));
    assert_eq!(out.exit_code, 1);
    assert_eq!(v["code"], 1);
    assert_eq!(*p.calls.borrow(), vec!["ADD 0.2.0", "DEL"]);
}

#[test]
fn status_and_gc_reach_the_plugin_from_1_1_0() {
    let p = Recorder::default();
    let conf = json!({"cniVersion": "1.1.0", "name": "n",
        "cni.dev/valid-attachments": [{"containerID": "a", "ifname": "eth0"}, {"containerID": "b", "ifname": "eth0"}]});
    assert_eq!(run(&p, "STATUS", &conf).0.exit_code, 0);
    assert_eq!(run(&p, "GC", &conf).0.exit_code, 0);
    let mut old = conf.clone();
    old["cni.dev/attachments"] = old["cni.dev/valid-attachments"].take();
    old.as_object_mut()
        .unwrap()
        .remove("cni.dev/valid-attachments");
    assert_eq!(run(&p, "GC", &old).0.exit_code, 0);
    assert_eq!(*p.calls.borrow(), vec!["STATUS", "GC 2", "GC 2"]);
    let (out, v) = run(
        &p,
        "GC",
        &json!({"cniVersion": "1.1.0", "name": "n", "cni.dev/valid-attachments": [{"containerID": 1}]}),
    );
    assert_eq!((out.exit_code, v["code"].as_u64()), (1, Some(6)));
    let (out, v) = run(&p, "GC", &json!({"cniVersion": "1.1.0", "name": "n"}));
    assert_eq!((out.exit_code, v["code"].as_u64()), (1, Some(7)));
    assert!(
        v["msg"]
            .as_str()
            .unwrap()
            .contains("cni.dev/valid-attachments"),
        "{v}"
    );
}

#[test]
fn del_and_check_print_nothing_on_success() {
    let p = Recorder::default();
    let (out, _) = run(&p, "DEL", &json!({"cniVersion": "1.0.0", "name": "n"}));
    assert_eq!((out.exit_code, out.stdout.as_str()), (0, ""));
    let (out, _) = run(&p, "CHECK", &json!({"cniVersion": "1.0.0", "name": "n"}));
    assert_eq!((out.exit_code, out.stdout.as_str()), (0, ""));
}

#[test]
fn del_of_an_id_every_add_refuses_succeeds_without_running_the_verb() {
    let conf = json!({"cniVersion": "1.0.0", "name": "n"});
    for id in ["../x", "a/b", "-a", "a b"] {
        let p = Recorder::default();
        let (_, v) = run_as(&p, "ADD", id, &conf);
        assert_eq!(v["code"], 4, "ADD {id:?}: {v}");
        let (out, _) = run_as(&p, "DEL", id, &conf);
        assert_eq!((out.exit_code, out.stdout.as_str()), (0, ""), "DEL {id:?}");
        assert!(
            p.calls.borrow().is_empty(),
            "{id:?}: {:?}",
            p.calls.borrow()
        );
    }
}

#[test]
fn long_container_ids_reach_every_verb() {
    let conf = json!({"cniVersion": "1.1.0", "name": "n"});
    let long = "a".repeat(1000);
    let p = Recorder::default();
    for cmd in ["ADD", "CHECK", "DEL"] {
        let (out, v) = run_as(&p, cmd, &long, &conf);
        assert_eq!(out.exit_code, 0, "{cmd}: {v}");
    }
    assert_eq!(*p.calls.borrow(), ["ADD 1.1.0", "CHECK", "DEL"]);
}
