//! flanneld under systemd on a node whose registry kubelet starts (a control-plane node: the API
//! server or etcd as a static pod). Two things keep such a node's start from hanging, each
//! tested here: deploy/systemd/flanneld.service orders nothing that kubelet needs after
//! flanneld (systemd-analyze finds no ordering cycle with a kubelet/containerd pair even when
//! flanneld's start waits for the static pods, and finds one with the old ordering), and
//! flanneld's READY=1 never waits for the registry (the real daemon, registry down at start:
//! ready after the grace, then its status says when subnet.env is written).

mod common;

use common::*;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use testkit::cluster::{Cluster, Registry};

const T: Duration = Duration::from_secs(30);
/// flanneld's grace (readiness::GRACE) and a margin for a loaded machine.
const READY_WITHIN: Duration = Duration::from_secs(10 + 20);

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A unit directory: the repository's flanneld.service (its ExecStart the built daemon, as
/// install.sh rewrites it), an environment file, and the fake units of a kubeadm node.
fn units(dir: &Path) {
    let env = dir.join("flanneld.env");
    std::fs::write(&env, "FLANNELD_ETCD_ENDPOINTS=http://127.0.0.1:2379\n").unwrap();
    let unit = std::fs::read_to_string(repo_root().join("deploy/systemd/flanneld.service"))
        .unwrap()
        .replace(
            "ExecStart=/usr/local/bin/flanneld",
            &format!("ExecStart={FLANNELD}"),
        )
        .replace(
            "EnvironmentFile=/etc/default/flanneld",
            &format!("EnvironmentFile={}", env.display()),
        );
    std::fs::write(dir.join("flanneld.service"), unit).unwrap();
    for (name, text) in [
        (
            "containerd.service",
            "[Unit]\nAfter=network.target local-fs.target\n\
             [Service]\nType=notify\nExecStart=/bin/sleep infinity\n",
        ),
        (
            "kubelet.service",
            "[Unit]\nWants=network-online.target containerd.service\n\
             After=network-online.target containerd.service\n\
             [Service]\nExecStart=/bin/sleep infinity\n",
        ),
        // What kubelet starts from /etc/kubernetes/manifests: the API server, etcd.
        (
            "static-pods.service",
            "[Unit]\nRequires=kubelet.service\nAfter=kubelet.service\n\
             [Service]\nExecStart=/bin/sleep infinity\n",
        ),
    ] {
        std::fs::write(dir.join(name), text).unwrap();
    }
    // The worst case for the ordering: flanneld's start counted done only once its registry,
    // a static pod, runs (as with a READY that waits for subnet.env).
    let dropins = dir.join("flanneld.service.d");
    std::fs::create_dir_all(&dropins).unwrap();
    std::fs::write(
        dropins.join("registry.conf"),
        "[Unit]\nWants=static-pods.service\nAfter=static-pods.service\n",
    )
    .unwrap();
}

