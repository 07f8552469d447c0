//! deploy/systemd's units under a real service manager. Node 1 of a testkit cluster (leases in
//! etcd, the wireguard backend) is a Debian machine booted by systemd as PID 1: the image
//! `scripts/image.sh --systemd-node` makes, run privileged by podman in node 1's network
//! namespace, the suite installed there by `scripts/install.sh --daemon` and started as
//! docs/deploying.md says; node 2 runs flanneld as the other tests do. Checked as an operator
//! would see it:
//! - flanneld.service is `Type=notify`: `systemctl enable --now` returns only once flanneld is
//!   ready, after the 10 s grace while etcd holds no network config (its status says so), and
//!   with subnet.env written when the lease is at hand;
//! - `Restart=on-failure`: after `kill -9` systemd starts it again 5 s later; meanwhile the
//!   node's routes stay and its pods' traffic goes on;
//! - `KillMode=process`: `systemctl restart` and `stop` end flanneld only, the userspace tunnel
//!   (flannel-wireguard) keeps its process and loses no echo of the pods' pings; a stop leaves
//!   the lease, the routes and the rules; the journal holds flanneld's log, the first line naming
//!   where leases live;
//! - flannel-netpol.service: without its kubeconfig it ends with status 2 and is started again
//!   until the kubeconfig is there; killed, it is restarted; a stop leaves its table.

use e2e::daemonset::{Container, Podman};
use e2e::plugins::repo_root;
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};
use testkit::cluster::{wait_for, Cluster, Family, Registry, ETCD_PREFIX};
use testkit::kube_api::{KubeApi, NETPOL_RULES};
use testkit::pings::{self, Pinger};
use testkit::{Need, TestNs};

/// The ceiling of every wait.
const T: Duration = Duration::from_secs(60);
const NETWORK_CONFIG: &str =
    r#"{"Network":"10.163.0.0/16","Backend":{"Type":"wireguard","PersistentKeepaliveInterval":0}}"#;
const SUBNET_ENV: &str = "/run/flannel/subnet.env";
/// flanneld's readiness grace (readiness::GRACE) and its unit's RestartSec.
const GRACE: Duration = Duration::from_secs(10);
const RESTART_SEC: Duration = Duration::from_secs(5);

/// The image scripts/image.sh --systemd-node tags: the release of deploy/Dockerfile.prebuilt's base.
fn node_image() -> String {
    let file = repo_root().join("deploy/Dockerfile.prebuilt");
    let text = std::fs::read_to_string(&file)
        .unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
    let release: String = text
        .lines()
        .find_map(|l| l.strip_prefix("ARG BASE=debian:"))
        .unwrap_or_else(|| panic!("no ARG BASE=debian:<release> in {}", file.display()))
        .chars()
        .take_while(char::is_ascii_lowercase)
        .collect();
    format!("localhost/flannel-cni-rs-systemd-node:{release}")
}

/// Node 1's machine: the container whose PID 1 is systemd.
struct Machine<'a> {
    container: Container<'a>,
    podman: &'a Podman,
}

impl Machine<'_> {
    fn sh(&self, script: &str) -> Output {
        self.podman
            .output(&["exec", &self.container.name, "bash", "-c", script])
    }

    /// The stdout of `script`, run as root on the machine; fails the test when it fails.
    fn ok(&self, script: &str) -> String {
        let out = self.sh(script);
        assert!(
            out.status.success(),
            "on the systemd node: {script}: {}{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.sh(
                "systemctl status --no-pager flanneld flannel-netpol; journalctl --no-pager -n 60"
            )
            .stdout
            .escape_ascii()
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// `systemctl show`'s value of `property` for `unit`.
    fn show(&self, unit: &str, property: &str) -> String {
        self.ok(&format!("systemctl show --value -p {property} {unit}"))
    }

    /// ActiveState/SubState, as `systemctl status` prints them.
    fn state(&self, unit: &str) -> String {
        format!(
            "{}/{}",
            self.show(unit, "ActiveState"),
            self.show(unit, "SubState")
        )
    }

    /// What `unit`'s own processes wrote to the journal, one message a line.
    fn journal(&self, unit: &str, command: &str) -> String {
        self.ok(&format!(
            "journalctl --no-pager -o cat _SYSTEMD_UNIT={unit}.service _COMM={command}"
        ))
    }
}

