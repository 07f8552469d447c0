//! Several nodes on one machine: an "underlay" namespace holding a bridge, and per node a
//! namespace whose `eth0` is a veth onto that bridge (192.168.<net>.<n>/24 and/or
//! fd00:<net>::<n>/64 as the `Underlay` asks, default routes via the underlay's .254 / ::fe,
//! forwarding on). Optionally a real etcd runs in the underlay on the bridge's address, a remote
//! server for every node, or the Kubernetes API server stand-in (`kube_api`) holding a Node
//! object per node with its podCIDR. flanneld runs in a node with its own subnet.env and log; pods are made
//! through the real plugins with the stock flannel conflist, with an address of each family
//! their node's subnet.env has. The underlay's own addresses stand for the world outside the
//! cluster network: no route leads from there back to a pod, so a pod reaches them only through
//! its node's masquerade. Everything is unique-named and removed on drop: processes killed
//! first, then namespaces deleted, then the temporary directory.

use crate::kube_api::{KubeApi, User, FLANNEL_RULES};
use crate::{bin_dir, conflist, Invocation, TestNs};
use serde_json::{Map, Value};
use std::fs;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// The underlay's own address on the bridge: the nodes' default gateway and etcd's address.
const UNDERLAY_HOST: u8 = 254;
/// etcd's key prefix, flannel's default.
pub const ETCD_PREFIX: &str = "/coreos.com/network";
/// Debian's etcd-server.
pub const ETCD: &str = "/usr/bin/etcd";

/// An address family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub const BOTH: [Family; 2] = [Family::V4, Family::V6];

    /// The family of an address in text form (`10.5.3.2`, `fc00::2`).
    pub fn of(ip: &str) -> Family {
        if ip.contains(':') {
            Family::V6
        } else {
            Family::V4
        }
    }

    /// The IP header and the ICMP echo header a ping's packet carries besides its payload.
    pub fn ping_overhead(self) -> u64 {
        match self {
            Family::V4 => 20 + 8,
            Family::V6 => 40 + 8,
        }
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
    }
}

/// `ip` as it goes into a URL or a socat address: IPv6 in brackets.
pub fn host_port(ip: &str, port: u16) -> String {
    match Family::of(ip) {
        Family::V4 => format!("{ip}:{port}"),
        Family::V6 => format!("[{ip}]:{port}"),
    }
}

/// The families the underlay carries: on its bridge, the nodes' `eth0` and etcd's address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Underlay {
    /// 192.168.<net>.<n>/24 only.
    V4,
    /// 192.168.<net>.<n>/24 and fd00:<net>::<n>/64; etcd on the IPv4 address.
    Dual,
    /// fd00:<net>::<n>/64 only; etcd on the IPv6 address.
    V6,
}

impl Underlay {
    pub fn has(self, f: Family) -> bool {
        !matches!(
            (self, f),
            (Underlay::V4, Family::V6) | (Underlay::V6, Family::V4)
        )
    }

    /// Node `host`'s (1-based; 254 the underlay's own) address of family `f` on `net`.
    fn address(self, f: Family, net: u8, host: u8) -> Option<String> {
        self.has(f).then(|| match f {
            Family::V4 => format!("192.168.{net}.{host}"),
            Family::V6 => format!("fd00:{net}::{host:x}"),
        })
    }
}

/// Polls `f` until it returns Some, or panics after `timeout` saying what it waited for.
pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        if start.elapsed() > timeout {
            panic!("gave up after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Where the nodes keep their leases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Registry {
    /// flanneld's embedded registry: one directory shared by every node's daemon.
    Embedded,
    /// A real etcd in the underlay namespace, reached over the bridge.
    Etcd,
    /// The Kubernetes API server stand-in in the underlay namespace, on port 6443 of the
    /// bridge's address: a Node `node<n>` per node with its podCIDR, each node's flanneld with
    /// `--kube-subnet-mgr`, `NODE_NAME` and a kubeconfig of its own, allowed what
    /// kube-flannel's ClusterRole allows.
    Kube,
}

/// The API server stand-in's port in the underlay.
pub const KUBE_API_PORT: u16 = 6443;

/// The name of node `index`'s Node object.
pub fn kube_node_name(index: u8) -> String {
    format!("node{index}")
}

/// The podCIDRs the cluster's node IPAM gives node `index`: the `index`-th subnet of
/// `SubnetLen` (24, IPv6 64) of each network in `network_config` (flannel's net-conf.json).
pub fn pod_cidrs_for(network_config: &str, index: u8) -> Vec<String> {
    let cfg: Value = serde_json::from_str(network_config)
        .unwrap_or_else(|e| panic!("the network config {network_config}: {e}"));
    let mut out = Vec::new();
    if let Some(net) = cfg["Network"].as_str() {
        let (addr, _) = net.split_once('/').expect("Network is addr/len");
        let base: std::net::Ipv4Addr = addr.parse().expect("Network's address");
        let len = cfg["SubnetLen"].as_u64().unwrap_or(24) as u32;
        let step = 1u32 << (32 - len);
        let a = std::net::Ipv4Addr::from(u32::from(base) + u32::from(index) * step);
        out.push(format!("{a}/{len}"));
    }
    if let Some(net) = cfg["IPv6Network"].as_str() {
        let (addr, _) = net.split_once('/').expect("IPv6Network is addr/len");
        let base: std::net::Ipv6Addr = addr.parse().expect("IPv6Network's address");
        let len = cfg["IPv6SubnetLen"].as_u64().unwrap_or(64) as u32;
        let step = 1u128 << (128 - len);
        let a = std::net::Ipv6Addr::from(u128::from(base) + u128::from(index) * step);
        out.push(format!("{a}/{len}"));
    }
    out
}

/// The subnet key (`10.5.3.0-24`, `fc00:0:0:3::-64`) of an address with its prefix
/// (`10.5.3.1/24`, `fc00:0:0:3::1/64`).
pub fn subnet_key(cidr: &str) -> String {
    let (ip, len) = cidr
        .split_once('/')
        .unwrap_or_else(|| panic!("{cidr:?} is not addr/len"));
    let ip: IpAddr = ip
        .parse()
        .unwrap_or_else(|e| panic!("{ip:?} in {cidr:?}: {e}"));
    let len: u32 = len
        .parse()
        .unwrap_or_else(|e| panic!("{len:?} in {cidr:?}: {e}"));
    let network = match ip {
        IpAddr::V4(a) => {
            let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
            IpAddr::from(std::net::Ipv4Addr::from(u32::from(a) & mask))
        }
        IpAddr::V6(a) => {
            let mask = u128::MAX.checked_shl(128 - len).unwrap_or(0);
            IpAddr::from(std::net::Ipv6Addr::from(u128::from(a) & mask))
        }
    };
    format!("{network}-{len}")
}

/// The lease key of a Node's podCIDRs, as flannel writes keys: IPv4 first, `0.0.0.0-0`
/// standing for none.
fn kube_lease_key(node: &Value) -> Option<String> {
    let cidrs: Vec<&str> = node["spec"]["podCIDRs"]
        .as_array()?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let of = |f| {
        cidrs
            .iter()
            .find(|c| Family::of(c) == f)
            .map(|c| subnet_key(c))
    };
    match (of(Family::V4), of(Family::V6)) {
        (Some(v4), Some(v6)) => Some(format!("{v4}&{v6}")),
        (Some(v4), None) => Some(v4),
        (None, Some(v6)) => Some(format!("0.0.0.0-0&{v6}")),
        (None, None) => None,
    }
}

/// Packets the kernel has dropped so far because a CPU's input backlog was full
/// (`/proc/net/softnet_stat`, second column, summed). The backlogs are the machine's, shared by
/// every namespace: when other tests flood their veths, a test's own packet can be dropped there,
/// through no fault of the code under test.
pub fn backlog_drops() -> u64 {
    fs::read_to_string("/proc/net/softnet_stat")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| u64::from_str_radix(l.split_whitespace().nth(1)?, 16).ok())
        .sum()
}

