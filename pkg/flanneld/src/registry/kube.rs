//! Leases from Kubernetes Node objects, kept as kube-flannel keeps them (`--kube-subnet-mgr`):
//! a node's subnet is its `spec.podCIDR(s)`, assigned by the cluster; what other nodes need to
//! reach it lives in its annotations under `--kube-annotation-prefix`. This node writes its own
//! annotations with a strategic-merge PATCH of `nodes/<name>/status` and follows everyone
//! else's through a list and a watch.
//!
//! The decisions (annotation names, a Node to a lease, the PATCH bodies, the watch's state) are
//! pure and tested here; `KubeClient` only carries them to the API server. Per node only what a
//! lease needs is kept, never the Node object.

use crate::config::NetConfig;
use crate::lease::{Lease, LeaseAttrs, SubnetKey};
use crate::metrics::{self, METRICS};
use crate::registry::{Change, Entry, LeaseRequest, Listing, Registry, RegistryError, WatchEnd};

type RegResult<T> = crate::registry::Result<T>;
use crate::view::BadEntry;
use futures::{Stream, StreamExt};
use ipnetwork::{IpNetwork, Ipv4Network, Ipv6Network};
use kube::api::{ListParams, Patch, PatchParams, WatchParams};
use kube::core::WatchEvent;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::mpsc;
use tracing::{info, warn};

