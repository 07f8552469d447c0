//! The kube mode under faults (issue 38), on the three-node cluster with twenty more Nodes
//! annotated as Go's flanneld annotates them: the API server restarted with its watch cache
//! empty (every watch answered 410), a ten-minute outage during which Nodes are deleted and
//! made again with other podCIDRs, and throttling (429 with Retry-After) while Nodes change.
//! After each, every node's kernel (routes, neighbours and FDB entries on flannel.1) equals
//! what the Nodes say within 5 s.

use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};
use testkit::cluster::{kube_node_name, wait_for, Cluster, Node, Registry};
use testkit::kube_api::{Kind, Overload};

const FLANNELD: &str = env!("CARGO_BIN_EXE_flanneld");
/// A ceiling for the cluster's start, on a loaded machine.
const T: Duration = Duration::from_secs(90);
/// Issue 38's bound: after a fault ends, the kernel equals the Nodes within this.
const IN_STEP: Duration = Duration::from_secs(5);
const PEERS: u32 = 20;

fn vxlan(net: u8) -> String {
    format!(r#"{{"Network":"10.{net}.0.0/16","Backend":{{"Type":"vxlan"}}}}"#)
}

/// Peer `i`, a node that runs no daemon here, with its subnet from `base` on.
fn peer(net: u8, i: u32, base: u32) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": format!("peer{i}"), "annotations": {
            "flannel.alpha.coreos.com/backend-data":
                format!(r#"{{"VNI":1,"VtepMAC":"0e:00:00:00:{:02x}:{:02x}"}}"#, base, i),
            "flannel.alpha.coreos.com/backend-type": "vxlan",
            "flannel.alpha.coreos.com/kube-subnet-manager": "true",
            "flannel.alpha.coreos.com/public-ip": format!("192.168.{net}.{}", base + i),
        }},
        "spec": {"podCIDR": format!("10.{net}.{}.0/24", base + i)},
    })
}

/// What a node's kernel holds for the others on flannel.1, or what the Nodes say it should.
#[derive(Debug, Default, PartialEq, Eq)]
struct Entries {
    routes: BTreeSet<String>,
    /// (VTEP address, MAC)
    neighbours: BTreeSet<(String, String)>,
    /// (MAC, public address)
    fdb: BTreeSet<(String, String)>,
}

/// What node `own`'s kernel should hold: an entry of each other Node that is a lease.
fn wanted(c: &Cluster, own: u8) -> Entries {
    let mut e = Entries::default();
    for n in c.kube().list(Kind::Node, None) {
        let ann = &n["metadata"]["annotations"];
        let text = |k: &str| ann[format!("flannel.alpha.coreos.com/{k}")].as_str();
        let (Some(cidr), Some("true"), Some(data), Some(public)) = (
            n["spec"]["podCIDR"].as_str(),
            text("kube-subnet-manager"),
            text("backend-data"),
            text("public-ip"),
        ) else {
            continue;
        };
        if n["metadata"]["name"] == kube_node_name(own).as_str() {
            continue;
        }
        let data: Value = serde_json::from_str(data).expect("backend-data is JSON");
        let mac = data["VtepMAC"].as_str().expect("a VtepMAC").to_string();
        let vtep = cidr.split('/').next().unwrap_or_default().to_string();
        e.routes.insert(cidr.to_string());
        e.neighbours.insert((vtep, mac.clone()));
        e.fdb.insert((mac, public.to_string()));
    }
    e
}

fn held(node: &Node) -> Entries {
    let routes = node
        .ns
        .ip_json(&["-4", "route", "show", "dev", "flannel.1"]);
    let neigh = node
        .ns
        .ip_json(&["neigh", "show", "dev", "flannel.1", "nud", "permanent"]);
    let fdb: Value = serde_json::from_str(
        &node
            .ns
            .run("bridge", &["-j", "fdb", "show", "dev", "flannel.1"]),
    )
    .unwrap_or(Value::Null);
    let list = |v: &Value| v.as_array().cloned().unwrap_or_default();
    let text = |v: &Value, k: &str| v[k].as_str().unwrap_or_default().to_string();
    Entries {
        routes: list(&routes).iter().map(|r| text(r, "dst")).collect(),
        neighbours: list(&neigh)
            .iter()
            .map(|n| (text(n, "dst"), text(n, "lladdr")))
            .collect(),
        fdb: list(&fdb)
            .iter()
            .filter(|f| f.get("dst").is_some())
            .map(|f| (text(f, "mac"), text(f, "dst")))
            .collect(),
    }
}

/// The first node whose kernel differs from the Nodes, and how; None when all agree.
fn difference(c: &Cluster) -> Option<String> {
    c.nodes().iter().find_map(|n| {
        let (want, have) = (wanted(c, n.index), held(n));
        (want != have).then(|| {
            format!(
                "node {}: the Nodes say {want:?}, the kernel holds {have:?}",
                n.index
            )
        })
    })
}

