//! flannel-netpol at scale, on one node (a namespace of its own) against the API server
//! stand-in: a cluster of 5,000 pods in 50 namespaces (110 of them on this node) and 1,000
//! policies. Measured: from the enforcer's start to the table in the kernel; from an API write
//! to the kernel's (last) commit of its consequence (200 writes: a peer pod's label, a policy made and
//! deleted), p50/p99; the enforcer's RSS; and an allowed pair of real pods on the node's bridge
//! (one isolated by ten of the policies) against the same pair with no table: TCP connections
//! per second and iperf3's throughput, each side by side in the same run, alternated.
//!
//!   cargo bench -p flannel-netpol --bench scale      (as root; iperf3 for the throughput)
//!
//! `NETPOL_PAIR_ROUNDS` (6): the pair's rounds, alternated with and without the table;
//! `NETPOL_IPERF_SECS` (10): each iperf3 run's seconds (3-second runs swung 0.87x to 1.09x).

use cni_kernel::nft_commits::{Commit, TableCommits};
use nix::sys::socket::{setsockopt, sockopt::Linger};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use testkit::kube_api::{Kind, KubeApi, NETPOL_RULES};
use testkit::TestNs;

const NETPOL: &str = env!("CARGO_BIN_EXE_flannel-netpol");
const PODS: usize = 5000;
const LOCAL: usize = 110;
const NAMESPACES: usize = 50;
const POLICIES: usize = 1000;
const EVENTS: usize = 200;
const SERVER: &str = "10.244.1.2";
const CLIENT: &str = "10.244.1.3";

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Pod `j`: namespace ns<j%50>, labels app=a<j%20>, role=r<j%5>; the first 110 on node1.
fn pod(j: usize) -> (String, Value, String) {
    let ns = format!("ns{}", j % NAMESPACES);
    let node = if j < LOCAL {
        "node1".to_string()
    } else {
        format!("node{}", 2 + j % 45)
    };
    let ip = format!("10.100.{}.{}", j / 250, 1 + j % 250);
    let obj = json!({
        "metadata": {"name": format!("p{j}"),
                     "labels": {"app": format!("a{}", j % 20), "role": format!("r{}", j % 5)}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "ports": [
            {"name": "http", "containerPort": 8080}, {"name": "metrics", "containerPort": 9090}]}]}
    });
    (ns, obj, ip)
}

/// Policy `k` in ns<k%50>: pods app=a<k%20> admit role=r<k%5> of the namespaces of team
/// t<k%10> on 8080 and the named port metrics; every fourth also limits egress to 10.0.0.0/8
/// but one /16, UDP 53.
fn policy(k: usize) -> (String, Value) {
    let mut spec = json!({
        "podSelector": {"matchLabels": {"app": format!("a{}", k % 20)}},
        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": format!("t{}", k % 10)}},
                               "podSelector": {"matchLabels": {"role": format!("r{}", k % 5)}}}],
                     "ports": [{"port": 8080}, {"port": "metrics"}]}]
    });
    if k.is_multiple_of(4) {
        spec["policyTypes"] = json!(["Ingress", "Egress"]);
        spec["egress"] = json!([{"to": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.99.0.0/16"]}}],
                                 "ports": [{"port": 53, "protocol": "UDP"}]}]);
    }
    (
        format!("ns{}", k % NAMESPACES),
        json!({"metadata": {"name": format!("pol{k}")}, "spec": spec}),
    )
}