/// flanneld's `--kube-annotation-prefix` default.
pub const DEFAULT_PREFIX: &str = "flannel.alpha.coreos.com";
/// Where a pod finds its service account, as client-go reads it.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// Nodes per page of a list.
const PAGE: u32 = 500;
/// A watch asks the server to end it after this, and is then resumed from where it was.
const WATCH_TIMEOUT_S: u32 = 290;

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
    pub fn new(prefix: &str) -> Result<Annotations, String> {
        let mut p = prefix.to_string();
        match p.matches('/').count() {
            0 => p.push('/'),
            1 => {}
            _ => return Err(format!("{prefix:?} has more than one slash")),
        }
        if !p.ends_with('/') && !p.ends_with('-') {
            p.push('-');
        }
        // A domain, a slash, then optionally a word and a dash. flanneld checks only the end
        // of the prefix; the whole of it is checked here, since the API server refuses
        // annotation names with anything else in front.
        let shape = regex::Regex::new(r"^[a-z0-9_-]+(?:\.[a-z0-9_-]+)+/(?:[a-z0-9_-]+-)?$")
            .map_err(|e| e.to_string())?;
        if !shape.is_match(&p) {
            return Err(format!(
                "{prefix:?} is not a domain followed by / and an optional name (like \
                 flannel.alpha.coreos.com or example.com/net)"
            ));
        }
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

fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
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

impl NodeObject {
    fn annotation(&self, name: &str) -> &str {
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
/// empty), whichever comes first in the list.
pub fn pod_cidrs(spec: &NodeSpec) -> Result<(Option<Ipv4Network>, Option<Ipv6Network>), String> {
    let list: Vec<&str> = if spec.pod_cidrs.is_empty() {
        [spec.pod_cidr.as_str()]
            .into_iter()
            .filter(|c| !c.is_empty())
            .collect()
    } else {
        spec.pod_cidrs.iter().map(String::as_str).collect()
    };
    if list.len() > 2 {
        return Err(format!(
            "podCIDRs {list:?}: at most one IPv4 and one IPv6 network"
        ));
    }
    let (mut v4, mut v6) = (None, None);
    for c in list {
        let net: IpNetwork = c
            .parse()
            .map_err(|e| format!("podCIDR {c:?} is not a network: {e}"))?;
        // Go's ParseCIDR gives the network, whatever host bits the text has.
        match net {
            IpNetwork::V4(n) => {
                let n = Ipv4Network::new(n.network(), n.prefix()).map_err(|e| e.to_string())?;
                v4.get_or_insert(n);
            }
            IpNetwork::V6(n) => {
                let n = Ipv6Network::new(n.network(), n.prefix()).map_err(|e| e.to_string())?;
                v6.get_or_insert(n);
            }
        }
    }
    Ok((v4, v6))
}

/// This node's subnet from its Node: None while it has no podCIDR. A CIDR of a family the
/// network lacks is ignored, as flanneld ignores it; one outside the network is refused.
pub fn own_subnet(node: &NodeObject, cfg: &NetConfig) -> Result<Option<SubnetKey>, String> {
    let (v4, v6) = pod_cidrs(&node.spec)?;
    if v4.is_none() && v6.is_none() {
        return Ok(None);
    }
    let name = &node.metadata.name;
    let mut key = SubnetKey {
        ipv4: None,
        ipv6: None,
    };
    if let Some(fam) = &cfg.ipv4 {
        let n = v4.ok_or_else(|| {
            format!(
                "node {name:?} has no IPv4 podCIDR ({:?}), but the flannel network {} is IPv4",
                node.spec.pod_cidrs, fam.network
            )
        })?;
        if n.prefix() < fam.network.prefix() || !fam.network.contains(n.network()) {
            return Err(format!(
                "podCIDR {n} of node {name:?} is outside the flannel network {} (net-conf.json's Network)",
                fam.network
            ));
        }
        key.ipv4 = Some(n);
    }
    if let Some(fam) = &cfg.ipv6 {
        let n = v6.ok_or_else(|| {
            format!(
                "node {name:?} has no IPv6 podCIDR ({:?}), but the flannel network has IPv6Network {}",
                node.spec.pod_cidrs, fam.network
            )
        })?;
        if n.prefix() < fam.network.prefix() || !fam.network.contains(n.network()) {
            return Err(format!(
                "podCIDR {n} of node {name:?} is outside the flannel network's IPv6Network {}",
                fam.network
            ));
        }
        key.ipv6 = Some(n);
    }
    if key.ipv4.is_none() && key.ipv6.is_none() {
        return Err(format!(
            "node {name:?} has podCIDRs {:?}, none of a family the flannel network has",
            node.spec.pod_cidrs
        ));
    }
    Ok(Some(key))
}

fn backend_data(node: &NodeObject, name: &str) -> Result<Option<Box<RawValue>>, String> {
    match node.annotation(name) {
        "" | "null" => Ok(None),
        text => RawValue::from_string(text.to_string())
            .map(Some)
            .map_err(|e| format!("annotation {name} {text:?} is not JSON: {e}")),
    }
}

/// Another node's lease from its Node, as flanneld reads it: None unless it is annotated
/// `kube-subnet-manager: "true"` and has a podCIDR; Err for an annotation that cannot be read.
pub fn node_lease(
    node: &NodeObject,
    names: &Annotations,
    families: Families,
) -> Result<Option<Lease>, String> {
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
        let text = node.annotation(&names.public_ip);
        attrs.public_ip = Some(text.parse::<Ipv4Addr>().map_err(|_| {
            format!(
                "annotation {} {text:?} is not an IPv4 address",
                names.public_ip
            )
        })?);
        attrs.backend_data = backend_data(node, &names.backend_data)?;
        key.ipv4 = Some(v4.ok_or("no IPv4 network in its podCIDRs")?);
    }
    if families.ipv6 {
        let text = node.annotation(&names.public_ipv6);
        attrs.public_ipv6 = Some(text.parse::<Ipv6Addr>().map_err(|_| {
            format!(
                "annotation {} {text:?} is not an IPv6 address",
                names.public_ipv6
            )
        })?);
        attrs.backend_v6_data = backend_data(node, &names.backend_v6_data)?;
        key.ipv6 = Some(v6.ok_or("no IPv6 network in its podCIDRs")?);
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
) -> Result<(Option<Ipv4Addr>, Option<Ipv6Addr>), String> {
    let v4 = match node.annotation(&names.node_public_ip) {
        "" => None,
        t => Some(t.parse::<Ipv4Addr>().map_err(|_| {
            format!(
                "annotation {} {t:?} is not an IPv4 address",
                names.node_public_ip
            )
        })?),
    };
    let v6 = match node.annotation(&names.node_public_ipv6) {
        "" => None,
        t => Some(t.parse::<Ipv6Addr>().map_err(|_| {
            format!(
                "annotation {} {t:?} is not an IPv6 address",
                names.node_public_ipv6
            )
        })?),
    };
    Ok((v4, v6))
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

/// The strategic-merge PATCH of `nodes/<name>/status` that makes this node's annotations say
/// `attrs`, as flanneld decides it: None when they already do. Only the annotations that
/// change are in the body; a user's `public-ip-overwrite` wins over the public address.
pub fn annotation_patch(
    node: &NodeObject,
    attrs: &LeaseAttrs,
    names: &Annotations,
) -> Option<Value> {
    let get = |n: &str| node.annotation(n);
    let raw = |v: &Option<Box<RawValue>>| v.as_ref().map_or("null", |r| r.get()).to_string();
    let (bd, v6bd) = (raw(&attrs.backend_data), raw(&attrs.backend_v6_data));
    let ip = attrs.public_ip.unwrap_or(Ipv4Addr::UNSPECIFIED).to_string();
    let ip6 = attrs.public_ipv6.map(|a| a.to_string());
    let kind = attrs.backend_type.as_str();
    let overwrite = get(&names.public_ip_overwrite);
    let overwrite6 = get(&names.public_ipv6_overwrite);

    let v4_stale = get(&names.backend_data) != bd
        || get(&names.backend_type) != kind
        || get(&names.public_ip) != ip
        || get(&names.managed) != "true"
        || (!overwrite.is_empty() && overwrite != ip);
    let v6_stale = ip6.as_ref().is_some_and(|ip6| {
        get(&names.backend_v6_data) != v6bd
            || get(&names.backend_type) != kind
            || get(&names.public_ipv6) != ip6
            || get(&names.managed) != "true"
            || (!overwrite6.is_empty() && overwrite6 != ip6)
    });
    if !v4_stale && !v6_stale {
        return None;
    }
    let mut want: BTreeMap<&str, String> = BTreeMap::new();
    want.insert(&names.backend_type, kind.to_string());
    // vxlan without IPv4 data (an IPv6-only network) leaves the IPv4 annotations alone.
    if kind != "vxlan" || bd != "null" {
        want.insert(&names.backend_data, bd);
        let public = if overwrite.is_empty() {
            ip
        } else {
            overwrite.to_string()
        };
        want.insert(&names.public_ip, public);
    }
    let v6_written = match kind {
        "vxlan" | "wireguard" => v6bd != "null" && ip6.is_some(),
        "host-gw" | "extension" => ip6.is_some(),
        _ => false,
    };
    if let (true, Some(ip6)) = (v6_written, ip6) {
        want.insert(&names.backend_v6_data, v6bd);
        let public = if overwrite6.is_empty() {
            ip6
        } else {
            overwrite6.to_string()
        };
        want.insert(&names.public_ipv6, public);
    }
    want.insert(&names.managed, "true".to_string());
    let changed: Map<String, Value> = want
        .into_iter()
        .filter(|(k, v)| get(k) != v || !node.metadata.annotations.contains_key(*k))
        .map(|(k, v)| (k.to_string(), Value::String(v)))
        .collect();
    (!changed.is_empty()).then(|| json!({"metadata": {"annotations": changed}}))
}

/// flanneld's node condition.
#[derive(Serialize)]
struct Condition {
    #[serde(rename = "type")]
    kind: &'static str,
    status: &'static str,
    #[serde(rename = "lastHeartbeatTime")]
    last_heartbeat: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
    #[serde(rename = "lastTransitionTime")]
    last_transition: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
    reason: &'static str,
    message: &'static str,
}

/// The strategic-merge PATCH of `nodes/<name>/status` that sets `NetworkUnavailable=False`
/// (`--set-node-network-unavailable`); the list is merged by `type`, so other conditions stay.
pub fn network_available_patch(
    now: k8s_openapi::chrono::DateTime<k8s_openapi::chrono::Utc>,
) -> Value {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    let c = Condition {
        kind: "NetworkUnavailable",
        status: "False",
        last_heartbeat: Time(now),
        last_transition: Time(now),
        reason: "FlannelIsUp",
        message: "Flannel is running on this node",
    };
    json!({"status": {"conditions": [c]}})
}

/// The lease entry a node gives, in the registry's form (key, flannel's lease JSON).
pub fn node_entry(
    node: &NodeObject,
    names: &Annotations,
    families: Families,
) -> Result<Option<Entry>, String> {
    Ok(node_lease(node, names, families)?.map(|l| Entry {
        key: l.key.to_string(),
        value: l.attrs.encode().into_bytes(),
    }))
}

/// What one listing or watch event changed.
#[derive(Debug, Clone, Default)]
pub struct Delivery {
    pub changes: Vec<Change>,
    /// Nodes whose annotations could not be read (key: `node <name>`).
    pub bad: Vec<BadEntry>,
}

/// Why a watch must end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchStop {
    /// 410: the resourceVersion left the server's window; list again.
    Expired(String),
    /// Any other error event.
    Failed(String),
}

/// The other nodes as leases, kept between a list and the watch that follows it: per node
/// only its entry. Events become Put or Delete of entries; a node whose lease did not change
/// (a status update, a label) is no change; a new listing yields only the difference.
#[derive(Debug, Clone)]
pub struct NodeWatch {
    names: Annotations,
    families: Families,
    known: HashMap<String, Entry>,
    resource_version: String,
}

impl NodeWatch {
    pub fn new(names: Annotations, families: Families) -> NodeWatch {
        NodeWatch {
            names,
            families,
            known: HashMap::new(),
            resource_version: String::new(),
        }
    }

    /// Where a watch resumes.
    pub fn resource_version(&self) -> &str {
        &self.resource_version
    }

    /// Every entry known now.
    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.known.values()
    }

    pub fn len(&self) -> usize {
        self.known.len()
    }

    pub fn is_empty(&self) -> bool {
        self.known.is_empty()
    }

    /// Updates one node; the changes go to `out`.
    fn update(&mut self, node: &NodeObject, out: &mut Delivery) {
        let name = &node.metadata.name;
        let entry = match node_entry(node, &self.names, self.families) {
            Ok(e) => e,
            Err(reason) => {
                out.bad.push(BadEntry {
                    key: format!("node {name}"),
                    reason,
                });
                None
            }
        };
        match (entry, self.known.get(name)) {
            (Some(e), Some(old)) if *old == e => {}
            (Some(e), old) => {
                if let Some(old) = old.filter(|o| o.key != e.key) {
                    out.changes.push(Change::Delete(old.key.clone()));
                }
                out.changes.push(Change::Put(e.clone()));
                self.known.insert(name.clone(), e);
            }
            (None, Some(_)) => self.forget(name, out),
            (None, None) => {}
        }
    }

    fn forget(&mut self, name: &str, out: &mut Delivery) {
        if let Some(old) = self.known.remove(name) {
            out.changes.push(Change::Delete(old.key));
        }
    }

    /// A complete listing at `resource_version` replaces what was known.
    pub fn listed(
        &mut self,
        nodes: impl IntoIterator<Item = NodeObject>,
        resource_version: String,
    ) -> Delivery {
        let mut out = Delivery::default();
        let mut seen = std::collections::HashSet::new();
        for n in nodes {
            self.update(&n, &mut out);
            seen.insert(n.metadata.name);
        }
        let gone: Vec<String> = self
            .known
            .keys()
            .filter(|k| !seen.contains(*k))
            .cloned()
            .collect();
        for name in gone {
            self.forget(&name, &mut out);
        }
        self.resource_version = resource_version;
        out
    }

    /// One event of the watch.
    pub fn event(&mut self, ev: WatchEvent<NodeObject>) -> Result<Delivery, WatchStop> {
        let mut out = Delivery::default();
        match ev {
            WatchEvent::Added(n) | WatchEvent::Modified(n) => {
                self.update(&n, &mut out);
                self.resource_version = n.metadata.resource_version;
            }
            WatchEvent::Deleted(n) => {
                self.forget(&n.metadata.name, &mut out);
                self.resource_version = n.metadata.resource_version;
            }
            WatchEvent::Bookmark(b) => self.resource_version = b.metadata.resource_version,
            WatchEvent::Error(e) if e.code == 410 => return Err(WatchStop::Expired(e.message)),
            WatchEvent::Error(e) => {
                return Err(WatchStop::Failed(format!(
                    "{} ({} {})",
                    e.message, e.code, e.reason
                )))
            }
        }
        Ok(out)
    }
}

/// What a request was, for error messages: RBAC's verb and resource, and the object.
#[derive(Debug, Clone, Copy)]
pub struct Op<'a> {
    pub verb: &'static str,
    pub resource: &'static str,
    pub name: Option<&'a str>,
}

impl fmt::Display for Op<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.verb, self.resource)?;
        if let Some(n) = self.name {
            write!(f, " {n:?}")?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeError {
    /// The API server could not be reached, timed out or answered 5xx: try again later.
    Unavailable(String),
    /// 401 or 403: the account lacks the right to this verb on this resource.
    Denied {
        verb: &'static str,
        resource: &'static str,
        message: String,
    },
    NotFound(String),
    /// 410: what was asked for is older than the server keeps.
    Expired(String),
    /// Any other refusal, or an answer that is not what the API gives.
    Refused(String),
    /// No configuration to reach the API server with.
    Config(String),
}

impl fmt::Display for KubeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KubeError::Denied {
                verb,
                resource,
                message,
            } => write!(
                f,
                "the API server does not let this account {verb} {resource}: {message} (flanneld \
                 needs get, list and watch on nodes, patch on nodes/status and get on pods)"
            ),
            KubeError::Unavailable(m)
            | KubeError::NotFound(m)
            | KubeError::Expired(m)
            | KubeError::Refused(m)
            | KubeError::Config(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for KubeError {}

/// What an answer with HTTP status `code` means for `op`.
pub fn classify(op: Op<'_>, code: u16, message: &str) -> KubeError {
    match code {
        401 | 403 => KubeError::Denied {
            verb: op.verb,
            resource: op.resource,
            message: message.to_string(),
        },
        404 => KubeError::NotFound(format!("{op}: {message}")),
        410 => KubeError::Expired(format!("{op}: {message}")),
        429 | 500..=599 => KubeError::Unavailable(format!("{op}: {message} ({code})")),
        _ => KubeError::Refused(format!("{op}: {message} ({code})")),
    }
}

fn from_kube(op: Op<'_>, e: kube::Error) -> KubeError {
    match e {
        kube::Error::Api(r) => classify(op, r.code, &r.message),
        kube::Error::SerdeError(e) => {
            KubeError::Refused(format!("{op}: the answer is not what the API gives: {e}"))
        }
        other => KubeError::Unavailable(format!("{op}: {other}")),
    }
}

/// client-go's in-cluster configuration as a kubeconfig: `https://$KUBERNETES_SERVICE_HOST:
/// $KUBERNETES_SERVICE_PORT`, the service account's token (read again as it rotates) and CA.
pub fn in_cluster_kubeconfig(
    host: Option<&str>,
    port: Option<&str>,
    dir: &Path,
) -> Result<kube::config::Kubeconfig, String> {
    let (Some(host), Some(port)) = (
        host.filter(|h| !h.is_empty()),
        port.filter(|p| !p.is_empty()),
    ) else {
        return Err(
            "not in a cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT \
                    are not both set"
                .into(),
        );
    };
    let token = dir.join("token");
    if let Err(e) = std::fs::metadata(&token) {
        return Err(format!(
            "the service account token {}: {e}",
            token.display()
        ));
    }
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_string()
    };
    let mut cluster = json!({"server": format!("https://{host}:{port}")});
    let ca = dir.join("ca.crt");
    if ca.exists() {
        cluster["certificate-authority"] = ca.display().to_string().into();
    }
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "in-cluster", "cluster": cluster}],
        "users": [{"name": "service-account", "user": {"tokenFile": token.display().to_string()}}],
        "contexts": [{"name": "in-cluster", "context": {"cluster": "in-cluster", "user": "service-account"}}],
        "current-context": "in-cluster",
    }))
    .map_err(|e| format!("the in-cluster configuration: {e}"))
}

