//! Node objects as the API server sends them, for the tests of the modules beside.

use super::node::{Annotations, Families, NodeObject};
use crate::config::NetConfig;
use serde_json::{json, Value};

pub(super) const P: &str = "flannel.alpha.coreos.com";
pub(super) const MAC: &str = "8a:b2:a4:39:cb:3f";

pub(super) fn names() -> Annotations {
    Annotations::new(P).unwrap()
}

pub(super) const V4: Families = Families {
    ipv4: true,
    ipv6: false,
};

/// A Node as the API server sends it, with the fields a lease does not need.
pub(super) fn node_json(name: &str, cidrs: &[&str], annotations: Value) -> String {
    json!({
        "kind": "Node", "apiVersion": "v1",
        "metadata": {
            "name": name, "uid": "0b2f", "resourceVersion": "4711",
            "creationTimestamp": "2026-11-25T17:56:17Z",
            "labels": {"kubernetes.io/hostname": name},
            "annotations": annotations,
            "managedFields": [{"manager": "kubelet", "operation": "Update", "fieldsV1": {"f:status": {}}}]
        },
        "spec": {"podCIDR": cidrs.first().copied().unwrap_or_default(), "podCIDRs": cidrs},
        "status": {"conditions": [{"type": "Ready", "status": "True"}], "addresses": [{"type": "InternalIP", "address": "192.168.1.2"}]}
    })
    .to_string()
}

pub(super) fn node(name: &str, cidrs: &[&str], annotations: Value) -> NodeObject {
    serde_json::from_str(&node_json(name, cidrs, annotations)).unwrap()
}

/// A node annotated as Go's flanneld annotates it (vxlan, IPv4).
pub(super) fn flannel_node(name: &str, cidr: &str, ip: &str) -> NodeObject {
    node(
        name,
        &[cidr],
        json!({
            "flannel.alpha.coreos.com/backend-data": format!(r#"{{"VNI":1,"VtepMAC":"{MAC}"}}"#),
            "flannel.alpha.coreos.com/backend-type": "vxlan",
            "flannel.alpha.coreos.com/kube-subnet-manager": "true",
            "flannel.alpha.coreos.com/public-ip": ip,
            "node.alpha.kubernetes.io/ttl": "0",
            "volumes.kubernetes.io/controller-managed-attach-detach": "true"
        }),
    )
}

pub(super) fn cfg(text: &str) -> NetConfig {
    crate::config::parse(text).unwrap()
}
