//! Three nodes with both address families, and with IPv6 alone, for vxlan, vxlan with
//! DirectRouting and host-gw, on the embedded registry, on etcd in the underlay and on Node
//! objects in the Kubernetes API server stand-in there (--kube-subnet-mgr, the podCIDRs of
//! each family): what an operator checks, on each family the network has. The dual-stack
//! underlay carries both families (etcd and the API server on its IPv4 address); the IPv6-only
//! one carries IPv6 alone, etcd and the API server included.
//!
//! One cluster per configuration goes through every check in turn, so that its set-up (the
//! namespaces, etcd, three daemons, six pods) is paid once: the leases and subnet.env, the
//! kernel's entries, ping and TCP between every pair of pods, Don't-Fragment pings of the pod
//! MTU, masquerade to the outside, a daemon restart under continuous pings, then a node that
//! joins and one that leaves.

use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, Instant};
use testkit::cluster::{backlog_drops, wait_for, Cluster, Family, Node, Registry, Underlay};
use testkit::pings::{self, Pinger};

const FLANNELD: &str = env!("CARGO_BIN_EXE_flanneld");
/// A ceiling for waits, a change in the leases reaching every other node's kernel included.
const T: Duration = Duration::from_secs(30);
/// Each pod's TCP server, and the outside's.
const PORT: u16 = 7000;
const OUTSIDE_PORT: u16 = 7001;
/// The networks: every cluster has namespaces of its own, so all use the same.
const NETWORK: &str = "10.30.0.0/16";
const NETWORK6: &str = "fc00:30::/48";
/// The underlay's eth0 MTU (veth's default).
const UNDERLAY_MTU: u64 = 1500;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stack {
    Dual,
    V6Only,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    Vxlan,
    HostGw,
    DirectRouting,
}

#[derive(Clone, Copy, Debug)]
struct Setup {
    stack: Stack,
    backend: Backend,
    registry: Registry,
}

impl Setup {
    /// flannel's net-conf.json. Dual-stack lists the IPv6 keys first, as operators who prefer
    /// IPv6 write it (flannel-io/flannel#1985 panicked on that).
    fn config(&self) -> String {
        let backend = match self.backend {
            Backend::Vxlan => r#"{"Type":"vxlan"}"#,
            Backend::HostGw => r#"{"Type":"host-gw"}"#,
            Backend::DirectRouting => r#"{"Type":"vxlan","DirectRouting":true}"#,
        };
        match self.stack {
            Stack::Dual => format!(
                r#"{{"EnableIPv6":true,"IPv6Network":"{NETWORK6}","EnableIPv4":true,"Network":"{NETWORK}","Backend":{backend}}}"#
            ),
            Stack::V6Only => format!(
                r#"{{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"{NETWORK6}","Backend":{backend}}}"#
            ),
        }
    }

    fn underlay(&self) -> Underlay {
        match self.stack {
            Stack::Dual => Underlay::Dual,
            Stack::V6Only => Underlay::V6,
        }
    }

    fn families(&self) -> Vec<Family> {
        match self.stack {
            Stack::Dual => vec![Family::V4, Family::V6],
            Stack::V6Only => vec![Family::V6],
        }
    }

    fn vxlan(&self) -> bool {
        self.backend != Backend::HostGw
    }

    /// The vxlan device of family `f`, and its MTU: the underlay's less 50 bytes of headers
    /// over IPv4 and 70 over IPv6 (flanneld takes 50 off both).
    fn device(&self, f: Family) -> Option<(&'static str, u64)> {
        self.vxlan().then_some(match f {
            Family::V4 => ("flannel.1", UNDERLAY_MTU - 50),
            Family::V6 => ("flannel-v6.1", UNDERLAY_MTU - 70),
        })
    }

    /// FLANNEL_MTU, the pods' MTU: what fits through every device the pods' packets may take.
    fn pod_mtu(&self) -> u64 {
        self.families()
            .into_iter()
            .map(|f| self.device(f).map_or(UNDERLAY_MTU, |(_, mtu)| mtu))
            .min()
            .unwrap_or(UNDERLAY_MTU)
    }

