//! The table in a real kernel (a namespace of its own): what the enforcer writes reads back
//! as written, so that a look with nothing changed writes nothing; what is changed by hand
//! (a rule, an element, a jump, a whole chain's rules, the table) comes back with one
//! transaction; a change of policy is one transaction that leaves the rest as it was.

use flannel_netpol::compile::{compile, Compiled};
use flannel_netpol::model::{NetworkPolicy, Pod};
use flannel_netpol::nft::{desired, transaction, TABLE};
use flannel_netpol::objects::Objects;
use flannel_netpol::{kernel, nft};
use serde_json::json;
use testkit::TestNs;

/// Pods x/a and x/b on this node, y/a elsewhere, dual-stack; x/a isolated both ways.
fn objects() -> Objects {
    let mut o = Objects::default();
    for (i, (ns, name, node)) in [("x", "a", "n1"), ("x", "b", "n1"), ("y", "a", "n2")]
        .into_iter()
        .enumerate()
    {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns, "uid": format!("0000-{i}"), "labels": {"pod": name}},
            "spec": {"nodeName": node, "containers": [{"ports": [{"name": "http", "containerPort": 8080}]}]},
            "status": {"phase": "Running", "podIPs": [{"ip": format!("10.7.0.{}", i + 2)}, {"ip": format!("fd07::{}", i + 2)}]}
        }))
        .unwrap();
        o.pods.insert((ns.into(), name.into()), pod);
    }
    let policy: NetworkPolicy = serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "x"},
        "spec": {"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}},
                                  {"ipBlock": {"cidr": "192.168.0.0/16", "except": ["192.168.7.0/24"]}}],
                         "ports": [{"port": "http"}, {"port": 9000, "endPort": 9100, "protocol": "UDP"}]}],
            "egress": [{}]}
    }))
    .unwrap();
    o.policies.insert(("x".into(), "p".into()), policy);
    o
}

fn compiled(o: &Objects) -> Compiled {
    compile(o, "n1")
}

fn read(ns: &TestNs) -> Option<nft::Listing> {
    ns.run_inside(kernel::read).unwrap()
}

fn write(ns: &TestNs, tx: &str) {
    ns.run_inside(|| kernel::write(tx)).unwrap();
}

#[test]
fn the_table_reads_back_as_written_and_comes_back_when_changed_by_hand() {
    let ns = TestNs::new("nptab");
    let want = desired(&compiled(&objects()));
    assert!(read(&ns).is_none(), "no table before the first write");
    write(&ns, &transaction(&want, None).unwrap());
    let have = read(&ns).unwrap();
    assert_eq!(
        transaction(&want, Some(&have.table)),
        None,
        "{:#?}",
        have.table
    );
    assert_eq!(have.table, {
        // Read back, a rule is its comment only.
        let mut t = want.clone();
        for c in t.chains.values_mut() {
            for r in &mut c.rules {
                r.text.clear();
            }
        }
        t
    });

    // By hand: a rule deleted, an element deleted, a jump deleted, a foreign rule added.
    let listing = ns.run(
        "nft",
        &["-a", "list", "chain", "inet", TABLE, "postrouting"],
    );
    let handle = listing
        .lines()
        .find(|l| l.contains("fib saddr type local"))
        .and_then(|l| l.rsplit("handle ").next())
        .unwrap()
        .trim()
        .to_string();
    ns.run(
        "nft",
        &[
            "delete",
            "rule",
            "inet",
            TABLE,
            "postrouting",
            "handle",
            &handle,
        ],
    );
    ns.run("nft", &["add", "rule", "inet", TABLE, "input", "accept"]);
    let set = desired(&compiled(&objects()))
        .sets
        .into_keys()
        .find(|s| s.starts_with("ingress4-0000-0-"))
        .unwrap();
    ns.run("nft", &["flush", "set", "inet", TABLE, &set]);
    ns.run(
        "nft",
        &[
            "delete", "element", "inet", TABLE, "egress6", "{", "fd07::2", "}",
        ],
    );
    let have = read(&ns).unwrap();
    let tx = transaction(&want, Some(&have.table)).expect("something to repair");
    write(&ns, &tx);
    assert_eq!(
        transaction(&want, Some(&read(&ns).unwrap().table)),
        None,
        "after {tx}"
    );

    // A base chain's priority changed, then the table deleted: written afresh each time.
    ns.run("nft", &["delete", "table", "inet", TABLE]);
    ns.run("nft", &["add", "table", "inet", TABLE]);
    ns.run(
        "nft",
        &[
            "add",
            "chain",
            "inet",
            TABLE,
            "input",
            "{ type filter hook input priority 10; }",
        ],
    );
    write(
        &ns,
        &transaction(&want, Some(&read(&ns).unwrap().table)).unwrap(),
    );
    assert_eq!(transaction(&want, Some(&read(&ns).unwrap().table)), None);
}

#[test]
fn a_change_of_policy_is_one_transaction_of_its_difference() {
    let ns = TestNs::new("nptab");
    let mut o = objects();
    let before = desired(&compiled(&o));
    write(&ns, &transaction(&before, None).unwrap());
    // The port range moves, x/b becomes isolated, x/b's address changes (a peer of x/a).
    let p = o
        .policies
        .get_mut(&("x".to_string(), "p".to_string()))
        .unwrap();
    p.spec.ingress[0].ports[1].end_port = Some(9200);
    p.spec.pod_selector.match_labels.clear();
    let xb = o.pods.get_mut(&("x".to_string(), "b".to_string())).unwrap();
    xb.status.pod_ips[0].ip = "10.7.0.99".into();
    let after = desired(&compiled(&o));
    let tx = transaction(&after, Some(&read(&ns).unwrap().table)).unwrap();
    assert!(
        !tx.contains("delete table") && !tx.contains("flush chain inet flannel-netpol postrouting"),
        "{tx}"
    );
    write(&ns, &tx);
    assert_eq!(
        transaction(&after, Some(&read(&ns).unwrap().table)),
        None,
        "after {tx}"
    );
    // Back again.
    let tx = transaction(&before, Some(&read(&ns).unwrap().table)).unwrap();
    write(&ns, &tx);
    assert_eq!(
        transaction(&before, Some(&read(&ns).unwrap().table)),
        None,
        "after {tx}"
    );
}
