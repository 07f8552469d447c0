//! Result conversion between every pair of spec versions, dual-stack, and the refusals.

use cni_protocol::{CniResult, Version};
use serde_json::{json, Value};

/// The dual-stack sample as a plugin of version `v` prints it.
fn sample(v: Version) -> Value {
    let s = v.as_str();
    let dns = json!({"nameservers": ["10.1.0.10"], "domain": "cluster.local", "search": ["svc.cluster.local"], "options": ["ndots:5"]});
    if v.has_legacy_result() {
        return json!({
            "cniVersion": s,
            "ip4": {"ip": "10.1.17.5/24", "gateway": "10.1.17.1",
                    "routes": [{"dst": "0.0.0.0/0", "gw": "10.1.17.1"}, {"dst": "10.1.0.0/16"}]},
            "ip6": {"ip": "fd00:1:17::5/64", "gateway": "fd00:1:17::1",
                    "routes": [{"dst": "::/0", "gw": "fd00:1:17::1"}]},
            "dns": dns,
        });
    }
    let mut interfaces = json!([
        {"name": "cni0", "mac": "0a:58:0a:01:11:01"},
        {"name": "veth1234", "mac": "aa:bb:cc:dd:ee:01"},
        {"name": "eth0", "mac": "aa:bb:cc:dd:ee:02", "sandbox": "/var/run/netns/pod"}
    ]);
    let mut ips = json!([
        {"interface": 2, "address": "10.1.17.5/24", "gateway": "10.1.17.1"},
        {"interface": 2, "address": "fd00:1:17::5/64", "gateway": "fd00:1:17::1"}
    ]);
    let mut routes = json!([
        {"dst": "0.0.0.0/0", "gw": "10.1.17.1"},
        {"dst": "10.1.0.0/16"},
        {"dst": "::/0", "gw": "fd00:1:17::1"}
    ]);
    if v < Version::V1_0_0 {
        ips[0]["version"] = json!("4");
        ips[1]["version"] = json!("6");
    }
    if v >= Version::V1_1_0 {
        interfaces[2]["mtu"] = json!(1450);
        interfaces[2]["socketPath"] = json!("/run/x.sock");
        interfaces[2]["pciID"] = json!("0000:00:1f.6");
        routes[1]["mtu"] = json!(1400);
        routes[1]["advmss"] = json!(1360);
        routes[1]["priority"] = json!(100);
        routes[1]["table"] = json!(254);
        routes[1]["scope"] = json!(0);
    }
    json!({"cniVersion": s, "interfaces": interfaces, "ips": ips, "routes": routes, "dns": dns})
}

/// What `sample(from)` printed as `to` must be: what both versions hold.
fn expected(from: Version, to: Version) -> Value {
    if to.has_legacy_result()
        || !from.has_legacy_result() && (from >= Version::V1_1_0 || to < Version::V1_1_0)
    {
        return sample(to);
    }
    let mut want = sample(to);
    let o = want.as_object_mut().unwrap();
    if from.has_legacy_result() {
        // 0.2.0 has no interfaces, so none can appear, and no address points at one.
        o.remove("interfaces");
        for ip in o["ips"].as_array_mut().unwrap() {
            ip.as_object_mut().unwrap().remove("interface");
        }
        // 0.2.0 lists routes per family: v4 first, then v6, as the sample already does.
    }
    // Fields of 1.1.0 that the source did not have are absent.
    if from < Version::V1_1_0 {
        let iface = o
            .get_mut("interfaces")
            .and_then(|i| i.get_mut(2))
            .and_then(Value::as_object_mut);
        if let Some(iface) = iface {
            for k in ["mtu", "socketPath", "pciID"] {
                iface.remove(k);
            }
        }
        let r = o["routes"][1].as_object_mut().unwrap();
        for k in ["mtu", "advmss", "priority", "table", "scope"] {
            r.remove(k);
        }
    }
    want
}

#[test]
fn every_version_pair_converts_dual_stack() {
    for from in Version::ALL {
        let parsed =
            CniResult::parse(&sample(from), from).unwrap_or_else(|e| panic!("parse {from}: {e}"));
        for to in Version::ALL {
            let got = parsed
                .to_json(to)
                .unwrap_or_else(|e| panic!("{from} -> {to}: {e}"));
            assert_eq!(got, expected(from, to), "{from} -> {to}");
        }
    }
}

