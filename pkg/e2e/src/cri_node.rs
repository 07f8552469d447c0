//! containerd's CRI on one node of a [`testkit::cluster`] cluster, as a kubelet node runs it: the
//! stock conflist and the plugins in the runtime's directories, `/run/flannel` the directory
//! where the node's running flanneld writes `subnet.env`, and containerd (scripts/cri.sh) with
//! its own config, root, state and socket, in the node's network namespace and a private mount
//! namespace. Pod sandboxes are driven over the CRI socket as kubelet drives them. Everything
//! goes on drop: containerd's session ends (its trap kills what it left), whatever still runs
//! from the node's home is killed, its cgroups and directory removed.

use crate::cri::{self, api, Cri};
use crate::image;
use crate::node::{http_get, Footprint, Home};
use crate::plugins::{self, PluginSet};
use crate::session::Session;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use testkit::cluster;

const IMAGE_REF: &str = "e2e.local/sandbox:latest";

/// A pod sandbox started through the CRI.
#[derive(Debug)]
pub struct CriPod {
    pub id: String,
    pub ip: Ipv4Addr,
    /// Its IPv6 address on a dual-stack network (the status's additional IPs).
    pub ip6: Option<Ipv6Addr>,
    /// The pod's network namespace, as its first process sees it (`/proc/<pid>/ns/net`).
    pub netns: PathBuf,
}

impl CriPod {
    /// GET http://addr:port/ from inside the pod.
    pub fn http_get(&self, addr: impl Into<IpAddr>, port: u16) -> Result<String, String> {
        http_get(&self.netns, addr, port)
    }

    /// Does one ping from inside the pod to `addr` get an answer within 2 s?
    pub fn ping(&self, addr: impl Into<IpAddr>) -> bool {
        let addr: IpAddr = addr.into();
        std::process::Command::new("nsenter")
            .arg(format!("--net={}", self.netns.display()))
            .args([image::BUSYBOX, "ping", "-c", "1", "-W", "2"])
            .arg(addr.to_string())
            .output()
            .is_ok_and(|o| o.status.success())
    }

    /// The MTU of the pod's eth0.
    pub fn mtu(&self) -> Option<u64> {
        let out = std::process::Command::new("nsenter")
            .arg(format!("--net={}", self.netns.display()))
            .args(["ip", "-j", "link", "show", "dev", "eth0"])
            .output()
            .ok()?;
        let links: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        links[0]["mtu"].as_u64()
    }
}

/// containerd's CRI on a cluster node; see the module's documentation.
pub struct CriNode<'c> {
    pub node: &'c cluster::Node,
    cri: Cri,
    session: Option<Session>,
    // Last: what runs from it is killed once the session has ended.
    home: Home,
}

