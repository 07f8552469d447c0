//! ADD on the real kernel: the result per spec version, and the state each config field makes.

mod common;

use common::{addrs, link, routes, vlan_filtering_supported, Node, VERSIONS, VLAN_FILTERING};
use serde_json::{json, Value};
use testkit::TestNs;

/// The one veth of the host namespace: (name, mac).
fn host_veth(node: &Node) -> (String, String) {
    let veths = node.links_of_kind("veth");
    assert_eq!(veths.len(), 1, "{veths:?}");
    (
        veths[0]["ifname"].as_str().unwrap().to_string(),
        veths[0]["address"].as_str().unwrap().to_string(),
    )
}

fn mac(ns: &TestNs, dev: &str) -> String {
    link(ns, dev)["address"].as_str().unwrap().to_string()
}

#[test]
fn result_per_spec_version() {
    let node = Node::new();
    for version in VERSIONS {
        let pod = TestNs::new("bp");
        let id = format!("ver-{}", version.replace('.', "-"));
        let conf = node.conf(
            version,
            json!({"isGateway": true, "ipam": {"routes": [{"dst": "10.200.0.0/16"}]}}),
        );
        let got = node.add(&pod, &id, &conf).ok();
        let (veth, veth_mac) = host_veth(&node);
        let (br_mac, eth0_mac) = (mac(&node.host, "cni0"), mac(&pod, "eth0"));
        let addr = addrs(&pod, "eth0")[0].clone();
        let want = match version {
            "0.1.0" | "0.2.0" => json!({
                "cniVersion": version,
                "ip4": {"ip": addr, "gateway": "10.88.0.1", "routes": [{"dst": "10.200.0.0/16"}]},
            }),
            "0.3.0" | "0.3.1" | "0.4.0" => json!({
                "cniVersion": version,
                "interfaces": [
                    {"name": "cni0", "mac": br_mac},
                    {"name": veth, "mac": veth_mac},
                    {"name": "eth0", "mac": eth0_mac, "sandbox": pod.path_str()},
                ],
                "ips": [{"version": "4", "interface": 2, "address": addr, "gateway": "10.88.0.1"}],
                "routes": [{"dst": "10.200.0.0/16"}],
            }),
            _ => json!({
                "cniVersion": version,
                "interfaces": [
                    {"name": "cni0", "mac": br_mac},
                    {"name": veth, "mac": veth_mac},
                    {"name": "eth0", "mac": eth0_mac, "sandbox": pod.path_str()},
                ],
                "ips": [{"interface": 2, "address": addr, "gateway": "10.88.0.1"}],
                "routes": [{"dst": "10.200.0.0/16"}],
            }),
        };
        assert_eq!(got, want, "cniVersion {version}");
        node.del(Some(&pod), &id, &conf).ok();
        node.assert_clean();
    }
}

