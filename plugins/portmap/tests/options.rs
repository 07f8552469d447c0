//! Each option as a user sees it: the rules it leaves in the host's tables and the traffic
//! that does or does not get through.

mod common;

use common::*;
use serde_json::{json, Value};

fn add(node: &Node, pod: &Pod, options: Value, mappings: Value) -> Value {
    let conf = portmap_config("1.0.0", options, mappings, Some(&pod.result));
    node.portmap("ADD", pod, &conf).ok();
    conf
}

fn dn_chain(pod: &Pod) -> String {
    cni_portmap::names::dnat_chain(NETWORK, &pod.id)
}

/// The rules of one chain in iptables-save form, without the `-A <chain> ` prefix.
fn chain_rules(nat: &str, chain: &str) -> Vec<String> {
    let prefix = format!("-A {chain} ");
    nat.lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .map(str::to_string)
        .collect()
}

/// Whether the host's conntrack table holds a source-NATed flow to `port`.
fn client_flow_was_masqueraded(node: &Node, port: u16) -> bool {
    let out = node.host.try_run(
        "conntrack",
        &[
            "-L",
            "-p",
            "tcp",
            "--orig-port-dst",
            &port.to_string(),
            "--src-nat",
        ],
    );
    String::from_utf8_lossy(&out.stdout).contains(&format!("src={CLIENT_V4}"))
}

#[test]
fn snat_off_leaves_out_masquerading_so_only_outside_clients_get_through() {
    for backend in ["iptables", "nftables"] {
        let node = Node::new();
        let mut pod = node.pod(false);
        pod.serve();
        let other = node.pod(false);
        add(
            &node,
            &pod,
            json!({"snat": false, "backend": backend}),
            web_and_dns(),
        );

        if backend == "iptables" {
            let nat = node.nat(false);
            assert!(
                !nat.contains("CNI-HOSTPORT-SETMARK") && !nat.contains("CNI-HOSTPORT-MASQ"),
                "{nat}"
            );
            assert_eq!(
                chain_rules(&nat, &dn_chain(&pod)),
                [
                    format!(
                        "-p tcp -m tcp --dport 8080 -j DNAT --to-destination {}:80",
                        pod.ip(false)
                    ),
                    format!(
                        "-p udp -m udp --dport 5353 -j DNAT --to-destination {}:53",
                        pod.ip(false)
                    ),
                ]
            );
        } else {
            let table = node.hostport_table("ip");
            assert!(
                !table.contains("masquerad") && !table.contains("mark"),
                "{table}"
            );
        }
        assert_eq!(
            node.host
                .sysctl(&format!("net.ipv4.conf.{}.route_localnet", node.bridge)),
            "0",
            "route_localnet is only needed for SNAT"
        );
        assert!(reaches(&node.client, Proto::Tcp, HOST_V4, HTTP));
        assert!(reaches(&node.client, Proto::Udp, HOST_V4, DNS));
        // Without masquerading the pod answers the second pod directly, which drops it.
        assert!(
            !reaches(&other.ns, Proto::Tcp, HOST_V4, HTTP),
            "{backend}: hairpin"
        );
    }
}

#[test]
fn masq_all_masquerades_every_source() {
    for backend in ["iptables", "nftables"] {
        let node = Node::new();
        let mut pod = node.pod(false);
        pod.serve();
        add(
            &node,
            &pod,
            json!({"masqAll": true, "backend": backend}),
            web_and_dns(),
        );
        if backend == "iptables" {
            let rules = chain_rules(&node.nat(false), &dn_chain(&pod));
            assert!(
                rules.contains(&"-p tcp -m tcp --dport 8080 -j CNI-HOSTPORT-SETMARK".to_string()),
                "{rules:?}"
            );
            assert!(!rules.iter().any(|r| r.contains("127.0.0.1")), "{rules:?}");
        }
        assert!(reaches(&node.client, Proto::Tcp, HOST_V4, HTTP));
        assert!(reaches(&node.host, Proto::Tcp, "127.0.0.1", HTTP));
        assert!(
            client_flow_was_masqueraded(&node, HTTP),
            "{backend}: the client's flow is masqueraded"
        );
    }
}

#[test]
fn by_default_outside_clients_keep_their_address() {
    let node = Node::new();
    let mut pod = node.pod(false);
    pod.serve();
    add(&node, &pod, json!({}), web_and_dns());
    assert!(reaches(&node.client, Proto::Tcp, HOST_V4, HTTP));
    assert!(!client_flow_was_masqueraded(&node, HTTP));
}

