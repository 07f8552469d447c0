//! The datapath between two nodes on one link, each a namespace running flanneld over a shared
//! registry directory: what the kernel holds for the other node, traffic across it, and the
//! reconciler putting back what is taken away. Routes go through nexthop objects (the kernel
//! here has them); the tests that matter run once more with plain routes
//! (`FLANNELD_NEXTHOPS=false`), the daemon's fallback.

mod common;

use common::*;
use std::fs;
use std::time::Duration;

/// A ceiling for waits, repairs included: a repair comes on the kernel's announcement in
/// milliseconds on a quiet machine, or at the latest with the periodic pass; how soon is the
/// benchmarks' to say, not a test's.
const T: Duration = Duration::from_secs(30);

/// How the daemons under test program routes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Style {
    Nexthop,
    Plain,
}

impl Style {
    fn env(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Style::Nexthop => &[],
            Style::Plain => &[("FLANNELD_NEXTHOPS", "false")],
        }
    }
}

struct Pair {
    a: Node,
    b: Node,
    da: Daemon,
    db: Daemon,
    style: Style,
    /// The subnets' network addresses (the vxlan devices' addresses).
    net_a: String,
    net_b: String,
    sub_b: String,
}

/// The id of the nexthop of the path to `subnet` (`10.9.3.0/24`, `fc00:0:0:3::/64`) of the
/// networks these tests use, 10.9.0.0/16 and fc00::/48: 4,000,000,000 (IPv6 4,100,000,000)
/// plus the subnet's number in its network.
fn nexthop_id(subnet: &str) -> u64 {
    let addr = subnet.split('/').next().unwrap_or_default();
    if addr.contains(':') {
        let third = addr.split(':').nth(3).unwrap_or_default();
        4_100_000_000 + u64::from_str_radix(third, 16).unwrap_or(0)
    } else {
        let third = addr.split('.').nth(2).unwrap_or_default();
        4_000_000_000 + third.parse::<u64>().unwrap_or(0)
    }
}

impl Pair {
    /// a's route to b's subnet via `gw` on `dev` as `ip route show` prints it in the pair's
    /// style (through a nexthop, `ip` shows the nexthop's gateway and device after its id).
    fn route_to(&self, subnet: &str, gw: &str, dev: &str) -> String {
        let onlink = if dev.starts_with("flannel") && !subnet.contains(':') {
            " onlink"
        } else {
            ""
        };
        match self.style {
            Style::Plain => format!("{subnet} via {gw} dev {dev}{onlink}"),
            Style::Nexthop => format!(
                "{subnet} nhid {} via {gw} dev {dev}{onlink}",
                nexthop_id(subnet)
            ),
        }
    }

    /// a's vxlan route to b.
    fn route_b(&self) -> String {
        self.route_to(&self.sub_b, &self.net_b, "flannel.1")
    }

    /// a's vxlan route to b as `flanneld doctor` shows it.
    fn doctor_route_b(&self) -> String {
        match self.style {
            Style::Plain => format!("{} via {} dev flannel.1 onlink", self.sub_b, self.net_b),
            Style::Nexthop => format!("{} nhid {}", self.sub_b, nexthop_id(&self.sub_b)),
        }
    }
}

fn start(node: &Node, reg: &str, name: &str) -> Daemon {
    start_in(Style::Nexthop, node, reg, name)
}

fn start_in(style: Style, node: &Node, reg: &str, name: &str) -> Daemon {
    Daemon::start(
        node,
        name,
        &[
            "--registry-dir",
            reg,
            "--iface",
            "eth0",
            "--ip-masq",
            "--iptables-resync",
            "1",
            "--healthz-ip",
            "127.0.0.1",
            "--healthz-port",
            "9106",
        ],
        style.env(),
    )
}

fn network_address(subnet: &str) -> String {
    key_of(subnet)
        .split('-')
        .next()
        .unwrap_or_default()
        .to_string()
}

fn pair(prefix: &str, backend: &str) -> Pair {
    pair_with(prefix, backend, "", |_| {})
}

fn pair_in(style: Style, prefix: &str, backend: &str) -> Pair {
    pair_styled(style, prefix, backend, "", |_| {})
}

/// A pair with `extra` network config keys, and `before` run on node a before its daemon starts.
fn pair_with(prefix: &str, backend: &str, extra: &str, before: impl FnOnce(&Node)) -> Pair {
    pair_styled(Style::Nexthop, prefix, backend, extra, before)
}

fn pair_styled(
    style: Style,
    prefix: &str,
    backend: &str,
    extra: &str,
    before: impl FnOnce(&Node),
) -> Pair {
    let (a, b) = Node::pair(prefix);
    let reg = a.registry(&format!(
        r#"{{"Network":"10.9.0.0/16","Backend":{backend}{extra}}}"#
    ));
    before(&a);
    let reg = reg.display().to_string();
    let da = start_in(style, &a, &reg, "a");
    let db = start_in(style, &b, &reg, "b");
    let (sa, sb) = (da.subnet(T), db.subnet(T));
    Pair {
        style,
        net_a: network_address(&sa),
        net_b: network_address(&sb),
        sub_b: key_of(&sb).replace('-', "/"),
        a,
        b,
        da,
        db,
    }
}

fn has(node: &Node, args: &[&str], needle: &str) -> bool {
    node.ns.run(args[0], &args[1..]).contains(needle)
}

fn wait_has(node: &Node, args: &[&str], needle: &str, timeout: Duration) {
    wait_for(
        &format!("{needle:?} in `{}` of {}", args.join(" "), node.ns.name()),
        timeout,
        || has(node, args, needle).then_some(()),
    );
}