/// Where this node's name comes from: `NODE_NAME`, else the pod's `spec.nodeName`.
#[derive(Debug, Clone, Default)]
pub struct NodeEnv {
    pub node_name: Option<String>,
    pub pod_name: Option<String>,
    pub pod_namespace: Option<String>,
}

impl NodeEnv {
    pub fn from_env() -> NodeEnv {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        NodeEnv {
            node_name: var("NODE_NAME"),
            pod_name: var("POD_NAME"),
            pod_namespace: var("POD_NAMESPACE"),
        }
    }
}

#[derive(Deserialize)]
struct PodObject {
    #[serde(default)]
    spec: PodSpec,
}

#[derive(Deserialize, Default)]
struct PodSpec {
    #[serde(rename = "nodeName", default, deserialize_with = "null_as_default")]
    node_name: String,
}

#[derive(Deserialize)]
struct NodeList {
    metadata: ListMeta,
    #[serde(default, deserialize_with = "null_as_default")]
    items: Vec<NodeObject>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListMeta {
    #[serde(default)]
    resource_version: String,
    #[serde(rename = "continue", default)]
    continue_token: Option<String>,
}

/// The Kubernetes API as flanneld uses it: Nodes and one Pod.
#[derive(Clone)]
pub struct KubeClient {
    client: kube::Client,
    server: String,
}

const NODES: &str = "/api/v1/nodes";

impl KubeClient {
    /// From the flags as flanneld takes them: a kubeconfig (its server replaced by
    /// `--kube-api-url` when both are given), or the URL alone, or else the in-cluster
    /// configuration, or else `$KUBECONFIG` / `~/.kube/config`.
    pub async fn connect(
        api_url: Option<&str>,
        kubeconfig: Option<&Path>,
    ) -> Result<KubeClient, KubeError> {
        let options = kube::config::KubeConfigOptions::default();
        let cfg_err = |what: String| {
            move |e: kube::config::KubeconfigError| KubeError::Config(format!("{what}: {e}"))
        };
        let mut config = match (api_url, kubeconfig) {
            (_, Some(path)) => {
                let what = format!("--kubeconfig-file {}", path.display());
                let kc =
                    kube::config::Kubeconfig::read_from(path).map_err(cfg_err(what.clone()))?;
                kube::Config::from_custom_kubeconfig(kc, &options)
                    .await
                    .map_err(cfg_err(what))?
            }
            (Some(url), None) => kube::Config::new(
                url.parse()
                    .map_err(|e| KubeError::Config(format!("--kube-api-url {url:?}: {e}")))?,
            ),
            (None, None) => {
                let host = std::env::var("KUBERNETES_SERVICE_HOST").ok();
                let port = std::env::var("KUBERNETES_SERVICE_PORT").ok();
                match in_cluster_kubeconfig(
                    host.as_deref(),
                    port.as_deref(),
                    Path::new(SERVICE_ACCOUNT_DIR),
                ) {
                    Ok(kc) => kube::Config::from_custom_kubeconfig(kc, &options)
                        .await
                        .map_err(cfg_err("the in-cluster configuration".into()))?,
                    Err(why) => kube::Config::from_kubeconfig(&options).await.map_err(|e| {
                        KubeError::Config(format!(
                            "no --kubeconfig-file or --kube-api-url, {why}, and no usable \
                             $KUBECONFIG or ~/.kube/config: {e}"
                        ))
                    })?,
                }
            }
        };
        if let (Some(url), Some(_)) = (api_url, kubeconfig) {
            config.cluster_url = url
                .parse()
                .map_err(|e| KubeError::Config(format!("--kube-api-url {url:?}: {e}")))?;
        }
        config.connect_timeout = Some(Duration::from_secs(5));
        let server = config.cluster_url.to_string();
        let client = kube::Client::try_from(config)
            .map_err(|e| KubeError::Config(format!("a client for {server}: {e}")))?;
        Ok(KubeClient { client, server })
    }

