//! flanneld on etcd as operators run it: three members, each in a namespace of its own, every
//! node given all three endpoints; dual-stack vxlan. Faults come one after another while nodes
//! join and leave: the leader killed and restarted, the leader cut off the network and plugged
//! back, quorum lost for 60 s (two members killed) and restored, compaction and defragmentation
//! while leases come and go. A monitor samples every node throughout, not only at the end: no
//! two running nodes hold overlapping subnets of either family, no kernel entry of a live
//! lease is removed, no daemon dies. Pods ping across nodes through every fault (vxlan needs no
//! etcd to forward). A node that joins during the lost quorum is programmed everywhere within
//! 1 s of quorum's return, and one joining after it within 1 s of its lease; after a member
//! comes back, no request of any node fails (renewals included: short leases make them come
//! every few seconds).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use testkit::cluster::{wait_for, Cluster, Family, Underlay, ETCD_PREFIX};
use testkit::pings::{across, Pinger};

const FLANNELD: &str = env!("CARGO_BIN_EXE_flanneld");
/// A ceiling for waits on a loaded machine.
const T: Duration = Duration::from_secs(30);
/// Real nodes take subnets 1 to 99 of each family; the leases the test writes itself, 200 on.
const CONFIG: &str = r#"{"Network":"10.32.0.0/16","SubnetMin":"10.32.1.0","SubnetMax":"10.32.99.0","EnableIPv6":true,"IPv6Network":"fc00:32::/48","IPv6SubnetMin":"fc00:32:0:1::","IPv6SubnetMax":"fc00:32:0:63::","Backend":{"Type":"vxlan"}}"#;
/// Short leases, so that renewals (every 10 s, retried every 3.75 s) come during each phase.
const LEASE_TTL: &str = "15";
const METRICS_PORT: &str = "9131";
/// How soon a join must be programmed on every other node after quorum's return (or after
/// its lease, for a join once etcd is whole).
const PROMPT: Duration = Duration::from_secs(1);
/// How long quorum stays lost.
const OUTAGE: Duration = Duration::from_secs(60);
/// flanneld's deadline for one request to etcd, its tries on every member included
/// (REQUEST_TIMEOUT in registry/etcd.rs).
const REQUEST_DEADLINE: Duration = Duration::from_secs(5);

/// A node's subnets as its subnet.env says: (IPv4, IPv6) networks.
type Subnets = (Option<ipnetwork::IpNetwork>, Option<ipnetwork::IpNetwork>);

/// What the monitor samples of one running node.
#[derive(Clone)]
struct Watched {
    index: u8,
    ns: String,
    subnet_file: PathBuf,
    pid: u32,
}

/// What the monitor found, shared with the test's thread.
#[derive(Default)]
struct Seen {
    /// Running nodes, as the test starts and stops them.
    nodes: Vec<Watched>,
    /// (a, b) -> when node a's kernel was first seen holding both routes to node b's subnets.
    programmed: HashMap<(u8, u8), Instant>,
    /// Each node's subnets, once its subnet.env had them.
    subnets: BTreeMap<u8, Subnets>,
    violations: Vec<String>,
    samples: u64,
    /// (node, destination) -> when `ip monitor` on the node printed the route's addition (and
    /// no deletion since): the moment the kernel got it, on the clock the daemons log by.
    routes_added: HashMap<(u8, String), SystemTime>,
}

fn network(s: &str) -> Option<ipnetwork::IpNetwork> {
    let n: ipnetwork::IpNetwork = s.trim().parse().ok()?;
    ipnetwork::IpNetwork::new(n.network(), n.prefix()).ok()
}

fn read_subnets(file: &PathBuf) -> Subnets {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let var = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")))
            .and_then(network)
    };
    (var("FLANNEL_SUBNET"), var("FLANNEL_IPV6_SUBNET"))
}

fn overlaps(a: &ipnetwork::IpNetwork, b: &ipnetwork::IpNetwork) -> bool {
    a.contains(b.network()) || b.contains(a.network())
}