fn set_status(api: &KubeApi, ns: &str, name: &str, ip: &str) -> u64 {
    let p = api
        .patch(
            Kind::Pod,
            ns,
            name,
            true,
            &json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}}),
        )
        .unwrap();
    p["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

fn cluster(api: &KubeApi) {
    for i in 0..NAMESPACES {
        api.create(
            Kind::Namespace,
            "",
            json!({"metadata": {"name": format!("ns{i}"),
            "labels": {"team": format!("t{}", i % 10)}}}),
        )
        .unwrap();
    }
    for j in 0..PODS {
        let (ns, obj, ip) = pod(j);
        api.create(Kind::Pod, &ns, obj).unwrap();
        set_status(api, &ns, &format!("p{j}"), &ip);
    }
    // The real pair: the server in ns0 (app=a0: ten policies select it, admitting role=r0 of
    // team t0), the client in ns10 (team t0) with role=r0, both on node1.
    for (ns, name, ip, labels) in [
        ("ns0", "server", SERVER, json!({"app": "a0", "role": "r3"})),
        ("ns10", "client", CLIENT, json!({"app": "a7", "role": "r0"})),
    ] {
        api.create(Kind::Pod, ns, json!({"metadata": {"name": name, "labels": labels},
            "spec": {"nodeName": "node1", "containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8080}]}]}}))
            .unwrap();
        set_status(api, ns, name, ip);
    }
    for k in 0..POLICIES {
        let (ns, obj) = policy(k);
        api.create(Kind::NetworkPolicy, &ns, obj).unwrap();
    }
}

struct Enforcer {
    child: Child,
    log: std::path::PathBuf,
}

impl Enforcer {
    fn start(ns: &TestNs, kubeconfig: &std::path::Path, log: std::path::PathBuf) -> Enforcer {
        let file = std::fs::File::create(&log).unwrap();
        let child = ns
            .command(NETPOL)
            .args([
                "--kubeconfig",
                &kubeconfig.display().to_string(),
                "--hostname-override",
                "node1",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .unwrap();
        Enforcer { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for `needle` in the log; the time it took from `since`.
    fn wait(&self, needle: &str, since: Instant) -> Duration {
        let limit = Instant::now() + Duration::from_secs(120);
        while !self.log().contains(needle) {
            assert!(Instant::now() < limit, "no {needle:?} in:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(2));
        }
        since.elapsed()
    }
}

impl Drop for Enforcer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// The node's bridge with the two pods of the pair on it.
fn pair(node: &TestNs) -> (TestNs, TestNs) {
    node.ip(&["link", "add", "br0", "type", "bridge"]);
    node.ip(&["addr", "add", "10.244.1.1/24", "dev", "br0"]);
    node.ip(&["link", "set", "br0", "up"]);
    let mut pods = Vec::new();
    for (name, ip) in [("srv", SERVER), ("cli", CLIENT)] {
        let pod = TestNs::new(&format!("npb{name}"));
        let host = testkit::unique_name("v");
        node.ip(&[
            "link",
            "add",
            &host,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            pod.name(),
        ]);
        node.ip(&["link", "set", &host, "master", "br0", "up"]);
        pod.ip(&["addr", "add", &format!("{ip}/24"), "dev", "eth0"]);
        pod.ip(&["link", "set", "eth0", "up"]);
        pods.push(pod);
    }
    let cli = pods.pop().unwrap();
    (pods.pop().unwrap(), cli)
}

/// A positive whole number from the environment, else `default`.
fn pair_setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(default)
}

/// TCP connections per second from the client to the server over `secs`.
fn connection_rate(srv: &TestNs, cli: &TestNs, secs: f64) -> f64 {
    let stop = AtomicBool::new(false);
    let (tx, rx) = mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            srv.run_inside(|| {
                let l = TcpListener::bind(("0.0.0.0", 8080)).unwrap();
                l.set_nonblocking(true).unwrap();
                tx.send(()).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    match l.accept() {
                        Ok((mut c, _)) => {
                            let _ = c.write_all(b"x");
                            // The client ends it (a reset): no TIME_WAIT on either side.
                            let _ = c.set_read_timeout(Some(Duration::from_secs(1)));
                            let _ = c.read(&mut [0u8; 1]);
                        }
                        Err(_) => std::thread::sleep(Duration::from_micros(50)),
                    }
                }
            })
        });
        rx.recv().unwrap();
        let n = cli.run_inside(|| {
            let start = Instant::now();
            let mut n = 0u64;
            let mut buf = [0u8; 1];
            let to: std::net::SocketAddr = format!("{SERVER}:8080").parse().unwrap();
            while start.elapsed().as_secs_f64() < secs {
                // A refused or lost connection ends nothing: the rate counts those that answer.
                if let Ok(mut c) = TcpStream::connect_timeout(&to, Duration::from_secs(1)) {
                    let _ = c.set_read_timeout(Some(Duration::from_secs(1)));
                    if c.read(&mut buf).is_ok_and(|k| k == 1) {
                        n += 1;
                    }
                    // Reset, not closed: a socket left in TIME_WAIT per connection ran the
                    // rounds out of ports and made the rate a tenth of itself in some runs.
                    let _ = setsockopt(
                        &c,
                        Linger,
                        &nix::libc::linger {
                            l_onoff: 1,
                            l_linger: 0,
                        },
                    );
                }
            }
            n as f64 / start.elapsed().as_secs_f64()
        });
        stop.store(true, Ordering::Relaxed);
        n
    })
}

/// iperf3's throughput from the client to the server, Gbit/s, on 8080: the port the policies
/// allow (5201 would be dropped with the table, and no run with it gave a figure).
fn throughput(srv: &TestNs, cli: &TestNs, secs: u64) -> Option<f64> {
    let mut server = srv
        .command("iperf3")
        .args(["-s", "-1", "-p", "8080"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    // Under load the server may take seconds to listen; a client before it is refused.
    let listening = || {
        srv.command("ss")
            .args(["-Hltn", "sport = :8080"])
            .output()
            .is_ok_and(|o| !o.stdout.is_empty())
    };
    let until = Instant::now() + Duration::from_secs(10);
    while !listening() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = cli
        .command("iperf3")
        .args([
            "-c",
            SERVER,
            "-p",
            "8080",
            "-t",
            &secs.to_string(),
            "-J",
            "--connect-timeout",
            "3000",
        ])
        .output();
    // A client that never reached it leaves the one-off server waiting: end it.
    let _ = server.kill();
    let _ = server.wait();
    let out = out.ok()?;
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .map(|b| b / 1e9)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let node = TestNs::new("npbench");
    let dir = tempfile::tempdir().unwrap();
    let mut api = KubeApi::start(
        Some(node.path()),
        "127.0.0.1:0".parse().unwrap(),
        dir.path(),
    );
    let user = api.add_user("netpol", Some(NETPOL_RULES));
    let made = Instant::now();
    cluster(&api);
    println!(
        "cluster: {PODS} pods ({LOCAL} on the node, plus a real pair) in {NAMESPACES} namespaces, {POLICIES} policies, made in {:.1?}; load {}",
        made.elapsed(),
        load()
    );
    let (srv, cli) = pair(&node);

    // From the start to the table in the kernel.
    let started = Instant::now();
    let e = Enforcer::start(&node, &user.kubeconfig, dir.path().join("netpol.log"));
    let took = e.wait("wrote table inet flannel-netpol", started);
    let line = e
        .log()
        .lines()
        .find(|l| l.contains("wrote table"))
        .unwrap_or_default()
        .to_string();
    println!(
        "start: table in the kernel {:.0?} after the enforcer's start; load {}",
        took,
        load()
    );
    println!("       {}", line.split("INFO ").nth(1).unwrap_or(&line));
    println!("       RSS {} KiB", rss_kib(e.child.id()));

    // From an API write to the kernel's commit.
    let (ctx, crx) = mpsc::channel();
    let listener = {
        let path = node.path().to_path_buf();
        std::thread::spawn(move || {
            let f = std::fs::File::open(&path).unwrap();
            nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let mut commits = TableCommits::subscribe("inet", "flannel-netpol").unwrap();
            loop {
                match commits.wait() {
                    Ok(Commit::By(_)) | Ok(Commit::Lost) => {
                        if ctx.send(Instant::now()).is_err() {
                            return;
                        }
                    }
                    Err(_) => return,
                }
            }
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    while crx.try_recv().is_ok() {}
    let mut lat = Vec::new();
    let mut missed = 0;
    for i in 0..EVENTS {
        let t = Instant::now();
        match i % 4 {
            // A peer of policies isolating this node's pods: p120 (ns20, team t0, role r0)
            // loses role=r0 and gets it back.
            0 => {
                api.patch(
                    Kind::Pod,
                    "ns20",
                    "p120",
                    false,
                    &json!({"metadata": {"labels": {"role": "r2"}}}),
                )
                .unwrap();
            }
            1 => {
                api.patch(
                    Kind::Pod,
                    "ns20",
                    "p120",
                    false,
                    &json!({"metadata": {"labels": {"role": "r0"}}}),
                )
                .unwrap();
            }
            // A policy made, then deleted, isolating local pods of ns3.
            2 => {
                api.create(
                    Kind::NetworkPolicy,
                    "ns3",
                    json!({"metadata": {"name": "extra"},
                "spec": {"podSelector": {}, "ingress": [{"ports": [{"port": 443}]}]}}),
                )
                .unwrap();
            }
            _ => {
                api.delete(Kind::NetworkPolicy, "ns3", "extra").unwrap();
            }
        }
        // No commit within 10 s is a figure too (said below), not the end of the bench.
        match crx.recv_timeout(Duration::from_secs(10)) {
            // A change may take up to three commits (new sets and chains, the elements, the
            // rules and what goes): the time is the last's, each within 200 ms of the one before.
            Ok(mut at) => {
                while let Ok(next) = crx.recv_timeout(Duration::from_millis(200)) {
                    at = next;
                }
                lat.push(at.duration_since(t))
            }
            Err(_) => missed += 1,
        }
    }
    // A write with no commit counts as the slowest of all in the percentiles.
    lat.extend(std::iter::repeat_n(Duration::MAX, missed));
    lat.sort();
    println!(
        "events: {EVENTS} API writes to the kernel's commit: p50 {:.1?} p90 {:.1?} p99 {:.1?} max {:.1?}; {missed} with no commit within 10 s; load {}",
        percentile(&lat, 0.5), percentile(&lat, 0.9), percentile(&lat, 0.99), lat[lat.len() - 1], load()
    );
    if missed > 0 {
        for l in e
            .log()
            .lines()
            .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        {
            println!("       enforcer: {l}");
        }
    }
    println!("       RSS {} KiB after them", rss_kib(e.child.id()));
    // The enforcer's own account of its passes after the start's: compiling, and writing the
    // difference.
    let took = |what: &str| -> Vec<f64> {
        let mut v: Vec<f64> = e
            .log()
            .lines()
            .filter(|l| l.contains("wrote table"))
            .skip(1)
            .filter_map(|l| {
                let t = l
                    .split(what)
                    .nth(1)?
                    .split([',', ' '])
                    .find(|t| !t.is_empty())?;
                let ms = if let Some(v) = t.strip_suffix("ms") {
                    v.parse::<f64>().ok()?
                } else if let Some(v) = t.strip_suffix("µs") {
                    v.parse::<f64>().ok()? / 1000.0
                } else {
                    t.strip_suffix('s')?.parse::<f64>().ok()? * 1000.0
                };
                Some(ms)
            })
            .collect();
        v.sort_by(|a, b| a.total_cmp(b));
        v
    };
    let (c, w) = (took("compiled in "), took("written in "));
    if !c.is_empty() && !w.is_empty() {
        println!(
            "       per pass (median, max): compiled in {:.1} ms, {:.1} ms; written in {:.1} ms, {:.1} ms",
            c[c.len() / 2],
            c[c.len() - 1],
            w[w.len() / 2],
            w[w.len() - 1]
        );
    }
    drop(crx);

    // The allowed pair with the table (1,000 policies, the server isolated by ten) and without.
    let mut rates = (Vec::new(), Vec::new());
    let mut gbits = (Vec::new(), Vec::new());
    let mut enforcer = Some(e);
    let rounds = pair_setting("NETPOL_PAIR_ROUNDS", 6);
    let secs = pair_setting("NETPOL_IPERF_SECS", 10);
    for round in 0..rounds {
        let loaded = round % 2 == 0;
        if loaded && enforcer.is_none() {
            let e = Enforcer::start(
                &node,
                &user.kubeconfig,
                dir.path().join(format!("netpol{round}.log")),
            );
            e.wait("table inet flannel-netpol:", Instant::now());
            enforcer = Some(e);
        }
        if !loaded {
            enforcer = None;
            node.run("nft", &["delete", "table", "inet", "flannel-netpol"]);
        }
        let r = connection_rate(&srv, &cli, 3.0);
        let g = throughput(&srv, &cli, secs);
        let (rv, gv) = if loaded {
            (&mut rates.0, &mut gbits.0)
        } else {
            (&mut rates.1, &mut gbits.1)
        };
        rv.push(r);
        if let Some(g) = g {
            gv.push(g);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    let (rl, rn) = (median(&mut rates.0), median(&mut rates.1));
    println!(
        "pair:  TCP connections/s with 1,000 policies {rl:.0}, without {rn:.0}: {:.3}x; load {}",
        rl / rn,
        load()
    );
    if !gbits.0.is_empty() && !gbits.1.is_empty() {
        let (gl, gn) = (median(&mut gbits.0), median(&mut gbits.1));
        println!(
            "       iperf3 Gbit/s with {gl:.2}, without {gn:.2}: {:.3}x",
            gl / gn
        );
    } else {
        println!("       iperf3: no figure (not installed, or no run reached its server)");
    }
    drop(enforcer);
    drop(listener);
    api.stop();
}
