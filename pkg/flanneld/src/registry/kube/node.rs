//! A Node as flanneld reads it: the annotation names under the prefix, the few fields of the
//! object a lease needs, and what they say (this node's subnet, another node's lease, the
//! attributes and addresses this node's annotations already hold).

use crate::annotation_prefix::{self, BadPrefix};
use crate::config::NetConfig;
use crate::family::IpFamily;
use crate::lease::{Lease, LeaseAttrs, SubnetKey};
use crate::registry::Entry;
use ipnetwork::{IpNetwork, Ipv4Network, Ipv6Network};
use kube_lite::null_as_default;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::collections::BTreeMap;
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

/// What a Node says that flanneld cannot take: outside data, said with the node and the
/// annotation or field it is in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeError {
    /// `--kube-annotation-prefix` that the API server's names cannot carry.
    Prefix {
        prefix: String,
        why: &'static str,
    },
    TooManyCidrs(Vec<String>),
    NotANetwork {
        cidr: String,
        why: String,
    },
    /// A podCIDR of prefix 0.
    EveryAddress(String),
    /// This node has no podCIDR of a family the network has.
    NoCidrOfFamily {
        node: String,
        family: IpFamily,
        cidrs: Vec<String>,
        network: IpNetwork,
    },
    /// This node's podCIDR lies outside the network of its family.
    Outside {
        node: String,
        cidr: IpNetwork,
        network: IpNetwork,
    },
    /// None of this node's podCIDRs is of a family the network has.
    NoFamilyOfNetwork {
        node: String,
        cidrs: Vec<String>,
    },
    /// Another node's lease lacks the podCIDR of a family the network has.
    NoLeaseCidr(IpFamily),
    NotJson {
        annotation: String,
        text: String,
        why: String,
    },
    NotAnAddress {
        annotation: String,
        text: String,
        family: IpFamily,
    },
}

impl fmt::Display for NodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeError::Prefix { prefix, why } => write!(f, "{prefix:?} {why}"),
            NodeError::TooManyCidrs(list) => write!(
                f,
                "podCIDRs {list:?}: at most one IPv4 and one IPv6 network"
            ),
            NodeError::NotANetwork { cidr, why } => {
                write!(f, "podCIDR {cidr:?} is not a network: {why}")
            }
            NodeError::EveryAddress(cidr) => write!(
                f,
                "podCIDR {cidr:?} covers every address: it is no node's subnet"
            ),
            NodeError::NoCidrOfFamily {
                node,
                family: IpFamily::V4,
                cidrs,
                network,
            } => write!(
                f,
                "node {node:?} has no IPv4 podCIDR ({cidrs:?}), but the flannel network {network} is IPv4"
            ),
            NodeError::NoCidrOfFamily {
                node,
                cidrs,
                network,
                ..
            } => write!(
                f,
                "node {node:?} has no IPv6 podCIDR ({cidrs:?}), but the flannel network has IPv6Network {network}"
            ),
            NodeError::Outside {
                node,
                cidr,
                network: network @ IpNetwork::V4(_),
            } => write!(
                f,
                "podCIDR {cidr} of node {node:?} is outside the flannel network {network} (net-conf.json's Network)"
            ),
            NodeError::Outside {
                node,
                cidr,
                network,
            } => write!(
                f,
                "podCIDR {cidr} of node {node:?} is outside the flannel network's IPv6Network {network}"
            ),
            NodeError::NoFamilyOfNetwork { node, cidrs } => write!(
                f,
                "node {node:?} has podCIDRs {cidrs:?}, none of a family the flannel network has"
            ),
            NodeError::NoLeaseCidr(family) => {
                write!(f, "no {} network in its podCIDRs", family.name())
            }
            NodeError::NotJson {
                annotation,
                text,
                why,
            } => write!(f, "annotation {annotation} {text:?} is not JSON: {why}"),
            NodeError::NotAnAddress {
                annotation,
                text,
                family,
            } => write!(
                f,
                "annotation {annotation} {text:?} is not an {} address",
                family.name()
            ),
        }
    }
}

