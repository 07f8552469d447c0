//! The backends the other tests leave out, each under a case of the truth tables: wireguard
//! (this kernel has none, so the userspace tunnel, flannel-wireguard) and udp (its tunnel,
//! flannel-udp, behind flannel0). Both tunnels carry the pods' own addresses, so that policies
//! see them as on vxlan.

mod common;

use common::*;
use serde_json::json;
use std::process::{Child, Command, Stdio};
use testkit::cluster::{wait_for, Cluster, Underlay};
use testkit::probe::Proto::Tcp;

/// Each node's mount namespace (a sleeping holder) with a /run/wireguard of its own, as on
/// separate machines; on drop, the tunnels left in the nodes (they outlive flanneld) ended.
struct Machines {
    holders: Vec<Child>,
    netns: Vec<String>,
}

impl Machines {
    fn separate(c: &mut Cluster) -> Machines {
        let mut m = Machines {
            holders: Vec::new(),
            netns: Vec::new(),
        };
        std::fs::create_dir_all("/run/wireguard").unwrap();
        for n in 1..=3 {
            let holder = Command::new("unshare")
                .args([
                    "-m",
                    "--propagation",
                    "private",
                    "sh",
                    "-c",
                    "mount -t tmpfs wg /run/wireguard && exec sleep 100000",
                ])
                .stdin(Stdio::null())
                .spawn()
                .unwrap();
            let pid = holder.id();
            wait_for("the node's /run/wireguard", T, || {
                std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
                    .ok()?
                    .contains(" /run/wireguard ")
                    .then_some(())
            });
            m.holders.push(holder);
            m.netns.push(c.node(n).ns.name().to_string());
            c.set_flanneld_wrapper(n, &["nsenter", &format!("--mount=/proc/{pid}/ns/mnt")]);
            let key = c.node(n).dir.join("wgkey");
            c.set_flanneld_env(n, "WIREGUARD_KEY_FILE", &key.display().to_string());
        }
        m
    }
}

impl Drop for Machines {
    fn drop(&mut self) {
        for ns in &self.netns {
            if let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() {
                for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    let _ = Command::new("kill").arg(pid).status();
                }
            }
        }
        for h in &mut self.holders {
            let _ = h.kill();
            let _ = h.wait();
        }
    }
}

#[test]
fn wireguard_userspace_tunnel() {
    let tunnel = testkit::bin_dir().join("flannel-wireguard");
    assert!(
        tunnel.exists(),
        "{} is missing: cargo build --workspace --bins",
        tunnel.display()
    );
    let mut machines = None;
    let w = World::prepared(
        "npw",
        127,
        r#"{"Type":"wireguard","PersistentKeepaliveInterval":0}"#,
        Underlay::V4,
        &[],
        |c| machines = Some(Machines::separate(c)),
    );
    x_a_from_y_only_z_sends_nothing(&w);
    drop(w);
    drop(machines);
}

/// A case on a cluster: x/a admits only namespace y; z sends nothing.
fn x_a_from_y_only_z_sends_nothing(w: &World) {
    w.expect("before any policy", Tcp, 80, &Reach::all(true));
    w.policy("x", "allow-client-a-via-ns-selector", json!({"podSelector": {"matchLabels": {"pod": "a"}},
        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "y"}}}]}]}));
    w.policy(
        "z",
        "deny-egress",
        json!({"podSelector": {}, "policyTypes": ["Egress"]}),
    );
    w.expect(
        "x/a from y only, z sends nothing",
        Tcp,
        80,
        &Reach::all(true)
            .peer("x/*", "x/a", false)
            .peer("z/*", "x/a", false)
            .peer("z/*", "*", false),
    );
}

#[test]
fn udp_tunnel() {
    let tunnel = testkit::bin_dir().join("flannel-udp");
    assert!(
        tunnel.exists(),
        "{} is missing: cargo build --workspace --bins",
        tunnel.display()
    );
    // Each node's tunnel socket in its own directory, as on separate machines (the cluster
    // ends the tunnels, which outlive flanneld, with its nodes).
    let w = World::prepared("npt", 128, r#"{"Type":"udp"}"#, Underlay::V4, &[], |c| {
        for n in 1..=3 {
            let dir = c.node(n).dir.display().to_string();
            c.set_flanneld_env(n, "FLANNEL_UDP_SOCKET_DIR", &dir);
        }
    });
    for n in 1..=3 {
        let routes = w.cluster.node(n).routes();
        assert!(
            routes.contains("10.128.0.0/16 dev flannel0"),
            "node {n}: the network through the udp tunnel's flannel0:\n{routes}"
        );
    }
    x_a_from_y_only_z_sends_nothing(&w);
}