/// The destinations of a namespace's routes of both families, `None` when `ip` failed.
fn route_dsts(ns: &str) -> Option<Vec<String>> {
    let mut dsts = Vec::new();
    for family in ["-4", "-6"] {
        let out = std::process::Command::new("ip")
            .args(["-n", ns, family, "-j", "route", "show"])
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        let routes: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).ok()?;
        dsts.extend(
            routes
                .iter()
                .filter_map(|r| r["dst"].as_str().map(str::to_string)),
        );
    }
    Some(dsts)
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit(')').next().map(|r| r.trim_start().to_string()))
        .is_some_and(|r| !r.starts_with('Z'))
}

/// One pass over every running node.
fn sample(seen: &Mutex<Seen>) {
    let nodes = seen.lock().unwrap().nodes.clone();
    let mut subnets = BTreeMap::new();
    let mut routes = BTreeMap::new();
    let mut dead = Vec::new();
    for n in &nodes {
        subnets.insert(n.index, read_subnets(&n.subnet_file));
        // When the routes were read, not when the pass ends: a pass takes a while when loaded.
        if let Some(d) = route_dsts(&n.ns) {
            routes.insert(n.index, (Instant::now(), d));
        }
        if !alive(n.pid) {
            dead.push(n.index);
        }
    }
    let mut s = seen.lock().unwrap();
    s.samples += 1;
    // A node stopped meanwhile is no longer one whose entries must stay.
    let running: Vec<u8> = s.nodes.iter().map(|n| n.index).collect();
    for i in dead.into_iter().filter(|i| running.contains(i)) {
        s.violations
            .push(format!("node {i}'s flanneld is no longer running"));
    }
    let held: Vec<(u8, Subnets)> = subnets
        .iter()
        .filter(|(i, _)| running.contains(i))
        .map(|(i, s)| (*i, *s))
        .collect();
    for (x, (i, a)) in held.iter().enumerate() {
        for (j, b) in &held[x + 1..] {
            for (fa, fb) in [(a.0, b.0), (a.1, b.1)] {
                if let (Some(fa), Some(fb)) = (fa, fb) {
                    if overlaps(&fa, &fb) {
                        s.violations.push(format!(
                            "nodes {i} and {j} hold overlapping subnets {fa} and {fb}"
                        ));
                    }
                }
            }
        }
    }
    for (i, sub) in &held {
        if sub.0.is_some() && sub.1.is_some() {
            s.subnets.insert(*i, *sub);
        }
    }
    for (a, (read, dsts)) in &routes {
        if !running.contains(a) {
            continue;
        }
        for (b, sub) in &held {
            if a == b {
                continue;
            }
            let (Some(v4), Some(v6)) = sub else { continue };
            let has = [v4, v6].iter().all(|n| dsts.contains(&n.to_string()));
            let was = s.programmed.contains_key(&(*a, *b));
            if has && !was {
                s.programmed.insert((*a, *b), *read);
            } else if !has && was {
                s.violations.push(format!(
                    "node {a}'s kernel lost an entry for node {b}'s live lease ({v4}, {v6})"
                ));
                s.programmed.remove(&(*a, *b));
            }
        }
    }
}

/// Samples every running node until `stop`, as often as the machine allows (every 100 ms at
/// most).
fn monitor(seen: Arc<Mutex<Seen>>, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            let began = Instant::now();
            sample(&seen);
            std::thread::sleep(Duration::from_millis(100).saturating_sub(began.elapsed()));
        }
    })
}

struct Run {
    c: Cluster,
    seen: Arc<Mutex<Seen>>,
    /// `ip monitor route` in each node, killed on drop.
    route_monitors: Vec<std::process::Child>,
}

impl Drop for Run {
    fn drop(&mut self) {
        for m in &mut self.route_monitors {
            let _ = m.kill();
            let _ = m.wait();
        }
    }
}

/// Follows node `index`'s route table: each addition and deletion into `seen.routes_added`.
fn follow_routes(index: u8, ns: &str, seen: Arc<Mutex<Seen>>) -> std::process::Child {
    let mut child = std::process::Command::new("ip")
        .args(["-n", ns, "monitor", "route"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("ip monitor route");
    let out = child.stdout.take().expect("its output");
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            let now = SystemTime::now();
            let (deleted, rest) = match line.strip_prefix("Deleted ") {
                Some(r) => (true, r),
                None => (false, line.as_str()),
            };
            let Some(dst) = rest.split_whitespace().next().and_then(network) else {
                continue;
            };
            let key = (index, dst.to_string());
            let mut s = seen.lock().unwrap();
            if deleted {
                s.routes_added.remove(&key);
            } else {
                s.routes_added.entry(key).or_insert(now);
            }
        }
    });
    child
}

