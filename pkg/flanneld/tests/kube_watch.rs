//! flanneld --kube-subnet-mgr against what an API server does to a watch besides sending
//! events, each staged in the stand-in: a resourceVersion too old in each of its forms (410 as
//! the watch's answer, an ERROR event in a 200 stream, a continue token that expires between
//! the pages of the list that follows), a watch the server ends (its timeout, a replica going
//! away), bookmarks, 429 and 503 with and without Retry-After, HTTP/2 offered. One node runs
//! the daemon; the other nodes are Node objects annotated as Go's flanneld annotates them,
//! whose routes, neighbours and FDB entries the test reads in the node's kernel.

use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};
use testkit::cluster::{wait_for, Cluster, Node, Registry};
use testkit::kube_api::{Logged, Overload};

const FLANNELD: &str = env!("CARGO_BIN_EXE_flanneld");
/// A ceiling for what takes a second on a quiet machine, and the client's backoff (at most
/// 30 s) besides.
const T: Duration = Duration::from_secs(90);

/// Subnets of 64 addresses: 10.<net>.0.0/16 holds 1,024 of them.
fn vxlan(net: u8) -> String {
    format!(r#"{{"Network":"10.{net}.0.0/16","SubnetLen":26,"Backend":{{"Type":"vxlan"}}}}"#)
}

/// Peer `i`'s subnet: the (100 + i)-th /26 of the network.
fn peer_subnet(net: u8, i: u32) -> String {
    let a = (100 + i) * 64;
    format!("10.{net}.{}.{}/26", a / 256, a % 256)
}

fn peer_mac(i: u32) -> String {
    format!("0e:00:00:00:{:02x}:{:02x}", i / 256, i % 256)
}

/// A Node annotated as Go's flanneld annotates it, for a node that runs no daemon here.
fn peer(net: u8, i: u32) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": format!("peer{i}"), "annotations": {
            "flannel.alpha.coreos.com/backend-data": format!(r#"{{"VNI":1,"VtepMAC":"{}"}}"#, peer_mac(i)),
            "flannel.alpha.coreos.com/backend-type": "vxlan",
            "flannel.alpha.coreos.com/kube-subnet-manager": "true",
            "flannel.alpha.coreos.com/public-ip": format!("192.168.{net}.{}", 100 + i % 100),
        }},
        "spec": {"podCIDR": peer_subnet(net, i)},
    })
}

/// Whether `node`'s kernel routes peer `i`'s subnet through flannel.1.
fn routes_peer(node: &Node, net: u8, i: u32) -> bool {
    let subnet = peer_subnet(net, i);
    node.routes()
        .lines()
        .any(|l| l.starts_with(&format!("{subnet} ")) && l.contains("dev flannel.1"))
}

fn vxlan_routes(node: &Node) -> usize {
    node.routes()
        .lines()
        .filter(|l| l.contains("dev flannel.1"))
        .count()
}

/// The requests of node 1's daemon.
fn daemon_requests(c: &Cluster) -> Vec<Logged> {
    let user = c.node(1).kube_user().expect("a kube user").name.clone();
    c.kube()
        .requests()
        .into_iter()
        .filter(|r| r.user == user)
        .collect()
}

fn first_pages(rs: &[Logged]) -> usize {
    rs.iter()
        .filter(|r| r.verb == "list" && r.param("continue").is_none())
        .count()
}

/// One node with the daemon and `peers` annotated Node objects, every peer programmed.
fn cluster(prefix: &str, net: u8, peers: u32, before_start: impl FnOnce(&mut Cluster)) -> Cluster {
    let mut c = Cluster::new(prefix, net, 1, Registry::Kube, &vxlan(net));
    c.kube().create_nodes((1..=peers).map(|i| peer(net, i)));
    before_start(&mut c);
    c.start_flanneld(1, Path::new(FLANNELD), &[]);
    c.node(1).wait_subnet_env(T);
    let want = peers as usize;
    wait_for(&format!("node 1's routes to {want} peers"), T, || {
        (vxlan_routes(c.node(1)) == want).then_some(())
    });
    c
}