fn verify(dir: &Path) -> (bool, String) {
    let names: Vec<PathBuf> = [
        "flanneld.service",
        "kubelet.service",
        "containerd.service",
        "static-pods.service",
    ]
    .iter()
    .map(|n| dir.join(n))
    .collect();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .args(&names)
        // The directory first, then systemd's own (network-online.target, ...).
        .env("SYSTEMD_UNIT_PATH", format!("{}:", dir.display()))
        .output()
        .expect("systemd-analyze (Debian's systemd, scripts/deps.sh installs it)");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_unit_orders_nothing_kubelet_needs_after_flanneld_even_if_flanneld_waited_for_static_pods() {
    if !testkit::runs_here(
        Path::new("/usr/bin/systemd-analyze").exists(),
        testkit::Need::Installed("systemd-analyze (Debian's systemd)"),
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    units(dir.path());
    let (ok, stderr) = verify(dir.path());
    assert!(
        ok && !stderr.contains("cycle"),
        "systemd-analyze verify with a kubelet/containerd pair:\n{stderr}"
    );
    // The check can fail: the old unit's ordering, Before=kubelet, closes the loop.
    std::fs::write(
        dir.path().join("flanneld.service.d/old-order.conf"),
        "[Unit]\nBefore=containerd.service crio.service kubelet.service\n",
    )
    .unwrap();
    let (ok, stderr) = verify(dir.path());
    assert!(
        !ok && stderr.contains("ordering cycle"),
        "with Before=kubelet.service systemd-analyze should find the cycle:\n{stderr}"
    );
}

/// A datagram socket standing for systemd's `$NOTIFY_SOCKET`.
struct Systemd {
    sock: UnixDatagram,
    path: PathBuf,
}

impl Systemd {
    fn new(dir: &Path) -> Systemd {
        let path = dir.join("notify.sock");
        let sock = UnixDatagram::bind(&path).unwrap();
        Systemd { sock, path }
    }

    /// The next message, within `within`; panics saying what was awaited.
    fn next(&self, what: &str, within: Duration) -> String {
        self.sock.set_read_timeout(Some(within)).unwrap();
        let mut buf = [0u8; 512];
        let n = self
            .sock
            .recv(&mut buf)
            .unwrap_or_else(|e| panic!("no {what} on the notify socket within {within:?}: {e}"));
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }
}

#[test]
fn with_etcd_down_at_start_ready_comes_after_the_grace_and_the_status_follows_the_lease() {
    let node = Node::new("sde");
    let systemd = Systemd::new(node.dir.path());
    let start = Instant::now();
    let a = Daemon::start(
        &node,
        "a",
        &[
            "--etcd-endpoints",
            "http://127.0.0.1:2379",
            "--iface",
            "eth0",
        ],
        &[("NOTIFY_SOCKET", systemd.path.to_str().unwrap())],
    );
    let ready = systemd.next("READY=1", READY_WITHIN);
    assert!(
        start.elapsed() >= Duration::from_secs(10),
        "ready before the grace, with nothing written: {ready}"
    );
    let subnet_file = a.subnet_file.display().to_string();
    assert_eq!(
        ready,
        format!(
            "READY=1\nSTATUS=waiting for etcd at http://127.0.0.1:2379: {subnet_file} not written yet"
        )
    );
    assert!(!a.subnet_file.exists());
    let etcd = Etcd::start(&node);
    etcd.put(
        &node,
        &format!("{PREFIX}/config"),
        r#"{"Network":"10.8.0.0/16","Backend":{"Type":"alloc"}}"#,
    );
    let status = systemd.next("the status once subnet.env is written", T);
    assert_eq!(status, format!("STATUS={subnet_file} written"));
    a.subnet(T);
}

#[test]
fn with_the_api_server_down_at_start_ready_comes_after_the_grace_and_the_status_follows_the_lease()
{
    let mut c = Cluster::new(
        "sdk",
        62,
        1,
        Registry::Kube,
        r#"{"Network":"10.62.0.0/16","Backend":{"Type":"vxlan"}}"#,
    );
    let dir = tempfile::tempdir().unwrap();
    let systemd = Systemd::new(dir.path());
    // The API server is a static pod kubelet has not started yet.
    c.kube_mut().stop();
    c.set_flanneld_wrapper(
        1,
        &["env", &format!("NOTIFY_SOCKET={}", systemd.path.display())],
    );
    c.start_flanneld(1, Path::new(FLANNELD), &[]);
    let ready = systemd.next("READY=1", READY_WITHIN);
    let subnet_file = c.node(1).subnet_file().display().to_string();
    assert_eq!(
        ready,
        format!(
            "READY=1\nSTATUS=waiting for the Kubernetes API (this node's Node and its podCIDR): \
             {subnet_file} not written yet"
        )
    );
    assert!(c.flanneld_running(1));
    c.kube_mut().resume();
    let status = systemd.next("the status once subnet.env is written", T + T);
    assert_eq!(status, format!("STATUS={subnet_file} written"));
    c.node(1).wait_subnet_env(T);
}
