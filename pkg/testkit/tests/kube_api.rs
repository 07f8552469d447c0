//! The API server stand-in against real clients: kubectl and the Python client
//! (python3-kubernetes) list with limit/continue, watch, annotate and patch status through it,
//! and see its errors as they see a real server's. Each test runs the stand-in in its own
//! network namespace, on that namespace's loopback.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use testkit::cluster::wait_for;
use testkit::kube_api::{Kind, KubeApi, FLANNEL_RULES, NETPOL_RULES};
use testkit::TestNs;

const KUBECTL: &str = "kubectl";
const PYTHON: &str = "/usr/bin/python3";

struct Setup {
    ns: TestNs,
    api: KubeApi,
    dir: tempfile::TempDir,
}

fn setup(prefix: &str) -> Setup {
    let ns = TestNs::new(prefix);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let api = KubeApi::start(
        Some(ns.path()),
        "127.0.0.1:6443".parse().unwrap(),
        dir.path(),
    );
    Setup { ns, api, dir }
}

fn node(name: &str, cidr: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "spec": {"podCIDR": cidr}})
}

impl Setup {
    /// kubectl inside the namespace, with `kubeconfig` and a discovery cache of its own.
    fn kubectl_cmd(&self, kubeconfig: &Path, args: &[&str]) -> Command {
        let mut c = self.ns.command(KUBECTL);
        c.env("KUBECONFIG", kubeconfig)
            .env("HOME", self.dir.path())
            .env("KUBECACHEDIR", self.dir.path().join("kube-cache"))
            .args(args);
        c
    }

    fn kubectl_as(&self, kubeconfig: &Path, args: &[&str]) -> Output {
        self.kubectl_cmd(kubeconfig, args)
            .output()
            .unwrap_or_else(|e| panic!("running kubectl (scripts/deps.sh installs it): {e}"))
    }

    /// kubectl as the administrator; its stdout, panicking with its stderr on failure.
    fn kubectl(&self, args: &[&str]) -> String {
        let out = self.kubectl_as(&self.api.admin().kubeconfig, args);
        assert!(
            out.status.success(),
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn python(&self, script: &str, args: &[&str]) -> Value {
        let out = self
            .ns
            .command(PYTHON)
            .env("HOME", self.dir.path())
            .arg("-c")
            .arg(script)
            .arg(&self.api.admin().kubeconfig)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("running {PYTHON}: {e}"));
        assert!(
            out.status.success(),
            "python: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "python printed no JSON ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }
}

/// Lines a child prints, collected by a thread as they come.
fn collect_lines(child: &mut Child) -> Arc<Mutex<Vec<String>>> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let out = child.stdout.take().expect("the child's stdout");
    let sink = lines.clone();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            sink.lock().unwrap().push(l);
        }
    });
    lines
}

fn list_requests(api: &KubeApi, user: &str) -> Vec<String> {
    api.requests()
        .into_iter()
        .filter(|r| r.user == user && r.verb == "list")
        .map(|r| r.query)
        .collect()
}

