//! The iptables mode on hosts whose rules are in iptables-legacy or iptables-nft, as nodes
//! with Docker or kubelet leave them: flanneld writes its rules where the host's are (as
//! kubernetes-sigs/iptables-wrappers chooses), so that a FORWARD policy DROP there is passed
//! by its accept rules, says so at start, in `doctor` and on /metrics; `--iptables-mode`
//! overrides the choice and moves the rules.

use std::path::Path;
use std::time::Duration;
use testkit::cluster::{wait_for, Cluster, Node, Registry};

const FLANNELD: &str = env!("CARGO_BIN_EXE_flanneld");
const T: Duration = Duration::from_secs(60);

/// Docker's leftovers in iptables-legacy: FORWARD policy DROP, its chains and jump.
fn stage_docker_in_legacy(node: &Node) {
    for args in [
        &["-P", "FORWARD", "DROP"][..],
        &["-N", "DOCKER"],
        &["-N", "DOCKER-USER"],
        &["-A", "DOCKER-USER", "-j", "RETURN"],
        &["-A", "FORWARD", "-j", "DOCKER-USER"],
    ] {
        node.ns.run("iptables-legacy", args);
    }
}

/// kubelet's chains in `tool`'s mangle table, and a FORWARD policy DROP there.
fn stage_kubelet(node: &Node, tool: &str) {
    node.ns.run(tool, &["-P", "FORWARD", "DROP"]);
    for chain in ["KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY"] {
        node.ns.run(tool, &["-t", "mangle", "-N", chain]);
    }
}

/// nat and filter as `save` (iptables-legacy-save, iptables-nft-save) prints them.
fn saved(node: &Node, save: &str) -> String {
    ["nat", "filter"]
        .iter()
        .map(|t| node.ns.run(save, &["-t", t]))
        .collect()
}

/// Whether `text` holds our jumps from FORWARD and POSTROUTING.
fn has_our_rules(text: &str) -> bool {
    let jump = |from: &str, to: &str| {
        text.lines()
            .any(|l| l.starts_with(&format!("-A {from} ")) && l.ends_with(&format!("-j {to}")))
    };
    jump("FORWARD", "FLANNEL-FWD") && jump("POSTROUTING", "FLANNEL-POSTRTG")
}

fn has_any_of_ours(text: &str) -> bool {
    text.contains("FLANNEL")
}