    /// The API server's URL, for log lines.
    pub fn server(&self) -> &str {
        &self.server
    }

    async fn request<T: serde::de::DeserializeOwned>(
        &self,
        op: Op<'_>,
        req: Result<http::Request<Vec<u8>>, kube::core::request::Error>,
    ) -> Result<T, KubeError> {
        let req = req.map_err(|e| KubeError::Refused(format!("{op}: {e}")))?;
        self.client.request(req).await.map_err(|e| from_kube(op, e))
    }

    /// This node's name: `NODE_NAME`, else the `spec.nodeName` of the pod `POD_NAME` in
    /// `POD_NAMESPACE`.
    pub async fn node_name(&self, env: &NodeEnv) -> Result<String, KubeError> {
        if let Some(n) = &env.node_name {
            return Ok(n.clone());
        }
        let (Some(pod), Some(ns)) = (&env.pod_name, &env.pod_namespace) else {
            return Err(KubeError::Config(
                "this node's name is unknown: set NODE_NAME, or POD_NAME and POD_NAMESPACE".into(),
            ));
        };
        let op = Op {
            verb: "get",
            resource: "pods",
            name: Some(pod),
        };
        let req = kube::core::Request::new(format!("/api/v1/namespaces/{ns}/pods"))
            .get(pod, &Default::default());
        let p: PodObject = self.request(op, req).await?;
        if p.spec.node_name.is_empty() {
            return Err(KubeError::Refused(format!(
                "pod {ns}/{pod} has no spec.nodeName"
            )));
        }
        Ok(p.spec.node_name)
    }

    pub async fn node(&self, name: &str) -> Result<NodeObject, KubeError> {
        let op = Op {
            verb: "get",
            resource: "nodes",
            name: Some(name),
        };
        self.request(
            op,
            kube::core::Request::new(NODES).get(name, &Default::default()),
        )
        .await
    }

    /// Every node, in pages, and the resourceVersion of the list.
    pub async fn list_nodes(&self) -> Result<(Vec<NodeObject>, String), KubeError> {
        let op = Op {
            verb: "list",
            resource: "nodes",
            name: None,
        };
        let mut nodes = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let lp = ListParams {
                limit: Some(PAGE),
                continue_token: token.take(),
                ..Default::default()
            };
            let page: NodeList = self
                .request(op, kube::core::Request::new(NODES).list(&lp))
                .await?;
            nodes.extend(page.items);
            match page.metadata.continue_token.filter(|t| !t.is_empty()) {
                Some(t) => token = Some(t),
                None => return Ok((nodes, page.metadata.resource_version)),
            }
        }
    }

    /// The node events after `resource_version`, with bookmarks, until the server ends the
    /// watch (after about five minutes) or the connection breaks.
    pub async fn watch_nodes(
        &self,
        resource_version: &str,
    ) -> Result<impl Stream<Item = Result<WatchEvent<NodeObject>, KubeError>> + use<>, KubeError>
    {
        let op = Op {
            verb: "watch",
            resource: "nodes",
            name: None,
        };
        let wp = WatchParams {
            timeout: Some(WATCH_TIMEOUT_S),
            bookmarks: true,
            ..Default::default()
        };
        let req = kube::core::Request::new(NODES)
            .watch(&wp, resource_version)
            .map_err(|e| KubeError::Refused(format!("{op}: {e}")))?;
        let stream = self
            .client
            .request_events::<NodeObject>(req)
            .await
            .map_err(|e| from_kube(op, e))?;
        Ok(StreamExt::map(stream, move |r| r.map_err(|e| from_kube(op, e))).boxed())
    }

    /// A strategic-merge PATCH of `nodes/<name>/status`.
    pub async fn patch_node_status(&self, name: &str, body: &Value) -> Result<(), KubeError> {
        let op = Op {
            verb: "patch",
            resource: "nodes/status",
            name: Some(name),
        };
        let req = kube::core::Request::new(NODES).patch_subresource(
            "status",
            name,
            &PatchParams::default(),
            &Patch::Strategic(body),
        );
        let _: Value = self.request(op, req).await?;
        Ok(())
    }
}

