//! flanneld --kube-subnet-mgr on nodes of testkit::cluster with `Registry::Kube`: the API
//! server stand-in in the underlay, a Node per node with its podCIDR. What kube-flannel's users
//! would check: the annotations and the condition as flanneld writes them, a node annotated in
//! flanneld's format read, the API server gone for a minute, a 410, a missing right, a missing
//! or wrong podCIDR, this node deleted, the node found through its pod, the service account
//! used as a pod uses it, a user's node-public-ip and public-ip-overwrite. (The full mesh, a
//! node joining and one leaving run with the other registries in cluster.rs.)

use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};
use testkit::cluster::{kube_node_name, wait_for, Cluster, Family, Node, Registry};

const FLANNELD: &str = env!("CARGO_BIN_EXE_flanneld");
/// A ceiling for waits: what takes a second on a quiet machine, and the client's backoff
/// after failures (at most 30 s) besides.
const T: Duration = Duration::from_secs(90);
const P: &str = "flannel.alpha.coreos.com/";
const HEALTHZ: &[&str] = &["--healthz-ip", "127.0.0.1", "--healthz-port", "8285"];
/// Where a pod's service account is mounted, as client-go reads it.
const SERVICE_ACCOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

fn vxlan(net: u8) -> String {
    format!(r#"{{"Network":"10.{net}.0.0/16","Backend":{{"Type":"vxlan"}}}}"#)
}

fn start_all(c: &mut Cluster, extra: &[&str]) {
    let nodes: Vec<u8> = c.nodes().iter().map(|n| n.index).collect();
    for &i in &nodes {
        c.start_flanneld(i, Path::new(FLANNELD), extra);
    }
    for &i in &nodes {
        c.node(i).wait_subnet_env(T);
    }
}

/// The Node object of node `i` as the API server holds it.
fn node_obj(c: &Cluster, i: u8) -> Value {
    c.kube()
        .node(&kube_node_name(i))
        .unwrap_or_else(|| panic!("no Node for node {i}"))
}

/// Node `i`'s annotations under flannel's prefix, the prefix taken off.
fn flannel_annotations(c: &Cluster, i: u8) -> Vec<(String, String)> {
    let n = node_obj(c, i);
    let mut out: Vec<(String, String)> = n["metadata"]["annotations"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.strip_prefix(P)?.to_string(), v.as_str()?.to_string())))
        .collect();
    out.sort();
    out
}

fn vxlan_mac(node: &Node) -> String {
    node.ns
        .link("flannel.1")
        .and_then(|l| l["address"].as_str().map(str::to_string))
        .unwrap_or_else(|| panic!("no flannel.1 on node {}", node.index))
}

fn http_code(node: &Node, path: &str) -> String {
    node.ns.http_status(&format!("http://127.0.0.1:8285{path}"))
}

/// What a node's kernel holds for the other nodes: its routes, the permanent neighbours
/// (the kernel's own ARP states on eth0 come and go) and the FDB.
fn datapath(node: &Node) -> String {
    format!(
        "{}\n{}\n{}",
        node.routes(),
        node.ns.ip(&["neigh", "show", "nud", "permanent"]),
        node.fdb()
    )
}

/// A Node annotated as Go's flanneld annotates it, for a node that runs no daemon here.
fn hand_annotated(name: &str, cidr: &str, mac: &str, public_ip: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "annotations": {
            "flannel.alpha.coreos.com/backend-data": format!(r#"{{"VNI":1,"VtepMAC":"{mac}"}}"#),
            "flannel.alpha.coreos.com/backend-type": "vxlan",
            "flannel.alpha.coreos.com/kube-subnet-manager": "true",
            "flannel.alpha.coreos.com/public-ip": public_ip,
        }},
        "spec": {"podCIDR": cidr},
    })
}

