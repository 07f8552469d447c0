//! The stock kube-flannel conflist run as a runtime runs it, inside a throwaway host namespace
//! with a pod namespace: flannel (bridge, host-local) then portmap with flannel's result;
//! DEL in reverse. What a user checks: the pod's address, routes and MTU, the saved delegate,
//! and that DEL leaves no address, veth, firewall rule or saved file.

mod common;

use common::{read_json, Node, NETWORK, STACK};
use ipnetwork::IpNetwork;
use serde_json::{json, Map, Value};
use testkit::{conflist, unique_name, TestNs};

/// One family of a subnet.env sample, as the pod should see it.
struct Family {
    /// `ip -4` or `ip -6`.
    flag: &'static str,
    subnet: &'static str,
    gateway: &'static str,
    network: &'static str,
}

const V4: Family = Family {
    flag: "-4",
    subnet: "10.244.1.0/24",
    gateway: "10.244.1.1",
    network: "10.244.0.0/16",
};

const V6: Family = Family {
    flag: "-6",
    subnet: "fd00:10:244:1::/64",
    gateway: "fd00:10:244:1::1",
    network: "fd00:10:244::/56",
};

fn port_mappings() -> Map<String, Value> {
    json!({"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]})
        .as_object()
        .unwrap()
        .clone()
}

/// Everything a firewall holds in `ns`, for both families and both front ends.
fn firewall(ns: &TestNs) -> String {
    let mut all = String::new();
    for (prog, args) in [
        ("iptables-save", &[][..]),
        ("ip6tables-save", &[][..]),
        ("nft", &["list", "ruleset"][..]),
    ] {
        let out = ns.try_run(prog, args);
        all += &String::from_utf8_lossy(&out.stdout);
    }
    all
}

/// The global addresses on the pod's eth0 of one family.
fn global_addresses(pod: &TestNs, fam: &Family) -> Vec<IpNetwork> {
    pod.addresses("eth0")
        .iter()
        .map(|a| a.parse::<IpNetwork>().unwrap())
        .filter(|a| a.is_ipv4() == (fam.flag == "-4"))
        .filter(|a| !matches!(a.ip(), std::net::IpAddr::V6(v6) if v6.segments()[0] == 0xfe80))
        .collect()
}

fn route_gateway(pod: &TestNs, fam: &Family, dst: &str) -> Option<String> {
    let routes = pod.ip_json(&[fam.flag, "route", "show", dst]);
    routes
        .get(0)
        .and_then(|r| r.get("gateway"))
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// The pod's IPv4 address on eth0, without its prefix.
fn pod_address(pod: &TestNs) -> String {
    global_addresses(pod, &V4)[0].ip().to_string()
}

fn host_veths(host: &TestNs) -> Vec<Value> {
    host.ip_json(&["link", "show", "type", "veth"])
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// ADD through the conflist, check the pod, DEL in reverse, check that nothing is left.
fn conflist_round_trip(sample: &str, families: &[&Family], mtu: u64, ip_masq: bool) {
    let node = Node::new(STACK);
    node.write_subnet_env(sample);
    let host = TestNs::new("flh");
    let pod = TestNs::new("flp");
    let container = unique_name("ctr");
    let list = node.conflist();
    let base = node
        .flannel("ADD")
        .container_id(&container)
        .netns(&pod.path_str());
    let runtime = port_mappings();

    let result = conflist::add(&list, &base, Some(&host), &runtime)
        .unwrap_or_else(|out| panic!("conflist ADD failed: {out:?}"));
    assert_eq!(result["cniVersion"], "0.3.1");

    let link = pod.link("eth0").expect("the pod has eth0");
    assert_eq!(link["mtu"], mtu, "the MTU from subnet.env");
    for fam in families {
        let subnet: IpNetwork = fam.subnet.parse().unwrap();
        let addrs = global_addresses(&pod, fam);
        assert_eq!(addrs.len(), 1, "one {} address: {addrs:?}", fam.flag);
        assert!(subnet.contains(addrs[0].ip()), "{} in {subnet}", addrs[0]);
        assert_eq!(addrs[0].prefix(), subnet.prefix());
        assert_eq!(
            route_gateway(&pod, fam, "default").as_deref(),
            Some(fam.gateway),
            "default route via the bridge gateway"
        );
        assert_eq!(
            route_gateway(&pod, fam, fam.network).as_deref(),
            Some(fam.gateway),
            "route to FLANNEL_NETWORK"
        );
        assert!(
            result["ips"]
                .as_array()
                .unwrap()
                .iter()
                .any(|ip| ip["address"] == addrs[0].to_string()),
            "the result names {}: {result}",
            addrs[0]
        );
    }
    let ranges: Vec<Value> = families
        .iter()
        .map(|f| json!([{"subnet": f.subnet}]))
        .collect();
    let routes: Vec<Value> = families.iter().map(|f| json!({"dst": f.network})).collect();
    assert_eq!(
        read_json(&node.saved(&container)),
        json!({
            "cniVersion": "0.3.1",
            "name": NETWORK,
            "type": "bridge",
            "hairpinMode": true,
            "isDefaultGateway": true,
            "isGateway": true,
            "ipMasq": ip_masq,
            "mtu": mtu,
            "ipam": {
                "type": "host-local",
                "dataDir": node.ipam_dir(),
                "ranges": ranges,
                "routes": routes
            }
        })
    );
    assert_eq!(node.allocations().len(), families.len());
    assert_eq!(host_veths(&host).len(), 1);
    assert!(
        firewall(&host).contains(&container),
        "portmap's rules name the container"
    );

    // libcni hands DEL no prevResult below 0.4.0.
    conflist::del(&list, &base, Some(&host), &runtime, None)
        .unwrap_or_else(|out| panic!("conflist DEL failed: {out:?}"));
    assert!(pod.link("eth0").is_none(), "eth0 removed from the pod");
    assert_eq!(host_veths(&host), Vec::<Value>::new(), "no veth left");
    assert_eq!(
        node.allocations(),
        Vec::<String>::new(),
        "no address file left"
    );
    let rules = firewall(&host);
    assert!(
        !rules.contains(&container),
        "a rule still names {container}:\n{rules}"
    );
    assert!(!node.saved(&container).exists(), "saved file removed");

    conflist::del(&list, &base, Some(&host), &runtime, None)
        .unwrap_or_else(|out| panic!("second DEL failed: {out:?}"));
}

#[test]
fn stock_conflist_ipv4() {
    conflist_round_trip("subnet-ipv4.env", &[&V4], 1450, false);
}

#[test]
fn stock_conflist_ipv6() {
    conflist_round_trip("subnet-ipv6.env", &[&V6], 1430, true);
}

#[test]
fn stock_conflist_dual_stack() {
    conflist_round_trip("subnet-dual.env", &[&V4, &V6], 1450, false);
}

/// containerd (go-cni) sends the mappings with Go's field names; a DEL whose config the
/// plugins cannot use (mappings and a flannel field unreadable) still removes everything:
/// portmap by container ID, then flannel, bridge and host-local from the saved delegate.
#[test]
fn go_style_mappings_are_forwarded_and_a_del_with_an_unusable_config_removes_everything() {
    let node = Node::new(STACK);
    node.write_subnet_env("subnet-ipv4.env");
    let host = TestNs::new("flh");
    let pod = TestNs::new("flp");
    let container = unique_name("ctr");
    let list = node.conflist();
    let base = node
        .flannel("ADD")
        .container_id(&container)
        .netns(&pod.path_str());
    let go_cni = json!({"portMappings": [
        {"HostPort": 8083, "ContainerPort": 80, "Protocol": "tcp", "HostIP": ""}
    ]});
    conflist::add(&list, &base, Some(&host), go_cni.as_object().unwrap())
        .unwrap_or_else(|out| panic!("conflist ADD failed: {out:?}"));
    let rules = firewall(&host);
    assert!(
        rules.contains(&container) && rules.contains("8083"),
        "no rule forwards 8083 for {container}:\n{rules}"
    );
    assert_eq!(node.allocations().len(), 1);

    let mut broken = list.clone();
    broken["plugins"][0]["subnetFileWait"] = json!("soon");
    let unreadable = json!({"portMappings": [{"hostPort": "eighty", "containerPort": null}]});
    conflist::del(
        &broken,
        &base,
        Some(&host),
        unreadable.as_object().unwrap(),
        None,
    )
    .unwrap_or_else(|out| panic!("conflist DEL failed: {out:?}"));
    let rules = firewall(&host);
    assert!(
        !rules.contains(&container),
        "a rule still names {container}:\n{rules}"
    );
    assert_eq!(node.allocations(), Vec::<String>::new(), "address released");
    assert!(pod.link("eth0").is_none(), "eth0 removed from the pod");
    assert_eq!(host_veths(&host), Vec::<Value>::new(), "no veth left");
    assert!(!node.saved(&container).exists(), "saved file removed");
}

#[test]
fn a_delegate_that_fails_half_way_leaves_nothing_behind() {
    // A /30 has one address for pods: the second pod's IPAM fails after its veth exists.
    let node = Node::new(STACK);
    std::fs::create_dir_all(node.subnet_file().parent().unwrap()).unwrap();
    std::fs::write(
        node.subnet_file(),
        "FLANNEL_NETWORK=10.99.0.0/16\nFLANNEL_SUBNET=10.99.0.1/30\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=false\n",
    )
    .unwrap();
    let host = TestNs::new("flh");
    let pods = [TestNs::new("flp"), TestNs::new("flp")];
    let ids = [unique_name("ctr"), unique_name("ctr")];
    let conf = node.flannel_config("1.0.0", json!({"delegate": {"isDefaultGateway": true}}));
    let add = |i: usize| {
        node.flannel("ADD")
            .container_id(&ids[i])
            .netns(&pods[i].path_str())
            .run_in_ns(&host, &conf)
    };
    add(0).ok();
    let out = add(1);
    assert_eq!(out.code, 1, "the second pod cannot get an address: {out:?}");

    assert!(pods[1].link("eth0").is_none(), "no eth0 in the failed pod");
    assert_eq!(host_veths(&host).len(), 1, "only the first pod's veth");
    assert_eq!(node.allocations(), vec!["10.99.0.2".to_string()]);
    assert!(!node.saved(&ids[1]).exists());
    assert!(
        !firewall(&host).contains(&ids[1]),
        "no rule names the failed container"
    );

    for i in [0, 1] {
        node.flannel("DEL")
            .container_id(&ids[i])
            .netns(&pods[i].path_str())
            .run_in_ns(&host, &conf)
            .ok();
    }
    assert_eq!(host_veths(&host), Vec::<Value>::new());
    assert_eq!(node.allocations(), Vec::<String>::new());
    assert!(!firewall(&host).contains(&ids[0]));
    assert_eq!(std::fs::read_dir(node.data_dir()).unwrap().count(), 0);
}

#[test]
fn check_asks_the_bridge_about_the_pod_it_made() {
    let node = Node::new(STACK);
    node.write_subnet_env("subnet-ipv4.env");
    let host = TestNs::new("flh");
    let pod = TestNs::new("flp");
    let container = unique_name("ctr");
    let conf = node.flannel_config("1.0.0", json!({"delegate": {"isDefaultGateway": true}}));
    let inv = |cmd: &str| {
        node.flannel(cmd)
            .container_id(&container)
            .netns(&pod.path_str())
    };
    let result = inv("ADD").run_in_ns(&host, &conf).ok();
    let mut check = conf.clone();
    check["prevResult"] = result.clone();
    inv("CHECK").run_in_ns(&host, &check).ok();

    // Take the pod's address away: the bridge's CHECK notices, and flannel reports it.
    let addr = result["ips"][0]["address"].as_str().unwrap();
    pod.ip(&["addr", "del", addr, "dev", "eth0"]);
    let out = inv("CHECK").run_in_ns(&host, &check);
    assert_eq!(out.code, 1, "CHECK must fail: {out:?}");

    inv("DEL").run_in_ns(&host, &conf).ok();
    assert_eq!(host_veths(&host), Vec::<Value>::new());
    assert!(!node.saved(&container).exists());
}

#[test]
fn status_asks_bridge_and_host_local_once_subnet_env_is_there() {
    let node = Node::new(STACK);
    let conf = node.flannel_config("1.1.0", json!({}));
    let status = || node.flannel("STATUS").run(&conf);
    let out = status();
    out.err(50);
    assert!(out.msg().contains("has not written it"), "{}", out.msg());
    node.write_subnet_env("subnet-dual.env");
    status().ok();
}

#[test]
fn gc_forgets_the_containers_the_runtime_no_longer_has() {
    let node = Node::new(STACK);
    node.write_subnet_env("subnet-ipv4.env");
    let host = TestNs::new("flh");
    let pods = [TestNs::new("flp"), TestNs::new("flp")];
    let ids = [unique_name("ctr"), unique_name("ctr")];
    let conf = node.flannel_config("1.1.0", json!({"delegate": {"isDefaultGateway": true}}));
    let inv = |cmd: &str, i: usize| {
        node.flannel(cmd)
            .container_id(&ids[i])
            .netns(&pods[i].path_str())
    };
    for i in [0, 1] {
        inv("ADD", i).run_in_ns(&host, &conf).ok();
    }
    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": ids[0], "ifname": "eth0"}]);
    node.flannel("GC").run_in_ns(&host, &gc).ok();
    assert!(node.saved(&ids[0]).exists(), "the live container is kept");
    assert!(
        !node.saved(&ids[1]).exists(),
        "the gone container is forgotten"
    );
    // The bridge handed the list on to host-local, which released the gone one's address.
    assert_eq!(node.allocations(), vec![pod_address(&pods[0])]);

    inv("DEL", 0).run_in_ns(&host, &conf).ok();
    assert!(pods[0].link("eth0").is_none());
    assert!(!node.saved(&ids[0]).exists());
}