/// `--kube-subnet-mgr` and its flags.
#[derive(Debug, Clone)]
pub struct KubeOptions {
    pub api_url: Option<String>,
    pub kubeconfig: Option<PathBuf>,
    pub annotation_prefix: String,
    pub set_node_network_unavailable: bool,
    /// `--net-config-path`: the network config, as kube-flannel's ConfigMap mounts it.
    pub net_config: PathBuf,
}

/// The Kubernetes API as the daemon's registry of leases: this node's name, the watch's state
/// and where the network config is.
pub struct KubeRegistry {
    client: KubeClient,
    node_name: String,
    names: Annotations,
    net_conf_path: PathBuf,
    set_node_network_unavailable: bool,
    watch: Mutex<Option<NodeWatch>>,
}

/// Log lines about the same failure come at most this often.
const LOG_EVERY: Duration = Duration::from_secs(30);
/// Retries of a failed request wait from 200 ms up to this.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// A failure logged once, then again only every `LOG_EVERY` while it lasts.
#[derive(Default)]
struct Quiet {
    last: Option<Instant>,
}

impl Quiet {
    fn due(&mut self) -> bool {
        let due = self.last.is_none_or(|t| t.elapsed() >= LOG_EVERY);
        if due {
            self.last = Some(Instant::now());
        }
        due
    }
}

impl KubeRegistry {
    pub fn new(
        client: KubeClient,
        node_name: String,
        names: Annotations,
        net_conf_path: PathBuf,
        set_node_network_unavailable: bool,
    ) -> KubeRegistry {
        KubeRegistry {
            client,
            node_name,
            names,
            net_conf_path,
            set_node_network_unavailable,
            watch: Mutex::new(None),
        }
    }

