//! The Kubernetes client of `--kube-subnet-mgr` against the API server stand-in: pages, the
//! watch and its bookmarks, a 410 after a compaction, the status PATCH and its refusal, the
//! node's name through its pod, and an API server that is gone. The client runs on a thread
//! inside the test's namespace, where the stand-in listens.

use flanneld::lease::LeaseAttrs;
use flanneld::registry::kube::{
    annotation_patch, network_available_patch, Annotations, Families, KubeClient, KubeError,
    NodeEnv, NodeObject, NodeWatch, WatchStop,
};
use flanneld::registry::Change;
use futures::StreamExt;
use kube::core::WatchEvent;
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;
use testkit::kube_api::{KubeApi, FLANNEL_RULES};
use testkit::TestNs;

const PREFIX: &str = "flannel.alpha.coreos.com";

fn node(i: u32, managed: bool) -> Value {
    let mut n = json!({
        "metadata": {"name": format!("n{i}")},
        "spec": {"podCIDR": format!("10.{}.{}.0/24", 100 + i / 256, i % 256)},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]}
    });
    if managed {
        n["metadata"]["annotations"] = json!({
            "flannel.alpha.coreos.com/backend-data": format!(r#"{{"VNI":1,"VtepMAC":"02:00:00:00:{:02x}:{:02x}"}}"#, i / 256, i % 256),
            "flannel.alpha.coreos.com/backend-type": "vxlan",
            "flannel.alpha.coreos.com/kube-subnet-manager": "true",
            "flannel.alpha.coreos.com/public-ip": format!("192.168.{}.{}", i / 256, i % 256),
        });
    }
    n
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

async fn next_event(
    stream: &mut (impl futures::Stream<Item = Result<WatchEvent<NodeObject>, KubeError>> + Unpin),
    what: &str,
) -> WatchEvent<NodeObject> {
    match tokio::time::timeout(Duration::from_secs(10), stream.next()).await {
        Ok(Some(Ok(e))) => e,
        other => panic!("waiting for {what}: {other:?}"),
    }
}

#[test]
fn the_client_lists_in_pages_watches_and_patches_through_the_api_server() {
    let ns = TestNs::new("kcli");
    let dir = tempfile::tempdir().unwrap();
    let mut api = KubeApi::start(
        Some(ns.path()),
        "127.0.0.1:6443".parse().unwrap(),
        dir.path(),
    );
    api.create_nodes((0..1200).map(|i| node(i, i % 3 == 0)));
    api.add_pod("kube-flannel", "kube-flannel-ds-7", "n7");
    let sa = "system:serviceaccount:kube-flannel:flannel";
    let user = api.add_user(sa, Some(FLANNEL_RULES));
    api.set_bookmark_interval(Duration::from_millis(300));
    let names = Annotations::new(PREFIX).unwrap();
    let fam = Families {
        ipv4: true,
        ipv6: false,
    };

    ns.run_inside(|| {
        runtime().block_on(async {
            let c = KubeClient::connect(None, Some(&user.kubeconfig)).await.unwrap();
            assert_eq!(c.server(), "https://127.0.0.1:6443/");
            let by_pod = NodeEnv {
                node_name: None,
                pod_name: Some("kube-flannel-ds-7".into()),
                pod_namespace: Some("kube-flannel".into()),
            };
            assert_eq!(c.node_name(&by_pod).await.unwrap(), "n7");
            let by_name = NodeEnv {
                node_name: Some("n3".into()),
                ..Default::default()
            };
            assert_eq!(c.node_name(&by_name).await.unwrap(), "n3");

            // 1,200 nodes in pages of 500; 400 of them are leases.
            let (nodes, rv) = c.list_nodes().await.unwrap();
            assert_eq!(nodes.len(), 1200);
            let lists: Vec<_> = api
                .requests()
                .into_iter()
                .filter(|r| r.user == sa && r.verb == "list")
                .collect();
            assert_eq!(lists.len(), 3, "{lists:?}");
            let mut w = NodeWatch::new(names.clone(), fam);
            let d = w.listed(nodes, rv.clone());
            assert_eq!((d.changes.len(), w.len()), (400, 400));

            // The watch: a node added, then a bookmark.
            let mut events = c.watch_nodes(w.resource_version()).await.unwrap();
            api.create_node(node(3000, true));
            let d = w
                .event(next_event(&mut events, "n3000's ADDED").await)
                .unwrap();
            assert!(
                matches!(&d.changes[..], [Change::Put(e)] if e.key == "10.111.184.0-24"),
                "{:?}",
                d.changes
            );
            loop {
                if let WatchEvent::Bookmark(b) = next_event(&mut events, "a bookmark").await {
                    assert_eq!(b.metadata.resource_version, api.resource_version().to_string());
                    break;
                }
            }

            // This node's annotations, then its condition, as flanneld writes them.
            let n7 = c.node("n7").await.unwrap();
            let attrs = LeaseAttrs::decode(
                br#"{"PublicIP":"192.168.0.7","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"02:aa:bb:cc:dd:07"}}"#,
            )
            .unwrap();
            let patch = annotation_patch(&n7, &attrs, &names).unwrap();
            c.patch_node_status("n7", &patch).await.unwrap();
            c.patch_node_status("n7", &network_available_patch(k8s_openapi::chrono::Utc::now()))
                .await
                .unwrap();
            let stored = api.node("n7").unwrap();
            let ann = &stored["metadata"]["annotations"];
            assert_eq!(ann["flannel.alpha.coreos.com/public-ip"], "192.168.0.7");
            assert_eq!(
                ann["flannel.alpha.coreos.com/backend-data"],
                r#"{"VNI":1,"VtepMAC":"02:aa:bb:cc:dd:07"}"#
            );
            let conditions: Vec<&str> = stored["status"]["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["type"].as_str().unwrap())
                .collect();
            assert_eq!(conditions, ["Ready", "NetworkUnavailable"]);
            let d = w.event(next_event(&mut events, "n7's MODIFIED").await).unwrap();
            assert!(matches!(&d.changes[..], [Change::Put(e)] if e.key == "10.100.7.0-24"));

            // Without the right, the refusal names the verb and the resource.
            api.forbid(&user.token, "patch", "nodes/status");
            let e = c.patch_node_status("n7", &patch).await.unwrap_err();
            assert!(
                matches!(&e, KubeError::Denied { verb: "patch", resource: "nodes/status", message } if message.contains(sa)),
                "{e:?}"
            );

            // A watch from before a compaction: 410, which means one list again.
            api.compact();
            let mut events = c.watch_nodes(&rv).await.unwrap();
            let stop = w.event(next_event(&mut events, "the 410").await).unwrap_err();
            assert!(matches!(stop, WatchStop::Expired(m) if m.starts_with("too old resource version")));
        });
    });

    // Gone: the client says so and can retry.
    api.stop();
    ns.run_inside(|| {
        runtime().block_on(async {
            let c = KubeClient::connect(None, Some(&user.kubeconfig))
                .await
                .unwrap();
            let e = c.list_nodes().await.unwrap_err();
            assert!(matches!(e, KubeError::Unavailable(_)), "{e:?}");
        })
    });
}

#[test]
fn a_url_alone_reaches_an_api_server_without_tls() {
    let ns = TestNs::new("kcli");
    let dir = tempfile::tempdir().unwrap();
    let api = KubeApi::start_plain(
        Some(ns.path()),
        "127.0.0.1:8080".parse().unwrap(),
        dir.path(),
    );
    api.create_node(node(1, true));
    ns.run_inside(|| {
        runtime().block_on(async {
            let c = KubeClient::connect(Some("http://127.0.0.1:8080"), None)
                .await
                .unwrap();
            let (nodes, _) = c.list_nodes().await.unwrap();
            assert_eq!(nodes[0].metadata.name, "n1");
            assert_eq!(
                c.node("nope").await.unwrap_err(),
                KubeError::NotFound(r#"get nodes "nope": nodes "nope" not found"#.into())
            );
        })
    });
}

/// A stand-in listening on `addr` in a namespace of its own, and a client of its
/// administrator's kubeconfig with `edit` applied to it, reaching it at `url`: the error of
/// listing the nodes.
fn list_error(addr: &str, url: Option<&str>, edit: impl FnOnce(&str, &Path) -> String) -> String {
    let ns = TestNs::new("kcau");
    let dir = tempfile::tempdir().unwrap();
    let api = KubeApi::start(Some(ns.path()), addr.parse().unwrap(), dir.path());
    let kubeconfig = dir.path().join("edited.kubeconfig");
    let text = std::fs::read_to_string(&api.admin().kubeconfig).unwrap();
    std::fs::write(&kubeconfig, edit(&text, dir.path())).unwrap();
    ns.run_inside(|| {
        runtime().block_on(async {
            let c = KubeClient::connect(url, Some(&kubeconfig)).await.unwrap();
            c.list_nodes().await.unwrap_err().to_string()
        })
    })
}

#[test]
fn a_certificate_not_signed_by_the_kubeconfigs_ca_is_named_so() {
    let mut other_ca = None;
    let e = list_error("127.0.0.1:6443", None, |kc, dir| {
        let other = dir.join("other");
        std::fs::create_dir(&other).unwrap();
        let certs = testkit::kube_api::make_certs(&other, "127.0.0.1".parse().unwrap());
        other_ca = Some(certs.ca.display().to_string());
        kc.replace(
            &dir.join("ca.crt").display().to_string(),
            &certs.ca.display().to_string(),
        )
    });
    let ca = other_ca.unwrap();
    assert!(
        e.contains(&format!(
            "the API server at 127.0.0.1:6443 presents a certificate that is not signed by the CA in {ca}"
        )),
        "{e}"
    );
}

#[test]
fn a_name_the_servers_certificate_lacks_is_named_so() {
    // The certificate is made for 0.0.0.0; the client reaches the server at 127.0.0.1.
    let e = list_error("0.0.0.0:6443", Some("https://127.0.0.1:6443"), |kc, _| {
        kc.to_string()
    });
    assert!(
        e.contains("is not valid for the name 127.0.0.1 it is reached by (--kube-api-url); it is valid for 0.0.0.0, localhost"),
        "{e}"
    );
}

#[test]
fn a_refused_connection_names_the_address() {
    let e = list_error("127.0.0.1:6443", Some("https://127.0.0.1:6449"), |kc, _| {
        kc.to_string()
    });
    assert!(
        e.contains("connection refused at 127.0.0.1:6449 (--kube-api-url): nothing listens there"),
        "{e}"
    );
}

#[test]
fn a_401_names_where_the_credentials_come_from() {
    let mut path = String::new();
    let e = list_error("127.0.0.1:6443", None, |kc, dir| {
        path = dir.join("edited.kubeconfig").display().to_string();
        let token = kc
            .lines()
            .find_map(|l| l.trim().strip_prefix("token: "))
            .unwrap()
            .to_string();
        kc.replace(&token, "expired")
    });
    assert!(
        e.contains(&format!(
            r#"does not accept the token of user "kubernetes-admin" of {path} (401 Unauthorized)"#
        )),
        "{e}"
    );
}