#[test]
fn a_result_without_cni_version_takes_the_hint() {
    let mut v = sample(Version::V0_3_1);
    v.as_object_mut().unwrap().remove("cniVersion");
    let r = CniResult::parse(&v, Version::V0_3_1).unwrap();
    assert_eq!(r.ips.len(), 2);
    assert_eq!(r.interfaces.len(), 3);
}

#[test]
fn empty_dns_is_left_out() {
    let r = CniResult::parse(
        &json!({"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.2/24"}], "dns": {}}),
        Version::V1_0_0,
    )
    .unwrap();
    for to in Version::ALL {
        assert!(r.to_json(to).unwrap().get("dns").is_none(), "{to}");
    }
}

#[test]
fn two_addresses_of_one_family_are_refused_for_legacy_versions() {
    let r = CniResult::parse(
        &json!({"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.2/24"}, {"address": "10.0.1.2/24"}]}),
        Version::V1_0_0,
    )
    .unwrap();
    for to in [Version::V0_1_0, Version::V0_2_0] {
        let e = r.to_json(to).unwrap_err();
        assert_eq!(e.code, 1);
        assert!(
            e.msg.contains("10.0.0.2/24")
                && e.msg.contains("10.0.1.2/24")
                && e.msg.contains(to.as_str()),
            "{}",
            e.msg
        );
    }
    for to in &Version::ALL[2..] {
        assert_eq!(r.to_json(*to).unwrap()["ips"].as_array().unwrap().len(), 2);
    }
}

#[test]
fn malformed_results_name_the_field() {
    for (doc, field) in [
        (
            json!({"cniVersion": "1.0.0", "ips": [{"address": "nope"}]}),
            "ips[0].address",
        ),
        (json!({"cniVersion": "1.0.0", "ips": "x"}), "ips"),
        (
            json!({"cniVersion": "1.0.0", "routes": [{"gw": "10.0.0.1"}]}),
            "routes[0].dst",
        ),
        (
            json!({"cniVersion": "0.2.0", "ip4": {"gateway": "10.0.0.1"}}),
            "ip4.ip",
        ),
        (
            json!({"cniVersion": "1.0.0", "interfaces": [{"name": 5}]}),
            "interfaces[0]",
        ),
    ] {
        let e = CniResult::parse(&doc, Version::V1_0_0).unwrap_err();
        assert_eq!(e.code, 6);
        assert!(e.msg.contains(field), "{field}: {}", e.msg);
    }
    let e = CniResult::parse(&json!({"cniVersion": "7.0.0"}), Version::V1_0_0).unwrap_err();
    assert_eq!(e.code, 1);
}

/// A result is read as the Go plugins read it: keys in any case, the exact one first.
#[test]
fn result_keys_match_in_any_case_as_in_go() {
    let r = CniResult::parse(
        &json!({
            "CNIVersion": "1.0.0",
            "Interfaces": [{"Name": "eth0", "MAC": "0a:00:00:00:00:01", "Sandbox": "/var/run/netns/x"}],
            "IPs": [{"Address": "10.0.0.2/24", "Gateway": "10.0.0.1", "Interface": 0}],
            "Routes": [{"Dst": "0.0.0.0/0", "GW": "10.0.0.1"}],
            "DNS": {"Nameservers": ["10.0.0.10"]}
        }),
        Version::V1_0_0,
    )
    .unwrap();
    assert_eq!(r.interfaces[0].name, "eth0");
    assert_eq!(r.interfaces[0].sandbox, "/var/run/netns/x");
    assert_eq!(r.ips[0].address.to_string(), "10.0.0.2/24");
    assert_eq!(r.ips[0].interface, Some(0));
    assert_eq!(r.routes[0].gw, Some("10.0.0.1".parse().unwrap()));
    assert_eq!(
        r.dns.nameservers,
        vec!["10.0.0.10".parse::<std::net::IpAddr>().unwrap()]
    );
}
