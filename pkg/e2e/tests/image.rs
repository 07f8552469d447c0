//! The container image (scripts/image.sh) run as deploy/kubernetes's DaemonSets run it, by podman
//! on the nodes of a testkit cluster: the init step installs the plugins onto a throwaway host
//! root; flanneld runs in the node's network with NET_ADMIN and NET_RAW only, its command,
//! arguments, environment and mounts the manifest's, against the Kubernetes API stand-in (its
//! service account's token mounted as the kubelet mounts it) and against etcd; pods made with
//! the plugins the image installed reach each other across the nodes; `podman stop` ends
//! flanneld with SIGTERM and leaves the datapath in place. With the wireguard backend, flanneld
//! starts the image's userspace tunnel through the DaemonSet's /dev/net/tun.
//!
//! The image must be the one of this commit (tagged flannel-cni-rs:<version>-<commit>, as
//! scripts/image.sh tags it): elsewhere the tests are skipped and listed, in CI they fail.

use e2e::daemonset::{probe_url, Container, Manifest, Pod, Podman};
use e2e::plugins::{repo_root, PLUGINS};
use serde_json::Value;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use testkit::cluster::{kube_node_name, subnet_key, wait_for, Cluster, Family, Node, Registry};
use testkit::{Need, TestNs};

const KUBE_MODE: &str = "flanneld-kube.yml";
const ETCD_MODE: &str = "flanneld.yml";
/// How long a container may take to start and flanneld to take its lease.
const T: Duration = Duration::from_secs(60);
const P: &str = "flannel.alpha.coreos.com/";
/// Linux's capability numbers the test looks for in the daemon's effective set.
const CAP_NET_ADMIN: u32 = 12;
const CAP_NET_RAW: u32 = 13;
const CAP_SYS_ADMIN: u32 = 21;

fn git(args: &[&str]) -> Option<std::process::Output> {
    Command::new("git")
        .arg("-C")
        .arg(repo_root())
        .args(args)
        .output()
        .ok()
}

/// This checkout's revision as scripts/image.sh and flanneld --version write it: the commit's
/// first 12 hex digits, `-dirty` after them when `git diff --quiet HEAD` finds changes.
fn revision() -> Option<String> {
    let head = git(&["rev-parse", "HEAD"]).filter(|o| o.status.success())?;
    let head = String::from_utf8_lossy(&head.stdout).trim().to_string();
    let dirty = git(&["diff", "--quiet", "HEAD"]).is_some_and(|o| o.status.code() == Some(1));
    Some(format!(
        "{}{}",
        head.get(..12)?,
        if dirty { "-dirty" } else { "" }
    ))
}

/// A test's directory, its podman, and the image of this commit; None (the test skipped) where
/// the image has not been built.
fn setup(prefix: &str) -> Option<(tempfile::TempDir, Podman, String)> {
    let dir = tempfile::Builder::new().prefix(prefix).tempdir().unwrap();
    let podman = Podman::new(&dir.path().join("podman"));
    let image =
        revision().map(|r| format!("localhost/flannel-cni-rs:{}-{r}", env!("CARGO_PKG_VERSION")));
    let present = image.as_ref().is_some_and(|i| {
        podman
            .command(None)
            .args(["image", "exists", i])
            .status()
            .is_ok_and(|s| s.success())
    });
    if !testkit::runs_here(
        present,
        Need::Installed(
            "podman and the image of this commit, localhost/flannel-cni-rs:<version>-<commit> \
             (scripts/image.sh builds it)",
        ),
    ) {
        return None;
    }
    Some((dir, podman, image.unwrap()))
}

/// The image the manifest's containers name is this commit's: the tag the DaemonSet runs
/// resolves to the same image, and the image says which commit it was built from.
fn assert_manifest_runs(podman: &Podman, manifest: &Manifest, image: &str) {
    let id = |name: &str| podman.ok(&["image", "inspect", "--format", "{{.Id}}", name]);
    for name in ["install-cni", "flanneld"] {
        let named = manifest.container(name)["image"]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(
            id(&named),
            id(image),
            "{}'s {name} runs {named}, which is not {image}",
            manifest.file
        );
    }
    let label = podman.ok(&[
        "image",
        "inspect",
        "--format",
        "{{index .Labels \"org.opencontainers.image.revision\"}}",
        image,
    ]);
    assert!(
        image.ends_with(&format!("-{label}")),
        "{image} is labelled revision {label:?}"
    );
}