impl std::error::Error for NodeError {}

pub use crate::annotation_prefix::DEFAULT as DEFAULT_PREFIX;

/// The annotations flanneld reads and writes, under one prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Annotations {
    /// `kube-subnet-manager`: "true" on every node whose flanneld has written its lease.
    pub managed: String,
    pub backend_type: String,
    pub backend_data: String,
    pub backend_v6_data: String,
    pub public_ip: String,
    pub public_ipv6: String,
    /// Set by a user: the public address other nodes should use for this one.
    pub public_ip_overwrite: String,
    pub public_ipv6_overwrite: String,
    /// Set by a user: this node's own public address, in place of `--public-ip`.
    pub node_public_ip: String,
    pub node_public_ipv6: String,
}

impl Annotations {
    /// The names under `prefix`, completed as flanneld completes it: `example.com` becomes
    /// `example.com/`, `example.com/net` becomes `example.com/net-`.
    pub fn new(prefix: &str) -> Result<Annotations, NodeError> {
        let p = annotation_prefix::complete(prefix)
            .map_err(|BadPrefix { prefix, why }| NodeError::Prefix { prefix, why })?;
        let name = |s: &str| format!("{p}{s}");
        Ok(Annotations {
            managed: name("kube-subnet-manager"),
            backend_type: name("backend-type"),
            backend_data: name("backend-data"),
            backend_v6_data: name("backend-v6-data"),
            public_ip: name("public-ip"),
            public_ipv6: name("public-ipv6"),
            public_ip_overwrite: name("public-ip-overwrite"),
            public_ipv6_overwrite: name("public-ipv6-overwrite"),
            node_public_ip: name("node-public-ip"),
            node_public_ipv6: name("node-public-ipv6"),
        })
    }
}

/// The part of a Node a lease needs; everything else in the object is skipped unread.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct NodeObject {
    #[serde(default)]
    pub metadata: NodeMeta,
    #[serde(default, deserialize_with = "null_as_default")]
    pub spec: NodeSpec,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeMeta {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub resource_version: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct NodeSpec {
    #[serde(rename = "podCIDR", default, deserialize_with = "null_as_default")]
    pub pod_cidr: String,
    #[serde(rename = "podCIDRs", default, deserialize_with = "null_as_default")]
    pub pod_cidrs: Vec<String>,
}

impl kube_lite::Object for NodeObject {
    /// The kubelet's status and the managed fields: most of a real Node, none of a lease.
    const UNREAD: &'static [&'static str] = &["status", "metadata.managedFields"];

    fn resource_version(&self) -> &str {
        &self.metadata.resource_version
    }
}

impl NodeObject {
    pub(super) fn annotation(&self, name: &str) -> &str {
        self.metadata
            .annotations
            .get(name)
            .map(String::as_str)
            .unwrap_or_default()
    }
}

/// Which address families the network has (its `Network` and `IPv6Network`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Families {
    pub ipv4: bool,
    pub ipv6: bool,
}

impl Families {
    pub fn of(cfg: &NetConfig) -> Families {
        Families {
            ipv4: cfg.ipv4.is_some(),
            ipv6: cfg.ipv6.is_some(),
        }
    }
}

