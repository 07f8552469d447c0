//! containerd 1.6 (Debian's) with runc: `ctr run --cni` runs a container from an image the test
//! builds and imports, on the flannel conflist: the container gets its address from
//! FLANNEL_SUBNET, reaches the gateway, its mapped port answers on the node, and when the task
//! ends ctr's CNI DEL releases everything.
//!
//! ctr has no flag to publish a port (it passes no capability arguments), so the mapping is a
//! fixed `runtimeConfig.portMappings` on the conflist's portmap entry, which libcni passes
//! through unchanged; the container's own address is checked as well.

use e2e::checks::{
    assert_footprint_gone, assert_footprint_present, assert_no_attachments,
    assert_on_flannel_network, assert_serves,
};
use e2e::{image, plugins, Node, PluginSet, RootSnapshot, Session};

const SCRIPT: &str = include_str!("../src/scripts/containerd.sh");
const IMAGE_REF: &str = "e2e.local/busybox:latest";
/// The containerd namespace the script uses; ctr names a container `<namespace>-<id>` to CNI.
const CTR_NAMESPACE: &str = "e2e";
const PORT: u16 = 8080;
const HOST_PORT: u16 = 18080;

/// Node `n` runs one container under containerd with `set`, checked while it runs and after.
fn ctr_runs_a_container(set: PluginSet, n: u8) {
    let root = RootSnapshot::take();
    let conflist = plugins::with_static_port_mapping(plugins::flannel_conflist(), HOST_PORT, PORT);
    let node = Node::new("ctr", set, n, &conflist);
    image::busybox_rootfs(&node.path("rootfs"));
    let archive = node.path("image.tar");
    image::docker_archive(
        &node.path("rootfs"),
        IMAGE_REF,
        &node.path("image"),
        &archive,
    );
    let name = testkit::unique_name("web");
    let container_id = format!("{CTR_NAMESPACE}-{name}");

    let mut session = Session::start(
        &node,
        SCRIPT,
        &[
            ("NAME", name.as_str()),
            ("IMAGE_TAR", archive.to_str().unwrap()),
            ("IMAGE_REF", IMAGE_REF),
            ("PORT", &PORT.to_string()),
        ],
    );
    let running = session.until_pause();
    let ip = assert_on_flannel_network(&node, running);
    assert_serves(&node, ip, PORT, HOST_PORT);
    assert_footprint_present(&node, &container_id, ip);
    assert_eq!(node.veths().len(), 1, "one veth in the host namespace");

    session.resume();
    let ended = session.finish();
    ended.ok("kill");
    ended.step("run-ended");
    assert_eq!(ended.ok("containers"), "", "ctr --rm left the container");
    assert_eq!(ended.ok("tasks"), "", "ctr left the task");
    assert_eq!(ended.exit, Some(0), "{ended}");
    assert_footprint_gone(&node, &container_id);
    assert_no_attachments(&node);
    root.assert_clean_after(node);
}

#[test]
fn ctr_with_our_plugins() {
    ctr_runs_a_container(PluginSet::Ours, 111);
}

#[test]
fn ctr_with_go_bridge_host_local_portmap() {
    ctr_runs_a_container(PluginSet::Go, 112);
}