impl Run {
    fn start_node(&mut self, index: u8) {
        let ns = self.c.node(index).ns.name().to_string();
        let monitor = follow_routes(index, &ns, self.seen.clone());
        self.route_monitors.push(monitor);
        let args = [
            "--subnet-lease-ttl",
            LEASE_TTL,
            "--healthz-ip",
            "127.0.0.1",
            "--healthz-port",
            METRICS_PORT,
        ];
        self.c
            .start_flanneld(index, std::path::Path::new(FLANNELD), &args);
        let pid = self.c.flanneld_pid(index).expect("flanneld's pid");
        let node = self.c.node(index);
        self.seen.lock().unwrap().nodes.push(Watched {
            index,
            ns: node.ns.name().to_string(),
            subnet_file: node.subnet_file(),
            pid,
        });
    }

    /// A node joins: its namespace, then its flanneld.
    fn join(&mut self) -> u8 {
        let index = self.c.add_node();
        self.start_node(index);
        index
    }

    /// A node leaves: its flanneld stopped (its lease expires by itself).
    fn leave(&mut self, index: u8) {
        self.seen.lock().unwrap().nodes.retain(|n| n.index != index);
        self.c.stop_flanneld(index);
    }

    fn running(&self) -> Vec<u8> {
        let s = self.seen.lock().unwrap();
        s.nodes.iter().map(|n| n.index).collect()
    }

    /// When every running node but `index` was first seen holding `index`'s routes, and
    /// `index` theirs: the last of those moments, waiting at most `timeout`.
    fn programmed_everywhere(&self, index: u8, timeout: Duration) -> SystemTime {
        wait_for(
            &format!(
                "node {index} and every running node to hold routes to each other\n{}",
                self.describe()
            ),
            timeout,
            || {
                let s = self.seen.lock().unwrap();
                let others: Vec<u8> = s
                    .nodes
                    .iter()
                    .map(|n| n.index)
                    .filter(|&i| i != index)
                    .collect();
                // Sampled in place (the routes are there now), timed by `ip monitor`.
                let added = |a: u8, b: u8| {
                    s.programmed.get(&(a, b))?;
                    let (v4, v6) = s.subnets.get(&b)?;
                    [v4, v6]
                        .iter()
                        .map(|n| s.routes_added.get(&(a, (**n)?.to_string())).copied())
                        .collect::<Option<Vec<SystemTime>>>()?
                        .into_iter()
                        .max()
                };
                others
                    .iter()
                    .flat_map(|&o| [(o, index), (index, o)])
                    .map(|(a, b)| added(a, b))
                    .collect::<Option<Vec<SystemTime>>>()
                    .and_then(|t| t.into_iter().max())
            },
        )
    }

    /// Waits until no running node's kernel holds a route to `gone`'s subnets.
    fn removed_everywhere(&self, gone: Subnets, timeout: Duration) {
        wait_for(
            &format!("every node to drop the routes to {gone:?}"),
            timeout,
            || {
                let s = self.seen.lock().unwrap();
                let nodes = s.nodes.clone();
                drop(s);
                let want: Vec<String> = [gone.0, gone.1]
                    .iter()
                    .flatten()
                    .map(|n| n.to_string())
                    .collect();
                nodes
                    .iter()
                    .all(|n| route_dsts(&n.ns).is_some_and(|d| want.iter().all(|w| !d.contains(w))))
                    .then_some(())
            },
        );
    }