/// The pids of the processes in `ns`, as the machine sees them.
fn pids_in(ns: &str) -> Vec<u32> {
    std::process::Command::new("ip")
        .args(["netns", "pids", ns])
        .output()
        .map(|out| {
            String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The userspace tunnel's pid in `ns`, as the machine sees it (flanneld leaves it running).
fn tunnel_pid(ns: &TestNs) -> Option<u32> {
    let pids: Vec<u32> = pids_in(ns.name())
        .into_iter()
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.starts_with("flannel-wiregua"))
        })
        .collect();
    assert!(
        pids.len() <= 1,
        "more than one tunnel in {}: {pids:?}",
        ns.name()
    );
    pids.first().copied()
}

/// Ends the processes left in a node's namespace (its tunnel outlives flanneld by design).
struct EndLeftIn(String);

impl Drop for EndLeftIn {
    fn drop(&mut self) {
        for pid in pids_in(&self.0) {
            let _ = std::process::Command::new("kill")
                .arg(pid.to_string())
                .status();
        }
    }
}

/// flannel's rules in `ns`: the lines of iptables-save that name them.
fn flannel_rules(ns: &TestNs) -> Vec<String> {
    ns.run("iptables-save", &[])
        .lines()
        .filter(|l| l.contains("FLANNEL"))
        .map(str::to_string)
        .collect()
}

fn ping(c: &Cluster, from: usize, to: usize) -> Pinger {
    let (a, b) = (&c.pods()[from], &c.pods()[to]);
    let mut cmd = a.ns.command("ping");
    cmd.args(["-i", "0.05", "-W", "1", &b.ip]);
    Pinger::start(
        &format!("pod on node {} to pod on node {}", a.node, b.node),
        cmd,
    )
}

