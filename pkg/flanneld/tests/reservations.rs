//! etcd reservations (flannel's Documentation/reservations.md): a subnet key an operator wrote
//! without an etcd lease belongs to the node whose public IP it names, for good. flanneld takes
//! it, keeps it without a lease through its start, its renewals and a restart, and never hands
//! it to another node nor counts it as free.

use serde_json::Value;
use std::path::Path;
use std::time::Duration;
use testkit::cluster::{wait_for, Cluster, Registry, ETCD_PREFIX};

const FLANNELD: &str = env!("CARGO_BIN_EXE_flanneld");
const T: Duration = Duration::from_secs(60);
/// Renewals every 2 s (a third of the lifetime), so that the test sees several.
const TTL: &[&str] = &["--subnet-lease-ttl", "6"];

/// The etcd lease the key is attached to (0: none), and its value.
fn stored(c: &Cluster, key: &str) -> (i64, Value) {
    let out: Value =
        serde_json::from_str(&c.etcdctl(&["get", key, "-w", "json"])).expect("etcdctl's JSON");
    let value = c.etcdctl(&["get", key, "--print-value-only"]);
    (
        out["kvs"][0]["lease"].as_i64().unwrap_or(0),
        serde_json::from_str(value.trim()).expect("a lease's JSON"),
    )
}

fn renewals(c: &Cluster, n: u8, key: &str) -> usize {
    c.node(n)
        .log()
        .matches(&format!("renewed lease {key}"))
        .count()
}

#[test]
fn a_reservation_is_its_nodes_for_good_and_nobody_elses() {
    // Two subnets in all: 10.135.77.0/24, reserved for node 1, and 10.135.78.0/24.
    let mut c = Cluster::new(
        "frv",
        135,
        3,
        Registry::Etcd,
        r#"{"Network":"10.135.0.0/16","SubnetMin":"10.135.77.0","SubnetMax":"10.135.78.0","Backend":{"Type":"vxlan"}}"#,
    );
    let name = "10.135.77.0-24";
    let key = format!("{ETCD_PREFIX}/subnets/{name}");
    let ip1 = c.node(1).ip.clone();
    c.etcdctl(&[
        "put",
        &key,
        &format!(r#"{{"PublicIP":"{ip1}","BackendType":"vxlan"}}"#),
    ]);
    // Node 2 comes first and takes the other one.
    c.start_flanneld(2, Path::new(FLANNELD), TTL);
    assert_eq!(c.node(2).subnet_env("FLANNEL_SUBNET", T), "10.135.78.1/24");
    // Node 1 takes its reservation; it stays without a lease through its renewals.
    c.start_flanneld(1, Path::new(FLANNELD), TTL);
    assert_eq!(c.node(1).subnet_env("FLANNEL_SUBNET", T), "10.135.77.1/24");
    let log = c.node(1).log();
    assert!(log.contains("is reserved for this node"), "{log}");
    let (lease, value) = stored(&c, &key);
    assert_eq!(lease, 0, "no etcd lease after the start: {value}");
    assert!(value["BackendData"]["VtepMAC"].is_string(), "{value}");
    wait_for("node 1's first two renewals", T, || {
        (renewals(&c, 1, name) >= 2).then_some(())
    });
    assert_eq!(stored(&c, &key).0, 0, "no etcd lease after renewals");
    // A restart takes it again, still a reservation.
    c.start_flanneld(1, Path::new(FLANNELD), TTL);
    let before = renewals(&c, 1, name);
    wait_for("a renewal after the restart", T, || {
        (renewals(&c, 1, name) > before).then_some(())
    });
    assert_eq!(c.node(1).subnet_env("FLANNEL_SUBNET", T), "10.135.77.1/24");
    assert_eq!(stored(&c, &key).0, 0, "no etcd lease after the restart");
    // Node 1 gone: its reservation is not free for node 3, which finds no subnet (node 2
    // holds the other).
    c.stop_flanneld(1);
    c.start_flanneld(3, Path::new(FLANNELD), TTL);
    c.node(3).wait_log("out of IPv4 subnets", T);
    let (lease, value) = stored(&c, &key);
    assert_eq!(lease, 0);
    assert_eq!(value["PublicIP"], Value::from(ip1), "{value}");
    assert!(!c.node(3).subnet_file().exists(), "node 3 has no subnet");
}