/// A child process killed (and reaped) on drop.
struct Process {
    child: Option<Child>,
}

impl Process {
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One machine of the cluster.
pub struct Node {
    /// 1-based; the last byte of the node's address and part of its file names.
    pub index: u8,
    pub ns: TestNs,
    /// The address of `eth0`, the node's public IP: the IPv4 one, or on an IPv6-only underlay
    /// the IPv6 one.
    pub ip: String,
    /// The IPv6 address of `eth0`, when the underlay carries IPv6.
    pub ip6: Option<String>,
    /// The node's own files: subnet.env, flanneld's log, the plugins' data directories.
    pub dir: PathBuf,
    daemon: Option<Process>,
    /// With `Registry::Kube`: the node's account at the API server.
    kube_user: Option<User>,
    /// flanneld's extra environment and the command it is started through, kept across
    /// restarts (`set_flanneld_env`, `set_flanneld_wrapper`).
    daemon_env: Vec<(String, String)>,
    daemon_wrapper: Vec<String>,
    /// With `Registry::Kube`: flanneld gets no `--kubeconfig-file` (`set_flanneld_in_cluster`).
    kube_in_cluster: bool,
    /// flanneld's `--iface` (`eth0`); None: it finds the interface itself (`set_flanneld_iface`).
    iface: Option<String>,
    /// The node's own CNI bin directory, instead of the cluster's (`set_node_plugins`).
    plugins: Option<PathBuf>,
}

impl Node {
    /// With `Registry::Kube`: the account this node's flanneld uses (its token, its
    /// kubeconfig).
    pub fn kube_user(&self) -> Option<&User> {
        self.kube_user.as_ref()
    }

    pub fn subnet_file(&self) -> PathBuf {
        self.dir.join("subnet.env")
    }

    pub fn log_file(&self) -> PathBuf {
        self.dir.join("flanneld.log")
    }

    pub fn log(&self) -> String {
        fs::read_to_string(self.log_file()).unwrap_or_default()
    }

    /// Waits until flanneld's log holds `needle`; panics with the log when it does not.
    pub fn wait_log(&self, needle: &str, timeout: Duration) {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if self.log().contains(needle) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "gave up after {timeout:?} waiting for {needle:?} in node {}'s flanneld log {}:\n{}",
            self.index,
            self.log_file().display(),
            self.log()
        );
    }

    /// subnet.env once flanneld has written it (with a subnet of either family).
    pub fn wait_subnet_env(&self, timeout: Duration) -> String {
        let file = self.subnet_file();
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Ok(t) = fs::read_to_string(&file) {
                if t.contains("FLANNEL_SUBNET=") || t.contains("FLANNEL_IPV6_SUBNET=") {
                    return t;
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "gave up after {timeout:?} waiting for node {}'s {}; flanneld log:\n{}",
            self.index,
            file.display(),
            self.log()
        );
    }

    /// One variable of subnet.env (waiting for the file), e.g. `FLANNEL_SUBNET`.
    pub fn subnet_env(&self, key: &str, timeout: Duration) -> String {
        let env = self.wait_subnet_env(timeout);
        env.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("no {key} in node {}'s subnet.env:\n{env}", self.index))
            .to_string()
    }

    /// One variable of subnet.env (waiting for the file), or None when it has none.
    pub fn subnet_env_opt(&self, key: &str, timeout: Duration) -> Option<String> {
        let env = self.wait_subnet_env(timeout);
        env.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .map(str::to_string)
    }

    /// The key of this node's lease as flannel writes it: `10.5.3.0-24`,
    /// `10.5.3.0-24&fc00:0:0:3::-64`, or `0.0.0.0-0&fc00:0:0:3::-64` without IPv4.
    pub fn lease_key(&self, timeout: Duration) -> String {
        let v4 = self.subnet_env_opt("FLANNEL_SUBNET", timeout);
        let v6 = self.subnet_env_opt("FLANNEL_IPV6_SUBNET", timeout);
        let mut key = v4.map_or_else(|| "0.0.0.0-0".to_string(), |s| subnet_key(&s));
        if let Some(s) = v6 {
            key = format!("{key}&{}", subnet_key(&s));
        }
        key
    }

    /// This node's subnet of family `f` (`10.5.3.0/24`, `fc00:0:0:3::/64`), if its lease has one.
    pub fn subnet(&self, f: Family, timeout: Duration) -> Option<String> {
        let var = match f {
            Family::V4 => "FLANNEL_SUBNET",
            Family::V6 => "FLANNEL_IPV6_SUBNET",
        };
        self.subnet_env_opt(var, timeout)
            .map(|s| subnet_key(&s).replacen('-', "/", 1))
    }

    /// `ip route` in the node.
    pub fn routes(&self) -> String {
        self.ns.ip(&["route", "show"])
    }

    /// `ip -6 route` in the node.
    pub fn routes6(&self) -> String {
        self.ns.ip(&["-6", "route", "show"])
    }

    /// The routes of family `f` whose destination is `subnet` (`10.5.3.0/24`,
    /// `fc00:0:0:3::/64`), as `ip -j route` gives them.
    pub fn routes_to(&self, f: Family, subnet: &str) -> Vec<Value> {
        let family = if f == Family::V6 { "-6" } else { "-4" };
        self.ns
            .ip_json(&[family, "route", "show"])
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["dst"] == subnet)
            .cloned()
            .collect()
    }

    /// The address of `eth0` of family `f`.
    pub fn addr(&self, f: Family) -> Option<&str> {
        match f {
            Family::V6 => self.ip6.as_deref(),
            Family::V4 => Some(self.ip.as_str()).filter(|ip| Family::of(ip) == Family::V4),
        }
    }

    /// `ip neigh` in the node (all devices, permanent entries included).
    pub fn neighbours(&self) -> String {
        self.ns.ip(&["neigh", "show"])
    }

    /// `bridge fdb` entries on the node's vxlan devices (empty when there are none).
    pub fn fdb(&self) -> String {
        let links = self.ns.ip(&["-o", "link", "show", "type", "vxlan"]);
        links
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|dev| dev.split('@').next().unwrap_or(dev))
            .map(|dev| self.ns.run("bridge", &["fdb", "show", "dev", dev]))
            .collect()
    }
}

/// A pod: its namespace, made through the conflist on one node.
pub struct Pod {
    pub ns: TestNs,
    /// 1-based index of the node it runs on.
    pub node: u8,
    pub container_id: String,
    /// Its first address on `eth0`, without the prefix length: the IPv4 one when it has one.
    pub ip: String,
    /// Every address on `eth0` the result lists, without prefix lengths, IPv4 first.
    pub ips: Vec<String>,
    /// The conflist's result.
    pub result: Value,
    servers: Vec<Process>,
}