#[test]
fn kubectl_lists_in_chunks_watches_annotates_and_patches_status() {
    let s = setup("kapik");
    for i in 1..=5 {
        s.api
            .create_node(node(&format!("n{i}"), &format!("10.5.{i}.0/24")));
    }
    let names = s.kubectl(&["get", "nodes", "--chunk-size=2", "-o", "name"]);
    assert_eq!(
        names.lines().collect::<Vec<_>>(),
        ["node/n1", "node/n2", "node/n3", "node/n4", "node/n5"]
    );
    let lists = list_requests(&s.api, "kubernetes-admin");
    assert_eq!(lists.len(), 3, "three pages of two: {lists:?}");
    assert!(lists[0].contains("limit=2") && !lists[0].contains("continue="));
    assert!(
        lists[1..].iter().all(|q| q.contains("continue=")),
        "{lists:?}"
    );

    // A watch sees a node added and one deleted.
    let mut watch = s
        .kubectl_cmd(
            &s.api.admin().kubeconfig,
            &["get", "nodes", "--watch", "--output-watch-events"],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting kubectl get --watch");
    let lines = collect_lines(&mut watch);
    wait_for(
        "kubectl's watch to list n5",
        Duration::from_secs(20),
        || {
            lines
                .lock()
                .unwrap()
                .iter()
                .any(|l| l.contains("n5"))
                .then_some(())
        },
    );
    s.api.create_node(node("n6", "10.5.6.0/24"));
    s.kubectl(&["delete", "node", "n2"]);
    wait_for(
        "kubectl's watch to print ADDED n6 and DELETED n2",
        Duration::from_secs(20),
        || {
            let l = lines.lock().unwrap();
            let seen = |ev: &str, n: &str| {
                l.iter().any(|x| {
                    let w: Vec<&str> = x.split_whitespace().collect();
                    w.first() == Some(&ev) && w.get(1) == Some(&n)
                })
            };
            (seen("ADDED", "n6") && seen("DELETED", "n2")).then_some(())
        },
    );
    let _ = watch.kill();
    let _ = watch.wait();

    // An annotation, then a strategic merge of the status that keeps the other conditions.
    s.kubectl(&[
        "annotate",
        "node",
        "n1",
        "flannel.alpha.coreos.com/public-ip-overwrite=192.168.9.1",
    ]);
    s.api
        .patch_node(
            "n1",
            true,
            &json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
        )
        .unwrap();
    s.kubectl(&[
        "patch",
        "node",
        "n1",
        "--subresource=status",
        "--type=strategic",
        "-p",
        r#"{"status":{"conditions":[{"type":"NetworkUnavailable","status":"False","reason":"FlannelIsUp","message":"Flannel is running on this node"}]}}"#,
    ]);
    let n1 = s.api.node("n1").unwrap();
    assert_eq!(
        n1["metadata"]["annotations"]["flannel.alpha.coreos.com/public-ip-overwrite"],
        "192.168.9.1"
    );
    let conditions: Vec<(&str, &str)> = n1["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["type"].as_str().unwrap(), c["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        conditions,
        [("Ready", "True"), ("NetworkUnavailable", "False")]
    );
    // kubectl reads back what it wrote.
    let yaml = s.kubectl(&["get", "node", "n1", "-o", "yaml"]);
    assert!(yaml.contains("reason: FlannelIsUp"), "{yaml}");
    assert!(yaml.contains("podCIDR: 10.5.1.0/24"), "{yaml}");
}

#[test]
fn kubectl_sees_the_api_servers_refusals() {
    let mut s = setup("kapir");
    s.api.create_node(node("n1", "10.5.1.0/24"));
    // kubectl reads nodes/status before it patches it, which flanneld's role need not allow.
    let rules: Vec<(&str, &str)> = FLANNEL_RULES
        .iter()
        .copied()
        .chain([("get", "nodes/status")])
        .collect();
    let flannel = s
        .api
        .add_user("system:serviceaccount:kube-flannel:flannel", Some(&rules));
    let out = s.kubectl_as(&flannel.kubeconfig, &["annotate", "node", "n1", "a=b"]);
    assert!(!out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        r#"Error from server (Forbidden): nodes "n1" is forbidden: User "system:serviceaccount:kube-flannel:flannel" cannot patch resource "nodes" in API group "" at the cluster scope"#
    );
    // The status is theirs to patch, until it is taken away.
    let patch = [
        "patch",
        "node",
        "n1",
        "--subresource=status",
        "-p",
        r#"{"metadata":{"annotations":{"a":"b"}}}"#,
    ];
    let out = s.kubectl_as(&flannel.kubeconfig, &patch);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    s.api.forbid(&flannel.token, "patch", "nodes/status");
    let out = s.kubectl_as(&flannel.kubeconfig, &patch);
    assert!(String::from_utf8_lossy(&out.stderr).contains(
        r#"nodes "n1" is forbidden: User "system:serviceaccount:kube-flannel:flannel" cannot patch resource "nodes/status" in API group "" at the cluster scope"#
    ), "{}", String::from_utf8_lossy(&out.stderr));

    let out = s.kubectl(&["get", "node", "nope", "--ignore-not-found", "-o", "name"]);
    assert_eq!(out, "");
    let out = s.kubectl_as(&s.api.admin().kubeconfig, &["get", "node", "nope"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        r#"Error from server (NotFound): nodes "nope" not found"#
    );
    let stranger = s.dir.path().join("stranger.kubeconfig");
    let text = std::fs::read_to_string(&flannel.kubeconfig).unwrap();
    std::fs::write(&stranger, text.replace(&flannel.token, "not-a-token")).unwrap();
    let out = s.kubectl_as(&stranger, &["get", "nodes"]);
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("error: You must be logged in to the server (Unauthorized)"));

    // Stopped, the server refuses connections; started again, it has the same objects.
    s.api.stop();
    let out = s.kubectl_as(
        &s.api.admin().kubeconfig,
        &["get", "nodes", "--request-timeout=3s"],
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("The connection to the server 127.0.0.1:6443 was refused"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    s.api.resume();
    assert_eq!(s.kubectl(&["get", "nodes", "-o", "name"]).trim(), "node/n1");
}

const PY_LIST_WATCH_PATCH: &str = r#"
import json, sys
from kubernetes import client, config, watch
config.load_kube_config(config_file=sys.argv[1])
v1 = client.CoreV1Api()
names, token, pages = [], None, 0
while True:
    page = v1.list_node(limit=2, _continue=token)
    pages += 1
    names += [n.metadata.name for n in page.items]
    token = page.metadata._continue
    if not token:
        break
rv = page.metadata.resource_version
v1.create_node(client.V1Node(metadata=client.V1ObjectMeta(name="p9"), spec=client.V1NodeSpec(pod_cidr="10.5.9.0/24")))
seen = []
for ev in watch.Watch().stream(v1.list_node, resource_version=rv, timeout_seconds=5):
    seen.append([ev["type"], ev["object"].metadata.name])
    break
v1.patch_node_status("p9", {"status": {"conditions": [{"type": "NetworkUnavailable", "status": "False", "reason": "FlannelIsUp"}]}})
v1.patch_node_status("p9", {"status": {"conditions": [{"type": "Ready", "status": "True"}]}})
conds = [[c.type, c.status] for c in v1.read_node("p9").status.conditions]
print(json.dumps({"names": names, "pages": pages, "rv": rv, "seen": seen, "conditions": conds}))
"#;

const PY_WATCH_EXPIRED: &str = r#"
import json, sys
from kubernetes import client, config, watch
config.load_kube_config(config_file=sys.argv[1])
v1 = client.CoreV1Api()
try:
    for ev in watch.Watch().stream(v1.list_node, resource_version=sys.argv[2], timeout_seconds=5):
        print(json.dumps({"event": ev["type"]}))
        sys.exit(0)
    print(json.dumps({"ended": True}))
except client.exceptions.ApiException as e:
    print(json.dumps({"status": e.status, "reason": e.reason}))
"#;

#[test]
fn python_client_lists_watches_and_patches_status() {
    let s = setup("kapip");
    for i in 1..=5 {
        s.api
            .create_node(node(&format!("p{i}"), &format!("10.5.{i}.0/24")));
    }
    let r = s.python(PY_LIST_WATCH_PATCH, &[]);
    assert_eq!(r["names"], json!(["p1", "p2", "p3", "p4", "p5"]));
    assert_eq!(r["pages"], 3);
    assert_eq!(r["seen"], json!([["ADDED", "p9"]]));
    assert_eq!(
        r["conditions"],
        json!([["NetworkUnavailable", "False"], ["Ready", "True"]])
    );

    // A watch from before a compaction ends with 410 Expired, raised as an ApiException.
    let old = r["rv"].as_str().unwrap().to_string();
    s.api.compact();
    let r = s.python(PY_WATCH_EXPIRED, &[&old]);
    assert_eq!(r["status"], 410, "{r}");
    let reason = r["reason"].as_str().unwrap();
    assert!(
        reason.starts_with(&format!("Expired: too old resource version: {old} (")),
        "{reason}"
    );
}

const WORKLOAD: &str = r#"apiVersion: v1
kind: Namespace
metadata:
  name: x
---
apiVersion: v1
kind: Pod
metadata:
  name: a
  namespace: x
  labels:
    pod: a
spec:
  nodeName: n1
  containers:
  - name: c
    image: agnhost
    ports:
    - name: serve-80-tcp
      containerPort: 80
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: deny-ingress
  namespace: x
spec:
  podSelector: {}
"#;

#[test]
fn kubectl_creates_watches_labels_and_deletes_namespaces_pods_and_policies() {
    let s = setup("kapin");
    let file = s.dir.path().join("workload.yaml");
    std::fs::write(&file, WORKLOAD).unwrap();
    let made = s.kubectl(&["create", "--validate=false", "-f", file.to_str().unwrap()]);
    assert_eq!(
        made.lines().collect::<Vec<_>>(),
        [
            "namespace/x created",
            "pod/a created",
            "networkpolicy.networking.k8s.io/deny-ingress created"
        ]
    );
    let ns: Value = serde_json::from_str(&s.kubectl(&["get", "ns", "x", "-o", "json"])).unwrap();
    assert_eq!(ns["metadata"]["labels"]["kubernetes.io/metadata.name"], "x");
    let pol: Value =
        serde_json::from_str(&s.kubectl(&["get", "netpol", "-n", "x", "-o", "json"])).unwrap();
    assert_eq!(pol["items"][0]["kind"], "NetworkPolicy");
    assert_eq!(pol["items"][0]["spec"]["policyTypes"], json!(["Ingress"]));
    let pod: Value =
        serde_json::from_str(&s.kubectl(&["get", "pods", "-A", "-o", "json"])).unwrap();
    assert_eq!(
        pod["items"][0]["spec"]["containers"][0]["ports"][0]["protocol"],
        "TCP"
    );

    // A watch of every namespace's pods sees a label and a status written, then the deletion.
    let mut watch = s
        .kubectl_cmd(
            &s.api.admin().kubeconfig,
            &[
                "get",
                "pods",
                "-A",
                "--watch",
                "--output-watch-events",
                "--no-headers",
                "-o",
                "custom-columns=E:.type,N:.object.metadata.name,R:.object.metadata.labels.role,IP:.object.status.podIP",
            ],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting kubectl get --watch");
    let lines = collect_lines(&mut watch);
    let seen = |what: &str, n: usize| {
        wait_for(what, Duration::from_secs(20), || {
            (lines.lock().unwrap().len() >= n).then_some(())
        })
    };
    seen("kubectl's watch to list x/a", 1);
    s.kubectl(&["label", "-n", "x", "pod", "a", "role=server"]);
    s.api
        .patch(
            Kind::Pod,
            "x",
            "a",
            true,
            &json!({"status": {"podIPs": [{"ip": "10.5.1.2"}], "podIP": "10.5.1.2"}}),
        )
        .unwrap();
    s.kubectl(&["delete", "ns", "x"]);
    seen("the label, the status and the deletion", 4);
    let _ = watch.kill();
    let _ = watch.wait();
    let events: Vec<String> = lines
        .lock()
        .unwrap()
        .iter()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    assert_eq!(
        events,
        [
            "ADDED a <none> <none>",
            "MODIFIED a server <none>",
            "MODIFIED a server 10.5.1.2",
            "DELETED a server 10.5.1.2"
        ]
    );
    assert_eq!(s.api.count(Kind::NetworkPolicy), 0);

    // The enforcer's account may list and watch, nothing else.
    let mut s = s;
    let enforcer = s.api.add_user("netpol", Some(NETPOL_RULES));
    let out = s.kubectl_as(&enforcer.kubeconfig, &["get", "netpol", "-A"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = s.kubectl_as(&enforcer.kubeconfig, &["create", "ns", "y"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(r#"User "netpol" cannot create resource "namespaces" in API group """#),
        "{err}"
    );
    let out = s.kubectl_as(&enforcer.kubeconfig, &["delete", "netpol", "-n", "x", "p"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(r#"in API group "networking.k8s.io""#), "{err}");
}
