//! Crash-injection soak: the stock flannel conflist (flannel → bridge → host-local, then
//! portmap with a mapping) on a throwaway node, pods ADDed and DELeted in random order by up to
//! eight runtimes at once, while a share of the plugin processes is SIGKILLed at a random moment
//! of their run. The runtime's answer to a killed or failed ADD is a DEL, and a failed DEL is
//! retried, as containerd and CRI-O do. When every pod is gone the node must hold nothing of
//! them, and no address may ever have been handed to two live pods.

use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use testkit::{bin_dir, conflist, unique_name, Invocation, TestNs};

/// The plugins whose processes the soak kills.
pub const PLUGINS: [&str; 4] = ["flannel", "bridge", "host-local", "portmap"];
/// The node's pod subnet and the bridge's own address there (a local address of the node).
const SUBNET_ENV: &str = "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1/24\n\
FLANNEL_IPV6_NETWORK=fd00:10:244::/56\nFLANNEL_IPV6_SUBNET=fd00:10:244:1::1/64\n\
FLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n";
const GATEWAY_V4: [u8; 4] = [10, 244, 1, 1];
/// Host ports are FIRST_PORT + cycle number, so every mapping of the run is told apart.
const FIRST_PORT: u16 = 20000;
/// Pods each simulated runtime keeps alive at most at once.
const HELD_PER_WORKER: usize = 2;
/// DEL attempts before a pod is reported as one the runtime could never remove.
const DEL_ATTEMPTS: usize = 6;
/// How long plugins orphaned by a kill may take to finish before the node is inspected.
const ORPHAN_WAIT: Duration = Duration::from_secs(20);

#[derive(Clone, Debug)]
pub struct Options {
    /// Pods, each ADDed once and DELeted at least once.
    pub cycles: usize,
    /// portmap's backend: "iptables" or "nftables".
    pub backend: String,
    /// Runtimes working at once.
    pub parallel: usize,
    /// Percentage of ADD and DEL operations during which one plugin process gets killed.
    pub kill_percent: u64,
    pub seed: u64,
    /// When to stop starting new pods; the run then fails as incomplete.
    pub time_limit: Duration,
}

impl Options {
    pub fn new(cycles: usize, backend: &str) -> Options {
        Options {
            cycles,
            backend: backend.to_string(),
            parallel: 8,
            kill_percent: 30,
            seed: seed_from_clock(),
            time_limit: Duration::from_secs(3600),
        }
    }
}

/// What a run did and what it found.
#[derive(Debug, Default)]
pub struct Report {
    pub cycles: usize,
    /// Per plugin: kills attempted, and those that landed while the process was running.
    pub kills: BTreeMap<&'static str, (usize, usize)>,
    /// Duplicate addresses, DELs that never succeeded, a run cut short.
    pub problems: Vec<String>,
    /// What the node still held at the end.
    pub leaks: Vec<String>,
    pub elapsed: Duration,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.problems.is_empty() && self.leaks.is_empty()
    }

    pub fn summary(&self) -> String {
        let mut s = format!(
            "{} pods in {:.1} s; kills landed/attempted:",
            self.cycles,
            self.elapsed.as_secs_f64()
        );
        for (plugin, (tried, landed)) in &self.kills {
            s += &format!(" {plugin} {landed}/{tried}");
        }
        for p in &self.problems {
            s += &format!("\nPROBLEM: {p}");
        }
        for l in &self.leaks {
            s += &format!("\nLEAK: {l}");
        }
        s
    }

    pub fn landed(&self) -> usize {
        self.kills.values().map(|(_, landed)| landed).sum()
    }
}

pub fn seed_from_clock() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
        | 1
}

/// xorshift64*: reproducible from the printed seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// The node: its host namespace and the directories flannel and host-local keep state in.
struct Node {
    host: TestNs,
    dir: tempfile::TempDir,
    list: Value,
}