impl Pod {
    /// Its address of family `f`, if it has one.
    pub fn addr(&self, f: Family) -> Option<&str> {
        self.ips
            .iter()
            .map(String::as_str)
            .find(|ip| Family::of(ip) == f)
    }

    /// The families it has an address of.
    pub fn families(&self) -> Vec<Family> {
        Family::BOTH
            .into_iter()
            .filter(|&f| self.addr(f).is_some())
            .collect()
    }

    /// Does one ping to `ip` (either family) get an answer within `wait_s` seconds?
    pub fn ping(&self, ip: &str, wait_s: u32) -> bool {
        self.ns
            .try_run(
                "busybox",
                &["ping", "-c", "1", "-W", &wait_s.to_string(), ip],
            )
            .status
            .success()
    }

    /// Serves `reply` (shell text: `$SOCAT_PEERADDR` is the client's address) to every TCP
    /// connection on `port`, over each family it has an address of, until the pod is dropped.
    pub fn serve_tcp(&mut self, port: u16, reply: &str) {
        let families = self.families();
        for &f in &families {
            self.servers.push(serve(&self.ns, f, port, reply));
        }
        wait_listening(&self.ns, port, families.len());
    }

    /// What a TCP connection to `ip:port` (either family) reads, connecting for at most 3 s,
    /// or None.
    pub fn tcp_read(&self, ip: &str, port: u16) -> Option<String> {
        let proto = match Family::of(ip) {
            Family::V4 => "TCP4",
            Family::V6 => "TCP6",
        };
        let out: Output = self.ns.try_run(
            "socat",
            &[
                "-T",
                "3",
                "-u",
                &format!("{proto}:{},connect-timeout=3", host_port(ip, port)),
                "STDOUT",
            ],
        );
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// Does a ping of a whole `packet` bytes (IP header included) with Don't Fragment set
    /// (IPv6 never fragments on the way) get an answer from `ip`? Tries every 50 ms for up to
    /// 2 s, so that a first packet held up by neighbour discovery does not count as lost.
    pub fn crosses_with_df(&self, ip: &str, packet: u64) -> bool {
        let payload = packet.saturating_sub(Family::of(ip).ping_overhead());
        self.ns
            .try_run(
                "ping",
                &[
                    "-c",
                    "1",
                    "-i",
                    "0.05",
                    "-w",
                    "2",
                    "-M",
                    "do",
                    "-s",
                    &payload.to_string(),
                    ip,
                ],
            )
            .status
            .success()
    }

    /// The MTU of the pod's `eth0`.
    pub fn mtu(&self) -> u64 {
        self.ns
            .link("eth0")
            .and_then(|l| l["mtu"].as_u64())
            .unwrap_or_else(|| panic!("no eth0 with an MTU in pod {}", self.ns.name()))
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        for s in &mut self.servers {
            s.kill();
        }
    }
}

/// socat in `ns` answering `reply` (shell text) to each TCP connection on `port` of family `f`.
fn serve(ns: &TestNs, f: Family, port: u16, reply: &str) -> Process {
    let listen = match f {
        Family::V4 => format!("TCP4-LISTEN:{port},fork,reuseaddr"),
        Family::V6 => format!("TCP6-LISTEN:{port},fork,reuseaddr,ipv6only=1"),
    };
    let child = ns
        .command("socat")
        .arg(listen)
        .arg(format!("SYSTEM:echo {reply}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("starting socat in {}: {e}", ns.name()));
    Process { child: Some(child) }
}

/// Waits until `sockets` TCP sockets listen on `port` in `ns`.
fn wait_listening(ns: &TestNs, port: u16, sockets: usize) {
    wait_for(
        &format!(
            "{sockets} socat listener(s) on port {port} in {}",
            ns.name()
        ),
        Duration::from_secs(10),
        || {
            let out = ns.run("ss", &["-Htln", &format!("sport = :{port}")]);
            (out.lines().count() >= sockets).then_some(())
        },
    );
}

/// A real etcd: one member in the underlay namespace, or (`Cluster::with_etcd_members`) a
/// cluster of members, each in a namespace of its own on the underlay's bridge.
struct Etcd {
    members: Vec<EtcdMember>,
    /// Every member's client URL, comma-separated, as `--etcd-endpoints` takes them.
    url: String,
}

/// One etcd member and how it is started again (with its data, after a kill).
struct EtcdMember {
    /// Its own namespace, `eth0` plugged into the bridge as port `e<n>`; none for the single
    /// member in the underlay.
    ns: Option<TestNs>,
    args: Vec<String>,
    client_url: String,
    log: PathBuf,
    process: Process,
}

/// The host byte of etcd member `n`'s address (1-based) on the underlay.
const ETCD_MEMBER_HOST: u8 = 240;

/// Nodes on one underlay bridge, optionally an etcd, flanneld per node, pods per node.
/// Fields drop in this order: pods, nodes (their daemons die first), etcd, the API server,
/// underlay, files.
pub struct Cluster {
    pods: Vec<Pod>,
    nodes: Vec<Node>,
    etcd: Option<Etcd>,
    kube: Option<KubeApi>,
    pub underlay: TestNs,
    /// Listeners in the underlay (`serve_outside`).
    outside_servers: Vec<Process>,
    prefix: String,
    net: u8,
    families: Underlay,
    registry: Registry,
    network_config: String,
    plugins: PathBuf,
    conflist: Value,
    dir: tempfile::TempDir,
}

impl Cluster {
    /// `nodes` nodes on 192.168.<net>.0/24, leases in `registry` under `network_config`
    /// (flannel's net-conf.json, e.g. `{"Network":"10.5.0.0/16","Backend":{"Type":"vxlan"}}`).
    /// Namespace names start with `prefix`. With `Registry::Etcd`, etcd is running and holds
    /// the config when this returns; with `Registry::Embedded`, the shared directory does.
    pub fn new(
        prefix: &str,
        net: u8,
        nodes: u8,
        registry: Registry,
        network_config: &str,
    ) -> Cluster {
        Cluster::on(Underlay::V4, prefix, net, nodes, registry, network_config)
    }

    /// As `new`, on an underlay of the families `underlay` names (fd00:<net>::/64 for IPv6).
    pub fn on(
        underlay: Underlay,
        prefix: &str,
        net: u8,
        nodes: u8,
        registry: Registry,
        network_config: &str,
    ) -> Cluster {
        Cluster::build(underlay, prefix, net, nodes, registry, network_config, 0)
    }

    /// As `on` with `Registry::Etcd`, the leases in an etcd cluster of `members` members as
    /// operators run it: each member in a namespace of its own on the bridge (host 241, 242,
    /// ... of the underlay's first family), every node's flanneld given every member's endpoint.
    pub fn with_etcd_members(
        underlay: Underlay,
        prefix: &str,
        net: u8,
        nodes: u8,
        members: u8,
        network_config: &str,
    ) -> Cluster {
        assert!(members > 0, "an etcd cluster has at least one member");
        let r = Registry::Etcd;
        Cluster::build(underlay, prefix, net, nodes, r, network_config, members)
    }

    fn build(
        underlay: Underlay,
        prefix: &str,
        net: u8,
        nodes: u8,
        registry: Registry,
        network_config: &str,
        etcd_members: u8,
    ) -> Cluster {
        let families = underlay;
        let underlay = TestNs::new(&format!("{prefix}u"));
        underlay.ip(&["link", "add", "br0", "type", "bridge"]);
        for f in Family::BOTH {
            if let Some(a) = families.address(f, net, UNDERLAY_HOST) {
                add_address(&underlay, &a, "br0");
            }
        }
        underlay.ip(&["link", "set", "br0", "up"]);
        let conflist_path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/10-flannel.conflist");
        let conflist: Value = serde_json::from_str(
            &fs::read_to_string(&conflist_path)
                .unwrap_or_else(|e| panic!("reading {}: {e}", conflist_path.display())),
        )
        .unwrap_or_else(|e| panic!("{}: {e}", conflist_path.display()));
        let mut c = Cluster {
            pods: Vec::new(),
            nodes: Vec::new(),
            etcd: None,
            kube: None,
            underlay,
            outside_servers: Vec::new(),
            prefix: prefix.to_string(),
            net,
            families,
            registry,
            network_config: network_config.to_string(),
            plugins: bin_dir(),
            conflist,
            dir: tempfile::tempdir().expect("a temporary directory"),
        };
        match registry {
            Registry::Embedded => {
                let reg = c.registry_dir();
                fs::create_dir_all(&reg)
                    .unwrap_or_else(|e| panic!("creating {}: {e}", reg.display()));
                fs::write(reg.join("config"), network_config)
                    .unwrap_or_else(|e| panic!("writing {}/config: {e}", reg.display()));
            }
            Registry::Etcd => {
                c.start_etcd(etcd_members);
                c.etcdctl(&[
                    "put",
                    &format!("{ETCD_PREFIX}/config"),
                    "--",
                    network_config,
                ]);
            }
            Registry::Kube => {
                fs::write(c.net_conf_file(), network_config)
                    .unwrap_or_else(|e| panic!("writing {}: {e}", c.net_conf_file().display()));
                let dir = c.dir.path().join("kube");
                fs::create_dir_all(&dir)
                    .unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
                let host = Family::BOTH
                    .into_iter()
                    .find_map(|f| c.outside(f))
                    .expect("an underlay of at least one family");
                let addr = host_port(&host, KUBE_API_PORT)
                    .parse()
                    .expect("the API server's address");
                c.kube = Some(KubeApi::start(Some(c.underlay.path()), addr, &dir));
            }
        }
        for _ in 0..nodes {
            c.add_node();
        }
        c
    }

    /// Takes the plugins from `dir` instead of the workspace's build directory.
    pub fn plugins_from(mut self, dir: &Path) -> Cluster {
        self.plugins = dir.to_path_buf();
        self
    }

    pub fn registry(&self) -> Registry {
        self.registry
    }

    /// The families the underlay carries.
    pub fn underlay_families(&self) -> Underlay {
        self.families
    }

    /// The underlay's own address of family `f`: outside the cluster network, with no route
    /// back to any pod, so that a pod reaches it only through its node's masquerade.
    pub fn outside(&self, f: Family) -> Option<String> {
        self.families.address(f, self.net, UNDERLAY_HOST)
    }

    /// Listens on `port` of every outside address (`outside`), answering each connection with
    /// the address it came from, until the cluster is dropped.
    pub fn serve_outside(&mut self, port: u16) {
        let families: Vec<Family> = Family::BOTH
            .into_iter()
            .filter(|&f| self.families.has(f))
            .collect();
        for &f in &families {
            let server = serve(&self.underlay, f, port, "$SOCAT_PEERADDR");
            self.outside_servers.push(server);
        }
        wait_listening(&self.underlay, port, families.len());
    }

    /// The source address the outside address of family `f` sees on a connection from pod
    /// `pod` to its `port` (`serve_outside`), or None when the connection fails.
    pub fn seen_from_outside(&self, pod: usize, f: Family, port: u16) -> Option<IpAddr> {
        let outside = self.outside(f)?;
        let seen = self.pods[pod].tcp_read(&outside, port)?;
        seen.trim_start_matches('[')
            .trim_end_matches(']')
            .parse()
            .ok()
    }

    pub fn network_config(&self) -> &str {
        &self.network_config
    }

    /// With `Registry::Kube`: the API server stand-in.
    pub fn kube(&self) -> &KubeApi {
        self.kube.as_ref().expect("this cluster has no API server")
    }

    pub fn kube_mut(&mut self) -> &mut KubeApi {
        self.kube.as_mut().expect("this cluster has no API server")
    }

    /// With `Registry::Kube`: net-conf.json, as the ConfigMap gives it to flanneld.
    pub fn net_conf_file(&self) -> PathBuf {
        self.dir.path().join("net-conf.json")
    }

    /// With `Registry::Kube`: creates node `index`'s Node object, with the podCIDRs of
    /// `pod_cidrs_for` when `with_cidr` (else none yet, as before the node IPAM assigns them).
    pub fn create_kube_node(&self, index: u8, with_cidr: bool) {
        let name = kube_node_name(index);
        let node = self.node(index);
        let mut obj = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "spec": {},
            "status": {"addresses": [{"type": "InternalIP", "address": node.ip}]},
        });
        if with_cidr {
            obj["spec"]["podCIDRs"] = pod_cidrs_for(&self.network_config, index).into();
        }
        self.kube().create_node(obj);
    }

    /// With `Registry::Kube`: gives node `index` its podCIDRs, as the node IPAM does.
    pub fn assign_pod_cidrs(&self, index: u8) {
        let cidrs = pod_cidrs_for(&self.network_config, index);
        self.kube()
            .patch_node(
                &kube_node_name(index),
                false,
                &serde_json::json!({"spec": {"podCIDRs": cidrs}}),
            )
            .unwrap_or_else(|e| panic!("assigning node {index} its podCIDRs: {}", e.message));
    }

    /// The embedded registry's shared directory.
    pub fn registry_dir(&self) -> PathBuf {
        self.dir.path().join("registry")
    }

    /// etcd's client URLs (one per member, comma-separated), as the nodes reach them.
    pub fn etcd_url(&self) -> Option<&str> {
        self.etcd.as_ref().map(|e| e.url.as_str())
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Node `index` (1-based).
    pub fn node(&self, index: u8) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.index == index)
            .unwrap_or_else(|| panic!("no node {index} in the cluster"))
    }

