//! A runtime and a live daemon together: two nodes of a test cluster (testkit::cluster: node
//! namespaces on an underlay bridge, etcd in the underlay), flanneld running on each and writing
//! its node's subnet.env, and on each node containerd's CRI (Debian's containerd 1.6) started
//! with its own config, root, state and socket, driven over that socket as kubelet drives it.
//! A pod sandbox with a hostPort on each node gets an address of its node's lease and
//! FLANNEL_MTU; each pod reaches the other pod across the vxlan overlay, and the other node's
//! host port (DNAT on that node, masquerade by flanneld's --ip-masq on the way out); deleting
//! the pods through the CRI leaves nothing of them on either node, and the machine's root
//! namespace, /etc/cni and /opt/cni are as they were.

use e2e::cri_node::{CriNode, CriPod};
use e2e::{PluginSet, RootSnapshot};
use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;
use testkit::cluster::{Cluster, Registry};

const NETWORK: &str = r#"{"Network":"10.31.0.0/16","Backend":{"Type":"vxlan"}}"#;
const FLANNELD: &str = "flanneld";
const T: Duration = Duration::from_secs(30);
const HOST_PORT: u16 = 18080;

fn page(node: u8) -> String {
    format!("served from the pod on node {node}\n")
}

/// The node's FLANNEL_SUBNET as (network, prefix) and its FLANNEL_MTU, read from the
/// subnet.env its flanneld wrote.
fn lease_of(c: &Cluster, index: u8) -> (ipnetwork::Ipv4Network, u64) {
    let node = c.node(index);
    let subnet: ipnetwork::Ipv4Network = node
        .subnet_env("FLANNEL_SUBNET", T)
        .parse()
        .unwrap_or_else(|e| panic!("node {index}'s FLANNEL_SUBNET: {e}"));
    let mtu = node
        .subnet_env("FLANNEL_MTU", T)
        .parse()
        .unwrap_or_else(|e| panic!("node {index}'s FLANNEL_MTU: {e}"));
    (subnet, mtu)
}

fn addr(s: &str) -> Ipv4Addr {
    s.parse()
        .unwrap_or_else(|e| panic!("{s:?} is not an IPv4 address: {e}"))
}

/// From `from` (on node `from_node`): the other pod answers ping and serves its page on its own
/// address, and the other node's host port reaches it too.
fn assert_reaches(from: &CriPod, from_node: u8, to: &CriPod, to_node: u8, to_node_ip: Ipv4Addr) {
    assert!(
        from.ping(to.ip),
        "the pod on node {from_node} ({}) gets no ping answer from the pod on node {to_node} ({})",
        from.ip,
        to.ip
    );
    assert_eq!(
        from.http_get(to.ip, e2e::cri::SANDBOX_PORT).as_deref(),
        Ok(page(to_node).as_str()),
        "the pod on node {from_node} fetching from the pod on node {to_node} at {}",
        to.ip
    );
    assert_eq!(
        from.http_get(to_node_ip, HOST_PORT).as_deref(),
        Ok(page(to_node).as_str()),
        "the pod on node {from_node} fetching node {to_node}'s host port {to_node_ip}:{HOST_PORT}"
    );
}

#[test]
fn cri_pods_with_host_ports_on_two_flanneld_nodes_reach_each_other() {
    let root = RootSnapshot::take();
    let flanneld = testkit::bin_dir().join(FLANNELD);
    let mut cluster = Cluster::new("crc", 93, 2, Registry::Etcd, NETWORK);
    for i in [1, 2] {
        cluster.start_flanneld(i, Path::new(&flanneld), &["--ip-masq"]);
    }
    let leases = [lease_of(&cluster, 1), lease_of(&cluster, 2)];
    assert_ne!(
        leases[0].0.network(),
        leases[1].0.network(),
        "both nodes got one subnet"
    );

    // Declared after the cluster: containerd ends before the namespaces go.
    let mut nodes: Vec<CriNode> = [1, 2]
        .into_iter()
        .map(|i| CriNode::start(cluster.node(i), PluginSet::Ours, &page(i)))
        .collect();
    let pods: Vec<CriPod> = nodes
        .iter_mut()
        .map(|n| {
            let name = testkit::unique_name(&format!("web{}", n.node.index));
            n.run_pod(&name, HOST_PORT)
        })
        .collect();

    for (i, (pod, (subnet, mtu))) in pods.iter().zip(&leases).enumerate() {
        assert!(
            subnet.contains(pod.ip) && pod.ip != subnet.ip() && pod.ip != subnet.network(),
            "the pod on node {} has {}, not a pod address of its FLANNEL_SUBNET {subnet}",
            i + 1,
            pod.ip
        );
        assert_eq!(
            pod.mtu(),
            Some(*mtu),
            "the pod on node {} does not have its FLANNEL_MTU",
            i + 1
        );
    }

    let node_ips = [addr(&cluster.node(1).ip), addr(&cluster.node(2).ip)];
    let reach = |from: usize, to: usize| {
        assert_reaches(
            &pods[from],
            from as u8 + 1,
            &pods[to],
            to as u8 + 1,
            node_ips[to],
        )
    };
    reach(0, 1);
    reach(1, 0);
    // A node itself reaches the other node's host port too.
    assert_eq!(
        e2e::node::http_get(cluster.node(1).ns.path(), node_ips[1], HOST_PORT).as_deref(),
        Ok(page(2).as_str()),
        "node 1 fetching node 2's host port"
    );

    for (n, pod) in nodes.iter_mut().zip(&pods) {
        n.remove_pod(pod);
        let left = n.attachments();
        assert!(
            left.is_empty(),
            "left on node {} after its pod's deletion: {left:#?}",
            n.node.index
        );
    }
    assert!(
        e2e::node::http_get(cluster.node(1).ns.path(), node_ips[1], HOST_PORT).is_err(),
        "node 2's host port still answers after its pod's deletion"
    );
    for n in nodes {
        n.shut_down();
    }
    drop(cluster);
    root.assert_unchanged();
}