impl Node {
    fn new(backend: &str) -> Node {
        let host = TestNs::new("soak");
        host.run(
            "sysctl",
            &[
                "-qw",
                "net.ipv6.conf.all.accept_dad=0",
                "net.ipv6.conf.default.accept_dad=0",
            ],
        );
        let dir = tempfile::Builder::new()
            .prefix("soak-")
            .tempdir()
            .expect("temporary directory");
        let bin = dir.path().join("bin");
        fs::create_dir_all(&bin).expect("creating the node's CNI_PATH");
        for plugin in PLUGINS {
            symlink(bin_dir().join(plugin), bin.join(plugin)).expect("installing a plugin");
        }
        let subnet_file = dir.path().join("run/flannel/subnet.env");
        fs::create_dir_all(subnet_file.parent().expect("a parent")).expect("creating run/");
        fs::write(&subnet_file, SUBNET_ENV).expect("writing subnet.env");
        let stock =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/10-flannel.conflist");
        let mut list: Value =
            serde_json::from_str(&fs::read_to_string(&stock).expect("reading the stock conflist"))
                .expect("the stock conflist is JSON");
        list["plugins"][0]["subnetFile"] = json!(subnet_file);
        list["plugins"][0]["dataDir"] = json!(dir.path().join("flannel"));
        list["plugins"][0]["ipam"] = json!({"dataDir": dir.path().join("networks")});
        list["plugins"][1]["backend"] = json!(backend);
        Node { host, dir, list }
    }

    fn bin(&self) -> PathBuf {
        self.dir.path().join("bin")
    }

    fn reservations_dir(&self) -> PathBuf {
        self.dir
            .path()
            .join("networks")
            .join(self.list["name"].as_str().unwrap_or_default())
    }

    fn flannel_dir(&self) -> PathBuf {
        self.dir.path().join("flannel")
    }
}

/// One pod: its container ID, network namespace and host port.
struct Pod {
    id: String,
    ns: TestNs,
    port: u16,
}

impl Pod {
    fn runtime_config(&self) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert(
            "portMappings".into(),
            json!([
                {"hostPort": self.port, "containerPort": 80, "protocol": "tcp"},
                {"hostPort": self.port, "containerPort": 53, "protocol": "udp"}
            ]),
        );
        m
    }
}

struct Shared {
    live: HashMap<IpAddr, String>,
    /// Per container, what each invocation did: printed for a container that leaked.
    history: HashMap<String, Vec<String>>,
    problems: Vec<String>,
    kills: BTreeMap<&'static str, (usize, usize)>,
}

struct Soak<'a> {
    node: &'a Node,
    opts: &'a Options,
    next: AtomicUsize,
    deadline: Instant,
    shared: Mutex<Shared>,
    /// Per plugin, the longest random delay (µs) after the process appears before it is
    /// killed: it shrinks when the process finished first and grows when the kill landed, so
    /// kills keep landing mid-run however loaded the machine is.
    spans: Mutex<HashMap<&'static str, u64>>,
}

/// Which process of an operation to kill, if any.
type Kill = Option<&'static str>;