/// The first IPv4 and the first IPv6 network of `podCIDRs` (of `podCIDR` when the list is
/// empty), whichever comes first in the list. A network of prefix 0 (every address) is no
/// node's subnet, and a lease key cannot hold it: flannel's key writes "no IPv4 subnet" as
/// `0.0.0.0-0`.
pub fn pod_cidrs(spec: &NodeSpec) -> Result<(Option<Ipv4Network>, Option<Ipv6Network>), NodeError> {
    let list: Vec<&str> = if spec.pod_cidrs.is_empty() {
        [spec.pod_cidr.as_str()]
            .into_iter()
            .filter(|c| !c.is_empty())
            .collect()
    } else {
        spec.pod_cidrs.iter().map(String::as_str).collect()
    };
    if list.len() > 2 {
        return Err(NodeError::TooManyCidrs(
            list.iter().map(|c| c.to_string()).collect(),
        ));
    }
    let (mut v4, mut v6) = (None, None);
    for c in list {
        let bad = |why: ipnetwork::IpNetworkError| NodeError::NotANetwork {
            cidr: c.to_string(),
            why: why.to_string(),
        };
        let net: IpNetwork = c.parse().map_err(bad)?;
        if net.prefix() == 0 {
            return Err(NodeError::EveryAddress(c.to_string()));
        }
        // Go's ParseCIDR gives the network, whatever host bits the text has.
        match net {
            IpNetwork::V4(n) => {
                v4.get_or_insert(Ipv4Network::new(n.network(), n.prefix()).map_err(bad)?);
            }
            IpNetwork::V6(n) => {
                v6.get_or_insert(Ipv6Network::new(n.network(), n.prefix()).map_err(bad)?);
            }
        }
    }
    Ok((v4, v6))
}

/// One family's network of `pod_cidrs`' answer.
fn of_family(
    cidrs: (Option<Ipv4Network>, Option<Ipv6Network>),
    family: IpFamily,
) -> Option<IpNetwork> {
    match family {
        IpFamily::V4 => cidrs.0.map(IpNetwork::V4),
        IpFamily::V6 => cidrs.1.map(IpNetwork::V6),
    }
}

/// This node's subnet from its Node: None while it has no podCIDR. A CIDR of a family the
/// network lacks is ignored, as flanneld ignores it; one outside the network is refused.
pub fn own_subnet(node: &NodeObject, cfg: &NetConfig) -> Result<Option<SubnetKey>, NodeError> {
    let cidrs = pod_cidrs(&node.spec)?;
    if cidrs.0.is_none() && cidrs.1.is_none() {
        return Ok(None);
    }
    let name = &node.metadata.name;
    let mut key = SubnetKey {
        ipv4: None,
        ipv6: None,
    };
    for family in cfg.families() {
        let Some(network) = cfg.network(family) else {
            continue;
        };
        let cidr = of_family(cidrs, family).ok_or_else(|| NodeError::NoCidrOfFamily {
            node: name.clone(),
            family,
            cidrs: node.spec.pod_cidrs.clone(),
            network,
        })?;
        // Inside the network, and no wider than it.
        if cidr.prefix() < network.prefix() || !network.contains(cidr.network()) {
            return Err(NodeError::Outside {
                node: name.clone(),
                cidr,
                network,
            });
        }
        key = key.with(cidr);
    }
    if key.ipv4.is_none() && key.ipv6.is_none() {
        return Err(NodeError::NoFamilyOfNetwork {
            node: name.clone(),
            cidrs: node.spec.pod_cidrs.clone(),
        });
    }
    Ok(Some(key))
}

fn backend_data(node: &NodeObject, name: &str) -> Result<Option<Box<RawValue>>, NodeError> {
    match node.annotation(name) {
        "" | "null" => Ok(None),
        text => RawValue::from_string(text.to_string())
            .map(Some)
            .map_err(|e| NodeError::NotJson {
                annotation: name.to_string(),
                text: text.to_string(),
                why: e.to_string(),
            }),
    }
}

