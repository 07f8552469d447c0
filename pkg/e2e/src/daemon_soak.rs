//! The daemon's soak: churn on a three-node cluster (testkit::cluster, leases in a real etcd)
//! for as long as asked. Nodes that exist only as leases join and leave at a steady rate (a put
//! and a delete in etcd each), and pods are added and deleted through the plugins (the stock
//! conflist: flannel, bridge, host-local, portmap) on the three nodes. Each flanneld's RSS and
//! open file descriptors are sampled throughout; after the warm-up they must stay within 5% of
//! what they were when it ended. At the end every pod and every joined lease is gone, and each
//! node must hold what it held before the churn: its links, addresses, rules, routes,
//! neighbours and vxlan FDB, its iptables rules (per-pod chains and rules leak there), no
//! host-local reservation and no saved flannel delegate; no address was handed to two live
//! pods, and no daemon restarted.

use crate::soak::iptables_leaks;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use testkit::cluster::{wait_for, Cluster, Registry, ETCD_PREFIX};
use testkit::{bin_dir, conflist, unique_name, Invocation, TestNs};

/// The real nodes take subnets 1 to 9; the joining nodes' leases 10 to 250.
const CONFIG: &str = r#"{"Network":"10.40.0.0/16","SubnetMin":"10.40.1.0","SubnetMax":"10.40.9.0","Backend":{"Type":"vxlan"}}"#;
const NET: u8 = 140;
const NODES: u8 = 3;
const T: Duration = Duration::from_secs(60);
/// Leased nodes alive at once: each join beyond it makes the oldest leave.
const LEASED_NODES: usize = 100;
/// Runtimes adding and deleting pods at once on each node, and the pods each keeps alive: each
/// add beyond them deletes its oldest.
const RUNTIMES_PER_NODE: u16 = 3;
const PODS_PER_RUNTIME: usize = 2;
/// How much RSS and open descriptors may move after the warm-up.
const FLAT: f64 = 0.05;

#[derive(Clone, Debug)]
pub struct Options {
    pub duration: Duration,
    /// Samples before its end are not held to FLAT; its last minute is the reference.
    pub warmup: Duration,
    pub joins_per_s: u32,
    pub pods_per_s: u32,
    /// How often each flanneld's RSS and descriptors are read.
    pub sample_every: Duration,
}

impl Options {
    pub fn new(duration: Duration) -> Options {
        Options {
            duration,
            warmup: Duration::from_secs(300).min(duration / 4),
            joins_per_s: 10,
            pods_per_s: 20,
            sample_every: Duration::from_secs(10),
        }
    }
}

/// One reading of one node's flanneld.
#[derive(Clone, Debug)]
pub struct Sample {
    pub at: Duration,
    pub node: u8,
    pub rss_kib: u64,
    pub fds: u64,
}

#[derive(Debug, Default)]
pub struct Report {
    pub elapsed: Duration,
    pub joins: usize,
    pub leaves: usize,
    pub pods_added: usize,
    pub pods_deleted: usize,
    pub samples: Vec<Sample>,
    /// Per node: RSS and descriptors at the warm-up's end, and the furthest either went after.
    pub flatness: BTreeMap<u8, Flatness>,
    pub problems: Vec<String>,
    pub leaks: Vec<String>,
    /// `uptime` at the start and at the end: the soak shares the machine.
    pub load: (String, String),
}

#[derive(Debug, Default, Clone)]
pub struct Flatness {
    pub rss_kib: u64,
    pub rss_range: (u64, u64),
    pub fds: u64,
    pub fds_range: (u64, u64),
}

impl Report {
    pub fn passed(&self) -> bool {
        self.problems.is_empty() && self.leaks.is_empty()
    }