#[test]
fn add_makes_the_go_plugins_state() {
    let node = Node::new();
    // Off first (a new namespace starts with the root namespace's), so that the plugin's
    // turning it on shows.
    node.host.run("sysctl", &["-qw", "net.ipv4.ip_forward=0"]);
    let pod = TestNs::new("bp");
    let conf = node.conf(
        "1.0.0",
        json!({"isGateway": true, "ipMasq": true, "mtu": 1400,
               "ipam": {"routes": [{"dst": "0.0.0.0/0"}]}}),
    );
    let result = node.add(&pod, "state-1", &conf).ok();
    let addr = result["ips"][0]["address"].as_str().unwrap().to_string();
    let ip = addr.split('/').next().unwrap();

    let br = link(&node.host, "cni0");
    assert_eq!(br["linkinfo"]["info_kind"], "bridge");
    assert_eq!(br["mtu"], 1400, "a bridge ADD creates gets the MTU");
    assert_eq!(br["operstate"], "UP");
    assert_eq!(addrs(&node.host, "cni0"), vec!["10.88.0.1/16"]);
    assert_eq!(node.host.sysctl("net.ipv6.conf.cni0.accept_ra"), "0");
    assert_eq!(node.host.sysctl("net.ipv4.ip_forward"), "1");

    let (veth, _) = host_veth(&node);
    let hv = link(&node.host, &veth);
    assert_eq!(hv["master"], "cni0");
    assert_eq!(hv["mtu"], 1400);
    assert_eq!(hv["operstate"], "UP");
    assert_eq!(
        node.host.sysctl(&format!("net.ipv6.conf.{veth}.accept_ra")),
        "0"
    );

    let eth0 = link(&pod, "eth0");
    assert_eq!(eth0["linkinfo"]["info_kind"], "veth");
    assert_eq!(eth0["mtu"], 1400);
    assert!(eth0["flags"].as_array().unwrap().contains(&json!("UP")));
    assert_eq!(addrs(&pod, "eth0"), vec![addr.clone()]);
    assert_eq!(
        routes(&pod, "-4"),
        vec!["default via 10.88.0.1", "10.88.0.0/16 dev eth0"]
    );
    assert_eq!(pod.sysctl("net.ipv4.conf.eth0.arp_notify"), "1");
    assert_eq!(pod.sysctl("net.ipv6.conf.eth0.accept_dad"), "0");

    let chain = cni_bridge::masq::chain_name("testnet", "state-1");
    let c = r#""name: \"testnet\" id: \"state-1\"""#;
    assert_eq!(
        node.cni_nat_lines(),
        vec![
            format!(":{chain} - [0:0]"),
            format!("-A POSTROUTING -s {ip}/32 -m comment --comment {c} -j {chain}"),
            format!("-A {chain} -d 10.88.0.0/16 -m comment --comment {c} -j ACCEPT"),
            format!("-A {chain} ! -d 224.0.0.0/4 -m comment --comment {c} -j MASQUERADE"),
        ]
    );
    node.del(Some(&pod), "state-1", &conf).ok();
    node.assert_clean();
    assert_eq!(
        addrs(&node.host, "cni0"),
        vec!["10.88.0.1/16"],
        "the bridge stays"
    );
}

#[test]
fn without_is_gateway_the_bridge_has_no_address() {
    let node = Node::new();
    // A new namespace starts with the root namespace's IPv4 forwarding: off here, whatever
    // the machine has, so that the plugin's leaving it off shows.
    node.host.run("sysctl", &["-qw", "net.ipv4.ip_forward=0"]);
    let pod = TestNs::new("bp");
    let conf = node.conf("1.0.0", json!({}));
    node.add(&pod, "nogw", &conf).ok();
    assert!(addrs(&node.host, "cni0").is_empty());
    assert_eq!(node.host.sysctl("net.ipv4.ip_forward"), "0");
    assert!(node.cni_nat_lines().is_empty());
    node.del(Some(&pod), "nogw", &conf).ok();
}

#[test]
fn default_gateway_adds_the_default_route() {
    let node = Node::new();
    let pod = TestNs::new("bp");
    let conf = node.conf("1.0.0", json!({"isDefaultGateway": true}));
    let r = node.add(&pod, "dgw", &conf).ok();
    assert_eq!(
        r["routes"],
        json!([{"dst": "0.0.0.0/0", "gw": "10.88.0.1"}])
    );
    assert!(routes(&pod, "-4").contains(&"default via 10.88.0.1".to_string()));
    assert_eq!(addrs(&node.host, "cni0"), vec!["10.88.0.1/16"]);
    node.del(Some(&pod), "dgw", &conf).ok();
}

#[test]
fn a_different_bridge_address_needs_force_address() {
    let node = Node::new();
    node.host.ip(&["link", "add", "cni0", "type", "bridge"]);
    node.host
        .ip(&["addr", "add", "10.99.0.1/16", "dev", "cni0"]);
    let pod = TestNs::new("bp");
    let conf = node.conf("1.0.0", json!({"isGateway": true, "ipMasq": true}));
    let out = node.add(&pod, "force", &conf);
    let e = out.err(7);
    assert!(e["msg"].as_str().unwrap().contains("forceAddress"), "{e}");
    assert!(e["msg"].as_str().unwrap().contains("10.99.0.1/16"), "{e}");
    node.assert_clean();
    assert!(pod.link("eth0").is_none());

    let forced = node.conf("1.0.0", json!({"isGateway": true, "forceAddress": true}));
    node.add(&pod, "force", &forced).ok();
    assert_eq!(addrs(&node.host, "cni0"), vec!["10.88.0.1/16"]);
    node.del(Some(&pod), "force", &forced).ok();
}