#[test]
fn mark_masq_bit_sets_the_mark_both_backends_use() {
    let node = Node::new();
    let mut pod = node.pod(false);
    pod.serve();
    let other = node.pod(false);
    add(&node, &pod, json!({"markMasqBit": 5}), web_and_dns());
    let nat = node.nat(false);
    assert_eq!(
        chain_rules(&nat, "CNI-HOSTPORT-SETMARK"),
        ["-m comment --comment \"CNI portfwd masquerade mark\" -j MARK --set-xmark 0x20/0x20"]
    );
    assert_eq!(
        chain_rules(&nat, "CNI-HOSTPORT-MASQ"),
        ["-m mark --mark 0x20/0x20 -j MASQUERADE"]
    );
    assert!(reaches(&other.ns, Proto::Tcp, HOST_V4, HTTP), "hairpin");

    add(
        &node,
        &other,
        json!({"markMasqBit": 31, "backend": "nftables"}),
        json!([{"hostPort": 9090, "containerPort": 80, "protocol": "tcp"}]),
    );
    let table = node.hostport_table("ip");
    assert!(
        table.contains("meta mark set meta mark | 0x80000000"),
        "{table}"
    );
    assert!(
        table.contains("meta mark 0x80000000/1 ip daddr 10.88.0.3 masquerade"),
        "{table}"
    );
}

#[test]
fn mark_masq_bit_out_of_range_is_refused_and_nothing_is_made() {
    let node = Node::new();
    let pod = node.pod(false);
    for bit in [-1, 32] {
        let conf = portmap_config(
            "1.0.0",
            json!({"markMasqBit": bit}),
            web_and_dns(),
            Some(&pod.result),
        );
        let out = node.portmap("ADD", &pod, &conf);
        out.err(7);
        assert!(
            out.msg().contains(&format!("markMasqBit {bit}")),
            "{}",
            out.msg()
        );
    }
    assert!(!node.firewall().contains("CNI-"), "{}", node.firewall());
}

#[test]
fn an_external_set_mark_chain_is_used_instead_of_the_own_ones() {
    let node = Node::new();
    let mut pod = node.pod(false);
    pod.serve();
    let other = node.pod(false);
    // What kube-proxy keeps: a chain that marks, and masquerading of the marked.
    let kube =
        "*nat\n:KUBE-MARK-MASQ - [0:0]\n-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n\
                -A POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE\nCOMMIT\n";
    let mut restore = node
        .host
        .command("iptables-restore")
        .arg("--noflush")
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(restore.stdin.as_mut().unwrap(), kube.as_bytes()).unwrap();
    drop(restore.stdin.take());
    assert!(restore.wait().unwrap().success());

    add(
        &node,
        &pod,
        json!({"externalSetMarkChain": "KUBE-MARK-MASQ"}),
        web_and_dns(),
    );
    let nat = node.nat(false);
    assert!(
        !nat.contains("CNI-HOSTPORT-SETMARK") && !nat.contains("CNI-HOSTPORT-MASQ"),
        "{nat}"
    );
    assert!(chain_rules(&nat, &dn_chain(&pod))
        .contains(&"-s 10.88.0.0/24 -p tcp -m tcp --dport 8080 -j KUBE-MARK-MASQ".to_string()));
    assert!(
        reaches(&other.ns, Proto::Tcp, HOST_V4, HTTP),
        "hairpin through kube's masquerade"
    );
    assert!(
        reaches(&node.host, Proto::Udp, "127.0.0.1", DNS),
        "localhost through kube's masquerade"
    );
}

#[test]
fn an_external_set_mark_chain_is_refused_with_a_mark_bit_or_nftables() {
    let node = Node::new();
    let pod = node.pod(false);
    for (options, want) in [
        (
            json!({"externalSetMarkChain": "KUBE-MARK-MASQ", "markMasqBit": 14}),
            "cannot both be set",
        ),
        (
            json!({"externalSetMarkChain": "KUBE-MARK-MASQ", "backend": "nftables"}),
            "iptables-specific options [externalSetMarkChain]",
        ),
    ] {
        let conf = portmap_config("1.0.0", options, web_and_dns(), Some(&pod.result));
        let out = node.portmap("ADD", &pod, &conf);
        out.err(7);
        assert!(out.msg().contains(want), "{}", out.msg());
    }
    assert!(!node.firewall().contains("CNI-"));
}

#[test]
fn conditions_limit_who_is_forwarded_per_family() {
    for (backend, v4, v6) in [
        (
            "iptables",
            json!(["-s", "192.168.77.0/24"]),
            json!(["-s", "fd77::/64"]),
        ),
        (
            "nftables",
            json!(["ip", "saddr", "192.168.77.0/24"]),
            json!(["ip6", "saddr", "fd77::/64"]),
        ),
    ] {
        let node = Node::new();
        let mut pod = node.pod(true);
        pod.serve();
        let other = node.pod(true);
        let conf = add(
            &node,
            &pod,
            json!({"backend": backend, "conditionsV4": v4, "conditionsV6": v6}),
            web_and_dns(),
        );
        for (host, v6) in [(HOST_V4, false), (HOST_V6, true)] {
            assert!(
                reaches(&node.client, Proto::Tcp, host, HTTP),
                "{backend} v6={v6}: underlay client"
            );
            assert!(
                reaches(&node.client, Proto::Udp, host, DNS),
                "{backend} v6={v6}: underlay client"
            );
            assert!(
                !reaches(&other.ns, Proto::Tcp, host, HTTP),
                "{backend} v6={v6}: a pod is not on the underlay"
            );
        }
        node.portmap("CHECK", &pod, &conf).ok();
    }
}