    pub fn summary(&self) -> String {
        let secs = self.elapsed.as_secs_f64().max(1.0);
        let mut s = format!(
            "{:.0} s: {} joins and {} leaves ({:.1}/s each), {} pods added and {} deleted \
             ({:.1}/s each) on {NODES} nodes\nload at start: {}\nload at end:   {}\n",
            secs,
            self.joins,
            self.leaves,
            self.joins as f64 / secs,
            self.pods_added,
            self.pods_deleted,
            self.pods_added as f64 / secs,
            self.load.0,
            self.load.1
        );
        s += "flanneld  RSS at warm-up's end (after: min-max)   fds (after: min-max)\n";
        for (node, f) in &self.flatness {
            s += &format!(
                "node {node}    {} KiB ({}-{})              {} ({}-{})\n",
                f.rss_kib, f.rss_range.0, f.rss_range.1, f.fds, f.fds_range.0, f.fds_range.1
            );
        }
        for p in &self.problems {
            s += &format!("PROBLEM: {p}\n");
        }
        for l in &self.leaks {
            s += &format!("LEAK: {l}\n");
        }
        s
    }
}

fn uptime() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().take(3).collect();
            format!("load average {}", f.join(", "))
        })
        .unwrap_or_default()
}

/// etcd's JSON gateway over one kept-alive connection, opened in the underlay namespace.
struct Gateway {
    stream: BufReader<TcpStream>,
    host: String,
}

fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

impl Gateway {
    fn open(underlay: &TestNs, url: &str) -> Gateway {
        let host = url.trim_start_matches("http://").to_string();
        let addr = host.clone();
        let stream = underlay
            .run_inside(move || TcpStream::connect(&addr))
            .unwrap_or_else(|e| panic!("connecting to etcd at {host}: {e}"));
        Gateway {
            stream: BufReader::new(stream),
            host,
        }
    }

    fn post(&mut self, path: &str, body: &Value) -> Result<Value, String> {
        let body = body.to_string();
        let req = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            self.host,
            body.len()
        );
        let s = self.stream.get_mut();
        s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
        let mut status = String::new();
        self.stream
            .read_line(&mut status)
            .map_err(|e| e.to_string())?;
        let mut length = 0usize;
        loop {
            let mut line = String::new();
            self.stream
                .read_line(&mut line)
                .map_err(|e| e.to_string())?;
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some(v) = line
                .to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().to_string())
            {
                length = v.parse().map_err(|e| format!("{line}: {e}"))?;
            }
        }
        let mut buf = vec![0; length];
        self.stream
            .read_exact(&mut buf)
            .map_err(|e| e.to_string())?;
        if !status.contains(" 200 ") {
            return Err(format!(
                "{}: {}",
                status.trim(),
                String::from_utf8_lossy(&buf)
            ));
        }
        serde_json::from_slice(&buf).map_err(|e| e.to_string())
    }

    fn put(&mut self, key: &str, value: &str) -> Result<(), String> {
        let body = json!({"key": base64(key.as_bytes()), "value": base64(value.as_bytes())});
        self.post("/v3/kv/put", &body).map(|_| ())
    }

    fn delete(&mut self, key: &str) -> Result<(), String> {
        let body = json!({"key": base64(key.as_bytes())});
        self.post("/v3/kv/deleterange", &body).map(|_| ())
    }
}

/// A node that exists only as its lease: subnet `n` (10 to 250).
fn lease(n: u8) -> (String, String) {
    (
        format!("{ETCD_PREFIX}/subnets/10.40.{n}.0-24"),
        format!(
            r#"{{"PublicIP":"192.168.{NET}.{n}","PublicIPv6":null,"BackendType":"vxlan","BackendData":{{"VNI":1,"VtepMAC":"02:00:00:40:00:{n:02x}"}}}}"#
        ),
    )
}

/// What a node holds that a pod or a leased node could leave behind, each kind's lines sorted
/// (the kernel lists neighbours in its hash's order, which changes as entries come and go).
fn state(c: &Cluster, index: u8) -> BTreeMap<&'static str, String> {
    let mut s = listed(c, index);
    for text in s.values_mut() {
        let mut lines: Vec<&str> = text.lines().collect();
        lines.sort_unstable();
        *text = lines.iter().map(|l| format!("{l}\n")).collect();
    }
    s
}