#[test]
fn every_form_of_a_too_old_resource_version_costs_one_list_and_no_entry_twice() {
    // 600 peers: the list comes in two pages of 500.
    let net = 101;
    let mut c = cluster("kxp", net, 600, |_| {});
    let lease_added = |i: u32| format!("lease added: {} ", peer_subnet(net, i).replace('/', "-"));
    let before = daemon_requests(&c);

    // 410 as the answer to the watch: the server restarts with peer 601 created and the
    // events of its downtime forgotten, and answers the daemon's watch with a 410 status.
    c.kube_mut().stop();
    c.kube().create_node(peer(net, 601));
    c.kube().compact();
    c.kube().set_expired_watch_as_status(true);
    c.kube_mut().resume();
    let n = c.node(1);
    wait_for("node 1's route to peer 601", T, || {
        routes_peer(n, net, 601).then_some(())
    });
    let after_status = daemon_requests(&c);
    let new = &after_status[before.len()..];
    assert!(
        new.iter().any(|r| r.verb == "watch" && r.code == 410),
        "the watch was never answered 410: {new:?}"
    );
    assert_eq!(
        first_pages(new),
        1,
        "not one list after a 410 answer: {new:?}"
    );

    // An ERROR event in a 200 stream, then a compaction between the pages of the list that
    // follows: the list starts again, once, and peer 602 arrives.
    c.kube().set_expired_watch_as_status(false);
    c.kube_mut().stop();
    c.kube().create_node(peer(net, 602));
    c.kube().compact();
    c.kube().compact_after_next_first_page();
    c.kube_mut().resume();
    let n = c.node(1);
    wait_for("node 1's route to peer 602", T, || {
        routes_peer(n, net, 602).then_some(())
    });
    let after_event = daemon_requests(&c);
    let new = &after_event[after_status.len()..];
    assert!(
        new.iter()
            .any(|r| r.verb == "list" && r.param("continue").is_some() && r.code == 410),
        "no continue token expired: {new:?}"
    );
    assert_eq!(
        first_pages(new),
        2,
        "not one list and one restart of it after a 410 event: {new:?}"
    );
    assert!(
        n.log().contains("listing them from the start"),
        "{}",
        n.log()
    );
    assert_eq!(vxlan_routes(n), 602);

    // Nothing delivered twice: every peer was added once, whatever was listed again.
    let log = n.log();
    for i in [1, 300, 600, 601, 602] {
        assert_eq!(
            log.matches(&lease_added(i)).count(),
            1,
            "peer {i} added other than once:\n{log}"
        );
    }
    assert!(!log.contains("lease removed"), "{log}");
}

#[test]
fn a_watch_the_server_ends_resumes_where_bookmarks_left_it_without_a_list() {
    let net = 102;
    let c = cluster("kxb", net, 3, |c| {
        // As a real API server offers it; the daemon keeps to HTTP/1.1.
        c.kube_mut().offer_http2();
        c.kube().set_bookmark_interval(Duration::from_millis(300));
    });
    let started = daemon_requests(&c);
    assert_eq!(first_pages(&started), 1, "{started:?}");

    // The server ends every watch after 2 s, as its request timeout does. Other objects
    // change meanwhile (pods), which moves the resourceVersion without a Node event: only
    // bookmarks tell the daemon.
    c.kube().set_watch_limit(Some(Duration::from_secs(2)));
    for i in 0..5 {
        c.kube()
            .add_pod("kube-system", &format!("p{i}"), "elsewhere");
    }
    let moved = c.kube().resource_version();
    let n = c.node(1);
    wait_for(
        &format!("a watch from resourceVersion {moved} or later"),
        T,
        || {
            daemon_requests(&c)
                .iter()
                .any(|r| {
                    r.verb == "watch"
                        && r.param("resourceVersion")
                            .and_then(|v| v.parse::<u64>().ok())
                            .is_some_and(|v| v >= moved)
                })
                .then_some(())
        },
    );
    // The events before now are forgotten: a daemon still at an older resourceVersion would
    // get a 410 and list again.
    c.kube().compact();
    let rv = c.kube().resource_version();
    wait_for(&format!("two more watches from {rv} on"), T, || {
        (daemon_requests(&c)
            .iter()
            .filter(|r| {
                r.verb == "watch"
                    && r.param("resourceVersion")
                        .and_then(|v| v.parse::<u64>().ok())
                        .is_some_and(|v| v >= rv)
            })
            .count()
            >= 2)
            .then_some(())
    });
    c.kube().create_node(peer(net, 4));
    wait_for("node 1's route to peer 4", T, || {
        routes_peer(n, net, 4).then_some(())
    });

    let all = daemon_requests(&c);
    assert_eq!(
        first_pages(&all),
        1,
        "a list after the start, though no watch was too old: {all:?}"
    );
    let watches: Vec<u64> = all
        .iter()
        .filter(|r| r.verb == "watch")
        .filter_map(|r| r.param("resourceVersion")?.parse().ok())
        .collect();
    assert!(watches.len() >= 3, "{all:?}");
    assert!(
        watches.windows(2).all(|w| w[0] <= w[1]),
        "a watch went back: {watches:?}"
    );
    assert!(all.iter().all(|r| r.code == 200), "{all:?}");
    // HTTP/1.1 (kube-rs's connector asks for no protocol in ALPN, which is HTTP/1.1).
    let protocols = c.kube().negotiated_protocols();
    assert!(
        !protocols.is_empty() && protocols.iter().all(|p| p != "h2"),
        "{protocols:?}"
    );
    assert!(!n.log().contains("watching the nodes"), "{}", n.log());
}

/// Node 1's daemon's requests from `from` on answered `code`, and the gaps between them.
fn answered(c: &Cluster, from: usize, code: u16) -> (Vec<Logged>, Vec<Duration>) {
    let rs: Vec<Logged> = daemon_requests(c)
        .into_iter()
        .skip(from)
        .filter(|r| r.code == code)
        .collect();
    let gaps = rs.windows(2).map(|w| w[1].at - w[0].at).collect();
    (rs, gaps)
}

