//! The `wireguard` backend on three-node clusters (testkit::cluster), each node's flanneld in a
//! mount namespace of its own whose /run/wireguard holds its devices' sockets, as on separate
//! machines. This kernel has no WireGuard, so the tunnel is the userspace one
//! (flannel-wireguard, beside flanneld). One cluster per underlay family, and one dual-stack with
//! `Mode` auto (one device for both families) and `MTU` set: pods reach each other by ping and
//! TCP; the devices (their MTU), routes, peers and leases (key and port) are flanneld's; on the
//! underlay of either family only UDP to the listen ports passes; peers and devices changed by
//! hand are repaired; a lease removed takes its peer along; a restart keeps the tunnel and every
//! echo across it; a tunnel of another namespace behind node 1's socket is not taken for its
//! own. Then a node whose tunnel is wireguard-go, configured with `wg` as Go's flanneld v0.26+
//! configures one on another port, joins ours and is reached on that port.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use testkit::cluster::{wait_for, Cluster, Family, Registry, Underlay};
use testkit::{runs_here, Need};

const FLANNELD: &str = env!("CARGO_BIN_EXE_flanneld");
const T: Duration = Duration::from_secs(30);
const PORT: u16 = 7000;
const NETWORK: &str = "10.31.0.0/16";
const NETWORK6: &str = "fd31::/48";
const WG_TOOLS: Need = Need::Installed(
    "wg, wireguard-go and tcpdump (Debian's wireguard-tools, wireguard-go, tcpdump)",
);

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn tunnel_program() -> PathBuf {
    let p = Path::new(FLANNELD).with_file_name("flannel-wireguard");
    assert!(
        p.exists(),
        "{} is missing: cargo build --workspace --bins",
        p.display()
    );
    p
}

/// Each node's mount namespace (held by a sleeping process) and, on drop, the end of every
/// process left in the nodes' network namespaces (their tunnels outlive flanneld by design).
struct Machines {
    holders: Vec<(u8, Child)>,
    netns: Vec<String>,
}

impl Machines {
    fn new() -> Machines {
        Machines {
            holders: Vec::new(),
            netns: Vec::new(),
        }
    }

    /// Gives node `index` a mount namespace with its own /run/wireguard and its own key file,
    /// from its next flanneld start on.
    fn separate(&mut self, c: &mut Cluster, index: u8) {
        std::fs::create_dir_all("/run/wireguard").unwrap();
        let holder = Command::new("unshare")
            .args([
                "-m",
                "--propagation",
                "private",
                "sh",
                "-c",
                "mount -t tmpfs wg /run/wireguard && exec sleep 100000",
            ])
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let pid = holder.id();
        wait_for("the node's /run/wireguard", T, || {
            std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
                .ok()?
                .contains(" /run/wireguard ")
                .then_some(())
        });
        self.holders.push((index, holder));
        self.netns.push(c.node(index).ns.name().to_string());
        c.set_flanneld_wrapper(index, &["nsenter", &format!("--mount=/proc/{pid}/ns/mnt")]);
        let key = c.node(index).dir.join("wgkey");
        c.set_flanneld_env(index, "WIREGUARD_KEY_FILE", &key.display().to_string());
    }

