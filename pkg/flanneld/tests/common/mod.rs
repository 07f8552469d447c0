//! Test support for the daemon: a node namespace with an `eth0`, a real etcd inside it on
//! loopback, flanneld processes with their logs, all removed on drop (also when a test fails).
#![allow(dead_code)]

use cni_kernel::{Netlink, Netns};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use testkit::TestNs;

pub const FLANNELD: &str = env!("CARGO_BIN_EXE_flanneld");
/// The cluster harness's helpers, under the names these tests use.
#[allow(unused_imports)] // not every test binary uses each
pub use testkit::cluster::{subnet_key as key_of, wait_for, ETCD_PREFIX as PREFIX};

/// A namespace standing for one machine: `lo`, and `eth0` at 192.168.100.1/24 with a default
/// route, so that the daemon finds an external interface as on a real node.
pub struct Node {
    pub ns: TestNs,
    pub dir: tempfile::TempDir,
}

impl Node {
    pub fn new(prefix: &str) -> Node {
        let ns = TestNs::new(prefix);
        ns.ip(&[
            "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p",
        ]);
        ns.ip(&["addr", "add", "192.168.100.1/24", "dev", "eth0"]);
        ns.ip(&["link", "set", "eth0", "up"]);
        ns.ip(&["link", "set", "eth0p", "up"]);
        ns.ip(&[
            "route",
            "add",
            "default",
            "via",
            "192.168.100.254",
            "dev",
            "eth0",
            "onlink",
        ]);
        Node {
            ns,
            dir: tempfile::tempdir().expect("a temporary directory"),
        }
    }

    /// Two machines on one link: each one's `eth0` is the other's peer, 192.168.100.1 and .2.
    pub fn pair(prefix: &str) -> (Node, Node) {
        let (a, b) = (TestNs::new(prefix), TestNs::new(prefix));
        a.ip(&[
            "link",
            "add",
            "eth0",
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            b.name(),
        ]);
        for (ns, addr, addr6) in [
            (&a, "192.168.100.1/24", "fd00::1/64"),
            (&b, "192.168.100.2/24", "fd00::2/64"),
        ] {
            ns.ip(&["addr", "add", addr, "dev", "eth0"]);
            ns.ip(&["addr", "add", addr6, "dev", "eth0", "nodad"]);
            ns.ip(&["link", "set", "eth0", "up"]);
            ns.ip(&[
                "route",
                "add",
                "default",
                "via",
                "192.168.100.254",
                "dev",
                "eth0",
                "onlink",
            ]);
        }
        let dir = || tempfile::tempdir().expect("a temporary directory");
        (Node { ns: a, dir: dir() }, Node { ns: b, dir: dir() })
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// An embedded registry's directory in the node's, `config` its network config.
    pub fn registry(&self, config: &str) -> PathBuf {
        let reg = self.path("registry");
        std::fs::create_dir_all(&reg).expect("the registry directory");
        std::fs::write(reg.join("config"), config).expect("the registry's config");
        reg
    }
}

/// A size field of /proc/<pid>/status (`VmRSS:`, `VmHWM:`) in KiB; 0 when unreadable.
pub fn memory_kib(pid: u32, field: &str) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// A real etcd (Debian's etcd-server) inside the node's namespace, on 127.0.0.1:2379.
pub struct Etcd {
    child: Option<Child>,
    pub data: PathBuf,
    log: PathBuf,
    args: Vec<String>,
    pub client_url: String,
    tls: Option<Tls>,
}

#[derive(Clone)]
pub struct Tls {
    pub ca: PathBuf,
    /// The server's certificate and key.
    pub cert: PathBuf,
    pub key: PathBuf,
    /// A client's, signed by the same CA.
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

impl Etcd {
    pub fn start(node: &Node) -> Etcd {
        Self::start_with(node, None, &[])
    }

