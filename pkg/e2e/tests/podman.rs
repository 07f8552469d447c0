//! podman 4 (Debian's) with its CNI backend runs a container on the flannel conflist: the
//! container gets its address from FLANNEL_SUBNET, reaches the gateway, its published port
//! answers on the node, and `podman rm` releases everything.

use e2e::checks::{
    assert_footprint_gone, assert_footprint_present, assert_no_attachments,
    assert_on_flannel_network, assert_serves,
};
use e2e::{image, plugins, Node, PluginSet, RootSnapshot, Session};

const SCRIPT: &str = concat!(
    include_str!("../src/scripts/podman-setup.sh"),
    include_str!("../src/scripts/podman.sh")
);
const PORT: u16 = 8080;
const HOST_PORT: u16 = 18080;

/// Node `n` runs one container under podman with `set`, checked while it runs and after rm.
fn podman_runs_a_container(set: PluginSet, n: u8) {
    let root = RootSnapshot::take();
    let node = Node::new("pm", set, n, &plugins::flannel_conflist());
    let rootfs = node.path("rootfs");
    image::busybox_rootfs(&rootfs);
    let name = testkit::unique_name("web");

    let mut session = Session::start(
        &node,
        SCRIPT,
        &[
            ("NAME", name.as_str()),
            ("ROOTFS", rootfs.to_str().unwrap()),
            ("PORT", &PORT.to_string()),
            ("HOST_PORT", &HOST_PORT.to_string()),
        ],
    );
    let running = session.until_pause();
    let container_id = running
        .ok("run")
        .lines()
        .last()
        .unwrap_or_default()
        .to_string();
    let ip = assert_on_flannel_network(&node, running);
    assert_eq!(
        running.ok("inspect"),
        ip.to_string(),
        "podman reports another address than the container has"
    );
    assert_serves(&node, ip, PORT, HOST_PORT);
    assert_footprint_present(&node, &container_id, ip);
    assert_eq!(node.veths().len(), 1, "one veth in the host namespace");

    session.resume();
    let removed = session.finish();
    removed.ok("rm");
    assert_eq!(removed.ok("ps"), "", "podman still lists a container");
    assert_eq!(removed.ok("netns"), "", "podman left its netns mount");
    assert_eq!(removed.exit, Some(0), "{removed}");
    assert_footprint_gone(&node, &container_id);
    assert_no_attachments(&node);
    root.assert_clean_after(node);
}

#[test]
fn podman_with_our_plugins() {
    podman_runs_a_container(PluginSet::Ours, 101);
}

#[test]
fn podman_with_go_bridge_host_local_portmap() {
    podman_runs_a_container(PluginSet::Go, 102);
}