fn names_under(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let path = e.path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                let rel = path.strip_prefix(root).unwrap();
                out.push(rel.display().to_string());
            }
        }
    }
    out.sort();
    out
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// A node's host root, where the init step puts the plugins and the conflist.
struct HostRoot(PathBuf);

impl HostRoot {
    /// The host roots of the cluster's two nodes, under `dir`.
    fn two(dir: &Path) -> Vec<HostRoot> {
        (1..=2)
            .map(|i| HostRoot(dir.join(format!("node{i}"))))
            .collect()
    }
    fn bin(&self) -> PathBuf {
        self.0.join("opt/cni/bin")
    }
    fn conf(&self) -> PathBuf {
        self.0.join("etc/cni/net.d")
    }
}

/// Node `i`'s flanneld pod as the DaemonSet mounts the host into it.
fn flanneld_pod<'m>(manifest: &'m Manifest, c: &Cluster, i: u8, root: &HostRoot) -> Pod<'m> {
    Pod::new(manifest, &kube_node_name(i), &root.0)
        .host_path("/run/flannel", &c.node(i).dir)
        .host_path("/run/xtables.lock", Path::new("/run/xtables.lock"))
        .host_path("/opt/cni/bin", &root.bin())
        .host_path("/etc/cni/net.d", &root.conf())
}

/// The service account's files as the kubelet mounts them into every container of the pod:
/// `token` the account's, in `dir`.
fn service_account(dir: &Path, token: &str, ca: &[u8], namespace: &str) -> PathBuf {
    let sa = dir.join("serviceaccount");
    std::fs::create_dir_all(&sa).unwrap();
    std::fs::write(sa.join("token"), token).unwrap();
    std::fs::write(sa.join("ca.crt"), ca).unwrap();
    std::fs::write(sa.join("namespace"), namespace).unwrap();
    sa
}