    /// Routes to other nodes go straight to their address on eth0 (host-gw, and DirectRouting
    /// since every node shares the underlay's link), or over the vxlan device.
    fn via_underlay(&self) -> bool {
        self.backend != Backend::Vxlan
    }
}

fn start_flanneld(c: &mut Cluster, node: u8) {
    c.start_flanneld(node, Path::new(FLANNELD), &["--ip-masq"]);
}

/// The cluster with flanneld (`--ip-masq`) running on every node and two pods per node.
fn cluster(prefix: &str, s: &Setup) -> Cluster {
    let mut c = Cluster::on(s.underlay(), prefix, 79, 3, s.registry, &s.config());
    for n in 1..=3 {
        start_flanneld(&mut c, n);
    }
    for n in 1..=3 {
        c.node(n).wait_subnet_env(T);
    }
    for n in 1..=3 {
        c.add_pod(n);
        c.add_pod(n);
    }
    c
}

/// The address of a subnet's network (`fc00:30:0:3::` of `fc00:30:0:3::/64`): the vxlan
/// device's address, and the gateway of the routes to that subnet.
fn network_address(subnet: &str) -> &str {
    subnet.split('/').next().unwrap_or_default()
}

/// The kernel entries of node `n` a restart must leave as they are: routes, permanent
/// neighbours and FDB entries of both families, and the vxlan devices.
fn snapshot(n: &Node) -> String {
    let links = n.ns.ip(&["-d", "-o", "link", "show", "type", "vxlan"]);
    [
        n.routes(),
        n.routes6(),
        n.ns.ip(&["-4", "neigh", "show", "nud", "permanent"]),
        n.ns.ip(&["-6", "neigh", "show", "nud", "permanent"]),
        n.fdb(),
        links,
    ]
    .join("\n")
}

/// The address a TCP server of `serve_tcp(PORT, "pod{j} $SOCAT_PEERADDR")` saw.
fn peer_of(reply: &str) -> Option<IpAddr> {
    reply
        .split_whitespace()
        .nth(1)?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok()
}

fn ip(text: &str) -> IpAddr {
    text.parse()
        .unwrap_or_else(|e| panic!("{text:?} is not an address: {e}"))
}

// ---- the checks, in the order a configuration goes through them -------------------------

/// One lease per node in flannel's key form, the same in the registry; subnet.env in
/// flanneld's order; every node hears of every other's lease with its public address(es).
fn leases_and_subnet_env(c: &Cluster, s: &Setup) {
    let keys: Vec<String> = c.nodes().iter().map(|n| n.lease_key(T)).collect();
    let mut sorted = keys.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(
        sorted.len(),
        keys.len(),
        "leases are not distinct: {keys:?}"
    );
    assert_eq!(c.lease_keys(), sorted, "the registry's leases");
    for key in &keys {
        let (v4, v6) = key.split_once('&').unwrap_or((key, ""));
        match s.stack {
            Stack::Dual => assert!(v4.starts_with("10.30.") && v4.ends_with(".0-24"), "{key}"),
            Stack::V6Only => assert_eq!(v4, "0.0.0.0-0", "{key}"),
        }
        assert!(v6.starts_with("fc00:30:") && v6.ends_with("::-64"), "{key}");
    }
    for n in c.nodes() {
        let mut want = String::new();
        if let Some(sub) = n.subnet_env_opt("FLANNEL_SUBNET", T) {
            want += &format!("FLANNEL_NETWORK={NETWORK}\nFLANNEL_SUBNET={sub}\n");
        }
        let sub6 = n
            .subnet_env_opt("FLANNEL_IPV6_SUBNET", T)
            .unwrap_or_default();
        want += &format!(
            "FLANNEL_IPV6_NETWORK={NETWORK6}\nFLANNEL_IPV6_SUBNET={sub6}\nFLANNEL_MTU={}\nFLANNEL_IPMASQ=true\n",
            s.pod_mtu()
        );
        assert_eq!(n.wait_subnet_env(T), want, "node {}'s subnet.env", n.index);
        for other in c.nodes().iter().filter(|o| o.index != n.index) {
            let mut line = format!("lease added: {}", other.lease_key(T));
            if let Some(ip) = other.addr(Family::V4).filter(|_| s.stack == Stack::Dual) {
                line += &format!(" public-ip {ip}");
            }
            line += &format!(" public-ipv6 {}", other.ip6.as_deref().unwrap_or_default());
            n.wait_log(&line, T);
        }
    }
}