/// Slack for a request that is due: the daemon's thread woken late on a loaded machine.
const LATE: Duration = Duration::from_millis(1500);

#[test]
fn an_overloaded_api_server_is_asked_again_when_it_says_and_ever_less_often_otherwise() {
    let net = 103;
    let c = cluster("kxo", net, 2, |_| {});
    let n = c.node(1);
    // The watch ends every 1.5 s from now on, so that the daemon keeps asking.
    c.kube().set_watch_limit(Some(Duration::from_millis(1500)));

    // 429 with Retry-After: 3: asked again after 3 s, neither sooner nor much later.
    let from = daemon_requests(&c).len();
    c.kube().set_overloaded(Some(Overload {
        code: 429,
        retry_after: Some(3),
    }));
    let (_, g) = wait_for("four requests answered 429", T, || {
        let (rs, g) = answered(&c, from, 429);
        (rs.len() >= 4).then_some((rs, g))
    });
    for gap in &g {
        assert!(
            *gap >= Duration::from_millis(2990) && *gap <= Duration::from_secs(3) + LATE,
            "asked again {gap:?} after a 429 with Retry-After: 3: {g:?}"
        );
    }

    // 503 without Retry-After: the daemon backs off, from 0.25-0.5 s doubling (with jitter,
    // each wait at least the one before it) up to 15-30 s, and keeps asking.
    let from = daemon_requests(&c).len();
    c.kube().set_overloaded(Some(Overload {
        code: 503,
        retry_after: None,
    }));
    let (rs, g) = wait_for("six requests answered 503", T, || {
        let (rs, g) = answered(&c, from, 503);
        (rs.len() >= 6).then_some((rs, g))
    });
    for w in g.windows(2) {
        assert!(
            w[1] + Duration::from_millis(300) >= w[0],
            "a wait shorter than the one before it while the server answers 503: {g:?}"
        );
    }
    // After four failures in a row the wait is at least 4 s (half of 8).
    assert!(
        g[4] >= Duration::from_secs(4),
        "not backing off while the server answers 503: {g:?}"
    );
    // The wait after the last refusal is at most twice its backoff, which is at most twice
    // the last gap.
    let last_wait = *g.last().expect("gaps") * 4;

    // Served again: asked again within the wait the backoff has reached (at most 30 s), and a
    // node created meanwhile arrives.
    let stopped = rs.len();
    c.kube().set_overloaded(None);
    c.kube().set_watch_limit(None);
    c.kube().create_node(peer(net, 3));
    let back = Instant::now();
    wait_for("node 1's route to peer 3 after the overload", T, || {
        routes_peer(n, net, 3).then_some(())
    });
    let ceiling = last_wait.min(Duration::from_secs(30)) + 2 * LATE;
    assert!(
        back.elapsed() <= ceiling,
        "back {:?} after the overload ended, beyond the backoff's {last_wait:?} ({stopped} \
         requests refused)",
        back.elapsed()
    );
    // Each cause once in the log, however often it was met.
    let log = n.log();
    let complaints: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("watching the nodes"))
        .collect();
    assert!(
        complaints.len() <= 4
            && complaints.iter().any(|l| l.contains("429"))
            && complaints.iter().any(|l| l.contains("503")),
        "{log}"
    );
    assert!(!log.contains("ERROR"), "{log}");
}

#[test]
fn throttling_that_ends_lets_a_node_created_right_after_in_within_two_seconds() {
    let net = 104;
    let c = cluster("kxt", net, 2, |_| {});
    let n = c.node(1);
    c.kube().set_watch_limit(Some(Duration::from_millis(1500)));

    // Failures without Retry-After first, so that the backoff has grown (to 2-4 s)...
    let from = daemon_requests(&c).len();
    c.kube().set_overloaded(Some(Overload {
        code: 503,
        retry_after: None,
    }));
    wait_for("four requests answered 503", T, || {
        (answered(&c, from, 503).0.len() >= 4).then_some(())
    });
    // ...then throttled as API priority and fairness throttles: 429 with Retry-After: 1,
    // which the daemon takes at its word, whatever the backoff reached.
    let from = daemon_requests(&c).len();
    c.kube().set_overloaded(Some(Overload {
        code: 429,
        retry_after: Some(1),
    }));
    let (_, g) = wait_for("four requests answered 429", T, || {
        let (rs, g) = answered(&c, from, 429);
        (rs.len() >= 4).then_some((rs, g))
    });
    assert!(
        g.iter().all(|gap| *gap <= Duration::from_secs(1) + LATE),
        "asked less often than Retry-After: 1 says: {g:?}"
    );

    c.kube().set_overloaded(None);
    c.kube().create_node(peer(net, 3));
    let created = Instant::now();
    wait_for("node 1's route to peer 3 after the throttling", T, || {
        routes_peer(n, net, 3).then_some(())
    });
    let took = created.elapsed();
    assert!(
        took <= Duration::from_secs(2),
        "a node created as the throttling ended took {took:?} to be programmed:\n{}",
        n.log()
    );
}