    pub fn start_with(node: &Node, tls: Option<Tls>, extra: &[&str]) -> Etcd {
        let data = node.path("etcd-data");
        let scheme = if tls.is_some() { "https" } else { "http" };
        let client_url = format!("{scheme}://127.0.0.1:2379");
        let mut args: Vec<String> = [
            "--name",
            "t",
            "--data-dir",
            data.to_str().unwrap_or_default(),
            "--listen-client-urls",
            &client_url,
            "--advertise-client-urls",
            &client_url,
            "--listen-peer-urls",
            "http://127.0.0.1:2380",
            "--initial-advertise-peer-urls",
            "http://127.0.0.1:2380",
            "--initial-cluster",
            "t=http://127.0.0.1:2380",
            "--log-level",
            "warn",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if let Some(t) = &tls {
            for (flag, path) in [
                ("--cert-file", &t.cert),
                ("--key-file", &t.key),
                ("--trusted-ca-file", &t.ca),
            ] {
                args.push(flag.into());
                args.push(path.display().to_string());
            }
            args.push("--client-cert-auth".into());
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut e = Etcd {
            child: None,
            data,
            log: node.path("etcd.log"),
            args,
            client_url,
            tls,
        };
        e.resume(node);
        e
    }

    /// Starts (again) on the same data directory and waits until it answers.
    pub fn resume(&mut self, node: &Node) {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("etcd log file");
        let child = node
            .ns
            .command("etcd")
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting etcd (Debian's etcd-server; scripts/deps.sh installs it)");
        self.child = Some(child);
        wait_for(
            "etcd to answer on 127.0.0.1:2379",
            Duration::from_secs(30),
            || {
                let out = self.ctl(node, &["endpoint", "health"]);
                out.status.success().then_some(())
            },
        );
    }

    /// Stops it (SIGKILL: as a crash would), keeping the data.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn ctl(&self, node: &Node, args: &[&str]) -> std::process::Output {
        let mut cmd = node.ns.command("etcdctl");
        cmd.env("ETCDCTL_API", "3")
            .arg("--endpoints")
            .arg(&self.client_url)
            .arg("--command-timeout=5s");
        if let Some(t) = &self.tls {
            cmd.arg("--cacert")
                .arg(&t.ca)
                .arg("--cert")
                .arg(&t.client_cert)
                .arg("--key")
                .arg(&t.client_key);
        }
        cmd.args(args).output().expect("running etcdctl")
    }

    /// Runs etcdctl and returns its stdout, panicking when it fails.
    pub fn ctl_ok(&self, node: &Node, args: &[&str]) -> String {
        let out = self.ctl(node, args);
        assert!(
            out.status.success(),
            "etcdctl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// One transaction from etcdctl's txn input (compares, a blank line, success ops, a blank
    /// line, failure ops), panicking when it fails.
    pub fn txn(&self, node: &Node, input: &str) {
        use std::io::Write as _;
        let mut child = node
            .ns
            .command("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &self.client_url, "txn"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("etcdctl txn");
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(input.as_bytes()).expect("writing the txn");
        }
        assert!(
            child.wait().expect("etcdctl txn").success(),
            "the txn failed"
        );
    }

    pub fn put(&self, node: &Node, key: &str, value: &str) {
        self.ctl_ok(node, &["put", key, "--", value]);
    }

    /// Deletes every key under `prefix`.
    pub fn delete_prefix(&self, node: &Node, prefix: &str) {
        self.ctl_ok(node, &["del", "--prefix", prefix]);
    }

    /// The value under `key`, or None.
    pub fn get(&self, node: &Node, key: &str) -> Option<String> {
        let out = self.ctl_ok(node, &["get", "--print-value-only", key]);
        let v = out.trim_end_matches('\n');
        (!v.is_empty()).then(|| v.to_string())
    }

    /// The keys under the lease prefix.
    pub fn lease_keys(&self, node: &Node) -> Vec<String> {
        self.ctl_ok(
            node,
            &[
                "get",
                "--keys-only",
                "--prefix",
                &format!("{PREFIX}/subnets/"),
            ],
        )
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            l.trim_start_matches(&format!("{PREFIX}/subnets/"))
                .to_string()
        })
        .collect()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One flanneld process with its log.
pub struct Daemon {
    child: Option<Child>,
    pub log: PathBuf,
    pub subnet_file: PathBuf,
    status: Option<ExitStatus>,
}

impl Daemon {
    /// Starts flanneld in the node's namespace with `args` (and the environment given).
    pub fn start(node: &Node, name: &str, args: &[&str], env: &[(&str, &str)]) -> Daemon {
        Daemon::start_binary(node, Path::new(FLANNELD), name, args, env)
    }

    /// [`Daemon::start`] with another build of flanneld, for a bench's same-run compare.
    pub fn start_binary(
        node: &Node,
        binary: &Path,
        name: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Daemon {
        let log = node.path(&format!("{name}.log"));
        let subnet_file = node.path(&format!("{name}.subnet.env"));
        let log_file = fs::File::create(&log).expect("daemon log file");
        let mut cmd: Command = node.ns.command(binary);
        cmd.arg("--subnet-file")
            .arg(&subnet_file)
            .args(args)
            .env_remove("NOTIFY_SOCKET")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file);
        let child = cmd.spawn().expect("starting flanneld");
        Daemon {
            child: Some(child),
            log,
            subnet_file,
            status: None,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// A size field of its /proc/<pid>/status (`VmRSS:`, `VmHWM:`) in KiB; 0 when unreadable.
    pub fn memory_kib(&self, field: &str) -> u64 {
        memory_kib(self.pid(), field)
    }

    /// User plus system CPU time used so far.
    pub fn cpu_time(&self) -> Duration {
        testkit::cpu_time(self.pid())
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log holds `needle`; panics with the log when it does not.
    pub fn wait_log(&self, needle: &str, timeout: Duration) {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if self.log_text().contains(needle) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "gave up after {timeout:?} waiting for {needle:?} in {}:\n{}",
            self.log.display(),
            self.log_text()
        );
    }

    /// The subnet.env once written.
    pub fn wait_subnet_env(&self, timeout: Duration) -> String {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Ok(t) = fs::read_to_string(&self.subnet_file) {
                if !t.is_empty() {
                    return t;
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "gave up after {timeout:?} waiting for {}; log:\n{}",
            self.subnet_file.display(),
            self.log_text()
        );
    }

    /// FLANNEL_SUBNET as written.
    pub fn subnet(&self, timeout: Duration) -> String {
        let env = self.wait_subnet_env(timeout);
        env.lines()
            .find_map(|l| l.strip_prefix("FLANNEL_SUBNET="))
            .unwrap_or_else(|| panic!("no FLANNEL_SUBNET in {env}"))
            .to_string()
    }

    /// Still running?
    pub fn running(&mut self) -> bool {
        match self.child.as_mut().map(|c| c.try_wait()) {
            Some(Ok(None)) => true,
            Some(Ok(Some(s))) => {
                self.status = Some(s);
                false
            }
            _ => false,
        }
    }

    /// Waits for the process to end by itself.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if !self.running() {
                if let Some(s) = self.status {
                    return s;
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "flanneld did not exit within {timeout:?}; log:\n{}",
            self.log_text()
        );
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        if let Some(c) = &self.child {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), sig);
        }
    }

    /// SIGTERM, then the exit status.
    pub fn stop(&mut self) -> ExitStatus {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        self.wait_exit(Duration::from_secs(10))
    }

    /// SIGKILL: the daemon dies without a word, as on a power loss.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate, made with openssl.
pub fn make_certs(dir: &Path) -> Tls {
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("running openssl");
        assert!(
            out.status.success(),
            "openssl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=test-ca",
    ]);
    fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n",
    )
    .expect("writing ext.cnf");
    for name in ["server", "client"] {
        run(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
            "-subj",
            &format!("/CN={name}"),
        ]);
        run(&[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &format!("{name}.crt"),
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ]);
    }
    Tls {
        ca: dir.join("ca.crt"),
        cert: dir.join("server.crt"),
        key: dir.join("server.key"),
        client_cert: dir.join("client.crt"),
        client_key: dir.join("client.key"),
    }
}

// ---- what a look must leave as it was ----------------------------------------------------

/// What the kernel of the node's namespace holds that flanneld could touch: links, addresses,
/// routes and rules of both families, permanent neighbours, FDB entries, nexthops, and the
/// firewall as nft and iptables (both modes) list it (counters and timestamps left out:
/// traffic moves them).
pub fn kernel_state(node: &Node) -> String {
    let listings: &[&[&str]] = &[
        &["ip", "-d", "link", "show"],
        &["ip", "addr", "show"],
        &["ip", "-4", "route", "show", "table", "all"],
        &["ip", "-6", "route", "show", "table", "all"],
        &["ip", "-4", "rule", "show"],
        &["ip", "-6", "rule", "show"],
        &["ip", "neigh", "show", "nud", "permanent"],
        &["ip", "nexthop", "show"],
        &["bridge", "fdb", "show"],
        &["nft", "list", "ruleset"],
        &["iptables-save", "-t", "nat"],
        &["iptables-save", "-t", "filter"],
        &["ip6tables-save", "-t", "nat"],
        &["ip6tables-save", "-t", "filter"],
        // The iptables mode the host's rules are not in, where installed.
        &["iptables-legacy-save"],
        &["ip6tables-legacy-save"],
    ];
    let mut out = String::new();
    for args in listings {
        let o = node.ns.try_run(args[0], &args[1..]);
        out.push_str(&format!("$ {}\n", args.join(" ")));
        for line in String::from_utf8_lossy(&o.stdout).lines() {
            if !line.starts_with('#') {
                out.push_str(&uncounted(line));
                out.push('\n');
            }
        }
    }
    out
}

/// An iptables-save line without its chain's packet counters (`[12:720]`).
fn uncounted(line: &str) -> String {
    match (line.starts_with(':'), line.rfind(" [")) {
        (true, Some(at)) => line[..at].to_string(),
        _ => line.to_string(),
    }
}

/// Every file and directory under `dir`: its path, mode and content (a directory's: none).
pub fn files_under(dir: &Path) -> std::collections::BTreeMap<PathBuf, (u32, Vec<u8>)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = std::collections::BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            let Ok(meta) = fs::symlink_metadata(&path) else {
                continue;
            };
            let content = if meta.is_dir() {
                todo.push(path.clone());
                Vec::new()
            } else {
                fs::read(&path).unwrap_or_default()
            };
            out.insert(path, (meta.permissions().mode(), content));
        }
    }
    out
}

/// The kernel state once nothing changes it by itself any more (a new link's carrier, IPv6's
/// duplicate address detection): the same twice a second apart, no address tentative.
fn settled_kernel_state(node: &Node) -> String {
    wait_for(
        "the node's kernel state to settle",
        Duration::from_secs(30),
        || {
            let first = kernel_state(node);
            std::thread::sleep(Duration::from_secs(1));
            let second = kernel_state(node);
            (first == second && !second.contains("tentative")).then_some(second)
        },
    )
}

/// Runs `look` and asserts that the node's kernel and the files under `dir` are as they were.
pub fn writes_nothing<T>(node: &Node, dir: &Path, what: &str, look: impl FnOnce() -> T) -> T {
    let (kernel, files) = (settled_kernel_state(node), files_under(dir));
    let out = look();
    let kernel_after = kernel_state(node);
    if kernel_after != kernel {
        let diff: Vec<String> = kernel_after
            .lines()
            .filter(|l| !kernel.lines().any(|b| b == *l))
            .map(|l| format!("+ {l}"))
            .chain(
                kernel
                    .lines()
                    .filter(|l| !kernel_after.lines().any(|a| a == *l))
                    .map(|l| format!("- {l}")),
            )
            .collect();
        panic!("{what} changed the kernel:\n{}", diff.join("\n"));
    }
    let files_after = files_under(dir);
    let changed: Vec<String> = files
        .keys()
        .chain(files_after.keys())
        .filter(|p| files.get(*p) != files_after.get(*p))
        .map(|p| p.display().to_string())
        .collect();
    assert!(
        changed.is_empty(),
        "{what} made, changed or removed under {}: {changed:?}",
        dir.display()
    );
    out
}

// ---- the datapath as the benchmarks watch it ---------------------------------------------

pub fn count(node: &Node, args: &[&str]) -> usize {
    node.ns
        .run(args[0], &args[1..])
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count()
}

/// Routes, neighbours and FDB entries on flannel.1.
pub fn entries(node: &Node) -> (usize, usize, usize) {
    (
        count(node, &["ip", "-4", "route", "show", "dev", "flannel.1"]),
        count(node, &["ip", "neigh", "show", "dev", "flannel.1"]),
        count(node, &["bridge", "fdb", "show", "dev", "flannel.1"]),
    )
}

/// Watches the daemon's datapath over netlink from inside the bench, counting what
/// `entries` counts. Three `ip`/`bridge` processes formatting up to 15,000 lines every 5 ms
/// took a share of the two cores and of the kernel's locks from the daemon being timed, and
/// saw completion up to 0.1 s late; the reference is timed without any watcher.
pub struct Observer {
    nl: Netlink,
    dev: u32,
}

impl Observer {
    pub fn new(node: &Node) -> Observer {
        let ns = Netns::open(node.ns.path()).expect("the node's namespace");
        let nl = Netlink::open_in(&ns).expect("a netlink socket in the node");
        let dev = nl
            .link_by_name("flannel.1")
            .expect("looking up flannel.1")
            .expect("flanneld made flannel.1")
            .index;
        Observer { nl, dev }
    }