/// Another node's lease from its Node, as flanneld reads it: None unless it is annotated
/// `kube-subnet-manager: "true"` and has a podCIDR; Err for an annotation that cannot be read.
pub fn node_lease(
    node: &NodeObject,
    names: &Annotations,
    families: Families,
) -> Result<Option<Lease>, NodeError> {
    if node.annotation(&names.managed) != "true" {
        return Ok(None);
    }
    let (v4, v6) = pod_cidrs(&node.spec)?;
    if v4.is_none() && v6.is_none() {
        return Ok(None);
    }
    let mut key = SubnetKey {
        ipv4: None,
        ipv6: None,
    };
    let mut attrs = LeaseAttrs {
        public_ip: None,
        public_ipv6: None,
        backend_type: node.annotation(&names.backend_type).to_string(),
        backend_data: None,
        backend_v6_data: None,
    };
    if families.ipv4 {
        attrs.public_ip = Some(address(node, &names.public_ip, IpFamily::V4)?);
        attrs.backend_data = backend_data(node, &names.backend_data)?;
        key.ipv4 = Some(v4.ok_or(NodeError::NoLeaseCidr(IpFamily::V4))?);
    }
    if families.ipv6 {
        attrs.public_ipv6 = Some(address(node, &names.public_ipv6, IpFamily::V6)?);
        attrs.backend_v6_data = backend_data(node, &names.backend_v6_data)?;
        key.ipv6 = Some(v6.ok_or(NodeError::NoLeaseCidr(IpFamily::V6))?);
    }
    if key.ipv4.is_none() && key.ipv6.is_none() {
        return Ok(None);
    }
    Ok(Some(Lease { key, attrs }))
}

/// The addresses a user set for this node (`node-public-ip`, `node-public-ipv6`); they take
/// the place of `--public-ip` and `--public-ipv6`, as in flanneld.
pub fn node_public_ips(
    node: &NodeObject,
    names: &Annotations,
) -> Result<(Option<Ipv4Addr>, Option<Ipv6Addr>), NodeError> {
    let set = |name: &str| !node.annotation(name).is_empty();
    let v4 = set(&names.node_public_ip)
        .then(|| address(node, &names.node_public_ip, IpFamily::V4))
        .transpose()?;
    let v6 = set(&names.node_public_ipv6)
        .then(|| address(node, &names.node_public_ipv6, IpFamily::V6))
        .transpose()?;
    Ok((v4, v6))
}

/// The address of `family` that the annotation `name` holds.
fn address<A: std::str::FromStr>(
    node: &NodeObject,
    name: &str,
    family: IpFamily,
) -> Result<A, NodeError> {
    let text = node.annotation(name);
    text.parse().map_err(|_| NodeError::NotAnAddress {
        annotation: name.to_string(),
        text: text.to_string(),
        family,
    })
}

/// The attributes this node's annotations hold, whatever else they lack: its backend data
/// (where the VtepMAC is, kept across restarts since a MAC that changed with every reboot went
/// stale on peers, flannel-io/flannel#1795) and type, and its public addresses where they parse.
pub fn own_attrs(node: &NodeObject, names: &Annotations) -> Option<LeaseAttrs> {
    let backend_data = backend_data(node, &names.backend_data).ok().flatten();
    let backend_v6_data = backend_data_v6(node, names);
    if backend_data.is_none() && backend_v6_data.is_none() {
        return None;
    }
    Some(LeaseAttrs {
        public_ip: node.annotation(&names.public_ip).parse().ok(),
        public_ipv6: node.annotation(&names.public_ipv6).parse().ok(),
        backend_type: node.annotation(&names.backend_type).to_string(),
        backend_data,
        backend_v6_data,
    })
}

fn backend_data_v6(node: &NodeObject, names: &Annotations) -> Option<Box<RawValue>> {
    backend_data(node, &names.backend_v6_data).ok().flatten()
}

