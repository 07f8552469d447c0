//! ADD, DEL, CHECK, STATUS and GC of our binary against a temporary dataDir.

mod common;

use common::*;
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;

const VERSIONS: [&str; 7] = [
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
];

fn resolv_conf(net: &Net) -> String {
    let path = net.tmp.path().join("resolv.conf");
    std::fs::write(
        &path,
        "# comment\nnameserver 10.96.0.10\nnameserver 2001:db8::53\n; other\n\
         domain cluster.local\nsearch svc.cluster.local cluster.local\noptions ndots:5\n",
    )
    .unwrap();
    path.display().to_string()
}

#[test]
fn add_prints_addresses_routes_and_dns_in_every_spec_version() {
    for version in VERSIONS {
        let net = Net::new();
        let conf = net.conf(
            version,
            json!({
                "ranges": [[{"subnet": "10.10.0.0/24"}], [{"subnet": "2001:db8:10::/64"}]],
                "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0", "gw": "2001:db8:10::1"}],
                "resolvConf": resolv_conf(&net),
            }),
        );
        let r = ours("ADD").run(&conf).ok();
        assert_eq!(r["cniVersion"], version);
        let dns = json!({
            "nameservers": ["10.96.0.10", "2001:db8::53"],
            "domain": "cluster.local",
            "search": ["svc.cluster.local", "cluster.local"],
            "options": ["ndots:5"]
        });
        assert_eq!(r["dns"], dns, "{version}: {r}");
        if version < "0.3.0" {
            assert_eq!(
                r["ip4"],
                json!({"ip": "10.10.0.2/24", "gateway": "10.10.0.1", "routes": [{"dst": "0.0.0.0/0"}]}),
                "{version}"
            );
            assert_eq!(
                r["ip6"],
                json!({"ip": "2001:db8:10::2/64", "gateway": "2001:db8:10::1",
                       "routes": [{"dst": "::/0", "gw": "2001:db8:10::1"}]}),
                "{version}"
            );
            assert!(r.get("ips").is_none());
        } else {
            let mut v4 = json!({"address": "10.10.0.2/24", "gateway": "10.10.0.1"});
            let mut v6 = json!({"address": "2001:db8:10::2/64", "gateway": "2001:db8:10::1"});
            if version < "1.0.0" {
                v4["version"] = json!("4");
                v6["version"] = json!("6");
            }
            assert_eq!(r["ips"], json!([v4, v6]), "{version}");
            assert_eq!(
                r["routes"],
                json!([{"dst": "0.0.0.0/0"}, {"dst": "::/0", "gw": "2001:db8:10::1"}]),
                "{version}"
            );
            assert!(r.get("interfaces").is_none());
        }
    }
}

#[test]
fn two_rangesets_of_one_family_are_refused_below_0_3_0_and_nothing_is_taken() {
    for version in VERSIONS {
        let net = Net::new();
        let conf = net.conf(
            version,
            json!({"ranges": [[{"subnet": "10.10.0.0/24"}], [{"subnet": "10.11.0.0/24"}]]}),
        );
        let out = ours("ADD").run(&conf);
        if version < "0.3.0" {
            let e = out.err(7);
            let msg = e["msg"].as_str().unwrap();
            assert!(msg.contains("more than 1 address per family"), "{msg}");
            assert!(msg.contains(&format!("{version:?}")), "{msg}");
            assert!(net.reservations().is_empty());
        } else {
            assert_eq!(
                addresses(&out.ok()),
                ["10.10.0.2", "10.11.0.2"],
                "{version}"
            );
        }
    }
}

