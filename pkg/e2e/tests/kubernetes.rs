//! deploy/kubernetes/flanneld.yml (leases in etcd) and flanneld-kube.yml (leases in the
//! Kubernetes API), checked as Kubernetes would read them (no cluster and no registry here):
//! their objects and the DaemonSet's pod, the kube mode's RBAC against what the daemon's tests
//! prove it needs, the images and paths they name against what deploy/Dockerfile builds, and
//! the init container's step (deploy/cni-install.sh) run for real against a throwaway root; and
//! netpol.yml, flannel-netpol's DaemonSet, its RBAC against what the enforcer's tests give it.

use e2e::plugins::{repo_root, PLUGINS};
use serde_json::Value;
use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The image deploy/Dockerfile's header tells to build: the workspace version as the tag.
fn image() -> String {
    format!("flannel-cni-rs:{}", env!("CARGO_PKG_VERSION"))
}

/// The etcd-mode manifest and the kube-mode one.
const ETCD_MODE: &str = "flanneld.yml";
const KUBE_MODE: &str = "flanneld-kube.yml";
const MANIFESTS: [&str; 2] = [ETCD_MODE, KUBE_MODE];

fn manifest() -> Vec<Value> {
    manifest_at(ETCD_MODE)
}

fn manifest_at(file: &str) -> Vec<Value> {
    let path = repo_root().join("deploy/kubernetes").join(file);
    let text = fs::read_to_string(&path).unwrap();
    serde_norway::Deserializer::from_str(&text)
        .map(|doc| {
            serde::Deserialize::deserialize(doc)
                .unwrap_or_else(|e| panic!("{}: not YAML: {e}", path.display()))
        })
        .filter(|doc: &Value| !doc.is_null())
        .collect()
}

fn object<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in the manifest"))
}

fn daemonset(docs: &[Value]) -> &Value {
    let sets: Vec<&Value> = docs.iter().filter(|d| d["kind"] == "DaemonSet").collect();
    assert_eq!(sets.len(), 1, "one DaemonSet");
    sets[0]
}

fn strs(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The destinations of deploy/Dockerfile's COPY lines in its last stage: what the image holds.
fn image_paths() -> Vec<String> {
    let text = fs::read_to_string(repo_root().join("deploy/Dockerfile")).unwrap();
    let last_stage = text.rsplit("\nFROM ").next().unwrap();
    last_stage
        .lines()
        .filter(|l| l.starts_with("COPY "))
        .filter_map(|l| l.split_whitespace().last())
        .map(str::to_string)
        .collect()
}

fn in_image(path: &str) -> bool {
    image_paths()
        .iter()
        .any(|dest| dest == path || (dest.ends_with('/') && path.starts_with(dest.as_str())))
}

/// `--name=value` from a command line.
fn flag<'a>(args: &[&'a str], name: &str) -> Option<&'a str> {
    args.iter()
        .find_map(|a| a.strip_prefix(name)?.strip_prefix('='))
}

#[test]
fn the_manifest_holds_the_objects_of_an_etcd_mode_install() {
    let docs = manifest();
    let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    assert_eq!(kinds, ["Namespace", "ConfigMap", "ConfigMap", "DaemonSet"]);
    let ns = docs[0]["metadata"]["name"].as_str().unwrap();
    for doc in &docs[1..] {
        assert_eq!(doc["metadata"]["namespace"], ns, "{doc}");
    }

    let ds = daemonset(&docs);
    assert_eq!(ds["apiVersion"], "apps/v1");
    assert_eq!(
        ds["spec"]["selector"]["matchLabels"], ds["spec"]["template"]["metadata"]["labels"],
        "the selector picks the template's pods"
    );
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);

    let cfg = object(&docs, "ConfigMap", "flanneld-cfg");
    let conflist: Value =
        serde_json::from_str(cfg["data"]["cni-conf.json"].as_str().unwrap()).unwrap();
    let ours: Value = serde_json::from_str(
        &fs::read_to_string(repo_root().join("testdata/10-flannel.conflist")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        conflist, ours,
        "the conflist is kube-flannel's, as testdata holds it"
    );
    let net_conf: Value =
        serde_json::from_str(cfg["data"]["net-conf.json"].as_str().unwrap()).unwrap();
    assert!(net_conf["Network"].is_string(), "net-conf.json: {net_conf}");
    assert_eq!(net_conf["Backend"]["Type"], "vxlan");
}