/// The lease entry a node gives, in the registry's form (key, flannel's lease JSON).
pub fn node_entry(
    node: &NodeObject,
    names: &Annotations,
    families: Families,
) -> Result<Option<Entry>, NodeError> {
    Ok(node_lease(node, names, families)?.map(|l| Entry {
        key: l.key.to_string(),
        value: l.attrs.encode().into_bytes(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::kube::fixtures::*;
    use serde_json::json;

    #[test]
    fn annotation_names_follow_the_prefix_as_flanneld_completes_it() {
        let a = names();
        assert_eq!(a.managed, "flannel.alpha.coreos.com/kube-subnet-manager");
        assert_eq!(a.backend_data, "flannel.alpha.coreos.com/backend-data");
        assert_eq!(
            a.backend_v6_data,
            "flannel.alpha.coreos.com/backend-v6-data"
        );
        assert_eq!(
            a.public_ipv6_overwrite,
            "flannel.alpha.coreos.com/public-ipv6-overwrite"
        );
        assert_eq!(a.node_public_ip, "flannel.alpha.coreos.com/node-public-ip");
        let a = Annotations::new("example.com/net").unwrap();
        assert_eq!(a.backend_type, "example.com/net-backend-type");
        let a = Annotations::new("example.com/net-").unwrap();
        assert_eq!(a.public_ip, "example.com/net-public-ip");
        for bad in ["a/b/c", "nodots", "example.com/Net", "exa mple.com", ""] {
            assert!(Annotations::new(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn pod_cidrs_give_the_first_of_each_family_in_any_order() {
        let spec = |single: &str, list: &[&str]| NodeSpec {
            pod_cidr: single.into(),
            pod_cidrs: list.iter().map(|s| s.to_string()).collect(),
        };
        let (v4, v6) = pod_cidrs(&spec("10.5.1.0/24", &[])).unwrap();
        assert_eq!((v4.unwrap().to_string(), v6), ("10.5.1.0/24".into(), None));
        let (v4, v6) = pod_cidrs(&spec("fd00:1::/64", &["fd00:1::/64", "10.5.1.0/24"])).unwrap();
        assert_eq!(v4.unwrap().to_string(), "10.5.1.0/24");
        assert_eq!(v6.unwrap().to_string(), "fd00:1::/64");
        // Host bits are dropped, as Go's ParseCIDR drops them.
        let (v4, _) = pod_cidrs(&spec("10.5.1.7/24", &[])).unwrap();
        assert_eq!(v4.unwrap().to_string(), "10.5.1.0/24");
        assert_eq!(pod_cidrs(&spec("", &[])).unwrap(), (None, None));
        assert!(pod_cidrs(&spec("", &["10.5.1.0/24", "fd00::/64", "10.5.2.0/24"])).is_err());
        assert!(pod_cidrs(&spec("banana", &[])).is_err());
        // Prefix 0, whatever the host bits, in either family.
        for c in ["10.244.4.42/0", "0.0.0.0/0", "::/0", "fd00::4/0"] {
            let e = pod_cidrs(&spec(c, &[])).unwrap_err().to_string();
            assert!(e.contains(c) && e.contains("every address"), "{e}");
        }
    }

    #[test]
    fn a_node_whose_pod_cidr_is_every_address_gives_no_lease() {
        // Found by the kube_node fuzz target: 10.244.4.42/0 became the IPv4 subnet 0.0.0.0/0,
        // whose key (0.0.0.0-0) says "no IPv4 subnet", so the dual-stack lease read back
        // as an IPv6-only one and the IPv4-only lease's key did not parse at all.
        let a = names();
        let mut n = flannel_node("d", "10.244.4.42/0", "192.168.1.4");
        n.metadata
            .annotations
            .insert(a.public_ipv6.clone(), "fd00::4".into());
        n.spec.pod_cidrs = vec!["fd00:0:0:4::/64".into(), "10.244.4.42/0".into()];
        let both = Families {
            ipv4: true,
            ipv6: true,
        };
        for families in [V4, both] {
            let e = node_lease(&n, &a, families).unwrap_err().to_string();
            assert!(e.contains("10.244.4.42/0"), "{e}");
            assert!(node_entry(&n, &a, families).is_err());
        }
        let c = cfg(r#"{"Network":"10.244.0.0/16"}"#);
        assert!(own_subnet(&n, &c).is_err());
    }

    #[test]
    fn the_own_subnet_is_the_pod_cidr_inside_the_network() {
        let c = cfg(r#"{"Network":"10.5.0.0/16"}"#);
        let n = node("n1", &["10.5.3.0/24"], json!({}));
        assert_eq!(
            own_subnet(&n, &c).unwrap().unwrap().to_string(),
            "10.5.3.0-24"
        );
        assert_eq!(own_subnet(&node("n1", &[], json!(null)), &c).unwrap(), None);
        let e = own_subnet(&node("n1", &["10.9.3.0/24"], json!({})), &c)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("10.9.3.0/24") && e.contains("10.5.0.0/16"),
            "{e}"
        );
        // Wider than the network is outside it too.
        assert!(own_subnet(&node("n1", &["10.0.0.0/8"], json!({})), &c).is_err());
        // An IPv6 CIDR is ignored in an IPv4 network; alone, it is refused.
        let n = node("n1", &["fd00:1::/64", "10.5.3.0/24"], json!({}));
        assert_eq!(
            own_subnet(&n, &c).unwrap().unwrap().to_string(),
            "10.5.3.0-24"
        );
        assert!(own_subnet(&node("n1", &["fd00:1::/64"], json!({})), &c).is_err());
        let dual = cfg(r#"{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fd00::/56"}"#);
        let n = node("n1", &["fd00:0:0:3::/64", "10.5.3.0/24"], json!({}));
        assert_eq!(
            own_subnet(&n, &dual).unwrap().unwrap().to_string(),
            "10.5.3.0-24&fd00:0:0:3::-64"
        );
    }

    #[test]
    fn a_node_annotated_by_go_flanneld_is_the_lease_etcd_would_hold() {
        let n = flannel_node("n2", "10.5.7.0/24", "192.168.1.2");
        let e = node_entry(&n, &names(), V4).unwrap().unwrap();
        assert_eq!(e.key, "10.5.7.0-24");
        assert_eq!(
            String::from_utf8(e.value).unwrap(),
            format!(
                r#"{{"PublicIP":"192.168.1.2","PublicIPv6":null,"BackendType":"vxlan","BackendData":{{"VNI":1,"VtepMAC":"{MAC}"}}}}"#
            )
        );
        // host-gw's data is "null", which is none.
        let mut hg = n.clone();
        hg.metadata
            .annotations
            .insert(names().backend_type, "host-gw".into());
        hg.metadata
            .annotations
            .insert(names().backend_data, "null".into());
        let l = node_lease(&hg, &names(), V4).unwrap().unwrap();
        assert!(l.attrs.backend_data.is_none());
        assert_eq!(l.attrs.backend_type, "host-gw");
    }

    #[test]
    fn nodes_that_are_no_leases_and_bad_annotations() {
        let a = names();
        let plain = node("n3", &["10.5.8.0/24"], json!({"x": "y"}));
        assert_eq!(node_lease(&plain, &a, V4).unwrap(), None);
        let mut unassigned = flannel_node("n3", "10.5.8.0/24", "192.168.1.3");
        unassigned.spec = NodeSpec::default();
        assert_eq!(node_lease(&unassigned, &a, V4).unwrap(), None);
        let mut bad = flannel_node("n3", "10.5.8.0/24", "192.168.1.3");
        bad.metadata
            .annotations
            .insert(a.public_ip.clone(), "banana".into());
        let e = node_lease(&bad, &a, V4).unwrap_err().to_string();
        assert!(e.contains(&a.public_ip) && e.contains("banana"), "{e}");
        let mut bad = flannel_node("n3", "10.5.8.0/24", "192.168.1.3");
        bad.metadata
            .annotations
            .insert(a.backend_data.clone(), "{VNI:".into());
        assert!(node_lease(&bad, &a, V4)
            .unwrap_err()
            .to_string()
            .contains(&a.backend_data));
    }

    #[test]
    fn nulls_in_a_node_are_empty() {
        let n: NodeObject = serde_json::from_str(
            r#"{"metadata":{"name":"n","annotations":null},"spec":{"podCIDR":null,"podCIDRs":null}}"#,
        )
        .unwrap();
        assert_eq!(n.metadata.name, "n");
        assert!(n.metadata.annotations.is_empty() && n.spec.pod_cidrs.is_empty());
    }
}
