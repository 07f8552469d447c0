//! A runtime and a live daemon together: three nodes of a test cluster (testkit::cluster: node
//! namespaces on an underlay bridge), flanneld running on each and writing its node's
//! subnet.env, its leases in etcd in the underlay or in Node objects of the Kubernetes API
//! server stand-in there (--kube-subnet-mgr), IPv4 or dual-stack; and on each node containerd's
//! CRI (Debian's containerd 1.6) with its own config, root, state and socket, driven over that
//! socket as kubelet drives it, the plugins put in place by scripts/install.sh. A pod sandbox
//! with a hostPort on each node gets addresses of its node's lease (each family) and
//! FLANNEL_MTU; each pod reaches the pod of the next node across the vxlan overlay, and that
//! node's host port (DNAT on that node, masquerade by flanneld's --ip-masq on the way out), on
//! each family; deleting the pods through the CRI leaves nothing of them on any node, and the
//! machine's root namespace, /etc/cni and /opt/cni are as they were.

use e2e::cri_node::{CriNode, CriPod};
use e2e::{PluginSet, RootSnapshot};
use ipnetwork::IpNetwork;
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;
use testkit::cluster::{wait_for, Cluster, Family, Registry, Underlay};

const NETWORK: &str = r#"{"Network":"10.31.0.0/16","Backend":{"Type":"vxlan"}}"#;
const DUAL_STACK: &str = r#"{"Network":"10.31.0.0/16","EnableIPv6":true,"IPv6Network":"fc00:31::/48","Backend":{"Type":"vxlan"}}"#;
const FLANNELD: &str = "flanneld";
const T: Duration = Duration::from_secs(60);
const HOST_PORT: u16 = 18080;
const NODES: u8 = 3;

fn page(node: u8) -> String {
    format!("served from the pod on node {node}\n")
}

/// A node's lease as its subnet.env says: FLANNEL_SUBNET, FLANNEL_IPV6_SUBNET if any, and
/// FLANNEL_MTU.
struct Lease {
    subnets: Vec<IpNetwork>,
    mtu: u64,
}

fn lease_of(c: &Cluster, index: u8, dual: bool) -> Lease {
    let node = c.node(index);
    let mut keys = vec!["FLANNEL_SUBNET"];
    if dual {
        keys.push("FLANNEL_IPV6_SUBNET");
    }
    let subnets = keys
        .iter()
        .map(|k| {
            node.subnet_env(k, T)
                .parse()
                .unwrap_or_else(|e| panic!("node {index}'s {k}: {e}"))
        })
        .collect();
    let mtu = node
        .subnet_env("FLANNEL_MTU", T)
        .parse()
        .unwrap_or_else(|e| panic!("node {index}'s FLANNEL_MTU: {e}"));
    Lease { subnets, mtu }
}

/// The pod's addresses: IPv4, and IPv6 on a dual-stack network.
fn pod_addrs(pod: &CriPod) -> Vec<IpAddr> {
    std::iter::once(IpAddr::V4(pod.ip))
        .chain(pod.ip6.map(IpAddr::V6))
        .collect()
}

/// From `from` (on node `from_node`): the other pod answers ping and serves its page on each
/// of its addresses, and the other node's host port reaches it too at each of the node's.
fn assert_reaches(from: &CriPod, from_node: u8, to: &CriPod, to_node: u8, to_node_ips: &[IpAddr]) {
    for ip in pod_addrs(to) {
        // Once every node has the others' entries, which may come after its own subnet.env.
        wait_for(
            &format!(
                "a ping answer to the pod on node {from_node} ({:?}) from the pod on node \
                 {to_node} at {ip}",
                pod_addrs(from)
            ),
            T,
            || from.ping(ip).then_some(()),
        );
        assert_eq!(
            from.http_get(ip, e2e::cri::SANDBOX_PORT).as_deref(),
            Ok(page(to_node).as_str()),
            "the pod on node {from_node} fetching from the pod on node {to_node} at {ip}"
        );
    }
    for ip in to_node_ips {
        assert_eq!(
            from.http_get(*ip, HOST_PORT).as_deref(),
            Ok(page(to_node).as_str()),
            "the pod on node {from_node} fetching node {to_node}'s host port {ip}:{HOST_PORT}"
        );
    }
}

