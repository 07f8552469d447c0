//! containerd 1.6's CRI plugin (Debian's), driven over its CRI socket as kubelet drives it, on the
//! stock flannel conflist: a pod sandbox with a hostPort mapping gets a pod address of
//! FLANNEL_SUBNET, answers ping from the node, and its port is reached through the node's
//! address; StopPodSandbox releases the address and removes the rules and flannel's saved
//! delegate, RemovePodSandbox the rest.
//!
//! containerd passes the mapping through go-cni with Go's field names
//! (`{"HostPort":18080,"ContainerPort":8080,...}`), unlike ctr or podman. The sandbox image's
//! own command is the web server (busybox httpd), so the pod serves without a container in it.

use e2e::checks::{assert_footprint_gone, assert_footprint_present, assert_no_attachments};
use e2e::cri::api::PodSandboxState;
use e2e::cri::{self, SANDBOX_PORT as PORT};
use e2e::image::{self, PAGE};
use e2e::node::NODE_ADDR;
use e2e::{plugins, Node, PluginSet, RootSnapshot, Session};
use std::net::Ipv4Addr;

const IMAGE_REF: &str = "e2e.local/sandbox:latest";
const HOST_PORT: u16 = 18080;

/// The end of containerd's log, for a failure message.
fn containerd_log(node: &Node) -> String {
    cri::containerd_log(&node.path("containerd"))
}

fn cri_runs_a_pod_sandbox(set: PluginSet, n: u8) {
    let root = RootSnapshot::take();
    let node = Node::new("cri", set, n, &plugins::flannel_conflist());
    image::busybox_rootfs(&node.path("rootfs"));
    let archive = node.path("image.tar");
    image::docker_archive_running(
        &node.path("rootfs"),
        IMAGE_REF,
        &node.path("image"),
        &archive,
        &cri::SANDBOX_HTTPD,
    );
    let name = testkit::unique_name("pod");

    let mut session = Session::start(
        &node,
        cri::SCRIPT,
        &[
            ("IMAGE_TAR", archive.to_str().unwrap()),
            ("IMAGE_REF", IMAGE_REF),
        ],
    );
    session.until_pause();
    let socket = node.path("containerd/containerd.sock");
    let mut cri = cri::wait_until_serving(&socket, cri::SERVE_TIMEOUT).unwrap();

    let id = cri
        .run_pod_sandbox(cri::sandbox_config(&name, &node.cgroup_parent(), HOST_PORT))
        .unwrap_or_else(|e| panic!("RunPodSandbox: {e}\n{}", containerd_log(&node)));
    let status = cri
        .pod_sandbox_status(&id)
        .unwrap_or_else(|e| panic!("PodSandboxStatus: {e}"));
    assert_eq!(
        status.state,
        PodSandboxState::SandboxReady as i32,
        "{status:?}"
    );
    let ip: Ipv4Addr = status
        .network
        .as_ref()
        .and_then(|n| n.ip.parse().ok())
        .unwrap_or_else(|| panic!("PodSandboxStatus has no IPv4 address: {status:?}"));
    assert!(
        node.is_pod_address(ip),
        "the pod's address {ip} is not in FLANNEL_SUBNET {}/24",
        node.gateway()
    );
    let ping = node.ns.try_run(
        image::BUSYBOX,
        &["ping", "-c", "1", "-W", "2", &ip.to_string()],
    );
    assert!(
        ping.status.success(),
        "the node cannot ping the pod at {ip}: {ping:?}"
    );
    assert_eq!(
        node.http_get(ip, PORT).as_deref(),
        Ok(PAGE),
        "the pod's own port"
    );
    assert_eq!(
        node.http_get(NODE_ADDR, HOST_PORT).as_deref(),
        Ok(PAGE),
        "the hostPort {NODE_ADDR}:{HOST_PORT} does not reach the pod"
    );
    assert_footprint_present(&node, &id, ip);

    cri.stop_pod_sandbox(&id)
        .unwrap_or_else(|e| panic!("StopPodSandbox: {e}"));
    assert_footprint_gone(&node, &id);
    assert!(
        node.http_get(NODE_ADDR, HOST_PORT).is_err(),
        "the hostPort still answers after StopPodSandbox"
    );
    cri.remove_pod_sandbox(&id)
        .unwrap_or_else(|e| panic!("RemovePodSandbox: {e}"));
    assert!(
        cri.pod_sandbox_status(&id).is_err(),
        "the sandbox is still known after RemovePodSandbox"
    );
    assert_no_attachments(&node);
    drop(cri);

    session.resume();
    let ended = session.finish();
    assert_eq!(
        ended.ok("containers"),
        "",
        "containerd kept the sandbox container"
    );
    assert_eq!(ended.ok("tasks"), "", "containerd kept the sandbox task");
    assert_eq!(ended.exit, Some(0), "{ended}");
    root.assert_clean_after(node);
}

#[test]
fn cri_with_our_plugins() {
    cri_runs_a_pod_sandbox(PluginSet::Ours, 131);
}

#[test]
fn cri_with_go_bridge_host_local_portmap() {
    cri_runs_a_pod_sandbox(PluginSet::Go, 132);
}