#[test]
fn a_host_ip_limits_forwarding_to_that_address() {
    for backend in ["iptables", "nftables"] {
        let node = Node::new();
        let mut pod = node.pod(true);
        pod.serve();
        let mappings = json!([
            {"hostPort": HTTP, "containerPort": 80, "protocol": "tcp", "hostIP": HOST_V4},
            {"hostPort": HTTP, "containerPort": 80, "protocol": "tcp", "hostIP": HOST_V6},
            {"hostPort": DNS, "containerPort": 53, "protocol": "udp", "hostIP": "0.0.0.0"},
        ]);
        let conf = add(&node, &pod, json!({"backend": backend}), mappings);
        assert!(
            reaches(&node.client, Proto::Tcp, HOST_V4, HTTP),
            "{backend}"
        );
        assert!(
            reaches(&node.client, Proto::Tcp, HOST_V6, HTTP),
            "{backend}"
        );
        assert!(
            !reaches(&node.host, Proto::Tcp, "127.0.0.1", HTTP),
            "{backend}: 127.0.0.1 is not the hostIP"
        );
        assert!(
            !reaches(&node.host, Proto::Tcp, BRIDGE_V4, HTTP),
            "{backend}: nor is the bridge address"
        );
        // A wildcard hostIP forwards every local address of its own family only.
        assert!(
            reaches(&node.host, Proto::Udp, "127.0.0.1", DNS),
            "{backend}"
        );
        assert!(reaches(&node.client, Proto::Udp, HOST_V4, DNS), "{backend}");
        assert!(
            !reaches(&node.client, Proto::Udp, HOST_V6, DNS),
            "{backend}"
        );
        node.portmap("CHECK", &pod, &conf).ok();
        if backend == "iptables" {
            let rules = chain_rules(&node.nat(false), &dn_chain(&pod));
            assert!(
                rules.contains(&format!(
                    "-d {HOST_V4}/32 -p tcp -m tcp --dport 8080 -j DNAT --to-destination {}:80",
                    pod.ip(false)
                )),
                "{rules:?}"
            );
            let rules6 = chain_rules(&node.nat(true), &dn_chain(&pod));
            assert!(
                rules6.contains(&format!(
                    "-d {HOST_V6}/128 -p tcp -m tcp --dport 8080 -j DNAT --to-destination [{}]:80",
                    pod.ip(true)
                )),
                "{rules6:?}"
            );
        }
    }
}

#[test]
fn an_ipv6_only_pod_is_forwarded_without_route_localnet() {
    for backend in ["iptables", "nftables"] {
        let node = Node::new();
        let mut pod = node.pod(true);
        pod.serve();
        // A prevResult naming only the IPv6 address.
        let mut prev = pod.result.clone();
        prev["ips"]
            .as_array_mut()
            .unwrap()
            .retain(|ip| ip["address"].as_str().unwrap().contains(':'));
        let conf = portmap_config(
            "1.0.0",
            json!({"backend": backend}),
            web_and_dns(),
            Some(&prev),
        );
        node.portmap("ADD", &pod, &conf).ok();
        assert!(reaches(&node.client, Proto::Tcp, HOST_V6, HTTP));
        assert!(reaches(&node.client, Proto::Udp, HOST_V6, DNS));
        assert!(!reaches(&node.client, Proto::Tcp, HOST_V4, HTTP));
        assert_eq!(
            node.host
                .sysctl(&format!("net.ipv4.conf.{}.route_localnet", node.bridge)),
            "0"
        );
        node.portmap("CHECK", &pod, &conf).ok();
    }
}

#[test]
fn the_backend_is_chosen_and_an_unknown_one_refused() {
    let node = Node::new();
    let pod = node.pod(false);
    add(&node, &pod, json!({}), web_and_dns());
    assert!(
        node.nat(false).contains(&dn_chain(&pod)),
        "iptables is the default"
    );
    assert_eq!(node.hostport_table("ip"), "");

    let other = node.pod(false);
    add(
        &node,
        &other,
        json!({"backend": "nftables"}),
        json!([{"hostPort": 9090, "containerPort": 80, "protocol": "tcp"}]),
    );
    assert!(node.hostport_table("ip").contains(&other.id));
    assert!(!node.nat(false).contains(&dn_chain(&other)));

    let conf = portmap_config(
        "1.0.0",
        json!({"backend": "bpf"}),
        web_and_dns(),
        Some(&pod.result),
    );
    let out = node.portmap("ADD", &pod, &conf);
    out.err(7);
    assert!(out.msg().contains("\"bpf\""), "{}", out.msg());
}

#[test]
fn route_localnet_reaches_a_bridge_with_a_dot_in_its_name() {
    let mut node = Node::new();
    node.bridge = testkit::unique_name("pm.");
    let mut pod = node.pod(false);
    pod.serve();
    add(&node, &pod, json!({}), web_and_dns());
    assert_eq!(
        node.host
            .sysctl(&format!("net/ipv4/conf/{}/route_localnet", node.bridge)),
        "1"
    );
    assert!(reaches(&node.host, Proto::Tcp, "127.0.0.1", HTTP));
}
