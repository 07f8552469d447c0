//! A throwaway node: its own host network namespace, the plugins installed in a temporary
//! directory, a conflist, a subnet.env as flanneld would write it, and the ways to look at what
//! the plugins left on it.

use crate::plugins::PluginSet;
use serde_json::Value;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tempfile::TempDir;
use testkit::TestNs;

/// The cluster network in every node's subnet.env; node `n` owns 10.244.n.0/24.
pub const FLANNEL_NETWORK: &str = "10.244.0.0/16";
pub const FLANNEL_MTU: u32 = 1450;
/// The node's own address (on `lo` of its host namespace): where a mapped port is reached.
pub const NODE_ADDR: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
/// A dual-stack node's: the cluster's IPv6 network, node `n` owning fd00:244:0:n::/64, the MTU
/// our flanneld writes beside it (vxlan over IPv6 takes 70 bytes), the node's own IPv6 address.
pub const FLANNEL_IPV6_NETWORK: &str = "fd00:244::/48";
pub const FLANNEL_MTU_DUAL_STACK: u32 = 1430;
pub const NODE_ADDR6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);

const HTTP_TIMEOUT: Duration = Duration::from_secs(5);
const CONFLIST: &str = "10-flannel.conflist";
const FLANNEL_DATA_DIR: &str = "/var/lib/cni/flannel";
const HOST_LOCAL_DATA_DIR: &str = "/var/lib/cni/networks";
const LIBCNI_CACHE_DIR: &str = "/var/lib/cni/results";

/// What a container runtime on a node keeps outside the node's network namespace: a directory
/// (`bin` with the plugins, `net.d` with the conflist, `run-flannel`, `var-lib-cni`, `empty`, and
/// whatever the runtime keeps there) and a cgroup parent only it uses. On drop, every process
/// started from the directory is killed and the cgroups removed, then the directory.
pub struct Home {
    network: String,
    cgroup_parent: String,
    dir: TempDir,
}

impl Home {
    /// `set` installed in `bin`, `conflist` in `net.d`. `run-flannel` (seen as /run/flannel by
    /// the sessions) is `subnet_dir` when given, an empty directory otherwise.
    pub fn new(set: PluginSet, conflist: &Value, subnet_dir: Option<&Path>) -> Home {
        let dir = tempfile::Builder::new()
            .prefix("e2e-")
            .tempdir()
            .expect("temporary directory");
        for sub in ["net.d", "var-lib-cni", "empty"] {
            std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        }
        let run_flannel = dir.path().join("run-flannel");
        match subnet_dir {
            Some(target) => std::os::unix::fs::symlink(target, &run_flannel).unwrap(),
            None => std::fs::create_dir_all(&run_flannel).unwrap(),
        }
        set.install(&dir.path().join("bin"));
        std::fs::write(
            dir.path().join("net.d").join(CONFLIST),
            serde_json::to_string_pretty(conflist).unwrap(),
        )
        .unwrap();
        let network = conflist["name"]
            .as_str()
            .expect("the conflist has a name")
            .to_string();
        Home {
            network,
            cgroup_parent: testkit::unique_name("e2e"),
            dir,
        }
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// The network name from the conflist (what podman's `--network` takes).
    pub fn network(&self) -> &str {
        &self.network
    }

    /// A cgroup parent only this home uses, removed with it.
    pub fn cgroup_parent(&self) -> String {
        format!("/{}", self.cgroup_parent)
    }

    /// Maps a path under /var/lib/cni (as the plugins see it) to where this home keeps it.
    fn var_lib_cni(&self, path: &str) -> PathBuf {
        let rel = path
            .strip_prefix("/var/lib/cni")
            .expect("a path under /var/lib/cni");
        self.path("var-lib-cni").join(rel.trim_start_matches('/'))
    }

    /// host-local's address files of the network (named by the address), as "ip: content".
    pub fn leases(&self) -> Vec<String> {
        let dir = self.var_lib_cni(HOST_LOCAL_DATA_DIR).join(&self.network);
        files_in(&dir)
            .into_iter()
            .filter(|(name, _)| name.parse::<std::net::IpAddr>().is_ok())
            .map(|(name, content)| format!("{name}: {}", content.replace(['\r', '\n'], " ")))
            .collect()
    }

    /// flannel's saved delegate configs (named by container ID).
    pub fn delegates(&self) -> Vec<String> {
        files_in(&self.var_lib_cni(FLANNEL_DATA_DIR))
            .into_iter()
            .map(|(name, _)| name)
            .collect()
    }

    /// libcni's cached results (named network-containerID-ifname).
    pub fn cached_results(&self) -> Vec<String> {
        files_in(&self.var_lib_cni(LIBCNI_CACHE_DIR))
            .into_iter()
            .map(|(name, _)| name)
            .collect()
    }

    /// Processes still running from this directory (a runtime, shim or monitor a test started
    /// and that outlived its session).
    pub fn processes(&self) -> Vec<(i32, String)> {
        let needle = self.dir().display().to_string();
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| {
                let pid: i32 = e.file_name().to_str()?.parse().ok()?;
                let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
                let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
                cmdline.contains(&needle).then_some((pid, cmdline))
            })
            .filter(|(pid, _)| *pid != std::process::id() as i32)
            .collect()
    }