/// The vxlan devices of the network's families (and no other) with their MTUs; one route per
/// other node and family, where the backend sends it; pods with an address of each family in
/// their node's subnets, none of another family, and FLANNEL_MTU.
fn devices_routes_and_pods(c: &Cluster, s: &Setup) {
    for n in c.nodes() {
        for f in Family::BOTH {
            let wanted = s.families().contains(&f);
            let Some((dev, mtu)) = s.device(f) else {
                continue;
            };
            let link = n.ns.link(dev);
            if !wanted {
                assert!(link.is_none(), "node {} has {dev}: {link:?}", n.index);
                continue;
            }
            let link = link.unwrap_or_else(|| panic!("node {} has no {dev}", n.index));
            assert_eq!(link["mtu"], mtu, "node {}: {dev}", n.index);
            let own = n.subnet(f, T).unwrap_or_default();
            let host = if f == Family::V6 { "128" } else { "32" };
            let want = format!("{}/{host}", network_address(&own));
            assert!(
                n.ns.addresses(dev).contains(&want),
                "node {}: {dev} has {:?}, not {want}",
                n.index,
                n.ns.addresses(dev)
            );
        }
    }
    let mut wrong = String::new();
    let start = Instant::now();
    let settled = loop {
        match c.nodes().iter().try_for_each(|n| routes_are_right(c, s, n)) {
            Ok(()) => break true,
            Err(e) if start.elapsed() > T => {
                wrong = e;
                break false;
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    assert!(
        settled,
        "gave up after {T:?} waiting for every node's routes to every other node: {wrong}\n{}",
        c.describe()
    );
    for p in c.pods() {
        let node = c.node(p.node);
        assert_eq!(
            p.families(),
            s.families(),
            "pod {:?} on node {}",
            p.ips,
            p.node
        );
        for f in p.families() {
            let subnet = node.subnet(f, T).unwrap_or_default();
            let net: ipnetwork::IpNetwork = subnet.parse().unwrap();
            let addr = p.addr(f).unwrap_or_default();
            assert!(
                net.contains(ip(addr)),
                "pod {addr} on node {} is not in {subnet}",
                p.node
            );
        }
        assert_eq!(p.mtu(), s.pod_mtu(), "pod {:?} MTU", p.ips);
    }
}

/// Node `n` holds exactly one route per other node and family, the one the backend calls for.
fn routes_are_right(c: &Cluster, s: &Setup, n: &Node) -> Result<(), String> {
    for other in c.nodes().iter().filter(|o| o.index != n.index) {
        for f in s.families() {
            let subnet = other.subnet(f, T).unwrap_or_default();
            let routes = n.routes_to(f, &subnet);
            let (gw, dev) = if s.via_underlay() {
                (other.addr(f).unwrap_or_default(), "eth0")
            } else {
                let (dev, _) = s.device(f).unwrap_or_default();
                (network_address(&subnet), dev)
            };
            let right = routes.len() == 1 && routes[0]["gateway"] == gw && routes[0]["dev"] == dev;
            if !right {
                return Err(format!(
                    "node {}: routes to {subnet} are {routes:?}, not one via {gw} dev {dev}",
                    n.index
                ));
            }
        }
    }
    Ok(())
}

/// Every pod serves its name and its peer's address on PORT, on each family; every other pod
/// connects and reads its name, and its own address: between pods nothing is masqueraded.
fn assert_tcp_between_every_pair(c: &mut Cluster, s: &Setup) {
    for i in 0..c.pods().len() {
        c.pod_mut(i)
            .serve_tcp(PORT, &format!("pod{i} $SOCAT_PEERADDR"));
    }
    for f in s.families() {
        for (i, from) in c.pods().iter().enumerate() {
            for (j, to) in c.pods().iter().enumerate() {
                if i == j {
                    continue;
                }
                let (src, dst) = (from.addr(f).unwrap(), to.addr(f).unwrap());
                let reply = from.tcp_read(dst, PORT);
                let name = reply.as_deref().and_then(|r| r.split_whitespace().next());
                assert!(
                    name == Some(format!("pod{j}").as_str())
                        && reply.as_deref().and_then(peer_of) == Some(ip(src)),
                    "{s:?}: TCP over {f} from pod {i} ({src}, node {}) to pod {j} ({dst}, node {}) read {reply:?}\n{}",
                    from.node,
                    to.node,
                    c.describe()
                );
            }
        }
    }
}

/// Between the first pods of every two nodes, on each family: a packet of the pod MTU with
/// Don't Fragment set crosses, one a byte bigger does not.
fn assert_df_pings_at_the_pod_mtu(c: &Cluster, s: &Setup) {
    let mtu = s.pod_mtu();
    let firsts: Vec<usize> = c
        .nodes()
        .iter()
        .filter_map(|n| c.pods().iter().position(|p| p.node == n.index))
        .collect();
    for f in s.families() {
        for &i in &firsts {
            for &j in &firsts {
                if i == j {
                    continue;
                }
                let (from, to) = (&c.pods()[i], &c.pods()[j]);
                let dst = to.addr(f).unwrap();
                assert!(
                    from.crosses_with_df(dst, mtu),
                    "{s:?}: a {mtu}-byte {f} packet with DF from pod {i} (node {}) to {dst} (node {}) did not cross\n{}",
                    from.node,
                    to.node,
                    c.describe()
                );
                assert!(
                    !from.crosses_with_df(dst, mtu + 1),
                    "{s:?}: a {}-byte {f} packet with DF crossed from pod {i} to {dst}, over the pod MTU {mtu}",
                    mtu + 1
                );
            }
        }
    }
}

/// Every pod reaches the outside (the underlay's own address, with no route back to pods) on
/// each family, and the outside sees the pod's node.
fn assert_masquerade_to_the_outside(c: &mut Cluster, s: &Setup) {
    c.serve_outside(OUTSIDE_PORT);
    for f in s.families() {
        for (i, p) in c.pods().iter().enumerate() {
            let node = c.node(p.node).addr(f).map(ip);
            let seen = c.seen_from_outside(i, f, OUTSIDE_PORT);
            assert!(
                seen.is_some() && seen == node,
                "{s:?}: pod {i} ({}) reached {} over {f} as {seen:?}, not as its node {node:?}\n{}\nip6tables:\n{}",
                p.addr(f).unwrap_or_default(),
                c.outside(f).unwrap_or_default(),
                c.describe(),
                c.node(p.node).ns.run("ip6tables-save", &["-t", "nat"])
            );
        }
    }
}

/// Node 1's daemon killed and started again while a pod on node 2 pings a pod on node 1 every
/// 20 ms on each family, from a reply before the kill until one after the new daemon wrote
/// subnet.env: no echo between went unanswered, and node 1's entries are as they were.
fn assert_restart_loses_nothing(c: &mut Cluster, s: &Setup) {
    let before = snapshot(c.node(1));
    let from = c.pods().iter().position(|p| p.node == 2).unwrap();
    let to = c.pods().iter().position(|p| p.node == 1).unwrap();
    let pingers: Vec<Pinger> = s
        .families()
        .into_iter()
        .map(|f| {
            let dst = c.pods()[to].addr(f).unwrap().to_string();
            let mut cmd = c.pods()[from].ns.command("ping");
            cmd.args(["-i", "0.02", "-W", "1", &dst]);
            Pinger::start(&format!("{f}"), cmd)
        })
        .collect();
    let drops = backlog_drops();
    let failed = pings::across(pingers, T, || {
        let wrote = |c: &Cluster| c.node(1).log().matches("wrote ").count();
        let writes = wrote(c);
        start_flanneld(c, 1);
        wait_for("node 1's restarted daemon to write subnet.env", T, || {
            (wrote(c) > writes).then_some(())
        });
    });
    assert!(
        failed.is_empty(),
        "{s:?}: pings every 20 ms across node 1's restart (the machine's input backlogs dropped \
         {} packets meanwhile):\n{}",
        backlog_drops() - drops,
        failed.join("\n")
    );
    assert!(c.flanneld_running(1), "node 1:\n{}", c.node(1).log());
    assert_eq!(
        snapshot(c.node(1)),
        before,
        "{s:?}: node 1's entries changed across a restart"
    );
}

/// A fourth node joins and is reached on each family without restarting anyone; then the
/// third dies and its lease is deleted: its routes, neighbours and FDB entries of both
/// families leave every other node, and the rest still reach each other.
fn assert_a_node_joins_and_another_leaves(c: &mut Cluster, s: &Setup) {
    let four = c.add_node();
    start_flanneld(c, four);
    c.node(four).wait_subnet_env(T);
    c.add_pod(four);
    c.wait_every_pod_reaches_every_other(&s.families(), T);
    wait_for("every node's routes with the fourth", T, || {
        c.nodes()
            .iter()
            .all(|n| routes_are_right(c, s, n).is_ok())
            .then_some(())
    });

    let gone = c.node(3);
    let key = gone.lease_key(T);
    let subnets: Vec<(Family, String)> = s
        .families()
        .into_iter()
        .map(|f| (f, gone.subnet(f, T).unwrap_or_default()))
        .collect();
    let addrs: Vec<String> = s
        .families()
        .into_iter()
        .filter_map(|f| gone.addr(f).map(str::to_string))
        .collect();
    let others = [1, 2, four];
    let holds = |n: &Node| -> Vec<String> {
        let mut held = Vec::new();
        for (f, subnet) in &subnets {
            if !n.routes_to(*f, subnet).is_empty() {
                held.push(format!("a route to {subnet}"));
            }
            let vtep = format!("{} ", network_address(subnet));
            if s.via_underlay() {
                continue;
            }
            if n.neighbours().lines().any(|l| l.starts_with(&vtep)) {
                held.push(format!("a neighbour entry for {vtep}"));
            }
        }
        for a in &addrs {
            if n.fdb().contains(&format!("dst {a} ")) {
                held.push(format!("an FDB entry to {a}"));
            }
        }
        held
    };
    let want_held = if s.via_underlay() {
        subnets.len()
    } else {
        3 * subnets.len()
    };
    for &i in &others {
        let held = holds(c.node(i));
        assert_eq!(
            held.len(),
            want_held,
            "node {i} before the removal: {held:?}"
        );
    }
    c.stop_flanneld(3);
    c.delete_lease(&key);
    let start = Instant::now();
    while others.iter().any(|&i| !holds(c.node(i)).is_empty()) {
        if start.elapsed() > T {
            let left: Vec<String> = others
                .iter()
                .map(|&i| format!("node {i}: {:?}", holds(c.node(i))))
                .collect();
            panic!(
                "{s:?}: {T:?} after lease {key} of node 3 was deleted, entries for it remain: {left:?}\n{}",
                c.describe()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    for f in s.families() {
        let bad = c.pairs_failing(|a, b| {
            a.node == 3 || b.node == 3 || a.ping(b.addr(f).unwrap_or_default(), 2)
        });
        assert!(
            bad.is_empty(),
            "{s:?}: after node 3 left, these {f} pings got no answer:\n{}",
            c.describe_pairs(&bad)
        );
    }
    for i in others {
        assert!(
            c.flanneld_running(i),
            "flanneld on node {i} exited:\n{}",
            c.node(i).log()
        );
    }
}

fn end_to_end(prefix: &str, s: Setup) {
    let started = Instant::now();
    let mut lap = Instant::now();
    let mut step = |what: &str| {
        eprintln!("{s:?}: {what} in {:?}", lap.elapsed());
        lap = Instant::now();
    };
    let mut c = cluster(prefix, &s);
    step("set-up");
    leases_and_subnet_env(&c, &s);
    step("leases");
    devices_routes_and_pods(&c, &s);
    step("devices");
    c.wait_every_pod_reaches_every_other(&s.families(), T);
    step("pings");
    assert_tcp_between_every_pair(&mut c, &s);
    step("tcp");
    assert_df_pings_at_the_pod_mtu(&c, &s);
    step("df");
    assert_masquerade_to_the_outside(&mut c, &s);
    step("masq");
    assert_restart_loses_nothing(&mut c, &s);
    step("restart");
    assert_a_node_joins_and_another_leaves(&mut c, &s);
    step("churn");
    eprintln!("{s:?}: every check in {:?}", started.elapsed());
}

macro_rules! configurations {
    ($($name:ident, $prefix:literal: $stack:expr, $backend:expr, $registry:expr;)*) => {$(
        #[test]
        fn $name() {
            end_to_end(
                $prefix,
                Setup {
                    stack: $stack,
                    backend: $backend,
                    registry: $registry,
                },
            );
        }
    )*};
}

configurations! {
    dual_stack_vxlan_embedded, "dve": Stack::Dual, Backend::Vxlan, Registry::Embedded;
    dual_stack_vxlan_etcd, "dvx": Stack::Dual, Backend::Vxlan, Registry::Etcd;
    dual_stack_direct_routing_embedded, "dde": Stack::Dual, Backend::DirectRouting, Registry::Embedded;
    dual_stack_direct_routing_etcd, "ddx": Stack::Dual, Backend::DirectRouting, Registry::Etcd;
    dual_stack_host_gw_embedded, "dhe": Stack::Dual, Backend::HostGw, Registry::Embedded;
    dual_stack_host_gw_etcd, "dhx": Stack::Dual, Backend::HostGw, Registry::Etcd;
    ipv6_only_vxlan_embedded, "6ve": Stack::V6Only, Backend::Vxlan, Registry::Embedded;
    ipv6_only_vxlan_etcd, "6vx": Stack::V6Only, Backend::Vxlan, Registry::Etcd;
    ipv6_only_direct_routing_embedded, "6de": Stack::V6Only, Backend::DirectRouting, Registry::Embedded;
    ipv6_only_direct_routing_etcd, "6dx": Stack::V6Only, Backend::DirectRouting, Registry::Etcd;
    ipv6_only_host_gw_embedded, "6he": Stack::V6Only, Backend::HostGw, Registry::Embedded;
    ipv6_only_host_gw_etcd, "6hx": Stack::V6Only, Backend::HostGw, Registry::Etcd;
    dual_stack_vxlan_kube, "dvk": Stack::Dual, Backend::Vxlan, Registry::Kube;
    dual_stack_direct_routing_kube, "ddk": Stack::Dual, Backend::DirectRouting, Registry::Kube;
    dual_stack_host_gw_kube, "dhk": Stack::Dual, Backend::HostGw, Registry::Kube;
    ipv6_only_vxlan_kube, "6vk": Stack::V6Only, Backend::Vxlan, Registry::Kube;
    ipv6_only_direct_routing_kube, "6dk": Stack::V6Only, Backend::DirectRouting, Registry::Kube;
    ipv6_only_host_gw_kube, "6hk": Stack::V6Only, Backend::HostGw, Registry::Kube;
}