#[test]
fn existing_bridge_keeps_its_mtu_and_must_be_a_bridge() {
    let node = Node::new();
    node.host.ip(&["link", "add", "cni0", "type", "bridge"]);
    // Set by hand, the MTU no longer follows the ports'.
    node.host.ip(&["link", "set", "cni0", "mtu", "1450"]);
    let pod = TestNs::new("bp");
    let conf = node.conf("1.0.0", json!({"mtu": 1300}));
    node.add(&pod, "mtu", &conf).ok();
    assert_eq!(link(&node.host, "cni0")["mtu"], 1450);
    assert_eq!(link(&pod, "eth0")["mtu"], 1300);
    assert_eq!(
        link(&node.host, "cni0")["operstate"],
        "UP",
        "ADD brings it up"
    );
    node.del(Some(&pod), "mtu", &conf).ok();

    let other = Node::new();
    other.host.ip(&["link", "add", "cni0", "type", "ifb"]);
    let e = other
        .add(&pod, "notbr", &other.conf("1.0.0", json!({})))
        .err(7);
    let msg = e["msg"].as_str().unwrap();
    assert!(msg.contains("bridge") && msg.contains("cni0"), "{msg}");
    other.assert_clean();
}

#[test]
fn masquerade_with_nftables() {
    let node = Node::new();
    let pod = TestNs::new("bp");
    let conf = node.conf(
        "1.0.0",
        json!({"bridge": "cbr0", "isGateway": true, "ipMasq": true, "ipMasqBackend": "nftables"}),
    );
    let r = node.add(&pod, "nft-1", &conf).ok();
    assert_eq!(r["interfaces"][0]["name"], "cbr0");
    assert_eq!(link(&node.host, "cbr0")["linkinfo"]["info_kind"], "bridge");
    assert_eq!(addrs(&node.host, "cbr0"), vec!["10.88.0.1/16"]);
    assert!(node.host.link("cni0").is_none());
    let ip = r["ips"][0]["address"]
        .as_str()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let table = node.nft(&["table", "inet", "cni_plugins_masquerade"]);
    let comment = cni_bridge::masq::nft_comment("testnet", "eth0", "nft-1");
    assert!(
        table.contains(&format!(
            "ip saddr {ip} ip daddr != 10.88.0.0/16 masquerade comment \"{comment}\""
        )),
        "{table}"
    );
    assert!(
        table.contains("type nat hook postrouting priority srcnat"),
        "{table}"
    );
    assert!(table.contains("goto masq_checks"), "{table}");
    assert!(
        node.cni_nat_lines().is_empty(),
        "no iptables rules with the nftables backend"
    );
    node.del(Some(&pod), "nft-1", &conf).ok();
    let table = node.nft(&["table", "inet", "cni_plugins_masquerade"]);
    assert!(!table.contains("masquerade comment"), "{table}");
    node.assert_clean();
}