/// Waits until every node's kernel equals the Nodes, `within` of `since`.
fn in_step(c: &Cluster, what: &str, since: Instant, within: Duration) {
    loop {
        let Some(diff) = difference(c) else {
            return;
        };
        if since.elapsed() > within {
            panic!("{what}: not in step {within:?} after: {diff}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn cluster(prefix: &str, net: u8) -> Cluster {
    let mut c = Cluster::new(prefix, net, 3, Registry::Kube, &vxlan(net));
    c.kube()
        .create_nodes((1..=PEERS).map(|i| peer(net, i, 100)));
    for i in 1..=3 {
        c.start_flanneld(i, Path::new(FLANNELD), &[]);
    }
    for n in c.nodes() {
        n.wait_subnet_env(T);
    }
    in_step(&c, "the start", Instant::now(), T);
    c
}

/// Peers `from..=to` deleted and made again at subnets from `base` on, with new MACs and
/// public addresses; and peer `fresh` added.
fn move_peers(c: &Cluster, net: u8, from: u32, to: u32, base: u32, fresh: u32) {
    for i in from..=to {
        c.kube()
            .delete_node(&format!("peer{i}"))
            .unwrap_or_else(|e| panic!("deleting peer{i}: {}", e.message));
        c.kube().create_node(peer(net, i, base));
    }
    c.kube().create_node(peer(net, fresh, base));
}

#[test]
fn a_restarted_api_server_with_an_empty_watch_cache_is_in_step_within_five_seconds() {
    let net = 111;
    let mut c = cluster("kfr", net);
    // Restarted over the same store, its watch cache empty: every watch from before is
    // answered 410, as a status, and the daemons list again.
    c.kube_mut().stop();
    move_peers(&c, net, 1, 5, 150, 30);
    c.kube().delete_node("peer6").expect("deleting peer6");
    c.kube().compact();
    c.kube().set_expired_watch_as_status(true);
    c.kube_mut().resume();
    in_step(&c, "after the restart", Instant::now(), IN_STEP);
    let expired = c
        .kube()
        .requests()
        .iter()
        .filter(|r| r.verb == "watch" && r.code == 410)
        .count();
    assert!(expired >= 3, "not every daemon's watch was answered 410");
}

#[test]
fn throttling_while_nodes_change_is_in_step_within_five_seconds_of_its_end() {
    let net = 112;
    let c = cluster("kft", net);
    // Watches end every 1.5 s, so that the daemons keep asking while they are throttled.
    c.kube().set_watch_limit(Some(Duration::from_millis(1500)));
    let from = c.kube().requests().len();
    c.kube().set_overloaded(Some(Overload {
        code: 429,
        retry_after: Some(1),
    }));
    move_peers(&c, net, 1, 5, 150, 30);
    c.kube().delete_node("peer6").expect("deleting peer6");
    wait_for("three requests of each daemon answered 429", T, || {
        let rs = c.kube().requests();
        c.nodes()
            .iter()
            .all(|n| {
                let user = &n.kube_user().expect("a kube user").name;
                rs[from..]
                    .iter()
                    .filter(|r| &r.user == user && r.code == 429)
                    .count()
                    >= 3
            })
            .then_some(())
    });
    c.kube().set_overloaded(None);
    in_step(&c, "after the throttling", Instant::now(), IN_STEP);
}

#[test]
fn ten_minutes_without_the_api_server_while_nodes_move_is_in_step_within_five_seconds() {
    let net = 113;
    let mut c = cluster("kfo", net);
    let before: Vec<Entries> = c.nodes().iter().map(held).collect();
    let outage = Duration::from_secs(600);
    c.kube_mut().stop();
    let down = Instant::now();
    let mut moved = [false; 2];
    // Mostly asleep, so that the suite's other tests run meanwhile; a look every 30 s that
    // the datapath stays as it was.
    while down.elapsed() < outage {
        std::thread::sleep(Duration::from_secs(30).min(outage.saturating_sub(down.elapsed())));
        if !moved[0] && down.elapsed() >= outage / 10 {
            move_peers(&c, net, 1, 5, 150, 30);
            c.kube().delete_node("peer6").expect("deleting peer6");
            moved[0] = true;
        }
        if !moved[1] && down.elapsed() >= outage * 9 / 10 {
            move_peers(&c, net, 7, 9, 180, 31);
            moved[1] = true;
        }
        for (n, was) in c.nodes().iter().zip(&before) {
            assert_eq!(
                &held(n),
                was,
                "node {}'s datapath changed {:?} into the outage",
                n.index,
                down.elapsed()
            );
        }
    }
    c.kube_mut().resume();
    in_step(
        &c,
        "after ten minutes without the API server",
        Instant::now(),
        IN_STEP,
    );
    for n in c.nodes() {
        assert!(!n.log().contains("ERROR"), "{}", n.log());
    }
}
