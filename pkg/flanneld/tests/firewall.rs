//! The firewall where operators got hurt by flanneld: a restart that must not disturb the
//! rules or the traffic, resyncs that must never rewrite rules that are right (also when other
//! tools add their own jumps beside ours), a node with IPv6 disabled. Each daemon runs with a
//! PATH whose rule tools log every call (`testkit::toolpath`), so that "writes nothing" is read
//! from what it ran, not from timing.

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;
use testkit::cluster::{wait_for, Cluster, Family, Node, Registry};
use testkit::toolpath::{writes_rules, ToolPath};

const FLANNELD: &str = env!("CARGO_BIN_EXE_flanneld");
const T: Duration = Duration::from_secs(60);

/// What an operator compares: `iptables -S` of nat and filter (both families) and the whole
/// nftables ruleset without its counters.
fn rules(node: &Node) -> String {
    let mut out = String::new();
    for tool in ["iptables", "ip6tables"] {
        for table in ["nat", "filter"] {
            out += &format!("== {tool} -S -t {table}\n");
            out += &node.ns.run(tool, &["-S", "-t", table]);
        }
    }
    out += "== nft -s list ruleset\n";
    out += &node.ns.run("nft", &["-s", "list", "ruleset"]);
    out
}

/// The number of times the daemon said it wrote its subnet.env: once per start.
fn starts(node: &Node) -> usize {
    node.log().matches("wrote ").count()
}

/// The calls among `calls` that write rules.
fn writes(calls: &[String]) -> Vec<&String> {
    calls.iter().filter(|c| writes_rules(c)).collect()
}

/// A ping from a pod every 10 ms, `count` of them; its summary when it ends.
struct Pinger {
    to: String,
    child: Child,
}

