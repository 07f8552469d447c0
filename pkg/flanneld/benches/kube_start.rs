//! 5,000 other nodes, leases in etcd and leases from Node objects in the API server stand-in,
//! in the same run: from the daemon's start (the leases already there) to every node's route,
//! neighbour and FDB entry in the kernel, then from a burst of 5,000 more nodes to the kernel's
//! last notification of theirs (a netlink listener counts them; no table is dumped while the
//! burst is timed), and the daemon's RSS after each. The kube mode's target: within 1.5x of
//! the etcd mode's times, under 40 MiB at 5,000 nodes, no stall at start (flanneld deadlocked
//! there, flannel-io/flannel#2252). A third column has the Node objects as a real cluster holds them
//! (50 images, volumes, conditions, managed fields: about 15 KB each), which the daemon
//! should pay for no more than their annotations.
//!
//! `KUBE_START_MODES=etcd,kube,real` runs only the modes named (all three by default; a mode
//! not run shows as 0); `KUBE_START_LOGS=<dir>` keeps each daemon's log there, to read its
//! timeline (`-v=…` in `KUBE_START_ARGS` for more of it), and the stand-in's requests with the
//! burst's marks on one clock beside it. `KUBE_START_ROUNDS=n` runs each mode n times (a fresh
//! node and daemon each): the table then gives ranges, and each round of a kube mode is listed
//! with the passes the daemon's datapath took for the burst and, beside the burst, the CPU the
//! stand-in took to store it: the same work every round, so it says how fast the machine ran
//! that round. `KUBE_START_BUILDS=before=/path/to/flanneld,after=/other/flanneld` runs those
//! builds of the daemon instead of this one, their rounds interleaved (the first build's, the
//! second's, then the first's again), so that what else the machine does falls on both alike:
//! the same-run compare.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "watch/mod.rs"]
#[allow(dead_code)] // peer(): the other benches' nodes
mod watch;

use common::*;
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use testkit::kube_api::{KubeApi, FLANNEL_RULES};
use watch::{Counts, Watch};

const N: usize = 5000;
const NETWORK: &str = r#"{"Network":"10.0.0.0/8","SubnetMin":"10.1.0.0","SubnetMax":"10.99.255.0","Backend":{"Type":"vxlan"}}"#;

fn mac(i: usize) -> String {
    format!(
        "02:00:00:{:02x}:{:02x}:{:02x}",
        (i >> 16) & 0xff,
        (i >> 8) & 0xff,
        i & 0xff
    )
}

/// Node `i`'s subnet (10.100.0.0 upwards, one /24 each) and public address.
fn subnet(i: usize) -> (String, String) {
    let n = 100 * 256 + i;
    (
        format!("10.{}.{}.0", n / 256, n % 256),
        format!("172.16.{}.{}", i / 256, i % 256),
    )
}

fn etcd_leases(range: std::ops::Range<usize>) -> String {
    let mut put = String::from("\n");
    for i in range {
        let (sn, public) = subnet(i);
        let value = format!(
            r#"{{"PublicIP":"{public}","PublicIPv6":null,"BackendType":"vxlan","BackendData":{{"VNI":1,"VtepMAC":"{}"}}}}"#,
            mac(i)
        );
        let _ = writeln!(put, "put {PREFIX}/subnets/{sn}-24 {value:?}");
    }
    put.push_str("\n\n");
    put
}