    fn node_mut(&mut self, index: u8) -> &mut Node {
        self.nodes
            .iter_mut()
            .find(|n| n.index == index)
            .unwrap_or_else(|| panic!("no node {index} in the cluster"))
    }

    pub fn pods(&self) -> &[Pod] {
        &self.pods
    }

    pub fn pod_mut(&mut self, i: usize) -> &mut Pod {
        &mut self.pods[i]
    }

    /// Starts etcd: `members` 0, one member in the underlay on the bridge's address; else that
    /// many members, each in its own namespace. Returns when every member is healthy.
    fn start_etcd(&mut self, members: u8) {
        assert!(
            Path::new(ETCD).exists(),
            "{ETCD} is missing: scripts/deps.sh tests installs Debian's etcd-server"
        );
        let family = Family::BOTH
            .into_iter()
            .find(|&f| self.families.has(f))
            .expect("an underlay of at least one family");
        let host = |n: u8| {
            self.families
                .address(family, self.net, n)
                .expect("the underlay's family")
        };
        let mut placed = Vec::new();
        if members == 0 {
            placed.push((
                "underlay".to_string(),
                None,
                host(UNDERLAY_HOST),
                "127.0.0.1".into(),
            ));
        }
        for n in 1..=members {
            let ns = TestNs::new(&format!("{}e{n}", self.prefix));
            self.plug(&format!("e{n}"), &ns, "eth0");
            let addr = host(ETCD_MEMBER_HOST + n);
            add_address(&ns, &addr, "eth0");
            ns.ip(&["link", "set", "eth0", "up"]);
            placed.push((format!("m{n}"), Some(ns), addr.clone(), addr));
        }
        let initial_cluster = placed
            .iter()
            .map(|(name, _, _, peer)| format!("{name}=http://{}", host_port(peer, 2380)))
            .collect::<Vec<_>>()
            .join(",");
        for (name, ns, client, peer) in placed {
            let client_url = format!("http://{}", host_port(&client, 2379));
            let peer_url = format!("http://{}", host_port(&peer, 2380));
            let data = self.dir.path().join(format!("etcd-{name}"));
            let mut args: Vec<String> = vec!["--name".into(), name.clone(), "--data-dir".into()];
            args.push(data.display().to_string());
            for (flag, value) in [
                ("--listen-client-urls", &client_url),
                ("--advertise-client-urls", &client_url),
                ("--listen-peer-urls", &peer_url),
                ("--initial-advertise-peer-urls", &peer_url),
                ("--initial-cluster", &initial_cluster),
                ("--initial-cluster-token", &self.prefix),
                ("--log-level", &"warn".to_string()),
            ] {
                args.extend([flag.to_string(), value.clone()]);
            }
            if members > 0 {
                // Heartbeats and elections at twice etcd's defaults: a loaded machine delays
                // the heartbeats of a member now and then, and no election should come of it.
                args.extend([
                    "--heartbeat-interval=200".into(),
                    "--election-timeout=2000".into(),
                ]);
            }
            let mut member = EtcdMember {
                ns,
                args,
                client_url,
                log: self.dir.path().join(format!("etcd-{name}.log")),
                process: Process { child: None },
            };
            self.spawn_etcd(&mut member);
            let etcd = self.etcd.get_or_insert_with(|| Etcd {
                members: Vec::new(),
                url: String::new(),
            });
            etcd.members.push(member);
        }
        let etcd = self.etcd.as_mut().expect("etcd members");
        etcd.url = etcd
            .members
            .iter()
            .map(|m| m.client_url.as_str())
            .collect::<Vec<_>>()
            .join(",");
        for n in 1..=members.max(1) {
            self.wait_etcd_member_healthy(n, Duration::from_secs(60));
        }
    }