    /// Removes this home's cgroup trees from every hierarchy; the directories that would not
    /// go (a process still in them) are returned.
    pub fn remove_cgroups(&self) -> Vec<PathBuf> {
        let mut stuck = Vec::new();
        let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
            return stuck;
        };
        let mut roots: Vec<PathBuf> = vec![PathBuf::from("/sys/fs/cgroup")];
        roots.extend(hierarchies.flatten().map(|e| e.path()));
        for root in roots {
            let top = root.join(&self.cgroup_parent);
            if top.is_dir() {
                remove_dirs_depth_first(&top, &mut stuck);
            }
        }
        stuck
    }

    /// Kills what runs from this home and removes its cgroups.
    fn end_processes(&self) {
        for (pid, _) in self.processes() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        // Killed processes leave their cgroups a moment later.
        for _ in 0..20 {
            if self.remove_cgroups().is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        self.end_processes();
    }
}

pub struct Node {
    pub ns: TestNs,
    n: u8,
    ipv6: bool,
    // Last: removed after the namespace, when nothing can be using it any more.
    home: Home,
}

impl Node {
    /// A node numbered `n` (its FLANNEL_SUBNET is 10.244.n.1/24) running `set` on `conflist`.
    pub fn new(prefix: &str, set: PluginSet, n: u8, conflist: &Value) -> Node {
        Node::build(prefix, set, n, conflist, false)
    }

    /// As `new`, with IPv6 beside IPv4: FLANNEL_IPV6_SUBNET fd00:244:0:n::1/64 in subnet.env
    /// and NODE_ADDR6 on the node.
    pub fn dual_stack(prefix: &str, set: PluginSet, n: u8, conflist: &Value) -> Node {
        Node::build(prefix, set, n, conflist, true)
    }

    fn build(prefix: &str, set: PluginSet, n: u8, conflist: &Value, ipv6: bool) -> Node {
        let ns = TestNs::new(prefix);
        ns.ip(&["addr", "add", &format!("{NODE_ADDR}/32"), "dev", "lo"]);
        if ipv6 {
            ns.ip(&["addr", "add", &format!("{NODE_ADDR6}/128"), "dev", "lo"]);
        }
        let node = Node {
            ns,
            n,
            ipv6,
            home: Home::new(set, conflist, None),
        };
        std::fs::write(node.path("run-flannel/subnet.env"), node.subnet_env()).unwrap();
        node
    }

    /// What the runtime keeps of this node outside its namespace.
    pub fn home(&self) -> &Home {
        &self.home
    }

    /// The node's directory: `bin`, `net.d`, `run-flannel`, `var-lib-cni`, `empty`, and whatever
    /// a runtime keeps there.
    pub fn dir(&self) -> &Path {
        self.home.dir()
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.home.path(rel)
    }

    /// The network name from the conflist (what podman's `--network` takes).
    pub fn network(&self) -> &str {
        self.home.network()
    }

    /// The subnet.env flanneld would have written for this node.
    pub fn subnet_env(&self) -> String {
        let mut env = format!(
            "FLANNEL_NETWORK={FLANNEL_NETWORK}\nFLANNEL_SUBNET={}/24\n",
            self.gateway()
        );
        if let Some(gw6) = self.gateway6() {
            env += &format!(
                "FLANNEL_IPV6_NETWORK={FLANNEL_IPV6_NETWORK}\nFLANNEL_IPV6_SUBNET={gw6}/64\n"
            );
        }
        env + &format!("FLANNEL_MTU={}\nFLANNEL_IPMASQ=true\n", self.mtu())
    }