fn scrape(node: &Node, port: u16) -> String {
    let out = node.ns.try_run(
        "curl",
        &["-s", "-m", "2", &format!("http://127.0.0.1:{port}/metrics")],
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn doctor(c: &Cluster, n: u8, extra: &[&str]) -> String {
    let out = c
        .node(n)
        .ns
        .command(FLANNELD)
        .arg("doctor")
        .args(c.flanneld_args(n))
        .args(extra)
        .output()
        .expect("running flanneld doctor");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn pods_cross_nodes_whose_rules_are_in_legacy_or_in_nft_and_ours_go_there() {
    let mut c = Cluster::new(
        "fxm",
        130,
        3,
        Registry::Embedded,
        r#"{"Network":"10.130.0.0/16","Backend":{"Type":"vxlan"}}"#,
    );
    stage_docker_in_legacy(c.node(1));
    stage_kubelet(c.node(2), "iptables-nft");
    stage_kubelet(c.node(3), "iptables-legacy");
    for n in 1..=3 {
        let port = format!("{}", 9130 + u16::from(n));
        c.start_flanneld(
            n,
            Path::new(FLANNELD),
            &["--ip-masq", "--healthz-port", &port],
        );
    }
    for n in 1..=3 {
        c.node(n).wait_subnet_env(T);
    }
    for n in 1..=3 {
        c.add_pod(n);
    }
    c.wait_every_pod_reaches_every_other(&[testkit::cluster::Family::V4], T);

    for (n, mode, reason) in [
        (1, "legacy", "iptables-legacy holds more"),
        (2, "nft", "KUBE-IPTABLES-HINT chain is in iptables-nft"),
        (
            3,
            "legacy",
            "KUBE-IPTABLES-HINT chain is in iptables-legacy",
        ),
    ] {
        let node = c.node(n);
        let (used, unused) = match mode {
            "legacy" => ("iptables-legacy-save", "iptables-nft-save"),
            _ => ("iptables-nft-save", "iptables-legacy-save"),
        };
        wait_for(&format!("node {n}'s rules in {used}"), T, || {
            has_our_rules(&saved(node, used)).then_some(())
        });
        let other = saved(node, unused);
        assert!(
            !has_any_of_ours(&other),
            "node {n}: none in {unused}:\n{other}"
        );
        let log = node.log();
        let line = log
            .lines()
            .find(|l| l.contains("iptables mode"))
            .unwrap_or_else(|| panic!("node {n} logs its iptables mode:\n{log}"));
        assert!(line.contains(&format!("iptables mode {mode}")), "{line}");
        assert!(line.contains(reason), "{line}");
        let metrics = scrape(node, 9130 + u16::from(n));
        assert!(
            metrics.contains(&format!(
                "flanneld_firewall_mode{{mode=\"iptables-{mode}\"}} 1"
            )),
            "node {n}:\n{metrics}"
        );
        let text = doctor(&c, n, &["--ip-masq"]);
        assert!(
            text.contains(&format!("iptables mode {mode}")),
            "doctor:\n{text}"
        );
    }
}

#[test]
fn iptables_mode_asked_for_moves_the_rules_there_and_back() {
    let mut c = Cluster::new(
        "fxo",
        131,
        1,
        Registry::Embedded,
        r#"{"Network":"10.131.0.0/16","Backend":{"Type":"vxlan"}}"#,
    );
    stage_docker_in_legacy(c.node(1));
    c.start_flanneld(1, Path::new(FLANNELD), &["--ip-masq"]);
    c.node(1).wait_subnet_env(T);
    wait_for("the rules in legacy", T, || {
        has_our_rules(&saved(c.node(1), "iptables-legacy-save")).then_some(())
    });
    // Asked for nft (the flag, or FLANNELD_IPTABLES_MODE): the rules move, none stay behind.
    c.set_flanneld_env(1, "FLANNELD_IPTABLES_MODE", "nft");
    c.start_flanneld(1, Path::new(FLANNELD), &["--ip-masq"]);
    wait_for("the rules moved to nft", T, || {
        let node = c.node(1);
        (has_our_rules(&saved(node, "iptables-nft-save"))
            && !has_any_of_ours(&saved(node, "iptables-legacy-save")))
        .then_some(())
    });
    let log = c.node(1).log();
    assert!(
        log.contains("iptables mode nft (iptables-restore): asked for"),
        "{log}"
    );
    assert!(
        log.contains("removed flannel's iptables chains from iptables-legacy"),
        "{log}"
    );
    // Back to the host's own: detected again (our own rules in nft never count), moved back.
    c.set_flanneld_env(1, "FLANNELD_IPTABLES_MODE", "auto");
    c.start_flanneld(1, Path::new(FLANNELD), &["--ip-masq"]);
    wait_for("the rules back in legacy", T, || {
        let node = c.node(1);
        (has_our_rules(&saved(node, "iptables-legacy-save"))
            && !has_any_of_ours(&saved(node, "iptables-nft-save")))
        .then_some(())
    });
    // A mode that is not there fails the start with status 2, naming the flag.
    let tools = testkit::toolpath::ToolPath::new(&["iptables-legacy", "ip6tables-legacy"], &[]);
    c.set_flanneld_env(1, "PATH", &tools.path());
    c.set_flanneld_env(1, "FLANNELD_IPTABLES_MODE", "legacy");
    c.start_flanneld(1, Path::new(FLANNELD), &["--ip-masq"]);
    let status = c.wait_flanneld_exit(1, T);
    assert_eq!(status.code(), Some(2), "{}", c.node(1).log());
    let log = c.node(1).log();
    assert!(
        log.contains("--iptables-mode: ")
            && log.contains("iptables-legacy-restore is not installed"),
        "{log}"
    );
}