#[test]
fn flanneld_and_flannel_netpol_under_systemd_keep_what_their_units_promise() {
    let dir = tempfile::Builder::new()
        .prefix("systemd-node-")
        .tempdir()
        .unwrap();
    let podman = Podman::new(&dir.path().join("podman"));
    let image = node_image();
    let present = podman
        .command(None)
        .args(["image", "exists", &image])
        .status()
        .is_ok_and(|s| s.success());
    if !testkit::runs_here(
        present,
        Need::Installed(
            "podman and the image of a node booted by systemd (scripts/image.sh --systemd-node)",
        ),
    ) || !testkit::runs_here(
        Path::new("/dev/net/tun").exists(),
        Need::Kernel("/dev/net/tun, for the userspace WireGuard tunnel"),
    ) {
        return;
    }

    let mut c = Cluster::new("sdn", 163, 2, Registry::Etcd, NETWORK_CONFIG);
    let etcd = c.etcd_url().unwrap().to_string();
    let config_key = format!("{ETCD_PREFIX}/config");
    // The network config comes only after the first start: flanneld is ready after its grace.
    c.etcdctl(&["del", &config_key]);
    // Node 2's flanneld and tunnel with a /run/wireguard and a key of their own.
    std::fs::create_dir_all("/run/wireguard").unwrap();
    c.set_flanneld_mounts(2, "mount -t tmpfs wg /run/wireguard");
    let key2 = c.node(2).dir.join("wgkey");
    c.set_flanneld_env(2, "WIREGUARD_KEY_FILE", &key2.display().to_string());
    let _node2_tunnel = EndLeftIn(c.node(2).ns.name().to_string());

    // The API server flannel-netpol watches, and where its kubeconfig will be put.
    let kube_dir = dir.path().join("kube");
    std::fs::create_dir_all(&kube_dir).unwrap();
    let api_addr = format!("{}:6443", c.outside(Family::V4).unwrap());
    let mut api = KubeApi::start(
        Some(c.underlay.path()),
        api_addr.parse().unwrap(),
        &kube_dir,
    );
    let netpol_user = api.add_user(
        "system:serviceaccount:kube-flannel:flannel-netpol",
        Some(NETPOL_RULES),
    );
    let etc_kubernetes = dir.path().join("etc-kubernetes");
    std::fs::create_dir_all(&etc_kubernetes).unwrap();

    // The checkout as install.sh needs it, with the built binaries as its target/release.
    let tree = e2e::install::fresh_tree();
    let vol = |host: &Path, at: &str, mode: &str| format!("--volume={}:{at}{mode}", host.display());
    let kube = kube_dir.display().to_string();
    let args = [
        "--systemd=always".to_string(),
        "--privileged".to_string(),
        "--network=host".to_string(),
        vol(tree.path(), "/src", ":ro"),
        // subnet.env where the cluster's pods on node 1 read it.
        vol(&c.node(1).dir, "/run/flannel", ""),
        vol(&etc_kubernetes, "/etc/kubernetes", ""),
        // The kubeconfig names the API server's CA by this path.
        vol(&kube_dir, &kube, ":ro"),
        image,
        "/sbin/init".to_string(),
    ];
    let name = testkit::unique_name("sdn-node");
    let node = Machine {
        container: podman.run_detached(&c.node(1).ns, &name, &args),
        podman: &podman,
    };
    // Until systemd answers (its socket comes a moment after the container starts), then until
    // the boot is done.
    let booted = wait_for("systemd to boot the node", T, || {
        let out = node.sh("systemctl is-system-running --wait");
        let state = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (!state.is_empty()).then_some(state)
    });
    assert!(
        ["running", "degraded"].contains(&booted.as_str()),
        "systemd booted to {booted:?}: {}\n{}",
        node.ok("systemctl --failed --no-pager"),
        node.container.logs()
    );

    // docs/deploying.md's commands, --no-build as the binaries are built, the settings edited.
    let installed = node
        .ok("cd /src && scripts/install.sh --no-build --daemon --with-conf --bin-dir /opt/cni/bin");
    for file in [
        "/usr/local/bin/flanneld",
        "/usr/local/bin/flannel-wireguard",
        "/etc/systemd/system/flanneld.service",
        "/etc/systemd/system/flannel-netpol.service",
        "/etc/default/flanneld",
    ] {
        assert!(
            installed.contains(&format!("installed {file}")),
            "{file}: {installed}"
        );
    }
    node.ok(&format!(
        "printf 'FLANNELD_ETCD_ENDPOINTS={etcd}\\nFLANNELD_IFACE=eth0\\n' >>/etc/default/flanneld"
    ));
    let start = Instant::now();
    node.ok("systemctl daemon-reload && systemctl enable --now flanneld");
    let took = start.elapsed();
    assert!(
        took >= GRACE,
        "systemctl enable --now returned after {took:?}, before flanneld's grace: systemd did \
         not wait for READY=1"
    );
    assert_eq!(node.state("flanneld"), "active/running");
    assert_eq!(
        node.show("flanneld", "StatusText"),
        format!("waiting for etcd at {etcd}: {SUBNET_ENV} not written yet")
    );
    assert!(!c.node(1).subnet_file().exists());

    c.etcdctl(&["put", &config_key, "--", NETWORK_CONFIG]);
    c.node(1).wait_subnet_env(T);
    wait_for("flanneld's status to say subnet.env is written", T, || {
        (node.show("flanneld", "StatusText") == format!("{SUBNET_ENV} written")).then_some(())
    });
    let log = node.journal("flanneld", "flanneld");
    let first = log.lines().next().unwrap_or_default();
    assert!(
        first.contains(&format!("leases in etcd at {etcd} under {ETCD_PREFIX}")),
        "the journal's first line of flanneld names where leases live: {log}"
    );
    for line in [
        "told systemd the daemon is ready after 10 s without a lease",
        "wireguard: userspace tunnel",
        &format!("wrote {SUBNET_ENV}"),
    ] {
        assert!(log.contains(line), "{line:?} in the journal: {log}");
    }

    let flanneld = testkit::bin_dir().join("flanneld");
    c.start_flanneld(2, &flanneld, &[]);
    c.node(2).wait_subnet_env(T);
    c.add_pod(1);
    c.add_pod(2);
    c.wait_every_pod_reaches_every_other(&[Family::V4], T);
    let tunnel = tunnel_pid(&c.node(1).ns).expect("node 1's userspace tunnel");
    let routes = c.node(1).routes();
    let rules = flannel_rules(&c.node(1).ns);
    assert!(!rules.is_empty(), "flanneld's masquerade and forward rules");

    // Restart=on-failure: killed, flanneld is started again RestartSec later; the routes stay
    // meanwhile, and the tunnel carries the pods' traffic throughout.
    let main = node.show("flanneld", "MainPID");
    let mut down_for = Duration::ZERO;
    let failed = pings::across(vec![ping(&c, 1, 0), ping(&c, 0, 1)], T, || {
        let killed = Instant::now();
        node.ok(&format!("kill -9 {main}"));
        wait_for("systemd to start the killed flanneld again", T, || {
            assert_eq!(
                c.node(1).routes(),
                routes,
                "node 1's routes changed while its flanneld was down"
            );
            let pid = node.show("flanneld", "MainPID");
            if pid == "0" || pid == main {
                return None;
            }
            down_for = killed.elapsed();
            (node.show("flanneld", "NRestarts") == "1"
                && node.state("flanneld") == "active/running"
                && node.show("flanneld", "StatusText") == format!("{SUBNET_ENV} written"))
            .then_some(())
        });
    });
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    assert!(
        down_for >= RESTART_SEC,
        "started again {down_for:?} after kill -9, before RestartSec"
    );
    assert_eq!(
        tunnel_pid(&c.node(1).ns),
        Some(tunnel),
        "the tunnel after kill -9"
    );

    // KillMode=process: a restart ends flanneld only; the new one takes the tunnel over.
    let main = node.show("flanneld", "MainPID");
    let failed = pings::across(vec![ping(&c, 1, 0), ping(&c, 0, 1)], T, || {
        node.ok("systemctl restart flanneld");
    });
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    assert_ne!(node.show("flanneld", "MainPID"), main);
    assert_eq!(node.state("flanneld"), "active/running");
    assert_eq!(
        tunnel_pid(&c.node(1).ns),
        Some(tunnel),
        "the tunnel after a restart"
    );
    assert_eq!(c.node(1).routes(), routes);

    // A stop: SIGTERM to flanneld only; the lease, routes, rules and the tunnel stay.
    let lease = c.node(1).lease_key(T);
    let failed = pings::across(vec![ping(&c, 1, 0), ping(&c, 0, 1)], T, || {
        node.ok("systemctl stop flanneld");
    });
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    assert_eq!(node.state("flanneld"), "inactive/dead");
    assert_eq!(node.show("flanneld", "Result"), "success");
    assert_eq!(
        tunnel_pid(&c.node(1).ns),
        Some(tunnel),
        "the tunnel after a stop"
    );
    assert_eq!(c.node(1).routes(), routes);
    assert_eq!(flannel_rules(&c.node(1).ns), rules);
    assert!(
        c.lease_keys().iter().any(|k| k.ends_with(&lease)),
        "node 1's lease {lease} in etcd after the stop: {:?}",
        c.lease_keys()
    );
    let log = node.journal("flanneld", "flanneld");
    assert!(
        log.contains("SIGTERM: stopping; the lease and the datapath stay in place"),
        "{log}"
    );
    // READY=1 waits for subnet.env when the lease is at hand: it exists when start returns.
    std::fs::remove_file(c.node(1).subnet_file()).unwrap();
    node.ok("systemctl start flanneld");
    assert!(
        c.node(1).subnet_file().exists(),
        "systemctl start returned before {SUBNET_ENV} was written"
    );
    assert_eq!(
        node.show("flanneld", "StatusText"),
        format!("{SUBNET_ENV} written")
    );
    assert_eq!(
        tunnel_pid(&c.node(1).ns),
        Some(tunnel),
        "the tunnel after a start"
    );

    // flannel-netpol: status 2 without its kubeconfig, retried until it is there.
    node.ok("systemctl enable --now flannel-netpol");
    wait_for(
        "flannel-netpol, without its kubeconfig, to end with status 2 and be started again",
        T,
        || (node.show("flannel-netpol", "NRestarts") != "0").then_some(()),
    );
    let log = node.ok("journalctl --no-pager -o cat -u flannel-netpol");
    assert!(
        log.contains("status=2/INVALIDARGUMENT"),
        "flannel-netpol's exit: {log}"
    );
    std::fs::copy(
        &netpol_user.kubeconfig,
        etc_kubernetes.join("flannel-netpol.kubeconfig"),
    )
    .unwrap();
    let table = |ns: &TestNs| {
        ns.try_run("nft", &["list", "table", "inet", "flannel-netpol"])
            .status
            .success()
    };
    wait_for(
        "flannel-netpol to enforce once its kubeconfig is there",
        T,
        || {
            (table(&c.node(1).ns)
                && node
                    .journal("flannel-netpol", "flannel-netpol")
                    .contains("the cluster is known"))
            .then_some(())
        },
    );
    let restarts: u32 = node.show("flannel-netpol", "NRestarts").parse().unwrap();
    let main = node.show("flannel-netpol", "MainPID");
    node.ok(&format!("kill -9 {main}"));
    wait_for(
        "systemd to start the killed flannel-netpol again",
        T,
        || {
            let pid = node.show("flannel-netpol", "MainPID");
            (pid != "0"
                && pid != main
                && node.show("flannel-netpol", "NRestarts") == (restarts + 1).to_string()
                && node.state("flannel-netpol") == "active/running")
                .then_some(())
        },
    );
    node.ok("systemctl stop flannel-netpol");
    assert_eq!(node.state("flannel-netpol"), "inactive/dead");
    assert!(
        table(&c.node(1).ns),
        "table inet flannel-netpol after flannel-netpol's stop"
    );
}