    /// A command in node `index`'s network and mount namespaces (`wg show` sees its tunnels).
    fn on(&self, c: &Cluster, index: u8, args: &[&str]) -> String {
        let pid = self
            .holders
            .iter()
            .find(|(i, _)| *i == index)
            .map(|(_, h)| h.id())
            .unwrap();
        let out = Command::new("nsenter")
            .arg(format!("--mount=/proc/{pid}/ns/mnt"))
            .arg(format!("--net={}", c.node(index).ns.path().display()))
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?} on node {index}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Machines {
    fn drop(&mut self) {
        for ns in &self.netns {
            let pids = Command::new("ip").args(["netns", "pids", ns]).output();
            if let Ok(out) = pids {
                for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    let _ = Command::new("kill").arg(pid).status();
                }
            }
        }
        for (_, h) in &mut self.holders {
            let _ = h.kill();
            let _ = h.wait();
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Stack {
    V4,
    Dual,
    V6Only,
    /// Dual-stack with `Mode` auto: one flannel-wg for both families.
    DualAuto,
}

impl Stack {
    fn config(self) -> String {
        let backend = r#""Backend":{"Type":"wireguard","PersistentKeepaliveInterval":0}"#;
        match self {
            Stack::V4 => format!(r#"{{"Network":"{NETWORK}",{backend}}}"#),
            Stack::DualAuto => format!(
                r#"{{"Network":"{NETWORK}","EnableIPv6":true,"IPv6Network":"{NETWORK6}","Backend":{{"Type":"wireguard","Mode":"auto","MTU":1400}}}}"#
            ),
            Stack::Dual => format!(
                r#"{{"Network":"{NETWORK}","EnableIPv6":true,"IPv6Network":"{NETWORK6}",{backend}}}"#
            ),
            Stack::V6Only => format!(
                r#"{{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"{NETWORK6}",{backend}}}"#
            ),
        }
    }

    fn underlay(self) -> Underlay {
        match self {
            Stack::V4 => Underlay::V4,
            Stack::Dual | Stack::DualAuto => Underlay::Dual,
            Stack::V6Only => Underlay::V6,
        }
    }

    fn families(self) -> Vec<Family> {
        match self {
            Stack::V4 => vec![Family::V4],
            Stack::Dual | Stack::DualAuto => vec![Family::V4, Family::V6],
            Stack::V6Only => vec![Family::V6],
        }
    }
}

impl Stack {
    /// The device of a family: one per family, or (auto) flannel-wg for both.
    fn device(self, f: Family) -> &'static str {
        match (self, f) {
            (Stack::DualAuto, _) | (_, Family::V4) => "flannel-wg",
            (_, Family::V6) => "flannel-wg-v6",
        }
    }

    /// The port the family's device listens on, which its lease announces.
    fn port(self, f: Family) -> u16 {
        if self.device(f) == "flannel-wg" {
            51820
        } else {
            51821
        }
    }

    /// The devices' MTU and FLANNEL_MTU: the underlay's (1500, or `MTU`) less 80.
    fn mtu(self) -> u32 {
        match self {
            Stack::DualAuto => 1320,
            _ => 1420,
        }
    }
}

fn network(f: Family) -> &'static str {
    match f {
        Family::V4 => NETWORK,
        Family::V6 => NETWORK6,
    }
}

/// `wg show <dev> dump`'s peers: (public key, endpoint, allowed ips).
fn peers(m: &Machines, c: &Cluster, index: u8, dev: &str) -> Vec<(String, String, String)> {
    m.on(c, index, &["wg", "show", dev, "dump"])
        .lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            (f[0].to_string(), f[2].to_string(), f[3].to_string())
        })
        .collect()
}

fn cluster(stack: Stack, registry: Registry, prefix: &str, net: u8) -> (Cluster, Machines) {
    tunnel_program();
    let mut c = Cluster::on(stack.underlay(), prefix, net, 3, registry, &stack.config());
    let mut m = Machines::new();
    for n in 1..=3 {
        m.separate(&mut c, n);
    }
    c.start_flanneld_everywhere(Path::new(FLANNELD), T);
    for n in 1..=3 {
        c.add_pod(n);
        c.add_pod(n);
    }
    (c, m)
}

/// Every pod serves its name on PORT; every pod reads every pod of another node, over `f`.
fn every_pod_reads_every_other_node_s(c: &Cluster, f: Family) {
    for (i, from) in c.pods().iter().enumerate() {
        for (j, to) in c.pods().iter().enumerate() {
            let Some(ip) = to.addr(f) else { continue };
            if from.node == to.node {
                continue;
            }
            assert_eq!(
                from.tcp_read(ip, PORT).as_deref(),
                Some(format!("pod{j}").as_str()),
                "TCP from pod {i} (node {}) to pod {j} (node {}, {ip})\n{}",
                from.node,
                to.node,
                c.describe()
            );
        }
    }
}

/// The lease's value as the registry holds it, byte for byte (the embedded registry's file
/// holds it within its record).
fn lease_value(c: &Cluster, key: &str) -> String {
    match c.registry() {
        Registry::Embedded => {
            std::fs::read_to_string(c.registry_dir().join("subnets").join(key)).unwrap()
        }
        Registry::Etcd => c.etcdctl(&[
            "get",
            "--print-value-only",
            &format!("{}/subnets/{key}", testkit::cluster::ETCD_PREFIX),
        ]),
        Registry::Kube => unreachable!("Node annotations are read apart"),
    }
}