    /// FLANNEL_MTU.
    pub fn mtu(&self) -> u32 {
        if self.ipv6 {
            FLANNEL_MTU_DUAL_STACK
        } else {
            FLANNEL_MTU
        }
    }

    /// The bridge's address, FLANNEL_SUBNET's first host.
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 244, self.n, 1)
    }

    /// The bridge's IPv6 address, FLANNEL_IPV6_SUBNET's first host, on a dual-stack node.
    pub fn gateway6(&self) -> Option<Ipv6Addr> {
        self.ipv6
            .then(|| Ipv6Addr::new(0xfd00, 0x244, 0, u16::from(self.n), 0, 0, 0, 1))
    }

    /// Whether `ip` is a pod address of FLANNEL_SUBNET (not the network, gateway or broadcast).
    pub fn is_pod_address(&self, ip: Ipv4Addr) -> bool {
        let [a, b, c, d] = ip.octets();
        (a, b, c) == (10, 244, self.n) && d > 1 && d < 255
    }

    /// Whether `ip` is a pod address of FLANNEL_IPV6_SUBNET (not the network or the gateway).
    pub fn is_pod_address6(&self, ip: Ipv6Addr) -> bool {
        let s = ip.segments();
        let host =
            u64::from(s[4]) << 48 | u64::from(s[5]) << 32 | u64::from(s[6]) << 16 | u64::from(s[7]);
        self.ipv6 && s[..4] == [0xfd00, 0x244, 0, u16::from(self.n)] && host > 1
    }

    /// The node's own address of `ip`'s family, where a mapped port is reached.
    pub fn address_like(&self, ip: IpAddr) -> IpAddr {
        match ip {
            IpAddr::V4(_) => NODE_ADDR.into(),
            IpAddr::V6(_) => NODE_ADDR6.into(),
        }
    }

    /// A cgroup parent only this node uses, removed with the node.
    pub fn cgroup_parent(&self) -> String {
        self.home.cgroup_parent()
    }

    /// GET http://addr:port/ from the node's host namespace; see [`http_get`].
    pub fn http_get(&self, addr: impl Into<IpAddr>, port: u16) -> Result<String, String> {
        http_get(self.ns.path(), addr, port)
    }

    /// What the plugins (and the runtime's CNI cache) hold for `container_id` on this node.
    pub fn footprint(&self, container_id: &str) -> Footprint {
        Footprint::of(&self.ns, &self.home, container_id)
    }

    /// host-local's address files of the network (named by the address), as "ip: content".
    pub fn leases(&self) -> Vec<String> {
        self.home.leases()
    }

    /// flannel's saved delegate configs (named by container ID).
    pub fn delegates(&self) -> Vec<String> {
        self.home.delegates()
    }

    /// libcni's cached results (named network-containerID-ifname).
    pub fn cached_results(&self) -> Vec<String> {
        self.home.cached_results()
    }

    /// The veth links in the host namespace.
    pub fn veths(&self) -> Vec<String> {
        veths(&self.ns)
    }

    /// Every iptables, ip6tables and nft line of the host namespace, prefixed by its source.
    pub fn firewall(&self) -> Vec<String> {
        firewall(&self.ns)
    }

    /// Everything container-specific on the node, whoever it belonged to; see
    /// [`Footprint::attachments`].
    pub fn attachments(&self) -> Footprint {
        Footprint::attachments(&self.ns, &self.home)
    }

    /// Processes still running from this node's directory.
    pub fn processes(&self) -> Vec<(i32, String)> {
        self.home.processes()
    }

    /// Removes this node's cgroup trees; the directories that would not go are returned.
    pub fn remove_cgroups(&self) -> Vec<PathBuf> {
        self.home.remove_cgroups()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // Before the namespace goes, so that no process outlives its name in it.
        self.home.end_processes();
    }
}