impl<'c> CriNode<'c> {
    /// Starts containerd on `node` with the plugins of `set`; its pod sandboxes run busybox
    /// httpd serving `page` on port 8080 ([`cri::SANDBOX_PORT`]).
    pub fn start(node: &'c cluster::Node, set: PluginSet, page: &str) -> CriNode<'c> {
        let home = Home::new(set, &plugins::flannel_conflist(), Some(&node.dir));
        image::busybox_rootfs_serving(&home.path("rootfs"), page);
        let archive = home.path("image.tar");
        image::docker_archive_running(
            &home.path("rootfs"),
            IMAGE_REF,
            &home.path("image"),
            &archive,
            &cri::SANDBOX_HTTPD,
        );
        let archive = archive.display().to_string();
        let mut session = Session::start_in(
            node.ns.path(),
            &home,
            cri::SCRIPT,
            &[("IMAGE_TAR", &archive), ("IMAGE_REF", IMAGE_REF)],
        );
        session.until_pause();
        let cri =
            cri::wait_until_serving(&home.path("containerd/containerd.sock"), cri::SERVE_TIMEOUT)
                .unwrap_or_else(|e| {
                    panic!(
                        "node {}: {e}\n{}",
                        node.index,
                        cri::containerd_log(&home.path("containerd"))
                    )
                });
        CriNode {
            node,
            cri,
            session: Some(session),
            home,
        }
    }

    /// RunPodSandbox of a pod `name` mapping `host_port` to its port 8080, as kubelet asks for
    /// a pod with a hostPort; the pod once it is ready and has an IPv4 address.
    pub fn run_pod(&mut self, name: &str, host_port: u16) -> CriPod {
        let config = cri::sandbox_config(name, &self.home.cgroup_parent(), host_port);
        let id = self.cri.run_pod_sandbox(config).unwrap_or_else(|e| {
            panic!(
                "RunPodSandbox {name} on node {}: {e}\n{}",
                self.node.index,
                self.containerd_log()
            )
        });
        let status = self
            .cri
            .pod_sandbox_status(&id)
            .unwrap_or_else(|e| panic!("PodSandboxStatus of {name}: {e}"));
        assert_eq!(
            status.state,
            api::PodSandboxState::SandboxReady as i32,
            "{status:?}"
        );
        let ip: Ipv4Addr = status
            .network
            .as_ref()
            .and_then(|n| n.ip.parse().ok())
            .unwrap_or_else(|| {
                panic!("PodSandboxStatus of {name} has no IPv4 address: {status:?}")
            });
        let ip6 = status
            .network
            .as_ref()
            .and_then(|n| n.additional_ips.iter().find_map(|a| a.ip.parse().ok()));
        let pid = self
            .cri
            .pod_sandbox_pid(&id)
            .unwrap_or_else(|e| panic!("{e}"));
        CriPod {
            id,
            ip,
            ip6,
            netns: PathBuf::from(format!("/proc/{pid}/ns/net")),
        }
    }

    /// StopPodSandbox then RemovePodSandbox, as kubelet deletes a pod.
    pub fn remove_pod(&mut self, pod: &CriPod) {
        self.cri
            .stop_pod_sandbox(&pod.id)
            .unwrap_or_else(|e| panic!("StopPodSandbox {}: {e}", pod.id));
        self.cri
            .remove_pod_sandbox(&pod.id)
            .unwrap_or_else(|e| panic!("RemovePodSandbox {}: {e}", pod.id));
        assert!(
            self.cri.pod_sandbox_status(&pod.id).is_err(),
            "the sandbox {} is still known after RemovePodSandbox",
            pod.id
        );
    }

    /// What the plugins and containerd's CNI cache hold on the node, whoever it belongs to.
    pub fn attachments(&self) -> Footprint {
        let mut left = Footprint::attachments(&self.node.ns, &self.home);
        // The node's own link onto the underlay is a veth too.
        left.rules.retain(|r| r != "veth eth0");
        left
    }

    /// The end of containerd's log, for a failure message.
    pub fn containerd_log(&self) -> String {
        cri::containerd_log(&self.home.path("containerd"))
    }

    /// Ends containerd through its session and checks that it kept no sandbox container or task,
    /// exited with status 0, and left no process or cgroup behind.
    pub fn shut_down(mut self) {
        let mut session = self
            .session
            .take()
            .expect("the session runs until shut_down");
        session.resume();
        let ended = session.finish();
        assert_eq!(
            ended.ok("containers"),
            "",
            "containerd on node {} kept a sandbox container",
            self.node.index
        );
        assert_eq!(ended.ok("tasks"), "", "containerd kept a sandbox task");
        assert_eq!(ended.exit, Some(0), "{ended}");
        let processes = self.home.processes();
        assert!(
            processes.is_empty(),
            "processes outlived containerd on node {}: {processes:?}",
            self.node.index
        );
        let cgroups = self.home.remove_cgroups();
        assert!(cgroups.is_empty(), "cgroups left behind: {cgroups:?}");
    }
}