/// Each node's BackendData (and BackendV6Data) in the registry: its public key and the port
/// of the family's device, as Go's flanneld writes them since v0.26, byte for byte.
fn assert_leases_announce_keys(m: &Machines, c: &Cluster, stack: Stack, case: &str) {
    let families = stack.families();
    for n in c.nodes() {
        let dev = stack.device(families[0]);
        let public = m.on(c, n.index, &["wg", "show", dev, "public-key"]);
        let data = |f: Family| {
            format!(
                r#"{{"PublicKey":"{}","Port":{}}}"#,
                public.trim(),
                stack.port(f)
            )
        };
        match c.registry() {
            Registry::Kube => {
                let node = c
                    .kube()
                    .node(&testkit::cluster::kube_node_name(n.index))
                    .unwrap();
                let ann = &node["metadata"]["annotations"];
                assert_eq!(
                    ann["flannel.alpha.coreos.com/backend-type"], "wireguard",
                    "{case}"
                );
                for (f, name) in [
                    (Family::V4, "backend-data"),
                    (Family::V6, "backend-v6-data"),
                ] {
                    if families.contains(&f) {
                        assert_eq!(
                            ann[format!("flannel.alpha.coreos.com/{name}")],
                            data(f).as_str(),
                            "{case}: {ann}"
                        );
                    }
                }
            }
            _ => {
                let value = lease_value(c, &n.lease_key(T));
                assert!(
                    value.contains(r#""BackendType":"wireguard""#),
                    "{case}: {value}"
                );
                for (f, name) in [(Family::V4, "BackendData"), (Family::V6, "BackendV6Data")] {
                    if families.contains(&f) {
                        assert!(
                            value.contains(&format!(r#""{name}":{}"#, data(f))),
                            "{case}: {value}"
                        );
                    }
                }
            }
        }
    }
}

/// A tcpdump expression for node 1's own connection to the registry (etcd's client port, the
/// API server's), the one TCP the underlay is meant to carry besides the tunnel; "" for the
/// embedded registry, which has none.
fn registry_connection(c: &Cluster) -> String {
    let servers: Vec<std::net::SocketAddr> = match c.registry() {
        Registry::Etcd => c
            .etcd_url()
            .unwrap()
            .split(',')
            .map(|u| {
                let hostport = u.trim().trim_start_matches("http://");
                hostport
                    .parse()
                    .unwrap_or_else(|e| panic!("etcd's client URL {u}: {e}"))
            })
            .collect(),
        Registry::Kube => vec![c.kube().addr()],
        Registry::Embedded => vec![],
    };
    servers
        .iter()
        .map(|a| format!("(tcp and host {} and port {})", a.ip(), a.port()))
        .collect::<Vec<_>>()
        .join(" or ")
}

/// What crosses node 1's link to the underlay while `run` runs, as tcpdump prints it.
fn captured(c: &Cluster, filter: &str, run: impl FnOnce()) -> String {
    let file = c.node(1).dir.join("underlay.pcap");
    let dump = c
        .node(1)
        .ns
        .command("tcpdump")
        .args([
            "-i",
            "eth0",
            "-n",
            "-U",
            "--immediate-mode",
            "-Z",
            "root",
            "-w",
        ])
        .arg(&file)
        .arg(filter)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("tcpdump to listen", T, || file.exists().then_some(()));
    std::thread::sleep(Duration::from_millis(300));
    run();
    std::thread::sleep(Duration::from_millis(300));
    let _ = Command::new("kill")
        .arg("-INT")
        .arg(dump.id().to_string())
        .status();
    let dumped = dump.wait_with_output().unwrap();
    let out = Command::new("tcpdump")
        .args(["-n", "-r"])
        .arg(&file)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        !text.is_empty(),
        "nothing captured: {}{}",
        String::from_utf8_lossy(&dumped.stderr),
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[test]
fn three_nodes_over_each_family_reach_each_other_encrypted_and_are_repaired() {
    if !runs_here(have("wg") && have("tcpdump"), WG_TOOLS) {
        return;
    }
    for (stack, registry, net) in [
        (Stack::V4, Registry::Embedded, 81),
        (Stack::Dual, Registry::Kube, 82),
        (Stack::V6Only, Registry::Etcd, 83),
        (Stack::DualAuto, Registry::Embedded, 85),
    ] {
        let case = format!("{stack:?} in {registry:?}");
        let (mut c, m) = cluster(stack, registry, &format!("wg{net}"), net);
        let families = stack.families();
        c.wait_every_pod_reaches_every_other(&families, T);

        // What flanneld made on each node: the device per family with the lease's subnet
        // address, one route for the network through it, a peer per other node.
        for n in c.nodes() {
            assert_eq!(
                n.subnet_env("FLANNEL_MTU", T),
                stack.mtu().to_string(),
                "{case}: node {}",
                n.index
            );
            let key = std::fs::read_to_string(n.dir.join("wgkey")).unwrap();
            for &f in &families {
                let dev = stack.device(f);
                let link =
                    n.ns.link(dev)
                        .unwrap_or_else(|| panic!("{case}: node {} has no {dev}", n.index));
                assert_eq!(link["mtu"], stack.mtu(), "{case}: {link}");
                let subnet = n.subnet(f, T).unwrap();
                let want = format!(
                    "{}/{}",
                    subnet.split('/').next().unwrap(),
                    if f == Family::V4 { 32 } else { 128 }
                );
                assert!(
                    n.ns.addresses(dev).contains(&want),
                    "{case}: node {} {dev}: {:?}, want {want}",
                    n.index,
                    n.ns.addresses(dev)
                );
                let routes = n.routes_to(f, network(f));
                assert_eq!(routes.len(), 1, "{case}: node {}: {routes:?}", n.index);
                assert_eq!(routes[0]["dev"], dev, "{case}: {routes:?}");
                let held = peers(&m, &c, n.index, dev);
                assert_eq!(held.len(), 2, "{case}: node {} {dev}: {held:?}", n.index);
                if matches!(stack, Stack::DualAuto) {
                    // One peer per node for both families, reached over IPv4 (both private).
                    for p in &held {
                        assert!(p.2.contains(',') && !p.1.starts_with('['), "{case}: {p:?}");
                    }
                }
                let show = m.on(&c, n.index, &["wg", "show", dev, "private-key"]);
                assert_eq!(
                    show.trim(),
                    key.trim(),
                    "{case}: node {} runs its key file's key",
                    n.index
                );
            }
        }
        assert_leases_announce_keys(&m, &c, stack, &case);
        for i in 0..c.pods().len() {
            c.pod_mut(i).serve_tcp(PORT, &format!("pod{i}"));
        }
        // Between nodes, over either underlay family, only WireGuard's UDP between the listen
        // ports (and IPv6's own neighbour and router traffic): no pod address in clear, no
        // ICMP or TCP. Node 1's connection to etcd or the API server is the one exception,
        // left out by its address and port only, not by a family.
        let registry = registry_connection(&c);
        let filter = if registry.is_empty() {
            "ip or ip6".to_string()
        } else {
            format!("(ip or ip6) and not ({registry})")
        };
        let seen = captured(&c, &filter, || {
            for &f in &families {
                every_pod_reads_every_other_node_s(&c, f);
            }
        });
        let lines: Vec<&str> = seen.lines().collect();
        for (family, port) in [(" IP ", ".51820 > "), (" IP6 ", "")] {
            let over = |f: Family| stack.underlay() == Underlay::Dual || families == [f];
            let expected = if family == " IP " {
                over(Family::V4)
            } else {
                over(Family::V6) && stack.device(Family::V6) == "flannel-wg-v6"
            };
            let tunnelled = lines
                .iter()
                .filter(|l| l.contains(family) && l.contains(": UDP") && l.contains(port))
                .count();
            assert!(
                !expected || tunnelled > 10,
                "{case}: too little WireGuard over{family}on the underlay:\n{seen}"
            );
        }
        for l in &lines {
            let link_local = l.contains("ICMP6, neighbor")
                || l.contains("ICMP6, router solicitation")
                || l.contains("multicast listener report");
            let udp = l.contains(": UDP") && (l.contains(".51820 > ") || l.contains(".51821 > "));
            assert!(
                link_local || (udp && !l.contains("10.31.") && !l.contains("fd31:")),
                "{case}: in clear on the underlay: {l}"
            );
        }
        if matches!(stack, Stack::V4) {
            repairs_and_restart(&mut c, &m);
            bad_input(&mut c);
        }
    }
}

/// Node 1's tunnel as flanneld left it: the process, and the peer of node 2.
fn tunnel_pid(c: &Cluster, index: u8) -> String {
    let out = Command::new("ip")
        .args(["netns", "pids", c.node(index).ns.name()])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .find(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.starts_with("flannel-wiregua"))
        })
        .unwrap_or_default()
        .to_string()
}

/// A peer removed or changed by hand is put back; a device deleted is made again; a restart
/// of flanneld keeps the tunnel and loses no packet; a lease gone takes its peer along.
fn repairs_and_restart(c: &mut Cluster, m: &Machines) {
    let held = peers(m, c, 1, "flannel-wg");
    let (key2, endpoint2, _) = held
        .iter()
        .find(|p| p.1.starts_with(&c.node(2).ip))
        .cloned()
        .unwrap();
    m.on(c, 1, &["wg", "set", "flannel-wg", "peer", &key2, "remove"]);
    wait_for(
        "node 1's peer of node 2, removed by hand, to be back",
        T,
        || {
            peers(m, c, 1, "flannel-wg")
                .iter()
                .any(|p| p.0 == key2)
                .then_some(())
        },
    );
    m.on(
        c,
        1,
        &[
            "wg",
            "set",
            "flannel-wg",
            "peer",
            &key2,
            "endpoint",
            "192.0.2.1:9",
        ],
    );
    wait_for(
        "node 1's peer of node 2, changed by hand, to be right again",
        T,
        || {
            peers(m, c, 1, "flannel-wg")
                .iter()
                .any(|p| p.0 == key2 && p.1 == endpoint2)
                .then_some(())
        },
    );
    c.node(1).ns.ip(&["link", "del", "flannel-wg"]);
    wait_for(
        "node 1's flannel-wg, deleted, to be back with its peers",
        T,
        || {
            (c.node(1).ns.link("flannel-wg").is_some() && peers(m, c, 1, "flannel-wg").len() == 2)
                .then_some(())
        },
    );
    c.wait_every_pod_reaches_every_other(&[Family::V4], T);

    // A restart keeps the tunnel process and the pods' traffic: pings every 20 ms from node 2
    // to node 1, answered before flanneld stops and after it is back, miss no echo between.
    let before = tunnel_pid(c, 1);
    assert!(!before.is_empty());
    let to = c.pods().iter().find(|p| p.node == 1).unwrap().ip.clone();
    let from = c.pods().iter().find(|p| p.node == 2).unwrap();
    let mut cmd = from.ns.command("ping");
    cmd.args(["-i", "0.02", "-W", "1", &to]);
    let pinger = testkit::pings::Pinger::start(&format!("node 2's pod to {to}"), cmd);
    let failed = testkit::pings::across(vec![pinger], T, || {
        c.terminate_flanneld(1, T);
        c.start_flanneld(1, Path::new(FLANNELD), &[]);
        c.node(1).wait_log("wireguard: device flannel-wg", T);
    });
    assert!(
        failed.is_empty(),
        "pods' traffic across flanneld's restart:\n{}",
        failed.join("\n")
    );
    assert_eq!(tunnel_pid(c, 1), before, "the tunnel process was replaced");

    // A tunnel of the same name in another network namespace, serving node 1's socket
    // directory, after node 1's own ended: flanneld says so and starts its own.
    let elsewhere = testkit::TestNs::new("wgx");
    c.stop_flanneld(1);
    let _ = Command::new("kill").arg(&before).status();
    wait_for("node 1's tunnel to end", T, || {
        tunnel_pid(c, 1).is_empty().then_some(())
    });
    let holder = m.holders.iter().find(|(i, _)| *i == 1).unwrap().1.id();
    let mut foreign = Command::new("nsenter")
        .arg(format!("--mount=/proc/{holder}/ns/mnt"))
        .arg(format!("--net={}", elsewhere.path().display()))
        .arg(tunnel_program())
        .arg("flannel-wg")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for("the foreign tunnel to serve node 1's socket", T, || {
        elsewhere.link("flannel-wg").map(|_| ())
    });
    c.start_flanneld(1, Path::new(FLANNELD), &[]);
    c.node(1).wait_log("runs in another network namespace", T);
    c.wait_every_pod_reaches_every_other(&[Family::V4], T);
    assert!(
        !tunnel_pid(c, 1).is_empty(),
        "node 1 runs a tunnel of its own"
    );
    assert!(
        elsewhere.link("flannel-wg").is_some(),
        "the other namespace's tunnel was left alone"
    );
    let _ = foreign.kill();
    let _ = foreign.wait();

    // Node 3's lease gone: its peer leaves nodes 1 and 2.
    let key3 = m
        .on(c, 3, &["wg", "show", "flannel-wg", "public-key"])
        .trim()
        .to_string();
    let lease3 = c.node(3).lease_key(T);
    c.stop_flanneld(3);
    c.delete_lease(&lease3);
    for n in [1, 2] {
        wait_for(
            &format!("node {n}'s peer of node 3 to leave with its lease"),
            T,
            || (!peers(m, c, n, "flannel-wg").iter().any(|p| p.0 == key3)).then_some(()),
        );
    }
}

/// A lease without a usable key is skipped with a warning naming it; a bad PSK and a bad key
/// file end the start with status 2, saying which.
fn bad_input(c: &mut Cluster) {
    let bad = "10.31.250.0-24";
    let path = c.registry_dir().join("subnets").join(bad);
    let expiry = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 3600;
    std::fs::write(
        &path,
        format!(r#"{{"Expiration":{expiry},"Lease":{{"PublicIP":"192.168.81.250","BackendType":"wireguard","BackendData":{{"PublicKey":"AAAA"}}}}}}"#),
    )
    .unwrap();
    c.node(1).wait_log(
        &format!("the node of lease {bad} (public address 192.168.81.250) is not programmed"),
        T,
    );
    std::fs::remove_file(&path).unwrap();

    let four = c.add_node();
    let key = c.node(four).dir.join("wgkey");
    std::fs::write(&key, "not a key").unwrap();
    c.set_flanneld_env(four, "WIREGUARD_KEY_FILE", &key.display().to_string());
    c.start_flanneld(four, Path::new(FLANNELD), &[]);
    let status = c.wait_flanneld_exit(four, T);
    assert_eq!(status.code(), Some(2), "{}", c.node(four).log());
    assert!(
        c.node(four).log().contains(&key.display().to_string()),
        "{}",
        c.node(four).log()
    );

    let config = c.registry_dir().join("config");
    std::fs::write(
        &config,
        format!(r#"{{"Network":"{NETWORK}","Backend":{{"Type":"wireguard","PSK":"c2VjcmV0"}}}}"#),
    )
    .unwrap();
    std::fs::remove_file(&key).unwrap();
    c.start_flanneld(four, Path::new(FLANNELD), &[]);
    let status = c.wait_flanneld_exit(four, T);
    let log = c.node(four).log();
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(
        log.contains("Backend.PSK") && !log.contains("c2VjcmV0"),
        "{log}"
    );
}

/// Node 3 runs no flanneld of ours: its tunnel is Debian's wireguard-go, and it is set up as Go's
/// flanneld (v0.26 on) sets up a node (with `wg` where Go uses wgctrl), listening on another
/// port than ours: its lease in etcd in Go's format with that `Port`, the device with its key
/// and port, the subnet's address, a scope-link route for the network, a peer per other node's
/// lease at the port that lease announces. Pods on all three reach each other both ways, and
/// ours reach node 3 on its port.
#[test]
fn a_node_whose_tunnel_is_wireguard_go_set_up_as_go_s_flanneld_does_joins_ours() {
    if !runs_here(have("wg") && have("wireguard-go"), WG_TOOLS) {
        return;
    }
    tunnel_program();
    let mut c = Cluster::on(
        Underlay::V4,
        "wg84",
        84,
        3,
        Registry::Etcd,
        &Stack::V4.config(),
    );
    let mut m = Machines::new();
    for n in 1..=3 {
        m.separate(&mut c, n);
    }
    c.start_flanneld(1, Path::new(FLANNELD), &[]);
    c.start_flanneld(2, Path::new(FLANNELD), &[]);
    c.node(1).wait_subnet_env(T);
    c.node(2).wait_subnet_env(T);

    let wg = |args: &[&str], stdin: &str| -> String {
        let mut child = Command::new("wg")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(child.stdin.as_mut().unwrap(), stdin.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let private = wg(&["genkey"], "");
    let public = wg(&["pubkey"], &private);
    let (ip3, key3) = (c.node(3).ip.clone(), "10.31.200.0-24");
    let port3 = "51999";
    let value = format!(
        r#"{{"PublicIP":"{ip3}","BackendType":"wireguard","BackendData":{{"PublicKey":"{public}","Port":{port3}}}}}"#
    );
    let grant = c.etcdctl(&["lease", "grant", "3600"]);
    let lease_id = grant.split_whitespace().nth(1).unwrap().to_string();
    c.etcdctl(&[
        "put",
        &format!("--lease={lease_id}"),
        &format!("{}/subnets/{key3}", testkit::cluster::ETCD_PREFIX),
        "--",
        &value,
    ]);

    let holder = m.holders.iter().find(|(i, _)| *i == 3).unwrap().1.id();
    let mut go = Command::new("nsenter")
        .arg(format!("--mount=/proc/{holder}/ns/mnt"))
        .arg(format!("--net={}", c.node(3).ns.path().display()))
        .args(["wireguard-go", "-f", "flannel-wg"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for("wireguard-go on node 3", T, || {
        Command::new("nsenter")
            .arg(format!("--mount=/proc/{holder}/ns/mnt"))
            .args(["wg", "show", "flannel-wg"])
            .output()
            .ok()
            .filter(|o| o.status.success())
    });
    let keyfile = c.node(3).dir.join("wgkey");
    std::fs::write(&keyfile, &private).unwrap();
    let keyfile = keyfile.display().to_string();
    m.on(
        &c,
        3,
        &[
            "wg",
            "set",
            "flannel-wg",
            "private-key",
            &keyfile,
            "listen-port",
            port3,
        ],
    );
    let ns3 = &c.node(3).ns;
    ns3.ip(&["addr", "add", "10.31.200.0/32", "dev", "flannel-wg"]);
    ns3.ip(&["link", "set", "flannel-wg", "mtu", "1420", "up"]);
    ns3.ip(&[
        "route",
        "replace",
        NETWORK,
        "dev",
        "flannel-wg",
        "scope",
        "link",
    ]);
    for n in [1, 2] {
        let lease = c.node(n).lease_key(T);
        let value: serde_json::Value = serde_json::from_str(&lease_value(&c, &lease)).unwrap();
        let peer = value["BackendData"]["PublicKey"]
            .as_str()
            .unwrap()
            .to_string();
        let endpoint = format!(
            "{}:{}",
            value["PublicIP"].as_str().unwrap(),
            value["BackendData"]["Port"]
        );
        m.on(
            &c,
            3,
            &[
                "wg",
                "set",
                "flannel-wg",
                "peer",
                &peer,
                "endpoint",
                &endpoint,
                "allowed-ips",
                &lease.replacen('-', "/", 1),
            ],
        );
    }
    std::fs::write(
        c.node(3).subnet_file(),
        format!("FLANNEL_NETWORK={NETWORK}\nFLANNEL_SUBNET=10.31.200.1/24\nFLANNEL_MTU=1420\nFLANNEL_IPMASQ=false\n"),
    )
    .unwrap();

    for n in 1..=3 {
        c.add_pod(n);
    }
    c.wait_every_pod_reaches_every_other(&[Family::V4], T);
    for i in 0..c.pods().len() {
        c.pod_mut(i).serve_tcp(PORT, &format!("pod{i}"));
    }
    every_pod_reads_every_other_node_s(&c, Family::V4);
    // Ours programmed Go's node from its lease as it programs its own kind.
    for n in [1, 2] {
        let held = peers(&m, &c, n, "flannel-wg");
        assert!(
            held.iter().any(|p| p.0 == public
                && p.1 == format!("{ip3}:{port3}")
                && p.2 == "10.31.200.0/24"),
            "node {n}: {held:?}"
        );
    }
    let _ = go.kill();
    let _ = go.wait();
}

/// The kernel path's probe: where the kernel has none (this project's machines) it says why;
/// either way the probe device it made is gone.
#[test]
fn the_kernel_path_is_taken_only_where_the_kernel_runs_wireguard() {
    let ns = testkit::TestNs::new("wgk");
    let handle = cni_kernel::Netns::open(ns.path()).unwrap();
    let nl = cni_kernel::Netlink::open_in(&handle).unwrap();
    let support = nl.block_on(flanneld::backend::wireguard::kernel_support(nl.conn()));
    if let Err(why) = &support {
        let has_module = Path::new("/sys/module/wireguard").exists();
        assert!(!has_module, "the wireguard module is loaded, yet: {why}");
        assert!(why.contains("no WireGuard"), "{why}");
    }
    assert!(
        ns.ip(&["-o", "link"])
            .lines()
            .all(|l| !l.contains("wgprobe")),
        "the probe left a link behind"
    );
}
