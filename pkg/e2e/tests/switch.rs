//! Switching a node in place, under podman: with a container attached by Debian's Go bridge,
//! host-local and portmap (behind our flannel), `scripts/install.sh` puts our plugins in the same
//! directory; a new container is attached by ours and ours remove the old one; then the Go
//! binaries are put back and they remove the container ours made. Each set reads and releases
//! what the other wrote: leases, the saved delegate, the veth, the port-forwarding rules. Once on
//! an IPv4 node and once on a dual-stack one, where each container also has an IPv6 address,
//! its lease and its ip6tables rules.

use e2e::checks::{
    assert_footprint_gone, assert_footprint_present_for, assert_no_attachments,
    assert_on_flannel_network, assert_on_flannel_network6, assert_serves,
};
use e2e::install::{fresh_tree, run_install, succeeded};
use e2e::{image, plugins, Node, PluginSet, RootSnapshot, Session, Transcript};
use std::net::IpAddr;

const SCRIPT: &str = concat!(
    include_str!("../src/scripts/podman-setup.sh"),
    include_str!("../src/scripts/switch.sh")
);
const PORT: u16 = 8080;
const OLD_PORT: u16 = 18080;
const NEW_PORT: u16 = 18081;

/// The container the last `start_web` started: its ID and addresses (IPv4 first), checked.
fn started(node: &Node, t: &Transcript, host_port: u16) -> (String, Vec<IpAddr>) {
    let id = t.ok("run").lines().last().unwrap_or_default().to_string();
    let ip = assert_on_flannel_network(node, t);
    assert_eq!(t.ok("inspect"), ip.to_string());
    let mut ips = vec![IpAddr::from(ip)];
    if node.gateway6().is_some() {
        ips.push(assert_on_flannel_network6(node, t).into());
    }
    for &ip in &ips {
        assert_serves(node, ip, PORT, host_port);
    }
    assert_footprint_present_for(node, &id, &ips);
    (id, ips)
}

fn switch_from_the_go_plugins_to_ours_and_back(node: Node) {
    let root = RootSnapshot::take();
    let rootfs = node.path("rootfs");
    image::busybox_rootfs(&rootfs);
    let (old, new) = (testkit::unique_name("old"), testkit::unique_name("new"));
    let mut session = Session::start(
        &node,
        SCRIPT,
        &[
            ("OLD", old.as_str()),
            ("NEW", new.as_str()),
            ("ROOTFS", rootfs.to_str().unwrap()),
            ("PORT", &PORT.to_string()),
            ("OLD_PORT", &OLD_PORT.to_string()),
            ("NEW_PORT", &NEW_PORT.to_string()),
        ],
    );

    let (old_id, old_ips) = started(&node, session.until_pause(), OLD_PORT);
    let tree = fresh_tree();
    let bin = node.path("bin");
    succeeded(&run_install(
        tree.path(),
        &["--bin-dir", bin.to_str().unwrap()],
    ));
    for &ip in &old_ips {
        assert_serves(&node, ip, PORT, OLD_PORT);
    }

    session.resume();
    let t = session.until_pause();
    t.ok("rm");
    let (new_id, new_ips) = started(&node, t, NEW_PORT);
    assert_footprint_gone(&node, &old_id);
    assert_eq!(node.veths().len(), 1, "only the new container's veth");
    // Removing the old container did not disturb the bridge or the new one's rules.
    for &ip in &new_ips {
        assert_serves(&node, ip, PORT, NEW_PORT);
    }
    PluginSet::Go.install(&bin);

    session.resume();
    let t = session.finish();
    t.ok("rm");
    assert_eq!(t.ok("ps"), "", "podman still lists a container");
    assert_eq!(t.ok("netns"), "", "podman left a netns mount");
    assert_eq!(t.exit, Some(0), "{t}");
    assert_footprint_gone(&node, &new_id);
    assert_no_attachments(&node);
    root.assert_clean_after(node);
}

#[test]
fn switching_a_node_from_the_go_plugins_to_ours_and_back() {
    switch_from_the_go_plugins_to_ours_and_back(Node::new(
        "sw",
        PluginSet::Go,
        121,
        &plugins::flannel_conflist(),
    ));
}

#[test]
fn switching_a_dual_stack_node_from_the_go_plugins_to_ours_and_back() {
    switch_from_the_go_plugins_to_ours_and_back(Node::dual_stack(
        "sw6",
        PluginSet::Go,
        122,
        &plugins::flannel_conflist(),
    ));
}
