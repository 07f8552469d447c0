//! The client against the API server stand-in: pages, a watch and its bookmarks, a watch
//! followed across the server's ends of it and ended by a 410, the watcher's list again after
//! one, a selector, the status PATCH and its refusal, this node's name through its pod, an API
//! server that is gone, and failed connections named by cause. The client runs on a thread
//! inside the test's namespace, where the stand-in listens.

use futures::{Stream, StreamExt};
use kube_lite::{
    Event, Followed, KubeClient, KubeError, NodeEnv, Object, Patch, Selector, Source, WatchEvent,
    NODES,
};
use serde::Deserialize;
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;
use testkit::kube_api::{KubeApi, FLANNEL_RULES};
use testkit::TestNs;

/// What a waited-for item may take at most, on a loaded machine.
const T: Duration = Duration::from_secs(30);

/// A Node as a caller's own type: only its name and resourceVersion.
#[derive(Debug, Deserialize)]
struct Named {
    metadata: Meta,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    name: String,
    resource_version: String,
}

impl Object for Named {
    fn resource_version(&self) -> &str {
        &self.metadata.resource_version
    }
}

fn node(i: u32) -> Value {
    json!({
        "metadata": {"name": format!("n{i}")},
        "spec": {"podCIDR": format!("10.{}.{}.0/24", 100 + i / 256, i % 256)},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]}
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

fn source(kubeconfig: &Path) -> Source<'_> {
    Source {
        api_url: None,
        kubeconfig: Some(kubeconfig),
        api_url_flag: "--kube-api-url",
        kubeconfig_flag: "--kubeconfig-file",
    }
}

async fn next<I: std::fmt::Debug>(stream: &mut (impl Stream<Item = I> + Unpin), what: &str) -> I {
    match tokio::time::timeout(T, stream.next()).await {
        Ok(Some(i)) => i,
        other => panic!("waiting for {what}: {other:?}"),
    }
}

