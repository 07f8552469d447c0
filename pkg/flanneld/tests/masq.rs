//! `--ip-masq` against the real kernel, each test in its own namespace: the rules as flannel
//! writes them (read back with iptables/nft as an operator would), a second ensure that changes
//! nothing, a rule deleted by hand restored, the nftables mode, a switch between modes, a
//! previous subnet's rules removed, and a pod's traffic leaving with the node's address.

use cni_kernel::Netns;
use flanneld::masq::{self, MasqSpec};
use flanneld::planes::firewall::FirewallPlane;
use flanneld::reconcile::Reconciler;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};
use testkit::TestNs;

/// Runs `f` on this thread inside `ns`, so that the rule tools it starts work there.
fn inside<T>(ns: &TestNs, f: impl FnOnce() -> T) -> T {
    Netns::open(ns.path())
        .expect("opening the test namespace")
        .run(f)
        .expect("entering the test namespace")
}

fn spec(subnet: &str) -> MasqSpec {
    MasqSpec {
        ipv4: Some(("10.5.0.0/16".parse().unwrap(), subnet.parse().unwrap())),
        ipv6: Some((
            "fd00:5::/56".parse().unwrap(),
            "fd00:5:0:1::/64".parse().unwrap(),
        )),
        nftables: false,
        masq: true,
        random_fully: true,
        forward_rules: true,
    }
}

fn nft_spec() -> MasqSpec {
    MasqSpec {
        nftables: true,
        ..spec("10.5.1.0/24")
    }
}

/// What flannel's e2e suite reads: the jumps to our chain in `hook`, then `-S` of our chain.
fn chain_text(ns: &TestNs, tool: &str, table: &str, hook: &str, chain: &str) -> String {
    let hooks = ns.run(tool, &["-t", table, "-S", hook]);
    let ours = ns.run(tool, &["-t", table, "-S", chain]);
    hooks
        .lines()
        .filter(|l| l.contains("FLANNEL"))
        .chain(ours.lines())
        .collect::<Vec<_>>()
        .join("\n")
}