impl Soak<'_> {
    fn problem(&self, what: String) {
        self.shared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .problems
            .push(what);
    }

    fn plan_kill(&self, rng: &mut Rng) -> Kill {
        (rng.below(100) < self.opts.kill_percent)
            .then(|| PLUGINS[rng.below(PLUGINS.len() as u64) as usize])
    }

    /// Runs one plugin of the list with `command`; kills `kill` if it is this process or one
    /// it runs. Ok with stdout, or Err with what went wrong ("killed" when a kill landed).
    fn invoke(
        &self,
        rng: &mut Rng,
        pod: &Pod,
        command: &str,
        index: usize,
        prev: Option<&Value>,
        kill: Kill,
    ) -> Result<Value, String> {
        let plugin = &self.node.list["plugins"][index];
        let ty = plugin["type"].as_str().unwrap_or_default();
        let conf = conflist::plugin_config(&self.node.list, plugin, &pod.runtime_config(), prev);
        let inv = Invocation::at(self.node.bin().join(ty), command)
            .container_id(&pod.id)
            .netns(&pod.ns.path_str());
        let mut child = inv.spawn_in(Some(&self.node.host), conf.to_string().as_bytes());
        let target = kill.filter(|k| {
            if ty == "flannel" {
                *k != "portmap"
            } else {
                *k == ty
            }
        });
        let mut landed = false;
        if let Some(target) = target {
            landed = self.kill_during(rng, &mut child, target);
        }
        let out = child
            .wait_with_output()
            .map_err(|e| format!("waiting for {ty}: {e}"))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let event = match (out.status.success(), landed) {
            (true, false) => format!("{ty} {command} ok"),
            (true, true) => format!("{ty} {command} ok though {target:?} was killed"),
            (false, true) => format!("{ty} {command} failed: {target:?} killed"),
            (false, false) => format!("{ty} {command} failed: {}", stdout.trim()),
        };
        self.shared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .history
            .entry(pod.id.clone())
            .or_default()
            .push(event);
        if out.status.success() {
            return if stdout.trim().is_empty() {
                Ok(Value::Null)
            } else {
                serde_json::from_str(&stdout)
                    .map_err(|e| format!("{ty} {command} printed no JSON ({e}): {stdout}"))
            };
        }
        if landed {
            return Err("killed".into());
        }
        Err(format!(
            "{ty} {command} of {} failed: {}{}",
            pod.id,
            stdout.trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }

    /// Waits for `target` (the child itself or one of its descendants) to run, lets it run a
    /// random while, and SIGKILLs it. True when the kill hit a running process.
    fn kill_during(&self, rng: &mut Rng, child: &mut Child, target: &'static str) -> bool {
        let top = child.id() as i32;
        let span = *self
            .spans
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(target)
            .or_insert(2000);
        let delay = Duration::from_micros(rng.below(span));
        let give_up = Instant::now() + Duration::from_secs(30);
        let mut landed = false;
        while Instant::now() < give_up {
            if matches!(child.try_wait(), Ok(Some(_))) {
                break;
            }
            let Some(pid) = find_process(top, target) else {
                std::thread::sleep(Duration::from_micros(100));
                continue;
            };
            std::thread::sleep(delay);
            // Still the plugin (not a reused pid), and still running.
            if comm(pid).as_deref() == Some(target) && !is_zombie(pid) {
                landed = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                )
                .is_ok();
            }
            break;
        }
        let mut spans = self.spans.lock().unwrap_or_else(|e| e.into_inner());
        let span = spans.entry(target).or_insert(2000);
        *span = if landed {
            *span + *span / 20 + 1
        } else {
            (*span * 9 / 10).max(100)
        };
        drop(spans);
        let mut shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        let entry = shared.kills.entry(target).or_default();
        entry.0 += 1;
        entry.1 += usize::from(landed);
        landed
    }

    /// The conflist's ADD; true when the pod is up. A killed or failed ADD is followed by DEL.
    fn add(&self, rng: &mut Rng, pod: &Pod) -> bool {
        let kill = self.plan_kill(rng);
        let mut outcome = self.invoke(rng, pod, "ADD", 0, None, kill);
        if let Ok(prev) = &outcome {
            outcome = self.invoke(rng, pod, "ADD", 1, Some(prev), kill);
        }
        let result = match outcome {
            Ok(result) => result,
            Err(why) => {
                if why != "killed" {
                    self.problem(format!("ADD without a kill failed: {why}"));
                }
                self.del(rng, pod);
                return false;
            }
        };
        let ips: Vec<IpAddr> = result["ips"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|ip| ip["address"].as_str()?.split('/').next()?.parse().ok())
            .collect();
        if ips.len() != 2 {
            self.problem(format!(
                "ADD of {} gave {ips:?}, not one address per family",
                pod.id
            ));
        }
        {
            let mut shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
            for ip in &ips {
                if let Some(other) = shared.live.insert(*ip, pod.id.clone()) {
                    shared
                        .problems
                        .push(format!("{ip} handed to {} while {other} holds it", pod.id));
                }
            }
        }
        // Traffic to the mapped UDP port leaves a conntrack entry that DEL has to remove.
        if let Err(e) = send_udp(&self.node.host, SocketAddr::from((GATEWAY_V4, pod.port))) {
            self.problem(format!("sending to port {} of {}: {e}", pod.port, pod.id));
        }
        true
    }

    /// The conflist's DEL (portmap, then flannel), retried until it succeeds.
    fn del(&self, rng: &mut Rng, pod: &Pod) {
        {
            let mut shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
            shared.live.retain(|_, id| *id != pod.id);
        }
        for attempt in 0..DEL_ATTEMPTS {
            // Only a first attempt is killed: the retries show that DEL completes what a
            // killed DEL began.
            let kill = if attempt == 0 {
                self.plan_kill(rng)
            } else {
                None
            };
            let outcome = self
                .invoke(rng, pod, "DEL", 1, None, kill)
                .and_then(|_| self.invoke(rng, pod, "DEL", 0, None, kill));
            match outcome {
                Ok(_) => return,
                Err(why) if why == "killed" => {}
                Err(why) => self.problem(format!("DEL attempt {attempt}: {why}")),
            }
        }
        self.problem(format!(
            "{} could not be DELeted in {DEL_ATTEMPTS} attempts",
            pod.id
        ));
    }

    /// One runtime: starts pods and removes them in random order until the cycles run out.
    fn work(&self, worker: u64) {
        let mut rng = Rng(self.opts.seed ^ worker.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let mut held: Vec<Pod> = Vec::new();
        loop {
            let add = held.len() < HELD_PER_WORKER && (held.is_empty() || rng.below(2) == 0);
            if add {
                if Instant::now() > self.deadline {
                    break;
                }
                let n = self.next.fetch_add(1, Ordering::Relaxed);
                if n >= self.opts.cycles {
                    break;
                }
                let pod = Pod {
                    id: unique_name("soak"),
                    ns: TestNs::new("skp"),
                    port: FIRST_PORT + (n % 20000) as u16,
                };
                if self.add(&mut rng, &pod) {
                    held.push(pod);
                }
            } else {
                let pod = held.swap_remove(rng.below(held.len() as u64) as usize);
                self.del(&mut rng, &pod);
            }
        }
        for pod in held.drain(..) {
            self.del(&mut rng, &pod);
        }
    }
}

/// Runs the soak and inspects the node afterwards.
pub fn run(opts: &Options) -> Report {
    let started = Instant::now();
    let node = Node::new(&opts.backend);
    let soak = Soak {
        node: &node,
        opts,
        next: AtomicUsize::new(0),
        deadline: started + opts.time_limit,
        shared: Mutex::new(Shared {
            live: HashMap::new(),
            history: HashMap::new(),
            problems: Vec::new(),
            kills: BTreeMap::new(),
        }),
        spans: Mutex::new(HashMap::new()),
    };
    std::thread::scope(|s| {
        for w in 0..opts.parallel.max(1) {
            let soak = &soak;
            s.spawn(move || soak.work(w as u64));
        }
    });
    let shared = soak.shared.into_inner().unwrap_or_else(|e| e.into_inner());
    let cycles = soak.next.load(Ordering::Relaxed).min(opts.cycles);
    let mut problems = shared.problems;
    if cycles < opts.cycles {
        problems.push(format!(
            "only {cycles} of {} pods within the {:?} time limit",
            opts.cycles, opts.time_limit
        ));
    }
    if let Some(still) = wait_for_orphans(&node.host, ORPHAN_WAIT) {
        problems.push(format!(
            "plugins still running {ORPHAN_WAIT:?} after the last DEL: {still}"
        ));
    }
    let mut leaks = leaks(&node, FIRST_PORT..FIRST_PORT + cycles.min(20000) as u16);
    let mut told = std::collections::BTreeSet::new();
    for leak in leaks.clone() {
        for (id, events) in &shared.history {
            if leak.contains(id.as_str()) && told.insert(id.clone()) {
                leaks.push(format!("(what {id} went through: {})", events.join("; ")));
            }
        }
    }
    Report {
        cycles,
        kills: shared.kills,
        problems,
        leaks,
        elapsed: started.elapsed(),
    }
}

/// What the inspection reports for a node where one pod was ADDed and never DELeted: every
/// kind of leftover must show up, or the soak could pass without looking.
pub fn leaks_of_an_undeleted_pod(backend: &str) -> Vec<String> {
    let mut opts = Options::new(1, backend);
    opts.kill_percent = 0;
    let node = Node::new(backend);
    let soak = Soak {
        node: &node,
        opts: &opts,
        next: AtomicUsize::new(0),
        deadline: Instant::now() + opts.time_limit,
        shared: Mutex::new(Shared {
            live: HashMap::new(),
            history: HashMap::new(),
            problems: Vec::new(),
            kills: BTreeMap::new(),
        }),
        spans: Mutex::new(HashMap::new()),
    };
    let pod = Pod {
        id: unique_name("soak"),
        ns: TestNs::new("skp"),
        port: FIRST_PORT,
    };
    let mut rng = Rng(opts.seed);
    let mut found = Vec::new();
    if !soak.add(&mut rng, &pod) {
        found.push(format!(
            "ADD failed: {:?}",
            soak.shared.lock().map(|s| s.problems.clone())
        ));
    }
    found.extend(leaks(&node, FIRST_PORT..FIRST_PORT + 1));
    found
}

/// What the node still holds of any pod.
fn leaks(node: &Node, ports: std::ops::Range<u16>) -> Vec<String> {
    let mut out = Vec::new();
    for name in file_names(&node.reservations_dir()) {
        if name != "lock" && !name.starts_with("last_reserved_ip.") {
            let content = fs::read_to_string(node.reservations_dir().join(&name))
                .unwrap_or_default()
                .replace("\r\n", " ");
            out.push(format!("host-local file {name} ({content:?})"));
        }
    }
    for name in file_names(&node.flannel_dir()) {
        out.push(format!("flannel's saved delegate {name}"));
    }
    let veths = node.host.ip_json(&["link", "show", "type", "veth"]);
    for link in veths.as_array().into_iter().flatten() {
        out.push(format!("veth {}", link["ifname"].as_str().unwrap_or("?")));
    }
    for prog in ["iptables-save", "ip6tables-save"] {
        let text = String::from_utf8_lossy(&node.host.try_run(prog, &[]).stdout).into_owned();
        out.extend(
            iptables_leaks(&text)
                .into_iter()
                .map(|l| format!("{prog}: {l}")),
        );
    }
    let nft = node.host.try_run("nft", &["-j", "list", "ruleset"]);
    match serde_json::from_slice::<Value>(&nft.stdout) {
        Ok(v) => out.extend(nft_leaks(&v)),
        Err(e) => out.push(format!("nft -j list ruleset printed no JSON: {e}")),
    }
    for family in ["ipv4", "ipv6"] {
        let listed = node
            .host
            .try_run("conntrack", &["-L", "-f", family, "-o", "extended"]);
        let text = String::from_utf8_lossy(&listed.stdout);
        for line in text.lines() {
            if let Some(port) = first_dport(line) {
                if ports.contains(&port) {
                    out.push(format!("conntrack entry {line}"));
                }
            }
        }
    }
    out
}

fn file_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The chains portmap keeps for all containers: present, and empty of container rules, once
/// every pod is gone (the Go plugin leaves them too).
const SHARED_CHAINS: [&str; 3] = [
    "CNI-HOSTPORT-DNAT",
    "CNI-HOSTPORT-SETMARK",
    "CNI-HOSTPORT-MASQ",
];

/// Lines of `iptables-save` output that belong to a pod: a CNI-* chain other than the shared
/// ones, or a rule that jumps to one or names a container.
pub fn iptables_leaks(save: &str) -> Vec<String> {
    let per_pod = |chain: &str| chain.starts_with("CNI-") && !SHARED_CHAINS.contains(&chain);
    save.lines()
        .filter(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.first() {
                Some(w) if w.starts_with(':') => per_pod(&w[1..]),
                Some(&"-A") => {
                    words.iter().any(|w| per_pod(w))
                        || line.contains("id: \"")
                        || line.contains("name: \"")
                        || (words.get(1) == Some(&"CNI-HOSTPORT-DNAT"))
                }
                _ => false,
            }
        })
        .map(str::to_string)
        .collect()
}