#[test]
fn hairpin_isolation_and_promisc() {
    let node = Node::new();
    let pod = TestNs::new("bp");
    let conf = node.conf("1.0.0", json!({"hairpinMode": true, "portIsolation": true}));
    node.add(&pod, "hp", &conf).ok();
    let (veth, _) = host_veth(&node);
    let port = &link(&node.host, &veth)["linkinfo"]["info_slave_data"];
    assert_eq!(port["hairpin"], true);
    assert_eq!(port["isolated"], true);
    assert_eq!(link(&node.host, "cni0")["promiscuity"], 0);
    node.del(Some(&pod), "hp", &conf).ok();

    let conf = node.conf("1.0.0", json!({"promiscMode": true}));
    node.add(&pod, "pm", &conf).ok();
    let br = link(&node.host, "cni0");
    assert!(
        br["flags"].as_array().unwrap().contains(&json!("PROMISC")),
        "{br}"
    );
    let (veth, _) = host_veth(&node);
    assert_eq!(
        link(&node.host, &veth)["linkinfo"]["info_slave_data"]["hairpin"],
        false
    );
    node.del(Some(&pod), "pm", &conf).ok();

    let both = node.conf("1.0.0", json!({"promiscMode": true, "hairpinMode": true}));
    let e = node.add(&pod, "both", &both).err(7);
    assert!(e["msg"].as_str().unwrap().contains("hairpinMode"), "{e}");
    node.assert_clean();
}

