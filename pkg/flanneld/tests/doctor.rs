//! `flanneld doctor` is a look: on a fresh node, with and without a lease in the registry, with
//! each backend that makes something of its own (vxlan its device, wireguard its device and its
//! private key), it says what is missing and leaves the kernel (links, addresses, routes,
//! rules, neighbours, FDB, nexthops, nft and iptables) and the files (the registry, the
//! subnet.env's directory, the key file's) exactly as they were.

mod common;

use common::*;
use std::fs;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

const KEY_B: &str = "HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw=";

/// A lease file of the embedded registry expiring `ttl` seconds from now (0: expired).
fn lease_file(reg: &Path, key: &str, public: &str, backend: &str, data: &str, ttl: u64) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let expiration = if ttl == 0 { now - 60 } else { now + ttl };
    let lease = format!(
        r#"{{"Expiration":{expiration},"Lease":{{"PublicIP":"{public}","BackendType":"{backend}","BackendData":{data}}}}}"#
    );
    let dir = reg.join("subnets");
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join(key), lease).unwrap();
}

/// `flanneld doctor` on the node, its files under the node's `run/` (not made yet); the exit
/// status and what it printed.
fn doctor(node: &Node, reg: &Path) -> (i32, String) {
    let run = node.path("run");
    let subnet_file = run.join("subnet.env");
    let args = [
        "doctor",
        "--registry-dir",
        reg.to_str().unwrap(),
        "--iface",
        "eth0",
        "--subnet-file",
        subnet_file.to_str().unwrap(),
        "--ip-masq",
        "--ip-blackhole-route",
    ];
    let out = node
        .ns
        .command(FLANNELD)
        .args(args)
        .env("WIREGUARD_KEY_FILE", run.join("wgkey"))
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn doctor_on_a_fresh_node_writes_nothing_anywhere() {
    for (backend, own_data, peer_data) in [
        (
            "vxlan",
            r#"{"VNI":1,"VtepMAC":"0a:58:0a:09:01:00"}"#,
            r#"{"VNI":1,"VtepMAC":"0a:58:0a:09:02:00"}"#,
        ),
        (
            "wireguard",
            r#"{"PublicKey":"XqxKzEJPdzuzUnT7OPf2VBoNSdpg4VBdQwAFKx7Wz2Q="}"#,
            &format!(r#"{{"PublicKey":"{KEY_B}"}}"#) as &str,
        ),
    ] {
        let node = Node::new("fdw");
        let reg = node.registry(&format!(
            r#"{{"Network":"10.9.0.0/16","Backend":{{"Type":"{backend}"}}}}"#
        ));
        // No lease yet: the look ends there, having made neither the registry's lease
        // directory nor the key.
        let (code, text) = writes_nothing(&node, node.dir.path(), "doctor", || doctor(&node, &reg));
        assert_eq!(code, 1, "{backend}: {text}");
        assert!(
            text.contains("no lease carries this node's address"),
            "{backend}: {text}"
        );

        // This node's lease, another node's, and an expired one that the look leaves to the
        // daemons: every plane plans, and each finds what is missing.
        lease_file(
            &reg,
            "10.9.1.0-24",
            "192.168.100.1",
            backend,
            own_data,
            3600,
        );
        lease_file(
            &reg,
            "10.9.2.0-24",
            "192.168.100.2",
            backend,
            peer_data,
            3600,
        );
        lease_file(&reg, "10.9.3.0-24", "192.168.100.3", backend, peer_data, 0);
        let (code, text) = writes_nothing(&node, node.dir.path(), "doctor", || doctor(&node, &reg));
        assert_eq!(code, 1, "{backend}: {text}");
        for want in [
            "device     missing",
            "blackhole  missing  blackhole 10.9.1.0/24",
            "masquerade wrong",
            "subnet.env",
        ] {
            assert!(text.contains(want), "{backend}: {want:?} not in\n{text}");
        }
        assert!(!node.path("run").exists(), "{backend}");
    }
}
