//! `--ip-blackhole-route`, as Go's flanneld (0.27.1 and later) has it: a blackhole route to the
//! node's own subnet, put back after it is deleted (at the next `--iptables-resync`), and left
//! alone where another route to the subnet is there (a bridge's), with one warning.

mod common;

use common::*;
use std::time::Duration;

const T: Duration = Duration::from_secs(30);

fn blackholes(node: &Node) -> String {
    node.ns.run("ip", &["route", "show", "type", "blackhole"])
}

#[test]
fn a_blackhole_route_to_the_subnet_is_kept_and_doctor_sees_it() {
    let node = Node::new("fbh");
    let reg = node.registry(r#"{"Network":"10.9.0.0/16","Backend":{"Type":"alloc"}}"#);
    let reg = reg.display().to_string();
    let args = [
        "--registry-dir",
        reg.as_str(),
        "--ip-blackhole-route",
        "--iptables-resync=1",
    ];
    let a = Daemon::start(&node, "a", &args, &[]);
    let subnet = a.subnet(T);
    let net = subnet.replace(".1/24", ".0/24");
    let want = format!("blackhole {net}");
    wait_for("the blackhole route", T, || {
        blackholes(&node).contains(&want).then_some(())
    });
    node.ns.ip(&["route", "del", "blackhole", &net]);
    wait_for("the blackhole route put back", T, || {
        blackholes(&node).contains(&want).then_some(())
    });
    let doctor = node
        .ns
        .command(FLANNELD)
        .arg("doctor")
        .args(args)
        .args(["--subnet-file", a.subnet_file.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&doctor.stdout);
    assert!(doctor.status.success(), "{text}");
    assert!(
        text.contains(&format!("blackhole  ok       {want}")),
        "{text}"
    );
}

#[test]
fn where_a_bridge_holds_the_subnet_it_is_left_alone_with_one_warning() {
    let node = Node::new("fbb");
    // Dual-stack: the bridge holds the IPv4 subnet only, so the IPv6 blackhole route, deleted
    // and put back at each pass, shows the passes that go by.
    node.ns
        .ip(&["addr", "add", "fd00:100::1/64", "dev", "eth0", "nodad"]);
    let reg = node.path("registry");
    std::fs::create_dir_all(reg.join("subnets")).unwrap();
    std::fs::write(
        reg.join("config"),
        r#"{"Network":"10.9.0.0/16","EnableIPv6":true,"IPv6Network":"fc00:9::/48","Backend":{"Type":"alloc"}}"#,
    )
    .unwrap();
    let reg = reg.display().to_string();
    let mut args = vec!["--registry-dir", reg.as_str(), "--iptables-resync=1"];
    // A first start takes the lease; a bridge then holds the subnet, as after pods' ADD.
    let mut a = Daemon::start(&node, "a", &args, &[]);
    let subnet = a.subnet(T);
    a.stop();
    node.ns.ip(&["link", "add", "cni0", "type", "bridge"]);
    node.ns.ip(&["addr", "add", &subnet, "dev", "cni0"]);
    node.ns.ip(&["link", "set", "cni0", "up"]);
    args.push("--ip-blackhole-route");
    let mut b = Daemon::start(&node, "b", &args, &[]);
    b.wait_log("another route to", T);
    let v6 = b
        .wait_subnet_env(T)
        .lines()
        .find_map(|l| l.strip_prefix("FLANNEL_IPV6_SUBNET="))
        .expect("an IPv6 subnet")
        .replace("::1/64", "::/64");
    let v6_blackhole = || {
        node.ns
            .run("ip", &["-6", "route", "show", "type", "blackhole"])
            .contains(&v6)
    };
    for pass in 1..=3 {
        wait_for(&format!("the IPv6 blackhole route ({pass})"), T, || {
            v6_blackhole().then_some(())
        });
        node.ns.ip(&["-6", "route", "del", "blackhole", &v6]);
    }
    wait_for("the IPv6 blackhole route put back", T, || {
        v6_blackhole().then_some(())
    });
    assert!(b.running());
    let v4 = node
        .ns
        .run("ip", &["-4", "route", "show", "type", "blackhole"]);
    assert_eq!(v4.trim(), "");
    assert_eq!(b.log_text().matches("another route to").count(), 1);
}