#[test]
fn flanneld_runs_with_the_network_capabilities_its_etcd_settings_and_probes_on_its_port() {
    let docs = manifest();
    let pod = &daemonset(&docs)["spec"]["template"]["spec"];
    let containers = pod["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    let args = check_flanneld_container(pod, c);

    // The etcd settings: FLANNELD_* variables from the manifest's own ConfigMap.
    let from = c["envFrom"].as_array().unwrap();
    let map = from
        .iter()
        .find_map(|e| e["configMapRef"]["name"].as_str())
        .expect("envFrom a ConfigMap");
    let etcd = object(&docs, "ConfigMap", map);
    let endpoints = etcd["data"]["FLANNELD_ETCD_ENDPOINTS"].as_str().unwrap();
    assert!(
        endpoints.split(',').all(|e| e.starts_with("http")),
        "FLANNELD_ETCD_ENDPOINTS: {endpoints}"
    );
    for key in etcd["data"].as_object().unwrap().keys() {
        assert!(
            key.starts_with("FLANNELD_"),
            "{key} is not a flanneld variable"
        );
    }
    assert!(!args.contains(&"--kube-subnet-mgr".to_string()));
}

/// What both modes' flanneld container must be: flags flanneld takes, probes on its health
/// port, subnet.env on the host and the network config from the ConfigMap. Returns the args.
fn check_flanneld_container(pod: &Value, c: &Value) -> Vec<String> {
    assert_eq!(strs(&c["command"]), ["/usr/local/bin/flanneld"]);
    let caps = strs(&c["securityContext"]["capabilities"]["add"]);
    for cap in ["NET_ADMIN", "NET_RAW"] {
        assert!(caps.contains(&cap), "{cap} missing from {caps:?}");
    }
    assert_ne!(
        c["securityContext"]["privileged"], true,
        "no more than it needs"
    );
    let args = strs(&c["args"]);
    // flanneld parses flags before acting on --help: an unknown flag or bad value fails here.
    let parsed = Command::new(testkit::bin_dir().join("flanneld"))
        .args(&args)
        .arg("--help")
        .output()
        .unwrap();
    assert!(
        parsed.status.success(),
        "flanneld refuses the manifest's args {args:?}: {}",
        String::from_utf8_lossy(&parsed.stderr)
    );
    let port: u64 = flag(&args, "--healthz-port")
        .expect("--healthz-port in the args")
        .parse()
        .unwrap();
    let healthz_ip = flag(&args, "--healthz-ip").unwrap_or("0.0.0.0");
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["path"], path, "{probe}");
        assert_eq!(
            get["port"].as_u64(),
            Some(port),
            "{probe} on --healthz-port"
        );
        if healthz_ip != "0.0.0.0" {
            assert_eq!(get["host"], healthz_ip, "{probe} where flanneld listens");
        }
    }

    // subnet.env reaches the host, where the flannel plugin reads it.
    let mounts = mounts(pod, c);
    assert_eq!(
        mounts.get("/run/flannel").map(String::as_str),
        Some("/run/flannel")
    );
    let net_conf = flag(&args, "--net-config-path").unwrap();
    let dir = Path::new(net_conf).parent().unwrap();
    assert!(
        mounted_config_maps(pod, c).contains(&format!("{}/", dir.display())),
        "{net_conf} comes from the ConfigMap"
    );
    args.iter().map(|a| a.to_string()).collect()
}