fn name_of(ev: &WatchEvent<Named>) -> Option<&str> {
    match ev {
        WatchEvent::Added(n) | WatchEvent::Modified(n) | WatchEvent::Deleted(n) => {
            Some(&n.metadata.name)
        }
        _ => None,
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
    api.create_nodes((0..1200).map(node));
    api.add_pod("kube-flannel", "kube-flannel-ds-7", "n7");
    let sa = "system:serviceaccount:kube-flannel:flannel";
    let user = api.add_user(sa, Some(FLANNEL_RULES));
    api.set_bookmark_interval(Duration::from_millis(300));

    ns.run_inside(|| {
        runtime().block_on(async {
            let c = KubeClient::connect(&source(&user.kubeconfig))
                .await
                .unwrap()
                .needing("the test needs patch on nodes/status");
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

            // 1,200 nodes in pages of 500, into the caller's type and as JSON.
            let listed = c.list::<Named>(NODES, &Selector::all()).await.unwrap();
            assert_eq!(listed.items.len(), 1200);
            assert_eq!(listed.items[1199].metadata.name, "n999");
            let lists: Vec<_> = api
                .requests()
                .into_iter()
                .filter(|r| r.user == sa && r.verb == "list")
                .collect();
            assert_eq!(lists.len(), 3, "{lists:?}");
            let one = c
                .list::<Value>(NODES, &Selector::fields("metadata.name=n5"))
                .await
                .unwrap();
            assert_eq!(one.items.len(), 1);
            assert_eq!(one.items[0]["spec"]["podCIDR"], "10.100.5.0/24");
            let rv = listed.resource_version;

            // The watch: a node added, then a bookmark.
            let mut events = c.watch::<Named>(NODES, &Selector::all(), &rv).await.unwrap();
            api.create_node(node(3000));
            let ev = next(&mut events, "n3000's ADDED").await.unwrap();
            assert!(matches!(&ev, WatchEvent::Added(n) if n.metadata.name == "n3000"));
            loop {
                if let WatchEvent::Bookmark(b) = next(&mut events, "a bookmark").await.unwrap() {
                    assert_eq!(b.metadata.resource_version, api.resource_version().to_string());
                    break;
                }
            }

            // A strategic-merge PATCH of the status: an annotation, and a condition merged by
            // its type beside the others.
            let patch = Patch::Strategic(json!({
                "metadata": {"annotations": {"example.com/mark": "yes"}},
                "status": {"conditions": [{"type": "NetworkUnavailable", "status": "False"}]}
            }));
            let back = c
                .patch(NODES, None, "n7", Some("status"), &patch)
                .await
                .unwrap();
            assert_eq!(back["metadata"]["annotations"]["example.com/mark"], "yes");
            let stored = api.node("n7").unwrap();
            let conditions: Vec<&str> = stored["status"]["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["type"].as_str().unwrap())
                .collect();
            assert_eq!(conditions, ["Ready", "NetworkUnavailable"]);
            loop {
                let ev = next(&mut events, "n7's MODIFIED").await.unwrap();
                if name_of(&ev) == Some("n7") {
                    assert!(matches!(ev, WatchEvent::Modified(_)));
                    break;
                }
            }

            // Without the right, the refusal names the verb, the resource and what is needed.
            api.forbid(&user.token, "patch", "nodes/status");
            let e = c
                .patch(NODES, None, "n7", Some("status"), &patch)
                .await
                .unwrap_err();
            assert!(
                matches!(&e, KubeError::Denied { verb: "patch", resource, message, .. }
                    if resource == "nodes/status" && message.contains(sa)),
                "{e:?}"
            );
            assert!(
                e.to_string()
                    .ends_with("(the test needs patch on nodes/status)"),
                "{e}"
            );

            // A watch from before a compaction: an ERROR event with 410.
            api.compact();
            let mut events = c.watch::<Named>(NODES, &Selector::all(), &rv).await.unwrap();
            let ev = next(&mut events, "the 410").await.unwrap();
            assert!(
                matches!(&ev, WatchEvent::Error(e) if e.code == 410 && e.message.starts_with("too old resource version")),
                "{ev:?}"
            );
        });
    });

    // Gone: the client says so and can retry.
    api.stop();
    ns.run_inside(|| {
        runtime().block_on(async {
            let c = KubeClient::connect(&source(&user.kubeconfig))
                .await
                .unwrap();
            let e = c.list::<Named>(NODES, &Selector::all()).await.unwrap_err();
            assert!(matches!(e, KubeError::Unavailable(_)), "{e:?}");
        })
    });
}

#[test]
fn following_resumes_where_the_server_ended_a_watch_and_ends_at_a_410() {
    let ns = TestNs::new("kcfo");
    let dir = tempfile::tempdir().unwrap();
    let mut api = KubeApi::start(
        Some(ns.path()),
        "127.0.0.1:6443".parse().unwrap(),
        dir.path(),
    );
    api.create_nodes((0..3).map(node));
    let admin = api.admin().clone();
    api.set_bookmark_interval(Duration::from_millis(200));
    // The server ends every watch after a second, as its request timeout does.
    api.set_watch_limit(Some(Duration::from_secs(1)));

    let rt = runtime();
    let c = ns.run_inside(|| {
        rt.block_on(KubeClient::connect(&source(&admin.kubeconfig)))
            .unwrap()
    });
    let rv = ns.run_inside(|| {
        rt.block_on(c.list::<Named>(NODES, &Selector::all()))
            .unwrap()
            .resource_version
    });
    let mut followed = Box::pin(ns.run_inside(|| c.follow::<Named>(NODES, &Selector::all(), &rv)));
    let mut seen = Vec::new();
    for i in 10..14 {
        api.create_node(node(i));
        // Each creation waits for its event, so that they span several watches.
        let want = format!("n{i}");
        while !seen.contains(&want) {
            match ns.run_inside(|| rt.block_on(next(&mut followed, &want))) {
                Ok(Followed::Applied(n)) => seen.push(n.metadata.name),
                Ok(Followed::Bookmark) => {}
                other => panic!("following, waiting for {want}: {other:?}"),
            }
        }
        std::thread::sleep(Duration::from_millis(700));
    }
    api.delete_node("n11").unwrap();
    loop {
        match ns.run_inside(|| rt.block_on(next(&mut followed, "n11's deletion"))) {
            Ok(Followed::Deleted(n)) if n.metadata.name == "n11" => break,
            Ok(Followed::Bookmark) => {}
            other => panic!("following, waiting for n11's deletion: {other:?}"),
        }
    }
    let watches: Vec<u64> = api
        .requests()
        .iter()
        .filter(|r| r.verb == "watch")
        .filter_map(|r| r.param("resourceVersion")?.parse().ok())
        .collect();
    assert!(watches.len() >= 3, "one watch for every event: {watches:?}");
    assert!(
        watches.windows(2).all(|w| w[0] <= w[1]),
        "a watch went back: {watches:?}"
    );
    assert!(
        api.requests().iter().all(|r| r.code == 200),
        "{:?}",
        api.requests()
    );

    // Down while a node is created and the events forgotten: the next watch is too old.
    api.stop();
    api.create_node(node(20));
    api.compact();
    api.resume();
    loop {
        match ns.run_inside(|| rt.block_on(next(&mut followed, "the 410"))) {
            Ok(Followed::Expired(m)) => {
                assert!(m.starts_with("too old resource version"), "{m}");
                break;
            }
            Ok(Followed::Bookmark) | Err(KubeError::Unavailable(_)) => {}
            other => panic!("following, waiting for the 410: {other:?}"),
        }
    }
    let end = ns.run_inside(|| rt.block_on(followed.next()));
    assert!(end.is_none(), "{end:?}");
}

#[test]
fn the_watcher_lists_follows_and_lists_again_after_a_410() {
    let ns = TestNs::new("kcwa");
    let dir = tempfile::tempdir().unwrap();
    let mut api = KubeApi::start(
        Some(ns.path()),
        "127.0.0.1:6443".parse().unwrap(),
        dir.path(),
    );
    api.create_nodes((0..600).map(node));
    let admin = api.admin().clone();
    api.set_expired_watch_as_status(true);

    let rt = runtime();
    let c = ns.run_inside(|| {
        rt.block_on(KubeClient::connect(&source(&admin.kubeconfig)))
            .unwrap()
    });
    let mut events = Box::pin(ns.run_inside(|| c.watcher::<Value>(NODES, &Selector::all())));
    let mut step = |what: &str| ns.run_inside(|| rt.block_on(next(&mut events, what)));
    match step("the first list") {
        Ok(Event::Listed(all)) => assert_eq!(all.len(), 600),
        other => panic!("{other:?}"),
    }
    api.create_node(node(700));
    assert!(matches!(step("n700"), Ok(Event::Applied(n)) if n["metadata"]["name"] == "n700"));
    api.delete_node("n0").unwrap();
    assert!(
        matches!(step("n0's deletion"), Ok(Event::Deleted(n)) if n["metadata"]["name"] == "n0")
    );

    // The server restarts with a node created and the events of its downtime forgotten: the
    // watch is answered 410, and the watcher lists again, once.
    api.stop();
    api.create_node(node(701));
    api.compact();
    let lists_before = api.requests().iter().filter(|r| r.verb == "list").count();
    api.resume();
    let relisted = loop {
        match step("the list after the 410") {
            Ok(Event::Listed(all)) => break all,
            Err(KubeError::Unavailable(_)) => {}
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(relisted.len(), 601);
    assert!(relisted.iter().any(|n| n["metadata"]["name"] == "n701"));
    let rs = api.requests();
    assert!(
        rs.iter().any(|r| r.verb == "watch" && r.code == 410),
        "no watch was answered 410: {rs:?}"
    );
    let first_pages = rs
        .iter()
        .filter(|r| r.verb == "list" && r.param("continue").is_none())
        .count();
    assert_eq!(
        first_pages, 2,
        "not one list after the 410 ({lists_before} list requests before): {rs:?}"
    );
    api.create_node(node(702));
    assert!(matches!(step("n702"), Ok(Event::Applied(n)) if n["metadata"]["name"] == "n702"));
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
    api.create_node(node(1));
    ns.run_inside(|| {
        runtime().block_on(async {
            let c = KubeClient::connect(&Source {
                api_url: Some("http://127.0.0.1:8080"),
                kubeconfig: None,
                api_url_flag: "--kube-api-url",
                kubeconfig_flag: "--kubeconfig-file",
            })
            .await
            .unwrap();
            let listed = c.list::<Named>(NODES, &Selector::all()).await.unwrap();
            assert_eq!(listed.items[0].metadata.name, "n1");
            assert_eq!(
                c.get::<Named>(NODES, None, "nope").await.unwrap_err(),
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
            let c = KubeClient::connect(&Source {
                api_url: url,
                ..source(&kubeconfig)
            })
            .await
            .unwrap();
            c.list::<Named>(NODES, &Selector::all())
                .await
                .unwrap_err()
                .to_string()
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