    /// When each route between `index` and the other running nodes came, after `since`; the
    /// log of `index` and the ends of the others', for a failure's message.
    fn timeline(&self, index: u8, since: SystemTime) -> String {
        let s = self.seen.lock().unwrap();
        let mut out = String::new();
        for ((node, dst), at) in &s.routes_added {
            let theirs = s.subnets.get(&index).is_some_and(|(v4, v6)| {
                [v4, v6]
                    .iter()
                    .any(|n| n.is_some_and(|n| n.to_string() == *dst))
            });
            if *node == index || theirs {
                let after = at.duration_since(since).unwrap_or_default();
                out += &format!("node {node} got {dst} {after:?} after\n");
            }
        }
        drop(s);
        out += &self.c.node(index).log();
        // The others' last lines: a node late to program `index` says why in its own log.
        for other in self.running().into_iter().filter(|&o| o != index) {
            let log = self.c.node(other).log();
            let lines: Vec<&str> = log.lines().collect();
            out += &format!("--- node {other}'s log, its last 40 lines:\n");
            for line in &lines[lines.len().saturating_sub(40)..] {
                out += line;
                out.push('\n');
            }
        }
        out
    }

    /// When node `index`'s flanneld first logged a line with `needle`, by its log's stamp.
    fn logged(&self, index: u8, needle: &str) -> SystemTime {
        let log = self.c.node(index).log();
        log.lines()
            .find(|l| l.contains(needle))
            .and_then(|l| stamp(l.split_whitespace().next()?))
            .unwrap_or_else(|| panic!("node {index} logged no {needle:?}:\n{log}"))
    }

    fn subnets(&self, index: u8) -> Subnets {
        wait_for(&format!("node {index}'s subnets"), T, || {
            self.seen.lock().unwrap().subnets.get(&index).copied()
        })
    }

    /// Sum over running nodes of `flanneld_registry_errors_total`.
    fn registry_errors(&self) -> BTreeMap<u8, u64> {
        self.running()
            .into_iter()
            .map(|i| {
                let out = self.c.node(i).ns.try_run(
                    "curl",
                    &["-s", &format!("http://127.0.0.1:{METRICS_PORT}/metrics")],
                );
                let text = String::from_utf8_lossy(&out.stdout).into_owned();
                let n = text
                    .lines()
                    .find_map(|l| l.strip_prefix("flanneld_registry_errors_total "))
                    .and_then(|v| v.trim().parse::<f64>().ok())
                    .unwrap_or_else(|| panic!("node {i}'s metrics: {text}"));
                (i, n as u64)
            })
            .collect()
    }

    /// After a member came back (at `since`): a renewal on every running node, and no
    /// request of any of them failed that began after `since`. A request begun during the
    /// fault may still fail after it, at its deadline (its last tries held by a member that
    /// does not serve yet), so failures are counted from `since` plus that deadline, when
    /// every such request has ended. A request begun after `since` that a fault makes fail
    /// is tried again until its own deadline, which comes no earlier: it is counted.
    fn every_request_succeeds_after(&self, since: SystemTime, what: &str) {
        if let Ok(left) = (since + REQUEST_DEADLINE).duration_since(SystemTime::now()) {
            std::thread::sleep(left);
        }
        let before = self.registry_errors();
        let renewals = |i: u8| self.c.node(i).log().matches("renewed lease").count();
        let start: Vec<(u8, usize)> = self
            .running()
            .into_iter()
            .map(|i| (i, renewals(i)))
            .collect();
        wait_for(
            &format!("a renewal on every node after {what}"),
            Duration::from_secs(40),
            || start.iter().all(|&(i, n)| renewals(i) > n).then_some(()),
        );
        let after = self.registry_errors();
        for (i, n) in &after {
            let was = before.get(i).copied().unwrap_or(0);
            assert_eq!(
                *n,
                was,
                "node {i}: {} failed requests to etcd begun after {what}:\n{}",
                n - was,
                self.c.node(*i).log()
            );
        }
    }

    fn describe(&self) -> String {
        let s = self.seen.lock().unwrap();
        format!(
            "running {:?}, subnets {:?}, programmed pairs {:?}",
            s.nodes.iter().map(|n| n.index).collect::<Vec<_>>(),
            s.subnets,
            s.programmed.keys().collect::<Vec<_>>()
        )
    }