/// Pings from `from` to `to` in `node` every 20 ms while `event` runs: replies before it
/// began and after it ended, and none missing between.
fn no_reply_lost_across(node: &Node, from: &str, to: &str, event: impl FnOnce()) {
    let mut cmd = node.ns.command("ping");
    cmd.args(["-i", "0.02", "-W", "1", "-I", from, to]);
    let failed = testkit::pings::across(
        vec![testkit::pings::Pinger::start(
            &format!("{from} to {to}"),
            cmd,
        )],
        T,
        event,
    );
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

fn ping(node: &Node, from: &str, to: &str) -> bool {
    node.ns
        .try_run("busybox", &["ping", "-c", "1", "-W", "1", "-I", from, to])
        .status
        .success()
}

/// Deletes the FDB entry on `node`'s flannel.1 towards `dst` by hand; returns its MAC.
fn delete_fdb_to(node: &Node, dst: &str) -> String {
    let fdb = node.ns.run("bridge", &["fdb", "show", "dev", "flannel.1"]);
    let mac = fdb
        .lines()
        .find(|l| l.contains(&format!("dst {dst}")))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no FDB entry to {dst} in\n{fdb}"))
        .to_string();
    node.ns.run(
        "bridge",
        &["fdb", "del", &mac, "dev", "flannel.1", "dst", dst],
    );
    mac
}

/// Our rules as iptables-save prints them (without its comments and counters).
fn firewall(node: &Node) -> String {
    ["nat", "filter"]
        .iter()
        .map(|t| node.ns.run("iptables-save", &["-t", t]))
        .flat_map(|t| {
            t.lines()
                .filter(|l| l.contains("FLANNEL"))
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The kernel state a restart must not change.
fn snapshot(node: &Node) -> String {
    [
        node.ns.run("ip", &["route", "show"]),
        node.ns.run("ip", &["nexthop", "show"]),
        node.ns.run("ip", &["neigh", "show", "dev", "flannel.1"]),
        node.ns.run("bridge", &["fdb", "show", "dev", "flannel.1"]),
        node.ns.run("ip", &["-d", "link", "show", "flannel.1"]),
        node.ns.run("ip", &["-4", "addr", "show", "flannel.1"]),
        firewall(node),
    ]
    .join("\n")
}

#[test]
fn vxlan_programs_each_peer_and_carries_traffic() {
    vxlan_programs_each_peer_and_carries_traffic_in(Style::Nexthop);
}

#[test]
fn vxlan_programs_each_peer_and_carries_traffic_with_plain_routes() {
    vxlan_programs_each_peer_and_carries_traffic_in(Style::Plain);
}

fn vxlan_programs_each_peer_and_carries_traffic_in(style: Style) {
    let p = pair_in(style, "fva", r#"{"Type":"vxlan"}"#);
    let env = fs::read_to_string(&p.da.subnet_file).unwrap();
    assert!(env.contains("FLANNEL_MTU=1450\n"), "{env}");
    let dev = p.a.ns.run("ip", &["-d", "link", "show", "flannel.1"]);
    for want in [
        "mtu 1450",
        "vxlan id 1",
        "local 192.168.100.1",
        "dev eth0",
        "dstport 8472",
        "nolearning",
    ] {
        assert!(dev.contains(want), "{want} not in {dev}");
    }
    assert!(has(
        &p.a,
        &["ip", "addr", "show", "flannel.1"],
        &format!("inet {}/32", p.net_a)
    ));
    // The lease announces the device's MAC.
    let mac =
        p.b.ns
            .link("flannel.1")
            .and_then(|l| l["address"].as_str().map(str::to_string));
    let lease_file =
        p.a.path(&format!("registry/subnets/{}", p.sub_b.replace('/', "-")));
    let lease = fs::read_to_string(lease_file).unwrap();
    let announced = format!(
        r#""BackendType":"vxlan","BackendData":{{"VNI":1,"VtepMAC":"{}"}}"#,
        mac.unwrap_or_default()
    );
    assert!(lease.contains(&announced), "{lease}");
    wait_has(&p.a, &["ip", "route", "show"], &p.route_b(), T);
    wait_has(
        &p.a,
        &["ip", "neigh", "show", "dev", "flannel.1"],
        &format!("{} lladdr", p.net_b),
        T,
    );
    wait_has(
        &p.a,
        &["bridge", "fdb", "show", "dev", "flannel.1"],
        "dst 192.168.100.2",
        T,
    );
    assert!(has(
        &p.a,
        &["ip", "neigh", "show", "dev", "flannel.1"],
        "PERMANENT"
    ));
    // The route style, said first and held.
    let nexthops = p.a.ns.run("ip", &["nexthop", "show"]);
    match style {
        Style::Nexthop => {
            p.da.wait_log("routes through nexthop objects", T);
            let want = format!(
                "id {} via {} dev flannel.1 scope link proto boot onlink",
                nexthop_id(&p.sub_b),
                p.net_b
            );
            assert!(nexthops.contains(&want), "{want} not in {nexthops}");
        }
        Style::Plain => {
            p.da.wait_log(
                "plain routes: nexthop objects switched off (--nexthops=false)",
                T,
            );
            assert!(nexthops.trim().is_empty(), "{nexthops}");
        }
    }
    // Through the overlay: device address to device address.
    wait_for("a ping across vxlan", T, || {
        ping(&p.a, &p.net_a, &p.net_b).then_some(())
    });
}

#[test]
fn vxlan_puts_back_what_is_deleted_by_hand() {
    vxlan_puts_back_what_is_deleted_by_hand_in(Style::Nexthop);
}

#[test]
fn vxlan_puts_back_what_is_deleted_by_hand_with_plain_routes() {
    vxlan_puts_back_what_is_deleted_by_hand_in(Style::Plain);
}

fn vxlan_puts_back_what_is_deleted_by_hand_in(style: Style) {
    let p = pair_in(style, "fvr", r#"{"Type":"vxlan"}"#);
    let route = p.route_b();
    wait_has(&p.a, &["ip", "route", "show"], &route, T);
    wait_has(
        &p.a,
        &["bridge", "fdb", "show", "dev", "flannel.1"],
        "dst 192.168.100.2",
        T,
    );
    p.a.ns.ip(&["route", "del", &p.sub_b]);
    wait_has(&p.a, &["ip", "route", "show"], &route, T);
    p.a.ns.ip(&["neigh", "del", &p.net_b, "dev", "flannel.1"]);
    wait_has(
        &p.a,
        &["ip", "neigh", "show", "dev", "flannel.1"],
        &format!("{} lladdr", p.net_b),
        T,
    );
    delete_fdb_to(&p.a, "192.168.100.2");
    wait_has(
        &p.a,
        &["bridge", "fdb", "show", "dev", "flannel.1"],
        "dst 192.168.100.2",
        T,
    );
    // The device itself (flannel-io/flannel#869, #2247): made again with every peer.
    p.a.ns.ip(&["link", "del", "flannel.1"]);
    wait_has(&p.a, &["ip", "route", "show"], &route, T);
    wait_has(
        &p.a,
        &["bridge", "fdb", "show", "dev", "flannel.1"],
        "dst 192.168.100.2",
        T,
    );
    wait_has(
        &p.a,
        &["ip", "addr", "show", "flannel.1"],
        &format!("inet {}/32", p.net_a),
        T,
    );
    wait_for("a ping across vxlan after the repair", T, || {
        ping(&p.a, &p.net_a, &p.net_b).then_some(())
    });
    // The external interface down and up (#1070, #1434).
    p.b.ns.ip(&["link", "set", "eth0", "down"]);
    p.b.ns.ip(&["link", "set", "eth0", "up"]);
    p.b.ns.ip(&[
        "route",
        "replace",
        "default",
        "via",
        "192.168.100.254",
        "dev",
        "eth0",
        "onlink",
    ]);
    wait_for("a ping across vxlan after eth0 went down and up", T, || {
        ping(&p.b, &p.net_b, &p.net_a).then_some(())
    });
}

#[test]
fn a_restart_changes_nothing_and_a_stale_route_is_removed() {
    a_restart_changes_nothing_and_a_stale_route_is_removed_in(Style::Nexthop);
}

#[test]
fn a_restart_changes_nothing_and_a_stale_route_is_removed_with_plain_routes() {
    a_restart_changes_nothing_and_a_stale_route_is_removed_in(Style::Plain);
}

fn a_restart_changes_nothing_and_a_stale_route_is_removed_in(style: Style) {
    let mut p = pair_in(style, "fvs", r#"{"Type":"vxlan"}"#);
    let route = p.route_b();
    wait_has(&p.a, &["ip", "route", "show"], &route, T);
    wait_has(
        &p.a,
        &["bridge", "fdb", "show", "dev", "flannel.1"],
        "dst 192.168.100.2",
        T,
    );
    let before = snapshot(&p.a);
    assert_eq!(p.da.stop().code(), Some(0));
    // A route for a subnet nobody leases, left from some earlier life.
    p.a.ns.ip(&[
        "route",
        "add",
        "10.9.250.0/24",
        "via",
        "10.9.250.0",
        "dev",
        "flannel.1",
        "onlink",
    ]);
    let reg = p.a.path("registry").display().to_string();
    p.da = start_in(style, &p.a, &reg, "a");
    p.da.wait_log("wrote", T);
    wait_for("the stale route to go", T, || {
        (!has(&p.a, &["ip", "route", "show"], "10.9.250.0/24")).then_some(())
    });
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(snapshot(&p.a), before);
    assert!(
        !p.da.log_text().contains("device mended"),
        "{}",
        p.da.log_text()
    );
}

#[test]
fn a_peer_that_leaves_is_removed() {
    a_peer_that_leaves_is_removed_in(Style::Nexthop);
}

#[test]
fn a_peer_that_leaves_is_removed_with_plain_routes() {
    a_peer_that_leaves_is_removed_in(Style::Plain);
}

fn a_peer_that_leaves_is_removed_in(style: Style) {
    let mut p = pair_in(style, "fvl", r#"{"Type":"vxlan"}"#);
    let route = p.route_b();
    wait_has(&p.a, &["ip", "route", "show"], &route, T);
    p.db.stop();
    fs::remove_file(p.a.path(&format!("registry/subnets/{}", p.sub_b.replace('/', "-")))).unwrap();
    wait_for("b's route to leave a", T, || {
        (!has(&p.a, &["ip", "route", "show"], &p.sub_b)).then_some(())
    });
    assert!(!has(
        &p.a,
        &["bridge", "fdb", "show", "dev", "flannel.1"],
        "192.168.100.2"
    ));
    assert!(!has(
        &p.a,
        &["ip", "neigh", "show", "dev", "flannel.1"],
        &p.net_b
    ));
    wait_for("b's nexthop to leave a", T, || {
        (!has(&p.a, &["ip", "nexthop", "show"], &p.net_b)).then_some(())
    });
}

#[test]
fn host_gw_routes_via_the_peer_and_direct_routing_does_too() {
    host_gw_routes_via_the_peer_and_direct_routing_does_too_in(Style::Nexthop);
}

#[test]
fn host_gw_routes_via_the_peer_and_direct_routing_does_too_with_plain_routes() {
    host_gw_routes_via_the_peer_and_direct_routing_does_too_in(Style::Plain);
}

fn host_gw_routes_via_the_peer_and_direct_routing_does_too_in(style: Style) {
    for (prefix, backend) in [
        ("fvh", r#"{"Type":"host-gw"}"#),
        ("fvd", r#"{"Type":"vxlan","DirectRouting":true}"#),
    ] {
        let p = pair_in(style, prefix, backend);
        let route = p.route_to(&p.sub_b, "192.168.100.2", "eth0");
        wait_has(&p.a, &["ip", "route", "show"], &route, T);
        // An address of b's subnet on b answers through that route.
        let b_addr = p.net_b.replace(".0", ".1");
        let b_addr = match b_addr.rsplit_once('.') {
            Some((head, _)) => format!("{head}.1"),
            None => b_addr,
        };
        p.b.ns
            .ip(&["addr", "add", &format!("{b_addr}/32"), "dev", "lo"]);
        wait_for("a ping to b's subnet", T, || {
            ping(&p.a, "192.168.100.1", &b_addr).then_some(())
        });
        p.a.ns.ip(&["route", "del", &p.sub_b]);
        wait_has(&p.a, &["ip", "route", "show"], &route, T);
        let _ = &p.db;
    }
}

#[test]
fn a_device_left_with_a_wrong_address_is_fixed_at_start() {
    // flannel-io/flannel#1060: flannel.1 from an earlier life, with another subnet's address.
    let p = pair_with("fvw", r#"{"Type":"vxlan"}"#, "", |a| {
        a.ns.ip(&[
            "link",
            "add",
            "flannel.1",
            "type",
            "vxlan",
            "id",
            "1",
            "local",
            "192.168.100.1",
            "dev",
            "eth0",
            "dstport",
            "8472",
            "nolearning",
        ]);
        a.ns.ip(&["addr", "add", "10.9.250.0/32", "dev", "flannel.1"]);
    });
    let addrs = p.a.ns.run("ip", &["-4", "addr", "show", "flannel.1"]);
    assert!(addrs.contains(&format!("inet {}/32", p.net_a)), "{addrs}");
    assert!(!addrs.contains("10.9.250.0"), "{addrs}");
    wait_for("a ping across vxlan", T, || {
        ping(&p.a, &p.net_a, &p.net_b).then_some(())
    });
}

#[test]
fn a_device_mac_changed_by_hand_is_put_back() {
    // flannel-io/flannel#1330: the lease and the peers' entries keep the VtepMAC.
    let p = pair("fvm", r#"{"Type":"vxlan"}"#);
    wait_for("a ping across vxlan", T, || {
        ping(&p.a, &p.net_a, &p.net_b).then_some(())
    });
    let mac = |n: &Node| {
        n.ns.link("flannel.1")
            .and_then(|l| l["address"].as_str().map(str::to_string))
    };
    let before = mac(&p.b);
    p.b.ns
        .ip(&["link", "set", "flannel.1", "address", "02:11:22:33:44:55"]);
    wait_for("flannel.1's MAC to be put back", T, || {
        (mac(&p.b) == before).then_some(())
    });
    wait_for("a ping across vxlan", T, || {
        ping(&p.a, &p.net_a, &p.net_b).then_some(())
    });
}

#[test]
fn a_hundred_leases_present_at_start_are_all_programmed() {
    // flannel-io/flannel#1531, #958.
    let p = pair_with("fvc", r#"{"Type":"vxlan"}"#, "", |a| {
        let dir = a.path("registry/subnets");
        fs::create_dir_all(&dir).unwrap();
        for i in 0..100 {
            let value = format!(
                r#"{{"Expiration":99999999999,"Lease":{{"PublicIP":"172.16.0.{i}","PublicIPv6":null,"BackendType":"vxlan","BackendData":{{"VNI":1,"VtepMAC":"02:00:00:00:01:{i:02x}"}}}}}}"#
            );
            fs::write(dir.join(format!("10.9.{}.0-24", 150 + i)), value).unwrap();
        }
    });
    wait_for("101 routes on flannel.1", T, || {
        let routes =
            p.a.ns
                .run("ip", &["-4", "route", "show", "dev", "flannel.1"]);
        (routes.lines().count() == 101).then_some(())
    });
    let fdb = p.a.ns.run("bridge", &["fdb", "show", "dev", "flannel.1"]);
    assert_eq!(
        fdb.lines().filter(|l| l.contains(" dst ")).count(),
        101,
        "{fdb}"
    );
}

#[test]
fn dual_stack_vxlan_carries_both_families() {
    let p = pair_with(
        "fv6",
        r#"{"Type":"vxlan"}"#,
        r#","EnableIPv6":true,"IPv6Network":"fc00::/48""#,
        |_| {},
    );
    let env = fs::read_to_string(&p.da.subnet_file).unwrap();
    assert!(
        env.contains("FLANNEL_IPV6_NETWORK=fc00::/48\nFLANNEL_IPV6_SUBNET=fc00:0:0:"),
        "{env}"
    );
    let v6_addr = |n: &Node| {
        let out = n.ns.run(
            "ip",
            &["-6", "addr", "show", "flannel-v6.1", "scope", "global"],
        );
        out.split_whitespace()
            .skip_while(|w| *w != "inet6")
            .nth(1)
            .map(|a| a.trim_end_matches("/128").to_string())
            .unwrap_or_default()
    };
    wait_for("a global address on flannel-v6.1", T, || {
        (!v6_addr(&p.a).is_empty() && !v6_addr(&p.b).is_empty()).then_some(())
    });
    let dev = p.a.ns.run("ip", &["-d", "link", "show", "flannel-v6.1"]);
    assert!(dev.contains("local fd00::1"), "{dev}");
    wait_has(&p.a, &["ip", "-6", "route", "show"], "dev flannel-v6.1", T);
    wait_has(
        &p.a,
        &["bridge", "fdb", "show", "dev", "flannel-v6.1"],
        "dst fd00::2",
        T,
    );
    wait_for("a ping across vxlan over IPv4", T, || {
        ping(&p.a, &p.net_a, &p.net_b).then_some(())
    });
    let (a6, b6) = (v6_addr(&p.a), v6_addr(&p.b));
    wait_for("a ping across vxlan over IPv6", T, || {
        ping(&p.a, &a6, &b6).then_some(())
    });
}

const DUAL_STACK: &str = r#","EnableIPv6":true,"IPv6Network":"fc00::/48""#;

/// A daemon's IPv6 subnet (`fc00:0:0:3::/64`) from its subnet.env.
fn subnet6(d: &Daemon) -> String {
    let env = d.wait_subnet_env(T);
    let sub = env
        .lines()
        .find_map(|l| l.strip_prefix("FLANNEL_IPV6_SUBNET="))
        .unwrap_or_else(|| panic!("no FLANNEL_IPV6_SUBNET in {env}"));
    key_of(sub).replacen('-', "/", 1)
}

/// Deletes one entry by hand and waits for `show` to hold `needle` again.
fn deleted_and_back(node: &Node, what: &str, delete: &[&str], show: &[&str], needle: &str) {
    assert!(
        has(node, show, needle),
        "{needle:?} not in `{}` before deleting {what}",
        show.join(" ")
    );
    // `run` fails unless the entry was there and is gone; the daemon may put it back before
    // another look could see it missing.
    node.ns.run(delete[0], &delete[1..]);
    wait_for(
        &format!("{what} deleted by hand to be back ({needle:?})"),
        T,
        || has(node, show, needle).then_some(()),
    );
}

#[test]
fn dual_stack_vxlan_puts_back_ipv6_entries_deleted_by_hand() {
    let p = pair_with("fv7", r#"{"Type":"vxlan"}"#, DUAL_STACK, |_| {});
    let sub_b6 = subnet6(&p.db);
    let net_b6 = sub_b6.split('/').next().unwrap_or_default().to_string();
    let route = p.route_to(&sub_b6, &net_b6, "flannel-v6.1");
    let neigh = format!("{net_b6} lladdr");
    let route_show = ["ip", "-6", "route", "show"];
    let neigh_show = ["ip", "-6", "neigh", "show", "dev", "flannel-v6.1"];
    let fdb_show = ["bridge", "fdb", "show", "dev", "flannel-v6.1"];
    wait_has(&p.a, &route_show, &route, T);
    wait_has(&p.a, &neigh_show, &neigh, T);
    wait_has(&p.a, &fdb_show, "dst fd00::2", T);
    let v4_route = p.route_b();
    wait_has(&p.a, &["ip", "route", "show"], &v4_route, T);

    deleted_and_back(
        &p.a,
        "the IPv6 route",
        &["ip", "-6", "route", "del", &sub_b6],
        &route_show,
        &route,
    );
    deleted_and_back(
        &p.a,
        "the IPv6 neighbour",
        &["ip", "-6", "neigh", "del", &net_b6, "dev", "flannel-v6.1"],
        &neigh_show,
        &neigh,
    );
    let fdb = p.a.ns.run(fdb_show[0], &fdb_show[1..]);
    let mac = fdb
        .lines()
        .find(|l| l.contains("dst fd00::2"))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no FDB entry to fd00::2 in\n{fdb}"))
        .to_string();
    deleted_and_back(
        &p.a,
        "the IPv6 FDB entry",
        &[
            "bridge",
            "fdb",
            "del",
            &mac,
            "dev",
            "flannel-v6.1",
            "dst",
            "fd00::2",
        ],
        &fdb_show,
        "dst fd00::2",
    );
    // The device itself: made again, with its address and every peer's entries.
    let sub_a6 = subnet6(&p.da);
    let addr_a6 = format!("{}/128", sub_a6.split('/').next().unwrap_or_default());
    p.a.ns.ip(&["link", "del", "flannel-v6.1"]);
    wait_for(
        "flannel-v6.1 deleted by hand to be back with its address, route, neighbour and FDB entry",
        T,
        || {
            (p.a.ns.link("flannel-v6.1").is_some()
                && p.a.ns.addresses("flannel-v6.1").contains(&addr_a6)
                && has(&p.a, &route_show, &route)
                && has(&p.a, &neigh_show, &neigh)
                && has(&p.a, &fdb_show, "dst fd00::2"))
            .then_some(())
        },
    );
    let dev = p.a.ns.run("ip", &["-d", "link", "show", "flannel-v6.1"]);
    for want in ["mtu 1430", "vxlan id 1", "local fd00::1", "dev eth0"] {
        assert!(dev.contains(want), "{want} not in {dev}");
    }
    let addr_b6 = sub_b6.replacen("::/64", "::", 1);
    wait_for("a ping across flannel-v6.1 after the repair", T, || {
        ping(&p.a, addr_a6.trim_end_matches("/128"), &addr_b6).then_some(())
    });
    // IPv4 went on untouched.
    assert!(has(&p.a, &["ip", "route", "show"], &v4_route));
}

#[test]
fn dual_stack_host_gw_puts_back_an_ipv6_route_deleted_by_hand() {
    let p = pair_with("fv8", r#"{"Type":"host-gw"}"#, DUAL_STACK, |_| {});
    let sub_b6 = subnet6(&p.db);
    let route = p.route_to(&sub_b6, "fd00::2", "eth0");
    wait_has(&p.a, &["ip", "-6", "route", "show"], &route, T);
    deleted_and_back(
        &p.a,
        "the IPv6 route",
        &["ip", "-6", "route", "del", &sub_b6],
        &["ip", "-6", "route", "show"],
        &route,
    );
}

#[test]
fn masquerade_rules_are_flannels_and_put_back() {
    let p = pair("fvq", r#"{"Type":"vxlan"}"#);
    let rules = firewall(&p.a);
    let sub_a = format!("{}/24", p.net_a);
    for want in [
        "-A POSTROUTING -m comment --comment \"flanneld masq\" -j FLANNEL-POSTRTG".to_string(),
        format!("-A FLANNEL-POSTRTG -s {sub_a} -d 10.9.0.0/16 -m comment --comment \"flanneld masq\" -j RETURN"),
        "-A FLANNEL-POSTRTG -s 10.9.0.0/16 ! -d 224.0.0.0/4 -m comment --comment \"flanneld masq\" -j MASQUERADE --random-fully".to_string(),
        "-A FORWARD -m comment --comment \"flanneld forward\" -j FLANNEL-FWD".to_string(),
    ] {
        assert!(rules.contains(&want), "{want}\nnot in\n{rules}");
    }
    let rule =
        format!("-s {sub_a} -d 10.9.0.0/16 -m comment --comment \"flanneld masq\" -j RETURN");
    let mut del = vec!["-t", "nat", "-D", "FLANNEL-POSTRTG"];
    let parts = shell_words(&rule);
    del.extend(parts.iter().map(String::as_str));
    p.a.ns.run("iptables", &del);
    assert!(!firewall(&p.a).contains(&rule));
    wait_for("the deleted masquerade rule to come back", T, || {
        (firewall(&p.a) == rules).then_some(())
    });
}

/// Splits a rule as a shell would (double quotes only).
fn shell_words(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for c in s.chars() {
        match c {
            '"' => quoted = !quoted,
            ' ' if !quoted => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

fn scrape(node: &Node) -> String {
    let out = node
        .ns
        .try_run("curl", &["-s", "http://127.0.0.1:9106/metrics"]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

#[test]
fn metrics_move_with_leases_and_repairs() {
    let p = pair("fvp", r#"{"Type":"vxlan"}"#);
    let route = p.route_b();
    wait_has(&p.a, &["ip", "route", "show"], &route, T);
    wait_for(
        "flanneld_leases_known 1, one route and one nexthop",
        T,
        || {
            let m = scrape(&p.a);
            (sample(&m, "flanneld_leases_known") == Some(1.0)
                && sample(&m, "flanneld_kernel_entries{kind=\"route\"}") == Some(1.0)
                && sample(&m, "flanneld_kernel_entries{kind=\"nexthop\"}") == Some(1.0))
            .then_some(())
        },
    );
    let m = scrape(&p.a);
    assert_eq!(
        sample(&m, "flanneld_route_style{style=\"nexthop\"}"),
        Some(1.0),
        "{m}"
    );
    assert!(
        sample(&m, "flanneld_lease_expiry_timestamp_seconds").unwrap_or(0.0) > 1.7e9,
        "{m}"
    );
    assert!(
        sample(&m, "flanneld_reconcile_runs_total").unwrap_or(0.0) >= 1.0,
        "{m}"
    );
    let repaired = sample(&m, "flanneld_entries_repaired_total{kind=\"route\"}").unwrap_or(-1.0);
    p.a.ns.ip(&["route", "del", &p.sub_b]);
    wait_for("the repair to be counted", T, || {
        let m = scrape(&p.a);
        (sample(&m, "flanneld_entries_repaired_total{kind=\"route\"}") == Some(repaired + 1.0))
            .then_some(())
    });
}

fn doctor(node: &Node, reg: &str, subnet_file: &std::path::Path, json: bool) -> (i32, String) {
    doctor_with(node, reg, subnet_file, if json { &["--json"] } else { &[] })
}

fn doctor_with(
    node: &Node,
    reg: &str,
    subnet_file: &std::path::Path,
    extra: &[&str],
) -> (i32, String) {
    let file = subnet_file.display().to_string();
    let mut args = vec![
        "doctor",
        "--registry-dir",
        reg,
        "--iface",
        "eth0",
        "--subnet-file",
        &file,
        "--ip-masq",
    ];
    args.extend_from_slice(extra);
    let out = node.ns.try_run(FLANNELD, &args);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn doctor_names_each_broken_entry() {
    let mut p = pair("fvx", r#"{"Type":"vxlan"}"#);
    let route = p.route_b();
    wait_has(&p.a, &["ip", "route", "show"], &route, T);
    wait_has(
        &p.a,
        &["bridge", "fdb", "show", "dev", "flannel.1"],
        "dst 192.168.100.2",
        T,
    );
    // The daemon stopped, so that nothing is repaired while the doctor looks.
    assert_eq!(p.da.stop().code(), Some(0));
    let reg = p.a.path("registry").display().to_string();
    let (code, text) = doctor(&p.a, &reg, &p.da.subnet_file, false);
    assert_eq!(code, 0, "{text}");
    assert!(text.ends_with("all right\n"), "{text}");
    assert!(
        text.contains(&format!("route      ok       {}", p.sub_b)),
        "{text}"
    );
    // The route style, as the daemon's first log lines say it.
    assert!(
        text.contains(
            "ok   routes     ok       routes through nexthop objects (ids from 4000000000 for IPv4"
        ),
        "{text}"
    );
    let (_, plain) = doctor_with(&p.a, &reg, &p.da.subnet_file, &["--nexthops=false"]);
    assert!(
        plain.contains(
            "ok   routes     ok       plain routes: nexthop objects switched off (--nexthops=false)"
        ),
        "{plain}"
    );

    p.a.ns.ip(&["route", "del", &p.sub_b]);
    p.a.ns.ip(&["neigh", "del", &p.net_b, "dev", "flannel.1"]);
    p.a.ns.ip(&[
        "route",
        "add",
        "10.9.250.0/24",
        "via",
        "10.9.250.0",
        "dev",
        "flannel.1",
        "onlink",
    ]);
    p.a.ns
        .run("iptables", &["-t", "nat", "-F", "FLANNEL-POSTRTG"]);
    let mac = delete_fdb_to(&p.a, "192.168.100.2");
    // subnet.env with an MTU the device cannot carry.
    let env = std::fs::read_to_string(&p.da.subnet_file).unwrap();
    std::fs::write(
        &p.da.subnet_file,
        env.replace("FLANNEL_MTU=1450", "FLANNEL_MTU=1500"),
    )
    .unwrap();
    // A look: what is broken stays broken until --fix.
    let (code, text) = writes_nothing(&p.a, p.a.dir.path(), "doctor", || {
        doctor(&p.a, &reg, &p.da.subnet_file, false)
    });
    assert_eq!(code, 1, "{text}");
    for want in [
        format!("route      missing  {}", p.doctor_route_b()),
        format!("neighbour  missing  {}", p.net_b),
        "route      extra    10.9.250.0/24".to_string(),
        format!("fdb        missing  {mac} dst 192.168.100.2"),
        "mtu        wrong    eth0 1500 -> device 1450 -> FLANNEL_MTU 1500".to_string(),
        "masquerade wrong".to_string(),
    ] {
        assert!(text.contains(&want), "{want:?} not in\n{text}");
    }
    let (code, json) = doctor(&p.a, &reg, &p.da.subnet_file, true);
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&json).expect("doctor --json");
    let missing = v["findings"]
        .as_array()
        .map(|a| a.iter().filter(|f| f["state"] == "missing").count())
        .unwrap_or(0);
    assert_eq!(missing, 3, "{json}");

    // --fix: the daemon's pass, once, without the daemon; then all is right.
    let (code, text) = doctor_with(&p.a, &reg, &p.da.subnet_file, &["--fix"]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("--fix: wrote"), "{text}");
    assert!(text.ends_with("all right\n"), "{text}");
    wait_has(&p.a, &["ip", "route", "show"], &route, T);
    assert!(!p
        .a
        .ns
        .run("ip", &["route", "show"])
        .contains("10.9.250.0/24"));
    assert!(std::fs::read_to_string(&p.da.subnet_file)
        .unwrap()
        .contains("FLANNEL_MTU=1450"));
    let (code, text) = doctor(&p.a, &reg, &p.da.subnet_file, false);
    assert_eq!(code, 0, "{text}");
}

#[test]
fn a_full_size_packet_with_df_crosses_vxlan_and_a_bigger_one_does_not() {
    let p = pair("fvf", r#"{"Type":"vxlan"}"#);
    wait_for("a ping across vxlan", T, || {
        ping(&p.a, &p.net_a, &p.net_b).then_some(())
    });
    let df_ping = |payload: &str| {
        p.a.ns
            .try_run(
                "ping",
                &[
                    "-c", "1", "-W", "1", "-M", "do", "-s", payload, "-I", &p.net_a, &p.net_b,
                ],
            )
            .status
            .success()
    };
    // FLANNEL_MTU is 1450: 1450 - 20 (IP) - 8 (ICMP) = 1422 bytes of payload fit.
    assert!(
        df_ping("1372"),
        "a 1400-byte packet with DF set did not cross"
    );
    assert!(
        df_ping("1422"),
        "a 1450-byte packet with DF set did not cross"
    );
    assert!(
        !df_ping("1423"),
        "a packet over FLANNEL_MTU crossed with DF set"
    );
}

#[test]
fn a_restart_under_a_continuous_ping_loses_no_packet() {
    let mut p = pair("fvg", r#"{"Type":"vxlan"}"#);
    wait_for("a ping across vxlan", T, || {
        ping(&p.a, &p.net_a, &p.net_b).then_some(())
    });
    // Pings 20 ms apart from before a's daemon stops until after it has started again.
    no_reply_lost_across(&p.a, &p.net_a, &p.net_b, || {
        assert_eq!(p.da.stop().code(), Some(0));
        let reg = p.a.path("registry").display().to_string();
        p.da = start(&p.a, &reg, "a");
        p.da.wait_log("wrote", T);
    });
}

#[test]
fn a_nexthop_deleted_by_hand_is_back_with_its_routes() {
    let p = pair_with("fvn", r#"{"Type":"vxlan"}"#, DUAL_STACK, |_| {});
    let route = p.route_b();
    wait_has(&p.a, &["ip", "route", "show"], &route, T);
    let id = nexthop_id(&p.sub_b).to_string();
    // The kernel takes the route with the nexthop, and announces only the nexthop's deletion.
    p.a.ns.ip(&["nexthop", "del", "id", &id]);
    wait_for(
        "the nexthop deleted by hand to be back with its route",
        T,
        || {
            (has(&p.a, &["ip", "nexthop", "show"], &format!("id {id} via"))
                && has(&p.a, &["ip", "route", "show"], &route))
            .then_some(())
        },
    );
    let sub_b6 = subnet6(&p.db);
    let net_b6 = sub_b6.split('/').next().unwrap_or_default().to_string();
    let route6 = p.route_to(&sub_b6, &net_b6, "flannel-v6.1");
    wait_has(&p.a, &["ip", "-6", "route", "show"], &route6, T);
    deleted_and_back(
        &p.a,
        "the IPv6 nexthop",
        &[
            "ip",
            "nexthop",
            "del",
            "id",
            &nexthop_id(&sub_b6).to_string(),
        ],
        &["ip", "-6", "route", "show"],
        &route6,
    );
    wait_for("both repairs counted", T, || {
        (sample(
            &scrape(&p.a),
            "flanneld_entries_repaired_total{kind=\"nexthop\"}",
        ) == Some(2.0))
        .then_some(())
    });
    wait_for("a ping across vxlan after the repair", T, || {
        ping(&p.a, &p.net_a, &p.net_b).then_some(())
    });
}

#[test]
fn a_go_style_plain_route_is_replaced_by_one_through_a_nexthop_without_losing_a_packet() {
    let mut p = pair("fvo", r#"{"Type":"vxlan"}"#);
    let route = p.route_b();
    wait_has(&p.a, &["ip", "route", "show"], &route, T);
    assert_eq!(p.da.stop().code(), Some(0));
    // a as Go's flanneld leaves it: the same neighbour and FDB entry, a plain route (marked
    // boot, as Go's netlink library marks it), and no nexthop.
    let id = nexthop_id(&p.sub_b).to_string();
    p.a.ns.ip(&["nexthop", "del", "id", &id]);
    p.a.ns.ip(&[
        "route",
        "add",
        &p.sub_b,
        "via",
        &p.net_b,
        "dev",
        "flannel.1",
        "onlink",
        "proto",
        "boot",
    ]);
    let plain = format!("{} via {} dev flannel.1 onlink", p.sub_b, p.net_b);
    assert!(has(&p.a, &["ip", "route", "show"], &plain));
    wait_for("a ping across vxlan over the plain route", T, || {
        ping(&p.a, &p.net_a, &p.net_b).then_some(())
    });
    // Pings 20 ms apart from before our daemon starts until after it has replaced the route.
    no_reply_lost_across(&p.a, &p.net_a, &p.net_b, || {
        let reg = p.a.path("registry").display().to_string();
        p.da = start(&p.a, &reg, "a");
        wait_has(&p.a, &["ip", "route", "show"], &route, T);
    });
    // Replaced in place: one route to b's subnet, through the nexthop.
    let routes = p.a.ns.run("ip", &["route", "show", &p.sub_b]);
    assert_eq!(routes.lines().count(), 1, "{routes}");
    assert!(
        p.da.log_text().contains("wrote 1 routes"),
        "{}",
        p.da.log_text()
    );
}

/// `ip -o monitor` of some objects in a node, its lines read as they come. A marker route,
/// added and deleted in a table of its own (252) on lo, shows when the monitor listens and
/// when it has read everything announced before; marker lines are left out of what it saw.
struct Monitor {
    child: std::process::Child,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    reader: std::thread::JoinHandle<()>,
    marks: u8,
}

impl Monitor {
    fn start(node: &Node, objects: &[&str]) -> Monitor {
        use std::io::BufRead;
        let mut child = node
            .ns
            .command("ip")
            .args(["-o", "monitor"])
            .args(objects)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("ip monitor");
        let stdout = child.stdout.take().expect("ip monitor's output");
        let lines: std::sync::Arc<std::sync::Mutex<Vec<String>>> = Default::default();
        let reader = {
            let lines = lines.clone();
            std::thread::spawn(move || {
                for l in std::io::BufReader::new(stdout)
                    .lines()
                    .map_while(Result::ok)
                {
                    lines.lock().unwrap_or_else(|e| e.into_inner()).push(l);
                }
            })
        };
        let mut m = Monitor {
            child,
            lines,
            reader,
            marks: 0,
        };
        m.mark(node);
        m
    }

    /// Adds and deletes a marker route and waits until the monitor has shown its deletion.
    fn mark(&mut self, node: &Node) {
        self.marks += 1;
        let dst = format!("198.51.100.{}/32", self.marks);
        let mut deleted = None;
        wait_for("ip monitor to show a marker route", T, || {
            // Before it listens, the monitor misses a marker: another, until it shows one.
            node.ns
                .ip(&["route", "add", &dst, "dev", "lo", "table", "252"]);
            node.ns
                .ip(&["route", "del", &dst, "dev", "lo", "table", "252"]);
            let seen = |lines: &[String]| {
                lines
                    .iter()
                    .any(|l| l.starts_with(&format!("Deleted {} ", dst.trim_end_matches("/32"))))
            };
            for _ in 0..10 {
                if seen(&self.lines.lock().unwrap_or_else(|e| e.into_inner())) {
                    deleted = Some(());
                    return deleted;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            None
        });
        deleted.expect("the marker seen")
    }

    /// Everything announced until now, without the markers.
    fn stop(mut self, node: &Node) -> String {
        self.mark(node);
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
        let _ = self.reader.join();
        let lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
        lines
            .iter()
            .filter(|l| !l.contains("table 252"))
            .map(|l| format!("{l}\n"))
            .collect()
    }
}

/// The kernel's announcements while `act` runs, one a line (`ip -o monitor route nexthop`).
fn announced(node: &Node, act: impl FnOnce()) -> String {
    let monitor = Monitor::start(node, &["route", "nexthop"]);
    act();
    monitor.stop(node)
}

#[test]
fn a_restart_with_plain_routes_replaces_each_route_before_its_nexthop_goes() {
    let mut p = pair("fvb", r#"{"Type":"vxlan"}"#);
    wait_has(&p.a, &["ip", "route", "show"], &p.route_b(), T);
    assert_eq!(p.da.stop().code(), Some(0));
    let plain = format!("{} via {} dev flannel.1 onlink", p.sub_b, p.net_b);
    let id = nexthop_id(&p.sub_b);
    let reg = p.a.path("registry").display().to_string();
    // The kernel announces a nexthop's deletion but not that of the IPv4 routes it takes with
    // it: the route must have moved off the nexthop (replaced by the plain one) before.
    let seen = announced(&p.a, || {
        p.da = start_in(Style::Plain, &p.a, &reg, "a");
        wait_for("the plain route and no nexthop", T, || {
            (has(&p.a, &["ip", "route", "show"], &plain)
                && p.a.ns.run("ip", &["nexthop", "show"]).trim().is_empty())
            .then_some(())
        });
    });
    let lines: Vec<&str> = seen.lines().collect();
    let replaced = lines.iter().position(|l| l.starts_with(&plain));
    let deleted = lines
        .iter()
        .position(|l| l.starts_with(&format!("Deleted id {id} ")));
    assert!(
        replaced.is_some() && deleted.is_some() && replaced < deleted,
        "the route to b replaced, then its nexthop deleted:\n{seen}"
    );
    let routes = p.a.ns.run("ip", &["route", "show", &p.sub_b]);
    assert_eq!(routes.trim(), plain, "{routes}");
    wait_for("a ping across vxlan over the plain route", T, || {
        ping(&p.a, &p.net_a, &p.net_b).then_some(())
    });
}

#[test]
fn a_lease_outside_the_network_is_skipped_and_said_once() {
    let p = pair("fvy", r#"{"Type":"vxlan"}"#);
    wait_has(&p.a, &["ip", "route", "show"], &p.route_b(), T);
    // A lease in the registry for a subnet of another network (a node configured elsewhere).
    let value = r#"{"Expiration":99999999999,"Lease":{"PublicIP":"192.168.100.77","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"02:00:00:00:07:07"}}}"#;
    fs::write(p.a.path("registry/subnets/10.10.5.0-24"), value).unwrap();
    let said =
        "lease 10.10.5.0-24: its subnet 10.10.5.0/24 is outside the network 10.9.0.0/16; skipped";
    p.da.wait_log(said, T);
    // Another pass (a repair) says nothing new about it and programs nothing for it.
    p.a.ns.ip(&["route", "del", &p.sub_b]);
    wait_has(&p.a, &["ip", "route", "show"], &p.route_b(), T);
    assert!(!has(&p.a, &["ip", "route", "show"], "10.10.5.0"));
    assert!(!has(&p.a, &["ip", "nexthop", "show"], "10.10.5.0"));
    assert!(!has(
        &p.a,
        &["ip", "neigh", "show", "dev", "flannel.1"],
        "10.10.5.0"
    ));
    assert!(!has(
        &p.a,
        &["bridge", "fdb", "show", "dev", "flannel.1"],
        "192.168.100.77"
    ));
    assert_eq!(
        p.da.log_text().matches(said).count(),
        1,
        "{}",
        p.da.log_text()
    );
}

#[test]
fn a_restart_rewrites_nothing() {
    let mut p = pair_with("fvz", r#"{"Type":"vxlan"}"#, DUAL_STACK, |_| {});
    let sub_b6 = subnet6(&p.db);
    let net_b6 = sub_b6.split('/').next().unwrap_or_default().to_string();
    wait_has(&p.a, &["ip", "route", "show"], &p.route_b(), T);
    wait_has(
        &p.a,
        &["ip", "-6", "route", "show"],
        &p.route_to(&sub_b6, &net_b6, "flannel-v6.1"),
        T,
    );
    wait_has(
        &p.a,
        &["bridge", "fdb", "show", "dev", "flannel-v6.1"],
        "dst fd00::2",
        T,
    );
    let state = |n: &Node| {
        [
            n.ns.run("ip", &["-d", "nexthop", "show"]),
            n.ns.run("ip", &["-d", "route", "show"]),
            n.ns.run("ip", &["-d", "-6", "route", "show"]),
            snapshot(n),
        ]
        .join("\n")
    };
    // IPv6 addresses (eth0's link-local, flannel-v6.1's) are announced again when their
    // duplicate address detection ends.
    wait_for("no tentative IPv6 address on a", T, || {
        p.a.ns
            .run("ip", &["-6", "addr", "show", "tentative"])
            .trim()
            .is_empty()
            .then_some(())
    });
    let before = state(&p.a);
    assert_eq!(p.da.stop().code(), Some(0));
    // Every change the kernel announces from here on, while the daemon starts again.
    let monitor = Monitor::start(&p.a, &["route", "nexthop", "neigh", "address"]);
    let reg = p.a.path("registry").display().to_string();
    p.da = start(&p.a, &reg, "a");
    p.da.wait_log("wrote", T);
    wait_for("the restarted daemon's first pass", T, || {
        (sample(&scrape(&p.a), "flanneld_reconcile_runs_total").unwrap_or(0.0) >= 1.0).then_some(())
    });
    let seen = monitor.stop(&p.a);
    let first: Vec<&str> = seen.lines().take(10).collect();
    assert!(
        first.is_empty(),
        "the restart changed the kernel:\n{}",
        first.join("\n")
    );
    assert_eq!(state(&p.a), before);
    let log = p.da.log_text();
    assert!(!log.contains("datapath:"), "{log}");
    let m = scrape(&p.a);
    for kind in ["route", "neighbour", "fdb", "nexthop"] {
        let name = format!("flanneld_entries_repaired_total{{kind=\"{kind}\"}}");
        assert_eq!(sample(&m, &name), Some(0.0), "{m}");
    }
}