#[test]
fn reservations_are_written_in_the_go_format() {
    let net = Net::new();
    let conf = net.conf(
        "1.0.0",
        json!({"ranges": [[{"subnet": "10.20.0.0/16"}], [{"subnet": "fd00:20::/64"}]]}),
    );
    let r = ours("ADD")
        .container_id("ctr-one")
        .ifname("net1")
        .run(&conf)
        .ok();
    assert_eq!(addresses(&r), ["10.20.0.2", "fd00:20::2"]);
    let files = net.reservations();
    assert_eq!(files["10.20.0.2"], "ctr-one\r\nnet1");
    assert_eq!(files["fd00:20::2"], "ctr-one\r\nnet1");
    assert_eq!(net.mode_of("10.20.0.2"), 0o600);
    assert_eq!(net.mode_of("fd00:20::2"), 0o600);
    let last0 = std::fs::read_to_string(net.dir().join("last_reserved_ip.0")).unwrap();
    let last1 = std::fs::read_to_string(net.dir().join("last_reserved_ip.1")).unwrap();
    assert_eq!(
        (last0.as_str(), last1.as_str()),
        ("10.20.0.2", "fd00:20::2")
    );
    assert!(net.dir().join("lock").exists());
    for dir in [net.data_dir(), net.dir()] {
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o755, "{}", dir.display());
    }
}

#[test]
fn round_robin_continues_after_the_last_reserved_address_and_wraps() {
    let net = Net::new();
    let conf = net.subnet("1.0.0", "10.30.0.0/29"); // .2 to .6: five addresses
    let add = |id: &str| address(&ours("ADD").container_id(id).run(&conf).ok());
    assert_eq!(add("a"), "10.30.0.2");
    assert_eq!(add("b"), "10.30.0.3");
    ours("DEL").container_id("a").run(&conf).ok();
    // The freed .2 is not reused before the rest of the range.
    assert_eq!(add("c"), "10.30.0.4");
    assert_eq!(add("d"), "10.30.0.5");
    assert_eq!(add("e"), "10.30.0.6");
    assert_eq!(add("f"), "10.30.0.2");
    let e = ours("ADD").container_id("g").run(&conf).err(999);
    let msg = e["msg"].as_str().unwrap();
    assert!(
        msg.contains("no IP addresses available in range set: 10.30.0.1-10.30.0.6"),
        "{msg}"
    );
    assert_eq!(net.reservations().len(), 5);
}

#[test]
fn explicit_range_bounds_and_gateway_are_honoured() {
    let net = Net::new();
    let conf = net.conf(
        "1.0.0",
        json!({"subnet": "10.31.0.0/24", "rangeStart": "10.31.0.100", "rangeEnd": "10.31.0.101",
               "gateway": "10.31.0.100"}),
    );
    let r = ours("ADD").container_id("a").run(&conf).ok();
    assert_eq!(r["ips"][0]["address"], "10.31.0.101/24");
    assert_eq!(r["ips"][0]["gateway"], "10.31.0.100");
    ours("ADD").container_id("b").run(&conf).err(999);
}

#[test]
fn a_second_add_for_the_same_attachment_is_refused_naming_the_holder() {
    let net = Net::new();
    let conf = net.subnet("1.0.0", "10.32.0.0/24");
    let add = |id: &str, ifname: &str| ours("ADD").container_id(id).ifname(ifname).run(&conf);
    add("dup", "eth0").ok();
    let e = add("dup", "eth0").err(999);
    let msg = e["msg"].as_str().unwrap();
    assert!(
        msg.contains("10.32.0.2 has been allocated to dup") && msg.contains("duplicate"),
        "{msg}"
    );
    // The failed ADD released nothing it did not take.
    assert_eq!(net.reservations().len(), 1);
    assert_eq!(address(&add("dup", "eth1").ok()), "10.32.0.3");
}

#[test]
fn requested_addresses_from_cni_args_args_and_runtime_config() {
    let net = Net::new();
    let ipam = json!({"ranges": [[{"subnet": "10.33.0.0/24"}], [{"subnet": "fd00:33::/64"}]]});
    let conf = net.conf("1.0.0", ipam.clone());
    let r = ours("ADD")
        .container_id("a")
        .args("IgnoreUnknown=1;IP=fd00:33::99,10.33.0.99")
        .run(&conf)
        .ok();
    assert_eq!(addresses(&r), ["10.33.0.99", "fd00:33::99"]);

    let mut with_args = conf.clone();
    with_args["args"] = json!({"cni": {"ips": ["10.33.0.77/24"]}});
    let r = ours("ADD").container_id("b").run(&with_args).ok();
    assert_eq!(addresses(&r)[0], "10.33.0.77");

    let mut with_runtime = conf.clone();
    with_runtime["runtimeConfig"] = json!({"ips": ["fd00:33::55"]});
    let r = ours("ADD").container_id("c").run(&with_runtime).ok();
    assert_eq!(addresses(&r)[1], "fd00:33::55");
    assert_eq!(
        std::fs::read_to_string(net.dir().join("last_reserved_ip.1")).unwrap(),
        "fd00:33::55"
    );
}

