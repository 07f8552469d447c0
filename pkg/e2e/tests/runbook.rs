//! The switch-over runbook, executed: its four step lists (kube-flannel to ours and back, Go's
//! flanneld under systemd to ours and back) are read from docs/switching-from-go.md and run in
//! their order on a three-node testkit cluster, with Go's flanneld v0.20.2 and Go's plugins on
//! every node at the start and at the end. The kube mode (API server stand-in, vxlan) runs the
//! DaemonSet lists; the etcd mode (host-gw) the systemd ones.
//!
//! Every command of a step that is not kubectl's runs as written, on its node: `sh -c` in the
//! node's network namespace, the node's paths (/opt/cni/bin, /usr/local/bin,
//! /etc/systemd/system, /etc/sysconfig, /var/lib/cni/networks) mapped to a root per node, so a
//! typo in a `cp`, `mv`, `rm`, `install.sh` or `echo` line fails the test; `systemctl` is
//! answered by the test (`daemon-reload`; `restart flanneld` stops the daemon and starts what the
//! unit file names, with its environment file). A check that the runbook says prints nothing
//! must print nothing; every other command must exit 0. What kubectl would do is modelled, not
//! faked away: `kubectl label`, the JSON patches and `kubectl set env` act on two DaemonSets whose
//! node affinity is our manifest's and kube-flannel.yml's with the runbook's patches applied;
//! each node runs the daemon whose DaemonSet selects it (both selecting one node fails the
//! test), a template change restarts a DaemonSet's daemons one node at a time, and our init step
//! is deploy/cni-install.sh. Pods come before, during and after each
//! list; pings every 200 ms from the first pods run through each list and lose nothing; doctor
//! passes where ours runs; at the end Go's plugins delete every pod and nothing of ours is left.

use e2e::install::fresh_tree;
use e2e::plugins::repo_root;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::fs;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;
use testkit::cluster::{kube_node_name, wait_for, Cluster, Family, Registry};
use testkit::TestNs;

const NODES: u8 = 3;
const T: Duration = Duration::from_secs(30);
const OUTSIDE_PORT: u16 = 8080;
const LABEL: &str = "flannel-cni-rs.io/flanneld";
/// kube-flannel.yml's DaemonSet, as far as scheduling goes: its node affinity.
const KUBE_FLANNEL_AFFINITY: &str = r#"{"spec":{"template":{"spec":{"affinity":{"nodeAffinity":
    {"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":
    [{"key":"kubernetes.io/os","operator":"In","values":["linux"]}]}]}}}}}}}"#;

/// Go's flanneld: `FLANNELD_GO`, else `../shared/reference/flanneld-v0.20.2` beside the checkout.
fn go_flanneld() -> PathBuf {
    std::env::var_os("FLANNELD_GO")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("../shared/reference/flanneld-v0.20.2"))
}

fn runs_here() -> bool {
    let go = go_flanneld();
    testkit::runs_here(
        go.is_file(),
        testkit::Need::Outside(&format!(
            "Go's flanneld v0.20.2 at {} (FLANNELD_GO names another place)",
            go.display()
        )),
    ) && testkit::runs_here(testkit::go_plugins_available(), testkit::GO_PLUGINS)
}

// ---------------------------------------------------------------------------------------------
// The runbook as docs/switching-from-go.md lists it.

const RUNBOOK: &str = "docs/switching-from-go.md";

/// One numbered item of a list: its bold title, its text with the commands, and for "On each
/// node in turn" the items under it.
#[derive(Debug, Default)]
struct Step {
    title: String,
    text: String,
    each_node: Vec<Step>,
}

impl Step {
    /// The shell commands of its code blocks, continuation lines joined.
    fn commands(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut inside = false;
        let mut pending = String::new();
        for line in self.text.lines().map(str::trim) {
            if line.starts_with("```") {
                inside = !inside;
                continue;
            }
            if !inside {
                continue;
            }
            match line.strip_suffix('\\') {
                Some(head) => pending += head,
                None => {
                    out.push(format!("{pending}{line}"));
                    pending.clear();
                }
            }
        }
        out
    }
}

/// A numbered item's bold title (`1. **Title.** ...`), and how far it is indented.
fn item(line: &str) -> Option<(usize, String)> {
    let indent = line.len() - line.trim_start().len();
    let rest = line.trim_start();
    let digits = rest.find(|c: char| !c.is_ascii_digit())?;
    let rest = rest[digits..].strip_prefix(". **").filter(|_| digits > 0)?;
    let end = rest.find("**")?;
    Some((indent, rest[..end].to_string()))
}

/// The steps under the heading `### <section>` of the runbook's page, in order.
fn runbook(section: &str) -> Vec<Step> {
    let page = fs::read_to_string(repo_root().join(RUNBOOK)).unwrap();
    let heading = format!("### {section}");
    let mut lines = page.lines().skip_while(|l| *l != heading);
    assert!(
        lines.next().is_some(),
        "{RUNBOOK} has no heading {heading:?}"
    );
    let mut steps: Vec<Step> = Vec::new();
    let mut fence = false;
    for line in lines {
        if line.trim_start().starts_with("```") {
            fence = !fence;
        }
        if !fence && line.starts_with('#') {
            break;
        }
        match item(line).filter(|_| !fence) {
            Some((0, title)) => steps.push(Step {
                title,
                text: format!("{line}\n"),
                ..Step::default()
            }),
            Some((_, title)) => steps
                .last_mut()
                .unwrap_or_else(|| panic!("{section}: {title:?} is nested under nothing"))
                .each_node
                .push(Step {
                    title,
                    text: format!("{line}\n"),
                    ..Step::default()
                }),
            None => {
                if let Some(top) = steps.last_mut() {
                    let step = if top.each_node.is_empty() {
                        top
                    } else {
                        top.each_node.last_mut().expect("not empty")
                    };
                    step.text += line;
                    step.text += "\n";
                }
            }
        }
    }
    assert!(!steps.is_empty(), "no numbered steps under {heading:?}");
    steps
}

