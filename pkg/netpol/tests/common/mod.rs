//! The NetworkPolicy e2e suite's world on testkit's three-node cluster: flanneld in kube mode
//! (with --ip-masq, as kube-flannel runs it) against the API server stand-in, namespaces x, y
//! and z with pods a, b and c each (label `pod`), spread over the nodes so that every node has
//! one pod of each namespace; every pod serves TCP and UDP on 80 and 81 under the e2e suite's
//! port names (serve-80-tcp, ...); flannel-netpol on each node. A truth table is checked as a
//! full probe matrix: every pod to every other, on each family the cluster has.

#![allow(dead_code)]

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::Duration;
use testkit::cluster::{wait_for, Cluster, Family, Registry, Underlay};
use testkit::kube_api::{Kind, NETPOL_RULES};
use testkit::probe::{probe_all, Probe, Proto, Servers};

pub const NETPOL: &str = env!("CARGO_BIN_EXE_flannel-netpol");
/// The ceiling of every wait.
pub const T: Duration = Duration::from_secs(60);
pub const NAMESPACES: [&str; 3] = ["x", "y", "z"];
pub const PODS: [&str; 9] = [
    "x/a", "x/b", "x/c", "y/a", "y/b", "y/c", "z/a", "z/b", "z/c",
];
/// What a probe waits for an answer in the first look at a matrix.
const PROBE: Duration = Duration::from_secs(1);
/// What a probe that found no answer where one was expected waits the second time.
const PROBE_AGAIN: Duration = Duration::from_secs(3);

pub fn flanneld() -> PathBuf {
    let p = testkit::bin_dir().join("flanneld");
    assert!(
        p.exists(),
        "{} is missing: cargo build --workspace --bins",
        p.display()
    );
    p
}

/// The node a model pod runs on: pod a of each namespace on node 1, b on 2, c on 3.
pub fn node_of(pod: &str) -> u8 {
    match pod.rsplit('/').next() {
        Some("a") => 1,
        Some("b") => 2,
        _ => 3,
    }
}

pub fn ns_of(pod: &str) -> &str {
    pod.split('/').next().unwrap_or_default()
}

/// A child killed on drop.
struct Daemon(Option<Child>);

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub struct World {
    pub cluster: Cluster,
    /// Model pod ("x/a") to its place in the cluster's pods.
    pub pods: BTreeMap<&'static str, usize>,
    pub families: Vec<Family>,
    enforcers: std::sync::Mutex<BTreeMap<u8, Daemon>>,
    kubeconfig: PathBuf,
    servers: Vec<Servers>,
    logs: tempfile::TempDir,
}

fn container_ports() -> Value {
    let ports: Vec<Value> = [80, 81]
        .into_iter()
        .flat_map(|p| {
            ["TCP", "UDP"].into_iter().map(move |proto| {
                json!({"name": format!("serve-{p}-{}", proto.to_lowercase()),
                       "containerPort": p, "protocol": proto})
            })
        })
        .collect();
    json!([{"name": "cont-80-81", "image": "agnhost", "ports": ports}])
}

impl World {
    /// The world on a new cluster (`net`: the test's own 192.168.<net>.0/24 and 10.<net>/16),
    /// with `backend` (net-conf.json's Backend) on `underlay`, flanneld started with `extra`.
    pub fn new(prefix: &str, net: u8, backend: &str, underlay: Underlay, extra: &[&str]) -> World {
        World::prepared(prefix, net, backend, underlay, extra, |_| {})
    }

    /// As `new`, with flanneld started without --ip-masq: no NAT at all.
    pub fn without_masq(prefix: &str, net: u8, backend: &str, underlay: Underlay) -> World {
        World::build(prefix, net, backend, underlay, &[], |_| {})
    }

    /// As `new`, with `prepare` given the cluster before flanneld starts on it.
    pub fn prepared(
        prefix: &str,
        net: u8,
        backend: &str,
        underlay: Underlay,
        extra: &[&str],
        prepare: impl FnOnce(&mut Cluster),
    ) -> World {
        let mut args = vec!["--ip-masq"];
        args.extend_from_slice(extra);
        World::build(prefix, net, backend, underlay, &args, prepare)
    }

