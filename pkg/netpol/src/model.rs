//! The objects the enforcer reads, with only the fields it uses: a Namespace's labels; a Pod's
//! labels, node, addresses, phase and named container ports; a NetworkPolicy's spec. The rest
//! of each object is skipped unread. `null` reads as the field's default, as Go's decoder
//! gives it, and a port that is neither a number nor a name is kept as what it is, so that one
//! odd object is reported, not a failed watch.

use kube_lite::{null_as_default, Object};
use serde::Deserialize;
use std::collections::BTreeMap;

pub type Labels = BTreeMap<String, String>;

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Meta {
    #[serde(default, deserialize_with = "null_as_default")]
    pub name: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub namespace: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub uid: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub resource_version: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub labels: Labels,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Namespace {
    #[serde(default, deserialize_with = "null_as_default")]
    pub metadata: Meta,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Pod {
    #[serde(default, deserialize_with = "null_as_default")]
    pub metadata: Meta,
    #[serde(default, deserialize_with = "null_as_default")]
    pub spec: PodSpec,
    #[serde(default, deserialize_with = "null_as_default")]
    pub status: PodStatus,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    #[serde(default, deserialize_with = "null_as_default")]
    pub node_name: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub host_network: bool,
    #[serde(default, deserialize_with = "null_as_default")]
    pub containers: Vec<Container>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Container {
    #[serde(default, deserialize_with = "null_as_default")]
    pub ports: Vec<ContainerPort>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerPort {
    #[serde(default, deserialize_with = "null_as_default")]
    pub name: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub container_port: i64,
    /// Empty means TCP, the API's default.
    #[serde(default, deserialize_with = "null_as_default")]
    pub protocol: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStatus {
    #[serde(default, deserialize_with = "null_as_default")]
    pub phase: String,
    #[serde(default, rename = "podIP", deserialize_with = "null_as_default")]
    pub pod_ip: String,
    #[serde(default, rename = "podIPs", deserialize_with = "null_as_default")]
    pub pod_ips: Vec<PodIp>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct PodIp {
    #[serde(default, deserialize_with = "null_as_default")]
    pub ip: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct NetworkPolicy {
    #[serde(default, deserialize_with = "null_as_default")]
    pub metadata: Meta,
    #[serde(default, deserialize_with = "null_as_default")]
    pub spec: PolicySpec,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicySpec {
    #[serde(default, deserialize_with = "null_as_default")]
    pub pod_selector: LabelSelector,
    #[serde(default, deserialize_with = "null_as_default")]
    pub policy_types: Vec<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub ingress: Vec<Rule>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub egress: Vec<Rule>,
}

/// An ingress rule (`from`) or an egress rule (`to`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Rule {
    #[serde(
        default,
        rename = "from",
        alias = "to",
        deserialize_with = "null_as_default"
    )]
    pub peers: Vec<Peer>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub ports: Vec<PolicyPort>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Peer {
    #[serde(default)]
    pub pod_selector: Option<LabelSelector>,
    #[serde(default)]
    pub namespace_selector: Option<LabelSelector>,
    #[serde(default)]
    pub ip_block: Option<IpBlock>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct IpBlock {
    #[serde(default, deserialize_with = "null_as_default")]
    pub cidr: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub except: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyPort {
    /// None means TCP, the API's default.
    #[serde(default)]
    pub protocol: Option<String>,
    #[serde(default)]
    pub port: Option<PortRef>,
    #[serde(default)]
    pub end_port: Option<i64>,
}

/// A port by number or by the name of a container port.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum PortRef {
    Number(i64),
    Name(String),
    /// Anything else the object holds, reported as such.
    Other(serde_json::Value),
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    #[serde(default, deserialize_with = "null_as_default")]
    pub match_labels: Labels,
    #[serde(default, deserialize_with = "null_as_default")]
    pub match_expressions: Vec<Requirement>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Requirement {
    #[serde(default, deserialize_with = "null_as_default")]
    pub key: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub operator: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub values: Vec<String>,
}

macro_rules! objects {
    ($($t:ty),*) => {$(
        impl Object for $t {
            fn resource_version(&self) -> &str {
                &self.metadata.resource_version
            }
        }
    )*};
}

objects!(Namespace, Pod, NetworkPolicy);

impl Pod {
    /// Its addresses: `status.podIPs`, else `status.podIP`, each parsed; unparsable ones left
    /// out.
    pub fn ips(&self) -> Vec<std::net::IpAddr> {
        let listed: Vec<&str> = if self.status.pod_ips.is_empty() {
            vec![self.status.pod_ip.as_str()]
        } else {
            self.status.pod_ips.iter().map(|p| p.ip.as_str()).collect()
        };
        let mut ips: Vec<std::net::IpAddr> = listed.iter().filter_map(|s| s.parse().ok()).collect();
        ips.dedup();
        ips
    }

    /// Whether policies apply to it, as a target or a peer: a pod with an address of its
    /// own (not the node's network) that has not finished.
    pub fn is_policy_pod(&self) -> bool {
        !self.policy_ips().is_empty()
    }

    /// Its addresses when it is a policy pod; none when it is not.
    pub fn policy_ips(&self) -> Vec<std::net::IpAddr> {
        if self.spec.host_network || matches!(self.status.phase.as_str(), "Succeeded" | "Failed") {
            return Vec::new();
        }
        self.ips()
    }

    /// The container ports named `name` of `protocol`.
    pub fn named_ports<'a>(
        &'a self,
        name: &'a str,
        protocol: &'a str,
    ) -> impl Iterator<Item = i64> + 'a {
        self.spec
            .containers
            .iter()
            .flat_map(|c| &c.ports)
            .filter(move |p| {
                p.name == name && protocol_or_tcp(&p.protocol).eq_ignore_ascii_case(protocol)
            })
            .map(|p| p.container_port)
    }
}

/// A protocol field's value, TCP when empty.
pub fn protocol_or_tcp(p: &str) -> &str {
    if p.is_empty() {
        "TCP"
    } else {
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn objects_read_only_what_they_need_and_take_nulls() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "a", "namespace": "x", "labels": null, "managedFields": [{}]},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "ports": [
                {"name": "serve-80-tcp", "containerPort": 80},
                {"name": "serve-80-udp", "containerPort": 80, "protocol": "UDP"}]}]},
            "status": {"podIP": "10.5.1.2", "podIPs": [{"ip": "10.5.1.2"}, {"ip": "fd00::2"}]}
        }))
        .unwrap();
        assert!(pod.metadata.labels.is_empty());
        assert_eq!(pod.ips().len(), 2);
        assert_eq!(
            pod.named_ports("serve-80-tcp", "TCP").collect::<Vec<_>>(),
            [80]
        );
        assert_eq!(
            pod.named_ports("serve-80-udp", "UDP").collect::<Vec<_>>(),
            [80]
        );
        assert_eq!(pod.named_ports("serve-80-udp", "TCP").count(), 0);
        assert!(pod.is_policy_pod());

        let policy: NetworkPolicy = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "x"},
            "spec": {"podSelector": {}, "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}}],
                     "ports": [{"port": "serve-80-tcp"}, {"port": 81, "endPort": 90}, {"port": 1.5}]}],
                     "egress": [{"to": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}
        }))
        .unwrap();
        let ports = &policy.spec.ingress[0].ports;
        assert_eq!(ports[0].port, Some(PortRef::Name("serve-80-tcp".into())));
        assert_eq!(ports[1].end_port, Some(90));
        assert!(matches!(ports[2].port, Some(PortRef::Other(_))));
        assert!(policy.spec.egress[0].peers[0].pod_selector.is_some());
        assert!(policy.spec.policy_types.is_empty());
    }

    #[test]
    fn finished_and_host_network_pods_are_no_policy_pods() {
        let mut pod = Pod::default();
        assert!(!pod.is_policy_pod(), "no address yet");
        pod.status.pod_ip = "10.5.1.2".into();
        assert!(pod.is_policy_pod());
        pod.status.phase = "Succeeded".into();
        assert!(!pod.is_policy_pod());
        pod.status.phase = "Running".into();
        pod.spec.host_network = true;
        assert!(!pod.is_policy_pod());
    }
}