    /// Pings between the pods of nodes 1, 2 and 3 (which stay throughout), both families.
    fn pingers(&self, interval: &str) -> Vec<Pinger> {
        let pods = self.c.pods();
        [(0, 1, Family::V4), (1, 2, Family::V6), (2, 0, Family::V4)]
            .into_iter()
            .map(|(from, to, f)| {
                let dst = pods[to].addr(f).expect("a pod address").to_string();
                let mut cmd = pods[from].ns.command("ping");
                cmd.args(["-i", interval, "-W", "1", &dst]);
                Pinger::start(&format!("pod {from} to pod {to} ({f})"), cmd)
            })
            .collect()
    }

    /// For each running node whose routes into the networks differ from the leases etcd
    /// holds (its own aside), what it lacks and what it has too many.
    fn routes_unlike_leases(&self) -> Vec<String> {
        let mut leased = Vec::new();
        for key in self.c.lease_keys() {
            let Some((v4, v6)) = key.split_once('&') else {
                continue;
            };
            let (Some(v4), Some(v6)) = (
                network(&v4.replacen('-', "/", 1)),
                network(&v6.replacen('-', "/", 1)),
            ) else {
                continue;
            };
            leased.push((v4, v6));
        }
        let nets: [ipnetwork::IpNetwork; 2] = [
            "10.32.0.0/16".parse().expect("IPv4 network"),
            "fc00:32::/48".parse().expect("IPv6 network"),
        ];
        let nodes = self.seen.lock().unwrap().nodes.clone();
        let mut wrong = Vec::new();
        for n in &nodes {
            let own = read_subnets(&n.subnet_file);
            let mut want: Vec<String> = leased
                .iter()
                .filter(|(v4, _)| Some(*v4) != own.0)
                .flat_map(|(v4, v6)| [v4.to_string(), v6.to_string()])
                .collect();
            let mut held: Vec<String> = route_dsts(&n.ns)
                .unwrap_or_default()
                .into_iter()
                .filter(|d| {
                    network(d).is_some_and(|d| {
                        nets.iter()
                            .any(|net| net.contains(d.network()) && d.prefix() > net.prefix())
                            && ![own.0, own.1]
                                .iter()
                                .flatten()
                                .any(|o| o.contains(d.network()))
                    })
                })
                .collect();
            want.sort();
            held.sort();
            if want != held {
                let lacks: Vec<&String> = want.iter().filter(|w| !held.contains(w)).collect();
                let extra: Vec<&String> = held.iter().filter(|h| !want.contains(h)).collect();
                wrong.push(format!(
                    "node {}: lacks {lacks:?}, has too many {extra:?}",
                    n.index
                ));
            }
        }
        wrong
    }

    fn assert_no_violations(&self) {
        let s = self.seen.lock().unwrap();
        assert!(
            s.violations.is_empty(),
            "after {} samples:\n{}",
            s.samples,
            s.violations.join("\n")
        );
    }
}

/// A log line's stamp, `2026-11-28T17:44:21.907907Z`, as a time.
fn stamp(s: &str) -> Option<SystemTime> {
    let (date, time) = s.strip_suffix('Z')?.split_once('T')?;
    let mut d = date.split('-').map(|x| x.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':').map(|x| x.parse::<i64>().ok());
    let (h, min, sec) = (t.next()??, t.next()??, t.next()??);
    // Days since the epoch of a civil date (proleptic Gregorian).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146097 + doe - 719468;
    let secs = u64::try_from(days * 86400 + h * 3600 + min * 60 + sec).ok()?;
    let nanos: u32 = format!("{frac:0<9}").get(..9)?.parse().ok()?;
    Some(UNIX_EPOCH + Duration::new(secs, nanos))
}

/// A lease the test writes itself: subnet `n` (200 on) of both families, for a node that does
/// not exist, as a join the daemons must program.
fn fake_lease(n: u8) -> (String, String) {
    let key = format!("{ETCD_PREFIX}/subnets/10.32.{n}.0-24&fc00:32:0:{n:x}::-64");
    let value = format!(
        r#"{{"PublicIP":"192.168.120.{n}","PublicIPv6":"fd00:120::{n:x}","BackendType":"vxlan","BackendData":{{"VNI":1,"VtepMAC":"02:00:00:00:00:{n:02x}"}},"BackendV6Data":{{"VNI":1,"VtepMAC":"02:00:00:00:06:{n:02x}"}}}}"#
    );
    (key, value)
}

