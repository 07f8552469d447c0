//! The enforcer's life beside the cluster's: a restart under running traffic loses nothing of
//! an allowed pair and lets no denied pair through, and writes nothing; 30 s without the API
//! server change nothing; what is changed by hand in the table comes back; `doctor` says what
//! is wrong and `--fix` mends it; a policy the API server would refuse is said with its name
//! and allows nothing, the others enforced; the node's own traffic to its pods passes.

mod common;

use common::*;
use serde_json::json;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use testkit::cluster::{wait_for, Family, Underlay};
use testkit::kube_api::Kind;
use testkit::probe::{probe_all, Probe, Proto::Tcp};

const VXLAN: &str = r#"{"Type":"vxlan"}"#;

/// x/a (node 1) admits x/b (node 2) and z/a (node 1) only.
fn guard_x_a(w: &World) -> Reach {
    w.policy("x", "guard", json!({"podSelector": {"matchLabels": {"pod": "a"}},
        "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}},
                              {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "z"}},
                               "podSelector": {"matchLabels": {"pod": "a"}}}]}]}));
    Reach::all(true)
        .peer("*", "x/a", false)
        .peer("x/b", "x/a", true)
        .peer("z/a", "x/a", true)
}

fn probe(w: &World, from: &str, to: &str) -> Probe {
    Probe {
        from: w.pod(from).ns.path().to_path_buf(),
        proto: Tcp,
        to: SocketAddr::new(w.addr(to, Family::V4), 80),
    }
}

/// The name of the (one) IPv4 ingress allow set of the pod with `uid`.
fn allow_set(node: &testkit::TestNs, uid: &str) -> String {
    node.run("nft", &["list", "sets", "inet"])
        .split_whitespace()
        .find(|w| w.starts_with(&format!("ingress4-{uid}-")))
        .unwrap_or_else(|| panic!("no ingress4-{uid}-* set"))
        .to_string()
}

fn wrote(w: &World, node: u8) -> usize {
    w.log(node).matches("wrote table").count()
}

#[test]
fn a_restart_under_traffic_loses_nothing_lets_nothing_through_and_writes_nothing() {
    let w = World::new("npr", 130, VXLAN, Underlay::V4, &[]);
    let r = guard_x_a(&w);
    w.expect("guarded", Tcp, 80, &r);
    let before = wrote(&w, 1);

    // Allowed: x/b (another node) and z/a (the same node); denied: y/a (same), y/b (another).
    let allowed = [probe(&w, "x/b", "x/a"), probe(&w, "z/a", "x/a")];
    let denied = [probe(&w, "y/a", "x/a"), probe(&w, "y/b", "x/a")];
    let stop = AtomicBool::new(false);
    let (counts, ping) = std::thread::scope(|s| {
        let prober = s.spawn(|| {
            let (mut ok, mut leaked, mut rounds) = (0, 0, 0);
            while !stop.load(Ordering::Relaxed) {
                let got = probe_all(&allowed, Duration::from_secs(2));
                ok += got.iter().filter(|g| **g).count();
                let got = probe_all(&denied, Duration::from_millis(300));
                leaked += got.iter().filter(|g| **g).count();
                rounds += 1;
            }
            (ok, leaked, rounds)
        });
        let xb = &w.pod("x/b").ns;
        let target = w.addr("x/a", Family::V4).to_string();
        let pinger = s.spawn(move || xb.try_run("ping", &["-q", "-i", "0.01", "-w", "6", &target]));
        std::thread::sleep(Duration::from_secs(1));
        w.terminate_enforcer(1);
        std::thread::sleep(Duration::from_millis(500));
        w.start_enforcer(1);
        w.wait_log_times(1, "the cluster is known", 2);
        let ping = pinger.join().unwrap();
        stop.store(true, Ordering::Relaxed);
        (prober.join().unwrap(), ping)
    });
    let (ok, leaked, rounds) = counts;
    assert!(rounds >= 3, "{rounds} rounds of probes");
    assert_eq!(
        ok,
        2 * rounds,
        "every probe of an allowed pair was answered"
    );
    assert_eq!(leaked, 0, "no probe of a denied pair was answered");
    let text = String::from_utf8_lossy(&ping.stdout);
    assert!(text.contains(" 0% packet loss"), "ping x/b -> x/a: {text}");
    assert_eq!(
        wrote(&w, 1),
        before,
        "the restart wrote nothing:\n{}",
        w.log(1)
    );
    w.expect("still guarded", Tcp, 80, &r);

    // The node's own traffic to its pods passes (kubelet's probes); another node's does not.
    let from_node = |n: u8| Probe {
        from: w.cluster.node(n).ns.path().to_path_buf(),
        proto: Tcp,
        to: SocketAddr::new(w.addr("x/a", Family::V4), 80),
    };
    assert_eq!(
        probe_all(&[from_node(1), from_node(2)], Duration::from_secs(2)),
        [true, false],
        "node 1 reaches its x/a, node 2 does not"
    );
}