/// Node `node` holds the route, neighbour and FDB entry of a vxlan peer.
fn has_peer(node: &Node, subnet: &str, mac: &str, public_ip: &str) -> bool {
    let vtep = subnet.split('/').next().unwrap_or_default();
    // Through a nexthop object `ip route` shows its id before the nexthop's gateway.
    node.routes().lines().any(|l| {
        l.starts_with(&format!("{subnet} ")) && l.contains(&format!(" via {vtep} dev flannel.1 "))
    }) && node
        .neighbours()
        .lines()
        .any(|l| l.starts_with(&format!("{vtep} dev flannel.1 lladdr {mac}")))
        && node.fdb().contains(&format!("{mac} dst {public_ip} "))
}

fn lists_by(c: &Cluster, i: u8) -> usize {
    let user = c.node(i).kube_user().expect("a kube user").name.clone();
    c.kube()
        .requests()
        .iter()
        .filter(|r| r.user == user && r.verb == "list" && !r.query.contains("continue="))
        .count()
}

#[test]
fn the_annotations_and_the_condition_are_flanneld_s_field_by_field() {
    let mut c = Cluster::new("kan", 81, 3, Registry::Kube, &vxlan(81));
    // Another controller's condition, which the merge by type keeps; a user's overwrite of
    // node 3's public address.
    c.kube()
        .patch_node(
            "node1",
            true,
            &json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}}),
        )
        .unwrap();
    c.kube()
        .patch_node(
            "node3",
            false,
            &json!({"metadata": {"annotations": {"flannel.alpha.coreos.com/public-ip-overwrite": "192.168.81.203"}}}),
        )
        .unwrap();
    start_all(&mut c, &[]);
    for n in c.nodes() {
        let i = n.index;
        wait_for(
            &format!("node {i}'s NetworkUnavailable condition"),
            T,
            || {
                node_obj(&c, i)["status"]["conditions"]
                    .as_array()?
                    .iter()
                    .any(|c| c["type"] == "NetworkUnavailable")
                    .then_some(())
            },
        );
        let public = if i == 3 {
            "192.168.81.203"
        } else {
            n.ip.as_str()
        };
        let mut want = vec![
            (
                "backend-data".to_string(),
                format!(r#"{{"VNI":1,"VtepMAC":"{}"}}"#, vxlan_mac(n)),
            ),
            ("backend-type".into(), "vxlan".into()),
            ("kube-subnet-manager".into(), "true".into()),
            ("public-ip".into(), public.into()),
        ];
        if i == 3 {
            want.push(("public-ip-overwrite".into(), "192.168.81.203".into()));
        }
        want.sort();
        assert_eq!(flannel_annotations(&c, i), want, "node {i}");
        let obj = node_obj(&c, i);
        let cond = obj["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "NetworkUnavailable")
            .unwrap()
            .clone();
        assert_eq!(cond["status"], "False");
        assert_eq!(cond["reason"], "FlannelIsUp");
        assert_eq!(cond["message"], "Flannel is running on this node");
        for t in ["lastHeartbeatTime", "lastTransitionTime"] {
            let v = cond[t].as_str().unwrap_or_default();
            assert!(v.len() == 20 && v.ends_with('Z'), "{t} {v:?}");
        }
        // The lease is the podCIDR.
        let cidr = obj["spec"]["podCIDR"].as_str().unwrap();
        assert_eq!(n.lease_key(T), testkit::cluster::subnet_key(cidr));
    }
    let types: Vec<Value> = node_obj(&c, 1)["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["type"].clone())
        .collect();
    assert_eq!(types, [json!("Ready"), json!("NetworkUnavailable")]);
    // The overwrite is where the other nodes send node 3's traffic.
    let mac3 = vxlan_mac(c.node(3));
    wait_for("node 1's FDB entry for node 3 at its overwrite", T, || {
        c.node(1)
            .fdb()
            .contains(&format!("{mac3} dst 192.168.81.203 "))
            .then_some(())
    });

    // A restart with flannel.1 gone keeps the VtepMAC the annotations hold (flannel#1795).
    let mac1 = vxlan_mac(c.node(1));
    // The log goes on across the restart: the new daemon's condition line is one more.
    let condition = "NetworkUnavailable=False";
    let conditions_before = c.node(1).log().matches(condition).count();
    c.stop_flanneld(1);
    c.node(1).ns.ip(&["link", "del", "flannel.1"]);
    let patches_before = c
        .kube()
        .requests()
        .iter()
        .filter(|r| r.verb == "patch" && r.path == "/api/v1/nodes/node1/status")
        .count();
    c.start_flanneld(1, Path::new(FLANNELD), &[]);
    wait_for("flannel.1 on node 1 again", T, || {
        c.node(1).ns.link("flannel.1").map(|_| ())
    });
    assert_eq!(
        vxlan_mac(c.node(1)),
        mac1,
        "the VtepMAC changed with the restart"
    );
    wait_for("the restarted daemon to set its condition", T, || {
        (c.node(1).log().matches(condition).count() > conditions_before).then_some(())
    });
    let patches: Vec<_> = c
        .kube()
        .requests()
        .into_iter()
        .filter(|r| r.verb == "patch" && r.path == "/api/v1/nodes/node1/status")
        .collect();
    assert_eq!(
        patches.len() - patches_before,
        1,
        "only the condition is written again: {patches:?}"
    );
}

#[test]
fn a_node_annotated_in_flanneld_s_format_is_read_and_a_garbled_one_skipped() {
    let mut c = Cluster::new("krd", 82, 2, Registry::Kube, &vxlan(82));
    start_all(&mut c, &[]);
    c.kube().create_node(hand_annotated(
        "go-node",
        "10.82.50.0/24",
        "0e:11:22:33:44:55",
        "192.168.82.77",
    ));
    let mut garbled = hand_annotated("bad-node", "10.82.51.0/24", "0e:11:22:33:44:56", "nope");
    garbled["metadata"]["annotations"]["flannel.alpha.coreos.com/backend-type"] = "vxlan".into();
    c.kube().create_node(garbled);
    for n in c.nodes() {
        wait_for(
            &format!("node {}'s entries for go-node", n.index),
            T,
            || has_peer(n, "10.82.50.0/24", "0e:11:22:33:44:55", "192.168.82.77").then_some(()),
        );
        n.wait_log("bad-node", T);
        let log = n.log();
        let line = log.lines().find(|l| l.contains("bad-node")).unwrap();
        assert!(
            line.contains("public-ip") && line.contains("nope"),
            "{line}"
        );
        assert!(!n.routes().contains("10.82.51.0/24"), "{}", n.routes());
    }
    for i in [1, 2] {
        assert!(c.flanneld_running(i), "{}", c.node(i).log());
    }
}

#[test]
fn the_api_server_gone_for_a_minute_leaves_the_datapath_and_costs_no_cpu() {
    let mut c = Cluster::new("kgo", 83, 3, Registry::Kube, &vxlan(83));
    start_all(&mut c, HEALTHZ);
    for n in c.nodes() {
        for o in c.nodes().iter().filter(|o| o.index != n.index) {
            let key = o.lease_key(T);
            n.wait_log(&format!("lease added: {key}"), T);
        }
    }
    // Settled: the same over a second.
    let before: Vec<String> = wait_for("every node's datapath to settle", T, || {
        let a: Vec<String> = c.nodes().iter().map(datapath).collect();
        std::thread::sleep(Duration::from_secs(1));
        let b: Vec<String> = c.nodes().iter().map(datapath).collect();
        (a == b).then_some(b)
    });
    let pids: Vec<u32> = (1..=3).map(|i| c.flanneld_pid(i).unwrap()).collect();
    let cpu: Vec<Duration> = pids.iter().map(|&p| testkit::cpu_time(p)).collect();

    c.kube_mut().stop();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(60) {
        for n in c.nodes() {
            assert_eq!(http_code(n, "/healthz"), "200", "node {}", n.index);
        }
        std::thread::sleep(Duration::from_secs(10));
    }
    for (i, n) in c.nodes().iter().enumerate() {
        assert_eq!(
            datapath(n),
            before[i],
            "node {}'s datapath changed",
            n.index
        );
        let used = testkit::cpu_time(pids[i]) - cpu[i];
        assert!(
            used < Duration::from_secs(1),
            "node {}'s flanneld used {used:?} of CPU in the minute without an API server",
            n.index
        );
    }
    let log = c.node(1).log();
    let complaints = log.lines().filter(|l| l.contains("retrying")).count();
    assert!(
        complaints <= 3,
        "{complaints} log lines in a minute:\n{log}"
    );

    c.kube_mut().resume();
    c.kube().create_node(hand_annotated(
        "late",
        "10.83.60.0/24",
        "0e:00:00:00:00:60",
        "192.168.83.60",
    ));
    for n in c.nodes() {
        wait_for(
            &format!(
                "node {}'s entries for a node added after the outage",
                n.index
            ),
            T,
            || has_peer(n, "10.83.60.0/24", "0e:00:00:00:00:60", "192.168.83.60").then_some(()),
        );
    }
}

#[test]
fn a_410_costs_one_list_and_delivers_only_the_difference() {
    let mut c = Cluster::new("k41", 84, 3, Registry::Kube, &vxlan(84));
    start_all(&mut c, &[]);
    let key3 = c.node(3).lease_key(T);
    let subnet3 = key3.replacen('-', "/", 1);
    for n in [1, 2] {
        wait_for(&format!("node {n}'s route to node 3"), T, || {
            c.node(n).routes().contains(&subnet3).then_some(())
        });
    }
    let lists: Vec<usize> = [1, 2].iter().map(|&i| lists_by(&c, i)).collect();
    let added = c.kube().requests().len();

    // While the server is down, node 3 leaves and another joins; the server comes back
    // having forgotten the events of that time.
    c.stop_flanneld(3);
    c.kube_mut().stop();
    c.kube().delete_node("node3").unwrap();
    c.kube().create_node(hand_annotated(
        "joined",
        "10.84.70.0/24",
        "0e:00:00:00:00:70",
        "192.168.84.70",
    ));
    c.kube().compact();
    c.kube_mut().resume();

    for i in [1, 2] {
        let n = c.node(i);
        wait_for(&format!("node {i} to follow the difference"), T, || {
            (has_peer(n, "10.84.70.0/24", "0e:00:00:00:00:70", "192.168.84.70")
                && !n.routes().contains(&subnet3))
            .then_some(())
        });
        n.wait_log("lease removed", T);
    }
    for (k, i) in [1u8, 2].iter().enumerate() {
        assert_eq!(
            lists_by(&c, *i) - lists[k],
            1,
            "node {i} listed more than once: {:?}",
            &c.kube().requests()[added..]
        );
        // Only the difference: node 1 hears of no lease it already had.
        let log = c.node(*i).log();
        let other = if *i == 1 { 2 } else { 1 };
        let key = c.node(other).lease_key(T);
        assert_eq!(
            log.matches(&format!("lease added: {key}")).count(),
            1,
            "node {i} was told of node {other}'s lease again:\n{log}"
        );
    }
}

#[test]
fn without_the_right_to_patch_the_status_the_log_names_the_verb_and_the_resource() {
    let mut c = Cluster::new("k43", 85, 1, Registry::Kube, &vxlan(85));
    let token = c.node(1).kube_user().unwrap().token.clone();
    c.kube().forbid(&token, "patch", "nodes/status");
    c.start_flanneld(1, Path::new(FLANNELD), HEALTHZ);
    c.node(1).wait_log("patch nodes/status", T);
    let log = c.node(1).log();
    let line = log
        .lines()
        .find(|l| l.contains("patch nodes/status"))
        .unwrap();
    assert!(
        line.contains(r#"cannot patch resource "nodes/status" in API group """#),
        "{line}"
    );
    wait_for("/readyz to answer", T, || {
        (http_code(c.node(1), "/readyz") == "503").then_some(())
    });
    assert!(c.flanneld_running(1), "{log}");
    // Given the right, it goes on by itself.
    c.kube().allow(&token, "patch", "nodes/status");
    c.node(1).wait_subnet_env(T);
    wait_for("/readyz 200", T, || {
        (http_code(c.node(1), "/readyz") == "200").then_some(())
    });
}

#[test]
fn a_node_without_a_pod_cidr_waits_and_one_outside_the_network_is_refused() {
    let mut c = Cluster::new("kpc", 86, 2, Registry::Kube, &vxlan(86));
    c.kube().delete_node("node1").unwrap();
    c.create_kube_node(1, false);
    c.start_flanneld(1, Path::new(FLANNELD), HEALTHZ);
    c.node(1).wait_log(
        "has no podCIDR yet; waiting for the cluster to assign one (the controller manager's --allocate-node-cidrs)",
        T,
    );
    wait_for("/readyz to answer 503", T, || {
        (http_code(c.node(1), "/readyz") == "503").then_some(())
    });
    // Still asking, once a second, and saying so once however often it asks.
    let user = c.node(1).kube_user().expect("a kube user").name.clone();
    let gets = || {
        c.kube()
            .requests()
            .iter()
            .filter(|r| r.user == user && r.verb == "get" && r.path.ends_with("/nodes/node1"))
            .count()
    };
    let asked = gets();
    wait_for(
        "node 1's flanneld to ask for its Node three more times",
        T,
        || (gets() >= asked + 3).then_some(()),
    );
    let waits = c.node(1).log().matches("no podCIDR").count();
    assert_eq!(
        waits,
        1,
        "{waits} lines while waiting:\n{}",
        c.node(1).log()
    );
    c.assign_pod_cidrs(1);
    assert_eq!(c.node(1).lease_key(T), "10.86.1.0-24");
    wait_for("/readyz 200", T, || {
        (http_code(c.node(1), "/readyz") == "200").then_some(())
    });

    c.kube().delete_node("node2").unwrap();
    c.kube().create_node(json!({
        "metadata": {"name": "node2"}, "spec": {"podCIDR": "10.99.2.0/24"}
    }));
    c.start_flanneld(2, Path::new(FLANNELD), &[]);
    let code = wait_for("node 2's flanneld to exit", T, || c.flanneld_exit(2));
    assert_eq!(code, 2, "{}", c.node(2).log());
    let log = c.node(2).log();
    assert!(
        log.contains("10.99.2.0/24") && log.contains("10.86.0.0/16"),
        "{log}"
    );
}

#[test]
fn the_alloc_backend_neither_lists_nor_watches_the_nodes() {
    let alloc = r#"{"Network":"10.88.0.0/16","Backend":{"Type":"alloc"}}"#;
    let mut c = Cluster::new("kal", 88, 2, Registry::Kube, alloc);
    start_all(&mut c, HEALTHZ);
    for n in c.nodes() {
        wait_for(&format!("node {}'s /readyz 200", n.index), T, || {
            (http_code(n, "/readyz") == "200").then_some(())
        });
    }
    // Ready means the leases were listed, had they been: a node made now would be watched.
    c.kube().create_node(hand_annotated(
        "late",
        "10.88.60.0/24",
        "0e:00:00:00:00:60",
        "192.168.88.60",
    ));
    for n in c.nodes() {
        let user = n.kube_user().expect("a kube user").name.clone();
        wait_for(&format!("node {}'s annotations", n.index), T, || {
            flannel_annotations(&c, n.index)
                .iter()
                .any(|(k, v)| k == "backend-type" && v == "alloc")
                .then_some(())
        });
        let mine: Vec<_> = c
            .kube()
            .requests()
            .into_iter()
            .filter(|r| r.user == user)
            .collect();
        assert!(
            mine.iter().any(|r| r.verb == "get"
                && r.path
                    .ends_with(&format!("/nodes/{}", kube_node_name(n.index)))),
            "node {} never read its own Node: {mine:?}",
            n.index
        );
        let followed: Vec<_> = mine
            .iter()
            .filter(|r| r.path.ends_with("/nodes") && matches!(r.verb.as_str(), "list" | "watch"))
            .collect();
        assert!(
            followed.is_empty(),
            "node {} listed or watched the nodes with the alloc backend: {followed:?}",
            n.index
        );
        assert!(
            n.log()
                .contains("the other nodes are neither listed nor watched"),
            "{}",
            n.log()
        );
        assert!(!n.log().contains("lease added"), "{}", n.log());
    }
}

#[test]
fn this_node_deleted_ends_the_daemon_as_a_deleted_lease_does() {
    let mut c = Cluster::new("kdl", 87, 2, Registry::Kube, &vxlan(87));
    start_all(&mut c, &[]);
    c.kube().delete_node("node2").unwrap();
    let code = wait_for("node 2's flanneld to exit", T, || c.flanneld_exit(2));
    assert_eq!(code, 1, "{}", c.node(2).log());
    assert!(c.flanneld_running(1));
}

#[test]
fn without_node_name_the_node_is_the_one_its_pod_runs_on() {
    let mut c = Cluster::new("kpn", 88, 2, Registry::Kube, &vxlan(88));
    // As kube-flannel's DaemonSet gives them, NODE_NAME left out.
    for (i, pod) in [(1, "flanneld-7xk2p"), (2, "flanneld-q9d4m")] {
        c.set_flanneld_wrapper(i, &["env", "-u", "NODE_NAME"]);
        c.set_flanneld_env(i, "POD_NAME", pod);
        c.set_flanneld_env(i, "POD_NAMESPACE", "flannel-cni-rs");
    }
    c.kube()
        .add_pod("flannel-cni-rs", "flanneld-7xk2p", "node1");

    // Node 2's pod is not in the API yet: the daemon says which pod and ends.
    c.start_flanneld(2, Path::new(FLANNELD), &[]);
    let code = wait_for("node 2's flanneld to exit", T, || c.flanneld_exit(2));
    assert_eq!(code, 2, "{}", c.node(2).log());
    let log = c.node(2).log();
    assert!(
        log.contains(r#"get pods "flanneld-q9d4m""#) && log.contains("not found"),
        "{log}"
    );

    c.kube()
        .add_pod("flannel-cni-rs", "flanneld-q9d4m", "node2");
    start_all(&mut c, &[]);
    for n in c.nodes() {
        let i = n.index;
        n.wait_log(
            &format!("this node is \"node{i}\" in the Kubernetes API"),
            T,
        );
        let pod = if i == 1 {
            "flanneld-7xk2p"
        } else {
            "flanneld-q9d4m"
        };
        let user = n.kube_user().unwrap().name.clone();
        let gets: Vec<_> = c
            .kube()
            .requests()
            .into_iter()
            .filter(|r| r.user == user && r.verb == "get" && r.path.contains("/pods/"))
            .collect();
        assert!(
            gets.iter().any(|r| r.code == 200
                && r.path == format!("/api/v1/namespaces/flannel-cni-rs/pods/{pod}")),
            "node {i}: {gets:?}"
        );
        // The lease is that node's podCIDR, and its annotations are on that Node.
        let cidr = node_obj(&c, i)["spec"]["podCIDR"]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(n.lease_key(T), testkit::cluster::subnet_key(&cidr));
        assert!(
            flannel_annotations(&c, i).contains(&("public-ip".into(), n.ip.clone())),
            "node {i}: {:?}",
            flannel_annotations(&c, i)
        );
    }
    let mac1 = vxlan_mac(c.node(1));
    let subnet1 = node_obj(&c, 1)["spec"]["podCIDR"]
        .as_str()
        .unwrap()
        .to_string();
    let ip1 = c.node(1).ip.clone();
    wait_for("node 2's entries for node 1", T, || {
        has_peer(c.node(2), &subnet1, &mac1, &ip1).then_some(())
    });
}

#[test]
fn without_a_kubeconfig_the_daemon_uses_the_service_account_as_a_pod_does() {
    let mut c = Cluster::new("kic", 89, 2, Registry::Kube, &vxlan(89));
    // The service account's files, as the kubelet mounts them into the pod.
    let sa = c.node(1).dir.join("serviceaccount");
    assert!(
        !sa.starts_with("/var"),
        "{} would be hidden under the daemon's own /var",
        sa.display()
    );
    std::fs::create_dir_all(&sa).unwrap();
    std::fs::write(sa.join("token"), &c.node(1).kube_user().unwrap().token).unwrap();
    std::fs::copy(c.kube().ca_file(), sa.join("ca.crt")).unwrap();
    std::fs::write(sa.join("namespace"), "flannel-cni-rs").unwrap();
    // They appear at the path client-go reads only in the daemon's own mount namespace: its
    // /var is a tmpfs holding just that directory.
    c.set_flanneld_mounts(
        1,
        &format!(
            "mount -t tmpfs -o mode=755 flanneld-var /var\n\
             mkdir -p {dir}\n\
             mount --bind '{sa}' {dir}",
            dir = SERVICE_ACCOUNT,
            sa = sa.display()
        ),
    );
    c.set_flanneld_in_cluster(1);
    let api = c.kube().addr();
    c.set_flanneld_env(1, "KUBERNETES_SERVICE_HOST", &api.ip().to_string());
    c.set_flanneld_env(1, "KUBERNETES_SERVICE_PORT", &api.port().to_string());
    let host_had_it = Path::new(SERVICE_ACCOUNT).exists();

    start_all(&mut c, &[]);
    let args = c.flanneld_args(1);
    assert!(
        !args
            .iter()
            .any(|a| a == "--kubeconfig-file" || a == "--kube-api-url"),
        "node 1's flanneld has a way to the API server besides the in-cluster one: {args:?}"
    );
    c.node(1).wait_log(
        &format!("this node is \"node1\" in the Kubernetes API at https://{api}/"),
        T,
    );
    // Its requests carry the token from the file: the account the API server knows it by.
    let user = c.node(1).kube_user().unwrap().name.clone();
    wait_for(
        &format!("node 1's flanneld to get, list, watch and patch as {user}"),
        T,
        || {
            let verbs: Vec<String> = c
                .kube()
                .requests()
                .into_iter()
                .filter(|r| r.user == user && r.code < 300)
                .map(|r| r.verb)
                .collect();
            ["get", "list", "watch", "patch"]
                .iter()
                .all(|v| verbs.iter().any(|w| w == v))
                .then_some(())
        },
    );
    let cidr = node_obj(&c, 1)["spec"]["podCIDR"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(c.node(1).lease_key(T), testkit::cluster::subnet_key(&cidr));
    let mac1 = vxlan_mac(c.node(1));
    let want_data = format!(r#"{{"VNI":1,"VtepMAC":"{mac1}"}}"#);
    assert!(
        flannel_annotations(&c, 1).contains(&("backend-data".into(), want_data)),
        "{:?}",
        flannel_annotations(&c, 1)
    );
    let ip1 = c.node(1).ip.clone();
    wait_for("node 2's entries for node 1", T, || {
        has_peer(c.node(2), &cidr, &mac1, &ip1).then_some(())
    });
    assert_eq!(
        Path::new(SERVICE_ACCOUNT).exists(),
        host_had_it,
        "the service account's path changed outside the daemon's mount namespace"
    );
}

#[test]
fn a_users_node_public_ip_and_public_ip_overwrite_decide_where_peers_send() {
    let mut c = Cluster::new("kpi", 90, 3, Registry::Kube, &vxlan(90));
    // Node 2 is to be reached at a second address of its eth0 (node-public-ip, in place of
    // --public-ip); node 3 at a third one, which its overwrite names, whatever its
    // node-public-ip says: the overwrite is what flanneld writes as the public-ip.
    c.node(2)
        .ns
        .ip(&["addr", "add", "192.168.90.102/24", "dev", "eth0"]);
    for a in ["192.168.90.103/24", "192.168.90.203/24"] {
        c.node(3).ns.ip(&["addr", "add", a, "dev", "eth0"]);
    }
    let annotate = |node: &str, pairs: &[(&str, &str)]| {
        let ann: serde_json::Map<String, Value> = pairs
            .iter()
            .map(|(k, v)| (format!("{P}{k}"), Value::from(*v)))
            .collect();
        c.kube()
            .patch_node(node, false, &json!({"metadata": {"annotations": ann}}))
            .unwrap();
    };
    annotate("node2", &[("node-public-ip", "192.168.90.102")]);
    annotate(
        "node3",
        &[
            ("node-public-ip", "192.168.90.103"),
            ("public-ip-overwrite", "192.168.90.203"),
        ],
    );
    start_all(&mut c, &[]);

    for (i, ip) in [(2, "192.168.90.102"), (3, "192.168.90.103")] {
        c.node(i).wait_log(
            &format!("public address {ip} from annotation {P}node-public-ip"),
            T,
        );
    }
    assert!(
        !c.node(1).log().contains("from annotation"),
        "{}",
        c.node(1).log()
    );
    let announced = [
        (1, c.node(1).ip.clone()),
        (2, "192.168.90.102".to_string()),
        (3, "192.168.90.203".to_string()),
    ];
    for (i, ip) in &announced {
        let public = flannel_annotations(&c, *i)
            .into_iter()
            .find(|(k, _)| k == "public-ip")
            .map(|(_, v)| v);
        assert_eq!(public.as_deref(), Some(ip.as_str()), "node {i}'s public-ip");
    }
    // Every other node sends the node's traffic to the address it announced.
    for n in c.nodes() {
        for (i, ip) in announced.iter().filter(|(i, _)| *i != n.index) {
            let subnet = node_obj(&c, *i)["spec"]["podCIDR"]
                .as_str()
                .unwrap()
                .to_string();
            let mac = vxlan_mac(c.node(*i));
            wait_for(
                &format!(
                    "node {}'s route, neighbour and FDB entry to node {i} at {ip}",
                    n.index
                ),
                T,
                || has_peer(n, &subnet, &mac, ip).then_some(()),
            );
        }
    }
    for i in 1..=3 {
        c.add_pod(i);
    }
    c.wait_every_pod_reaches_every_other(&[Family::V4], T);
}

/// flanneld_registry_errors_total on node `node`'s /metrics.
fn registry_errors(node: &Node) -> u64 {
    let out = node
        .ns
        .try_run("curl", &["-s", "-m", "2", "http://127.0.0.1:8285/metrics"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("flanneld_registry_errors_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_failing_connection_is_logged_once_per_cause_in_the_daemons_words() {
    let mut c = Cluster::new("kca", 104, 1, Registry::Kube, &vxlan(104));
    // The node's kubeconfig names a CA that did not sign the server's certificate.
    let kubeconfig = c.node(1).kube_user().unwrap().kubeconfig.clone();
    let other = tempfile::tempdir().unwrap();
    let wrong = testkit::kube_api::make_certs(other.path(), "127.0.0.1".parse().unwrap());
    let text = std::fs::read_to_string(&kubeconfig).unwrap();
    let ca = c.kube().ca_file().display().to_string();
    assert!(text.contains(&ca), "{text}");
    std::fs::write(
        &kubeconfig,
        text.replace(&ca, &wrong.ca.display().to_string()),
    )
    .unwrap();
    c.start_flanneld(1, Path::new(FLANNELD), HEALTHZ);
    let n = c.node(1);
    wait_for("three failed requests", T, || {
        (registry_errors(n) >= 3).then_some(())
    });
    let unsigned = format!(
        "presents a certificate that is not signed by the CA in {}",
        wrong.ca.display()
    );
    // Once among the retries (the one read of the public address annotations at the start
    // says it too, as what it could not do).
    let retried = |log: &str, cause: &str| {
        log.lines()
            .filter(|l| l.contains(cause) && l.ends_with("; retrying"))
            .count()
    };
    let log = n.log();
    assert_eq!(retried(&log, &unsigned), 1, "{log}");

    // Another cause: the server gone.
    let before = registry_errors(n);
    c.kube_mut().stop();
    let n = c.node(1);
    wait_for("two more failed requests", T, || {
        (registry_errors(n) >= before + 2).then_some(())
    });
    let log = n.log();
    assert_eq!(retried(&log, &unsigned), 1, "{log}");
    assert_eq!(
        retried(&log, "connection refused at 192.168.104.254:6443"),
        1,
        "{log}"
    );
    // Only the daemon's own lines: no library's `client error (Connect)`.
    assert!(
        !log.contains("ERROR") && !log.contains("client error"),
        "{log}"
    );
}