#[test]
fn log_stamps_are_read_as_times() {
    let t = stamp("2026-11-28T17:44:21.907907Z").expect("a stamp");
    let since = t.duration_since(UNIX_EPOCH).expect("after the epoch");
    assert_eq!(since.as_secs(), 1_795_887_861);
    assert_eq!(since.subsec_nanos(), 907_907_000);
    assert_eq!(
        stamp("1970-01-01T00:00:00Z"),
        Some(UNIX_EPOCH),
        "the epoch itself"
    );
}

#[test]
fn three_members_under_faults_while_nodes_join_and_leave() {
    let c = Cluster::with_etcd_members(Underlay::Dual, "efa", 120, 3, 3, CONFIG);
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mut run = Run {
        c,
        seen,
        route_monitors: Vec::new(),
    };
    for i in 1..=3 {
        run.start_node(i);
    }
    for i in 1..=3 {
        run.c.add_pod(i);
    }
    run.c
        .wait_every_pod_reaches_every_other(&[Family::V4, Family::V6], T);
    let stop = Arc::new(AtomicBool::new(false));
    let monitor = monitor(run.seen.clone(), stop.clone());
    for i in 1..=3 {
        run.programmed_everywhere(i, T);
    }

    // The leader killed and started again; node 4 joins meanwhile.
    let leader = wait_for("a leader", T, || run.c.etcd_leader());
    let failed = across(run.pingers("0.05"), T, || {
        run.c.kill_etcd_member(leader);
        let four = run.join();
        run.programmed_everywhere(four, T);
        run.c.restart_etcd_member(leader);
        run.c.wait_etcd_member_healthy(leader, T);
    });
    assert!(
        failed.is_empty(),
        "the leader killed:\n{}",
        failed.join("\n")
    );
    run.every_request_succeeds_after(SystemTime::now(), &format!("member {leader} came back"));

    // The leader cut off the network and plugged back; node 4 leaves, node 5 joins.
    let leader = wait_for("a leader", T, || run.c.etcd_leader());
    let four = run.subnets(4);
    let failed = across(run.pingers("0.05"), T, || {
        run.c.set_etcd_member_link(leader, false);
        run.leave(4);
        let five = run.join();
        run.programmed_everywhere(five, T);
        // The lease of node 4 expires on the members that still have a quorum.
        run.removed_everywhere(four, T + Duration::from_secs(20));
        run.c.set_etcd_member_link(leader, true);
        run.c.wait_etcd_member_healthy(leader, T);
    });
    assert!(
        failed.is_empty(),
        "the leader cut off:\n{}",
        failed.join("\n")
    );
    run.every_request_succeeds_after(
        SystemTime::now(),
        &format!("member {leader} was plugged back"),
    );

    // Quorum lost for OUTAGE: two members killed. Node 6 joins and node 5 leaves meanwhile.
    let leader = wait_for("a leader", T, || run.c.etcd_leader());
    let other = (1..=3).find(|&m| m != leader).expect("another member");
    let mut joined = 0;
    let mut returned = SystemTime::now();
    let failed = across(run.pingers("0.2"), T, || {
        let lost = Instant::now();
        run.c.kill_etcd_member(leader);
        run.c.kill_etcd_member(other);
        std::thread::sleep(Duration::from_secs(5));
        joined = run.join();
        std::thread::sleep(Duration::from_secs(5));
        run.leave(5);
        std::thread::sleep(OUTAGE.saturating_sub(lost.elapsed()));
        run.c.restart_etcd_member(leader);
        run.c.restart_etcd_member(other);
        // Quorum is back once a linearizable read succeeds again. A member without a leader
        // holds such a read until it has one (etcdctl does not ask for a leader), so a read
        // begun during the election succeeds at its end: each probe may take 300 ms at most,
        // and the return is the start of the first that succeeds, at most that much before.
        returned = wait_for("quorum's return", T, || {
            let began = SystemTime::now();
            let out = run.c.try_etcdctl_at(
                run.c.etcd_url().unwrap_or_default(),
                &["get", "--command-timeout=300ms", "quorum-probe"],
            );
            out.status.success().then_some(began)
        });
        run.programmed_everywhere(joined, T);
    });
    assert!(failed.is_empty(), "quorum lost:\n{}", failed.join("\n"));
    // What the registry decides is timed, not the node's own start (its vxlan devices take
    // a second or more on a loaded machine): its first read once quorum is back, then the
    // others' routes to it and its routes to them, from its lease on.
    let read = run.logged(joined, "external interface");
    let leased = run.logged(joined, "leased subnet");
    let at = run.programmed_everywhere(joined, T);
    let after =
        |later: SystemTime, earlier: SystemTime| later.duration_since(earlier).unwrap_or_default();
    eprintln!(
        "node {joined}, joined while quorum was lost: its config read {:?} after quorum's \
         return, its lease {:?} after, programmed everywhere {:?} after its lease",
        after(read, returned),
        after(leased, returned),
        after(at, leased)
    );
    assert!(
        after(read, returned) <= PROMPT && after(at, leased) <= PROMPT,
        "node {joined}, which joined while quorum was lost, read its config {:?} after quorum's \
         return and was programmed everywhere {:?} after its lease\n{}\n{}",
        after(read, returned),
        after(at, leased),
        run.describe(),
        run.timeline(joined, returned)
    );
    // A join once etcd is whole: programmed everywhere within PROMPT of its lease.
    let seven = run.join();
    let at = run.programmed_everywhere(seven, T);
    let leased = run.logged(seven, "leased subnet");
    eprintln!(
        "node {seven}, joined after: programmed everywhere {:?} after its lease",
        after(at, leased)
    );
    assert!(
        after(at, leased) <= PROMPT,
        "node {seven}, which joined after quorum's return, was programmed everywhere {:?} \
         after its lease\n{}\n{}",
        after(at, leased),
        run.describe(),
        run.timeline(seven, leased)
    );
    run.every_request_succeeds_after(returned, "quorum's return");

    // Compaction and defragmentation while leases come and go at 20 a second.
    let url = run.c.etcd_url().unwrap_or_default().to_string();
    let churn = {
        let underlay = run.c.underlay.name().to_string();
        let url = url.clone();
        std::thread::spawn(move || {
            let etcdctl = |args: &[&str]| {
                let _ = std::process::Command::new("ip")
                    .args(["netns", "exec", &underlay, "etcdctl", "--endpoints", &url])
                    .args(args)
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .status();
            };
            let started = Instant::now();
            let mut n = 200u8;
            while started.elapsed() < Duration::from_secs(15) {
                let (key, value) = fake_lease(n);
                etcdctl(&["put", &key, &value]);
                let (old, _) = fake_lease(if n >= 205 { n - 5 } else { n + 45 });
                etcdctl(&["del", &old]);
                n = if n >= 249 { 200 } else { n + 1 };
            }
        })
    };
    let failed = across(run.pingers("0.05"), T, || {
        for _ in 0..3 {
            std::thread::sleep(Duration::from_secs(3));
            let status = run.c.etcdctl(&["endpoint", "status", "-w", "json"]);
            let rev = serde_json::from_str::<serde_json::Value>(&status)
                .ok()
                .and_then(|s| s[0]["Status"]["header"]["revision"].as_i64())
                .expect("etcd's revision");
            run.c.etcdctl(&["compact", &rev.to_string(), "--physical"]);
            run.c
                .etcdctl(&["defrag", "--cluster", "--command-timeout=30s"]);
        }
        let eight = run.join();
        run.programmed_everywhere(eight, T);
        run.leave(6);
    });
    churn.join().expect("the lease churn");
    assert!(
        failed.is_empty(),
        "compaction under load:\n{}",
        failed.join("\n")
    );
    // Every node's kernel ends with exactly the leases etcd holds.
    let started = Instant::now();
    loop {
        let wrong = run.routes_unlike_leases();
        if wrong.is_empty() {
            break;
        }
        assert!(
            started.elapsed() < T,
            "after {T:?}, routes unlike the leases in etcd:\n{}",
            wrong.join("\n")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, Ordering::Relaxed);
    monitor.join().expect("the monitor");
    run.assert_no_violations();
    for i in run.running() {
        assert!(run.c.flanneld_running(i), "node {i}'s flanneld stopped");
        let log = run.c.node(i).log();
        assert!(!log.contains("panicked"), "node {i}:\n{log}");
    }
}