    /// Connects as the flags say and finds this node's name (through its pod when NODE_NAME
    /// is unset), waiting while the API server does not answer; Err for what waiting does not
    /// mend (no configuration, no name, a refusal).
    pub async fn open(opts: &KubeOptions) -> Result<KubeRegistry, KubeError> {
        let names = Annotations::new(&opts.annotation_prefix)
            .map_err(|e| KubeError::Config(format!("--kube-annotation-prefix {e}")))?;
        let client =
            KubeClient::connect(opts.api_url.as_deref(), opts.kubeconfig.as_deref()).await?;
        let env = NodeEnv::from_env();
        let mut quiet = Quiet::default();
        let node_name = loop {
            match client.node_name(&env).await {
                Ok(n) => break n,
                Err(KubeError::Unavailable(e)) => {
                    if quiet.due() {
                        warn!("finding this node's name: {e}; retrying");
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(e) => return Err(e),
            }
        };
        info!(
            "this node is {node_name:?} in the Kubernetes API at {}",
            client.server()
        );
        Ok(KubeRegistry::new(
            client,
            node_name,
            names,
            opts.net_config.clone(),
            opts.set_node_network_unavailable,
        ))
    }

    /// Puts the addresses a user annotated this node with (`node-public-ip`,
    /// `node-public-ipv6`) in place of `--public-ip` and `--public-ipv6`, as flanneld does
    /// before it looks for the interface. A node that cannot be read at once keeps the flags'.
    pub async fn apply_public_ips(&self, wanted: &mut crate::iface::Wanted) {
        let read = tokio::time::timeout(Duration::from_secs(5), self.annotated_public_ips()).await;
        match read {
            Ok(Ok((v4, v6))) => {
                if let Some(ip) = v4 {
                    info!(
                        "public address {ip} from annotation {}",
                        self.names.node_public_ip
                    );
                    wanted.public_ip = Some(ip);
                }
                if let Some(ip) = v6 {
                    info!(
                        "public address {ip} from annotation {}",
                        self.names.node_public_ipv6
                    );
                    wanted.public_ipv6 = Some(ip);
                }
            }
            Ok(Err(KubeError::NotFound(_))) => {}
            Ok(Err(e)) => warn!(
                "reading node {:?}'s public address annotations: {e}",
                self.node_name
            ),
            Err(_) => warn!(
                "reading node {:?}'s public address annotations: no answer within 5 s",
                self.node_name
            ),
        }
    }

    pub fn client(&self) -> &KubeClient {
        &self.client
    }

    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    pub fn names(&self) -> &Annotations {
        &self.names
    }

    pub fn net_conf_path(&self) -> &Path {
        &self.net_conf_path
    }

    pub fn sets_node_network_unavailable(&self) -> bool {
        self.set_node_network_unavailable
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<NodeWatch>> {
        self.watch.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// This node's lease: its podCIDR, waited for while it has none; then its annotations
    /// written as flanneld writes them, then (`--set-node-network-unavailable`) its condition.
    /// Requests that fail are retried with backoff, logged once per 30 s; Err only for a
    /// podCIDR the network config cannot hold, which waiting does not change.
    pub async fn take_lease(
        &self,
        cfg: &NetConfig,
        attrs: &LeaseAttrs,
    ) -> Result<SubnetKey, String> {
        let name = self.node_name.as_str();
        let mut waiting = Quiet::default();
        let mut failing = Quiet::default();
        let mut delay = Duration::from_millis(200);
        let mut fail = |what: String, delay: &mut Duration| {
            metrics::inc(&METRICS.registry_errors);
            if failing.due() {
                warn!("{what}; retrying");
            }
            let d = *delay;
            *delay = (*delay * 2).min(MAX_BACKOFF);
            d
        };
        'again: loop {
            let node = match self.client.node(name).await {
                Ok(n) => n,
                Err(KubeError::NotFound(_)) => {
                    if waiting.due() {
                        info!("node {name:?} is not in the Kubernetes API yet; waiting for it");
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
                Err(e) => {
                    let d = fail(format!("reading node {name:?}: {e}"), &mut delay);
                    tokio::time::sleep(d).await;
                    continue;
                }
            };
            let key = match own_subnet(&node, cfg)? {
                Some(k) => k,
                None => {
                    if waiting.due() {
                        info!(
                            "node {name:?} has no podCIDR yet; waiting for the cluster to assign                              one (the controller manager's --allocate-node-cidrs)"
                        );
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            if let Some(patch) = annotation_patch(&node, attrs, &self.names) {
                loop {
                    match self.client.patch_node_status(name, &patch).await {
                        Ok(()) => break,
                        Err(KubeError::NotFound(_)) => continue 'again,
                        Err(e) => {
                            let d = fail(
                                format!("writing node {name:?}'s annotations: {e}"),
                                &mut delay,
                            );
                            tokio::time::sleep(d).await;
                        }
                    }
                }
                let written: Vec<&str> = patch["metadata"]["annotations"]
                    .as_object()
                    .map(|m| m.keys().map(String::as_str).collect())
                    .unwrap_or_default();
                info!("wrote node {name:?}'s annotations {}", written.join(", "));
            }
            if self.set_node_network_unavailable {
                loop {
                    let patch = network_available_patch(k8s_openapi::chrono::Utc::now());
                    match self.client.patch_node_status(name, &patch).await {
                        Ok(()) => break,
                        Err(KubeError::NotFound(_)) => continue 'again,
                        Err(e) => {
                            let d = fail(
                                format!(
                                    "setting node {name:?}'s NetworkUnavailable condition: {e}"
                                ),
                                &mut delay,
                            );
                            tokio::time::sleep(d).await;
                        }
                    }
                }
                info!("set node {name:?}'s condition NetworkUnavailable=False (FlannelIsUp)");
            }
            return Ok(key);
        }
    }

    /// What this node's annotations say of it, for the VtepMAC to keep (flannel#1795);
    /// None when the node cannot be read at once or carries no backend data.
    pub async fn earlier_attrs(&self) -> Option<LeaseAttrs> {
        let node = tokio::time::timeout(Duration::from_secs(5), self.client.node(&self.node_name))
            .await
            .ok()?
            .ok()?;
        own_attrs(&node, &self.names)
    }

    /// The addresses a user set for this node (`node-public-ip`, `node-public-ipv6`), which
    /// take the place of `--public-ip` and `--public-ipv6`.
    pub async fn annotated_public_ips(
        &self,
    ) -> Result<(Option<Ipv4Addr>, Option<Ipv6Addr>), KubeError> {
        let node = self.client.node(&self.node_name).await?;
        node_public_ips(&node, &self.names).map_err(KubeError::Refused)
    }

    /// Every node that is a lease, listed anew; the watch resumes from this listing.
    pub async fn list_leases(&self, families: Families) -> Result<Listing, KubeError> {
        let (nodes, rv) = self.client.list_nodes().await?;
        let mut guard = self.lock();
        let w = guard.get_or_insert_with(|| NodeWatch::new(self.names.clone(), families));
        let d = w.listed(nodes, rv);
        Ok(Listing {
            entries: w.entries().cloned().collect(),
            bad: d.bad,
            revision: 0,
        })
    }

    /// Follows the nodes from the last listing, sending every lease change, until a 410 asks
    /// for a new listing (`Compacted`) or nobody listens. A broken connection, a server that
    /// ends the watch or answers 5xx, is watched again from where it was, backing off.
    pub async fn follow(&self, tx: mpsc::Sender<Change>) -> WatchEnd {
        let mut delay = Duration::from_millis(200);
        let mut quiet = Quiet::default();
        loop {
            let rv = match self.lock().as_ref() {
                Some(w) => w.resource_version().to_string(),
                None => return WatchEnd::Broken("the nodes were never listed".into()),
            };
            let failure = match self.client.watch_nodes(&rv).await {
                Err(e) => Some(e.to_string()),
                Ok(mut events) => loop {
                    let Some(item) = events.next().await else {
                        break None;
                    };
                    let step = match item {
                        Ok(ev) => match self.lock().as_mut() {
                            Some(w) => w.event(ev),
                            None => return WatchEnd::Broken("the nodes were never listed".into()),
                        },
                        Err(e) => break Some(e.to_string()),
                    };
                    match step {
                        Ok(d) => {
                            delay = Duration::from_millis(200);
                            for b in &d.bad {
                                warn!("skipping {}: {}", b.key, b.reason);
                            }
                            for c in d.changes {
                                if tx.send(c).await.is_err() {
                                    return WatchEnd::Closed;
                                }
                            }
                        }
                        Err(WatchStop::Expired(m)) => {
                            info!("the watch on the nodes is too old ({m}); listing them again");
                            return WatchEnd::Compacted(0);
                        }
                        Err(WatchStop::Failed(m)) => break Some(m),
                    }
                },
            };
            if let Some(why) = failure {
                metrics::inc(&METRICS.registry_errors);
                if quiet.due() {
                    warn!(
                        "watching the nodes at {}: {why}; retrying",
                        self.client.server()
                    );
                }
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(MAX_BACKOFF);
            }
        }
    }
}

impl KubeRegistry {
    /// The families of the network config, for reading other nodes' annotations.
    fn families(&self) -> Families {
        std::fs::read_to_string(&self.net_conf_path)
            .ok()
            .and_then(|t| crate::config::parse(&t).ok())
            .map(|c| Families::of(&c))
            .unwrap_or(Families {
                ipv4: true,
                ipv6: false,
            })
    }
}

impl Registry for KubeRegistry {
    fn describe(&self) -> String {
        format!(
            "the Kubernetes API at {} (node {:?})",
            self.client.server(),
            self.node_name
        )
    }

    fn config_location(&self) -> String {
        self.net_conf_path.display().to_string()
    }

    /// The network config is a file (the ConfigMap's net-conf.json), as in flanneld's kube mode.
    async fn config(&self) -> RegResult<Option<Vec<u8>>> {
        match std::fs::read(&self.net_conf_path) {
            Ok(t) => Ok(Some(t)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(RegistryError::Failed(format!(
                "reading {}: {e}",
                self.net_conf_path.display()
            ))),
        }
    }

    async fn list(&self) -> RegResult<Listing> {
        self.list_leases(self.families())
            .await
            .map_err(|e| RegistryError::Failed(e.to_string()))
    }

    /// Subnets are the cluster's to assign: a node never creates one.
    async fn create(&self, key: &SubnetKey, _: &str, _: Duration) -> RegResult<SystemTime> {
        Err(RegistryError::Failed(format!(
            "subnet {key}: in the Kubernetes mode a node's subnet is its podCIDR, assigned by the cluster"
        )))
    }

    /// A podCIDR does not expire; the annotations stay until the node goes.
    async fn renew(&self, _: &SubnetKey, _: &str, ttl: Duration) -> RegResult<SystemTime> {
        Ok(SystemTime::now() + ttl)
    }

    /// A podCIDR is the cluster's; it goes with the Node.
    async fn delete(&self, _: &SubnetKey) -> RegResult<()> {
        Ok(())
    }

    async fn watch(&self, _revision: i64, tx: mpsc::Sender<Change>) -> WatchEnd {
        self.follow(tx).await
    }

    /// This node's podCIDR, its annotations written: the cluster assigned the subnet.
    async fn acquire(
        &self,
        req: &LeaseRequest<'_>,
    ) -> std::result::Result<(SubnetKey, SystemTime), String> {
        let key = self.take_lease(req.config, req.attrs).await?;
        Ok((key, SystemTime::now() + req.ttl))
    }

    /// This node's own annotations, found by its name (its public address may be a user's
    /// overwrite).
    async fn earlier_lease(&self, _: &NetConfig, _: &crate::alloc::Node) -> Option<LeaseAttrs> {
        self.earlier_attrs().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: &str = "flannel.alpha.coreos.com";
    const MAC: &str = "8a:b2:a4:39:cb:3f";

    fn names() -> Annotations {
        Annotations::new(P).unwrap()
    }

    const V4: Families = Families {
        ipv4: true,
        ipv6: false,
    };

    /// A Node as the API server sends it, with the fields a lease does not need.
    fn node_json(name: &str, cidrs: &[&str], annotations: Value) -> String {
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

    fn node(name: &str, cidrs: &[&str], annotations: Value) -> NodeObject {
        serde_json::from_str(&node_json(name, cidrs, annotations)).unwrap()
    }

    /// A node annotated as Go's flanneld annotates it (vxlan, IPv4).
    fn flannel_node(name: &str, cidr: &str, ip: &str) -> NodeObject {
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

    fn cfg(text: &str) -> NetConfig {
        crate::config::parse(text).unwrap()
    }

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
        let e = own_subnet(&node("n1", &["10.9.3.0/24"], json!({})), &c).unwrap_err();
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
        let e = node_lease(&bad, &a, V4).unwrap_err();
        assert!(e.contains(&a.public_ip) && e.contains("banana"), "{e}");
        let mut bad = flannel_node("n3", "10.5.8.0/24", "192.168.1.3");
        bad.metadata
            .annotations
            .insert(a.backend_data.clone(), "{VNI:".into());
        assert!(node_lease(&bad, &a, V4)
            .unwrap_err()
            .contains(&a.backend_data));
    }

    fn attrs(kind: &str, data: Option<&str>, ip: &str) -> LeaseAttrs {
        LeaseAttrs {
            public_ip: Some(ip.parse().unwrap()),
            public_ipv6: None,
            backend_type: kind.into(),
            backend_data: data.map(|d| RawValue::from_string(d.into()).unwrap()),
            backend_v6_data: None,
        }
    }

    #[test]
    fn the_annotation_patch_writes_what_flanneld_writes_and_only_what_changed() {
        let a = names();
        let data = format!(r#"{{"VNI":1,"VtepMAC":"{MAC}"}}"#);
        let fresh = node(
            "n1",
            &["10.5.1.0/24"],
            json!({"node.alpha.kubernetes.io/ttl": "0"}),
        );
        let patch = annotation_patch(&fresh, &attrs("vxlan", Some(&data), "192.168.1.1"), &a);
        assert_eq!(
            patch.unwrap().to_string(),
            format!(
                r#"{{"metadata":{{"annotations":{{"flannel.alpha.coreos.com/backend-data":"{{\"VNI\":1,\"VtepMAC\":\"{MAC}\"}}","flannel.alpha.coreos.com/backend-type":"vxlan","flannel.alpha.coreos.com/kube-subnet-manager":"true","flannel.alpha.coreos.com/public-ip":"192.168.1.1"}}}}}}"#
            )
        );
        // Already so: nothing to write.
        let done = flannel_node("n1", "10.5.1.0/24", "192.168.1.1");
        assert_eq!(
            annotation_patch(&done, &attrs("vxlan", Some(&data), "192.168.1.1"), &a),
            None
        );
        // A new address: only that annotation.
        let p = annotation_patch(&done, &attrs("vxlan", Some(&data), "192.168.1.9"), &a).unwrap();
        assert_eq!(
            p,
            json!({"metadata": {"annotations": {"flannel.alpha.coreos.com/public-ip": "192.168.1.9"}}})
        );
        // host-gw writes its data as "null".
        let p = annotation_patch(&fresh, &attrs("host-gw", None, "192.168.1.1"), &a).unwrap();
        assert_eq!(p["metadata"]["annotations"][&a.backend_data], "null");
        assert_eq!(p["metadata"]["annotations"][&a.backend_type], "host-gw");
    }

    #[test]
    fn a_users_overwrite_wins_over_the_public_address() {
        let a = names();
        let data = format!(r#"{{"VNI":1,"VtepMAC":"{MAC}"}}"#);
        let mut n = flannel_node("n1", "10.5.1.0/24", "192.168.1.1");
        n.metadata
            .annotations
            .insert(a.public_ip_overwrite.clone(), "203.0.113.7".into());
        let p = annotation_patch(&n, &attrs("vxlan", Some(&data), "192.168.1.1"), &a).unwrap();
        assert_eq!(p["metadata"]["annotations"][&a.public_ip], "203.0.113.7");
        // Once written, flanneld's check still differs (it compares with its own address) but
        // the patch is empty: nothing is sent.
        n.metadata
            .annotations
            .insert(a.public_ip.clone(), "203.0.113.7".into());
        assert_eq!(
            annotation_patch(&n, &attrs("vxlan", Some(&data), "192.168.1.1"), &a),
            None
        );
        n.metadata
            .annotations
            .insert(a.node_public_ip.clone(), "192.168.1.50".into());
        assert_eq!(
            node_public_ips(&n, &a).unwrap(),
            (Some("192.168.1.50".parse().unwrap()), None)
        );
        n.metadata
            .annotations
            .insert(a.node_public_ipv6.clone(), "nope".into());
        assert!(node_public_ips(&n, &a).is_err());
    }

    #[test]
    fn dual_stack_vxlan_writes_the_v6_annotations_too() {
        let a = names();
        let mut at = attrs(
            "vxlan",
            Some(r#"{"VNI":1,"VtepMAC":"aa:aa:aa:aa:aa:aa"}"#),
            "192.168.1.1",
        );
        at.public_ipv6 = Some("fd00::1".parse().unwrap());
        at.backend_v6_data = Some(
            RawValue::from_string(r#"{"VNI":1,"VtepMAC":"bb:bb:bb:bb:bb:bb"}"#.into()).unwrap(),
        );
        let n = node("n1", &["10.5.1.0/24", "fd00:0:0:1::/64"], json!({}));
        let p = annotation_patch(&n, &at, &a).unwrap();
        let ann = &p["metadata"]["annotations"];
        assert_eq!(ann[&a.public_ipv6], "fd00::1");
        assert_eq!(
            ann[&a.backend_v6_data],
            r#"{"VNI":1,"VtepMAC":"bb:bb:bb:bb:bb:bb"}"#
        );
        let both = Families {
            ipv4: true,
            ipv6: true,
        };
        let mut written = n.clone();
        for (k, v) in ann.as_object().unwrap() {
            written
                .metadata
                .annotations
                .insert(k.clone(), v.as_str().unwrap().into());
        }
        assert_eq!(annotation_patch(&written, &at, &a), None);
        let l = node_lease(&written, &a, both).unwrap().unwrap();
        assert_eq!(l.key.to_string(), "10.5.1.0-24&fd00:0:0:1::-64");
        assert_eq!(l.attrs, at);
        // What the daemon keeps of its own node: the backend data, even before it is managed.
        assert_eq!(own_attrs(&written, &a).unwrap(), at);
        assert!(own_attrs(&node("x", &[], json!({})), &a).is_none());
    }

    #[test]
    fn the_condition_patch_is_flanneld_s() {
        let t = k8s_openapi::chrono::DateTime::parse_from_rfc3339("2026-11-25T17:56:17Z")
            .unwrap()
            .with_timezone(&k8s_openapi::chrono::Utc);
        assert_eq!(
            network_available_patch(t).to_string(),
            r#"{"status":{"conditions":[{"lastHeartbeatTime":"2026-11-25T17:56:17Z","lastTransitionTime":"2026-11-25T17:56:17Z","message":"Flannel is running on this node","reason":"FlannelIsUp","status":"False","type":"NetworkUnavailable"}]}}"#
        );
    }

    fn event(line: &str) -> WatchEvent<NodeObject> {
        serde_json::from_str(line).unwrap()
    }

    fn keys(d: &Delivery) -> Vec<String> {
        d.changes
            .iter()
            .map(|c| match c {
                Change::Put(e) => format!("+{}", e.key),
                Change::Delete(k) => format!("-{k}"),
                Change::Snapshot(_) => "snapshot".into(),
            })
            .collect()
    }

    fn ev(kind: &str, n: &str) -> WatchEvent<NodeObject> {
        event(&format!(r#"{{"type":"{kind}","object":{n}}}"#))
    }

    #[test]
    fn the_watch_turns_node_events_into_lease_changes() {
        let mut w = NodeWatch::new(names(), V4);
        let d = w.listed(
            [
                flannel_node("a", "10.5.1.0/24", "192.168.1.1"),
                node("b", &["10.5.2.0/24"], json!({})),
            ],
            "100".into(),
        );
        assert_eq!(keys(&d), ["+10.5.1.0-24"]);
        assert_eq!(w.resource_version(), "100");
        let a_json = |ip: &str, extra: &str| {
            let mut v: Value = serde_json::from_str(&node_json(
                "a",
                &["10.5.1.0/24"],
                json!({
                    "flannel.alpha.coreos.com/backend-data": format!(r#"{{"VNI":1,"VtepMAC":"{MAC}"}}"#),
                    "flannel.alpha.coreos.com/backend-type": "vxlan",
                    "flannel.alpha.coreos.com/kube-subnet-manager": "true",
                    "flannel.alpha.coreos.com/public-ip": ip,
                    "other": extra
                }),
            ))
            .unwrap();
            v["metadata"]["resourceVersion"] = "101".into();
            v.to_string()
        };
        // Neither a status update nor another annotation is a change of the lease.
        let d = w
            .event(ev("MODIFIED", &a_json("192.168.1.1", "x")))
            .unwrap();
        assert!(d.changes.is_empty());
        assert_eq!(w.resource_version(), "101");
        let d = w
            .event(ev("MODIFIED", &a_json("192.168.1.9", "x")))
            .unwrap();
        assert_eq!(keys(&d), ["+10.5.1.0-24"]);
        // b becomes a lease when it is annotated.
        let b = flannel_node("b", "10.5.2.0/24", "192.168.1.2");
        let b_json = serde_json::to_string(&json!({
            "metadata": {"name": "b", "resourceVersion": "102", "annotations": b.metadata.annotations},
            "spec": {"podCIDR": "10.5.2.0/24"}
        }))
        .unwrap();
        assert_eq!(
            keys(&w.event(ev("ADDED", &b_json)).unwrap()),
            ["+10.5.2.0-24"]
        );
        // A bookmark moves the resourceVersion only.
        let d = w
            .event(event(r#"{"type":"BOOKMARK","object":{"kind":"Node","apiVersion":"v1","metadata":{"resourceVersion":"150","creationTimestamp":null},"spec":{},"status":{}}}"#))
            .unwrap();
        assert!(d.changes.is_empty());
        assert_eq!(w.resource_version(), "150");
        // A garbled annotation: logged with the node's name, the lease gone.
        let d = w.event(ev("MODIFIED", &a_json("not-an-ip", "x"))).unwrap();
        assert_eq!(keys(&d), ["-10.5.1.0-24"]);
        assert_eq!(d.bad[0].key, "node a");
        assert!(d.bad[0].reason.contains("not-an-ip"));
        let d = w.event(ev("DELETED", &b_json)).unwrap();
        assert_eq!(keys(&d), ["-10.5.2.0-24"]);
        assert!(w.is_empty());
        let gone = w.event(event(r#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 150 (160)","reason":"Expired","code":410}}"#));
        assert_eq!(
            gone.unwrap_err(),
            WatchStop::Expired("too old resource version: 150 (160)".into())
        );
    }

    #[test]
    fn a_new_listing_yields_only_the_difference() {
        let mut w = NodeWatch::new(names(), V4);
        w.listed(
            [
                flannel_node("a", "10.5.1.0/24", "192.168.1.1"),
                flannel_node("b", "10.5.2.0/24", "192.168.1.2"),
                flannel_node("c", "10.5.3.0/24", "192.168.1.3"),
            ],
            "100".into(),
        );
        let d = w.listed(
            [
                flannel_node("a", "10.5.1.0/24", "192.168.1.1"),
                flannel_node("c", "10.5.3.0/24", "192.168.1.33"),
                flannel_node("d", "10.5.4.0/24", "192.168.1.4"),
            ],
            "200".into(),
        );
        let mut k = keys(&d);
        k.sort();
        assert_eq!(k, ["+10.5.3.0-24", "+10.5.4.0-24", "-10.5.2.0-24"]);
        assert_eq!(w.len(), 3);
        assert_eq!(w.resource_version(), "200");
    }

    #[test]
    fn refusals_name_the_verb_and_the_resource() {
        let op = Op {
            verb: "patch",
            resource: "nodes/status",
            name: Some("n1"),
        };
        let msg = r#"nodes "n1" is forbidden: User "system:serviceaccount:kube-flannel:flannel" cannot patch resource "nodes/status" in API group "" at the cluster scope"#;
        let e = classify(op, 403, msg);
        assert!(matches!(
            e,
            KubeError::Denied {
                verb: "patch",
                resource: "nodes/status",
                ..
            }
        ));
        let text = e.to_string();
        assert!(
            text.contains("patch nodes/status") && text.contains(msg),
            "{text}"
        );
        assert!(matches!(
            classify(op, 503, "down"),
            KubeError::Unavailable(_)
        ));
        assert!(matches!(classify(op, 410, "old"), KubeError::Expired(_)));
        assert!(matches!(classify(op, 422, "bad"), KubeError::Refused(_)));
    }

    #[test]
    fn the_in_cluster_configuration_is_client_go_s() {
        let dir = tempfile::tempdir().unwrap();
        assert!(in_cluster_kubeconfig(None, Some("443"), dir.path()).is_err());
        assert!(
            in_cluster_kubeconfig(Some("10.96.0.1"), Some("443"), dir.path())
                .unwrap_err()
                .contains("token")
        );
        std::fs::write(dir.path().join("token"), "t0ken").unwrap();
        std::fs::write(dir.path().join("ca.crt"), "").unwrap();
        let kc = in_cluster_kubeconfig(Some("10.96.0.1"), Some("443"), dir.path()).unwrap();
        let cluster = kc.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://10.96.0.1:443"));
        assert_eq!(
            cluster.certificate_authority.as_deref(),
            Some(dir.path().join("ca.crt").to_str().unwrap())
        );
        let user = kc.auth_infos[0].auth_info.as_ref().unwrap();
        assert_eq!(
            user.token_file.as_deref(),
            Some(dir.path().join("token").to_str().unwrap())
        );
        let kc = in_cluster_kubeconfig(Some("fd00::1"), Some("6443"), dir.path()).unwrap();
        assert_eq!(
            kc.clusters[0].cluster.as_ref().unwrap().server.as_deref(),
            Some("https://[fd00::1]:6443")
        );
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
