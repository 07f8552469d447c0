//! Delegation with real processes: a missing plugin, a failing one, and DEL after a failed ADD.

use cni_protocol::invoke::{delegate, delegate_add, find_plugin};
use cni_protocol::{Command, Env, Version};
use serde_json::json;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

fn env_with_path(dirs: &[&Path]) -> Env {
    Env {
        command: Command::Add,
        container_id: "c1".into(),
        netns: "/run/netns/x".into(),
        ifname: "eth0".into(),
        args: vec![],
        path_raw: std::env::join_paths(dirs)
            .unwrap()
            .to_string_lossy()
            .into_owned(),
        path: dirs.iter().map(|d| d.to_path_buf()).collect(),
    }
}

fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

#[test]
fn a_missing_delegate_names_the_type_and_the_path() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let e = find_plugin("bridge", &[a.path().into(), b.path().into()]).unwrap_err();
    assert_eq!(e.code, 4);
    assert!(
        e.msg.contains("failed to find plugin \"bridge\""),
        "{}",
        e.msg
    );
    assert!(
        e.msg.contains(&a.path().display().to_string())
            && e.msg.contains(&b.path().display().to_string())
    );
    let e = find_plugin("../bin/sh", &[a.path().into()]).unwrap_err();
    assert_eq!(e.code, 7);
}

#[test]
fn a_failed_add_runs_del_and_returns_the_error_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    script(
        dir.path(),
        "failing",
        &format!(
            "echo \"$CNI_COMMAND $CNI_CONTAINERID $(cat)\" >> {log}\n[ \"$CNI_COMMAND\" = DEL ] && exit 0\necho '{{\"cniVersion\":\"1.0.0\",\"code\":11,\"msg\":\"busy\",\"details\":\"d\"}}'\nexit 1",
            log = log.display()
        ),
    );
    let env = env_with_path(&[dir.path()]);
    let conf = json!({"cniVersion": "1.0.0", "name": "n", "type": "failing"});
    let e = delegate_add(&env, "failing", &conf, Version::V1_0_0).unwrap_err();
    assert_eq!(
        (e.code, e.msg.as_str(), e.details.as_str()),
        (11, "busy", "d")
    );
    let calls = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = calls.lines().collect();
    assert_eq!(lines.len(), 2, "{calls}");
    assert!(lines[0].starts_with("ADD c1 {"));
    assert!(lines[1].starts_with("DEL c1 {"));
    assert!(lines[1].contains("\"type\":\"failing\""));
}

#[test]
fn a_delegate_result_is_parsed_and_a_silent_del_is_success() {
    let dir = tempfile::tempdir().unwrap();
    script(
        dir.path(),
        "ok",
        "[ \"$CNI_COMMAND\" = DEL ] && exit 0\necho '{\"cniVersion\":\"0.3.1\",\"ips\":[{\"version\":\"4\",\"address\":\"10.0.0.2/24\"}]}'",
    );
    let env = env_with_path(&[dir.path()]);
    let conf = json!({"cniVersion": "0.3.1", "name": "n", "type": "ok"});
    let r = delegate_add(&env, "ok", &conf, Version::V0_3_1).unwrap();
    assert_eq!(r.ips[0].address.to_string(), "10.0.0.2/24");
    delegate(&env, Command::Del, "ok", &conf).unwrap();
}

#[test]
fn a_delegate_that_prints_no_error_object_still_fails_with_its_output() {
    let dir = tempfile::tempdir().unwrap();
    script(dir.path(), "crashy", "echo 'segfault-ish'; exit 2");
    let env = env_with_path(&[dir.path()]);
    let e = delegate(&env, Command::Check, "crashy", &json!({})).unwrap_err();
    assert_eq!(e.code, 999);
    assert!(
        e.msg.contains("segfault-ish") && e.msg.contains("crashy"),
        "{}",
        e.msg
    );
}
