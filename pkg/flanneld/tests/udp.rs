//! The `udp` backend, the one a config without `Backend.Type` gets, as in Go's flanneld: pods
//! across three nodes in every registry; `flannel0` as Go's makes it; its tunnel (a process
//! of its own) kept across a restart of flanneld and repaired when killed or changed; and a
//! cluster where Go's flanneld v0.20.2 runs udp on one node, pods crossing both ways.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;
use testkit::cluster::{wait_for, Cluster, Family, Registry, ETCD_PREFIX};
use udptunnel::control::{socket_path, Change, Client};

const FLANNELD: &str = env!("CARGO_BIN_EXE_flanneld");
const T: Duration = Duration::from_secs(60);

fn tunnel_program() -> PathBuf {
    let p = Path::new(FLANNELD).with_file_name("flannel-udp");
    assert!(
        p.exists(),
        "{} is missing: cargo build --workspace --bins",
        p.display()
    );
    p
}

/// A cluster on `Backend` absent (udp); each node's tunnel socket in its own directory.
fn cluster(prefix: &str, net: u8, nodes: u8, registry: Registry) -> Cluster {
    tunnel_program();
    let config = format!(r#"{{"Network":"10.{net}.0.0/16"}}"#);
    let mut c = Cluster::new(prefix, net, nodes, registry, &config);
    for n in 1..=nodes {
        let dir = c.node(n).dir.display().to_string();
        c.set_flanneld_env(n, "FLANNEL_UDP_SOCKET_DIR", &dir);
    }
    c
}

fn client(c: &Cluster, n: u8) -> Client {
    Client::at(&socket_path(&c.node(n).dir, "flannel0"))
}

/// The pid of node `n`'s tunnel process.
fn tunnel_pid(c: &Cluster, n: u8) -> Option<String> {
    let out = Command::new("ip")
        .args(["netns", "pids", c.node(n).ns.name()])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .find(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|cmd| cmd.contains("flannel-udp"))
        })
        .map(str::to_string)
}

/// What every node shows of the backend: flannel0 as Go's makes it, its lease without a
/// backend type, its tunnel routing the other nodes.
fn check_nodes(c: &Cluster, net: u8, nodes: u8) {
    for n in 1..=nodes {
        let node = c.node(n);
        let link = node.ns.link("flannel0").expect("flannel0");
        assert_eq!(link["mtu"], 1472, "node {n}: the external MTU less 28");
        let subnet = node.subnet(Family::V4, T).expect("a subnet");
        let network_address = subnet.split('/').next().unwrap().to_string();
        let v4: Vec<String> = node
            .ns
            .addresses("flannel0")
            .into_iter()
            .filter(|a| !a.contains(':'))
            .collect();
        assert_eq!(v4, vec![format!("{network_address}/32")], "node {n}");
        let routes = node.routes();
        assert!(
            routes.contains(&format!("10.{net}.0.0/16 dev flannel0")),
            "node {n}: the network through flannel0:\n{routes}"
        );
        let state = client(c, n).get().expect("the tunnel answers");
        assert_eq!(state.listen, format!("{}:8285", node.ip).parse().ok());
        assert_eq!(
            state.routes.len(),
            usize::from(nodes) - 1,
            "node {n}: {state:?}"
        );
    }
}

fn default_case(prefix: &str, net: u8, registry: Registry) {
    let mut c = cluster(prefix, net, 3, registry);
    c.start_flanneld_everywhere(Path::new(FLANNELD), T);
    for n in 1..=3 {
        c.add_pod(n);
    }
    c.wait_every_pod_reaches_every_other(&[Family::V4], T);
    check_nodes(&c, net, 3);
    let log = c.node(1).log();
    assert!(log.contains("backend udp"), "{log}");
    // Leases as Go's udp backend writes them: no BackendType, no BackendData.
    match registry {
        Registry::Kube => {
            let node = c
                .kube()
                .node(&testkit::cluster::kube_node_name(1))
                .expect("node 1");
            let ann = &node["metadata"]["annotations"];
            assert_eq!(ann["flannel.alpha.coreos.com/backend-type"], "", "{ann}");
        }
        Registry::Etcd => {
            let key = c.node(1).lease_key(T);
            let value = c.etcdctl(&[
                "get",
                &format!("{ETCD_PREFIX}/subnets/{key}"),
                "--print-value-only",
            ]);
            assert!(
                !value.contains("BackendType") && !value.contains("BackendData"),
                "{value}"
            );
        }
        Registry::Embedded => {
            let key = c.node(1).lease_key(T);
            let value =
                std::fs::read_to_string(c.registry_dir().join("subnets").join(&key)).unwrap();
            assert!(
                !value.contains("BackendType") && !value.contains("BackendData"),
                "{value}"
            );
        }
    }
}

#[test]
fn udp_is_the_default_and_carries_pods_across_nodes_with_etcd() {
    default_case("fue", 140, Registry::Etcd);
}

#[test]
fn udp_is_the_default_and_carries_pods_across_nodes_in_kube_mode() {
    default_case("fuk", 141, Registry::Kube);
}

#[test]
fn udp_is_the_default_and_carries_pods_across_nodes_with_the_embedded_registry() {
    default_case("fud", 142, Registry::Embedded);
}

