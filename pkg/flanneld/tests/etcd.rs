//! flanneld against a real etcd (Debian's etcd-server) started per test in the test's own
//! namespace: leases in flannel's exact schema, their lifecycle, and etcd misbehaving.

mod common;

use common::*;
use std::collections::HashSet;
use std::time::Duration;

const T: Duration = Duration::from_secs(30);
// `alloc` programs nothing: several daemons share one namespace here. The datapath has its
// own tests (tests/datapath.rs).
const CONFIG: &str = r#"{"Network":"10.5.0.0/16","Backend":{"Type":"alloc"}}"#;

fn config(node: &Node, etcd: &Etcd) {
    etcd.put(node, &format!("{PREFIX}/config"), CONFIG);
}

fn daemon(node: &Node, etcd: &Etcd, name: &str, ip: &str, extra: &[&str]) -> Daemon {
    // Several daemons share this namespace: only one set of firewall rules is wanted there.
    let mut args = vec![
        "--iptables-forward-rules=false",
        "--etcd-endpoints",
        &etcd.client_url,
        "--iface",
        "eth0",
        "--public-ip",
        ip,
    ];
    args.extend_from_slice(extra);
    Daemon::start(node, name, &args, &[])
}

#[test]
fn a_lease_is_taken_in_flannels_schema_renewed_and_expires_when_the_node_dies() {
    let node = Node::new("fde");
    let etcd = Etcd::start(&node);
    config(&node, &etcd);
    let mut a = daemon(
        &node,
        &etcd,
        "a",
        "192.168.100.11",
        &["--subnet-lease-ttl", "6"],
    );
    let subnet = a.subnet(T);
    let env = std::fs::read_to_string(&a.subnet_file).unwrap();
    assert_eq!(
        env,
        format!("FLANNEL_NETWORK=10.5.0.0/16\nFLANNEL_SUBNET={subnet}\nFLANNEL_MTU=1500\nFLANNEL_IPMASQ=false\n")
    );
    let key = key_of(&subnet);
    // The value flanneld would write, byte for byte.
    assert_eq!(
        etcd.get(&node, &format!("{PREFIX}/subnets/{key}"))
            .as_deref(),
        Some(r#"{"PublicIP":"192.168.100.11","PublicIPv6":null,"BackendType":"alloc"}"#)
    );
    // A TTL of 6 s is renewed every 4 s: after 10 s it is still there.
    a.wait_log(&format!("renewed lease {key}"), T);
    std::thread::sleep(Duration::from_secs(5));
    assert!(etcd.lease_keys(&node).contains(&key));
    assert!(a.running());

    let mut b = daemon(&node, &etcd, "b", "192.168.100.12", &[]);
    b.wait_log(&format!("lease added: {key} public-ip 192.168.100.11"), T);
    // A dies without a word; etcd expires its lease and B hears of it.
    a.kill();
    b.wait_log(&format!("lease removed: {key}"), T);
    assert!(!etcd.lease_keys(&node).contains(&key));
    assert!(b.running());
}

#[test]
fn ten_daemons_started_at_once_get_distinct_subnets() {
    let node = Node::new("fdt");
    let etcd = Etcd::start(&node);
    // A small range, so that the random picks collide and the losers must choose again.
    etcd.put(
        &node,
        &format!("{PREFIX}/config"),
        r#"{"Network":"10.5.0.0/16","SubnetMin":"10.5.1.0","SubnetMax":"10.5.12.0","Backend":{"Type":"alloc"}}"#,
    );
    let mut daemons: Vec<Daemon> = (0..10)
        .map(|i| {
            daemon(
                &node,
                &etcd,
                &format!("d{i}"),
                &format!("192.168.100.{}", 20 + i),
                &[],
            )
        })
        .collect();
    let subnets: HashSet<String> = daemons.iter().map(|d| d.subnet(T)).collect();
    assert_eq!(subnets.len(), 10, "{subnets:?}");
    let keys: HashSet<String> = etcd.lease_keys(&node).into_iter().collect();
    assert_eq!(keys, subnets.iter().map(|s| key_of(s)).collect());
    // Everyone hears of everyone else.
    for d in &daemons {
        for s in &subnets {
            if d.subnet(T) != *s {
                d.wait_log(&format!("lease added: {}", key_of(s)), T);
            }
        }
    }
    for d in &mut daemons {
        assert!(d.running(), "a daemon exited:\n{}", d.log_text());
    }
}

/// A key names both families, so two nodes can choose different keys that share one subnet:
/// creating a lease must fail when another was created since the listing it was chosen from.
#[test]
fn ten_dual_stack_daemons_started_at_once_share_no_subnet_of_either_family() {
    let node = Node::new("fdx");
    node.ns
        .ip(&["addr", "add", "fd00::1/64", "dev", "eth0", "nodad"]);
    let etcd = Etcd::start(&node);
    // Large IPv4 and small IPv6 ranges (and the reverse), so that the random picks of one
    // family collide while the keys differ by the other.
    let configs = [
        r#"{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fc00:5::/60","Backend":{"Type":"alloc"}}"#,
        r#"{"Network":"10.5.0.0/16","SubnetMin":"10.5.1.0","SubnetMax":"10.5.12.0","EnableIPv6":true,"IPv6Network":"fc00:5::/48","Backend":{"Type":"alloc"}}"#,
    ];
    for (round, config) in configs.iter().enumerate() {
        etcd.delete_prefix(&node, &format!("{PREFIX}/subnets/"));
        etcd.put(&node, &format!("{PREFIX}/config"), config);
        let mut daemons: Vec<Daemon> = (0..10)
            .map(|i| {
                daemon(
                    &node,
                    &etcd,
                    &format!("x{round}-{i}"),
                    &format!("192.168.100.{}", 20 + i),
                    &["--public-ipv6", &format!("fd00::{}", 20 + i)],
                )
            })
            .collect();
        let mut v4 = HashSet::new();
        let mut v6 = HashSet::new();
        for d in &daemons {
            v4.insert(d.subnet(T));
            let env = std::fs::read_to_string(&d.subnet_file).unwrap_or_default();
            let six = env
                .lines()
                .find_map(|l| l.strip_prefix("FLANNEL_IPV6_SUBNET="))
                .unwrap_or_else(|| panic!("no FLANNEL_IPV6_SUBNET in {env}"));
            v6.insert(six.to_string());
        }
        assert_eq!((v4.len(), v6.len()), (10, 10), "{config}: {v4:?} {v6:?}");
        assert_eq!(etcd.lease_keys(&node).len(), 10, "{config}");
        for d in &mut daemons {
            assert!(d.running(), "a daemon exited:\n{}", d.log_text());
        }
    }
}

/// Every lease lost at once (etcd restored from an old backup, or wiped): ten dual-stack
/// daemons starting together each take back the subnets of their subnet.env, and none has to
/// choose again, since the leases created meanwhile share no subnet with its own.
#[test]
fn ten_dual_stack_daemons_that_lost_their_leases_take_them_back_without_choosing_again() {
    let node = Node::new("fdl");
    node.ns
        .ip(&["addr", "add", "fd00::1/64", "dev", "eth0", "nodad"]);
    let etcd = Etcd::start(&node);
    etcd.put(
        &node,
        &format!("{PREFIX}/config"),
        r#"{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fc00:5::/48","Backend":{"Type":"alloc"}}"#,
    );
    let start = |i: usize| {
        daemon(
            &node,
            &etcd,
            &format!("l{i}"),
            &format!("192.168.100.{}", 20 + i),
            &["--public-ipv6", &format!("fd00::{}", 20 + i)],
        )
    };
    let mut first: Vec<Daemon> = (0..10).map(start).collect();
    let keys: Vec<String> = first
        .iter()
        .map(|d| {
            d.wait_log("leased subnet", T);
            let line = d.log_text();
            let at = line.find("leased subnet ").unwrap_or(0) + "leased subnet ".len();
            line[at..]
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    for d in &mut first {
        d.stop();
    }
    etcd.delete_prefix(&node, &format!("{PREFIX}/subnets/"));
    let mut again: Vec<Daemon> = (0..10).map(start).collect();
    for (d, key) in again.iter_mut().zip(&keys) {
        d.wait_log(&format!("leased subnet {key} "), T);
        assert!(!d.log_text().contains("choosing again"), "{}", d.log_text());
        assert!(d.running(), "a daemon exited:\n{}", d.log_text());
    }
    let mut held = etcd.lease_keys(&node);
    held.sort();
    let mut want = keys.clone();
    want.sort();
    assert_eq!(held, want);
}

#[test]
fn leases_written_as_flanneld_writes_them_are_nodes_and_bad_ones_are_skipped() {
    let node = Node::new("fdf");
    let etcd = Etcd::start(&node);
    config(&node, &etcd);
    let mut a = daemon(&node, &etcd, "a", "192.168.100.11", &[]);
    a.subnet(T);
    let flanneld = r#"{"PublicIP":"192.168.64.3","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"c6:d2:32:6f:8f:44"}}"#;
    etcd.put(&node, &format!("{PREFIX}/subnets/10.5.200.0-24"), flanneld);
    a.wait_log(
        "lease added: 10.5.200.0-24 public-ip 192.168.64.3 backend vxlan",
        T,
    );
    // Garbage: a value that is not JSON, a key that is not a subnet.
    etcd.put(
        &node,
        &format!("{PREFIX}/subnets/10.5.201.0-24"),
        "{not json",
    );
    etcd.put(&node, &format!("{PREFIX}/subnets/banana"), flanneld);
    a.wait_log("skipping lease 10.5.201.0-24", T);
    a.wait_log("skipping lease banana", T);
    // The rest is still served.
    etcd.put(
        &node,
        &format!("{PREFIX}/subnets/10.5.202.0-24&fc00:0:0:1::-64"),
        r#"{"PublicIP":"192.168.64.4","PublicIPv6":"fd00::4","BackendType":"vxlan"}"#,
    );
    a.wait_log(
        "lease added: 10.5.202.0-24&fc00:0:0:1::-64 public-ip 192.168.64.4",
        T,
    );
    etcd.ctl_ok(&node, &["del", &format!("{PREFIX}/subnets/10.5.200.0-24")]);
    a.wait_log("lease removed: 10.5.200.0-24", T);
    assert!(a.running());
}

/// A transaction putting the leases of subnets 10.5.`from`.0 to 10.5.`to - 1`.0, each value
/// padded with 50 KB that flanneld ignores (an unknown field), so that 100 leases weigh what
/// 30,000 real ones do.
fn padded_leases(from: usize, to: usize) -> String {
    let pad = "x".repeat(50_000);
    let mut txn = String::from("\n");
    for i in from..to {
        let value = format!(
            r#"{{"PublicIP":"192.168.64.{i}","PublicIPv6":null,"BackendType":"alloc","Pad":"{pad}"}}"#
        );
        txn.push_str(&format!("put {PREFIX}/subnets/10.5.{i}.0-24 {value:?}\n"));
    }
    txn.push_str("\n\n");
    txn
}

#[test]
fn a_listing_over_4_mib_is_read() {
    let node = Node::new("fdp");
    let etcd = Etcd::start(&node);
    config(&node, &etcd);
    // 5 MB of leases before the daemon starts (etcdctl sends at most 2 MiB at once): the
    // daemon's listing is one answer of that size, over the gRPC library's default 4 MiB.
    for from in (1..101).step_by(25) {
        etcd.txn(&node, &padded_leases(from, from + 25));
    }
    let mut a = daemon(&node, &etcd, "a", "192.168.100.11", &[]);
    a.subnet(T);
    a.wait_log("lease added: 10.5.100.0-24", T);
    let log = a.log_text();
    assert!(!log.contains("too large"), "{log}");
    assert!(a.running());
}

#[test]
fn a_restart_keeps_the_subnet_and_sigterm_leaves_the_lease() {
    let node = Node::new("fdr");
    let etcd = Etcd::start(&node);
    config(&node, &etcd);
    let mut a = daemon(&node, &etcd, "a", "192.168.100.11", &[]);
    let subnet = a.subnet(T);
    assert_eq!(a.stop().code(), Some(0));
    assert!(etcd.lease_keys(&node).contains(&key_of(&subnet)));
    // Same node again: its lease is found by its public address.
    std::fs::remove_file(&a.subnet_file).unwrap();
    let mut a = daemon(&node, &etcd, "a", "192.168.100.11", &[]);
    assert_eq!(a.subnet(T), subnet);
    a.wait_log("leased subnet", T);
    assert_eq!(etcd.lease_keys(&node), vec![key_of(&subnet)]);
    // A lease lost meanwhile: the old subnet.env brings the same subnet back.
    assert_eq!(a.stop().code(), Some(0));
    etcd.ctl_ok(&node, &["del", "--prefix", &format!("{PREFIX}/subnets/")]);
    let a = daemon(&node, &etcd, "a", "192.168.100.11", &[]);
    a.wait_log("leased subnet", T);
    assert_eq!(etcd.lease_keys(&node), vec![key_of(&subnet)]);
}

#[test]
fn etcd_down_for_30_seconds_the_daemon_rides_it_out() {
    let node = Node::new("fdo");
    let mut etcd = Etcd::start(&node);
    config(&node, &etcd);
    let mut a = daemon(&node, &etcd, "a", "192.168.100.11", &[]);
    let subnet = a.subnet(T);
    let cpu = a.cpu_time();
    etcd.stop();
    std::thread::sleep(Duration::from_secs(30));
    assert!(a.running(), "flanneld died with etcd:\n{}", a.log_text());
    // No busy retry loop while etcd is away (flannel-io/flannel#2171).
    let spent = a.cpu_time() - cpu;
    assert!(
        spent < Duration::from_secs(1),
        "{spent:?} of CPU over the outage"
    );
    etcd.resume(&node);
    etcd.put(
        &node,
        &format!("{PREFIX}/subnets/10.5.250.0-24"),
        r#"{"PublicIP":"192.168.100.99","PublicIPv6":null,"BackendType":"vxlan"}"#,
    );
    a.wait_log("lease added: 10.5.250.0-24", Duration::from_secs(60));
    assert!(a.running());
    assert!(etcd.lease_keys(&node).contains(&key_of(&subnet)));
    assert_eq!(a.subnet(T), subnet);
}

#[test]
fn this_nodes_lease_deleted_by_someone_else_ends_the_daemon_with_a_message() {
    let node = Node::new("fdd");
    let etcd = Etcd::start(&node);
    config(&node, &etcd);
    let mut a = daemon(&node, &etcd, "a", "192.168.100.11", &[]);
    let key = key_of(&a.subnet(T));
    a.wait_log("leased subnet", T);
    etcd.ctl_ok(&node, &["del", &format!("{PREFIX}/subnets/{key}")]);
    assert_eq!(a.wait_exit(T).code(), Some(1));
    assert!(a
        .log_text()
        .contains(&format!("this node's lease {key} was removed")));
}

#[test]
fn tls_with_client_certificates() {
    let node = Node::new("fds");
    let tls = make_certs(node.dir.path());
    let etcd = Etcd::start_with(&node, Some(tls.clone()), &[]);
    config(&node, &etcd);
    let (ca, cert, key) = (
        tls.ca.display().to_string(),
        tls.client_cert.display().to_string(),
        tls.client_key.display().to_string(),
    );
    let a = daemon(
        &node,
        &etcd,
        "a",
        "192.168.100.11",
        &[
            "--etcd-cafile",
            &ca,
            "--etcd-certfile",
            &cert,
            "--etcd-keyfile",
            &key,
        ],
    );
    let subnet = a.subnet(T);
    assert!(etcd.lease_keys(&node).contains(&key_of(&subnet)));
    // Without a client certificate etcd refuses it: no lease, no subnet.env, still running.
    let mut b = daemon(&node, &etcd, "b", "192.168.100.12", &["--etcd-cafile", &ca]);
    b.wait_log("no client certificate", T);
    assert!(b.running());
    assert!(!b.subnet_file.exists());
    assert_eq!(etcd.lease_keys(&node).len(), 1);
}

#[test]
fn user_and_password() {
    let node = Node::new("fdu");
    let etcd = Etcd::start(&node);
    config(&node, &etcd);
    etcd.ctl_ok(&node, &["user", "add", "root:s3cret"]);
    etcd.ctl_ok(&node, &["user", "grant-role", "root", "root"]);
    etcd.ctl_ok(&node, &["auth", "enable"]);
    // The password from the environment, as a unit file would pass it.
    let a = Daemon::start(
        &node,
        "a2",
        &[
            "--etcd-endpoints",
            &etcd.client_url,
            "--iface",
            "eth0",
            "--etcd-username",
            "root",
        ],
        &[("FLANNELD_ETCD_PASSWORD", "s3cret")],
    );
    let subnet = a.subnet(T);
    let keys = etcd.ctl_ok(
        &node,
        &[
            "--user",
            "root:s3cret",
            "get",
            "--keys-only",
            "--prefix",
            &format!("{PREFIX}/subnets/"),
        ],
    );
    assert!(keys.contains(&key_of(&subnet)), "{keys}");
}

#[test]
fn an_unreachable_etcd_at_start_is_waited_for() {
    let node = Node::new("fdw");
    // Each try to connect is a SYN to port 2379, counted here.
    node.ns.run(
        "nft",
        &["add table inet tries; add chain inet tries out { type filter hook output priority 0 ; } ; \
           add rule inet tries out tcp dport 2379 counter"],
    );
    let tries = || {
        let out = node
            .ns
            .run("nft", &["list", "chain", "inet", "tries", "out"]);
        out.split("packets ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // Nothing listens yet.
    let a = Daemon::start(
        &node,
        "a",
        &[
            "--etcd-endpoints",
            "http://127.0.0.1:2379",
            "--iface",
            "eth0",
        ],
        &[],
    );
    a.wait_log("connection refused at 127.0.0.1:2379", T);
    // Retried, and logged once, in the daemon's words only.
    let logged = tries();
    wait_for("three more tries after the first warning", T, || {
        (tries() >= logged + 3).then_some(())
    });
    let log = a.log_text();
    assert_eq!(
        log.matches("connection refused at 127.0.0.1:2379 (--etcd-endpoints)")
            .count(),
        1,
        "{log}"
    );
    assert!(!log.contains("ERROR") && !log.contains("source:"), "{log}");
    let mut a = a;
    assert!(a.running());
    let etcd = Etcd::start(&node);
    a.wait_log("no network config yet at /coreos.com/network/config", T);
    config(&node, &etcd);
    let subnet = a.subnet(T);
    assert!(etcd.lease_keys(&node).contains(&key_of(&subnet)));
}

#[test]
fn a_malformed_network_config_ends_the_start_with_status_2_naming_the_key() {
    let node = Node::new("fdm");
    let etcd = Etcd::start(&node);
    etcd.put(
        &node,
        &format!("{PREFIX}/config"),
        r#"{"Network":"10.5.0.0/16","SubnetLen":31}"#,
    );
    let mut a = daemon(&node, &etcd, "a", "192.168.100.11", &[]);
    assert_eq!(a.wait_exit(T).code(), Some(2));
    let log = a.log_text();
    assert!(
        log.contains("SubnetLen 31") && log.contains("/coreos.com/network/config"),
        "{log}"
    );
    assert!(etcd.lease_keys(&node).is_empty());
}

/// What reading the network config with `opts` fails with, from inside `node`.
fn registry_error(node: &Node, opts: flanneld::registry::etcd::EtcdOptions) -> String {
    use flanneld::registry::etcd::EtcdRegistry;
    use flanneld::registry::Registry;
    node.ns.run_inside(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        rt.block_on(async {
            match EtcdRegistry::connect(opts).await {
                Ok(reg) => match reg.config().await {
                    Ok(v) => panic!("the network config was read: {v:?}"),
                    Err(e) => e.to_string(),
                },
                Err(e) => e.to_string(),
            }
        })
    })
}

/// Options for etcd at `url` with `tls`'s CA and, if `client`, its client certificate.
fn tls_options(
    url: &str,
    ca: &std::path::Path,
    tls: &Tls,
    client: bool,
) -> flanneld::registry::etcd::EtcdOptions {
    flanneld::registry::etcd::EtcdOptions {
        endpoints: vec![url.to_string()],
        prefix: PREFIX.to_string(),
        cafile: Some(ca.to_path_buf()),
        certfile: client.then(|| tls.client_cert.clone()),
        keyfile: client.then(|| tls.client_key.clone()),
        ..Default::default()
    }
}

#[test]
fn a_certificate_not_signed_by_the_etcd_cafile_is_named_so() {
    let node = Node::new("fcc");
    let tls = make_certs(node.dir.path());
    let _etcd = Etcd::start_with(&node, Some(tls.clone()), &[]);
    let other = node.path("other");
    std::fs::create_dir(&other).unwrap();
    let wrong = make_certs(&other);
    let e = registry_error(
        &node,
        tls_options("https://127.0.0.1:2379", &wrong.ca, &tls, true),
    );
    assert!(
        e.contains(&format!(
            "presents a certificate that is not signed by the CA in --etcd-cafile {}",
            wrong.ca.display()
        )),
        "{e}"
    );
}

#[test]
fn a_name_etcds_certificate_lacks_is_named_so() {
    let node = Node::new("fcn");
    let tls = make_certs(node.dir.path());
    // Its certificate is for 127.0.0.1 and localhost; the node reaches it at 127.0.0.2.
    let _etcd = Etcd::start_with(
        &node,
        Some(tls.clone()),
        &["--listen-client-urls", "https://0.0.0.0:2379"],
    );
    let e = registry_error(
        &node,
        tls_options("https://127.0.0.2:2379", &tls.ca, &tls, true),
    );
    assert!(
        e.contains("is not valid for the name 127.0.0.2 it is reached by (--etcd-endpoints); it is valid for 127.0.0.1, localhost"),
        "{e}"
    );
}

#[test]
fn a_missing_client_certificate_is_named_so() {
    let node = Node::new("fcm");
    let tls = make_certs(node.dir.path());
    let _etcd = Etcd::start_with(&node, Some(tls.clone()), &[]);
    let e = registry_error(
        &node,
        tls_options("https://127.0.0.1:2379", &tls.ca, &tls, false),
    );
    assert!(
        e.contains(
            "closed the connection; this node offers no client certificate (no --etcd-certfile)"
        ),
        "{e}"
    );
}

#[test]
fn a_refused_connection_to_etcd_names_the_address() {
    let node = Node::new("fcr");
    let e = registry_error(
        &node,
        flanneld::registry::etcd::EtcdOptions {
            endpoints: vec!["http://127.0.0.1:2391".into()],
            prefix: PREFIX.to_string(),
            ..Default::default()
        },
    );
    assert!(
        e.contains(
            "connection refused at 127.0.0.1:2391 (--etcd-endpoints): nothing listens there"
        ),
        "{e}"
    );
}

#[test]
fn a_refused_user_names_the_flags_it_came_from() {
    let node = Node::new("fcu");
    let etcd = Etcd::start(&node);
    etcd.ctl_ok(&node, &["user", "add", "root:s3cret"]);
    etcd.ctl_ok(&node, &["user", "grant-role", "root", "root"]);
    etcd.ctl_ok(&node, &["auth", "enable"]);
    let e = registry_error(
        &node,
        flanneld::registry::etcd::EtcdOptions {
            endpoints: vec![etcd.client_url.clone()],
            prefix: PREFIX.to_string(),
            username: Some("root".into()),
            password: Some("wrong".into()),
            ..Default::default()
        },
    );
    assert!(
        e.contains(r#"refuses the user "root" of --etcd-username with the password of --etcd-password (or FLANNELD_ETCD_PASSWORD)"#),
        "{e}"
    );
}

/// A member that takes connections and answers nothing, as a restarted etcd member does until
/// its quorum lets it publish itself (the client counts it ready all the same): each request
/// that tries it goes on to the member that answers within a fraction of a second, and the
/// next ones go there first. Both orders of the endpoints, so that one registry starts with the
/// silent member whichever it starts with.
#[test]
fn a_member_that_takes_connections_and_never_answers_is_left_within_a_second() {
    use flanneld::registry::etcd::{EtcdOptions, EtcdRegistry};
    use flanneld::registry::Registry;
    let node = Node::new("fcs");
    let etcd = Etcd::start(&node);
    config(&node, &etcd);
    let silent_url = "http://127.0.0.1:2391";
    // Listening, never accepting: the kernel completes each connection and keeps what is sent.
    let silent = node
        .ns
        .run_inside(|| std::net::TcpListener::bind("127.0.0.1:2391"))
        .expect("a listener on 127.0.0.1:2391");
    let orders = [
        vec![silent_url.to_string(), etcd.client_url.clone()],
        vec![etcd.client_url.clone(), silent_url.to_string()],
    ];
    for endpoints in orders {
        let slowest = node.ns.run_inside(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a tokio runtime");
            rt.block_on(async {
                let opts = EtcdOptions {
                    endpoints: endpoints.clone(),
                    prefix: PREFIX.to_string(),
                    ..Default::default()
                };
                let reg = EtcdRegistry::connect(opts).await.expect("the registry");
                let mut slowest = Duration::ZERO;
                for _ in 0..10 {
                    let t = std::time::Instant::now();
                    let config = reg.config().await.expect("the network config");
                    assert_eq!(config.as_deref(), Some(CONFIG.as_bytes()));
                    reg.list().await.expect("the leases");
                    slowest = slowest.max(t.elapsed());
                }
                slowest
            })
        });
        assert!(
            slowest < Duration::from_secs(1),
            "with endpoints {endpoints:?}, a config read and a listing took {slowest:?}"
        );
    }
    drop(silent);
}