/// Rules in portmap's `cni_hostport` tables beyond the jumps into its own chains, and any rule
/// or table naming a container.
pub fn nft_leaks(ruleset: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for item in ruleset["nftables"].as_array().into_iter().flatten() {
        let Some(rule) = item.get("rule") else {
            continue;
        };
        let text = rule.to_string();
        let ours = rule["table"] == "cni_hostport";
        let jump_only = rule["expr"].as_array().is_some_and(|e| {
            e.iter()
                .all(|x| x.get("jump").is_some() || x.get("match").is_some())
        }) && rule.get("comment").is_none();
        if (ours && !jump_only) || text.contains("soak") {
            out.push(format!("nft rule {text}"));
        }
    }
    out
}

/// The original direction's destination port of a conntrack line.
fn first_dport(line: &str) -> Option<u16> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("dport="))
        .and_then(|p| p.parse().ok())
}

/// Sends one datagram from inside `host`.
fn send_udp(host: &TestNs, to: SocketAddr) -> std::io::Result<()> {
    let path = host.path().to_path_buf();
    std::thread::scope(|s| {
        s.spawn(move || {
            let f = fs::File::open(&path)?;
            nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(std::io::Error::from)?;
            let sock = UdpSocket::bind("0.0.0.0:0")?;
            sock.send_to(b"soak", to).map(|_| ())
        })
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("the sending thread panicked")))
    })
}