/// Node `i` as Go's flanneld annotates it.
fn kube_node(i: usize) -> Value {
    let (sn, public) = subnet(i);
    json!({
        "metadata": {"name": format!("node{i}"), "annotations": {
            "flannel.alpha.coreos.com/backend-data": format!(r#"{{"VNI":1,"VtepMAC":"{}"}}"#, mac(i)),
            "flannel.alpha.coreos.com/backend-type": "vxlan",
            "flannel.alpha.coreos.com/kube-subnet-manager": "true",
            "flannel.alpha.coreos.com/public-ip": public,
        }},
        "spec": {"podCIDR": format!("{sn}/24")},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    })
}

/// Node `i` as a real cluster holds it: the kubelet's status (its 50 largest images, volumes,
/// conditions, node info), labels, kubeadm's annotations and the managed fields besides
/// flanneld's annotations.
fn real_node(i: usize) -> Value {
    let mut n = kube_node(i);
    let name = format!("node{i}");
    let images: Vec<Value> = (0..50)
        .map(|k| {
            let repo = format!("registry.example.com/team-{k}/service-{k}-{i}");
            json!({
                "names": [
                    format!("{repo}@sha256:{:064x}", (i * 50 + k) as u128 * 0x9e37_79b9_7f4a_7c15),
                    format!("{repo}:v1.{k}.{i}"),
                ],
                "sizeBytes": 10_000_000 + k * 1_234_567,
            })
        })
        .collect();
    let volumes: Vec<String> = (0..10)
        .map(|k| format!("kubernetes.io/csi/ebs.csi.aws.com^vol-{i:08x}{k:08x}"))
        .collect();
    let condition = |t: &str, s: &str, reason: &str, message: &str| {
        json!({"type": t, "status": s, "reason": reason, "message": message,
               "lastHeartbeatTime": "2026-11-27T10:00:00Z", "lastTransitionTime": "2026-11-01T08:00:00Z"})
    };
    n["metadata"]["labels"] = json!({
        "beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": "m5.2xlarge",
        "topology.kubernetes.io/region": "eu-west-1", "topology.kubernetes.io/zone": "eu-west-1b",
        "node-role.kubernetes.io/worker": "",
    });
    let ann = n["metadata"]["annotations"]
        .as_object_mut()
        .expect("annotations");
    ann.insert(
        "kubeadm.alpha.kubernetes.io/cri-socket".into(),
        "unix:///run/containerd/containerd.sock".into(),
    );
    ann.insert("node.alpha.kubernetes.io/ttl".into(), "0".into());
    ann.insert(
        "volumes.kubernetes.io/controller-managed-attach-detach".into(),
        "true".into(),
    );
    ann.insert(
        "csi.volume.kubernetes.io/nodeid".into(),
        format!(r#"{{"ebs.csi.aws.com":"i-{i:017x}"}}"#).into(),
    );
    n["metadata"]["managedFields"] = (0..4)
        .map(|k| {
            json!({"manager": format!("manager-{k}"), "operation": "Update", "apiVersion": "v1",
                   "time": "2026-11-27T10:00:00Z", "fieldsType": "FieldsV1",
                   "fieldsV1": {"f:status": {"f:conditions": {
                       "k:{\"type\":\"DiskPressure\"}": {"f:lastHeartbeatTime": {}, "f:message": {}, "f:reason": {}, "f:status": {}},
                       "k:{\"type\":\"MemoryPressure\"}": {"f:lastHeartbeatTime": {}, "f:message": {}, "f:reason": {}, "f:status": {}},
                       "k:{\"type\":\"PIDPressure\"}": {"f:lastHeartbeatTime": {}, "f:message": {}, "f:reason": {}, "f:status": {}},
                       "k:{\"type\":\"Ready\"}": {"f:lastHeartbeatTime": {}, "f:message": {}, "f:reason": {}, "f:status": {}}},
                       "f:images": {}, "f:nodeInfo": {"f:bootID": {}}, "f:volumesInUse": {}}}})
        })
        .collect();
    n["status"] = json!({
        "capacity": {"cpu": "8", "ephemeral-storage": "104845292Ki", "hugepages-1Gi": "0",
                     "hugepages-2Mi": "0", "memory": "32386544Ki", "pods": "110"},
        "allocatable": {"cpu": "7910m", "ephemeral-storage": "95551679124", "hugepages-1Gi": "0",
                        "hugepages-2Mi": "0", "memory": "31369712Ki", "pods": "110"},
        "conditions": [
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            condition("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
            condition("NetworkUnavailable", "False", "FlannelIsUp", "Flannel is running on this node"),
        ],
        "addresses": [{"type": "InternalIP", "address": format!("172.16.{}.{}", i / 256, i % 256)},
                      {"type": "Hostname", "address": name}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {"machineID": format!("{i:032x}"), "systemUUID": format!("ec2{i:029x}"),
                     "bootID": format!("{:032x}", i * 7), "kernelVersion": "6.1.0-13-cloud-amd64",
                     "osImage": "Debian GNU/Linux 12 (bookworm)", "containerRuntimeVersion": "containerd://1.7.13",
                     "kubeletVersion": "v1.30.2", "kubeProxyVersion": "v1.30.2",
                     "operatingSystem": "linux", "architecture": "amd64"},
        "images": images,
        "volumesInUse": volumes,
        "volumesAttached": volumes.iter().map(|v| json!({"name": v, "devicePath": ""})).collect::<Vec<_>>(),
    });
    n
}

struct Figures {
    start: Duration,
    burst: Duration,
    rss_start_kib: u64,
    rss_burst_kib: u64,
    marks: BurstMarks,
    /// The daemon's datapath passes that wrote the burst's entries (its log's `datapath:`
    /// lines with more than N leases).
    passes: usize,
}

/// The burst's timeline, on the start's clock, for `KUBE_START_LOGS`.
#[derive(Default)]
struct BurstMarks {
    began: Duration,
    /// The stand-in had stored the burst's objects (its watchers are woken then).
    stored: Duration,
    /// The CPU time the stand-in took to store them: the same work in every round, so it
    /// says how fast the machine ran that round.
    stored_cpu: Duration,
    /// The CPU time the daemon took from the burst's start to its entries in the kernel (in
    /// the kernel's clock ticks, 10 ms).
    daemon_cpu: Duration,
}

/// The CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only the timespec it is given.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Times the daemon `d` on `node` to N entries from `started` (the tables dumped until they
/// hold them), then runs `burst` and times it to the kernel's last notification of the N
/// more nodes' entries: nothing dumps a table while the burst is timed (the dumps took about
/// 60% of a core and the RTNL lock from the daemon, and saw the end 20 to 100 ms late), and
/// the tables are dumped after it, to check that they hold 2N.
fn measure(node: &Node, d: &Daemon, started: Instant, burst: impl FnOnce()) -> Figures {
    d.subnet(Duration::from_secs(120));
    let observer = Observer::new(node);
    let start = observer.wait(node, N, started);
    let rss_start_kib = d.memory_kib("VmRSS:");
    let watch = Watch::start(node.ns.path(), "10.0.0.0/8".parse().expect("a network"));
    let more = Counts {
        routes: N,
        neighbours: N,
        fdb: N,
        nexthops: N,
    };
    let (t, cpu, daemon_cpu) = (Instant::now(), thread_cpu(), d.cpu_time());
    burst();
    let (stored, stored_cpu) = (started.elapsed(), thread_cpu().saturating_sub(cpu));
    let last = watch.wait(more, Counts::default(), Duration::from_secs(120));
    let burst = last.saturating_duration_since(t);
    let daemon_cpu = d.cpu_time().saturating_sub(daemon_cpu);
    drop(watch);
    observer.wait(node, 2 * N, t);
    let passes = burst_passes(d);
    let marks = BurstMarks {
        began: t.saturating_duration_since(started),
        stored,
        stored_cpu,
        daemon_cpu,
    };
    Figures {
        start,
        burst,
        rss_start_kib,
        rss_burst_kib: d.memory_kib("VmRSS:"),
        marks,
        passes,
    }
}

/// How many of the daemon's datapath passes wrote for more than N leases: the burst's. The
/// last pass's line follows its writes' acknowledgements, so it is waited for (up to 5 s).
fn burst_passes(d: &Daemon) -> usize {
    let passes = |log: &str| {
        let leases = log.lines().filter_map(|l| {
            let n = l.split("datapath: ").nth(1)?.split(' ').next()?;
            n.parse::<usize>().ok()
        });
        let counts: Vec<usize> = leases.filter(|&n| n > N).collect();
        (counts.len(), counts.contains(&(2 * N)))
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (n, whole) = passes(&d.log_text());
        if whole || Instant::now() >= deadline {
            return n;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn etcd_mode(name: &str, flanneld: &Path) -> Figures {
    let node = Node::new("kse");
    let etcd = Etcd::start_with(
        &node,
        None,
        &["--max-txn-ops", "6000", "--max-request-bytes", "16777216"],
    );
    etcd.put(&node, &format!("{PREFIX}/config"), NETWORK);
    etcd.txn(&node, &etcd_leases(0..N));
    // The burst's text is made before the clocks start: the bench's own work, not etcd's.
    let more = etcd_leases(N..2 * N);
    let started = Instant::now();
    let d = Daemon::start_binary(
        &node,
        flanneld,
        "etcd",
        &["--etcd-endpoints", &etcd.client_url, "--iface", "eth0"],
        &[],
    );
    let f = measure(&node, &d, started, || etcd.txn(&node, &more));
    keep_log(&d, name);
    settle(&node, d);
    f
}

/// Stops the daemon and removes its device, and with it its 10,000 routes, neighbours, FDB
/// entries and nexthops, before the round ends. Left to the namespace's deletion, that work
/// runs later in a kernel worker holding the RTNL lock, where it held the next round's daemon
/// in its first read of the links for 250 to 430 ms (4 rounds of 10).
fn settle(node: &Node, mut d: Daemon) {
    d.kill();
    let out = node.ns.try_run("ip", &["link", "del", "flannel.1"]);
    if !out.status.success() {
        eprintln!(
            "removing flannel.1 in {}: {}",
            node.ns.name(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
}

/// The flags of `KUBE_START_ARGS`, after the bench's own.
fn extra_args() -> Vec<String> {
    std::env::var("KUBE_START_ARGS")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// Copies the daemon's log to `$KUBE_START_LOGS/<mode>.log`, when asked for.
fn keep_log(d: &Daemon, mode: &str) {
    if let Ok(dir) = std::env::var("KUBE_START_LOGS") {
        let to = std::path::Path::new(&dir).join(format!("{mode}.log"));
        if let Err(e) = std::fs::copy(&d.log, &to) {
            eprintln!("keeping the {mode} log as {}: {e}", to.display());
        }
    }
}

fn runs(mode: &str) -> bool {
    std::env::var("KUBE_START_MODES").map_or(true, |m| m.split(',').any(|x| x.trim() == mode))
}

fn skipped() -> Figures {
    Figures {
        start: Duration::ZERO,
        burst: Duration::ZERO,
        rss_start_kib: 0,
        rss_burst_kib: 0,
        marks: BurstMarks::default(),
        passes: 0,
    }
}

/// `KUBE_START_ROUNDS`: how many times each mode runs (1 by default).
fn rounds() -> usize {
    std::env::var("KUBE_START_ROUNDS")
        .ok()
        .and_then(|r| r.trim().parse().ok())
        .filter(|&r| r > 0)
        .unwrap_or(1)
}

/// Each mode run `rounds()` times, or not at all.
/// `KUBE_START_BUILDS`: the builds of flanneld to run, each with its label; this one's by
/// default (no label).
fn builds() -> Vec<(String, PathBuf)> {
    let named: Vec<(String, PathBuf)> = std::env::var("KUBE_START_BUILDS")
        .unwrap_or_default()
        .split(',')
        .filter_map(|b| {
            let (label, path) = b.trim().split_once('=')?;
            Some((label.to_string(), PathBuf::from(path)))
        })
        .collect();
    if named.is_empty() {
        vec![(String::new(), PathBuf::from(FLANNELD))]
    } else {
        named
    }
}

/// Each build's rounds of `mode` (one skipped figure each when the mode is not run), the
/// builds' rounds interleaved. Each round is given its name in `KUBE_START_LOGS`: the mode's,
/// then the build's label and the round's number where there are more than one.
fn run(
    mode: &str,
    builds: &[(String, PathBuf)],
    f: impl Fn(&str, &Path) -> Figures,
) -> Vec<Vec<Figures>> {
    let mut all: Vec<Vec<Figures>> = builds.iter().map(|_| Vec::new()).collect();
    if !runs(mode) {
        all.iter_mut().for_each(|b| b.push(skipped()));
        return all;
    }
    let n = rounds();
    for i in 1..=n {
        for ((label, path), figures) in builds.iter().zip(all.iter_mut()) {
            let mut name = mode.to_string();
            if !label.is_empty() {
                name = format!("{name}-{label}");
            }
            if n > 1 {
                name = format!("{name}-{i}");
            }
            figures.push(f(&name, path));
        }
    }
    all
}

/// The smallest and the largest of `xs`.
fn bounds(xs: &[f64]) -> (f64, f64) {
    xs.iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)))
}

/// The slowest over the fastest of `xs`, and the smallest such ratio over any five in a
/// row (None with fewer than five).
fn spreads(xs: &[f64]) -> (f64, Option<f64>) {
    let ratio = |w: &[f64]| match bounds(w) {
        (min, max) if min > 0.0 => max / min,
        _ => 0.0,
    };
    let five = xs.windows(5).map(ratio).reduce(f64::min);
    (ratio(xs), five)
}

fn kube_mode(name: &str, flanneld: &Path, node_object: fn(usize) -> Value) -> Figures {
    let node = Node::new("ksk");
    let mut api = KubeApi::start(
        Some(node.ns.path()),
        "127.0.0.1:6443".parse().expect("an address"),
        node.dir.path(),
    );
    let user = api.add_user(
        "system:serviceaccount:kube-flannel:flannel",
        Some(FLANNEL_RULES),
    );
    api.create_node(json!({"metadata": {"name": "bench"}, "spec": {"podCIDR": "10.1.0.0/24"}}));
    api.create_nodes((0..N).map(node_object));
    let conf = node.path("net-conf.json");
    std::fs::write(&conf, NETWORK).expect("writing net-conf.json");
    let (kubeconfig, conf) = (
        user.kubeconfig.display().to_string(),
        conf.display().to_string(),
    );
    // The burst's Node objects are made before the clocks start: the bench's own work, not
    // the API server's (which stores and encodes each, in the clock) nor the daemon's.
    let more: Vec<Value> = (N..2 * N).map(node_object).collect();
    let extra = extra_args();
    let mut args = vec![
        "--kube-subnet-mgr",
        "--kubeconfig-file",
        &kubeconfig,
        "--net-config-path",
        &conf,
        "--iface",
        "eth0",
    ];
    args.extend(extra.iter().map(String::as_str));
    let (started, wall) = (Instant::now(), std::time::SystemTime::now());
    let d = Daemon::start_binary(&node, flanneld, "kube", &args, &[("NODE_NAME", "bench")]);
    let f = measure(&node, &d, started, || api.create_nodes(more));
    keep_log(&d, name);
    if let Ok(dir) = std::env::var("KUBE_START_LOGS") {
        // The stand-in's requests, ms from the daemon's start: when each answer was ready;
        // the burst's marks on the same clock, and the start in the daemon log's time.
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let m = &f.marks;
        let mut text = format!(
            "daemon started at {:.6} s since 1970 (UTC)\n{:9.1} the burst began\n{:9.1} the stand-in had stored it ({:.1} ms of its CPU)\n{:9.1} its entries were in the kernel ({:.0} ms of the daemon's CPU since the burst began)\n",
            wall.duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs_f64(),
            ms(m.began),
            ms(m.stored),
            ms(m.stored_cpu),
            ms(m.began + f.burst),
            ms(m.daemon_cpu),
        );
        for r in api.requests() {
            let ms = r.at.saturating_duration_since(started).as_secs_f64() * 1e3;
            let _ = writeln!(
                text,
                "{ms:9.1} {} {} {} {}",
                r.code, r.verb, r.path, r.query
            );
        }
        let to = std::path::Path::new(&dir).join(format!("{name}.requests"));
        if let Err(e) = std::fs::write(&to, text) {
            eprintln!("keeping the stand-in's requests as {}: {e}", to.display());
        }
    }
    settle(&node, d);
    f
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let builds = builds();
    let etcd = run("etcd", &builds, etcd_mode);
    let kube = run("kube", &builds, |name, bin| kube_mode(name, bin, kube_node));
    let real = run("real", &builds, |name, bin| kube_mode(name, bin, real_node));
    let size = |f: fn(usize) -> Value| f(N / 2).to_string().len() as f64 / 1024.0;
    println!(
        "{N} other nodes: leases in etcd against leases from Node objects (API server stand-in), \
         the Nodes with flanneld's annotations only ({:.1} KB) and as a real cluster holds them \
         ({:.1} KB); {} round(s) each",
        size(kube_node),
        size(real_node),
        rounds()
    );
    for (i, (label, path)) in builds.iter().enumerate() {
        if !label.is_empty() {
            println!("\n{label}: {}", path.display());
        }
        table(&etcd[i], &kube[i], &real[i]);
    }
}

/// One build's figures: the table (ranges over the rounds), then each kube mode's rounds.
fn table(etcd: &[Figures], kube: &[Figures], real: &[Figures]) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    // One round's figure, or the range over the rounds.
    let range = |fs: &[Figures], f: &dyn Fn(&Figures) -> f64, unit: &str| {
        let xs: Vec<f64> = fs.iter().map(f).collect();
        let (lo, hi) = bounds(&xs);
        let p = if unit.is_empty() { 0 } else { 1 };
        if (hi - lo).abs() < f64::EPSILON {
            format!("{lo:.p$}{unit}")
        } else {
            format!("{lo:.p$} to {hi:.p$}{unit}")
        }
    };
    let median = |fs: &[Figures], f: &dyn Fn(&Figures) -> f64| {
        let mut xs: Vec<f64> = fs.iter().map(f).collect();
        xs.sort_by(f64::total_cmp);
        xs[xs.len() / 2]
    };
    println!("| | etcd mode | kube mode | kube / etcd (medians) | kube mode, real Nodes |");
    println!("|---|---:|---:|---:|---:|");
    let start = |f: &Figures| ms(f.start);
    let burst = |f: &Figures| ms(f.burst);
    let rss_start = |f: &Figures| f.rss_start_kib as f64 / 1024.0;
    let rss_burst = |f: &Figures| f.rss_burst_kib as f64 / 1024.0;
    for (what, f) in [
        (
            "start to every entry in the kernel (ms)",
            &start as &dyn Fn(&Figures) -> f64,
        ),
        ("a burst of 5,000 more to theirs (ms)", &burst),
    ] {
        // A mode not run (KUBE_START_MODES) has no ratio.
        let (e, k) = (median(etcd, f), median(kube, f));
        let ratio = if e == 0.0 || k == 0.0 {
            "-".to_string()
        } else {
            format!("{:.2}x", k / e)
        };
        println!(
            "| {what} | {} | {} | {ratio} | {} |",
            range(etcd, f, ""),
            range(kube, f, ""),
            range(real, f, "")
        );
    }
    for (what, f) in [
        ("RSS at 5,000", &rss_start as &dyn Fn(&Figures) -> f64),
        ("RSS at 10,000", &rss_burst),
    ] {
        println!(
            "| {what} | {} | {} | | {} |",
            range(etcd, f, " MiB"),
            range(kube, f, " MiB"),
            range(real, f, " MiB")
        );
    }
    for (mode, fs) in [("kube", kube), ("real", real)] {
        if fs.len() < 2 {
            continue;
        }
        let bursts: Vec<f64> = fs.iter().map(burst).collect();
        let control: Vec<f64> = fs.iter().map(|f| ms(f.marks.stored_cpu)).collect();
        let list = |xs: &[f64]| {
            xs.iter()
                .map(|x| format!("{x:.0}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let passes: Vec<String> = fs.iter().map(|f| f.passes.to_string()).collect();
        let five = |r: Option<f64>| r.map_or("-".to_string(), |r| format!("{r:.2}x"));
        let (b_all, b_five) = spreads(&bursts);
        let (c_all, c_five) = spreads(&control);
        println!("\n{mode} mode, round by round:");
        println!("  the burst (ms): {}", list(&bursts));
        println!(
            "  the stand-in's CPU storing it, the same work each round (ms): {}",
            list(&control)
        );
        println!("  the datapath's passes for it: {}", passes.join(" "));
        println!(
            "  slowest / fastest: the burst {b_all:.2}x (best five in a row {}), \
             the stand-in's fixed work {c_all:.2}x (best five in a row {})",
            five(b_five),
            five(c_five)
        );
    }
}