/// `iptables-save` and `ip6tables-save` of both tables, without their dated comments.
fn saved(ns: &TestNs) -> String {
    ["iptables-save", "ip6tables-save"]
        .iter()
        .map(|tool| ns.run(tool, &[]))
        .flat_map(|s| {
            s.lines()
                .filter(|l| !l.starts_with('#'))
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

const MASQ: &str = r#"-m comment --comment "flanneld masq""#;
const FWD: &str = r#"-m comment --comment "flanneld forward""#;

fn expected_postrtg(net: &str, subnet: &str, multicast: &str, masq: &str) -> String {
    [
        format!("-A POSTROUTING {MASQ} -j FLANNEL-POSTRTG"),
        "-N FLANNEL-POSTRTG".to_string(),
        format!("-A FLANNEL-POSTRTG -m mark --mark 0x4000/0x4000 {MASQ} -j RETURN"),
        format!("-A FLANNEL-POSTRTG -s {subnet} -d {net} {MASQ} -j RETURN"),
        format!("-A FLANNEL-POSTRTG -s {net} -d {subnet} {MASQ} -j RETURN"),
        format!("-A FLANNEL-POSTRTG ! -s {net} -d {subnet} {MASQ} -j RETURN"),
        format!("-A FLANNEL-POSTRTG -s {net} ! -d {multicast} {MASQ} -j {masq}"),
        format!("-A FLANNEL-POSTRTG ! -s {net} -d {net} {MASQ} -j {masq}"),
    ]
    .join("\n")
}

fn expected_forward(net: &str) -> String {
    [
        format!("-A FORWARD {FWD} -j FLANNEL-FWD"),
        "-N FLANNEL-FWD".to_string(),
        format!("-A FLANNEL-FWD -s {net} {FWD} -j ACCEPT"),
        format!("-A FLANNEL-FWD -d {net} {FWD} -j ACCEPT"),
    ]
    .join("\n")
}

#[test]
fn iptables_rules_are_flannels_text_for_both_families() {
    let ns = TestNs::new("mqi");
    assert!(inside(&ns, || masq::ensure(&spec("10.5.1.0/24"))).unwrap());
    let random = "MASQUERADE --random-fully";
    assert_eq!(
        chain_text(&ns, "iptables", "nat", "POSTROUTING", "FLANNEL-POSTRTG"),
        expected_postrtg("10.5.0.0/16", "10.5.1.0/24", "224.0.0.0/4", random)
    );
    assert_eq!(
        chain_text(&ns, "iptables", "filter", "FORWARD", "FLANNEL-FWD"),
        expected_forward("10.5.0.0/16")
    );
    assert_eq!(
        chain_text(&ns, "ip6tables", "nat", "POSTROUTING", "FLANNEL-POSTRTG"),
        expected_postrtg("fd00:5::/56", "fd00:5:0:1::/64", "ff00::/8", random)
    );
    assert_eq!(
        chain_text(&ns, "ip6tables", "filter", "FORWARD", "FLANNEL-FWD"),
        expected_forward("fd00:5::/56")
    );
}

#[test]
fn a_second_ensure_changes_nothing() {
    let ns = TestNs::new("mqr");
    let spec = spec("10.5.1.0/24");
    assert!(inside(&ns, || masq::ensure(&spec)).unwrap());
    let before = saved(&ns);
    assert!(!inside(&ns, || masq::ensure(&spec)).unwrap());
    assert_eq!(saved(&ns), before);
}

#[test]
fn rules_deleted_by_hand_are_restored_in_order() {
    let ns = TestNs::new("mqd");
    let spec = spec("10.5.1.0/24");
    inside(&ns, || masq::ensure(&spec)).unwrap();
    let before = saved(&ns);
    ns.run("iptables", &["-t", "nat", "-D", "FLANNEL-POSTRTG", "3"]);
    ns.run(
        "iptables",
        &[
            "-t",
            "nat",
            "-D",
            "POSTROUTING",
            "-m",
            "comment",
            "--comment",
            "flanneld masq",
            "-j",
            "FLANNEL-POSTRTG",
        ],
    );
    ns.run("ip6tables", &["-t", "filter", "-F", "FLANNEL-FWD"]);
    assert_ne!(saved(&ns), before);
    assert!(inside(&ns, || masq::ensure(&spec)).unwrap());
    assert_eq!(saved(&ns), before);
}

#[test]
fn a_rule_put_between_ours_is_put_out() {
    let ns = TestNs::new("mqx");
    let spec = spec("10.5.1.0/24");
    inside(&ns, || masq::ensure(&spec)).unwrap();
    let before = saved(&ns);
    ns.run(
        "iptables",
        &["-t", "nat", "-I", "FLANNEL-POSTRTG", "2", "-j", "ACCEPT"],
    );
    assert!(inside(&ns, || masq::ensure(&spec)).unwrap());
    assert_eq!(saved(&ns), before);
}

#[test]
fn without_random_fully_masquerade_has_no_option() {
    let ns = TestNs::new("mqp");
    let spec = MasqSpec {
        random_fully: false,
        forward_rules: false,
        ipv6: None,
        ..spec("10.5.1.0/24")
    };
    inside(&ns, || masq::ensure(&spec)).unwrap();
    assert_eq!(
        chain_text(&ns, "iptables", "nat", "POSTROUTING", "FLANNEL-POSTRTG"),
        expected_postrtg("10.5.0.0/16", "10.5.1.0/24", "224.0.0.0/4", "MASQUERADE")
    );
    let filter = ns.run("iptables", &["-t", "filter", "-S"]);
    assert!(
        !filter.contains("FLANNEL"),
        "no forward rules asked:\n{filter}"
    );
    assert!(!ns.run("ip6tables-save", &[]).contains("FLANNEL"));
}

fn expected_nft(ip: &str, table: &str, net: &str, subnet: &str, multicast: &str) -> String {
    [
        format!("table {ip} {table} {{"),
        "\tchain postrtg {".to_string(),
        "\t\tcomment \"chain to manage traffic masquerading by flannel\"".to_string(),
        "\t\ttype nat hook postrouting priority srcnat; policy accept;".to_string(),
        "\t\tmeta mark 0x00004000 return".to_string(),
        format!("\t\t{ip} saddr {subnet} {ip} daddr {net} return"),
        format!("\t\t{ip} saddr {net} {ip} daddr {subnet} return"),
        format!("\t\t{ip} saddr != {subnet} {ip} daddr {net} return"),
        format!("\t\t{ip} saddr {net} {ip} daddr != {multicast} masquerade fully-random"),
        format!("\t\t{ip} saddr != {net} {ip} daddr {net} masquerade fully-random"),
        "\t}".to_string(),
        "}".to_string(),
        format!("table {ip} {table} {{"),
        "\tchain forward {".to_string(),
        "\t\tcomment \"chain to accept flannel traffic\"".to_string(),
        "\t\ttype filter hook forward priority filter; policy accept;".to_string(),
        format!("\t\t{ip} saddr {net} accept"),
        format!("\t\t{ip} daddr {net} accept"),
        "\t}".to_string(),
        "}".to_string(),
    ]
    .join("\n")
}

/// `nft list chain` of both our chains in a family, as flannel's e2e suite reads them.
fn nft_chains(ns: &TestNs, ip: &str, table: &str) -> String {
    ["postrtg", "forward"]
        .iter()
        .map(|c| {
            ns.run("nft", &["list", "chain", ip, table, c])
                .trim_end()
                .to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn nftables_mode_writes_flannels_tables_once() {
    let ns = TestNs::new("mqn");
    let spec = nft_spec();
    assert!(inside(&ns, || masq::ensure(&spec)).unwrap());
    assert_eq!(
        nft_chains(&ns, "ip", "flannel-ipv4"),
        expected_nft(
            "ip",
            "flannel-ipv4",
            "10.5.0.0/16",
            "10.5.1.0/24",
            "224.0.0.0/4"
        )
    );
    assert_eq!(
        nft_chains(&ns, "ip6", "flannel-ipv6"),
        expected_nft(
            "ip6",
            "flannel-ipv6",
            "fd00:5::/56",
            "fd00:5:0:1::/64",
            "ff00::/8"
        )
    );
    let before = ns.run("nft", &["-a", "list", "ruleset"]);
    assert!(!inside(&ns, || masq::ensure(&spec)).unwrap());
    assert_eq!(
        ns.run("nft", &["-a", "list", "ruleset"]),
        before,
        "a second ensure rewrote rules (their handles changed)"
    );
    assert!(
        !ns.run("iptables-save", &[]).contains("FLANNEL"),
        "nftables mode wrote iptables rules"
    );
}

#[test]
fn an_nft_rule_deleted_by_hand_is_restored() {
    let ns = TestNs::new("mqm");
    let spec = nft_spec();
    inside(&ns, || masq::ensure(&spec)).unwrap();
    let before = nft_chains(&ns, "ip", "flannel-ipv4");
    let listing = ns.run(
        "nft",
        &["-a", "list", "chain", "ip", "flannel-ipv4", "postrtg"],
    );
    let handle = listing
        .lines()
        .find(|l| l.contains("daddr != 224.0.0.0/4"))
        .and_then(|l| l.rsplit("handle ").next())
        .expect("the masquerade rule's handle")
        .trim()
        .to_string();
    ns.run(
        "nft",
        &[
            "delete",
            "rule",
            "ip",
            "flannel-ipv4",
            "postrtg",
            "handle",
            &handle,
        ],
    );
    ns.run(
        "nft",
        &["delete", "chain", "ip6", "flannel-ipv6", "forward"],
    );
    ns.run(
        "nft",
        &["add chain ip flannel-ipv4 forward { type filter hook forward priority filter; policy drop; }"],
    );
    assert!(inside(&ns, || masq::ensure(&spec)).unwrap());
    assert_eq!(nft_chains(&ns, "ip", "flannel-ipv4"), before);
    assert!(ns
        .run("nft", &["list", "chain", "ip6", "flannel-ipv6", "forward"])
        .contains("ip6 daddr fd00:5::/56 accept"));
}

#[test]
fn switching_modes_removes_the_other_modes_rules() {
    let ns = TestNs::new("mqs");
    let ipt = spec("10.5.1.0/24");
    let nft = nft_spec();
    inside(&ns, || masq::ensure(&ipt)).unwrap();
    assert!(ns.run("iptables-save", &[]).contains("FLANNEL-POSTRTG"));

    assert!(inside(&ns, || masq::remove_other_mode(&nft)).unwrap());
    inside(&ns, || masq::ensure(&nft)).unwrap();
    for tool in ["iptables-save", "ip6tables-save"] {
        let s = ns.run(tool, &[]);
        assert!(!s.contains("FLANNEL"), "{tool} still shows ours:\n{s}");
    }
    assert!(ns.run("nft", &["list", "tables"]).contains("flannel-ipv4"));
    assert!(!inside(&ns, || masq::remove_other_mode(&nft)).unwrap());

    assert!(inside(&ns, || masq::remove_other_mode(&ipt)).unwrap());
    inside(&ns, || masq::ensure(&ipt)).unwrap();
    let tables = ns.run("nft", &["list", "tables"]);
    assert!(!tables.contains("flannel-ipv"), "{tables}");
    assert_eq!(
        chain_text(&ns, "iptables", "filter", "FORWARD", "FLANNEL-FWD"),
        expected_forward("10.5.0.0/16")
    );
}

#[test]
fn a_pass_writes_the_batches_its_one_read_planned_and_the_next_plan_is_empty() {
    let ns = TestNs::new("mqp");
    let old = spec("10.5.9.0/24");
    let new = spec("10.5.1.0/24");
    inside(&ns, || masq::ensure(&old)).unwrap();
    inside(&ns, || masq::ensure(&nft_spec())).unwrap();
    let rules = || format!("{}\n{}", saved(&ns), ns.run("nft", &["list", "ruleset"]));
    let before = rules();
    let first = || masq::plan(&new, Some((old.ipv4, None)));
    let pass = inside(&ns, first).unwrap();
    assert_eq!(rules(), before, "the plan wrote");
    // The other mode's tables, the previous subnet's rules, then the chain as it must be.
    let batches = pass.batches();
    let tools: Vec<&str> = batches.iter().map(|(tool, _)| *tool).collect();
    assert_eq!(tools, ["nft", "iptables-restore", "iptables-restore"]);
    assert!(batches[0].1.contains("delete table ip flannel-ipv4"));
    assert!(batches[1].1.contains("-D FLANNEL-POSTRTG -s 10.5.9.0/24"));
    assert!(batches[2].1.contains(":FLANNEL-POSTRTG - [0:0]"));
    let applied = inside(&ns, || pass.apply()).unwrap();
    assert_eq!(
        applied,
        masq::Applied {
            cleaned: true,
            restored: true
        }
    );
    assert!(!ns.run("nft", &["list", "tables"]).contains("flannel-ipv"));
    assert_eq!(
        chain_text(&ns, "iptables", "nat", "POSTROUTING", "FLANNEL-POSTRTG"),
        expected_postrtg(
            "10.5.0.0/16",
            "10.5.1.0/24",
            "224.0.0.0/4",
            "MASQUERADE --random-fully"
        )
    );
    assert!(inside(&ns, first).unwrap().is_empty());
}

#[test]
fn a_previous_subnets_rules_are_removed() {
    let ns = TestNs::new("mqo");
    let old = spec("10.5.9.0/24");
    let new = spec("10.5.1.0/24");
    inside(&ns, || masq::ensure(&old)).unwrap();
    assert!(inside(&ns, || masq::remove_stale(old.ipv4, None, &new)).unwrap());
    let nat = ns.run("iptables-save", &["-t", "nat"]);
    assert!(!nat.contains("10.5.9.0/24"), "{nat}");
    assert!(nat.contains(r#"-A POSTROUTING -m comment --comment "flanneld masq""#));
    inside(&ns, || masq::ensure(&new)).unwrap();
    assert_eq!(
        chain_text(&ns, "iptables", "nat", "POSTROUTING", "FLANNEL-POSTRTG"),
        expected_postrtg(
            "10.5.0.0/16",
            "10.5.1.0/24",
            "224.0.0.0/4",
            "MASQUERADE --random-fully"
        )
    );
    assert!(!inside(&ns, || masq::remove_stale(old.ipv4, None, &new)).unwrap());

    let old = MasqSpec {
        nftables: true,
        ..old
    };
    let new = MasqSpec {
        nftables: true,
        ..new
    };
    inside(&ns, || masq::ensure(&old)).unwrap();
    assert!(inside(&ns, || masq::remove_stale(old.ipv4, None, &new)).unwrap());
    let listed = ns.run("nft", &["list", "table", "ip", "flannel-ipv4"]);
    assert!(!listed.contains("10.5.9.0/24"), "{listed}");
}

/// Polls `f` every 50 ms until it holds, or panics after `timeout` naming what it waited for.
fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < timeout,
            "gave up after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_firewall_plane_restores_a_deleted_rule_at_its_next_resync() {
    let ns = TestNs::new("mqk");
    let spec = spec("10.5.1.0/24");
    inside(&ns, || masq::ensure(&spec)).unwrap();
    let before = saved(&ns);
    // A runtime made inside the namespace: the threads that run the rule tools start there.
    let rt = inside(&ns, || tokio::runtime::Runtime::new().unwrap());
    let plane = FirewallPlane::new(spec.clone(), Duration::from_millis(200), None);
    let (_tx, rx) = tokio::sync::mpsc::channel(1);
    let reconciler = rt.spawn(Reconciler::new(vec![Box::new(plane)]).run(rx));
    ns.run("iptables", &["-t", "nat", "-F", "FLANNEL-POSTRTG"]);
    wait_until(
        "the flushed chain to be restored",
        Duration::from_secs(5),
        || saved(&ns) == before,
    );
    reconciler.abort();
}

/// A process stopped when the test ends, also when it fails.
struct Stopped(Child);

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A TCP listener in `ns` that answers each connection with the address it came from.
fn peer_printer(ns: &TestNs, addr: &str) -> Stopped {
    let child = ns
        .command("socat")
        .args([
            &format!("TCP-LISTEN:8080,bind={addr},reuseaddr,fork"),
            "SYSTEM:echo $SOCAT_PEERADDR",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting socat");
    Stopped(child)
}

/// Connects from `ns` to `addr`:8080 and returns the address the listener saw.
fn seen_from(ns: &TestNs, addr: &str) -> String {
    let target = format!("TCP:{addr}:8080,connect-timeout=2");
    let mut seen = String::new();
    wait_until(
        &format!("an answer from {addr}:8080"),
        Duration::from_secs(5),
        || {
            let out = ns.try_run("socat", &["-T2", "-u", &target, "-"]);
            seen = String::from_utf8_lossy(&out.stdout).trim().to_string();
            out.status.success() && !seen.is_empty()
        },
    );
    seen
}

/// One veth between two namespaces with an address on each end.
fn wire(a: &TestNs, a_addr: &str, b: &TestNs, b_addr: &str, name: &str) {
    let peer = format!("{name}p");
    a.ip(&[
        "link",
        "add",
        name,
        "type",
        "veth",
        "peer",
        "name",
        &peer,
        "netns",
        b.name(),
    ]);
    a.ip(&["addr", "add", a_addr, "dev", name]);
    a.ip(&["link", "set", name, "up"]);
    b.ip(&["addr", "add", b_addr, "dev", &peer]);
    b.ip(&["link", "set", &peer, "up"]);
}

#[test]
fn a_pod_leaves_the_network_with_the_nodes_address_and_reaches_pods_with_its_own() {
    let node = TestNs::new("mqen");
    let pod = TestNs::new("mqep");
    let remote_pod = TestNs::new("mqer");
    let outside = TestNs::new("mqeo");
    wire(&node, "10.5.1.1/24", &pod, "10.5.1.2/24", "cni0");
    wire(&node, "10.5.2.1/24", &remote_pod, "10.5.2.2/24", "peer0");
    wire(
        &node,
        "192.168.200.1/24",
        &outside,
        "192.168.200.2/24",
        "eth0",
    );
    pod.ip(&["route", "add", "default", "via", "10.5.1.1"]);
    remote_pod.ip(&["route", "add", "default", "via", "10.5.2.1"]);
    node.run("sysctl", &["-w", "net.ipv4.ip_forward=1"]);
    let spec = MasqSpec {
        ipv6: None,
        ..spec("10.5.1.0/24")
    };
    inside(&node, || masq::ensure(&spec)).unwrap();

    let _out = peer_printer(&outside, "192.168.200.2");
    let _remote = peer_printer(&remote_pod, "10.5.2.2");
    let outside_saw = seen_from(&pod, "192.168.200.2");
    let remote_saw = seen_from(&pod, "10.5.2.2");
    assert_eq!(
        outside_saw, "192.168.200.1",
        "leaving the network: the node's address"
    );
    assert_eq!(remote_saw, "10.5.1.2", "pod to pod: the pod's own address");
}