fn listed(c: &Cluster, index: u8) -> BTreeMap<&'static str, String> {
    let ns = &c.node(index).ns;
    let run = |prog: &str, args: &[&str]| {
        String::from_utf8_lossy(&ns.try_run(prog, args).stdout).into_owned()
    };
    let mut s = BTreeMap::new();
    s.insert(
        "links",
        run("ip", &["-o", "link", "show"])
            .lines()
            .map(|l| {
                // Name and kind only: counters and flags move.
                l.split(':').nth(1).unwrap_or_default().trim().to_string() + "\n"
            })
            .collect(),
    );
    s.insert(
        "addresses",
        run("ip", &["-o", "addr", "show"])
            .lines()
            .map(|l| l.split_whitespace().take(4).collect::<Vec<_>>().join(" ") + "\n")
            .collect(),
    );
    s.insert("rules", run("ip", &["rule"]) + &run("ip", &["-6", "rule"]));
    s.insert(
        "routes",
        run("ip", &["route"]) + &run("ip", &["-6", "route"]),
    );
    s.insert(
        "neighbours",
        run("ip", &["neigh", "show", "dev", "flannel.1"])
            .lines()
            .filter(|l| l.contains("PERMANENT"))
            .map(|l| format!("{l}\n"))
            .collect(),
    );
    s.insert("fdb", run("bridge", &["fdb", "show", "dev", "flannel.1"]));
    let save = run("iptables-save", &[]);
    s.insert(
        "iptables",
        save.lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| match l.find(" [") {
                Some(i) if l.starts_with(':') => format!("{}\n", &l[..i]),
                _ => format!("{l}\n"),
            })
            .collect(),
    );
    s
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

/// Files a node keeps for live pods only: host-local's reservations, flannel's saved delegates.
fn pod_files(c: &Cluster, index: u8) -> Vec<String> {
    let dir = &c.node(index).dir;
    let mut out = Vec::new();
    for net in file_names(&dir.join("networks")) {
        for name in file_names(&dir.join("networks").join(&net)) {
            if name != "lock" && !name.starts_with("last_reserved_ip.") {
                out.push(format!("host-local reservation {net}/{name}"));
            }
        }
    }
    for name in file_names(&dir.join("flannel")) {
        out.push(format!("flannel's saved delegate {name}"));
    }
    out
}

fn ports(port: u16) -> Map<String, Value> {
    Map::from_iter([(
        "portMappings".to_string(),
        json!([{"hostPort": port, "containerPort": 80, "protocol": "tcp"}]),
    )])
}

struct LivePod {
    port: u16,
    id: String,
    ns: TestNs,
    result: Value,
    ip: String,
}

/// A pod on node `index` with one host port mapped (portmap's per-pod rules leak there).
fn add_pod(c: &Cluster, index: u8, port: u16) -> Result<LivePod, String> {
    let plugins = c.node_plugins(index);
    let ns = TestNs::new(&format!("dsp{index}"));
    let id = unique_name("soak");
    let base = Invocation::at(plugins.join("flannel"), "ADD")
        .container_id(&id)
        .netns(&ns.path_str())
        .path(&plugins.display().to_string());
    let result = conflist::add(
        &c.node_conflist(index),
        &base,
        Some(&c.node(index).ns),
        &ports(port),
    )
    .map_err(|out| format!("ADD on node {index}: {} {}", out.stdout, out.stderr))?;
    let ip = result["ips"][0]["address"]
        .as_str()
        .and_then(|a| a.split('/').next())
        .ok_or_else(|| format!("ADD on node {index}: no address in {result}"))?
        .to_string();
    Ok(LivePod {
        port,
        id,
        ns,
        result,
        ip,
    })
}

