//! DEL and CHECK over the life of several containers: DEL needs no prevResult and removes
//! exactly one container's rules, repeated DEL succeeds, CHECK fails when a mapping's rules are
//! gone, and concurrent ADDs share the shared chains without duplicating them.

mod common;

use common::*;
use serde_json::json;

/// The firewall listing without what traffic and time change: comments with timestamps and
/// packet counters.
fn stable(listing: &str) -> String {
    listing
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let l = match l.starts_with(':') {
                true => l.split(" [").next().unwrap_or(l),
                false => l,
            };
            match l.find("counter packets ") {
                Some(at) => {
                    let rest = &l[at..];
                    let end = rest.find(" bytes ").map(|b| {
                        let after = &rest[b + 7..];
                        b + 7 + after.find(' ').unwrap_or(after.len())
                    });
                    format!("{}counter{}", &l[..at], &rest[end.unwrap_or(rest.len())..])
                }
                None => l.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The nat tables as iptables-save prints them and the cni_hostport tables as nft does:
/// one rule a line, each naming its chain or carrying its container's comment.
fn rules(node: &Node) -> String {
    node.nat(false) + &node.nat(true) + &node.hostport_table("ip") + &node.hostport_table("ip6")
}

fn del_config(backend: &str) -> serde_json::Value {
    portmap_config("1.0.0", json!({"backend": backend}), web_and_dns(), None)
}

#[test]
fn del_removes_one_container_and_leaves_the_others_and_the_shared_chains() {
    for backend in ["iptables", "nftables"] {
        let node = Node::new();
        let mut first = node.pod(true);
        let mut second = node.pod(true);
        first.serve();
        second.serve();
        let options = json!({"backend": backend});
        let other_ports = json!([
            {"hostPort": 9080, "containerPort": 80, "protocol": "tcp"},
            {"hostPort": 9053, "containerPort": 53, "protocol": "udp"},
        ]);
        let second_conf =
            portmap_config("1.0.0", options.clone(), other_ports, Some(&second.result));
        node.portmap(
            "ADD",
            &first,
            &portmap_config("1.0.0", options, web_and_dns(), Some(&first.result)),
        )
        .ok();
        node.portmap("ADD", &second, &second_conf).ok();
        let before = stable(&rules(&node));

        node.portmap("DEL", &first, &del_config(backend)).ok();
        let after = stable(&rules(&node));
        assert!(!after.contains(&first.id), "{backend}:\n{after}");
        // Every line that did not name the first container is still there.
        let first_chain = cni_portmap::names::dnat_chain(NETWORK, &first.id);
        for line in before.lines() {
            if line.contains(&first.id) || line.contains(&first_chain) {
                continue;
            }
            assert!(
                after.contains(line),
                "{backend}: DEL took {line:?} too:\n{after}"
            );
        }
        for host in [HOST_V4, HOST_V6] {
            assert!(!reaches(&node.client, Proto::Tcp, host, HTTP), "{backend}");
            assert!(reaches(&node.client, Proto::Tcp, host, 9080), "{backend}");
            assert!(reaches(&node.client, Proto::Udp, host, 9053), "{backend}");
        }
        node.portmap("CHECK", &second, &second_conf).ok();

        node.portmap("DEL", &first, &del_config(backend)).ok();
        assert_eq!(
            stable(&rules(&node)),
            after,
            "{backend}: a repeated DEL changes nothing"
        );
        node.portmap("DEL", &second, &del_config(backend)).ok();
        assert!(!node.firewall().contains(&second.id));
    }
}

/// A DEL whose config cannot be used (mappings of the wrong type, an unknown backend) still
/// removes the container's rules, found by network name and container ID in both backends,
/// and succeeds so that the runtime goes on to DEL the rest of the chain.
#[test]
fn del_with_an_unusable_config_removes_the_containers_rules() {
    let unusable = [
        portmap_config(
            "1.0.0",
            json!({}),
            json!([{"hostPort": "eighty", "containerPort": null}]),
            None,
        ),
        portmap_config("1.0.0", json!({"backend": "ebpf"}), json!("junk"), None),
    ];
    for backend in ["iptables", "nftables"] {
        let node = Node::new();
        let pod = node.pod(true);
        let added = portmap_config(
            "1.0.0",
            json!({"backend": backend}),
            web_and_dns(),
            Some(&pod.result),
        );
        for del in &unusable {
            node.portmap("ADD", &pod, &added).ok();
            assert!(node.firewall().contains(&pod.id), "{backend}");
            node.portmap("DEL", &pod, del).ok();
            let left = node.firewall();
            assert!(!left.contains(&pod.id), "{backend}: {del}\n{left}");
        }
    }
}

#[test]
fn del_of_a_container_never_added_succeeds() {
    let node = Node::new();
    let pod = node.pod(false);
    for backend in ["iptables", "nftables"] {
        node.portmap("DEL", &pod, &del_config(backend)).ok();
    }
    // Also with no network namespace any more, as after a node reboot.
    let conf = del_config("iptables");
    testkit::Invocation::new("portmap", "DEL")
        .container_id(&pod.id)
        .netns("/var/run/netns/gone-long-ago")
        .run_in_ns(&node.host, &conf)
        .ok();
}

#[test]
fn check_fails_when_a_mappings_rule_is_missing() {
    let node = Node::new();
    let pod = node.pod(true);
    // iptables: take the UDP DNAT rule out of the container's chain.
    let conf = portmap_config("1.0.0", json!({}), web_and_dns(), Some(&pod.result));
    node.portmap("ADD", &pod, &conf).ok();
    node.portmap("CHECK", &pod, &conf).ok();
    let chain = cni_portmap::names::dnat_chain(NETWORK, &pod.id);
    let target = format!("{}:53", pod.ip(false));
    node.host.run(
        "iptables",
        &[
            "-t",
            "nat",
            "-D",
            &chain,
            "-p",
            "udp",
            "--dport",
            "5353",
            "-j",
            "DNAT",
            "--to-destination",
            &target,
        ],
    );
    let out = node.portmap("CHECK", &pod, &conf);
    assert_eq!(out.code, 1);
    assert!(out.msg().contains("hostPort 5353"), "{}", out.msg());
    node.portmap("DEL", &pod, &conf).ok();
    let out = node.portmap("CHECK", &pod, &conf);
    assert_eq!(out.code, 1, "CHECK after DEL: {}", out.stdout);

    // nftables: take the TCP dnat rule out of the IPv6 table.
    let conf = portmap_config(
        "1.0.0",
        json!({"backend": "nftables"}),
        web_and_dns(),
        Some(&pod.result),
    );
    node.portmap("ADD", &pod, &conf).ok();
    node.portmap("CHECK", &pod, &conf).ok();
    let listing = node.host.run(
        "nft",
        &["-a", "list", "chain", "ip6", "cni_hostport", "hostports"],
    );
    let handle = listing
        .lines()
        .find(|l| l.contains("tcp dport 8080 dnat"))
        .and_then(|l| l.rsplit("handle ").next())
        .unwrap()
        .trim()
        .to_string();
    node.host.run(
        "nft",
        &[
            "delete",
            "rule",
            "ip6",
            "cni_hostport",
            "hostports",
            "handle",
            &handle,
        ],
    );
    let out = node.portmap("CHECK", &pod, &conf);
    assert_eq!(out.code, 1);
    assert!(
        out.msg().contains("hostPort 8080") && out.msg().contains("ip6"),
        "{}",
        out.msg()
    );
    node.portmap("DEL", &pod, &conf).ok();
    assert!(!node.firewall().contains(&pod.id));
}

#[test]
fn a_second_add_of_the_same_container_replaces_its_rules() {
    for backend in ["iptables", "nftables"] {
        let node = Node::new();
        let mut pod = node.pod(false);
        pod.serve();
        let first = json!([{"hostPort": 7070, "containerPort": 80, "protocol": "tcp"}]);
        let options = json!({"backend": backend});
        node.portmap(
            "ADD",
            &pod,
            &portmap_config("1.0.0", options.clone(), first, Some(&pod.result)),
        )
        .ok();
        let conf = portmap_config("1.0.0", options, web_and_dns(), Some(&pod.result));
        node.portmap("ADD", &pod, &conf).ok();
        assert!(
            !reaches(&node.client, Proto::Tcp, HOST_V4, 7070),
            "{backend}"
        );
        assert!(
            reaches(&node.client, Proto::Tcp, HOST_V4, HTTP),
            "{backend}"
        );
        let rules = node.firewall();
        assert!(!rules.contains("7070"), "{backend}:\n{rules}");
        node.portmap("CHECK", &pod, &conf).ok();
    }
}

#[test]
fn concurrent_adds_share_the_shared_chains_once() {
    let node = Node::new();
    let pods: Vec<Pod> = (0..6).map(|_| node.pod(false)).collect();
    std::thread::scope(|s| {
        for (i, pod) in pods.iter().enumerate() {
            let node = &node;
            s.spawn(move || {
                let port = 10000 + i as u64;
                let conf = portmap_config(
                    "1.0.0",
                    json!({}),
                    json!([{"hostPort": port, "containerPort": 80, "protocol": "tcp"}]),
                    Some(&pod.result),
                );
                node.portmap("ADD", pod, &conf).ok();
            });
        }
    });
    let nat = node.nat(false);
    for shared in [
        "-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT",
        "-A OUTPUT -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT",
        "-A POSTROUTING -m comment --comment \"CNI portfwd requiring masquerade\" -j CNI-HOSTPORT-MASQ",
        "-A CNI-HOSTPORT-MASQ -m mark --mark 0x2000/0x2000 -j MASQUERADE",
    ] {
        assert_eq!(nat.matches(shared).count(), 1, "{shared}\n{nat}");
    }
    for pod in &pods {
        assert!(nat.contains(&cni_portmap::names::dnat_chain(NETWORK, &pod.id)));
    }
}