// ---------------------------------------------------------------------------------------------
// Continuous pings.

/// Seconds since the epoch, as `ping -D` prints them.
fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

/// `ping -i 0.2` from a pod on `node`, until stopped.
struct Pinger {
    what: String,
    node: u8,
    outside: bool,
    child: Child,
}

/// A ping that got no answer, between the answers before and after it (their times).
#[derive(Debug)]
struct Lost {
    seq: u64,
    after: f64,
    before: f64,
}

impl Pinger {
    fn start(ns: &TestNs, to: &str, node: u8, outside: bool, what: String) -> Pinger {
        let child = ns
            .command("ping")
            .args(["-D", "-n", "-i", "0.2", to])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("ping in {}: {e}", ns.name()));
        Pinger {
            what,
            node,
            outside,
            child,
        }
    }

    /// Stops it; how many were answered, and those up to the last answered one that were not.
    fn stop(mut self) -> (usize, Vec<Lost>) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
        let _ = self.child.wait();
        let mut out = String::new();
        if let Some(mut s) = self.child.stdout.take() {
            let _ = s.read_to_string(&mut out);
        }
        // `[1795774364.683537] 64 bytes from ...: icmp_seq=9 ttl=63 time=0.083 ms`
        let answered: std::collections::BTreeMap<u64, f64> = out
            .lines()
            .filter(|l| !l.contains("DUP!"))
            .filter_map(|l| {
                let at = l.strip_prefix('[')?.split(']').next()?.parse().ok()?;
                let seq = l
                    .split("icmp_seq=")
                    .nth(1)?
                    .split(' ')
                    .next()?
                    .parse()
                    .ok()?;
                Some((seq, at))
            })
            .collect();
        let last = answered.keys().next_back().copied().unwrap_or(0);
        let lost = (1..=last)
            .filter(|s| !answered.contains_key(s))
            .map(|seq| Lost {
                seq,
                after: answered.range(..seq).next_back().map_or(0.0, |(_, t)| *t),
                before: answered.range(seq..).next().map_or(f64::MAX, |(_, t)| *t),
            })
            .collect();
        (answered.len(), lost)
    }
}

impl Drop for Pinger {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------------
// The cluster, its nodes' daemons and the two DaemonSets.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Daemon {
    None,
    Go,
    Ours,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// kube-flannel's DaemonSet and ours, leases in Node objects.
    DaemonSet,
    /// A systemd unit per node, leases in etcd.
    Systemd,
}

struct Switch {
    c: Cluster,
    mode: Mode,
    go: PathBuf,
    /// Each node's root: opt/cni/bin, etc/cni/net.d, usr/local/bin, etc/systemd/system, etc.
    roots: tempfile::TempDir,
    running: Vec<Daemon>,
    /// kube-flannel's DaemonSet (None once deleted) and ours (None until applied).
    go_ds: Option<Value>,
    ours_ds: Option<Value>,
    /// Our DaemonSet's variables from `kubectl set env`.
    ours_env: Vec<(String, String)>,
    /// Our ConfigMap's files, as step "Apply ours" copies them from kube-flannel's.
    ours_cm: PathBuf,
    /// How many pods existed before the runbook: the pingers run from them.
    first_pods: usize,
    /// Each start of Go's flanneld: its node, from before its start until a second after it
    /// wrote subnet.env (its masquerade rules are written around then).
    go_starts: Vec<(u8, f64, f64)>,
}

