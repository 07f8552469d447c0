//! The external interface on real hosts: made again under a running daemon with a new index
//! (a VLAN or bond taken down and up, a NIC driver reloaded), and IPv6 addresses that must not
//! be announced (privacy addresses that change, deprecated ones).

use std::path::Path;
use std::time::Duration;
use testkit::cluster::{wait_for, Cluster, Family, Registry, Underlay};

const FLANNELD: &str = env!("CARGO_BIN_EXE_flanneld");
const T: Duration = Duration::from_secs(60);

fn link_index(c: &Cluster, n: u8, name: &str) -> u64 {
    c.node(n)
        .ns
        .link(name)
        .unwrap_or_else(|| panic!("node {n} has no {name}"))["ifindex"]
        .as_u64()
        .unwrap_or_default()
}

/// eth0 of node 1 deleted and made again: the kernel deletes the devices on top of it and the
/// routes through it; the daemon follows the new index and pods talk again, no restart.
fn remade_case(prefix: &str, net: u8, backend: &str) {
    let config = format!(r#"{{"Network":"10.{net}.0.0/16","Backend":{{"Type":"{backend}"}}}}"#);
    let mut c = Cluster::new(prefix, net, 2, Registry::Embedded, &config);
    c.start_flanneld_everywhere(Path::new(FLANNELD), T);
    let (a, b) = (c.add_pod(1), c.add_pod(2));
    let ip_b = c.pods()[b].ip.clone();
    let ip_a = c.pods()[a].ip.clone();
    wait_for("pod a to reach pod b", T, || {
        c.pods()[a].ping(&ip_b, 1).then_some(())
    });
    let pid = c.flanneld_pid(1);
    let before = link_index(&c, 1, "eth0");
    c.remake_eth0(1);
    assert_ne!(link_index(&c, 1, "eth0"), before, "eth0 has a new index");
    wait_for(
        &format!("{backend}: pods to talk again over the new eth0"),
        T,
        || (c.pods()[a].ping(&ip_b, 1) && c.pods()[b].ping(&ip_a, 1)).then_some(()),
    );
    assert!(c.flanneld_running(1), "{}", c.node(1).log());
    assert_eq!(c.flanneld_pid(1), pid, "the same daemon");
    let log = c.node(1).log();
    assert!(
        log.contains("external interface eth0 is back with index"),
        "{log}"
    );
    assert!(!log.contains("no longer holds"), "{log}");
}

#[test]
fn vxlan_follows_an_external_interface_made_again() {
    remade_case("fir", 132, "vxlan");
}

#[test]
fn host_gw_follows_an_external_interface_made_again() {
    remade_case("fig", 133, "host-gw");
}

#[test]
fn a_privacy_and_a_deprecated_ipv6_address_are_never_announced() {
    let mut c = Cluster::on(
        Underlay::V6,
        "fi6",
        134,
        2,
        Registry::Embedded,
        r#"{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd34::/48","Backend":{"Type":"vxlan"}}"#,
    );
    // As SLAAC leaves a host: the stable address with a lifetime, managing a privacy address
    // beside it (use_tempaddr), and a deprecated one; the kernel lists the newest first.
    let node = c.node(1);
    let stable = node.ip6.clone().expect("an IPv6 underlay address");
    node.ns
        .run("sysctl", &["-qw", "net.ipv6.conf.eth0.use_tempaddr=2"]);
    let lifetimes = |preferred| ["valid_lft", "3600", "preferred_lft", preferred];
    let mut change = vec!["-6", "addr", "change"];
    let stable_net = format!("{stable}/64");
    change.extend([stable_net.as_str(), "dev", "eth0", "nodad", "mngtmpaddr"]);
    change.extend(lifetimes("3600"));
    node.ns.ip(&change);
    let mut add = vec![
        "-6",
        "addr",
        "add",
        "fd00:134::de/64",
        "dev",
        "eth0",
        "nodad",
    ];
    add.extend(lifetimes("0"));
    node.ns.ip(&add);
    let shown = node.ns.ip(&["-6", "addr", "show", "dev", "eth0"]);
    assert!(
        shown.contains("temporary"),
        "a privacy address was made:\n{shown}"
    );
    assert!(shown.contains("deprecated"), "{shown}");
    c.start_flanneld_everywhere(Path::new(FLANNELD), T);
    let log = c.node(1).log();
    let line = log
        .lines()
        .find(|l| l.contains("external interface eth0"))
        .unwrap_or_else(|| panic!("the interface is said:\n{log}"));
    assert!(
        line.ends_with(&format!("public address {stable}")),
        "{line}"
    );
    c.add_pod(1);
    c.add_pod(2);
    c.wait_every_pod_reaches_every_other(&[Family::V6], T);
}