    fn build(
        prefix: &str,
        net: u8,
        backend: &str,
        underlay: Underlay,
        args: &[&str],
        prepare: impl FnOnce(&mut Cluster),
    ) -> World {
        let conf = match underlay {
            Underlay::V4 => format!(r#"{{"Network":"10.{net}.0.0/16","Backend":{backend}}}"#),
            _ => format!(
                r#"{{"EnableIPv6":true,"IPv6Network":"fd{net:02x}::/48","Network":"10.{net}.0.0/16","Backend":{backend}}}"#
            ),
        };
        let mut cluster = Cluster::on(underlay, prefix, net, 3, Registry::Kube, &conf);
        prepare(&mut cluster);
        for n in 1..=3 {
            cluster.start_flanneld(n, &flanneld(), args);
        }
        for n in 1..=3 {
            cluster.node(n).wait_subnet_env(T);
        }
        World::on(cluster, underlay)
    }

    /// The world on a cluster whose flanneld runs already.
    pub fn on(mut cluster: Cluster, underlay: Underlay) -> World {
        let families: Vec<Family> = Family::BOTH
            .into_iter()
            .filter(|f| underlay.has(*f))
            .collect();
        let api = cluster.kube();
        for ns in NAMESPACES {
            api.create(Kind::Namespace, "", json!({"metadata": {"name": ns}}))
                .unwrap();
        }
        let mut pods = BTreeMap::new();
        let mut servers = Vec::new();
        for model in PODS {
            let i = cluster.add_pod(node_of(model));
            pods.insert(model, i);
            let pod = &cluster.pods()[i];
            servers.push(Servers::start(
                pod.ns.path(),
                &[
                    (Proto::Tcp, 80),
                    (Proto::Tcp, 81),
                    (Proto::Udp, 80),
                    (Proto::Udp, 81),
                ],
            ));
            let (ns, name) = model.split_once('/').unwrap();
            let api = cluster.kube();
            api.create(
                Kind::Pod,
                ns,
                json!({"metadata": {"name": name, "labels": {"pod": name}},
                       "spec": {"nodeName": format!("node{}", node_of(model)),
                                "containers": container_ports()}}),
            )
            .unwrap();
            let ips: Vec<Value> = pod.ips.iter().map(|ip| json!({"ip": ip})).collect();
            api.patch(
                Kind::Pod,
                ns,
                name,
                true,
                &json!({"status": {"phase": "Running", "podIP": pod.ip, "podIPs": ips}}),
            )
            .unwrap();
        }
        let kubeconfig = cluster
            .kube_mut()
            .add_user(
                "system:serviceaccount:kube-flannel:flannel-netpol",
                Some(NETPOL_RULES),
            )
            .kubeconfig;
        let w = World {
            cluster,
            pods,
            families,
            enforcers: Default::default(),
            kubeconfig,
            servers,
            logs: tempfile::tempdir().expect("a temporary directory"),
        };
        for n in 1..=3 {
            w.start_enforcer(n);
        }
        for n in 1..=3 {
            w.wait_log(n, "table inet flannel-netpol:");
        }
        // The truth tables are the enforcers': the datapath carries every pair first (once,
        // under load, a userspace tunnel did not yet when subnet.env was written), else the
        // failure names the pairs with every node's flanneld view, not a policy's.
        w.cluster.wait_every_pod_reaches_every_other(&w.families, T);
        w
    }

    /// The enforcers' kubeconfig.
    pub fn kubeconfig(&self) -> &std::path::Path {
        &self.kubeconfig
    }

    pub fn log_file(&self, node: u8) -> PathBuf {
        self.logs.path().join(format!("netpol-node{node}.log"))
    }

    pub fn log(&self, node: u8) -> String {
        fs::read_to_string(self.log_file(node)).unwrap_or_default()
    }

    /// Waits until node `node`'s enforcer has logged `needle` `times` times in all.
    pub fn wait_log_times(&self, node: u8, needle: &str, times: usize) {
        wait_for(
            &format!("{needle:?} ({times}x) in node {node}'s flannel-netpol log"),
            T,
            || (self.log(node).matches(needle).count() >= times).then_some(()),
        );
    }

    pub fn wait_log(&self, node: u8, needle: &str) {
        self.wait_log_times(node, needle, 1);
    }

    /// Starts node `node`'s enforcer (a running one is killed first), logging to its file.
    pub fn start_enforcer(&self, node: u8) {
        self.enforcers.lock().unwrap().remove(&node);
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_file(node))
            .unwrap();
        let child = self
            .cluster
            .node(node)
            .ns
            .command(NETPOL)
            .args(["--kubeconfig", &self.kubeconfig.display().to_string()])
            .args(["--hostname-override", &format!("node{node}")])
            .args([
                "--subnet-file",
                &self.cluster.node(node).subnet_file().display().to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {NETPOL} on node {node}: {e}"));
        self.enforcers
            .lock()
            .unwrap()
            .insert(node, Daemon(Some(child)));
    }

    /// Stops node `node`'s enforcer with SIGTERM and waits for it.
    pub fn terminate_enforcer(&self, node: u8) {
        let d = self.enforcers.lock().unwrap().remove(&node);
        if let Some(mut d) = d {
            if let Some(c) = d.0.as_mut() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(c.id() as i32),
                    nix::sys::signal::Signal::SIGTERM,
                );
                let _ = c.wait();
            }
        }
    }

