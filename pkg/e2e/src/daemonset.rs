//! The DaemonSets of deploy/kubernetes run as a kubelet runs them, with podman and without a
//! cluster: one container of the manifest's pod becomes one `podman run` with the pod's host
//! network, the container's command and arguments, its environment (values, the pod's own
//! fields, ConfigMaps), its volumes (host paths mapped into a test's throwaway directories,
//! ConfigMaps written out as files), its privilege and capabilities, and the service account's
//! token where the pod is given one. Whatever of the manifest this cannot run as Kubernetes
//! would, it refuses, so that a test never runs something other than what the manifest says.

use crate::plugins::repo_root;
use serde_json::Value;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use testkit::TestNs;

/// Where the kubelet mounts a pod's service account, as client-go reads it.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// One of deploy/kubernetes's manifests, its documents as JSON values.
pub struct Manifest {
    pub file: String,
    pub docs: Vec<Value>,
}

impl Manifest {
    /// deploy/kubernetes/`file`.
    pub fn read(file: &str) -> Manifest {
        let path = repo_root().join("deploy/kubernetes").join(file);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let docs = serde_norway::Deserializer::from_str(&text)
            .map(|doc| {
                serde::Deserialize::deserialize(doc)
                    .unwrap_or_else(|e| panic!("{}: not YAML: {e}", path.display()))
            })
            .filter(|doc: &Value| !doc.is_null())
            .collect();
        Manifest {
            file: file.to_string(),
            docs,
        }
    }

    pub fn object(&self, kind: &str, name: &str) -> &Value {
        self.docs
            .iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name} in {}", self.file))
    }

    pub fn daemonset(&self) -> &Value {
        let sets: Vec<&Value> = self
            .docs
            .iter()
            .filter(|d| d["kind"] == "DaemonSet")
            .collect();
        assert_eq!(sets.len(), 1, "one DaemonSet in {}", self.file);
        sets[0]
    }

    /// The DaemonSet's pod spec.
    pub fn pod(&self) -> &Value {
        &self.daemonset()["spec"]["template"]["spec"]
    }

    /// The namespace the DaemonSet's pods run in.
    pub fn namespace(&self) -> &str {
        self.daemonset()["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
    }

    /// The pod's container (or init container) called `name`.
    pub fn container(&self, name: &str) -> &Value {
        let pod = self.pod();
        pod["initContainers"]
            .as_array()
            .into_iter()
            .chain(pod["containers"].as_array())
            .flatten()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no container {name} in {}'s DaemonSet", self.file))
    }

    /// A key of a ConfigMap of the manifest.
    pub fn config_value(&self, map: &str, key: &str) -> String {
        self.object("ConfigMap", map)["data"][key]
            .as_str()
            .unwrap_or_else(|| panic!("no {key} in ConfigMap {map} of {}", self.file))
            .to_string()
    }
}

/// The URL of a container's HTTP probe (`livenessProbe`, `readinessProbe`), as the kubelet asks.
pub fn probe_url(container: &Value, probe: &str) -> String {
    let get = &container[probe]["httpGet"];
    let port = get["port"]
        .as_u64()
        .unwrap_or_else(|| panic!("{probe} of {} has no numeric port", container["name"]));
    format!(
        "{}://{}:{port}{}",
        get["scheme"].as_str().unwrap_or("HTTP").to_lowercase(),
        get["host"].as_str().unwrap_or("127.0.0.1"),
        get["path"].as_str().unwrap_or("/")
    )
}

/// One pod of the DaemonSet on one node: what the kubelet would give its containers.
pub struct Pod<'a> {
    manifest: &'a Manifest,
    node_name: String,
    pod_name: String,
    /// Where each hostPath of the pod's volumes is here.
    host_paths: BTreeMap<String, PathBuf>,
    /// ConfigMap keys given another value than the manifest's (map, key) -> value.
    config: BTreeMap<(String, String), String>,
    /// The service account's files and the API server's address (KUBERNETES_SERVICE_*).
    service_account: Option<(PathBuf, SocketAddr)>,
    /// Where the ConfigMaps' files are written.
    dir: PathBuf,
}