    fn spawn_etcd(&self, member: &mut EtcdMember) {
        let log_file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&member.log)
            .unwrap_or_else(|e| panic!("opening {}: {e}", member.log.display()));
        let ns = member.ns.as_ref().unwrap_or(&self.underlay);
        let child = ns
            .command(ETCD)
            .args(&member.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {ETCD} in {}: {e}", ns.name()));
        member.process = Process { child: Some(child) };
    }

    fn etcd_member(&self, n: u8) -> &EtcdMember {
        let members = &self
            .etcd
            .as_ref()
            .expect("this cluster has no etcd")
            .members;
        usize::from(n)
            .checked_sub(1)
            .and_then(|i| members.get(i))
            .unwrap_or_else(|| panic!("no etcd member {n} (1 to {})", members.len()))
    }

    fn etcd_member_mut(&mut self, n: u8) -> &mut EtcdMember {
        let members = &mut self
            .etcd
            .as_mut()
            .expect("this cluster has no etcd")
            .members;
        let count = members.len();
        usize::from(n)
            .checked_sub(1)
            .and_then(|i| members.get_mut(i))
            .unwrap_or_else(|| panic!("no etcd member {n} (1 to {count})"))
    }

    /// How many members the etcd cluster has.
    pub fn etcd_members(&self) -> u8 {
        self.etcd.as_ref().map_or(0, |e| e.members.len() as u8)
    }

    /// Member `n`'s client URL (1-based).
    pub fn etcd_member_url(&self, n: u8) -> String {
        self.etcd_member(n).client_url.clone()
    }

    /// Kills member `n` (SIGKILL, as a crash or an OOM kill), its data kept.
    pub fn kill_etcd_member(&mut self, n: u8) {
        self.etcd_member_mut(n).process.kill();
    }

    /// Starts member `n` again on its data, as systemd would after a crash.
    pub fn restart_etcd_member(&mut self, n: u8) {
        let mut member = std::mem::replace(
            self.etcd_member_mut(n),
            EtcdMember {
                ns: None,
                args: Vec::new(),
                client_url: String::new(),
                log: PathBuf::new(),
                process: Process { child: None },
            },
        );
        member.process.kill();
        self.spawn_etcd(&mut member);
        *self.etcd_member_mut(n) = member;
    }

    /// Cuts member `n` off the network (`up` false: its port on the bridge down, so neither
    /// its peers nor the nodes reach it) or plugs it back.
    pub fn set_etcd_member_link(&self, n: u8, up: bool) {
        assert!(
            self.etcd_member(n).ns.is_some(),
            "member {n} has no link of its own"
        );
        let state = if up { "up" } else { "down" };
        self.underlay.ip(&["link", "set", &format!("e{n}"), state]);
    }

    /// Whether member `n` answers a linearizable read now (so it has a leader).
    pub fn etcd_member_healthy(&self, n: u8) -> bool {
        let url = self.etcd_member(n).client_url.clone();
        self.try_etcdctl_at(&url, &["endpoint", "health", "--command-timeout=2s"])
            .status
            .success()
    }

    /// Waits until member `n` is healthy, saying which when it is not within `timeout`.
    pub fn wait_etcd_member_healthy(&self, n: u8, timeout: Duration) {
        let log = self.etcd_member(n).log.clone();
        wait_for(
            &format!(
                "etcd member {n} ({}) to be healthy (log {})",
                self.etcd_member(n).client_url,
                log.display()
            ),
            timeout,
            || self.etcd_member_healthy(n).then_some(()),
        );
    }

    /// The member that leads the etcd cluster now, if the members reached agree on one.
    pub fn etcd_leader(&self) -> Option<u8> {
        let out = self.try_etcdctl(&["endpoint", "status", "-w", "json", "--command-timeout=2s"]);
        let statuses: Vec<Value> = serde_json::from_slice(&out.stdout).ok()?;
        let leader = statuses
            .iter()
            .find(|s| s["Status"]["leader"] == s["Status"]["header"]["member_id"])?;
        let url = leader["Endpoint"].as_str()?;
        (1..=self.etcd_members()).find(|&n| self.etcd_member(n).client_url == url)
    }

    fn try_etcdctl(&self, args: &[&str]) -> Output {
        let url = self.etcd_url().expect("this cluster has no etcd");
        self.try_etcdctl_at(url, args)
    }

