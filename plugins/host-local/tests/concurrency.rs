//! Many processes on one network at once: the lock makes them take turns.

mod common;

use common::*;
use serde_json::Value;
use std::collections::BTreeSet;
use std::process::Child;
use testkit::Invocation;

/// Starts `inv` without waiting for it.
fn spawn(inv: &Invocation, conf: &Value) -> Child {
    inv.spawn_in(None, conf.to_string().as_bytes())
}

fn finish(child: Child) -> Value {
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "failed: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    if stdout.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&stdout).unwrap()
    }
}

#[test]
fn sixty_four_concurrent_adds_get_distinct_addresses_and_dels_leave_only_bookkeeping() {
    let net = Net::new();
    let conf = net.subnet("1.0.0", "10.50.0.0/24");
    let ids: Vec<String> = (0..64).map(|i| format!("conc-{i}")).collect();

    let children: Vec<Child> = ids
        .iter()
        .map(|id| spawn(&ours("ADD").container_id(id), &conf))
        .collect();
    let got: Vec<String> = children.into_iter().map(|c| address(&finish(c))).collect();
    let distinct: BTreeSet<&String> = got.iter().collect();
    assert_eq!(distinct.len(), 64, "{got:?}");
    let files = net.reservations();
    assert_eq!(files.len(), 64);
    for (id, ip) in ids.iter().zip(&got) {
        assert_eq!(files[ip], format!("{id}\r\neth0"));
    }

    let children: Vec<Child> = ids
        .iter()
        .map(|id| spawn(&ours("DEL").container_id(id), &conf))
        .collect();
    for c in children {
        finish(c);
    }
    assert_eq!(net.files(), ["last_reserved_ip.0", "lock"]);
}

#[test]
fn ours_and_go_at_once_never_share_an_address() {
    if go("ADD").is_none() {
        return;
    }
    let net = Net::new();
    let conf = net.subnet("1.0.0", "10.51.0.0/24");
    let ids: Vec<String> = (0..64).map(|i| format!("mixed-{i}")).collect();
    let inv = |i: usize, cmd: &str| {
        if i.is_multiple_of(2) {
            ours(cmd)
        } else {
            go(cmd).unwrap()
        }
        .container_id(&ids[i])
    };
    let children: Vec<Child> = (0..64).map(|i| spawn(&inv(i, "ADD"), &conf)).collect();
    let got: Vec<String> = children.into_iter().map(|c| address(&finish(c))).collect();
    let distinct: BTreeSet<&String> = got.iter().collect();
    assert_eq!(distinct.len(), 64, "{got:?}");
    assert_eq!(net.reservations().len(), 64);

    // Each releases the other's.
    let children: Vec<Child> = (0..64).map(|i| spawn(&inv(63 - i, "DEL"), &conf)).collect();
    for c in children {
        finish(c);
    }
    assert!(net.reservations().is_empty());
    ours("DEL").container_id("none").run(&conf).ok();
    net.assert_empty();
}