#[test]
fn the_kube_manifest_holds_kube_flannels_objects() {
    let docs = manifest_at(KUBE_MODE);
    let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    assert_eq!(
        kinds,
        [
            "Namespace",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "DaemonSet"
        ]
    );
    let ns = docs[0]["metadata"]["name"].as_str().unwrap();
    for doc in &docs {
        let cluster_scoped = ["Namespace", "ClusterRole", "ClusterRoleBinding"]
            .contains(&doc["kind"].as_str().unwrap());
        assert_eq!(
            doc["metadata"]["namespace"].as_str().is_none(),
            cluster_scoped,
            "{doc}"
        );
        if !cluster_scoped {
            assert_eq!(doc["metadata"]["namespace"], ns, "{doc}");
        }
    }
    let sa = docs.iter().find(|d| d["kind"] == "ServiceAccount").unwrap();
    let role = docs.iter().find(|d| d["kind"] == "ClusterRole").unwrap();
    let binding = docs
        .iter()
        .find(|d| d["kind"] == "ClusterRoleBinding")
        .unwrap();
    assert_eq!(binding["roleRef"]["kind"], "ClusterRole");
    assert_eq!(binding["roleRef"]["apiGroup"], "rbac.authorization.k8s.io");
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    let subjects = binding["subjects"].as_array().unwrap();
    assert_eq!(subjects.len(), 1);
    assert_eq!(subjects[0]["kind"], "ServiceAccount");
    assert_eq!(subjects[0]["name"], sa["metadata"]["name"]);
    assert_eq!(subjects[0]["namespace"], ns);

    let ds = daemonset(&docs);
    assert_eq!(
        ds["spec"]["selector"]["matchLabels"], ds["spec"]["template"]["metadata"]["labels"],
        "the selector picks the template's pods"
    );
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["serviceAccountName"], sa["metadata"]["name"]);
    assert_ne!(
        pod["automountServiceAccountToken"], false,
        "flanneld reads its token from the service account's mount"
    );
    // The same conflist and network config as the etcd mode's.
    let cfg = object(&docs, "ConfigMap", "flanneld-cfg");
    let etcd_docs = manifest();
    let etcd_cfg = object(&etcd_docs, "ConfigMap", "flanneld-cfg");
    assert_eq!(cfg["data"], etcd_cfg["data"]);
}

#[test]
fn the_kube_role_allows_exactly_what_flanneld_asks_for() {
    let docs = manifest_at(KUBE_MODE);
    let role = docs.iter().find(|d| d["kind"] == "ClusterRole").unwrap();
    let mut granted = BTreeSet::new();
    for rule in role["rules"].as_array().unwrap() {
        assert_eq!(
            strs(&rule["apiGroups"]),
            [""],
            "the core group only: {rule}"
        );
        for r in strs(&rule["resources"]) {
            for v in strs(&rule["verbs"]) {
                granted.insert((v.to_string(), r.to_string()));
            }
        }
    }
    // The rules the daemon's tests give it at the API server stand-in, where every other
    // request is refused as RBAC refuses it.
    let needed: BTreeSet<(String, String)> = testkit::kube_api::FLANNEL_RULES
        .iter()
        .map(|(v, r)| (v.to_string(), r.to_string()))
        .collect();
    assert_eq!(granted, needed);
}

#[test]
fn flanneld_in_kube_mode_knows_its_node_and_takes_no_etcd_settings() {
    let docs = manifest_at(KUBE_MODE);
    let pod = &daemonset(&docs)["spec"]["template"]["spec"];
    let containers = pod["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    let args = check_flanneld_container(pod, c);
    for wanted in ["--kube-subnet-mgr", "--ip-masq"] {
        assert!(
            args.iter().any(|a| a == wanted),
            "{wanted} missing from {args:?}"
        );
    }
    assert!(
        !args.iter().any(|a| a.starts_with("--etcd")) && c["envFrom"].is_null(),
        "no etcd in kube mode"
    );
    let env: std::collections::BTreeMap<&str, &str> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap(),
                e["valueFrom"]["fieldRef"]["fieldPath"]
                    .as_str()
                    .unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(env.get("NODE_NAME"), Some(&"spec.nodeName"));
    assert_eq!(env.get("POD_NAME"), Some(&"metadata.name"));
    assert_eq!(env.get("POD_NAMESPACE"), Some(&"metadata.namespace"));
}

/// A container's mount paths and the host paths behind them.
fn mounts(pod: &Value, c: &Value) -> std::collections::BTreeMap<String, String> {
    let mut out = std::collections::BTreeMap::new();
    for m in c["volumeMounts"].as_array().unwrap() {
        let vol = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == m["name"])
            .unwrap_or_else(|| panic!("no volume {} for {}", m["name"], c["name"]));
        if let Some(host) = vol["hostPath"]["path"].as_str() {
            out.insert(
                m["mountPath"].as_str().unwrap().to_string(),
                host.to_string(),
            );
        }
    }
    out
}