    /// etcdctl against the members at `urls` (comma-separated), from the underlay; its output.
    pub fn try_etcdctl_at(&self, urls: &str, args: &[&str]) -> Output {
        // The last --command-timeout given wins: a caller's own comes after the default.
        self.underlay
            .command("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg("--endpoints")
            .arg(urls)
            .arg("--command-timeout=5s")
            .args(args)
            .output()
            .expect("running etcdctl")
    }

    /// etcdctl against the underlay's etcd; its stdout, panicking when it fails.
    pub fn etcdctl(&self, args: &[&str]) -> String {
        let out = self.try_etcdctl(args);
        assert!(
            out.status.success(),
            "etcdctl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Adds a node joined to the underlay; returns its index.
    pub fn add_node(&mut self) -> u8 {
        let index = self.nodes.iter().map(|n| n.index).max().unwrap_or(0) + 1;
        assert!(index < UNDERLAY_HOST, "too many nodes");
        let ns = TestNs::new(&format!("{}n{index}", self.prefix));
        self.wire_eth0(&ns, index);
        let addr = |f| self.families.address(f, self.net, index);
        let (ip4, ip6) = (addr(Family::V4), addr(Family::V6));
        ns.run(
            "sysctl",
            &[
                "-qw",
                "net.ipv4.ip_forward=1",
                "net.ipv6.conf.all.forwarding=1",
            ],
        );
        let dir = self.dir.path().join(format!("node{index}"));
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        let ip = ip4.or_else(|| ip6.clone()).unwrap_or_default();
        let kube_user = self.kube.as_mut().map(|api| {
            api.add_user(
                &format!("system:serviceaccount:flannel-cni-rs:flanneld-node{index}"),
                Some(FLANNEL_RULES),
            )
        });
        self.nodes.push(Node {
            index,
            ns,
            ip,
            ip6,
            dir,
            daemon: None,
            kube_user,
            daemon_env: Vec::new(),
            daemon_wrapper: Vec::new(),
            kube_in_cluster: false,
            iface: Some("eth0".into()),
            plugins: None,
        });
        if self.kube.is_some() {
            self.create_kube_node(index, true);
        }
        index
    }

    /// Node `index`'s `eth0` on the underlay: its addresses, up, the default routes.
    fn wire_eth0(&self, ns: &TestNs, index: u8) {
        self.plug(&format!("n{index}"), ns, "eth0");
        for f in Family::BOTH {
            if let Some(a) = self.families.address(f, self.net, index) {
                add_address(ns, &a, "eth0");
            }
        }
        ns.ip(&["link", "set", "eth0", "up"]);
        for f in Family::BOTH {
            if let Some(gw) = self.outside(f) {
                let family = if f == Family::V6 { "-6" } else { "-4" };
                ns.ip(&[family, "route", "add", "default", "via", &gw, "dev", "eth0"]);
            }
        }
    }

    /// Deletes node `index`'s `eth0` and makes it again as it was (a new index), as a VLAN or
    /// bond taken down and up, or a NIC driver reloaded, does.
    pub fn remake_eth0(&self, index: u8) {
        let ns = &self.node(index).ns;
        ns.ip(&["link", "del", "eth0"]);
        self.wire_eth0(ns, index);
    }

    /// The arguments flanneld gets on node `index`, before `extra`.
    pub fn flanneld_args(&self, index: u8) -> Vec<String> {
        let node = self.node(index);
        let mut args: Vec<String> = match self.registry {
            Registry::Embedded => vec![
                "--registry-dir".into(),
                self.registry_dir().display().to_string(),
            ],
            Registry::Etcd => vec![
                "--etcd-endpoints".into(),
                self.etcd_url().unwrap_or_default().to_string(),
            ],
            Registry::Kube => {
                let mut a: Vec<String> = vec!["--kube-subnet-mgr".into()];
                if let Some(u) = node.kube_user.as_ref().filter(|_| !node.kube_in_cluster) {
                    a.extend([
                        "--kubeconfig-file".into(),
                        u.kubeconfig.display().to_string(),
                    ]);
                }
                a.extend([
                    "--net-config-path".into(),
                    self.net_conf_file().display().to_string(),
                ]);
                a
            }
        };
        if let Some(iface) = &node.iface {
            args.extend(["--iface".into(), iface.clone()]);
        }
        args.extend([
            "--subnet-file".into(),
            node.subnet_file().display().to_string(),
        ]);
        args
    }

    /// Starts `flanneld` (the binary at that path) on node `index`, logging to the node's
    /// flanneld.log; a daemon already running there is killed first.
    pub fn start_flanneld(&mut self, index: u8, flanneld: &Path, extra: &[&str]) {
        self.stop_flanneld(index);
        let args = self.flanneld_args(index);
        let node = self.node_mut(index);
        let log = node.log_file();
        let log_file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap_or_else(|e| panic!("opening {}: {e}", log.display()));
        let mut cmd = match node.daemon_wrapper.split_first() {
            Some((program, wrapper_args)) => {
                let mut c = node.ns.command(program);
                c.args(wrapper_args).arg(flanneld);
                c
            }
            None => node.ns.command(flanneld),
        };
        let child = cmd
            .args(&args)
            .args(extra)
            .env("NODE_NAME", kube_node_name(index))
            .envs(node.daemon_env.iter().map(|(k, v)| (k, v)))
            .env_remove("NOTIFY_SOCKET")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {} on node {index}: {e}", flanneld.display()));
        node.daemon = Some(Process { child: Some(child) });
    }

    /// Is node `index`'s flanneld still running?
    pub fn flanneld_running(&mut self, index: u8) -> bool {
        self.node_mut(index)
            .daemon
            .as_mut()
            .is_some_and(Process::running)
    }

    /// Sets `key` in the environment of node `index`'s flanneld from its next start on.
    pub fn set_flanneld_env(&mut self, index: u8, key: &str, value: &str) {
        let env = &mut self.node_mut(index).daemon_env;
        env.retain(|(k, _)| k != key);
        env.push((key.to_string(), value.to_string()));
    }

    /// Gives node `index` `--iface <iface>` from its next start on (`eth0` until then), or with
    /// None no `--iface`: flanneld then takes the interface holding `--public-ip`, else the one
    /// of the default route.
    pub fn set_flanneld_iface(&mut self, index: u8, iface: Option<&str>) {
        self.node_mut(index).iface = iface.map(str::to_string);
    }

    /// Gives node `index` a second port on the underlay bridge: `name` in the node, holding
    /// `addrs` (with their prefixes), up. The node then answers ARP for an address only on the
    /// port that holds it (`arp_ignore=1`, `arp_announce=2`, as a host with two NICs on one
    /// segment is set up), so that whoever sends to that address reaches that port.
    pub fn add_port(&self, index: u8, name: &str, addrs: &[&str]) {
        let node = self.node(index);
        self.plug(&format!("n{index}{name}"), &node.ns, name);
        for a in addrs {
            let mut args = vec!["addr", "add", a, "dev", name];
            if a.contains(':') {
                args.push("nodad");
            }
            node.ns.ip(&args);
        }
        node.ns.ip(&["link", "set", name, "up"]);
        node.ns.run(
            "sysctl",
            &[
                "-qw",
                "net.ipv4.conf.all.arp_ignore=1",
                "net.ipv4.conf.all.arp_announce=2",
            ],
        );
    }

    /// A veth from the underlay bridge (`port`, up) into `ns` (`name`, down).
    fn plug(&self, port: &str, ns: &TestNs, name: &str) {
        self.underlay.ip(&[
            "link",
            "add",
            port,
            "type",
            "veth",
            "peer",
            "name",
            name,
            "netns",
            &ns.path_str(),
        ]);
        self.underlay
            .ip(&["link", "set", port, "master", "br0", "up"]);
    }

    /// Starts node `index`'s flanneld through `wrapper` from its next start on: the wrapper's
    /// program and arguments, then flanneld's path and arguments (e.g. `unshare -m ...`).
    pub fn set_flanneld_wrapper(&mut self, index: u8, wrapper: &[&str]) {
        self.node_mut(index).daemon_wrapper = wrapper.iter().map(|w| w.to_string()).collect();
    }

    /// Starts node `index`'s flanneld from its next start on in a mount namespace of its own
    /// (`unshare -m`, nothing propagating back), after the shell commands `setup` arranged its
    /// mounts there; the first of them to fail ends the start.
    pub fn set_flanneld_mounts(&mut self, index: u8, setup: &str) {
        let script = format!("set -e\n{setup}\nexec \"$0\" \"$@\"");
        self.set_flanneld_wrapper(
            index,
            &[
                "unshare",
                "-m",
                "--propagation",
                "private",
                "sh",
                "-c",
                &script,
            ],
        );
    }

    /// With `Registry::Kube`: from its next start on, node `index`'s flanneld gets no
    /// `--kubeconfig-file` and finds the API server as a pod does, through the in-cluster
    /// configuration the test gives it (`KUBERNETES_SERVICE_HOST`, the service account's files).
    pub fn set_flanneld_in_cluster(&mut self, index: u8) {
        self.node_mut(index).kube_in_cluster = true;
    }

    /// Stops node `index`'s flanneld as systemd does, with SIGTERM, and waits up to `timeout`
    /// for it to exit; its exit status.
    pub fn terminate_flanneld(&mut self, index: u8, timeout: Duration) -> ExitStatus {
        let daemon = self
            .node_mut(index)
            .daemon
            .as_mut()
            .and_then(|d| d.child.as_mut())
            .unwrap_or_else(|| panic!("no flanneld running on node {index}"));
        let pid = nix::unistd::Pid::from_raw(daemon.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)
            .unwrap_or_else(|e| panic!("SIGTERM to node {index}'s flanneld: {e}"));
        self.wait_flanneld_exit(index, timeout)
    }

    /// Waits up to `timeout` for node `index`'s flanneld to exit by itself; its exit status.
    pub fn wait_flanneld_exit(&mut self, index: u8, timeout: Duration) -> ExitStatus {
        let mut daemon = self
            .node_mut(index)
            .daemon
            .take()
            .unwrap_or_else(|| panic!("no flanneld started on node {index}"));
        let child = daemon.child.as_mut().expect("a started daemon");
        wait_for(&format!("node {index}'s flanneld to exit"), timeout, || {
            child.try_wait().ok().flatten()
        })
    }

    /// The process id of node `index`'s flanneld, while it runs.
    pub fn flanneld_pid(&mut self, index: u8) -> Option<u32> {
        let d = self.node_mut(index).daemon.as_mut()?;
        d.running().then(|| d.child.as_ref().map(Child::id))?
    }

    /// How node `index`'s flanneld exited: its status code, or None while it runs (or after
    /// a signal).
    pub fn flanneld_exit(&mut self, index: u8) -> Option<i32> {
        let d = self.node_mut(index).daemon.as_mut()?;
        d.child.as_mut()?.try_wait().ok()??.code()
    }

    /// Kills node `index`'s flanneld (SIGKILL, as when the machine dies); its lease stays.
    pub fn stop_flanneld(&mut self, index: u8) {
        if let Some(mut d) = self.node_mut(index).daemon.take() {
            d.kill();
        }
    }

    /// Starts flanneld on every node and waits for each one's subnet.env.
    pub fn start_flanneld_everywhere(&mut self, flanneld: &Path, timeout: Duration) {
        let indices: Vec<u8> = self.nodes.iter().map(|n| n.index).collect();
        for &i in &indices {
            self.start_flanneld(i, flanneld, &[]);
        }
        for &i in &indices {
            self.node(i).wait_subnet_env(timeout);
        }
    }

    /// The lease keys the registry holds.
    pub fn lease_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = match self.registry {
            Registry::Embedded => fs::read_dir(self.registry_dir().join("subnets"))
                .map(|d| {
                    d.flatten()
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .filter(|n| !n.starts_with('.'))
                        .collect()
                })
                .unwrap_or_default(),
            Registry::Etcd => {
                let prefix = format!("{ETCD_PREFIX}/subnets/");
                self.etcdctl(&["get", "--keys-only", "--prefix", &prefix])
                    .lines()
                    .filter_map(|l| l.strip_prefix(&prefix))
                    .map(str::to_string)
                    .collect()
            }
            // A node's lease is its podCIDR once its flanneld has annotated it.
            Registry::Kube => self
                .nodes
                .iter()
                .filter_map(|n| self.kube().node(&kube_node_name(n.index)))
                .filter(|n| {
                    n["metadata"]["annotations"]["flannel.alpha.coreos.com/kube-subnet-manager"]
                        == "true"
                })
                .filter_map(|n| kube_lease_key(&n))
                .collect(),
        };
        keys.sort();
        keys
    }

    /// Deletes a lease from the registry, as an operator (or its expiry) would.
    pub fn delete_lease(&self, key: &str) {
        match self.registry {
            Registry::Embedded => {
                let path = self.registry_dir().join("subnets").join(key);
                fs::remove_file(&path)
                    .unwrap_or_else(|e| panic!("removing {}: {e}", path.display()));
            }
            Registry::Etcd => {
                let deleted = self.etcdctl(&["del", &format!("{ETCD_PREFIX}/subnets/{key}")]);
                assert_eq!(deleted.trim(), "1", "etcd held no lease {key}");
            }
            // The lease goes with its Node, as when a node is deleted from the cluster.
            Registry::Kube => {
                let node = self
                    .nodes
                    .iter()
                    .map(|n| kube_node_name(n.index))
                    .find(|name| {
                        self.kube()
                            .node(name)
                            .is_some_and(|n| kube_lease_key(&n).as_deref() == Some(key))
                    })
                    .unwrap_or_else(|| panic!("no Node has the podCIDR of lease {key}"));
                self.kube()
                    .delete_node(&node)
                    .unwrap_or_else(|e| panic!("deleting Node {node}: {}", e.message));
            }
        }
    }

    /// A pod on node `index`: a namespace, then the conflist's ADD (flannel, which runs
    /// bridge and host-local, then portmap) with the node's subnet.env and data directories.
    /// Returns the pod's position in `pods()`.
    pub fn add_pod(&mut self, index: u8) -> usize {
        let node = self.node(index);
        let ns = TestNs::new(&format!("{}p{index}", self.prefix));
        let plugins = self.node_plugins(index);
        for p in ["flannel", "bridge", "host-local", "portmap"] {
            assert!(
                plugins.join(p).exists(),
                "no {p} in {}: build the plugins first (cargo build --workspace --bins)",
                plugins.display()
            );
        }
        let list = self.node_conflist(index);
        let container_id = crate::unique_name("c");
        let base = Invocation::at(plugins.join("flannel"), "ADD")
            .container_id(&container_id)
            .netns(&ns.path_str())
            .path(&plugins.display().to_string());
        let result =
            conflist::add(&list, &base, Some(&node.ns), &Map::new()).unwrap_or_else(|out| {
                panic!(
                    "pod ADD on node {index} failed: {}\nstderr: {}",
                    out.stdout, out.stderr
                )
            });
        let mut ips: Vec<String> = result["ips"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| i["address"].as_str()?.split('/').next())
            .map(str::to_string)
            .collect();
        ips.sort_by_key(|ip| Family::of(ip) == Family::V6);
        let ip = ips
            .first()
            .unwrap_or_else(|| panic!("no address in the pod's result {result}"))
            .clone();
        self.pods.push(Pod {
            ns,
            node: index,
            container_id,
            ip,
            ips,
            result,
            servers: Vec::new(),
        });
        self.pods.len() - 1
    }

    /// Node `index`'s CNI bin directory from now on, for its pods' ADD and DEL: `dir`, where
    /// the cluster's plugins (the workspace's build, or `plugins_from`) were until then.
    pub fn set_node_plugins(&mut self, index: u8, dir: &Path) {
        self.node_mut(index).plugins = Some(dir.to_path_buf());
    }

    /// The CNI bin directory node `index`'s pods are added and deleted with.
    pub fn node_plugins(&self, index: u8) -> PathBuf {
        self.node(index)
            .plugins
            .clone()
            .unwrap_or_else(|| self.plugins.clone())
    }

    /// The conflist as node `index`'s runtime runs it: its subnet.env and data directories.
    pub fn node_conflist(&self, index: u8) -> Value {
        let node = self.node(index);
        let mut list = self.conflist.clone();
        for plugin in list["plugins"].as_array_mut().into_iter().flatten() {
            if plugin["type"] == "flannel" {
                plugin["subnetFile"] = node.subnet_file().display().to_string().into();
                plugin["dataDir"] = node.dir.join("flannel").display().to_string().into();
                plugin["ipam"] =
                    serde_json::json!({"dataDir": node.dir.join("networks").display().to_string()});
            }
        }
        list
    }

    /// The conflist's DEL for pod `i` with its node's plugins now, as the runtime runs it when
    /// the pod goes; the pod stays listed (its namespace is removed with the cluster).
    pub fn del_pod(&self, i: usize) -> Result<(), crate::PluginOutput> {
        let pod = &self.pods[i];
        let plugins = self.node_plugins(pod.node);
        let base = Invocation::at(plugins.join("flannel"), "DEL")
            .container_id(&pod.container_id)
            .netns(&pod.ns.path_str())
            .path(&plugins.display().to_string());
        conflist::del(
            &self.node_conflist(pod.node),
            &base,
            Some(&self.node(pod.node).ns),
            &Map::new(),
            Some(&pod.result),
        )
    }

    /// Every ordered pair of pods (from, to) where one ping gets no answer within `wait_s`.
    pub fn unreachable_pairs(&self, wait_s: u32) -> Vec<(usize, usize)> {
        self.pairs_failing(|from, to| from.ping(&to.ip, wait_s))
    }

    /// As `unreachable_pairs`, to the addresses of family `f` (pods without one are left out).
    pub fn unreachable_pairs_over(&self, f: Family, wait_s: u32) -> Vec<(usize, usize)> {
        self.pairs_failing(|from, to| match (from.addr(f), to.addr(f)) {
            (Some(_), Some(ip)) => from.ping(ip, wait_s),
            _ => true,
        })
    }

    /// Waits (bounded) until every pod answers every other pod's ping on each family of
    /// `families`; panics naming the pairs that never did, with every node's view.
    pub fn wait_every_pod_reaches_every_other(&self, families: &[Family], timeout: Duration) {
        for &f in families {
            let start = Instant::now();
            loop {
                let bad = self.unreachable_pairs_over(f, 1);
                if bad.is_empty() {
                    break;
                }
                if start.elapsed() > timeout {
                    panic!(
                        "after {timeout:?}, these {f} pings got no answer:\n{}\n{}",
                        self.describe_pairs(&bad),
                        self.describe()
                    );
                }
            }
        }
    }

    /// Every ordered pair of distinct pods (from, to) for which `ok` is false.
    pub fn pairs_failing(&self, ok: impl Fn(&Pod, &Pod) -> bool) -> Vec<(usize, usize)> {
        let mut bad = Vec::new();
        for (i, from) in self.pods.iter().enumerate() {
            for (j, to) in self.pods.iter().enumerate() {
                if i != j && !ok(from, to) {
                    bad.push((i, j));
                }
            }
        }
        bad
    }

    /// A readable list of pod pairs: `pod 0 (node 1, 10.5.3.2) -> pod 2 (node 2, 10.5.7.2)`,
    /// every address of each pod listed.
    pub fn describe_pairs(&self, pairs: &[(usize, usize)]) -> String {
        pairs
            .iter()
            .map(|&(i, j)| {
                let (a, b) = (&self.pods[i], &self.pods[j]);
                format!(
                    "pod {i} (node {}, {}) -> pod {j} (node {}, {})",
                    a.node,
                    a.ips.join(" "),
                    b.node,
                    b.ips.join(" ")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Every node's view, for a failure message: lease, routes, neighbours, FDB, log tail.
    pub fn describe(&self) -> String {
        let mut s = String::new();
        for n in &self.nodes {
            let log = n.log();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            s += &format!(
                "--- node {} ({}) subnet.env:\n{}routes:\n{}neighbours:\n{}fdb:\n{}flanneld log (last lines):\n{}\n",
                n.index,
                n.ip,
                fs::read_to_string(n.subnet_file()).unwrap_or_default(),
                n.routes() + &n.routes6(),
                n.neighbours(),
                n.fdb(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        s
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Processes first, so that no namespace outlives its name through a process in it.
        for p in &mut self.pods {
            for s in &mut p.servers {
                s.kill();
            }
        }
        for s in &mut self.outside_servers {
            s.kill();
        }
        for n in &mut self.nodes {
            if let Some(mut d) = n.daemon.take() {
                d.kill();
            }
            // What flanneld started to outlive it (a userspace tunnel), in its node.
            kill_all_in(&n.ns);
        }
        if let Some(e) = &mut self.etcd {
            for m in &mut e.members {
                m.process.kill();
            }
        }
        if let Some(k) = &mut self.kube {
            k.stop();
        }
    }
}

/// Ends every process left in `ns` (`ip netns pids`), and waits for each to be gone.
fn kill_all_in(ns: &TestNs) {
    let Ok(out) = Command::new("ip")
        .args(["netns", "pids", ns.name()])
        .output()
    else {
        return;
    };
    let pids: Vec<i32> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    for &pid in &pids {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let start = Instant::now();
    while pids
        .iter()
        .any(|p| std::path::Path::new(&format!("/proc/{p}")).exists())
        && start.elapsed() < Duration::from_secs(5)
    {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Adds `addr` to `dev` in `ns` with the underlay's prefix length (/24 or /64); IPv6 without
/// duplicate address detection, so that it is usable at once.
fn add_address(ns: &TestNs, addr: &str, dev: &str) {
    match Family::of(addr) {
        Family::V4 => ns.ip(&["addr", "add", &format!("{addr}/24"), "dev", dev]),
        Family::V6 => ns.ip(&["addr", "add", &format!("{addr}/64"), "dev", dev, "nodad"]),
    };
}