impl<'a> Pod<'a> {
    /// The pod on node `node_name`; its ConfigMap volumes are written under `dir`.
    pub fn new(manifest: &'a Manifest, node_name: &str, dir: &Path) -> Pod<'a> {
        Pod {
            manifest,
            node_name: node_name.to_string(),
            pod_name: format!("flanneld-{node_name}"),
            host_paths: BTreeMap::new(),
            config: BTreeMap::new(),
            service_account: None,
            dir: dir.to_path_buf(),
        }
    }

    /// The node's `host` path (a hostPath volume's) is `here` on this machine.
    pub fn host_path(mut self, host: &str, here: &Path) -> Self {
        self.host_paths.insert(host.to_string(), here.to_path_buf());
        self
    }

    /// ConfigMap `map`'s `key` holds `value` in this cluster (an etcd endpoint, say).
    pub fn config_value(mut self, map: &str, key: &str, value: &str) -> Self {
        self.config
            .insert((map.to_string(), key.to_string()), value.to_string());
        self
    }

    /// The service account's token, ca.crt and namespace are in `dir`; the API server is `api`.
    pub fn service_account(mut self, dir: &Path, api: SocketAddr) -> Self {
        self.service_account = Some((dir.to_path_buf(), api));
        self
    }

    pub fn pod_name(&self) -> &str {
        &self.pod_name
    }

    fn config_map(&self, name: &str) -> BTreeMap<String, String> {
        let data = &self.manifest.object("ConfigMap", name)["data"];
        let mut out: BTreeMap<String, String> = data
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
            .collect();
        for ((map, key), value) in &self.config {
            if map == name {
                out.insert(key.clone(), value.clone());
            }
        }
        out
    }

    fn field(&self, path: &str) -> String {
        match path {
            "spec.nodeName" => self.node_name.clone(),
            "metadata.name" => self.pod_name.clone(),
            "metadata.namespace" => self.manifest.namespace().to_string(),
            other => panic!("the pod field {other} is not given here"),
        }
    }

    /// `podman run` arguments for container `name`, from after `run` to the end: options, the
    /// image, the command's arguments. The caller adds `--detach`, `--name` and the like first.
    pub fn podman_args(&self, name: &str) -> Vec<String> {
        let pod = self.manifest.pod();
        let c = self.manifest.container(name);
        let mut args: Vec<String> = Vec::new();
        let mut arg = |a: &str| args.push(a.to_string());

        assert_eq!(
            pod["hostNetwork"], true,
            "only host-network pods run here ({})",
            self.manifest.file
        );
        arg("--network=host");
        let security = &c["securityContext"];
        if security["privileged"] == true {
            arg("--privileged");
        }
        for cap in str_list(&security["capabilities"]["add"]) {
            arg(&format!("--cap-add={cap}"));
        }
        for cap in str_list(&security["capabilities"]["drop"]) {
            arg(&format!("--cap-drop={cap}"));
        }

        for e in c["env"].as_array().into_iter().flatten() {
            let key = e["name"].as_str().expect("an env entry's name");
            let value = if let Some(v) = e["value"].as_str() {
                v.to_string()
            } else if let Some(path) = e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                self.field(path)
            } else if let Some(r) = e["valueFrom"]["configMapKeyRef"].as_object() {
                let map = self.config_map(r["name"].as_str().unwrap_or_default());
                map.get(r["key"].as_str().unwrap_or_default())
                    .cloned()
                    .unwrap_or_else(|| panic!("{key}: no such ConfigMap key {r:?}"))
            } else {
                panic!("{key}: an env source not given here: {e}")
            };
            arg(&format!("--env={key}={value}"));
        }
        for from in c["envFrom"].as_array().into_iter().flatten() {
            if let Some(map) = from["configMapRef"]["name"].as_str() {
                for (k, v) in self.config_map(map) {
                    arg(&format!("--env={k}={v}"));
                }
            } else if from["secretRef"].is_object() {
                // No Secret exists in these tests: only an optional one may be missing.
                assert_eq!(
                    from["secretRef"]["optional"], true,
                    "the Secret {} is not optional",
                    from["secretRef"]["name"]
                );
            } else {
                panic!("an envFrom source not given here: {from}");
            }
        }

        for m in c["volumeMounts"].as_array().into_iter().flatten() {
            let vname = m["name"].as_str().expect("a mount's volume name");
            let mount = m["mountPath"].as_str().expect("a mount's path");
            let vol = pod["volumes"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|v| v["name"] == vname)
                .unwrap_or_else(|| panic!("no volume {vname} for {name}"));
            let ro = if m["readOnly"] == true { ":ro" } else { "" };
            if vol["hostPath"]["type"] == "CharDevice" {
                // A device is the machine's own, never a place the test moves elsewhere.
                let host = vol["hostPath"]["path"].as_str().expect("a hostPath's path");
                assert!(Path::new(host).exists(), "no device {host} on this machine");
                arg(&format!("--device={host}:{mount}"));
            } else if let Some(host) = vol["hostPath"]["path"].as_str() {
                let here = self
                    .host_paths
                    .get(host)
                    .unwrap_or_else(|| panic!("the test gives no place for the host's {host}"));
                match vol["hostPath"]["type"].as_str() {
                    Some("FileOrCreate") => {
                        if !here.exists() {
                            std::fs::write(here, b"").unwrap();
                        }
                    }
                    Some("File") => assert!(here.is_file(), "{} is no file", here.display()),
                    _ => std::fs::create_dir_all(here).unwrap(),
                }
                arg(&format!("--volume={}:{mount}{ro}", here.display()));
            } else if let Some(map) = vol["configMap"]["name"].as_str() {
                let dir = self.dir.join(format!("configmap-{map}"));
                std::fs::create_dir_all(&dir).unwrap();
                for (k, v) in self.config_map(map) {
                    std::fs::write(dir.join(k), v).unwrap();
                }
                arg(&format!("--volume={}:{mount}:ro", dir.display()));
            } else if vol["secret"].is_object() {
                // No Secret exists in these tests: an optional one is an empty directory.
                assert_eq!(
                    vol["secret"]["optional"], true,
                    "the Secret volume {vname} is not optional"
                );
                let dir = self.dir.join(format!("secret-{vname}"));
                std::fs::create_dir_all(&dir).unwrap();
                arg(&format!("--volume={}:{mount}:ro", dir.display()));
            } else {
                panic!("the volume {vname} is of a kind not given here: {vol}");
            }
        }

        if pod["serviceAccountName"].is_string() && pod["automountServiceAccountToken"] != false {
            let (dir, api) = self
                .service_account
                .as_ref()
                .expect("the pod mounts its service account's token: the test gives none");
            arg(&format!(
                "--volume={}:{SERVICE_ACCOUNT_DIR}:ro",
                dir.display()
            ));
            arg(&format!("--env=KUBERNETES_SERVICE_HOST={}", api.ip()));
            arg(&format!("--env=KUBERNETES_SERVICE_PORT={}", api.port()));
        }

        let command = str_list(&c["command"]);
        if let Some(entry) = command.first() {
            arg(&format!("--entrypoint={entry}"));
        }
        arg(c["image"].as_str().expect("the container's image"));
        for a in command.iter().skip(1).chain(&str_list(&c["args"])) {
            arg(a);
        }
        args
    }
}