    pub fn pod(&self, model: &str) -> &testkit::cluster::Pod {
        &self.cluster.pods()[self.pods[model]]
    }

    pub fn addr(&self, model: &str, f: Family) -> IpAddr {
        self.pod(model)
            .addr(f)
            .unwrap_or_else(|| panic!("{model} has no {f} address"))
            .parse()
            .unwrap()
    }

    /// A gauge of node `node`'s enforcer, from its /metrics.
    pub fn metric(&self, node: u8, name: &str) -> Option<f64> {
        let text = self.cluster.node(node).ns.run_inside(|| {
            let mut s = std::net::TcpStream::connect(("127.0.0.1", 9095)).ok()?;
            s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                .ok()?;
            let mut out = String::new();
            s.read_to_string(&mut out).ok()?;
            Some(out)
        })?;
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    }

    /// Waits until every running enforcer's kernel holds what the changes up to
    /// resourceVersion `rv` say.
    pub fn settle(&self, rv: u64) {
        let running: Vec<u8> = self.enforcers.lock().unwrap().keys().copied().collect();
        for n in running {
            wait_for(
                &format!("node {n}'s flannel-netpol to apply resourceVersion {rv}"),
                T,
                || {
                    let v = self.metric(n, "flannel_netpol_applied_resource_version")?;
                    (v >= rv as f64).then_some(())
                },
            );
        }
    }

    /// Creates (or replaces) policy `name` in `ns` with `spec`, and waits until it is enforced.
    pub fn policy(&self, ns: &str, name: &str, spec: Value) {
        let api = self.cluster.kube();
        let obj = json!({"metadata": {"name": name}, "spec": spec});
        let made = if api.get(Kind::NetworkPolicy, ns, name).is_some() {
            api.replace(Kind::NetworkPolicy, ns, name, &obj).unwrap()
        } else {
            api.create(Kind::NetworkPolicy, ns, obj).unwrap()
        };
        self.settle(version(&made));
    }

    pub fn delete_policy(&self, ns: &str, name: &str) {
        let gone = self
            .cluster
            .kube()
            .delete(Kind::NetworkPolicy, ns, name)
            .unwrap();
        self.settle(version(&gone));
    }

    /// Deletes every policy, as the e2e suite cleans up between cases.
    pub fn clean(&self) {
        let api = self.cluster.kube();
        let mut last = 0;
        for p in api.list(Kind::NetworkPolicy, None) {
            let meta = &p["metadata"];
            let (ns, name) = (meta["namespace"].as_str(), meta["name"].as_str());
            let gone = api
                .delete(Kind::NetworkPolicy, ns.unwrap(), name.unwrap())
                .unwrap();
            last = version(&gone);
        }
        self.settle(last);
    }

    /// Merges `labels` into pod `model`'s (a null value removes one), and waits until the
    /// enforcers hold it.
    pub fn label_pod(&self, model: &str, labels: Value) {
        let (ns, name) = model.split_once('/').unwrap();
        let p = self
            .cluster
            .kube()
            .patch(
                Kind::Pod,
                ns,
                name,
                false,
                &json!({"metadata": {"labels": labels}}),
            )
            .unwrap();
        self.settle(version(&p));
    }

    /// Merges `labels` into namespace `ns`'s (a null value removes one), and waits until the
    /// enforcers hold it.
    pub fn label_namespace(&self, ns: &str, labels: Value) {
        let n = self
            .cluster
            .kube()
            .patch(
                Kind::Namespace,
                "",
                ns,
                false,
                &json!({"metadata": {"labels": labels}}),
            )
            .unwrap();
        self.settle(version(&n));
    }