#[test]
fn a_restart_keeps_the_tunnel_and_what_breaks_is_repaired() {
    let mut c = cluster("fur", 143, 2, Registry::Embedded);
    c.start_flanneld_everywhere(Path::new(FLANNELD), T);
    let (a, b) = (c.add_pod(1), c.add_pod(2));
    let to = c.pods()[b].ip.clone();
    wait_for("pod a to reach pod b", T, || {
        c.pods()[a].ping(&to, 1).then_some(())
    });
    let pid = tunnel_pid(&c, 1).expect("node 1's tunnel");
    // flanneld restarted under 100 pings a second: none lost, the same tunnel.
    let pings = c.pods()[a]
        .ns
        .command("ping")
        .args(["-n", "-q", "-i", "0.01", "-W", "2", "-c", "600", &to])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    c.start_flanneld(1, Path::new(FLANNELD), &["--healthz-port", "9143"]);
    let out = pings.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(" 0% packet loss"),
        "pings across the restart: {text}"
    );
    c.node(1).wait_log("wrote", T);
    assert_eq!(
        tunnel_pid(&c, 1).as_deref(),
        Some(pid.as_str()),
        "the same tunnel"
    );
    wait_for("/metrics to count the tunnel's route", T, || {
        let out = c
            .node(1)
            .ns
            .try_run("curl", &["-s", "-m", "2", "http://127.0.0.1:9143/metrics"]);
        String::from_utf8_lossy(&out.stdout)
            .contains("flanneld_backend_peers 1\n")
            .then_some(())
    });
    // A route taken from the tunnel behind flanneld's back is put back.
    let subnet_b = c.node(2).subnet(Family::V4, T).unwrap();
    client(&c, 1)
        .set(&Change {
            remove: vec![subnet_b.parse().unwrap()],
            ..Change::default()
        })
        .unwrap();
    wait_for("the route put back into the tunnel", T, || {
        (client(&c, 1).get().ok()?.routes.len() == 1).then_some(())
    });
    // The tunnel killed: flannel0 goes with it; flanneld starts another, pods talk again.
    Command::new("kill").args(["-9", &pid]).status().unwrap();
    wait_for("a new tunnel", T, || {
        tunnel_pid(&c, 1).filter(|p| *p != pid)
    });
    wait_for("pod a to reach pod b again", T, || {
        c.pods()[a].ping(&to, 1).then_some(())
    });
    check_nodes(&c, 143, 2);
    // doctor: the device, its tunnel, the other node's route; nothing wrong.
    let out = c
        .node(1)
        .ns
        .command(FLANNELD)
        .arg("doctor")
        .args(c.flanneld_args(1))
        .env("FLANNEL_UDP_SOCKET_DIR", &c.node(1).dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "doctor:\n{text}");
    assert!(text.contains("flannel0 (udp tunnel on"), "{text}");
    assert!(text.contains("via 192.168.143.2:8285"), "{text}");
}

#[test]
fn ipv6_networks_are_refused_naming_the_backend() {
    let mut c = Cluster::on(
        testkit::cluster::Underlay::Dual,
        "fu6",
        144,
        1,
        Registry::Embedded,
        r#"{"Network":"10.144.0.0/16","EnableIPv6":true,"IPv6Network":"fd44::/48","Backend":{"Type":"udp"}}"#,
    );
    c.start_flanneld(1, Path::new(FLANNELD), &[]);
    let status = c.wait_flanneld_exit(1, T);
    assert_eq!(status.code(), Some(2));
    let log = c.node(1).log();
    assert!(log.contains("udp backend carries IPv4 only"), "{log}");
}

#[test]
fn go_s_flanneld_on_udp_and_ours_carry_pods_both_ways() {
    if !testkit::go_flanneld_here() {
        return;
    }
    let mut c = cluster("fug", 145, 3, Registry::Etcd);
    for n in 1..=2 {
        c.start_flanneld(n, Path::new(FLANNELD), &[]);
    }
    // Go's v0.20.2 misses a lease created in the first instants of its etcd watch: the nodes
    // of a running cluster do not start together.
    for n in 1..=2 {
        c.node(n).wait_subnet_env(T);
    }
    c.start_flanneld(3, &testkit::go_flanneld(), &[]);
    c.node(3).wait_subnet_env(T);
    for n in 1..=3 {
        c.add_pod(n);
    }
    c.wait_every_pod_reaches_every_other(&[Family::V4], T);
    // Go's reads ours, ours reads Go's.
    let go_log = c.node(3).log();
    for n in 1..=2 {
        let subnet = c.node(n).subnet(Family::V4, T).unwrap();
        assert!(
            go_log.contains(&format!("Subnet added: {subnet}")),
            "Go's log:\n{go_log}"
        );
        let routes = client(&c, n).get().unwrap().routes;
        let go_subnet = c.node(3).subnet(Family::V4, T).unwrap();
        assert!(
            routes.iter().any(|(s, to)| s.to_string() == go_subnet
                && to.to_string() == format!("{}:8285", c.node(3).ip)),
            "node {n}'s tunnel routes Go's node: {routes:?}"
        );
    }
    let go_link = c.node(3).ns.link("flannel0").expect("Go's flannel0");
    assert_eq!(
        go_link["mtu"],
        c.node(1).ns.link("flannel0").unwrap()["mtu"]
    );
}