/// `bridge -j vlan show dev <port>`: vid -> flags.
fn port_vlans(node: &Node, port: &str) -> Vec<(u64, Vec<String>)> {
    let out = node
        .host
        .run("bridge", &["-j", "vlan", "show", "dev", port]);
    let v: Value = serde_json::from_str(&out).unwrap();
    v.as_array()
        .and_then(|a| a.first())
        .and_then(|p| p["vlans"].as_array())
        .map(|vlans| {
            vlans
                .iter()
                .map(|x| {
                    let flags = x["flags"]
                        .as_array()
                        .map(|f| f.iter().map(|s| s.as_str().unwrap().to_string()).collect())
                        .unwrap_or_default();
                    (x["vlan"].as_u64().unwrap(), flags)
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn access_vlan_with_its_gateway_interface() {
    if !testkit::runs_here(vlan_filtering_supported(), VLAN_FILTERING) {
        return;
    }
    let node = Node::new();
    let pod = TestNs::new("bp");
    let conf = node.conf("1.0.0", json!({"vlan": 100, "isGateway": true}));
    let r = node.add(&pod, "vlan", &conf).ok();
    assert_eq!(
        link(&node.host, "cni0")["linkinfo"]["info_data"]["vlan_filtering"],
        1
    );
    let veths: Vec<String> = node
        .links_of_kind("veth")
        .iter()
        .filter(|l| l["master"] == "cni0" && l["link_netnsid"].is_number())
        .map(|l| l["ifname"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(veths.len(), 1);
    let vlans = port_vlans(&node, &veths[0]);
    assert!(
        vlans.contains(&(100, vec!["PVID".into(), "Egress Untagged".into()])),
        "{vlans:?}"
    );
    assert!(
        vlans.iter().any(|(v, _)| *v == 1),
        "the default VLAN is kept: {vlans:?}"
    );
    // The gateway lives on cni0.100, whose peer is an access port of VLAN 100.
    assert_eq!(addrs(&node.host, "cni0.100"), vec!["10.88.0.1/16"]);
    assert_eq!(r["interfaces"][3]["name"], "cni0.100");
    assert_eq!(r["interfaces"].as_array().unwrap().len(), 4);
    node.del(Some(&pod), "vlan", &conf).ok();
    assert!(pod.link("eth0").is_none());
}

#[test]
fn trunk_vlans_without_the_default_one() {
    if !testkit::runs_here(vlan_filtering_supported(), VLAN_FILTERING) {
        return;
    }
    let node = Node::new();
    let pod = TestNs::new("bp");
    let conf = node.conf(
        "1.0.0",
        json!({"vlanTrunk": [{"id": 10}, {"minID": 20, "maxID": 22}], "preserveDefaultVlan": false}),
    );
    node.add(&pod, "trunk", &conf).ok();
    let (veth, _) = host_veth(&node);
    let vids: Vec<u64> = port_vlans(&node, &veth)
        .into_iter()
        .map(|(v, f)| {
            assert!(f.is_empty(), "trunk VLANs are tagged: {v} {f:?}");
            v
        })
        .collect();
    assert_eq!(vids, vec![10, 20, 21, 22]);
    node.del(Some(&pod), "trunk", &conf).ok();
}

#[test]
fn vlan_refusals_name_the_field() {
    let node = Node::new();
    let pod = TestNs::new("bp");
    for (extra, code, field) in [
        (json!({"vlan": 5000}), 7, "vlan"),
        (json!({"vlan": 5, "vlanTrunk": [{"id": 6}]}), 7, "vlan"),
        (
            json!({"vlanTrunk": [{"minID": 9}]}),
            7,
            "vlanTrunk[0].minID",
        ),
        (json!({"vlan": "5"}), 6, "vlan"),
    ] {
        let e = node
            .add(&pod, "bad", &node.conf("1.0.0", extra.clone()))
            .err(code);
        assert!(e["msg"].as_str().unwrap().contains(field), "{extra}: {e}");
    }
    node.assert_clean();
    assert!(
        node.host.link("cni0").is_none(),
        "nothing made for a refused config"
    );
}

#[test]
fn dual_stack_with_dad() {
    let node = Node::new();
    let pod = TestNs::new("bp");
    let conf = node.conf(
        "1.0.0",
        json!({"isDefaultGateway": true, "ipMasq": true, "enabledad": true,
               "ipam": {"ranges": [[{"subnet": "10.88.0.0/16"}], [{"subnet": "fd00:88::/64"}]]}}),
    );
    let r = node.add(&pod, "dual", &conf).ok();
    assert_eq!(r["ips"].as_array().unwrap().len(), 2);
    let v6 = r["ips"][1]["address"].as_str().unwrap().to_string();
    assert!(addrs(&pod, "eth0").contains(&v6));
    assert_eq!(pod.sysctl("net.ipv6.conf.eth0.accept_dad"), "1");
    assert_eq!(pod.sysctl("net.ipv6.conf.eth0.enhanced_dad"), "1");
    assert!(
        routes(&pod, "-6").contains(&"default via fd00:88::1".to_string()),
        "{:?}",
        routes(&pod, "-6")
    );
    assert!(addrs(&node.host, "cni0").contains(&"fd00:88::1/64".to_string()));
    assert_eq!(node.host.sysctl("net.ipv6.conf.all.forwarding"), "1");
    let ip6 = v6.split('/').next().unwrap();
    assert!(
        node.nat6()
            .contains(&format!("-A POSTROUTING -s {ip6}/128")),
        "{}",
        node.nat6()
    );
    assert!(node.nat6().contains("! -d ff00::/8"), "{}", node.nat6());
    node.del(Some(&pod), "dual", &conf).ok();
    node.assert_clean();
}

#[test]
fn mac_spoof_check_rules() {
    let node = Node::new();
    let pod = TestNs::new("bp");
    let conf = node.conf(
        "1.0.0",
        json!({"macspoofchk": true, "runtimeConfig": {"mac": "0a:58:0a:58:00:09"}}),
    );
    node.add(&pod, "spoof", &conf).ok();
    let (veth, _) = host_veth(&node);
    let table = node.nft(&["table", "bridge", "nat"]);
    assert!(
        table.contains(&format!(
            "iifname \"{veth}\" jump cni-br-iface-spoof-eth0 comment \"macspoofchk-spoof-eth0\""
        )),
        "{table}"
    );
    assert!(
        table.contains("ether saddr 0a:58:0a:58:00:09 return"),
        "{table}"
    );
    assert!(
        table.contains("drop comment \"macspoofchk-spoof-eth0\""),
        "{table}"
    );
    node.del(Some(&pod), "spoof", &conf).ok();
    let table = node.nft(&["table", "bridge", "nat"]);
    assert!(!table.contains("spoof-eth0"), "{table}");
}

#[test]
fn layer_2_and_disabled_container_interface() {
    let node = Node::new();
    let pod = TestNs::new("bp");
    let l2 = node.conf("1.0.0", json!({"ipam": null}));
    let r = node.add(&pod, "l2", &l2).ok();
    assert!(r.get("ips").is_none(), "{r}");
    assert_eq!(r["interfaces"].as_array().unwrap().len(), 3);
    assert!(link(&pod, "eth0")["flags"]
        .as_array()
        .unwrap()
        .contains(&json!("UP")));
    node.del(Some(&pod), "l2", &l2).ok();

    let down = node.conf(
        "1.0.0",
        json!({"ipam": null, "disableContainerInterface": true}),
    );
    node.add(&pod, "down", &down).ok();
    assert!(!link(&pod, "eth0")["flags"]
        .as_array()
        .unwrap()
        .contains(&json!("UP")));
    node.del(Some(&pod), "down", &down).ok();

    let refused = node.conf("1.0.0", json!({"disableContainerInterface": true}));
    let e = node.add(&pod, "down2", &refused).err(7);
    assert!(
        e["msg"]
            .as_str()
            .unwrap()
            .contains("disableContainerInterface"),
        "{e}"
    );
    node.assert_clean();
}

#[test]
fn mac_comes_from_runtime_config_then_args_then_cni_args() {
    let node = Node::new();
    for (extra, cni_args, want) in [
        (
            json!({"runtimeConfig": {"mac": "0a:00:00:00:00:01"}, "args": {"cni": {"mac": "0a:00:00:00:00:02"}}}),
            "IgnoreUnknown=1;MAC=0a:00:00:00:00:03",
            "0a:00:00:00:00:01",
        ),
        (
            json!({"args": {"cni": {"mac": "0a:00:00:00:00:02"}}}),
            "IgnoreUnknown=1;MAC=0a:00:00:00:00:03",
            "0a:00:00:00:00:02",
        ),
        (
            json!({}),
            "IgnoreUnknown=1;MAC=0a:00:00:00:00:03",
            "0a:00:00:00:00:03",
        ),
    ] {
        let pod = TestNs::new("bp");
        let conf = node.conf("1.0.0", extra);
        let r = node
            .invocation("ADD", Some(&pod), "mac")
            .args(cni_args)
            .run_in_ns(&node.host, &conf)
            .ok();
        assert_eq!(mac(&pod, "eth0"), want);
        assert_eq!(r["interfaces"][2]["mac"], want);
        node.del(Some(&pod), "mac", &conf).ok();
    }
}

#[test]
fn config_dns_replaces_ipams() {
    let node = Node::new();
    let pod = TestNs::new("bp");
    let conf = node.conf(
        "1.0.0",
        json!({"dns": {"nameservers": ["10.96.0.10"], "search": ["svc.cluster.local"]}}),
    );
    let r = node.add(&pod, "dns", &conf).ok();
    assert_eq!(
        r["dns"],
        json!({"nameservers": ["10.96.0.10"], "search": ["svc.cluster.local"]})
    );
    node.del(Some(&pod), "dns", &conf).ok();
}

#[test]
fn other_interface_names_and_a_taken_one() {
    let node = Node::new();
    let pod = TestNs::new("bp");
    let conf = node.conf("1.0.0", json!({"isGateway": true, "ipMasq": true}));
    let r = node
        .invocation("ADD", Some(&pod), "net1")
        .ifname("net1")
        .run_in_ns(&node.host, &conf)
        .ok();
    assert_eq!(r["interfaces"][2]["name"], "net1");
    assert_eq!(link(&pod, "net1")["linkinfo"]["info_kind"], "veth");
    // A second ADD for the same name fails and takes back everything it made.
    let out = node
        .invocation("ADD", Some(&pod), "net1b")
        .ifname("net1")
        .run_in_ns(&node.host, &conf);
    let e = out.err(999);
    assert!(e["msg"].as_str().unwrap().contains("net1"), "{e}");
    assert_eq!(node.links_of_kind("veth").len(), 1);
    assert_eq!(node.reserved().len(), 1);
    assert_eq!(node.cni_nat_lines().len(), 4, "only the first pod's rules");
    node.invocation("DEL", Some(&pod), "net1")
        .ifname("net1")
        .run_in_ns(&node.host, &conf)
        .ok();
    node.assert_clean();
}