    /// Probes every pair on `proto`/`port` over every family, side by side; the cells that
    /// are not as `expect` says. A cell that found no answer where one was expected is probed
    /// once more with a longer timeout, so that a slow answer on a loaded machine is no miss.
    pub fn mismatches(
        &self,
        proto: Proto,
        port: u16,
        expect: &dyn Fn(&str, &str) -> bool,
    ) -> Vec<String> {
        let mut cells = Vec::new();
        for &f in &self.families {
            for from in PODS {
                for to in PODS.iter().copied().filter(|t| *t != from) {
                    cells.push((from, to, f));
                }
            }
        }
        let probe = |c: &(&str, &str, Family)| Probe {
            from: self.pod(c.0).ns.path().to_path_buf(),
            proto,
            to: SocketAddr::new(self.addr(c.1, c.2), port),
        };
        let mut got = probe_all(&cells.iter().map(probe).collect::<Vec<_>>(), PROBE);
        let again: Vec<usize> = (0..cells.len())
            .filter(|&i| !got[i] && expect(cells[i].0, cells[i].1))
            .collect();
        if !again.is_empty() {
            let probes: Vec<Probe> = again.iter().map(|&i| probe(&cells[i])).collect();
            for (i, g) in again.iter().zip(probe_all(&probes, PROBE_AGAIN)) {
                got[*i] = g;
            }
        }
        cells
            .iter()
            .zip(got)
            .filter(|((from, to, _), g)| *g != expect(from, to))
            .map(|((from, to, f), g)| {
                format!(
                    "{from} -> {to} {proto}/{port} {f}: {}",
                    if g {
                        "connected, expected denied"
                    } else {
                        "denied, expected connected"
                    }
                )
            })
            .collect()
    }

    /// The truth table holds: every pair reaches as `expect` says (loopback left out). The
    /// enforcers have applied every change by now (the helpers that change the cluster wait
    /// for that); a matrix that does not hold is looked at twice more before it fails, for the
    /// machine's sake, not the enforcers'.
    pub fn check(&self, what: &str, proto: Proto, port: u16, expect: impl Fn(&str, &str) -> bool) {
        let mut wrong = Vec::new();
        for _ in 0..3 {
            wrong = self.mismatches(proto, port, &expect);
            if wrong.is_empty() {
                return;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        panic!(
            "{what}: the truth table does not hold:\n  {}\n{}",
            wrong.join("\n  "),
            self.describe()
        );
    }

    /// Each node's enforcer log tail and table, for a failure message.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        for n in 1..=3 {
            let log = self.log(n);
            let tail: Vec<&str> = log.lines().rev().take(15).collect();
            let table = self
                .cluster
                .node(n)
                .ns
                .try_run("nft", &["list", "table", "inet", "flannel-netpol"]);
            out.push_str(&format!(
                "--- node {n}: flannel-netpol log (last lines)\n{}\n--- node {n}: table\n{}\n",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
                String::from_utf8_lossy(&table.stdout)
            ));
        }
        out
    }
}

/// An object's resourceVersion.
pub fn version(obj: &Value) -> u64 {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no resourceVersion in {obj}"))
}

/// Whether `pod` ("x/a") matches `pattern` ("*", "x/*", "*/a", "x/a").
fn matches(pattern: &str, pod: &str) -> bool {
    if pattern == "*" {
        return true;
    }
    let (pns, pname) = pattern.split_once('/').unwrap_or((pattern, "*"));
    let (ns, name) = pod.split_once('/').unwrap_or_default();
    (pns == "*" || pns == ns) && (pname == "*" || pname == name)
}

/// An expected truth table, built as the e2e suite's Reachability is: everything one way,
/// then pairs set by patterns, later settings over earlier ones.
#[derive(Debug, Clone)]
pub struct Reach {
    cells: BTreeMap<(&'static str, &'static str), bool>,
}

impl Reach {
    pub fn all(v: bool) -> Reach {
        let mut cells = BTreeMap::new();
        for from in PODS {
            for to in PODS {
                cells.insert((from, to), v);
            }
        }
        Reach { cells }
    }

    /// Every pair from a pod matching `from` to one matching `to`.
    pub fn peer(mut self, from: &str, to: &str, v: bool) -> Reach {
        for ((f, t), cell) in self.cells.iter_mut() {
            if matches(from, f) && matches(to, t) {
                *cell = v;
            }
        }
        self
    }

    pub fn get(&self, from: &str, to: &str) -> bool {
        self.cells.get(&(from, to)).copied().unwrap_or(false)
    }
}

impl World {
    /// `check` against a `Reach`.
    pub fn expect(&self, what: &str, proto: Proto, port: u16, r: &Reach) {
        self.check(what, proto, port, |f, t| r.get(f, t));
    }
}