#[test]
fn requested_addresses_that_cannot_be_honoured_fail_naming_them_and_leave_nothing() {
    let net = Net::new();
    let conf = net.conf(
        "1.0.0",
        json!({"ranges": [[{"subnet": "10.34.0.0/24"}], [{"subnet": "fd00:34::/64"}]]}),
    );
    ours("ADD")
        .container_id("holder")
        .args("IP=fd00:34::5")
        .run(&conf)
        .ok();
    let before = net.reservations();

    // Taken: the v4 address of this ADD is released again.
    let e = ours("ADD")
        .container_id("x")
        .args("IP=fd00:34::5")
        .run(&conf)
        .err(999);
    let msg = e["msg"].as_str().unwrap();
    assert!(
        msg.contains("fd00:34::5") && msg.contains("not available"),
        "{msg}"
    );
    assert_eq!(net.reservations(), before);

    for (args, named) in [
        ("IP=10.34.0.1", "10.34.0.1 (CNI_ARGS IP) is the gateway"),
        ("IP=10.99.0.5", "10.99.0.5 (CNI_ARGS IP)"),
        ("IP=10.34.0.5,10.34.0.6", "10.34.0.6 (CNI_ARGS IP)"),
        ("IP=banana", "CNI_ARGS IP \"banana\""),
    ] {
        let e = ours("ADD").container_id("y").args(args).run(&conf).err(7);
        let msg = e["msg"].as_str().unwrap();
        assert!(msg.contains(named), "{args}: {msg}");
        assert_eq!(net.reservations(), before, "{args}");
    }
}

#[test]
fn runtime_ip_ranges_come_first_and_legacy_fields_before_ranges() {
    let net = Net::new();
    let mut conf = net.conf(
        "1.0.0",
        json!({"subnet": "10.35.1.0/24", "ranges": [[{"subnet": "10.35.2.0/24"}]]}),
    );
    conf["runtimeConfig"] = json!({"ipRanges": [[{"subnet": "10.35.0.0/24"}]]});
    let r = ours("ADD").run(&conf).ok();
    assert_eq!(addresses(&r), ["10.35.0.2", "10.35.1.2", "10.35.2.2"]);
    let last: Vec<String> = (0..3)
        .map(|i| std::fs::read_to_string(net.dir().join(format!("last_reserved_ip.{i}"))).unwrap())
        .collect();
    assert_eq!(last, ["10.35.0.2", "10.35.1.2", "10.35.2.2"]);
}