/// Runs the DaemonSet's init container from the image in `ns` with `root` as the host's root
/// (and the pod's service account, where the manifest gives it one), failing the test when it
/// fails.
fn run_init(
    podman: &Podman,
    manifest: &Manifest,
    ns: &TestNs,
    node: &str,
    root: &HostRoot,
    account: Option<(&Path, SocketAddr)>,
) {
    let mut pod = Pod::new(manifest, node, &root.0.with_extension("pod"))
        .host_path("/opt/cni/bin", &root.bin())
        .host_path("/etc/cni/net.d", &root.conf());
    if let Some((dir, api)) = account {
        pod = pod.service_account(dir, api);
    }
    let name = testkit::unique_name("img-init");
    let out = podman
        .command(Some(ns))
        .args(["run", "--rm", "--name", &name])
        .args(pod.podman_args("install-cni"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}'s install-cni from the image: {}{}",
        manifest.file,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_init_step_from_the_image_leaves_the_five_plugins_and_the_conflist_on_the_host() {
    let Some((dir, podman, image)) = setup("e2e-image-init-") else {
        return;
    };
    for file in [KUBE_MODE, ETCD_MODE] {
        let manifest = Manifest::read(file);
        assert_manifest_runs(&podman, &manifest, &image);
        // The pod's host network: a namespace of the test's own, as a node's.
        let ns = TestNs::new("imgi");
        let root = HostRoot(dir.path().join(file).join("host"));
        // A kube-mode pod has its service account's token in every container; the init step
        // never calls the API, so no server is behind this one.
        let sa = service_account(&dir.path().join(file), "unused", b"", manifest.namespace());
        let api: SocketAddr = "127.0.0.1:6443".parse().unwrap();
        run_init(&podman, &manifest, &ns, "node1", &root, Some((&sa, api)));

        let mut want: Vec<String> = PLUGINS.iter().map(|p| format!("opt/cni/bin/{p}")).collect();
        want.push("etc/cni/net.d/10-flannel.conflist".into());
        want.sort();
        assert_eq!(
            names_under(&root.0),
            want,
            "{file}: exactly these on the host"
        );
        for p in PLUGINS {
            assert_eq!(mode(&root.bin().join(p)), 0o755, "{file}: {p}'s mode");
        }
        let conflist = root.conf().join("10-flannel.conflist");
        assert_eq!(mode(&conflist), 0o644);
        let installed: Value =
            serde_json::from_str(&std::fs::read_to_string(&conflist).unwrap()).unwrap();
        let configured: Value =
            serde_json::from_str(&manifest.config_value("flanneld-cfg", "cni-conf.json")).unwrap();
        assert_eq!(installed, configured, "{file}: the ConfigMap's conflist");
        // The image's flanneld was built from the commit its tag and label name.
        let version = podman.ok(&[
            "run",
            "--rm",
            "--network=none",
            "--entrypoint=/usr/local/bin/flanneld",
            &image,
            "--version",
        ]);
        let commit = image.rsplit(':').next().unwrap()[env!("CARGO_PKG_VERSION").len() + 1..]
            .trim_end_matches("-dirty")
            .to_string();
        assert!(
            version.starts_with(&format!("flanneld {}-{commit}", env!("CARGO_PKG_VERSION"))),
            "{image}'s flanneld --version: {version}"
        );
        // The plugins run on the host, outside the image: a runtime's VERSION call answers.
        for p in PLUGINS {
            let out = Command::new(root.bin().join(p))
                .env_clear()
                .env("CNI_COMMAND", "VERSION")
                .output()
                .unwrap();
            let answer: Value = serde_json::from_slice(&out.stdout)
                .unwrap_or_else(|e| panic!("{file}: {p} VERSION: {e}"));
            assert!(answer["supportedVersions"].is_array(), "{p}: {answer}");
        }
    }
}

/// Node `node`'s flanneld started from the image as `manifest`'s DaemonSet starts it.
fn start_flanneld<'p>(podman: &'p Podman, pod: Pod<'_>, node: &Node, what: &str) -> Container<'p> {
    let name = testkit::unique_name(&format!("img-{what}-n{}", node.index));
    podman.run_detached(&node.ns, &name, &pod.podman_args("flanneld"))
}

/// Waits for node `node`'s subnet.env, written by the flanneld in `container`.
fn wait_subnet_env(node: &Node, container: &Container) {
    let file = node.subnet_file();
    let start = std::time::Instant::now();
    while start.elapsed() < T {
        if std::fs::read_to_string(&file).is_ok_and(|t| t.contains("FLANNEL_SUBNET=")) {
            return;
        }
        if !container.running() {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!(
        "no {1} from node {0}'s flanneld within {T:?} (container {2} running: {3}); its log:\n{4}",
        node.index,
        file.display(),
        container.name,
        container.running(),
        container.logs()
    );
}

/// The probes of the manifest's flanneld answer 200 on `node`.
fn assert_probes_pass(manifest: &Manifest, node: &Node, container: &Container) {
    let c = manifest.container("flanneld");
    for p in ["livenessProbe", "readinessProbe"] {
        let url = probe_url(c, p);
        wait_for(
            &format!("node {}'s {p} at {url} to answer 200", node.index),
            T,
            || (node.ns.http_status(&url) == "200").then_some(()),
        );
    }
    assert!(container.running());
}

/// The daemon runs without privilege, with the two network capabilities and not CAP_SYS_ADMIN,
/// as the DaemonSet's securityContext asks.
fn assert_unprivileged(container: &Container) {
    assert_eq!(container.inspect("{{.HostConfig.Privileged}}"), "false");
    let status = std::fs::read_to_string(format!("/proc/{}/status", container.pid())).unwrap();
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .expect("CapEff in the daemon's status");
    for (cap, name, want) in [
        (CAP_NET_ADMIN, "NET_ADMIN", true),
        (CAP_NET_RAW, "NET_RAW", true),
        (CAP_SYS_ADMIN, "SYS_ADMIN", false),
    ] {
        assert_eq!(eff & (1 << cap) != 0, want, "{name} in CapEff {eff:x}");
    }
}

/// Node `from` has node `to`'s subnet routed over vxlan, through `to`'s address.
fn assert_programmed(c: &Cluster, from: u8, to: u8) {
    let subnet = c.node(to).subnet(Family::V4, T).unwrap();
    let ip = c.node(to).ip.clone();
    wait_for(
        &format!("node {from}'s route to node {to}'s {subnet} and its FDB entry"),
        T,
        || {
            let routed = c
                .node(from)
                .routes_to(Family::V4, &subnet)
                .iter()
                .any(|r| r["dev"] == "flannel.1");
            (routed && c.node(from).fdb().contains(&format!("dst {ip} "))).then_some(())
        },
    );
}

/// Every pod reaches every other, the containers' logs shown when not.
fn assert_pods_talk(c: &Cluster, containers: &[Container]) {
    let lost = c.unreachable_pairs(2);
    if lost.is_empty() {
        return;
    }
    // One more round: a first packet can wait on a neighbour's resolution.
    let lost = c.unreachable_pairs(2);
    assert!(
        lost.is_empty(),
        "{}\n{}\nthe daemons' logs:\n{}",
        c.describe_pairs(&lost),
        c.describe(),
        containers
            .iter()
            .map(|k| format!("{}:\n{}", k.name, k.logs()))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

fn node_obj(c: &Cluster, i: u8) -> Value {
    c.kube()
        .node(&kube_node_name(i))
        .unwrap_or_else(|| panic!("no Node for node {i}"))
}

#[test]
fn flanneld_from_the_image_in_kube_mode_as_its_daemonset_runs_it() {
    let Some((dir, podman, image)) = setup("e2e-image-kube-") else {
        return;
    };
    let manifest = Manifest::read(KUBE_MODE);
    assert_manifest_runs(&podman, &manifest, &image);
    // The cluster's network is the manifest's net-conf.json; its nodes' podCIDRs are in it.
    let net_conf = manifest.config_value("flanneld-cfg", "net-conf.json");
    let roots = HostRoot::two(dir.path());
    let mut c = Cluster::new("imk", 61, 2, Registry::Kube, &net_conf);
    // Each node's pod has a service account token of its own, as the kubelet mounts it.
    let accounts: Vec<PathBuf> = (1..=2)
        .zip(&roots)
        .map(|(i, root)| {
            let token = &c.node(i).kube_user().unwrap().token;
            let ca = std::fs::read(c.kube().ca_file()).unwrap();
            service_account(&root.0, token, &ca, manifest.namespace())
        })
        .collect();
    let api = c.kube().addr();
    for ((i, root), sa) in (1..=2).zip(&roots).zip(&accounts) {
        let account = Some((sa.as_path(), api));
        run_init(
            &podman,
            &manifest,
            &c.node(i).ns,
            &kube_node_name(i),
            root,
            account,
        );
    }
    // Pods are made by the plugins the image put on the host.
    c = c.plugins_from(&roots[0].bin());

    let mut containers = Vec::new();
    for ((i, root), sa) in (1..=2).zip(&roots).zip(&accounts) {
        let pod = flanneld_pod(&manifest, &c, i, root).service_account(sa, api);
        containers.push(start_flanneld(&podman, pod, c.node(i), "kube"));
    }

    for (i, k) in (1..=2).zip(&containers) {
        let node = c.node(i);
        wait_subnet_env(node, k);
        // Its lease is its podCIDR, its annotations say how to reach it, its condition is up.
        let obj = node_obj(&c, i);
        let cidr = obj["spec"]["podCIDR"].as_str().unwrap();
        assert_eq!(node.lease_key(T), subnet_key(cidr), "node {i}'s lease");
        let mac = node
            .ns
            .link("flannel.1")
            .and_then(|l| l["address"].as_str().map(str::to_string))
            .unwrap_or_else(|| panic!("no flannel.1 on node {i}:\n{}", k.logs()));
        wait_for(&format!("node {i}'s annotations"), T, || {
            let a = &node_obj(&c, i)["metadata"]["annotations"];
            (a[format!("{P}public-ip")] == node.ip.as_str()).then_some(())
        });
        let a = &node_obj(&c, i)["metadata"]["annotations"];
        assert_eq!(a[format!("{P}backend-type")], "vxlan");
        assert_eq!(a[format!("{P}kube-subnet-manager")], "true");
        let data: Value =
            serde_json::from_str(a[format!("{P}backend-data")].as_str().unwrap()).unwrap();
        assert_eq!(data["VtepMAC"], mac.as_str(), "node {i}'s backend-data");
        wait_for(&format!("node {i}'s NetworkUnavailable False"), T, || {
            node_obj(&c, i)["status"]["conditions"]
                .as_array()?
                .iter()
                .any(|c| c["type"] == "NetworkUnavailable" && c["status"] == "False")
                .then_some(())
        });
        // It found the API server and its identity through the mounted service account.
        let user = node.kube_user().unwrap().name.clone();
        assert!(
            c.kube()
                .requests()
                .iter()
                .any(|r| r.user == user && r.verb == "watch" && r.code < 300),
            "node {i}'s flanneld never watched the nodes as {user}"
        );
        assert_probes_pass(&manifest, node, k);
        assert_unprivileged(k);
    }
    assert_programmed(&c, 1, 2);
    assert_programmed(&c, 2, 1);
    c.add_pod(1);
    c.add_pod(2);
    assert_pods_talk(&c, &containers);

    // podman stop: SIGTERM, as the kubelet stops a pod. flanneld exits cleanly and leaves the
    // datapath as it is, so that pods keep talking while it restarts.
    let stopped = &containers[0];
    let before = c.node(1).routes();
    podman.ok(&["stop", "--time", "30", &stopped.name]);
    assert_eq!(
        stopped.inspect("{{.State.ExitCode}}"),
        "0",
        "flanneld's exit on SIGTERM:\n{}",
        stopped.logs()
    );
    assert!(c.node(1).ns.link("flannel.1").is_some(), "flannel.1 went");
    assert_eq!(c.node(1).routes(), before, "node 1's routes changed");
    assert!(c.node(1).subnet_file().exists(), "subnet.env went");
    assert_pods_talk(&c, &containers);

    let names: Vec<String> = containers.iter().map(|k| k.name.clone()).collect();
    drop(containers);
    for name in names {
        let left = podman.ok(&[
            "ps",
            "--all",
            "--quiet",
            "--filter",
            &format!("name=^{name}$"),
        ]);
        assert_eq!(left, "", "container {name} left behind");
    }
}

/// Two nodes whose leases live in etcd (which holds `net_conf`, as an operator puts it there),
/// each after the image's init step, running flanneld from the image as the etcd-mode DaemonSet
/// runs it; `what` names their containers in failures.
fn etcd_nodes_from_the_image<'p>(
    podman: &'p Podman,
    manifest: &Manifest,
    dir: &Path,
    (prefix, net): (&str, u8),
    net_conf: &str,
    what: &str,
) -> (Cluster, Vec<Container<'p>>) {
    let roots = HostRoot::two(dir);
    let mut c = Cluster::new(prefix, net, 2, Registry::Etcd, net_conf);
    for (i, root) in (1..=2).zip(&roots) {
        run_init(
            podman,
            manifest,
            &c.node(i).ns,
            &kube_node_name(i),
            root,
            None,
        );
    }
    c = c.plugins_from(&roots[0].bin());
    let etcd = c.etcd_url().unwrap().to_string();
    let containers = (1..=2)
        .zip(&roots)
        .map(|(i, root)| {
            let pod = flanneld_pod(manifest, &c, i, root)
                .config_value("flanneld-etcd", "FLANNELD_ETCD_ENDPOINTS", &etcd)
                .config_value("flanneld-cfg", "net-conf.json", net_conf);
            start_flanneld(podman, pod, c.node(i), what)
        })
        .collect();
    (c, containers)
}

/// Node `i`'s lease as etcd holds it: parsed, and as written.
fn lease_in_etcd(c: &Cluster, i: u8) -> (Value, String) {
    let key = c.node(i).lease_key(T);
    let value = c.etcdctl(&[
        "get",
        "--print-value-only",
        &format!("{}/subnets/{key}", testkit::cluster::ETCD_PREFIX),
    ]);
    let lease = serde_json::from_str(value.trim())
        .unwrap_or_else(|e| panic!("node {i}'s lease {key} in etcd: {e}: {value:?}"));
    (lease, value)
}

#[test]
fn flanneld_from_the_image_with_leases_in_etcd_as_its_daemonset_runs_it() {
    let Some((dir, podman, image)) = setup("e2e-image-etcd-") else {
        return;
    };
    let manifest = Manifest::read(ETCD_MODE);
    assert_manifest_runs(&podman, &manifest, &image);
    let net_conf = manifest.config_value("flanneld-cfg", "net-conf.json");
    let (mut c, containers) = etcd_nodes_from_the_image(
        &podman,
        &manifest,
        dir.path(),
        ("ime", 62),
        &net_conf,
        "etcd",
    );
    for (i, k) in (1..=2).zip(&containers) {
        let node = c.node(i);
        wait_subnet_env(node, k);
        let (lease, _) = lease_in_etcd(&c, i);
        assert_eq!(lease["PublicIP"], node.ip.as_str(), "node {i}'s lease");
        assert_eq!(lease["BackendType"], "vxlan");
        assert_probes_pass(&manifest, node, k);
        assert_unprivileged(k);
    }
    assert_programmed(&c, 1, 2);
    assert_programmed(&c, 2, 1);
    c.add_pod(1);
    c.add_pod(2);
    assert_pods_talk(&c, &containers);
}

/// The process of node `node` whose name is the userspace tunnel's, if one runs there.
fn tunnel_of(node: &Node) -> Option<u32> {
    let out = Command::new("ip")
        .args(["netns", "pids", node.ns.name()])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .find(|pid: &u32| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.starts_with("flannel-wiregua"))
        })
}

fn mount_ns(pid: u32) -> String {
    std::fs::read_link(format!("/proc/{pid}/ns/mnt"))
        .map(|l| l.display().to_string())
        .unwrap_or_default()
}

/// The wireguard backend from the image, leases in etcd: flanneld starts the userspace tunnel
/// the image holds (this kernel has no WireGuard) through the DaemonSet's /dev/net/tun, with no
/// privilege beyond the manifest's; each lease announces the node's key and port; pods talk
/// across the tunnel.
#[test]
fn flanneld_from_the_image_runs_the_wireguard_backend_s_tunnel() {
    let Some((dir, podman, image)) = setup("e2e-image-wg-") else {
        return;
    };
    let manifest = Manifest::read(ETCD_MODE);
    assert_manifest_runs(&podman, &manifest, &image);
    let mut conf: Value =
        serde_json::from_str(&manifest.config_value("flanneld-cfg", "net-conf.json")).unwrap();
    conf["Backend"] = serde_json::json!({ "Type": "wireguard" });
    let net_conf = conf.to_string();
    let (mut c, containers) =
        etcd_nodes_from_the_image(&podman, &manifest, dir.path(), ("imw", 63), &net_conf, "wg");
    let network = conf["Network"].as_str().unwrap().to_string();
    for (i, k) in (1..=2).zip(&containers) {
        let node = c.node(i);
        wait_subnet_env(node, k);
        let (lease, value) = lease_in_etcd(&c, i);
        assert_eq!(lease["BackendType"], "wireguard", "{value}");
        assert_eq!(lease["BackendData"]["Port"], 51820, "{value}");
        assert_eq!(
            lease["BackendData"]["PublicKey"].as_str().map(str::len),
            Some(44),
            "{value}"
        );
        let link = node
            .ns
            .link("flannel-wg")
            .unwrap_or_else(|| panic!("no flannel-wg on node {i}:\n{}", k.logs()));
        assert_eq!(link["linkinfo"]["info_kind"], "tun", "{link}");
        assert_eq!(link["mtu"], 1420, "{link}");
        let tunnel = tunnel_of(node)
            .unwrap_or_else(|| panic!("no tunnel process on node {i}:\n{}", k.logs()));
        assert_eq!(
            mount_ns(tunnel),
            mount_ns(k.pid()),
            "node {i}'s tunnel is not the one in flanneld's container"
        );
        wait_for(&format!("node {i}'s route to {network}"), T, || {
            node.routes_to(Family::V4, &network)
                .iter()
                .any(|r| r["dev"] == "flannel-wg")
                .then_some(())
        });
        assert_probes_pass(&manifest, node, k);
        assert_unprivileged(k);
    }
    c.add_pod(1);
    c.add_pod(2);
    assert_pods_talk(&c, &containers);
}