    /// IPv4 ones on flannel.1, directly or through a nexthop object on it.
    fn routes(&self) -> usize {
        let on_dev: std::collections::HashSet<u32> = self
            .nl
            .nexthops()
            .expect("listing nexthops")
            .iter()
            .filter(|n| n.device == self.dev)
            .map(|n| n.id)
            .collect();
        let routes = self.nl.routes().expect("listing routes");
        routes
            .iter()
            .filter(|r| {
                r.dst.is_ipv4()
                    && (r.oif == Some(self.dev) || r.nhid.is_some_and(|id| on_dev.contains(&id)))
            })
            .count()
    }

    /// Permanent IPv4 ones: the kernel's own IPv6 multicast entries, which `ip neigh show`
    /// leaves out, are not counted.
    fn neighbours(&self) -> usize {
        let neighbours = self.nl.neighbours(self.dev).expect("listing neighbours");
        neighbours
            .iter()
            .filter(|n| n.permanent && n.ip.is_ipv4())
            .count()
    }

    fn fdb(&self) -> usize {
        let fdb = self.nl.fdb(self.dev).expect("listing FDB entries");
        fdb.iter().filter(|f| f.dst.is_some()).count()
    }

    /// The time from `start` until the routes, the neighbours and the FDB entries on
    /// flannel.1 number `want` each. Within a round each count only moves one way, so waiting
    /// for them one after the other is waiting for all three.
    pub fn wait(&self, node: &Node, want: usize, start: Instant) -> Duration {
        type Count = fn(&Observer) -> usize;
        let counts: [(&str, Count); 3] = [
            ("routes", Observer::routes),
            ("neighbours", Observer::neighbours),
            ("FDB entries", Observer::fdb),
        ];
        for (what, count) in counts {
            loop {
                let got = count(self);
                if got == want {
                    break;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(120),
                    "after 120 s the datapath holds {got} {what}, not {want}"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        let took = start.elapsed();
        assert_eq!(entries(node), (want, want, want), "as ip and bridge see it");
        took
    }
}