#[test]
fn config_rules_are_code_7_naming_field_and_value() {
    let net = Net::new();
    let cases: Vec<(Value, &str)> = vec![
        (json!({}), "no IP ranges specified"),
        (json!({"subnet": "10.0.0.0/31"}), "ipam.subnet \"10.0.0.0/31\": network 10.0.0.0/31 is too small"),
        (json!({"subnet": "10.0.0.1/32"}), "ipam.subnet \"10.0.0.1/32\""),
        (json!({"ranges": [[{"subnet": "fd00::/127"}]]}), "ipam.ranges[0][0].subnet \"fd00::/127\": network fd00::/127 is too small"),
        (json!({"ranges": [[{"subnet": "fd00::/128"}]]}), "\"fd00::/128\": network fd00::/128 is too small"),
        (json!({"subnet": "10.0.0.7/24"}), "ipam.subnet \"10.0.0.7/24\": host bits are set: for a /24 the network address is 10.0.0.0"),
        (json!({"subnet": "10.0.0.0/24", "rangeStart": "10.0.1.1"}), "ipam.rangeStart \"10.0.1.1\": not in network 10.0.0.0/24"),
        (json!({"subnet": "10.0.0.0/24", "rangeEnd": "10.1.0.1"}), "ipam.rangeEnd \"10.1.0.1\": not in network 10.0.0.0/24"),
        (json!({"subnet": "10.0.0.0/24", "gateway": "ten"}), "ipam.gateway \"ten\": not an IP address"),
        (json!({"ranges": [[{"subnet": "10.0.0.0/24"}, {"subnet": "fd00::/64"}]]}), "ipam.ranges[0][1].subnet \"fd00::/64\": mixed address families"),
        (json!({"ranges": [[{"subnet": "10.0.0.0/24"}, {"subnet": "10.0.0.0/25"}]]}), "ipam.ranges[0][0] (10.0.0.1-10.0.0.254 in 10.0.0.0/24) and ipam.ranges[0][1] (10.0.0.1-10.0.0.126 in 10.0.0.0/25) overlap"),
        (json!({"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "10.0.0.0/16"}]]}), "range set 0 (ipam.ranges[0] = 10.0.0.1-10.0.0.254) overlaps with range set 1 (ipam.ranges[1] = 10.0.0.1-10.0.255.254)"),
        (json!({"ranges": [[]]}), "ipam.ranges[0] is an empty range set"),
        (json!({"subnet": "10.0.0.0/24", "routes": [{"dst": "1.2.3.4"}]}), "ipam.routes[0].dst \"1.2.3.4\": not a CIDR"),
        (json!({"subnet": "10.0.0.0/24", "resolvConf": "/nonexistent/resolv.conf"}), "ipam.resolvConf \"/nonexistent/resolv.conf\""),
    ];
    for (ipam, expected) in cases {
        let conf = net.conf("1.0.0", ipam.clone());
        let e = ours("ADD").run(&conf).err(7);
        let msg = e["msg"].as_str().unwrap();
        assert!(
            msg.contains(expected),
            "{ipam}:\n  got {msg}\n  want {expected}"
        );
    }
    let no_ipam = json!({"cniVersion": "1.0.0", "name": "x"});
    let e = ours("ADD").run(&no_ipam).err(7);
    assert!(e["msg"].as_str().unwrap().contains("\"ipam\""));
    // A value of the wrong JSON type is a decoding error naming its path.
    let conf = net.conf("1.0.0", json!({"ranges": [[{"subnet": ["10.0.0.0/24"]}]]}));
    let e = ours("ADD").run(&conf).err(6);
    assert!(e["msg"]
        .as_str()
        .unwrap()
        .contains("ipam.ranges[0][0].subnet"));
    // DEL reads only where the files are: it succeeds, and makes nothing.
    let conf = net.subnet("1.0.0", "10.0.0.0/31");
    ours("DEL").run(&conf).ok();
    assert!(
        net.files().is_empty(),
        "nothing is made for a refused config"
    );
}

#[test]
fn del_releases_by_container_and_ifname_and_missing_is_success() {
    let net = Net::new();
    let conf = net.subnet("1.0.0", "10.36.0.0/24");
    ours("ADD").container_id("a").ifname("eth0").run(&conf).ok();
    ours("ADD").container_id("a").ifname("eth1").run(&conf).ok();
    ours("ADD").container_id("b").ifname("eth0").run(&conf).ok();
    ours("DEL").container_id("a").ifname("eth0").run(&conf).ok();
    let left: Vec<String> = net.reservations().into_values().collect();
    assert_eq!(left, ["a\r\neth1", "b\r\neth0"]);
    // Again, and for something never added: success.
    ours("DEL").container_id("a").ifname("eth0").run(&conf).ok();
    ours("DEL").container_id("never").run(&conf).ok();
    ours("DEL").container_id("a").ifname("eth1").run(&conf).ok();
    ours("DEL").container_id("b").run(&conf).ok();
    net.assert_empty();
}

#[test]
fn del_without_a_network_directory_succeeds_and_creates_nothing() {
    let net = Net::new();
    let conf = net.subnet("1.0.0", "10.37.0.0/24");
    ours("DEL").unset("CNI_NETNS").run(&conf).ok();
    assert!(!net.data_dir().exists());
}

/// Configs that ADD refuses but that still name the network and its dataDir.
fn no_longer_valid(net: &Net, version: &str) -> Vec<(&'static str, Value)> {
    vec![
        (
            "a subnet that is not a network address",
            net.subnet(version, "10.45.0.5/24"),
        ),
        (
            "a rangeFromFile that is gone",
            net.conf(
                version,
                json!({"rangeFromFile": net.tmp.path().join("gone.json")}),
            ),
        ),
        (
            "overlapping range sets",
            net.conf(
                version,
                json!({"subnet": "10.45.0.0/16", "ranges": [[{"subnet": "10.45.0.0/24"}]]}),
            ),
        ),
    ]
}

#[test]
fn del_releases_even_when_the_config_no_longer_validates() {
    let net = Net::new();
    let conf = net.subnet("1.0.0", "10.45.0.0/24");
    for (why, bad) in no_longer_valid(&net, "1.0.0") {
        ours("ADD").container_id("a").run(&conf).ok();
        ours("ADD").run(&bad).err(7);
        ours("DEL").container_id("a").run(&bad).ok();
        assert!(net.reservations().is_empty(), "{why}: the address is free");
    }
    // A malformed CNI_ARGS IP is not read by DEL either.
    ours("ADD").container_id("a").run(&conf).ok();
    ours("DEL").container_id("a").args("IP=zz").run(&conf).ok();
    net.assert_empty();
    // An unreadable dataDir leaves the default one: DEL succeeds, so that the rest of the
    // chain still runs, says why on stderr, and releases nothing it could not find.
    ours("ADD").container_id("a").run(&conf).ok();
    let mut wrong = conf.clone();
    wrong["ipam"]["dataDir"] = json!(5);
    let out = ours("DEL").container_id("a").run(&wrong);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stderr.contains("ipam.dataDir"), "{out:?}");
    assert_eq!(net.reservations().len(), 1);
    ours("DEL").container_id("a").run(&conf).ok();
    net.assert_empty();
}

#[test]
fn one_line_reservations_of_old_versions_are_found_and_released_by_container_id() {
    let net = Net::new();
    let conf = net.subnet("0.4.0", "10.38.0.0/24");
    net.write_reservation("10.38.0.50", "oldctr\n");
    net.write_reservation("10.38.0.51", "otherctr");
    ours("CHECK").container_id("oldctr").run(&conf).ok();
    // It counts as held: no second address for the same container.
    let e = ours("ADD").container_id("oldctr").run(&conf).err(999);
    assert!(e["msg"]
        .as_str()
        .unwrap()
        .contains("10.38.0.50 has been allocated to oldctr"));
    ours("DEL").container_id("oldctr").run(&conf).ok();
    assert_eq!(
        net.reservations().keys().collect::<Vec<_>>(),
        ["10.38.0.51"]
    );
}

#[test]
fn a_full_match_is_released_before_one_line_ones() {
    let net = Net::new();
    let conf = net.subnet("1.0.0", "10.39.0.0/24");
    net.write_reservation("10.39.0.50", "c");
    ours("ADD")
        .container_id("c")
        .ifname("eth1")
        .run(&conf)
        .err(999);
    let mut with_ip = conf.clone();
    with_ip["args"] = json!({"cni": {"ips": ["10.39.0.60"]}});
    ours("ADD")
        .container_id("c")
        .ifname("eth1")
        .run(&with_ip)
        .ok();
    // DEL c/eth1 finds its own file and leaves the old one-line one alone, as Go does.
    ours("DEL").container_id("c").ifname("eth1").run(&conf).ok();
    assert_eq!(
        net.reservations().keys().collect::<Vec<_>>(),
        ["10.39.0.50"]
    );
    ours("DEL").container_id("c").ifname("eth1").run(&conf).ok();
    net.assert_empty();
}

#[test]
fn check_needs_an_address_held_by_the_attachment() {
    for version in ["0.4.0", "1.0.0", "1.1.0"] {
        let net = Net::new();
        let conf = net.subnet(version, "10.40.0.0/24");
        let e = ours("CHECK").container_id("a").run(&conf).err(999);
        let msg = e["msg"].as_str().unwrap();
        assert!(msg.contains("container a") && msg.contains("eth0"), "{msg}");
        ours("ADD").container_id("a").run(&conf).ok();
        ours("CHECK").container_id("a").run(&conf).ok();
        ours("CHECK")
            .container_id("a")
            .ifname("eth1")
            .run(&conf)
            .err(999);
        ours("DEL").container_id("a").run(&conf).ok();
        ours("CHECK").container_id("a").run(&conf).err(999);
    }
    // Before 0.4.0 there is no CHECK.
    let net = Net::new();
    ours("CHECK")
        .run(&net.subnet("0.3.1", "10.40.0.0/24"))
        .err(1);
}

#[test]
fn status_answers_ready_when_the_data_dir_is_usable() {
    let net = Net::new();
    ours("STATUS")
        .run(&net.subnet("1.1.0", "10.41.0.0/24"))
        .ok();
    assert!(!net.data_dir().exists(), "STATUS creates nothing");
    std::fs::write(net.data_dir(), "not a directory").unwrap();
    let e = ours("STATUS")
        .run(&net.subnet("1.1.0", "10.41.0.0/24"))
        .err(50);
    let msg = e["msg"].as_str().unwrap();
    assert!(msg.contains(&net.data_dir().display().to_string()), "{msg}");
    ours("STATUS")
        .run(&net.subnet("1.0.0", "10.41.0.0/24"))
        .err(1);
}

fn gc_conf(net: &Net, key: &str, valid: &[(&str, &str)]) -> Value {
    let mut conf = net.subnet("1.1.0", "10.42.0.0/24");
    let list: Vec<Value> = valid
        .iter()
        .map(|(c, i)| json!({"containerID": c, "ifname": i}))
        .collect();
    conf[key] = json!(list);
    conf
}

#[test]
fn gc_releases_everything_not_in_the_valid_attachments() {
    let net = Net::new();
    let conf = net.subnet("1.1.0", "10.42.0.0/24");
    for (id, ifname) in [
        ("keep", "eth0"),
        ("keep", "eth1"),
        ("gone", "eth0"),
        ("gone2", "eth0"),
    ] {
        ours("ADD").container_id(id).ifname(ifname).run(&conf).ok();
    }
    net.write_reservation("10.42.0.100", "legacy-keep");
    net.write_reservation("10.42.0.101", "legacy-gone");
    net.write_reservation("10.42.0.102", "");
    ours("GC")
        .run(&gc_conf(
            &net,
            "cni.dev/valid-attachments",
            &[("keep", "eth0"), ("legacy-keep", "eth0")],
        ))
        .ok();
    let left: Vec<(String, String)> = net.reservations().into_iter().collect();
    assert_eq!(
        left,
        [
            ("10.42.0.100".to_string(), "legacy-keep".to_string()),
            ("10.42.0.2".to_string(), "keep\r\neth0".to_string())
        ]
    );
    assert!(net.files().contains(&"last_reserved_ip.0".to_string()));
    assert!(net.files().contains(&"lock".to_string()));
    // The older key is understood, and an empty list releases everything.
    ours("GC")
        .run(&gc_conf(&net, "cni.dev/attachments", &[("keep", "eth0")]))
        .ok();
    assert_eq!(net.reservations().len(), 1);
    ours("GC")
        .run(&gc_conf(&net, "cni.dev/valid-attachments", &[]))
        .ok();
    net.assert_empty();
    // What GC freed can be handed out again, and the index agrees with the files.
    assert_eq!(
        address(&ours("ADD").container_id("new").run(&conf).ok()),
        "10.42.0.6"
    );
    ours("CHECK").container_id("new").run(&conf).ok();
}

#[test]
fn gc_reports_every_failure() {
    let net = Net::new();
    let conf = net.subnet("1.1.0", "10.43.0.0/24");
    for id in ["a", "b", "c"] {
        ours("ADD").container_id(id).run(&conf).ok();
    }
    // A mount point cannot be unlinked (EBUSY), even by root and on any file system: GC runs in
    // a private mount namespace where two reservation files are bind-mounted onto themselves.
    let pinned = ["10.43.0.2", "10.43.0.3"];
    let files: Vec<String> = pinned
        .iter()
        .map(|p| format!("'{}'", net.dir().join(p).display()))
        .collect();
    let wrapper = net.tmp.path().join("host-local-with-busy-files");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec unshare --mount --propagation private sh -c \
             'for f; do mount --bind \"$f\" \"$f\" || exit 99; done; exec \"$0\"' '{}' {}\n",
            testkit::bin_dir().join("host-local").display(),
            files.join(" ")
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = testkit::Invocation::at(wrapper, "GC")
        .netns(NETNS)
        .run(&gc_conf(&net, "cni.dev/valid-attachments", &[]));
    let e = out.err(5);
    let msg = e["msg"].as_str().unwrap();
    assert!(msg.contains("2 failure(s)"), "{msg}");
    assert!(
        msg.contains("10.43.0.2") && msg.contains("10.43.0.3"),
        "{msg}"
    );
    // The one that could go went; the others stay releasable.
    assert_eq!(net.reservations().len(), 2);
    ours("DEL").container_id("a").run(&conf).ok();
    ours("DEL").container_id("b").run(&conf).ok();
    net.assert_empty();
}

#[test]
fn gc_releases_even_when_the_config_no_longer_validates() {
    let net = Net::new();
    let conf = net.subnet("1.1.0", "10.46.0.0/24");
    for (why, mut bad) in no_longer_valid(&net, "1.1.0") {
        ours("ADD").container_id("keep").run(&conf).ok();
        ours("ADD").container_id("gone").run(&conf).ok();
        bad["cni.dev/valid-attachments"] = json!([{"containerID": "keep", "ifname": "eth0"}]);
        ours("GC").args("IP=zz").run(&bad).ok();
        let left: Vec<String> = net.reservations().into_values().collect();
        assert_eq!(left, ["keep\r\neth0"], "{why}");
        ours("DEL").container_id("keep").run(&conf).ok();
        net.assert_empty();
    }
}

#[test]
fn gc_needs_1_1_0() {
    let net = Net::new();
    ours("GC").run(&net.subnet("1.0.0", "10.44.0.0/24")).err(1);
}

#[test]
fn a_long_container_id_is_stored_inside_the_file_as_go_does() {
    let net = Net::new();
    let conf = net.subnet("1.1.0", "10.42.0.0/24");
    let (long, other) = ("a".repeat(1000), "b".repeat(1000));
    for id in [&long, &other] {
        ours("ADD").container_id(id).run(&conf).ok();
    }
    let files = net.reservations();
    assert_eq!(files["10.42.0.2"], format!("{long}\r\neth0"));
    ours("CHECK").container_id(&long).run(&conf).ok();
    // GC keeps what the list names, whatever CNI_CONTAINERID holds.
    ours("GC")
        .container_id(&long)
        .run(&gc_conf(
            &net,
            "cni.dev/valid-attachments",
            &[(&long, "eth0")],
        ))
        .ok();
    assert_eq!(
        net.reservations().into_keys().collect::<Vec<_>>(),
        ["10.42.0.2"]
    );
    for _ in 0..2 {
        ours("DEL").container_id(&long).run(&conf).ok();
    }
    net.assert_empty();
}

#[test]
fn status_is_code_50_naming_the_exhausted_range_sets() {
    let net = Net::new();
    // A /30 hands out one address: .1 is the gateway, .3 the broadcast address.
    let one = net.conf("1.1.0", json!({"ranges": [[{"subnet": "10.45.0.0/30"}]]}));
    ours("STATUS").run(&one).ok();
    ours("ADD").container_id("a").run(&one).ok();
    let e = ours("STATUS").run(&one).err(50);
    let msg = e["msg"].as_str().unwrap();
    assert!(
        msg.contains("range set 0 (ipam.ranges[0] = 10.45.0.1-10.45.0.2)"),
        "{msg}"
    );
    // It says what ADD would find.
    ours("ADD").container_id("b").run(&one).err(999);
    ours("DEL").container_id("a").run(&one).ok();
    ours("STATUS").run(&one).ok();

    // ADD needs an address from every set: one exhausted set is enough, and only it is named.
    let dual = net.conf(
        "1.1.0",
        json!({"ranges": [[{"subnet": "fd45::/64"}], [{"subnet": "10.45.0.0/30"}]]}),
    );
    ours("ADD").container_id("c").run(&dual).ok();
    let e = ours("STATUS").run(&dual).err(50);
    let msg = e["msg"].as_str().unwrap();
    assert!(
        msg.contains("range set 1") && !msg.contains("range set 0"),
        "{msg}"
    );
    ours("DEL").container_id("c").run(&dual).ok();
    ours("STATUS").run(&dual).ok();
}