#[test]
fn thirty_seconds_without_the_api_server_change_nothing() {
    let mut w = World::new("npo", 131, VXLAN, Underlay::V4, &[]);
    let r = guard_x_a(&w);
    w.expect("guarded", Tcp, 80, &r);
    let before: Vec<usize> = (1..=3).map(|n| wrote(&w, n)).collect();
    let down = Instant::now();
    w.cluster.kube_mut().stop();
    for n in 1..=3 {
        w.wait_log(n, "keeping what is enforced until it works again");
    }
    w.expect("the API server gone", Tcp, 80, &r);
    std::thread::sleep(Duration::from_secs(30).saturating_sub(down.elapsed()));
    w.expect("30 s later", Tcp, 80, &r);
    w.cluster.kube_mut().resume();
    for n in 1..=3 {
        w.wait_log(n, "works again");
    }
    // A change the enforcers hear once they watch again: nothing the policies read.
    w.label_namespace("y", json!({"touched": "yes"}));
    w.expect("the API server back", Tcp, 80, &r);
    let after: Vec<usize> = (1..=3).map(|n| wrote(&w, n)).collect();
    assert_eq!(after, before, "nothing written through the outage");
}

#[test]
fn hand_edits_come_back_doctor_says_so_and_bad_policies_are_told() {
    let w = World::new("nph", 132, VXLAN, Underlay::V4, &[]);
    let r = guard_x_a(&w);
    w.expect("guarded", Tcp, 80, &r);
    let node1 = &w.cluster.node(1).ns;
    let uid = w.cluster.kube().get(Kind::Pod, "x", "a").unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    let ip = w.addr("x/a", Family::V4).to_string();
    let table = "inet flannel-netpol";
    let edits = [
        format!("delete table {table}"),
        format!("flush set {table} {}", allow_set(node1, &uid)),
        format!("flush chain {table} postrouting"),
        format!("delete element {table} ingress4 {{ {ip} }}"),
        format!("add rule {table} ingress-{uid} accept"),
    ];
    for (i, edit) in edits.iter().enumerate() {
        node1.run("nft", &[edit]);
        w.wait_log_times(1, "repaired table", i + 1);
        w.expect(&format!("after `nft {edit}`"), Tcp, 80, &r);
    }

    // doctor, with the enforcer stopped: the element missing is said, --fix writes it.
    w.terminate_enforcer(1);
    node1.run(
        "nft",
        &[&format!("delete element {table} ingress4 {{ {ip} }}")],
    );
    let doctor = |fix: bool| {
        let mut args = vec![
            "--kubeconfig".to_string(),
            w.kubeconfig().display().to_string(),
        ];
        let subnet_file = w.cluster.node(1).subnet_file().display().to_string();
        args.extend([
            "--hostname-override".into(),
            "node1".into(),
            "--subnet-file".into(),
            subnet_file,
            "doctor".into(),
        ]);
        if fix {
            args.push("--fix".into());
        }
        let out = node1.command(NETPOL).args(&args).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, text) = doctor(false);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("FAIL table    inet flannel-netpol differs"),
        "{text}"
    );
    assert!(
        text.contains("ok   flannel  ") && text.contains("FLANNEL_IPMASQ=true"),
        "{text}"
    );
    assert!(
        text.contains("x/a ") && text.contains("isolated by x/guard"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "allows from {} (x/b) any protocol",
            w.addr("x/b", Family::V4)
        )),
        "{text}"
    );
    let (code, text) = doctor(true);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.ends_with("all right\n"), "{text}");
    w.expect("after doctor --fix", Tcp, 80, &r);
    let before = wrote(&w, 1);
    w.start_enforcer(1);
    w.wait_log_times(1, "the cluster is known", 2);
    w.expect("the enforcer back", Tcp, 80, &r);
    assert_eq!(wrote(&w, 1), before, "nothing left to write");

    // What the API server would refuse: said with the policy's name, allowing nothing; the
    // other policies as they were.
    w.policy(
        "x",
        "bad",
        json!({"podSelector": {"matchLabels": {"pod": "c"}},
        "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/33"}}]},
                    {"ports": [{"port": "no-such-port"}]}]}),
    );
    for n in 1..=3 {
        w.wait_log(n, "NetworkPolicy x/bad: ingress rule 0 peer 0: ipBlock.cidr \"10.0.0.0/33\" is not a CIDR");
    }
    w.expect(
        "x/c isolated, nothing allowed",
        Tcp,
        80,
        &r.clone().peer("*", "x/c", false),
    );
    wait_for("x/bad said once per node", Duration::from_secs(1), || {
        (w.log(3).matches("NetworkPolicy x/bad").count() == 1).then_some(())
    });
}