/// Where a container mounts ConfigMaps.
fn mounted_config_maps(pod: &Value, c: &Value) -> BTreeSet<String> {
    c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| {
            pod["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|v| v["name"] == m["name"] && v["configMap"].is_object())
        })
        .map(|m| m["mountPath"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn the_init_step_writes_the_hosts_cni_directories() {
    for file in MANIFESTS {
        init_step_writes_the_hosts_cni_directories(&manifest_at(file));
    }
}

fn init_step_writes_the_hosts_cni_directories(docs: &[Value]) {
    let pod = &daemonset(docs)["spec"]["template"]["spec"];
    let init = pod["initContainers"].as_array().unwrap();
    assert_eq!(init.len(), 1);
    let c = &init[0];
    let cmd = strs(&c["command"]);
    assert_eq!(cmd[0], "/usr/local/bin/cni-install.sh");
    let root = flag(&cmd, "--root").unwrap();
    let mounts = mounts(pod, c);
    assert_eq!(
        mounts
            .get(&format!("{root}/opt/cni/bin"))
            .map(String::as_str),
        Some("/opt/cni/bin")
    );
    assert_eq!(
        mounts
            .get(&format!("{root}/etc/cni/net.d"))
            .map(String::as_str),
        Some("/etc/cni/net.d")
    );
    let conflist = flag(&cmd, "--conflist").unwrap();
    let dir = Path::new(conflist).parent().unwrap();
    assert!(
        mounted_config_maps(pod, c).contains(&format!("{}/", dir.display())),
        "{conflist} comes from the ConfigMap"
    );
}

#[test]
fn every_image_and_path_the_manifests_run_is_one_the_dockerfile_builds() {
    for file in MANIFESTS {
        images_and_paths_are_the_dockerfiles(&manifest_at(file));
    }
}

fn images_and_paths_are_the_dockerfiles(docs: &[Value]) {
    let pod = &daemonset(docs)["spec"]["template"]["spec"];
    let dockerfile = fs::read_to_string(repo_root().join("deploy/Dockerfile")).unwrap();
    assert!(
        dockerfile.contains(&format!(
            "docker build -f deploy/Dockerfile -t {} .",
            image()
        )),
        "deploy/Dockerfile should say how to build {}",
        image()
    );
    for c in pod["initContainers"]
        .as_array()
        .unwrap()
        .iter()
        .chain(pod["containers"].as_array().unwrap())
    {
        assert_eq!(c["image"], image().as_str(), "{}", c["name"]);
        let cmd = strs(&c["command"]);
        assert!(in_image(cmd[0]), "{} is not in the image", cmd[0]);
        if let Some(from) = flag(&cmd, "--from") {
            assert!(in_image(&format!("{from}/")), "{from} is not in the image");
        }
    }
    // And the image's sources are the repository's.
    assert!(repo_root().join("deploy/cni-install.sh").is_file());
    assert!(
        dockerfile.contains("--bins"),
        "the build makes every binary"
    );
    for p in PLUGINS.iter().chain(["flanneld"].iter()) {
        assert!(
            repo_root().join("plugins").join(p).is_dir()
                || repo_root().join("pkg").join(p).is_dir(),
            "{p} is not built by this workspace"
        );
        assert!(dockerfile.contains(p), "the Dockerfile does not copy {p}");
    }
}

/// A throwaway host root, and the conflist the init container would read from the ConfigMap.
struct Host {
    dir: tempfile::TempDir,
}

impl Host {
    fn new() -> Host {
        let dir = tempfile::Builder::new()
            .prefix("e2e-k8s-host-")
            .tempdir()
            .unwrap();
        let docs = manifest();
        let cfg = object(&docs, "ConfigMap", "flanneld-cfg");
        fs::create_dir_all(dir.path().join("config")).unwrap();
        fs::write(
            dir.path().join("config/cni-conf.json"),
            cfg["data"]["cni-conf.json"].as_str().unwrap(),
        )
        .unwrap();
        fs::create_dir_all(dir.path().join("root")).unwrap();
        Host { dir }
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    fn run_init(&self, from: &Path) -> Output {
        Command::new(repo_root().join("deploy/cni-install.sh"))
            .arg(format!("--root={}", self.root().display()))
            .arg(format!("--from={}", from.display()))
            .arg(format!(
                "--conflist={}",
                self.dir.path().join("config/cni-conf.json").display()
            ))
            .output()
            .expect("running deploy/cni-install.sh")
    }
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn the_init_step_puts_the_five_plugins_and_the_conflist_on_a_throwaway_root() {
    let host = Host::new();
    let bin = host.root().join("opt/cni/bin");
    let conf = host.root().join("etc/cni/net.d");
    // The host already has an older plugin there: it is replaced, and other files are kept.
    fs::create_dir_all(&bin).unwrap();
    fs::write(bin.join("bridge"), b"old").unwrap();
    fs::write(bin.join("dhcp"), b"someone else's").unwrap();

    // Run twice: a pod restarted on the same node runs the step again.
    for _ in 0..2 {
        let out = host.run_init(&testkit::bin_dir());
        assert!(
            out.status.success(),
            "cni-install.sh: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    let mut expected: Vec<String> = PLUGINS.iter().map(|p| p.to_string()).collect();
    expected.push("dhcp".into());
    expected.sort();
    assert_eq!(names_in(&bin), expected, "the plugins, no temporary file");
    for p in PLUGINS {
        assert_eq!(
            fs::read(bin.join(p)).unwrap(),
            fs::read(testkit::bin_dir().join(p)).unwrap(),
            "{p} is not the built one"
        );
        assert_eq!(mode(&bin.join(p)), 0o755, "{p}'s mode");
    }
    assert_eq!(fs::read(bin.join("dhcp")).unwrap(), b"someone else's");
    assert_eq!(names_in(&conf), ["10-flannel.conflist"]);
    assert_eq!(mode(&conf.join("10-flannel.conflist")), 0o644);
    let installed: Value =
        serde_json::from_str(&fs::read_to_string(conf.join("10-flannel.conflist")).unwrap())
            .unwrap();
    assert_eq!(installed["plugins"][0]["type"], "flannel");

    // The installed plugin answers as a runtime would call it.
    let version = Command::new(bin.join("flannel"))
        .env("CNI_COMMAND", "VERSION")
        .output()
        .unwrap();
    assert!(version.status.success());
    let answer: Value = serde_json::from_slice(&version.stdout).unwrap();
    assert!(answer["supportedVersions"].is_array(), "{answer}");
}

#[test]
fn the_init_step_changes_nothing_when_a_plugin_is_missing() {
    let host = Host::new();
    let from = host.dir.path().join("image-bin");
    fs::create_dir_all(&from).unwrap();
    for p in PLUGINS.iter().filter(|p| **p != "portmap") {
        fs::copy(testkit::bin_dir().join(p), from.join(p)).unwrap();
    }

    let out = host.run_init(&from);

    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("portmap"));
    assert!(
        !host.root().join("opt").exists() && !host.root().join("etc").exists(),
        "the host was written before the check"
    );
}

/// The last stage of a Dockerfile under deploy/.
fn last_stage(file: &str) -> String {
    let text = fs::read_to_string(repo_root().join("deploy").join(file)).unwrap();
    text.rsplit("\nFROM ").next().unwrap().to_string()
}

#[test]
fn the_image_from_prebuilt_binaries_is_the_image_the_dockerfile_compiles() {
    let compiled = last_stage("Dockerfile");
    let prebuilt = last_stage("Dockerfile.prebuilt");
    let dests = |stage: &str| -> Vec<String> {
        stage
            .lines()
            .filter(|l| l.starts_with("COPY "))
            .filter_map(|l| l.split_whitespace().last())
            .map(str::to_string)
            .collect()
    };
    assert_eq!(
        dests(&prebuilt),
        dests(&compiled),
        "the same files, the same places"
    );
    let from_label = |stage: &str| stage[stage.find("\nLABEL ").unwrap()..].to_string();
    assert_eq!(
        from_label(&prebuilt),
        from_label(&compiled),
        "the same labels and entry point"
    );
    let base = |file: &str| {
        fs::read_to_string(repo_root().join("deploy").join(file))
            .unwrap()
            .lines()
            .find(|l| l.starts_with("ARG BASE="))
            .map(str::to_string)
    };
    assert_eq!(
        base("Dockerfile.prebuilt"),
        base("Dockerfile"),
        "the same base"
    );

    // What the compiling build installs on its base, scripts/image.sh's base already holds.
    let installed: Vec<&str> = compiled
        .split("--no-install-recommends")
        .nth(1)
        .expect("an apt-get install in the last stage")
        .split("&&")
        .next()
        .unwrap()
        .split_whitespace()
        .filter(|w| *w != "\\")
        .collect();
    assert!(installed.contains(&"nftables"), "nft, for EnableNFTables");
    let script = fs::read_to_string(repo_root().join("scripts/image.sh")).unwrap();
    // The base's mmdebstrap: `make_rootfs <variant> <packages> "$work/base.tar" ...`.
    let included: Vec<&str> = script
        .lines()
        .filter(|l| l.contains("\"$work/base.tar\""))
        .find_map(|l| l.trim().strip_prefix("make_rootfs "))
        .and_then(|args| args.split_whitespace().nth(1))
        .expect("make_rootfs <variant> <packages> \"$work/base.tar\" in scripts/image.sh")
        .split(',')
        .collect();
    assert_eq!(included, installed, "scripts/image.sh's base packages");
}

/// deploy/kubernetes/netpol.yml: flannel-netpol's DaemonSet and RBAC.
const NETPOL: &str = "netpol.yml";

#[test]
fn the_netpol_role_allows_exactly_what_the_enforcer_asks_for() {
    let docs = manifest_at(NETPOL);
    let role = object(&docs, "ClusterRole", "flannel-netpol");
    let mut granted = BTreeSet::new();
    for rule in role["rules"].as_array().unwrap() {
        for r in strs(&rule["resources"]) {
            let group = if r == "networkpolicies" {
                "networking.k8s.io"
            } else {
                ""
            };
            assert_eq!(strs(&rule["apiGroups"]), [group], "{r}'s group: {rule}");
            for v in strs(&rule["verbs"]) {
                granted.insert((v.to_string(), r.to_string()));
            }
        }
    }
    // The rules the enforcer's tests give it at the API server stand-in.
    let needed: BTreeSet<(String, String)> = testkit::kube_api::NETPOL_RULES
        .iter()
        .map(|(v, r)| (v.to_string(), r.to_string()))
        .collect();
    assert_eq!(granted, needed);
    let binding = object(&docs, "ClusterRoleBinding", "flannel-netpol");
    assert_eq!(binding["roleRef"]["name"], "flannel-netpol");
    let sa = &binding["subjects"][0];
    let account = object(&docs, "ServiceAccount", sa["name"].as_str().unwrap());
    assert_eq!(account["metadata"]["namespace"], sa["namespace"]);
}

#[test]
fn the_enforcer_runs_from_the_image_on_the_hosts_network_knowing_its_node() {
    let docs = manifest_at(NETPOL);
    let set = daemonset(&docs);
    let pod = &set["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["serviceAccountName"], "flannel-netpol");
    assert_eq!(
        set["metadata"]["namespace"],
        object(&docs, "ServiceAccount", "flannel-netpol")["metadata"]["namespace"]
    );
    let containers = pod["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    assert_eq!(c["image"], image().as_str());
    let cmd = strs(&c["command"]);
    assert_eq!(cmd, ["/usr/local/bin/flannel-netpol"]);
    assert!(in_image(cmd[0]), "{} is not in the image", cmd[0]);
    assert_eq!(
        c["env"][0],
        serde_json::json!({"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}})
    );
    assert_eq!(
        strs(&c["securityContext"]["capabilities"]["add"]),
        ["NET_ADMIN"]
    );
    assert_eq!(c["securityContext"]["privileged"], false);
    // The arguments are the binary's, and the probe asks where it serves.
    let args = strs(&c["args"]);
    let out = Command::new(testkit::bin_dir().join("flannel-netpol"))
        .args(&args)
        .arg("--version")
        .output()
        .expect("running flannel-netpol");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let served = flag(&args, "--metrics-bind-address").unwrap();
    let probe = &c["livenessProbe"]["httpGet"];
    assert_eq!(
        format!("{}:{}", probe["host"].as_str().unwrap(), probe["port"]),
        served
    );
    assert_eq!(probe["path"], "/healthz");
}