/// GET http://addr:port/ from the network namespace at `netns` (a node's, or a pod's
/// `/proc/<pid>/ns/net`); the body. Connection refusals are retried for a few seconds: a
/// container's server may not be listening yet when it starts.
pub fn http_get(netns: &Path, addr: impl Into<IpAddr>, port: u16) -> Result<String, String> {
    let ns = std::fs::File::open(netns).map_err(|e| format!("{}: {e}", netns.display()))?;
    let target = SocketAddr::from((addr.into(), port));
    // setns affects only the calling thread, so the request gets a thread of its own.
    std::thread::spawn(move || {
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(|e| format!("entering the namespace: {e}"))?;
        let mut attempts = 0;
        let mut stream = loop {
            match TcpStream::connect_timeout(&target, HTTP_TIMEOUT) {
                Ok(s) => break s,
                Err(e) if e.kind() == ErrorKind::ConnectionRefused && attempts < 50 => {
                    attempts += 1;
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => return Err(format!("connecting to {target}: {e}")),
            }
        };
        stream.set_read_timeout(Some(HTTP_TIMEOUT)).ok();
        let mut response = String::new();
        stream
            .write_all(b"GET / HTTP/1.0\r\n\r\n")
            .and_then(|_| stream.read_to_string(&mut response))
            .map_err(|e| format!("GET http://{target}/: {e}"))?;
        match response.split_once("\r\n\r\n") {
            Some((head, body)) if head.split_whitespace().nth(1) == Some("200") => {
                Ok(body.to_string())
            }
            _ => Err(format!("GET http://{target}/: {response:?}")),
        }
    })
    .join()
    .map_err(|_| "the request thread panicked".to_string())?
}

/// The veth links in the namespace `ns`.
pub fn veths(ns: &TestNs) -> Vec<String> {
    ns.ip_json(&["link", "show", "type", "veth"])
        .as_array()
        .map(|links| {
            links
                .iter()
                .filter_map(|l| l["ifname"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Every iptables, ip6tables and nft line of the namespace `ns`, prefixed by its source.
pub fn firewall(ns: &TestNs) -> Vec<String> {
    let mut lines = Vec::new();
    for (prog, args) in [
        ("iptables-save", &[][..]),
        ("ip6tables-save", &[][..]),
        ("nft", &["list", "ruleset"][..]),
    ] {
        let out = ns.try_run(prog, args);
        lines.extend(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
                .map(|l| format!("{prog}: {}", l.trim())),
        );
    }
    lines
}

/// cgroup directories are removed with rmdir (their control files are not real files).
fn remove_dirs_depth_first(dir: &Path, stuck: &mut Vec<PathBuf>) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_dirs_depth_first(&e.path(), stuck);
            }
        }
    }
    if std::fs::remove_dir(dir).is_err() {
        stuck.push(dir.to_path_buf());
    }
}

/// (name, content) of the regular files in `dir`; nothing when it does not exist.
fn files_in(dir: &Path) -> Vec<(String, String)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<(String, String)> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| {
            let content = std::fs::read_to_string(e.path()).unwrap_or_default();
            (e.file_name().to_string_lossy().into_owned(), content)
        })
        .collect();
    files.sort();
    files
}

/// Network state on a node: one container's, or (from [`Footprint::attachments`]) everyone's.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Footprint {
    /// host-local address files, "ip: content".
    pub leases: Vec<String>,
    /// flannel's saved delegate configs (file names: container IDs).
    pub delegates: Vec<String>,
    /// libcni's cached results.
    pub cached_results: Vec<String>,
    /// Firewall lines (and, node-wide, veths).
    pub rules: Vec<String>,
}

impl Footprint {
    /// What the plugins (and the runtime's CNI cache) hold for `container_id` on the node whose
    /// host namespace is `ns` and whose runtime keeps `home`.
    pub fn of(ns: &TestNs, home: &Home, container_id: &str) -> Footprint {
        let naming = |lines: Vec<String>| -> Vec<String> {
            lines
                .into_iter()
                .filter(|l| l.contains(container_id))
                .collect()
        };
        Footprint {
            leases: naming(home.leases()),
            delegates: home
                .delegates()
                .into_iter()
                .filter(|d| d == container_id)
                .collect(),
            cached_results: naming(home.cached_results()),
            rules: naming(firewall(ns)),
        }
    }

    /// Everything container-specific on such a node, whoever it belonged to: address files,
    /// saved delegates, cached results, per-container portmap chains (CNI-DN-*, CNI-SN-*: their
    /// names are hashes) and veths. Empty when no container is attached.
    pub fn attachments(ns: &TestNs, home: &Home) -> Footprint {
        let mut rules: Vec<String> = firewall(ns)
            .into_iter()
            .filter(|l| l.contains("CNI-DN-") || l.contains("CNI-SN-"))
            .collect();
        rules.extend(veths(ns).into_iter().map(|v| format!("veth {v}")));
        Footprint {
            leases: home.leases(),
            delegates: home.delegates(),
            cached_results: home.cached_results(),
            rules,
        }
    }

    pub fn is_empty(&self) -> bool {
        *self == Footprint::default()
    }
}