/// Descendants of `top` (itself included) named `name`: the first one found.
fn find_process(top: i32, name: &str) -> Option<i32> {
    let mut todo = vec![top];
    while let Some(pid) = todo.pop() {
        if comm(pid).as_deref() == Some(name) {
            return Some(pid);
        }
        // Each thread lists the children it started itself.
        for task in fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten()
        {
            let Ok(task) = task else { continue };
            let children = fs::read_to_string(task.path().join("children")).unwrap_or_default();
            todo.extend(
                children
                    .split_whitespace()
                    .filter_map(|c| c.parse::<i32>().ok()),
            );
        }
    }
    None
}

fn comm(pid: i32) -> Option<String> {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim_end().to_string())
}

fn is_zombie(pid: i32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| rest.starts_with('Z')))
        .unwrap_or(true)
}

/// Waits until no plugin process is left in `host` (orphans of a killed parent finish on
/// their own); what still runs at the deadline, or None.
fn wait_for_orphans(host: &TestNs, limit: Duration) -> Option<String> {
    let ns = fs::read_link(host.path()).ok().or_else(|| {
        fs::metadata(host.path())
            .ok()
            .map(|m| PathBuf::from(format!("net:[{}]", std::os::unix::fs::MetadataExt::ino(&m))))
    })?;
    let give_up = Instant::now() + limit;
    loop {
        let running: Vec<String> = fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                comm(*pid).is_some_and(|c| PLUGINS.contains(&c.as_str()))
                    && !is_zombie(*pid)
                    && fs::read_link(format!("/proc/{pid}/ns/net")).ok().as_ref() == Some(&ns)
            })
            .map(|pid| format!("{} ({pid})", comm(pid).unwrap_or_default()))
            .collect();
        if running.is_empty() {
            return None;
        }
        if Instant::now() > give_up {
            return Some(running.join(", "));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iptables_leaks_skip_the_shared_chains_and_catch_container_rules() {
        let save = "*nat\n:PREROUTING ACCEPT [0:0]\n:CNI-HOSTPORT-DNAT - [0:0]\n\
:CNI-HOSTPORT-MASQ - [0:0]\n:CNI-DN-0123456789abcdef - [0:0]\n\
-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT\n\
-A CNI-HOSTPORT-MASQ -m mark --mark 0x2000/0x2000 -j MASQUERADE\n\
-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment \"dnat name: \\\"cbr0\\\" id: \\\"x\\\"\" -j CNI-DN-0123456789abcdef\n\
COMMIT\n";
        let leaks = iptables_leaks(save);
        assert_eq!(leaks.len(), 2, "{leaks:?}");
        assert!(leaks[0].starts_with(":CNI-DN-"));
        assert!(leaks[1].starts_with("-A CNI-HOSTPORT-DNAT"));
    }

    #[test]
    fn conntrack_lines_give_the_original_destination_port() {
        let line = "ipv4 2 udp 17 29 src=10.244.1.1 dst=10.244.1.1 sport=4000 dport=20007 \
[UNREPLIED] src=10.244.1.5 dst=10.244.1.1 sport=53 dport=4000 mark=0 use=1";
        assert_eq!(first_dport(line), Some(20007));
    }
}