fn del_pod(c: &Cluster, index: u8, pod: &LivePod) -> Result<(), String> {
    let plugins = c.node_plugins(index);
    let base = Invocation::at(plugins.join("flannel"), "DEL")
        .container_id(&pod.id)
        .netns(&pod.ns.path_str())
        .path(&plugins.display().to_string());
    conflist::del(
        &c.node_conflist(index),
        &base,
        Some(&c.node(index).ns),
        &ports(pod.port),
        Some(&pod.result),
    )
    .map_err(|out| {
        format!(
            "DEL of {} on node {index}: {} {}",
            pod.id, out.stdout, out.stderr
        )
    })
}

fn rss_and_fds(pid: u32) -> Option<(u64, u64)> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let fds = fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    Some((rss, fds))
}

pub fn run(opts: &Options) -> Report {
    let mut report = Report {
        load: (uptime(), String::new()),
        ..Report::default()
    };
    let mut c = Cluster::new("dsk", NET, NODES, Registry::Etcd, CONFIG);
    c.start_flanneld_everywhere(&bin_dir().join("flanneld"), T);
    // A first pod on each node makes its bridge; the state before the churn is taken after.
    for i in 1..=NODES {
        let pod = add_pod(&c, i, 20000).unwrap_or_else(|e| panic!("{e}"));
        del_pod(&c, i, &pod).unwrap_or_else(|e| panic!("{e}"));
    }
    for i in 1..=NODES {
        wait_for(&format!("node {i}'s routes to the other nodes"), T, || {
            let routes = c.node(i).routes();
            (routes.matches("flannel.1").count() >= usize::from(NODES) - 1).then_some(())
        });
    }
    let before: Vec<_> = (1..=NODES).map(|i| state(&c, i)).collect();
    let pids: Vec<u32> = (1..=NODES)
        .map(|i| c.flanneld_pid(i).expect("flanneld's pid"))
        .collect();
    let url = c.etcd_url().expect("etcd").to_string();

    let stop = AtomicBool::new(false);
    let joins = AtomicUsize::new(0);
    let leaves = AtomicUsize::new(0);
    let added = AtomicUsize::new(0);
    let deleted = AtomicUsize::new(0);
    let problems = Mutex::new(Vec::new());
    let samples = Mutex::new(Vec::new());
    let held: Vec<Mutex<HashSet<String>>> =
        (0..NODES).map(|_| Mutex::new(HashSet::new())).collect();
    let started = Instant::now();
    let c = &c;
    std::thread::scope(|s| {
        // Leased nodes: one joins every 1/joins_per_s, the oldest leaves once LEASED_NODES live.
        s.spawn(|| {
            let mut gw = Gateway::open(&c.underlay, url.split(',').next().unwrap_or(&url));
            let mut live: VecDeque<u8> = VecDeque::new();
            let mut next = 10u8;
            let period = Duration::from_secs(1) / opts.joins_per_s.max(1);
            let mut due = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                let (key, value) = lease(next);
                match gw.put(&key, &value) {
                    Ok(()) => {
                        joins.fetch_add(1, Ordering::Relaxed);
                        live.push_back(next);
                    }
                    Err(e) => problems.lock().unwrap().push(format!("joining {key}: {e}")),
                }
                next = if next >= 250 { 10 } else { next + 1 };
                if live.len() > LEASED_NODES {
                    let (old, _) = lease(live.pop_front().expect("a leased node"));
                    match gw.delete(&old) {
                        Ok(()) => {
                            leaves.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => problems.lock().unwrap().push(format!("leaving {old}: {e}")),
                    }
                }
                due += period;
                std::thread::sleep(due.saturating_duration_since(Instant::now()));
            }
            for n in live {
                let (key, _) = lease(n);
                if gw.delete(&key).is_ok() {
                    leaves.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        // Pods: each runtime adds one every runtimes/pods_per_s, deleting its oldest; the
        // addresses live on a node are held in one set.
        let runtimes = u32::from(NODES) * u32::from(RUNTIMES_PER_NODE);
        for (i, w) in (1..=NODES).flat_map(|i| (0..RUNTIMES_PER_NODE).map(move |w| (i, w))) {
            let (stop, added, deleted, problems) = (&stop, &added, &deleted, &problems);
            let held = &held[usize::from(i) - 1];
            s.spawn(move || {
                let mut live: VecDeque<LivePod> = VecDeque::new();
                let period = Duration::from_secs(u64::from(runtimes)) / opts.pods_per_s.max(1);
                let mut due = Instant::now();
                let mut seq = 0u16;
                while !stop.load(Ordering::Relaxed) {
                    seq = seq.wrapping_add(1);
                    match add_pod(c, i, 20000 + w * 3000 + seq % 3000) {
                        Ok(pod) => {
                            added.fetch_add(1, Ordering::Relaxed);
                            if !held.lock().unwrap().insert(pod.ip.clone()) {
                                problems.lock().unwrap().push(format!(
                                    "node {i}: {} handed to pod {} while another live pod has it",
                                    pod.ip, pod.id
                                ));
                            }
                            live.push_back(pod);
                        }
                        Err(e) => problems.lock().unwrap().push(e),
                    }
                    if live.len() > PODS_PER_RUNTIME {
                        let pod = live.pop_front().expect("a pod");
                        match del_pod(c, i, &pod) {
                            Ok(()) => {
                                deleted.fetch_add(1, Ordering::Relaxed);
                                held.lock().unwrap().remove(&pod.ip);
                            }
                            Err(e) => problems.lock().unwrap().push(e),
                        }
                    }
                    due += period;
                    // Behind schedule (a loaded machine), it goes on at once without catching up.
                    let now = Instant::now();
                    if due < now {
                        due = now;
                    }
                    std::thread::sleep(due.saturating_duration_since(now));
                }
                for pod in live {
                    match del_pod(c, i, &pod) {
                        Ok(()) => {
                            deleted.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => problems.lock().unwrap().push(e),
                    }
                }
            });
        }
        // The daemons' RSS and descriptors, and the clock.
        let mut next = Instant::now();
        while started.elapsed() < opts.duration {
            for (k, pid) in pids.iter().enumerate() {
                let node = k as u8 + 1;
                match rss_and_fds(*pid) {
                    Some((rss_kib, fds)) => samples.lock().unwrap().push(Sample {
                        at: started.elapsed(),
                        node,
                        rss_kib,
                        fds,
                    }),
                    None => problems
                        .lock()
                        .unwrap()
                        .push(format!("node {node}'s flanneld (pid {pid}) is gone")),
                }
            }
            next += opts.sample_every;
            std::thread::sleep(
                next.saturating_duration_since(Instant::now())
                    .min(opts.duration.saturating_sub(started.elapsed())),
            );
        }
        stop.store(true, Ordering::Relaxed);
    });
    report.elapsed = started.elapsed();
    report.joins = joins.into_inner();
    report.leaves = leaves.into_inner();
    report.pods_added = added.into_inner();
    report.pods_deleted = deleted.into_inner();
    report.problems = problems.into_inner().unwrap_or_default();
    report.samples = samples.into_inner().unwrap_or_default();

    for (k, pid) in pids.iter().enumerate() {
        let i = k as u8 + 1;
        // A daemon that died is a zombie by now, without VmRSS.
        if rss_and_fds(*pid).is_none() {
            report
                .problems
                .push(format!("node {i}'s flanneld did not run throughout"));
        }
    }
    // Every pod and leased node is gone: each node must come back to what it held before.
    for i in 1..=NODES {
        let want = &before[usize::from(i) - 1];
        let settled = Instant::now();
        let mut now = state(c, i);
        while &now != want && settled.elapsed() < T {
            std::thread::sleep(Duration::from_millis(500));
            now = state(c, i);
        }
        for (what, text) in &now {
            let was = &want[what];
            if text != was {
                let gone: Vec<&str> = was.lines().filter(|l| !text.contains(l)).collect();
                let extra: Vec<&str> = text.lines().filter(|l| !was.contains(l)).collect();
                report.leaks.push(format!(
                    "node {i}'s {what}: now has {extra:?}, lost {gone:?}"
                ));
            }
        }
        report.leaks.extend(
            pod_files(c, i)
                .into_iter()
                .map(|f| format!("node {i}: {f}")),
        );
        report.leaks.extend(
            iptables_leaks(&now["iptables"])
                .into_iter()
                .map(|l| format!("node {i}: iptables {l}")),
        );
    }
    report.flatness = flatness(&report.samples, opts.warmup);
    for (node, f) in &report.flatness {
        let off = |v: u64, base: u64| (v as f64 - base as f64).abs() / (base.max(1) as f64);
        for (what, base, (lo, hi)) in [
            ("RSS", f.rss_kib, f.rss_range),
            ("open descriptors", f.fds, f.fds_range),
        ] {
            let worst = off(lo, base).max(off(hi, base));
            if worst > FLAT {
                report.problems.push(format!(
                    "node {node}'s flanneld: {what} went from {base} to {lo}-{hi} after the \
                     warm-up ({:.1}%, more than {:.0}%)",
                    worst * 100.0,
                    FLAT * 100.0
                ));
            }
        }
    }
    report.load.1 = uptime();
    report
}

/// Per node: RSS (median) and descriptors (least; transient sockets come and go) over the
/// minute before the warm-up's end, then each minute's after it, as (reference, (min, max)).
fn flatness(samples: &[Sample], warmup: Duration) -> BTreeMap<u8, Flatness> {
    let minute = Duration::from_secs(60).min(warmup.max(Duration::from_secs(10)));
    let mut out = BTreeMap::new();
    let nodes: std::collections::BTreeSet<u8> = samples.iter().map(|s| s.node).collect();
    for node in nodes {
        let of: Vec<&Sample> = samples.iter().filter(|s| s.node == node).collect();
        let window = |from: Duration, to: Duration| -> Option<(u64, u64)> {
            let mut rss: Vec<u64> = of
                .iter()
                .filter(|s| s.at >= from && s.at < to)
                .map(|s| s.rss_kib)
                .collect();
            let fds = of
                .iter()
                .filter(|s| s.at >= from && s.at < to)
                .map(|s| s.fds)
                .min()?;
            rss.sort_unstable();
            Some((rss[rss.len() / 2], fds))
        };
        let Some((rss_kib, fds)) = window(warmup.saturating_sub(minute), warmup) else {
            continue;
        };
        let end = of.last().map(|s| s.at).unwrap_or_default() + Duration::from_secs(1);
        let mut f = Flatness {
            rss_kib,
            rss_range: (rss_kib, rss_kib),
            fds,
            fds_range: (fds, fds),
        };
        let mut from = warmup;
        while from < end {
            if let Some((r, d)) = window(from, from + minute) {
                f.rss_range = (f.rss_range.0.min(r), f.rss_range.1.max(r));
                f.fds_range = (f.fds_range.0.min(d), f.fds_range.1.max(d));
            }
            from += minute;
        }
        out.insert(node, f);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_as_etcd_reads_it() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(
            base64(b"/coreos.com/network"),
            "L2NvcmVvcy5jb20vbmV0d29yaw=="
        );
    }

    #[test]
    fn flatness_is_measured_against_the_warm_ups_last_minute() {
        let s = |at: u64, rss_kib: u64, fds: u64| Sample {
            at: Duration::from_secs(at),
            node: 1,
            rss_kib,
            fds,
        };
        let samples = [
            s(0, 100, 9),
            s(250, 1000, 12),
            s(260, 1010, 11),
            s(310, 1020, 13),
            s(400, 1040, 11),
        ];
        let f = &flatness(&samples, Duration::from_secs(300))[&1];
        assert_eq!((f.rss_kib, f.fds), (1010, 11));
        assert_eq!(f.rss_range, (1010, 1040));
        assert_eq!(f.fds_range, (11, 13));
    }
}