/// Does this DaemonSet's required node affinity select a node with these labels?
fn selects(ds: &Value, labels: &Value) -> bool {
    let terms = &ds["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
        ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
    let terms = terms.as_array().cloned().unwrap_or_default();
    terms.is_empty()
        || terms.iter().any(|t| {
            t["matchExpressions"]
                .as_array()
                .into_iter()
                .flatten()
                .all(|e| {
                    let value = labels[e["key"].as_str().unwrap_or_default()].as_str();
                    let listed =
                        |v: &str| e["values"].as_array().into_iter().flatten().any(|x| x == v);
                    match e["operator"].as_str() {
                        Some("In") => value.is_some_and(listed),
                        Some("NotIn") => !value.is_some_and(listed),
                        Some("Exists") => value.is_some(),
                        Some("DoesNotExist") => value.is_none(),
                        op => panic!("node affinity operator {op:?}"),
                    }
                })
        })
}

/// Our kube-mode manifest's DaemonSet.
fn our_daemonset() -> Value {
    let path = repo_root().join("deploy/kubernetes/flanneld-kube.yml");
    let text = fs::read_to_string(&path).unwrap();
    let ds = serde_norway::Deserializer::from_str(&text)
        .map(|doc| serde::Deserialize::deserialize(doc).unwrap())
        .find(|d: &Value| d["kind"] == "DaemonSet");
    ds.unwrap_or_else(|| panic!("no DaemonSet in {}", path.display()))
}

/// The single-quoted JSON after `-p` in a kubectl command.
fn json_arg(cmd: &str) -> Value {
    let (_, rest) = cmd
        .split_once("-p '")
        .unwrap_or_else(|| panic!("no -p '...' in {cmd}"));
    let json = rest.split('\'').next().unwrap_or_default();
    serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {json}"))
}

/// The inode of a network namespace (`/proc/<pid>/ns/net`, or a node's bind mount of one).
fn net_ns_inode(path: &Path) -> Option<u64> {
    fs::metadata(path).ok().map(|m| m.ino())
}

impl Switch {
    fn root(&self, i: u8) -> PathBuf {
        self.roots.path().join(format!("node{i}"))
    }

    fn bin(&self, i: u8) -> PathBuf {
        self.root(i).join("opt/cni/bin")
    }

    fn unit(&self, i: u8) -> PathBuf {
        self.root(i).join("etc/systemd/system/flanneld.service")
    }

    fn env_file(&self, i: u8) -> PathBuf {
        self.root(i).join("etc/sysconfig/flanneld")
    }

    fn daemon_bin(&self, i: u8) -> PathBuf {
        self.root(i).join("usr/local/bin/flanneld")
    }

    fn nodes(&self) -> impl Iterator<Item = u8> {
        1..=NODES
    }

    /// The node's plugin directory as it is before the switch: Go's four plugins from Debian's
    /// package, and the flannel plugin (ours: Go's is not packaged).
    fn install_go_plugins(&self, i: u8) {
        let bin = self.bin(i);
        fs::create_dir_all(&bin).unwrap();
        for p in ["bridge", "host-local", "portmap", "loopback"] {
            fs::copy(Path::new(testkit::GO_PLUGIN_DIR).join(p), bin.join(p)).unwrap();
        }
        fs::copy(testkit::bin_dir().join("flannel"), bin.join("flannel")).unwrap();
        self.install_conflist(i);
    }

    /// kube-flannel's install-cni init container (and a systemd node's conflist).
    fn install_conflist(&self, i: u8) {
        let conf = self.root(i).join("etc/cni/net.d");
        fs::create_dir_all(&conf).unwrap();
        fs::copy(
            repo_root().join("testdata/10-flannel.conflist"),
            conf.join("10-flannel.conflist"),
        )
        .unwrap();
    }

    fn new(mode: Mode, prefix: &str, net: u8) -> Switch {
        let (registry, backend) = match mode {
            Mode::DaemonSet => (Registry::Kube, "vxlan"),
            Mode::Systemd => (Registry::Etcd, "host-gw"),
        };
        let config = format!(r#"{{"Network":"10.{net}.0.0/16","Backend":{{"Type":"{backend}"}}}}"#);
        let c = Cluster::new(prefix, net, NODES, registry, &config);
        let roots = tempfile::Builder::new()
            .prefix("runbook-")
            .tempdir()
            .unwrap();
        let ours_cm = roots.path().join("flanneld-cfg");
        let mut s = Switch {
            c,
            mode,
            go: go_flanneld(),
            roots,
            running: vec![Daemon::None; usize::from(NODES)],
            go_ds: None,
            ours_ds: None,
            ours_env: Vec::new(),
            ours_cm,
            first_pods: 0,
            go_starts: Vec::new(),
        };
        for i in s.nodes() {
            s.install_go_plugins(i);
            let bin = s.bin(i);
            s.c.set_node_plugins(i, &bin);
        }
        match mode {
            Mode::DaemonSet => {
                for i in s.nodes() {
                    // What kubelet puts on a Node: the OS label, an annotation (Go's flanneld
                    // v0.20.2 assumes the map exists). The manifests give no --iface.
                    s.c.kube()
                        .patch_node(
                            &kube_node_name(i),
                            false,
                            &json!({"metadata": {
                                "labels": {"kubernetes.io/os": "linux"},
                                "annotations": {"node.alpha.kubernetes.io/ttl": "0"}}}),
                        )
                        .unwrap();
                    s.c.set_flanneld_iface(i, None);
                }
                s.go_ds = Some(serde_json::from_str(KUBE_FLANNEL_AFFINITY).unwrap());
                for i in s.nodes() {
                    s.reconcile(i);
                }
            }
            Mode::Systemd => {
                for i in s.nodes() {
                    let root = s.root(i);
                    for d in ["usr/local/bin", "etc/systemd/system", "etc/sysconfig"] {
                        fs::create_dir_all(root.join(d)).unwrap();
                    }
                    std::os::unix::fs::symlink(&s.go, s.daemon_bin(i)).unwrap();
                    let env = format!(
                        "FLANNELD_ETCD_ENDPOINTS={}\nFLANNELD_IFACE=eth0\nFLANNELD_IP_MASQ=true\n\
                         FLANNELD_SUBNET_FILE={}\n",
                        s.c.etcd_url().unwrap(),
                        s.c.node(i).subnet_file().display()
                    );
                    fs::write(s.env_file(i), env).unwrap();
                    let unit = format!(
                        "[Unit]\nDescription=flannel (Go)\nAfter=network-online.target\n\
                         [Service]\nType=notify\nEnvironmentFile={}\nExecStart={}\n\
                         Restart=on-failure\n[Install]\nWantedBy=multi-user.target\n",
                        s.env_file(i).display(),
                        s.daemon_bin(i).display()
                    );
                    fs::write(s.unit(i), unit).unwrap();
                    s.systemctl_restart(i);
                    // Go's v0.20.2 misses a lease created in the first instants of its etcd
                    // watch; the nodes of a running cluster did not start together.
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        }
        assert_eq!(s.running, vec![Daemon::Go; usize::from(NODES)]);
        for i in s.nodes() {
            s.c.add_pod(i);
        }
        s.first_pods = s.c.pods().len();
        s.c.serve_outside(OUTSIDE_PORT);
        s.check_all("before the switch, on Go's flanneld and plugins");
        s
    }

    // --- daemons ---

    /// How many lines of node `i`'s flanneld log say `d` wrote subnet.env.
    fn writes(&self, i: u8, d: Daemon) -> usize {
        let needle = match d {
            Daemon::Go => "Wrote subnet file to".to_string(),
            _ => format!("wrote {}", self.c.node(i).subnet_file().display()),
        };
        self.c
            .node(i)
            .log()
            .lines()
            .filter(|l| l.contains(&needle))
            .count()
    }

    /// Starts `d` on node `i` through `wrapper` and waits until it has written subnet.env.
    fn start(&mut self, i: u8, d: Daemon, program: &Path, wrapper: &[&str], extra: &[&str]) {
        assert_eq!(self.running[usize::from(i) - 1], Daemon::None, "node {i}");
        let before = self.writes(i, d);
        let from = now();
        self.c.set_flanneld_wrapper(i, wrapper);
        self.c.start_flanneld(i, program, extra);
        self.running[usize::from(i) - 1] = d;
        wait_for(
            &format!("{d:?} flanneld on node {i} to write subnet.env"),
            T,
            || (self.writes(i, d) > before).then_some(()),
        );
        if d == Daemon::Go {
            self.go_starts.push((i, from, now() + 1.0));
        }
        self.assert_one_daemon(i);
    }

    /// SIGTERM, as the kubelet or systemd stop it; Go's v0.20.2 may panic on it, so any exit
    /// status is taken.
    fn stop(&mut self, i: u8) {
        if self.running[usize::from(i) - 1] != Daemon::None {
            self.c.terminate_flanneld(i, T);
            self.running[usize::from(i) - 1] = Daemon::None;
        }
        self.assert_one_daemon(i);
    }

    /// Never more than one flanneld process in a node's network namespace (a child it forks
    /// to run iptables shows its command line until it execs: not counted).
    fn assert_one_daemon(&self, i: u8) {
        let node_ns = net_ns_inode(self.c.node(i).ns.path());
        let mut found: Vec<(u32, u32, String)> = Vec::new();
        for entry in fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let proc = entry.path();
            let cmdline = fs::read(proc.join("cmdline")).unwrap_or_default();
            let argv0 = cmdline.split(|&b| b == 0).next().unwrap_or_default();
            let name = Path::new(std::str::from_utf8(argv0).unwrap_or_default())
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let args = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if name.starts_with("flanneld")
                && !args.contains(" doctor")
                && net_ns_inode(&proc.join("ns/net")) == node_ns
            {
                let stat = fs::read_to_string(proc.join("stat")).unwrap_or_default();
                let ppid = stat
                    .rsplit(')')
                    .next()
                    .and_then(|rest| rest.split_whitespace().nth(1))
                    .and_then(|p| p.parse().ok())
                    .unwrap_or(0);
                found.push((pid, ppid, args));
            }
        }
        let pids: BTreeSet<u32> = found.iter().map(|f| f.0).collect();
        let daemons: Vec<&String> = found
            .iter()
            .filter(|f| !pids.contains(&f.1))
            .map(|f| &f.2)
            .collect();
        assert!(daemons.len() <= 1, "two flanneld on node {i}: {daemons:?}");
    }

    // --- the DaemonSet model ---

    fn labels(&self, i: u8) -> Value {
        self.c.kube().node(&kube_node_name(i)).unwrap()["metadata"]["labels"].clone()
    }

    /// Which DaemonSet selects node `i` with these labels.
    fn selected(&self, labels: &Value) -> Daemon {
        if self.go_ds.as_ref().is_some_and(|ds| selects(ds, labels)) {
            Daemon::Go
        } else if self.ours_ds.as_ref().is_some_and(|ds| selects(ds, labels)) {
            Daemon::Ours
        } else {
            Daemon::None
        }
    }

    fn label(&mut self, nodes: &[u8], value: Option<&str>) {
        for &i in nodes {
            // The two DaemonSet controllers act on their own: a label that hands a node from
            // one straight to the other lets the new pod start before the old one is gone.
            let mut labels = self.labels(i);
            let before = self.selected(&labels);
            labels[LABEL] = value.map_or(Value::Null, Value::from);
            let after = self.selected(&labels);
            assert!(
                before == after || before == Daemon::None || after == Daemon::None,
                "labelling node {i} {value:?} hands it from {before:?}'s DaemonSet straight to \
                 {after:?}'s"
            );
        }
        for &i in nodes {
            self.c
                .kube()
                .patch_node(
                    &kube_node_name(i),
                    false,
                    &json!({"metadata": {"labels": {LABEL: value}}}),
                )
                .unwrap();
        }
        for &i in nodes {
            self.reconcile(i);
        }
    }

    /// What the DaemonSet controller does on node `i`: the daemon no DaemonSet selects any more
    /// goes, the one selected starts after its init step.
    fn reconcile(&mut self, i: u8) {
        let labels = self.labels(i);
        let go = self.go_ds.as_ref().is_some_and(|ds| selects(ds, &labels));
        let ours = self.ours_ds.as_ref().is_some_and(|ds| selects(ds, &labels));
        assert!(
            !(go && ours),
            "both DaemonSets select node {i} (labels {labels})"
        );
        let now = self.running[usize::from(i) - 1];
        if (now == Daemon::Go && !go) || (now == Daemon::Ours && !ours) {
            self.stop(i);
        }
        if self.running[usize::from(i) - 1] == Daemon::None {
            if go {
                self.start_go_pod(i);
            } else if ours {
                self.start_our_pod(i);
            }
        }
    }

    fn start_go_pod(&mut self, i: u8) {
        self.install_conflist(i);
        let go = self.go.clone();
        self.start(i, Daemon::Go, &go, &[], &["--ip-masq"]);
    }

    fn start_our_pod(&mut self, i: u8) {
        let ds = self.ours_ds.clone().expect("our DaemonSet applied");
        let pod = &ds["spec"]["template"]["spec"];
        // The init container: deploy/cni-install.sh, as the manifest runs it, on the node's root.
        let init = &pod["initContainers"][0]["command"];
        assert_eq!(init[0], "/usr/local/bin/cni-install.sh");
        let out = std::process::Command::new(repo_root().join("deploy/cni-install.sh"))
            .arg(format!("--root={}", self.root(i).display()))
            .arg(format!("--from={}", testkit::bin_dir().display()))
            .arg(format!(
                "--conflist={}",
                self.ours_cm.join("cni-conf.json").display()
            ))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "cni-install.sh on node {i}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // The container: the manifest's arguments, the ConfigMap where it is mounted.
        let args: Vec<String> = pod["containers"][0]["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                a.as_str().unwrap().replace(
                    "/etc/kube-flannel/",
                    &format!("{}/", self.ours_cm.display()),
                )
            })
            .collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let env: Vec<String> = self
            .ours_env
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let mut wrapper = vec!["env"];
        wrapper.extend(env.iter().map(String::as_str));
        let ours = testkit::bin_dir().join("flanneld");
        self.start(i, Daemon::Ours, &ours, &wrapper, &args);
        wait_for(&format!("our flanneld's /readyz on node {i}"), T, || {
            let status = self
                .c
                .node(i)
                .ns
                .http_status("http://127.0.0.1:8285/readyz");
            (status == "200").then_some(())
        });
    }

    /// A change of a DaemonSet's template: its daemons restart one node at a time.
    fn roll(&mut self, d: Daemon) {
        for i in self.nodes() {
            if self.running[usize::from(i) - 1] == d {
                self.stop(i);
                self.reconcile(i);
            }
        }
    }

    /// The kubectl commands of a step that change the cluster, applied to the model.
    fn kubectl(&mut self, cmd: &str, node: Option<u8>) {
        {
            let cmd = cmd.to_string();
            let words: Vec<&str> = cmd.split_whitespace().collect();
            if words.first() != Some(&"kubectl") {
                return;
            }
            let label_value = || {
                words.iter().find_map(|w| {
                    let rest = w.strip_prefix(LABEL)?;
                    Some(rest.strip_prefix('=').map(str::to_string))
                })
            };
            if cmd.starts_with("kubectl label nodes --all ") {
                let v = label_value().unwrap_or_else(|| panic!("{cmd}"));
                let all: Vec<u8> = self.nodes().collect();
                self.label(&all, v.as_deref());
            } else if cmd.starts_with("kubectl label node $N ") {
                let v = label_value().unwrap_or_else(|| panic!("{cmd}"));
                self.label(&[node.expect("a per-node step")], v.as_deref());
            } else if cmd
                .starts_with("kubectl -n kube-flannel patch ds kube-flannel-ds --type=json")
            {
                let ds = self.go_ds.as_mut().expect("kube-flannel's DaemonSet");
                testkit::kube_api::patch::json_patch(ds, &json_arg(&cmd))
                    .unwrap_or_else(|e| panic!("{cmd}: {e}"));
                self.roll(Daemon::Go);
            } else if cmd.starts_with("kubectl -n flannel-cni-rs set env ds/flanneld ") {
                for kv in &words[6..] {
                    let (k, v) = kv.split_once('=').unwrap_or_else(|| panic!("{cmd}"));
                    self.ours_env.retain(|(key, _)| key != k);
                    self.ours_env.push((k.to_string(), v.to_string()));
                }
                self.roll(Daemon::Ours);
            } else if cmd == "kubectl apply -f deploy/kubernetes/flanneld-kube.yml" {
                self.ours_ds = Some(our_daemonset());
                for i in self.nodes() {
                    self.reconcile(i);
                }
            } else if cmd == "kubectl delete -f deploy/kubernetes/flanneld-kube.yml" {
                self.ours_ds = None;
                for i in self.nodes() {
                    self.reconcile(i);
                }
            } else {
                let waits = ["wait", "rollout", "get", "create", "exec", "debug"];
                assert!(
                    words.iter().take(4).any(|w| waits.contains(w)),
                    "a kubectl command the model does not know: {cmd}"
                );
            }
        }
    }

    // --- systemd ---

    /// `systemctl daemon-reload && systemctl restart flanneld`: the running daemon stops, and
    /// what the unit file names now starts with its environment file.
    fn systemctl_restart(&mut self, i: u8) {
        self.stop(i);
        let unit = fs::read_to_string(self.unit(i)).unwrap();
        let key = |k: &str| {
            unit.lines()
                .find_map(|l| l.strip_prefix(k))
                .unwrap_or_else(|| panic!("no {k} in node {i}'s unit:\n{unit}"))
                .to_string()
        };
        let (env, exec) = (key("EnvironmentFile="), key("ExecStart="));
        // The runbook copies Go's binary aside and back: it is Go's by its content.
        let d = if fs::read(&exec).ok() == fs::read(&self.go).ok() {
            Daemon::Go
        } else {
            Daemon::Ours
        };
        // As systemd runs it: the variables of the file, then ExecStart, nothing else.
        let script = format!("set -a; . {env}; set +a; exec {exec}");
        self.start(i, d, Path::new(&exec), &["sh", "-c", &script, "sh"], &[]);
    }

    // --- checks ---

    /// Every pod reaches every other, and each the outside masqueraded as its node.
    fn check_all(&self, when: &str) {
        self.c.wait_every_pod_reaches_every_other(&[Family::V4], T);
        for (p, pod) in self.c.pods().iter().enumerate() {
            let node_ip = &self.c.node(pod.node).ip;
            wait_for(
                &format!(
                    "{when}: pod {p} (node {}) to reach the outside as {node_ip}",
                    pod.node
                ),
                T,
                || {
                    let seen = self.c.seen_from_outside(p, Family::V4, OUTSIDE_PORT)?;
                    (seen.to_string() == *node_ip).then_some(())
                },
            );
        }
    }

    /// `flanneld doctor` with the daemon's settings on node `i`: exit 0.
    fn doctor(&self, i: u8) {
        let out = match self.mode {
            Mode::DaemonSet => {
                let ours = testkit::bin_dir().join("flanneld");
                let mut args: Vec<String> = vec!["doctor".into()];
                args.extend(self.c.flanneld_args(i));
                args.extend(
                    ["--ip-masq", "--kube-subnet-mgr"]
                        .iter()
                        .map(|s| s.to_string()),
                );
                args.push(format!(
                    "--net-config-path={}",
                    self.ours_cm.join("net-conf.json").display()
                ));
                self.c
                    .node(i)
                    .ns
                    .command(&ours)
                    .args(&args)
                    .env("NODE_NAME", kube_node_name(i))
                    .output()
                    .unwrap()
            }
            Mode::Systemd => {
                let script = format!(
                    "set -a; . {}; set +a; exec {} doctor",
                    self.env_file(i).display(),
                    self.daemon_bin(i).display()
                );
                self.c
                    .node(i)
                    .ns
                    .command("sh")
                    .args(["-c", &script])
                    .output()
                    .unwrap()
            }
        };
        assert!(
            out.status.success(),
            "doctor on node {i}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// No nexthop, no route through one: what Go's flanneld finds is what it writes.
    fn no_nexthops(&self, i: u8) {
        let (nexthops, routes) = self.nexthops(i);
        assert!(
            nexthops.trim().is_empty() && !routes.contains("nhid"),
            "node {i} still has nexthops:\n{nexthops}\n{routes}"
        );
    }

    /// `ip nexthop` and `ip route` on node `i`.
    fn nexthops(&self, i: u8) -> (String, String) {
        let ns = &self.c.node(i).ns;
        (ns.run("ip", &["nexthop"]), ns.run("ip", &["route"]))
    }

    /// What the runbook waits for before ours leaves a node: its routes plain, its nexthops
    /// gone (they follow the start, once the leases are listed).
    fn wait_no_nexthops(&self, i: u8) {
        wait_for(
            &format!("node {i}'s routes to turn plain and its nexthops to go"),
            T,
            || {
                let (nexthops, routes) = self.nexthops(i);
                (nexthops.trim().is_empty() && !routes.contains("nhid")).then_some(())
            },
        );
    }

    // --- the steps ---

    fn run(&mut self, section: &str) {
        let mut pingers = Vec::new();
        for p in 0..self.first_pods {
            let pod = &self.c.pods()[p];
            let peer = &self.c.pods()[(p + 1) % self.first_pods];
            pingers.push(Pinger::start(
                &pod.ns,
                &peer.ip,
                pod.node,
                false,
                format!("pod {p} (node {}) -> pod on node {}", pod.node, peer.node),
            ));
            pingers.push(Pinger::start(
                &pod.ns,
                &self.c.outside(Family::V4).unwrap(),
                pod.node,
                true,
                format!("pod {p} (node {}) -> the outside", pod.node),
            ));
        }
        for step in runbook(section) {
            if step.title == "On each node in turn:" {
                for i in self.nodes() {
                    for sub in &step.each_node {
                        self.step(section, sub, Some(i));
                    }
                }
            } else {
                assert!(step.each_node.is_empty(), "{section}: {}", step.title);
                self.step(section, &step, None);
            }
        }
        let mut losses = Vec::new();
        for pinger in pingers {
            let (what, node, outside) = (pinger.what.clone(), pinger.node, pinger.outside);
            let (answered, lost) = pinger.stop();
            assert!(
                answered > 10,
                "{section}: {what}: only {answered} pings answered"
            );
            // What the runbook states: while Go's flanneld starts, packets to the outside
            // from its node may go unmasqueraded.
            for l in lost {
                let during_go_start = self.go_starts.iter().any(|&(n, from, to)| {
                    outside && n == node && l.after <= to && l.before >= from
                });
                if during_go_start {
                    eprintln!(
                        "{section}: {what}: icmp_seq {} unanswered during a start of Go's \
                         flanneld on node {node}",
                        l.seq
                    );
                } else {
                    losses.push(format!(
                        "{what}: no answer to icmp_seq {} (between answers at {:.3} and {:.3})",
                        l.seq, l.after, l.before
                    ));
                }
            }
        }
        assert!(
            losses.is_empty(),
            "{section}: replies lost:\n{}",
            losses.join("\n")
        );
        self.c.add_pod(1);
        self.check_all(&format!("after {section}"));
    }

    fn step(&mut self, section: &str, step: &Step, node: Option<u8>) {
        let at = node.map(|i| format!(" on node {i}")).unwrap_or_default();
        eprintln!("runbook: {:.3} {section}: {}{at}", now(), step.title);
        let i = node.unwrap_or(0);
        let title = step.title.as_str();
        // What the runbook says to wait for before a step's commands.
        match (self.mode, title) {
            (Mode::DaemonSet, "Apply ours with kube-flannel's config.") => {
                // kube-flannel's ConfigMap's two files, as the step's `create configmap` copies
                // them (the model carries no ConfigMap).
                fs::create_dir_all(&self.ours_cm).unwrap();
                fs::copy(self.c.net_conf_file(), self.ours_cm.join("net-conf.json")).unwrap();
                fs::copy(
                    repo_root().join("testdata/10-flannel.conflist"),
                    self.ours_cm.join("cni-conf.json"),
                )
                .unwrap();
            }
            (Mode::DaemonSet, "Take ours off the node.") => self.wait_no_nexthops(i),
            _ => {}
        }
        // The commands as written: kubectl's through the model, the others on the node.
        // A check the runbook says prints nothing passes when it does; any other command
        // (doctor's check included) when its exit status is 0.
        let check = step.text.contains("print nothing") || step.text.contains("prints nothing");
        for cmd in step.commands() {
            if cmd.contains("kubectl") {
                self.kubectl(&cmd, node);
                continue;
            }
            let i = node.unwrap_or_else(|| panic!("{section}: {title}: {cmd:?} on which node?"));
            let (ok, out) = self.on_node(i, &cmd);
            if check {
                assert!(out.trim().is_empty(), "{section}: node {i}: {cmd}:\n{out}");
            } else {
                assert!(ok, "{section}: node {i}: {cmd} failed:\n{out}");
            }
        }
        // What the step leaves, as the test checks it.
        match (self.mode, title) {
            (Mode::DaemonSet, "Apply ours with kube-flannel's config.") => assert!(
                self.running.iter().all(|d| *d == Daemon::Go),
                "{:?}",
                self.running
            ),
            (_, "Take Go's flanneld off the node.") | (_, "Take ours off the node.") => {
                assert_eq!(self.running[usize::from(i) - 1], Daemon::None)
            }
            (Mode::DaemonSet, "Start ours on the node.") | (Mode::Systemd, "Restart the unit.")
                if section.ends_with("to ours") =>
            {
                assert_eq!(self.running[usize::from(i) - 1], Daemon::Ours)
            }
            (_, "Start Go's flanneld on the node.") | (Mode::Systemd, "Restart the unit.") => {
                assert_eq!(self.running[usize::from(i) - 1], Daemon::Go)
            }
            (Mode::Systemd, "Install ours over them.") => {
                // Go's flanneld still runs; its environment file is kept.
                assert_eq!(self.running[usize::from(i) - 1], Daemon::Go);
                let env = fs::read_to_string(self.env_file(i)).unwrap();
                assert!(env.contains("FLANNELD_ETCD_ENDPOINTS="), "{env}");
            }
            (Mode::Systemd, "Turn ours' routes into plain ones.") => {
                assert_eq!(self.running[usize::from(i) - 1], Daemon::Ours);
                self.no_nexthops(i);
            }
            (_, "Check the node.") => {
                let d = self.running[usize::from(i) - 1];
                match d {
                    Daemon::Ours => self.doctor(i),
                    Daemon::Go => self.no_nexthops(i),
                    Daemon::None => panic!("no flanneld on node {i} at {section}"),
                }
                self.c.add_pod(i);
                self.check_all(&format!("{section}, node {i} on {d:?}"));
            }
            (Mode::Systemd, "Remove ours.") => {
                // A sentence, no command: the variable leaves the environment files.
                for i in self.nodes() {
                    let env = self.env_file(i);
                    let text = fs::read_to_string(&env).unwrap();
                    let kept: String = text
                        .lines()
                        .filter(|l| *l != "FLANNELD_NEXTHOPS=false")
                        .map(|l| format!("{l}\n"))
                        .collect();
                    fs::write(&env, kept).unwrap();
                }
            }
            _ => {}
        }
    }

    /// The node's paths as the runbook names them, and where the test keeps node `i`'s.
    fn node_paths(&self, i: u8) -> Vec<(&'static str, PathBuf)> {
        let root = self.root(i);
        vec![
            ("/opt/cni/bin", self.bin(i)),
            ("/usr/local/bin", root.join("usr/local/bin")),
            ("/etc/systemd/system", root.join("etc/systemd/system")),
            ("/etc/sysconfig", root.join("etc/sysconfig")),
            ("/etc/cni/net.d", root.join("etc/cni/net.d")),
            ("/var/lib/cni/networks", self.c.node(i).dir.join("networks")),
        ]
    }

    /// `cmd` with node `i`'s paths mapped to the test's; install.sh's defaults are the node's
    /// paths too, mapped alike, and it installs what the tree holds (built already).
    fn map_paths(&self, i: u8, cmd: &str) -> String {
        let paths = self.node_paths(i);
        let mut out = cmd.to_string();
        for (from, to) in &paths {
            out = out.replace(from, &to.display().to_string());
        }
        let dir = |p: &str| {
            paths
                .iter()
                .find(|(from, _)| *from == p)
                .map(|(_, to)| to.display().to_string())
                .unwrap_or_default()
        };
        out.replace(
            "scripts/install.sh",
            &format!(
                "scripts/install.sh --no-build --bin-dir {} --daemon-bin-dir {} --systemd-dir {} \
                 --conf-dir {}",
                dir("/opt/cni/bin"),
                dir("/usr/local/bin"),
                dir("/etc/systemd/system"),
                dir("/etc/cni/net.d")
            ),
        )
    }

    /// Runs a runbook command on node `i` as written (its paths mapped): `sh -c` in the node's
    /// network namespace, in a checkout of this tree, the node's /usr/local/bin on PATH, and
    /// `systemctl` answered by the test (`daemon-reload`, `restart flanneld`), which carries
    /// out each call while the command waits for it. Whether it succeeded, and its output.
    fn on_node(&mut self, i: u8, cmd: &str) -> (bool, String) {
        let tree = fresh_tree();
        let calls = tempfile::Builder::new()
            .prefix("runbook-systemctl-")
            .tempdir()
            .unwrap();
        let shim = calls.path().join("systemctl");
        fs::write(
            &shim,
            "#!/bin/sh\nn=$(date +%s%N)\necho \"$*\" >\"$SYSTEMCTL_CALLS/$n.tmp\"\n\
             mv \"$SYSTEMCTL_CALLS/$n.tmp\" \"$SYSTEMCTL_CALLS/$n.call\"\n\
             while [ ! -e \"$SYSTEMCTL_CALLS/$n.done\" ]; do sleep 0.05; done\n\
             exit \"$(cat \"$SYSTEMCTL_CALLS/$n.done\")\"\n",
        )
        .unwrap();
        fs::set_permissions(&shim, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let path = format!(
            "{}:{}:{}",
            calls.path().display(),
            self.root(i).join("usr/local/bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mapped = self.map_paths(i, cmd);
        let mut child = self
            .c
            .node(i)
            .ns
            .command("sh")
            .args(["-c", &format!("{mapped} 2>&1")])
            .current_dir(tree.path())
            .env("PATH", path)
            .env("SYSTEMCTL_CALLS", calls.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stdout.read_to_string(&mut text);
            text
        });
        let started = std::time::Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            let mut pending: Vec<PathBuf> = fs::read_dir(calls.path())
                .unwrap()
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "call"))
                .filter(|p| !p.with_extension("done").exists())
                .collect();
            pending.sort();
            for call in pending {
                let args = fs::read_to_string(&call).unwrap();
                let code = match args.split_whitespace().collect::<Vec<_>>()[..] {
                    ["daemon-reload"] => 0,
                    ["restart", "flanneld"] | ["restart", "flanneld.service"] => {
                        self.systemctl_restart(i);
                        0
                    }
                    _ => panic!("node {i}: systemctl {args}: not what the runbook's units need"),
                };
                // Each side renames a whole file into place: a file read as it is being
                // written came back empty (a call read as `systemctl ` in a CI run).
                let written = call.with_extension("answer");
                fs::write(&written, code.to_string()).unwrap();
                fs::rename(&written, call.with_extension("done")).unwrap();
            }
            if started.elapsed() > 3 * T {
                let _ = child.kill();
                panic!("node {i}: {cmd} still runs after {:?}", 3 * T);
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        (status.success(), reader.join().unwrap_or_default())
    }

    /// Back on Go's everywhere: Go's plugins delete every pod, and nothing of ours is left.
    fn finish(&mut self) {
        assert_eq!(self.running, vec![Daemon::Go; usize::from(NODES)]);
        for i in self.nodes() {
            self.no_nexthops(i);
            for p in ["bridge", "host-local", "portmap", "loopback"] {
                let go = fs::read(Path::new(testkit::GO_PLUGIN_DIR).join(p)).unwrap();
                assert!(
                    fs::read(self.bin(i).join(p)).unwrap() == go,
                    "node {i}'s {p} is not Go's"
                );
            }
            assert!(!self.root(i).join("opt/cni/bin.go").exists());
            if self.mode == Mode::Systemd {
                let unit = fs::read_to_string(self.unit(i)).unwrap();
                assert!(unit.contains("flannel (Go)"), "node {i}'s unit:\n{unit}");
                let env = fs::read_to_string(self.env_file(i)).unwrap();
                assert!(!env.contains("NEXTHOPS"), "{env}");
            }
        }
        for p in 0..self.c.pods().len() {
            self.c
                .del_pod(p)
                .unwrap_or_else(|o| panic!("DEL of pod {p} by Go's plugins: {}", o.stdout));
        }
        for i in self.nodes() {
            let node = self.c.node(i);
            // The node's own uplink is a veth too.
            let veths: Vec<String> = node
                .ns
                .run("ip", &["-o", "link", "show", "type", "veth"])
                .lines()
                .filter_map(|l| l.split(": ").nth(1)?.split('@').next().map(str::to_string))
                .filter(|name| name != "eth0")
                .collect();
            assert!(veths.is_empty(), "node {i}: pods' veths left: {veths:?}");
            let saved: Vec<_> = fs::read_dir(node.dir.join("flannel"))
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.file_name())
                .collect();
            assert!(
                saved.is_empty(),
                "node {i}: saved delegates left: {saved:?}"
            );
            for net in fs::read_dir(node.dir.join("networks")).unwrap().flatten() {
                let left: Vec<String> = fs::read_dir(net.path())
                    .unwrap()
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| !n.starts_with("last_reserved_ip") && n != "lock")
                    .collect();
                assert!(
                    left.is_empty(),
                    "node {i}: left in {}: {left:?}",
                    net.path().display()
                );
            }
        }
    }
}

/// No process of the test left once the cluster is gone: nothing naming the nodes' roots or
/// the cluster's files (every daemon of either side names its subnet.env there).
fn assert_nothing_runs_from(dirs: &[PathBuf]) {
    let dirs: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    let left: Vec<String> = fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| dirs.iter().any(|d| c.contains(d.as_str())))
        .collect();
    assert!(left.is_empty(), "still running: {left:?}");
}

fn switch_and_back(mode: Mode, prefix: &str, net: u8, forward: &str, back: &str) {
    if !runs_here() {
        return;
    }
    let mut s = Switch::new(mode, prefix, net);
    s.run(forward);
    assert_eq!(s.running, vec![Daemon::Ours; usize::from(NODES)]);
    s.run(back);
    s.finish();
    let cluster_dir = s.c.node(1).dir.parent().map(Path::to_path_buf);
    let dirs: Vec<PathBuf> = [Some(s.roots.path().to_path_buf()), cluster_dir]
        .into_iter()
        .flatten()
        .collect();
    let Switch { c, roots, .. } = s;
    drop(c);
    assert_nothing_runs_from(&dirs);
    drop(roots);
}

#[test]
fn kube_flannel_to_ours_and_back_node_by_node() {
    switch_and_back(
        Mode::DaemonSet,
        "rbk",
        73,
        "kube-flannel to ours",
        "Back to kube-flannel",
    );
}

#[test]
fn go_s_flanneld_under_systemd_to_ours_and_back_node_by_node() {
    switch_and_back(
        Mode::Systemd,
        "rbs",
        74,
        "Go's flanneld under systemd to ours",
        "Back to Go's flanneld under systemd",
    );
}

#[test]
fn the_runbook_s_lists_parse_into_the_steps_the_suite_knows() {
    // Every list the tests above run is found, with the per-node loop where it belongs, and
    // every step but the last systemd one (a sentence) has commands to run.
    for (section, top, per_node) in [
        ("kube-flannel to ours", 4, 4),
        ("Back to kube-flannel", 3, 4),
        ("Go's flanneld under systemd to ours", 1, 4),
        ("Back to Go's flanneld under systemd", 2, 4),
    ] {
        let steps = runbook(section);
        assert_eq!(steps.len(), top, "{section}: {steps:#?}");
        let each: Vec<&Step> = steps
            .iter()
            .filter(|s| s.title == "On each node in turn:")
            .collect();
        assert_eq!(each.len(), 1, "{section}");
        assert_eq!(each[0].each_node.len(), per_node, "{section}");
        assert!(
            steps
                .iter()
                .chain(&each[0].each_node)
                .all(|s| s.title == "On each node in turn:"
                    || !s.commands().is_empty()
                    || s.title == "Remove ours."),
            "{section}: a step without a command"
        );
    }
}