fn cri_pods_on_flanneld_nodes(prefix: &str, net: u8, registry: Registry, dual: bool) {
    let root = RootSnapshot::take();
    let flanneld = testkit::bin_dir().join(FLANNELD);
    let (underlay, config) = if dual {
        (Underlay::Dual, DUAL_STACK)
    } else {
        (Underlay::V4, NETWORK)
    };
    let mut cluster = Cluster::on(underlay, prefix, net, NODES, registry, config);
    for i in 1..=NODES {
        cluster.start_flanneld(i, Path::new(&flanneld), &["--ip-masq"]);
    }
    let leases: Vec<Lease> = (1..=NODES).map(|i| lease_of(&cluster, i, dual)).collect();
    let distinct: std::collections::BTreeSet<String> =
        leases.iter().map(|l| l.subnets[0].to_string()).collect();
    assert_eq!(
        distinct.len(),
        NODES as usize,
        "one subnet per node: {distinct:?}"
    );

    // Declared after the cluster: containerd ends before the namespaces go.
    let mut nodes: Vec<CriNode> = (1..=NODES)
        .map(|i| CriNode::start(cluster.node(i), PluginSet::Installed, &page(i)))
        .collect();
    let pods: Vec<CriPod> = nodes
        .iter_mut()
        .map(|n| {
            let name = testkit::unique_name(&format!("web{}", n.node.index));
            n.run_pod(&name, HOST_PORT)
        })
        .collect();

    for (i, (pod, lease)) in pods.iter().zip(&leases).enumerate() {
        let addrs = pod_addrs(pod);
        assert_eq!(
            addrs.len(),
            lease.subnets.len(),
            "the pod on node {} has {addrs:?}, one address per family of {:?}",
            i + 1,
            lease.subnets
        );
        for (ip, subnet) in addrs.iter().zip(&lease.subnets) {
            assert!(
                subnet.contains(*ip) && *ip != subnet.ip() && *ip != subnet.network(),
                "the pod on node {} has {ip}, not a pod address of its subnet {subnet}",
                i + 1
            );
        }
        assert_eq!(
            pod.mtu(),
            Some(lease.mtu),
            "the pod on node {} does not have its FLANNEL_MTU",
            i + 1
        );
    }

    let node_ips: Vec<Vec<IpAddr>> = (1..=NODES)
        .map(|i| {
            let n = cluster.node(i);
            let mut families = vec![Family::V4];
            if dual {
                families.push(Family::V6);
            }
            families
                .into_iter()
                .map(|f| {
                    n.addr(f)
                        .and_then(|a| a.parse().ok())
                        .unwrap_or_else(|| panic!("node {i} has no {f} address"))
                })
                .collect()
        })
        .collect();
    for from in 0..pods.len() {
        let to = (from + 1) % pods.len();
        assert_reaches(
            &pods[from],
            from as u8 + 1,
            &pods[to],
            to as u8 + 1,
            &node_ips[to],
        );
    }
    // A node itself reaches another node's host port too.
    for ip in &node_ips[1] {
        assert_eq!(
            e2e::node::http_get(cluster.node(1).ns.path(), *ip, HOST_PORT).as_deref(),
            Ok(page(2).as_str()),
            "node 1 fetching node 2's host port at {ip}"
        );
    }

    for (n, pod) in nodes.iter_mut().zip(&pods) {
        n.remove_pod(pod);
        let left = n.attachments();
        assert!(
            left.is_empty(),
            "left on node {} after its pod's deletion: {left:#?}",
            n.node.index
        );
    }
    for ip in &node_ips[1] {
        assert!(
            e2e::node::http_get(cluster.node(1).ns.path(), *ip, HOST_PORT).is_err(),
            "node 2's host port at {ip} still answers after its pod's deletion"
        );
    }
    for n in nodes {
        n.shut_down();
    }
    drop(cluster);
    root.assert_unchanged();
}

#[test]
fn cri_pods_with_host_ports_on_three_flanneld_nodes_of_etcd_reach_each_other() {
    cri_pods_on_flanneld_nodes("crc", 93, Registry::Etcd, false);
}

#[test]
fn cri_pods_with_host_ports_on_three_flanneld_nodes_of_etcd_dual_stack_reach_each_other() {
    cri_pods_on_flanneld_nodes("crd", 94, Registry::Etcd, true);
}

#[test]
fn cri_pods_with_host_ports_on_three_flanneld_nodes_of_the_kube_api_reach_each_other() {
    cri_pods_on_flanneld_nodes("crk", 95, Registry::Kube, false);
}

#[test]
fn cri_pods_with_host_ports_on_three_flanneld_nodes_of_the_kube_api_dual_stack_reach_each_other() {
    cri_pods_on_flanneld_nodes("crl", 96, Registry::Kube, true);
}