impl Pinger {
    fn start(c: &Cluster, pod: usize, to: &str, count: u32) -> Pinger {
        let child = c.pods()[pod]
            .ns
            .command("ping")
            .args([
                "-n",
                "-q",
                "-i",
                "0.01",
                "-W",
                "2",
                "-c",
                &count.to_string(),
                to,
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting ping in the pod");
        Pinger {
            to: to.to_string(),
            child,
        }
    }

    fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// (sent, answered) once it ends.
    fn finish(mut self) -> (u32, u32) {
        let to = self.to.clone();
        wait_for(&format!("the pings to {to} to end"), T, || {
            self.child.try_wait().ok().flatten()
        });
        let out = std::mem::replace(&mut self.child, spawn_true())
            .wait_with_output()
            .expect("reading ping's output");
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text
            .lines()
            .find(|l| l.contains("packets transmitted"))
            .unwrap_or_else(|| panic!("no summary from ping {to}: {text}"));
        let n = |word: &str| -> u32 {
            line.split(',')
                .find(|p| p.contains(word))
                .and_then(|p| p.split_whitespace().next()?.parse().ok())
                .unwrap_or_else(|| panic!("no {word:?} count in {line:?}"))
        };
        (n("transmitted"), n("received"))
    }
}

fn spawn_true() -> Child {
    std::process::Command::new("true")
        .stdout(Stdio::piped())
        .spawn()
        .expect("running true")
}

impl Drop for Pinger {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether a traced call is one of the daemon's checks of its IPv4 rules (iptables: the nat
/// table read; nftables: its table listed).
fn checks_rules(call: &str) -> bool {
    call.starts_with("iptables-save -t nat")
        || call.starts_with("nft -j list table ip flannel-ipv4")
}

/// The number of rule checks among `calls`.
fn checks(calls: &[String]) -> usize {
    calls.iter().filter(|c| checks_rules(c)).count()
}

/// A pod on node 1 pings the outside (through the masquerade) and a pod on node 2 every
/// 10 ms while node 1's flanneld is stopped with SIGTERM and started again: no reply may be
/// lost, the rules must read the same before, while stopped and after, and the new daemon must
/// write no rule (flannel-io/flannel#2237).
fn restart_case(prefix: &str, net: u8, network_config: &str, ours: &str) {
    let mut c = Cluster::new(prefix, net, 3, Registry::Embedded, network_config);
    let tools = ToolPath::traced();
    c.set_flanneld_env(1, "PATH", &tools.path());
    let args = ["--ip-masq", "--iptables-resync", "1"];
    for n in 1..=3 {
        c.start_flanneld(n, Path::new(FLANNELD), &args);
    }
    for n in 1..=3 {
        c.node(n).wait_subnet_env(T);
    }
    let a = c.add_pod(1);
    let b = c.add_pod(2);
    let outside = c.outside(Family::V4).expect("an IPv4 underlay");
    let pod_b = c.pods()[b].ip.clone();
    for to in [&outside, &pod_b] {
        wait_for(&format!("pod a to reach {to}"), T, || {
            c.pods()[a].ping(to, 1).then_some(())
        });
    }
    let first = tools.calls();
    assert!(
        !writes(&first).is_empty(),
        "the first start wrote its rules through the traced tools: {first:#?}"
    );
    let before = rules(c.node(1));
    assert!(before.contains(ours), "no {ours} in:\n{before}");

    // 2,000 pings at 10 ms: at least 20 s, longer than a restart takes on a loaded machine.
    let mut pings = [
        Pinger::start(&c, a, &outside, 2000),
        Pinger::start(&c, a, &pod_b, 2000),
    ];
    let started = starts(c.node(1));
    let status = c.terminate_flanneld(1, T);
    assert!(status.success(), "flanneld stopped by SIGTERM: {status}");
    let during = rules(c.node(1));
    let mark = tools.calls().len();
    c.start_flanneld(1, Path::new(FLANNELD), &args);
    wait_for("node 1's flanneld to finish its start", T, || {
        (starts(c.node(1)) > started).then_some(())
    });
    // The start's check and two resyncs after it: they too find everything right.
    wait_for("three rule checks by the restarted daemon", T, || {
        (checks(&tools.calls()[mark..]) >= 3).then_some(())
    });
    let after = rules(c.node(1));
    for p in pings.iter_mut() {
        assert!(
            p.running(),
            "the pings to {} ended before the restart was over: raise their count",
            p.to
        );
    }
    let since = tools.calls().split_off(mark);
    assert!(
        writes(&since).is_empty(),
        "the restarted daemon found its rules right and must write none, yet ran:\n{:#?}",
        writes(&since)
    );
    assert_eq!(
        during, before,
        "the rules changed while flanneld was stopped"
    );
    assert_eq!(after, before, "the rules changed across the restart");
    for p in pings {
        let to = p.to.clone();
        let (sent, answered) = p.finish();
        assert_eq!(sent, 2000, "pings to {to}");
        assert_eq!(
            answered, sent,
            "pings to {to} across the restart: {answered} of {sent} answered"
        );
    }
}

#[test]
fn a_restart_loses_no_reply_and_writes_no_rule() {
    restart_case(
        "ffr",
        111,
        r#"{"Network":"10.111.0.0/16","Backend":{"Type":"vxlan"}}"#,
        "FLANNEL-POSTRTG",
    );
}

#[test]
fn a_restart_with_nftables_loses_no_reply_and_writes_no_rule() {
    restart_case(
        "ffn",
        113,
        r#"{"Network":"10.113.0.0/16","Backend":{"Type":"vxlan"},"EnableNFTables":true}"#,
        "table ip flannel-ipv4",
    );
}

fn scrape(node: &Node) -> String {
    let out = node
        .ns
        .try_run("curl", &["-s", "http://127.0.0.1:9107/metrics"]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn restores(node: &Node) -> Option<f64> {
    let name = "flanneld_masquerade_restores_total ";
    scrape(node)
        .lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
}

/// Waits until the daemon has checked its rules `n` more times after call number `mark`: each
/// check reads the nat table.
fn wait_checks(tools: &ToolPath, mark: usize, n: usize) {
    wait_for(&format!("{n} resync checks"), T, || {
        (checks(&tools.calls()[mark..]) >= n).then_some(())
    });
}

#[test]
fn resyncs_never_rewrite_right_rules_beside_other_tools_jumps() {
    let mut c = Cluster::new(
        "ffs",
        112,
        1,
        Registry::Embedded,
        r#"{"Network":"10.112.0.0/16","Backend":{"Type":"vxlan"}}"#,
    );
    let tools = ToolPath::traced();
    c.set_flanneld_env(1, "PATH", &tools.path());
    let args = [
        "--ip-masq",
        "--iptables-resync",
        "1",
        "--healthz-ip",
        "127.0.0.1",
        "--healthz-port",
        "9107",
    ];
    c.start_flanneld(1, Path::new(FLANNELD), &args);
    c.node(1).wait_subnet_env(T);
    let node = c.node(1);
    wait_for("the metrics to answer", T, || restores(node));

    // Right rules, three resyncs: nothing written (flannel-io/flannel#1913).
    let log_mark = node.log().len();
    let mark = tools.calls().len();
    wait_checks(&tools, mark, 3);
    let since = tools.calls().split_off(mark);
    assert!(writes(&since).is_empty(), "{:#?}", writes(&since));

    // Another tool's jumps before and after ours (flannel-io/flannel#2145).
    for (table, hook) in [("nat", "POSTROUTING"), ("filter", "FORWARD")] {
        for chain in ["OTHER-BEFORE", "OTHER-AFTER"] {
            node.ns.run("iptables", &["-t", table, "-N", chain]);
            node.ns
                .run("iptables", &["-t", table, "-A", chain, "-j", "RETURN"]);
        }
        node.ns.run(
            "iptables",
            &["-t", table, "-I", hook, "1", "-j", "OTHER-BEFORE"],
        );
        node.ns
            .run("iptables", &["-t", table, "-A", hook, "-j", "OTHER-AFTER"]);
    }
    let before = rules(node);
    let mark = tools.calls().len();
    wait_checks(&tools, mark, 3);
    let since = tools.calls().split_off(mark);
    assert!(
        writes(&since).is_empty(),
        "other tools' jumps beside ours made flanneld write:\n{:#?}",
        writes(&since)
    );
    assert_eq!(rules(node), before);
    assert_eq!(restores(node), Some(0.0), "{}", scrape(node));
    let log = node.log();
    assert!(
        !log[log_mark..].contains("restor"),
        "a restore was logged after the start:\n{log}"
    );

    // The check is not blind: one of our rules deleted is restored, counted and logged.
    node.ns
        .run("iptables", &["-t", "nat", "-D", "FLANNEL-POSTRTG", "2"]);
    wait_for("the deleted rule to be restored", T, || {
        (restores(node) == Some(1.0)).then_some(())
    });
    wait_for("the rules as they were", T, || {
        (rules(node) == before).then_some(())
    });
    let log = node.log();
    assert!(log[log_mark..].contains("restoring"), "{log}");
}

/// Node `index` as a host whose IPv6 is off: disable_ipv6 on every interface (and on those to
/// come), and the IPv6 rule tools failing as they do where the kernel has no IPv6 (booted with
/// ipv6.disable=1), where `disable_ipv6` alone leaves them working.
fn ipv6_off(c: &mut Cluster, index: u8) -> ToolPath {
    for key in ["all", "default"] {
        c.node(index).ns.run(
            "sysctl",
            &["-qw", &format!("net.ipv6.conf.{key}.disable_ipv6=1")],
        );
    }
    let tools = ToolPath::traced();
    for tool in ["ip6tables", "ip6tables-save", "ip6tables-restore"] {
        tools.failing(
            tool,
            &format!(
                "{tool} v1.8.9 (legacy): can't initialize ip6tables table `nat': Address family \
                 not supported by protocol\nPerhaps ip6tables or your kernel needs to be upgraded."
            ),
            3,
        );
    }
    c.set_flanneld_env(index, "PATH", &tools.path());
    tools
}

#[test]
fn with_ipv6_off_an_ipv4_network_tries_no_ipv6_rule_and_logs_nothing_at_resyncs() {
    let mut c = Cluster::new(
        "ff6",
        114,
        2,
        Registry::Embedded,
        r#"{"Network":"10.114.0.0/16","Backend":{"Type":"vxlan"}}"#,
    );
    let tools = ipv6_off(&mut c, 1);
    let args = ["--ip-masq", "--iptables-resync", "1"];
    for n in 1..=2 {
        c.start_flanneld(n, Path::new(FLANNELD), &args);
    }
    for n in 1..=2 {
        c.node(n).wait_subnet_env(T);
    }
    let node = c.node(1);
    let log_mark = node.log().len();
    let mark = tools.calls().len();
    wait_checks(&tools, mark, 4);
    let calls = tools.calls();
    let ipv6: Vec<&String> = calls
        .iter()
        .filter(|c| c.starts_with("ip6tables") || (writes_rules(c) && c.contains("ip6")))
        .collect();
    assert!(ipv6.is_empty(), "IPv6 rules tried: {ipv6:#?}");
    let log = node.log();
    let complaints: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("ERROR"))
        .chain(log[log_mark..].lines().filter(|l| l.contains("WARN")))
        .collect();
    assert!(
        complaints.is_empty(),
        "logged at resyncs with IPv6 off:\n{}",
        complaints.join("\n")
    );
    assert!(
        rules(node).contains("FLANNEL-POSTRTG"),
        "the IPv4 rules are in place"
    );
    let a = c.add_pod(1);
    let b = c.add_pod(2);
    let unreachable = c.unreachable_pairs(2);
    assert!(
        unreachable.is_empty(),
        "pods a ({}) and b ({}): {}",
        c.pods()[a].ip,
        c.pods()[b].ip,
        c.describe_pairs(&unreachable)
    );
}

#[test]
fn with_ipv6_off_a_dual_stack_network_ends_the_start_naming_the_setting() {
    let mut c = Cluster::on(
        testkit::cluster::Underlay::Dual,
        "ff7",
        119,
        1,
        Registry::Embedded,
        r#"{"EnableIPv4":true,"Network":"10.119.0.0/16","EnableIPv6":true,"IPv6Network":"fc00:119::/48","Backend":{"Type":"vxlan"}}"#,
    );
    let tools = ipv6_off(&mut c, 1);
    c.start_flanneld(1, Path::new(FLANNELD), &["--ip-masq"]);
    let status = c.wait_flanneld_exit(1, T);
    let log = c.node(1).log();
    // A bad start, saying what to turn on or take out, rather than --public-ipv6 (which cannot
    // help a node without IPv6).
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(
        log.contains("interface eth0 has no IPv6 address: IPv6 is off on it (net.ipv6.conf.eth0.disable_ipv6 is 1")
            && !log.contains("--public-ipv6"),
        "{log}"
    );
    assert!(!c.node(1).subnet_file().exists(), "{log}");
    assert!(
        c.lease_keys().is_empty(),
        "a lease was taken: {:?}",
        c.lease_keys()
    );
    let _ = tools;
}

/// Programs whose names start with these are the iptables tools.
const IPTABLES_TOOLS: &[&str] = &["iptables", "ip6tables", "xtables"];

#[test]
fn without_iptables_the_daemon_uses_nftables_says_so_and_pods_reach_each_other() {
    let mut c = Cluster::new(
        "ffi",
        115,
        2,
        Registry::Embedded,
        r#"{"Network":"10.115.0.0/16","Backend":{"Type":"vxlan"}}"#,
    );
    let tools = ToolPath::new(IPTABLES_TOOLS, testkit::toolpath::RULE_TOOLS);
    for n in 1..=2 {
        c.set_flanneld_env(n, "PATH", &tools.path());
        c.start_flanneld(n, Path::new(FLANNELD), &["--ip-masq"]);
    }
    for n in 1..=2 {
        c.node(n).wait_subnet_env(T);
    }
    let node = c.node(1);
    let log = node.log();
    let said: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("using nftables"))
        .collect();
    assert_eq!(said.len(), 1, "one log line says so:\n{log}");
    assert!(said[0].contains("iptables"), "{}", said[0]);
    let table = node.ns.run("nft", &["list", "table", "ip", "flannel-ipv4"]);
    assert!(
        table.contains("chain postrtg") && table.contains("masquerade"),
        "{table}"
    );
    let nat = node.ns.run("iptables", &["-S", "-t", "nat"]);
    assert!(!nat.contains("FLANNEL"), "no iptables rule written:\n{nat}");
    assert!(
        tools.calls().iter().all(|c| c.starts_with("nft ")),
        "only nft ran: {:#?}",
        tools.calls()
    );
    // doctor says it too.
    let mut args = c.flanneld_args(1);
    args.insert(0, "doctor".to_string());
    args.push("--ip-masq".to_string());
    let out = node
        .ns
        .command(FLANNELD)
        .args(&args)
        .env("PATH", tools.path())
        .output()
        .expect("running flanneld doctor");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("using nftables"), "doctor:\n{text}");
    c.add_pod(1);
    c.add_pod(2);
    let unreachable = c.unreachable_pairs(2);
    assert!(unreachable.is_empty(), "{}", c.describe_pairs(&unreachable));
    c.serve_outside(9115);
    let seen = wait_for("pod on node 1 to reach the outside", T, || {
        c.seen_from_outside(0, Family::V4, 9115)
    });
    assert_eq!(seen.to_string(), c.node(1).ip, "masqueraded as its node");
}

/// Starts node 1's flanneld with `PATH` hiding `hidden`, and returns its exit code and log
/// once it has ended.
fn failed_start(prefix: &str, net: u8, config: &str, hidden: &[&str]) -> (Option<i32>, String) {
    let mut c = Cluster::new(prefix, net, 1, Registry::Embedded, config);
    let tools = ToolPath::new(hidden, &[]);
    c.set_flanneld_env(1, "PATH", &tools.path());
    c.start_flanneld(1, Path::new(FLANNELD), &["--ip-masq"]);
    let status = c.wait_flanneld_exit(1, T);
    (status.code(), c.node(1).log())
}

#[test]
fn without_any_rule_tool_ip_masq_fails_the_start_saying_what_is_missing() {
    let mut hidden = IPTABLES_TOOLS.to_vec();
    hidden.push("nft");
    let (code, log) = failed_start(
        "ffm",
        116,
        r#"{"Network":"10.116.0.0/16","Backend":{"Type":"vxlan"}}"#,
        &hidden,
    );
    assert_eq!(code, Some(2), "{log}");
    assert!(
        log.contains("neither iptables") && log.contains("nor nft is installed"),
        "{log}"
    );
}

#[test]
fn enable_nftables_without_nft_fails_the_start_saying_so() {
    let (code, log) = failed_start(
        "ffe",
        117,
        r#"{"Network":"10.117.0.0/16","Backend":{"Type":"vxlan"},"EnableNFTables":true}"#,
        &["nft"],
    );
    assert_eq!(code, Some(2), "{log}");
    assert!(
        log.contains("EnableNFTables is set") && log.contains("nft is not installed"),
        "{log}"
    );
}

#[test]
fn without_br_netfilter_the_daemon_warns_what_it_means_and_everything_works() {
    let mut c = Cluster::new(
        "ffb",
        118,
        2,
        Registry::Embedded,
        r#"{"Network":"10.118.0.0/16","Backend":{"Type":"vxlan"}}"#,
    );
    // Node 1's daemon sees an empty /proc/sys/net/bridge, as where br_netfilter is not loaded.
    // The limit of this staging: the tmpfs hides the module from the daemon only. The kernel's
    // br_netfilter, loaded or not on this machine (a test cannot unload it for itself alone),
    // still acts on the bridge's traffic, so what the pods' packets do here is not what they
    // do on a node without it; what is checked is the daemon's part: no crash, the warning,
    // its rules, and pods reaching each other across node 1's bridge and across nodes.
    c.set_flanneld_mounts(
        1,
        "if [ -d /proc/sys/net/bridge ]; then mount -t tmpfs none /proc/sys/net/bridge; fi",
    );
    for n in 1..=2 {
        c.start_flanneld(n, Path::new(FLANNELD), &["--ip-masq"]);
    }
    for n in 1..=2 {
        c.node(n).wait_subnet_env(T);
    }
    let log = c.node(1).log();
    let warned: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("br_netfilter"))
        .collect();
    assert_eq!(warned.len(), 1, "one warning:\n{log}");
    assert!(warned[0].contains("/proc/sys/net/bridge"), "{}", warned[0]);
    assert!(c.flanneld_running(1), "flanneld goes on:\n{log}");
    assert!(
        rules(c.node(1)).contains("FLANNEL-POSTRTG"),
        "the masquerade is in place"
    );
    // Two pods on node 1 (across its bridge), one on node 2.
    c.add_pod(1);
    c.add_pod(1);
    c.add_pod(2);
    let unreachable = c.unreachable_pairs(2);
    assert!(unreachable.is_empty(), "{}", c.describe_pairs(&unreachable));
    c.serve_outside(9118);
    let seen = wait_for("pod on node 1 to reach the outside", T, || {
        c.seen_from_outside(0, Family::V4, 9118)
    });
    assert_eq!(seen.to_string(), c.node(1).ip, "masqueraded as its node");
}
