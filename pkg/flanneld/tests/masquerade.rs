//! `--ip-masq` end to end: three nodes on an underlay, pods through the real plugins, flanneld
//! with `--ip-masq` on each. A pod's connection to an address outside the cluster network leaves
//! with its node's address; a connection to a pod on another node keeps the pod's own.

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;
use testkit::cluster::{wait_for, Cluster, Registry};

const FLANNELD: &str = env!("CARGO_BIN_EXE_flanneld");
const T: Duration = Duration::from_secs(30);

/// A listener outside the cluster network that answers with the peer's address.
struct Outside(Child);

impl Drop for Outside {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_pod_reaches_outside_as_its_node_and_other_pods_as_itself() {
    let mut c = Cluster::new(
        "fmq",
        78,
        2,
        Registry::Embedded,
        r#"{"Network":"10.78.0.0/16","Backend":{"Type":"vxlan"}}"#,
    );
    for n in 1..=2 {
        c.start_flanneld(n, Path::new(FLANNELD), &["--ip-masq"]);
    }
    for n in 1..=2 {
        c.node(n).wait_subnet_env(T);
    }
    let a = c.add_pod(1);
    let b = c.add_pod(2);
    let _outside = Outside(
        c.underlay
            .command("socat")
            .args([
                "TCP4-LISTEN:9000,fork,reuseaddr",
                "SYSTEM:echo $SOCAT_PEERADDR",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("socat in the underlay"),
    );
    c.pod_mut(b).serve_tcp(9001, "$SOCAT_PEERADDR");
    let node1 = c.node(1).ip.clone();
    let (pod_a, pod_b) = (c.pods()[a].ip.clone(), c.pods()[b].ip.clone());
    let seen = wait_for("pod a to reach the outside listener", T, || {
        c.pods()[a].tcp_read("192.168.78.254", 9000)
    });
    assert_eq!(seen, node1, "the outside saw {seen}, not node 1's {node1}");
    let seen = wait_for("pod a to reach pod b on node 2", T, || {
        c.pods()[a].tcp_read(&pod_b, 9001)
    });
    assert_eq!(seen, pod_a, "pod b saw {seen}, not pod a's {pod_a}");
}
