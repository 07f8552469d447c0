//! The vxlan device's tx checksum offload (flannel-io/flannel#2152, kubernetes#88986): `doctor`
//! says its state, and `Backend.TxChecksumOffload: false` keeps it off, also when it is turned
//! on by hand or the device is made again.

use std::path::Path;
use std::time::Duration;
use testkit::cluster::{wait_for, Cluster, Registry};
use testkit::{runs_here, Need};

const FLANNELD: &str = env!("CARGO_BIN_EXE_flanneld");
const T: Duration = Duration::from_secs(60);

/// `tx-checksum-ip-generic` as `ethtool -k flannel.1` shows it on node `n`.
fn offload(c: &Cluster, n: u8) -> String {
    let shown = c.node(n).ns.run("ethtool", &["-k", "flannel.1"]);
    shown
        .lines()
        .find_map(|l| l.trim().strip_prefix("tx-checksum-ip-generic: "))
        .unwrap_or_else(|| panic!("no tx-checksum-ip-generic in:\n{shown}"))
        .to_string()
}

fn doctor(c: &Cluster, n: u8) -> String {
    let out = c
        .node(n)
        .ns
        .command(FLANNELD)
        .arg("doctor")
        .args(c.flanneld_args(n))
        .output()
        .expect("running flanneld doctor");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn has_ethtool() -> bool {
    runs_here(
        cni_kernel::firewall::has_tool("ethtool"),
        Need::Installed("ethtool (scripts/deps.sh)"),
    )
}

#[test]
fn tx_checksum_offload_off_stays_off_and_doctor_says_it() {
    if !has_ethtool() {
        return;
    }
    let mut c = Cluster::new(
        "fxc",
        136,
        2,
        Registry::Embedded,
        r#"{"Network":"10.136.0.0/16","Backend":{"Type":"vxlan","TxChecksumOffload":false}}"#,
    );
    c.start_flanneld_everywhere(Path::new(FLANNELD), T);
    for n in 1..=2 {
        assert_eq!(offload(&c, n), "off", "node {n}");
    }
    c.add_pod(1);
    c.add_pod(2);
    let unreachable = c.unreachable_pairs(2);
    assert!(unreachable.is_empty(), "{}", c.describe_pairs(&unreachable));
    let text = doctor(&c, 1);
    assert!(text.contains("tx checksum offload off"), "doctor:\n{text}");
    // Turned on by hand: off again.
    c.node(1)
        .ns
        .run("ethtool", &["-K", "flannel.1", "tx", "on"]);
    wait_for("the offload off again", T, || {
        (offload(&c, 1) == "off").then_some(())
    });
    // The device deleted: made again, off from the start.
    c.node(1).ns.ip(&["link", "del", "flannel.1"]);
    wait_for("flannel.1 made again with the offload off", T, || {
        c.node(1)
            .ns
            .link("flannel.1")
            .and_then(|_| (offload(&c, 1) == "off").then_some(()))
    });
    let unreachable = c.unreachable_pairs(5);
    assert!(unreachable.is_empty(), "{}", c.describe_pairs(&unreachable));
    let log = c.node(1).log();
    assert!(
        log.contains("tx checksum offload turned off (Backend.TxChecksumOffload)"),
        "{log}"
    );
}

#[test]
fn by_default_the_offload_is_the_kernels_and_doctor_says_it() {
    if !has_ethtool() {
        return;
    }
    let mut c = Cluster::new(
        "fxd",
        137,
        1,
        Registry::Embedded,
        r#"{"Network":"10.137.0.0/16","Backend":{"Type":"vxlan"}}"#,
    );
    c.start_flanneld_everywhere(Path::new(FLANNELD), T);
    assert_eq!(offload(&c, 1), "on");
    let text = doctor(&c, 1);
    assert!(text.contains("tx checksum offload on"), "doctor:\n{text}");
    // Turned off by hand (Go's documented udev rule): left as the operator set it.
    c.node(1)
        .ns
        .run("ethtool", &["-K", "flannel.1", "tx", "off"]);
    assert!(!doctor(&c, 1).contains("wrong"), "{}", doctor(&c, 1));
}