fn str_list(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_string))
        .collect()
}

/// podman with a configuration of its own (a containers.conf under a test's directory) and the
/// machine's image store, where scripts/image.sh put the image.
pub struct Podman {
    conf: PathBuf,
}

impl Podman {
    /// Writes `dir`/containers.conf: rlimits and sysctls this machine accepts (podman's
    /// defaults are refused here), cgroupfs, events to a file. The store and podman's state
    /// directories stay the machine's: other podman commands must keep seeing one state.
    pub fn new(dir: &Path) -> Podman {
        std::fs::create_dir_all(dir).unwrap();
        let conf = dir.join("containers.conf");
        std::fs::write(
            &conf,
            "[containers]\n\
             default_ulimits = [\"nofile=20000:20000\", \"nproc=32768:32768\"]\n\
             default_sysctls = []\n\
             log_driver = \"k8s-file\"\n\
             [engine]\n\
             cgroup_manager = \"cgroupfs\"\n\
             events_logger = \"file\"\n",
        )
        .unwrap();
        Podman { conf }
    }

    /// `podman` with this configuration, run in `ns` (its host network) when given.
    pub fn command(&self, ns: Option<&TestNs>) -> Command {
        let mut c = match ns {
            Some(ns) => ns.command("podman"),
            None => Command::new("podman"),
        };
        c.env("CONTAINERS_CONF", &self.conf);
        c
    }

    pub fn output(&self, args: &[&str]) -> Output {
        self.command(None)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("running podman {args:?}: {e}"))
    }

    /// The trimmed stdout of a podman command that must succeed.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.output(args);
        assert!(
            out.status.success(),
            "podman {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Starts a container called `name` in `ns` from `args` (as [`Pod::podman_args`] gives
    /// them), detached; it is removed when the returned guard drops.
    pub fn run_detached(&self, ns: &TestNs, name: &str, args: &[String]) -> Container<'_> {
        let out = self
            .command(Some(ns))
            .args(["run", "--detach", "--name", name])
            .args(args)
            .output()
            .expect("running podman run");
        let container = Container {
            podman: self,
            name: name.to_string(),
        };
        assert!(
            out.status.success(),
            "podman run {name} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        container
    }
}

/// A container of a test, removed (killed first) when dropped.
pub struct Container<'a> {
    podman: &'a Podman,
    pub name: String,
}

impl Container<'_> {
    /// What the container wrote to stdout and stderr so far.
    pub fn logs(&self) -> String {
        let out = self.podman.output(&["logs", &self.name]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// `podman inspect --format FORMAT` of the container.
    pub fn inspect(&self, format: &str) -> String {
        self.podman.ok(&[
            "inspect",
            "--type",
            "container",
            "--format",
            format,
            &self.name,
        ])
    }

    pub fn running(&self) -> bool {
        self.inspect("{{.State.Running}}") == "true"
    }

    /// The container's main process as the machine sees it.
    pub fn pid(&self) -> u32 {
        self.inspect("{{.State.Pid}}")
            .parse()
            .unwrap_or_else(|e| panic!("{}'s pid: {e}", self.name))
    }
}

impl Drop for Container<'_> {
    fn drop(&mut self) {
        let _ = self
            .podman
            .output(&["rm", "--force", "--time", "0", &self.name]);
    }
}
