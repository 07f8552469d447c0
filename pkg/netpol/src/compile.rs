//! The policy compiler, pure: the cluster's objects and this node's name in; out, for each pod
//! of this node, whether each direction of its traffic is isolated and, if so, what it allows,
//! as the disjoint elements of an allow set per family (addresses x protocols x ports); and what
//! in the policies the API server would have refused, each said once with the policy's name.
//!
//! The semantics of networking.k8s.io/v1: a pod is isolated for a direction when a policy of
//! its namespace selects it and has that policy type (`policyTypes`, else Ingress, and Egress
//! when the policy has egress rules); an isolated pod's traffic in that direction is what the
//! union of those policies' rules allows; a rule allows its peers (every address when it names
//! none) on its ports (every protocol and port when it names none). A peer is the pods its
//! podSelector selects in the namespaces its namespaceSelector selects (the policy's own
//! namespace without one), or an ipBlock's CIDR minus its `except`, which holds for pods'
//! addresses too. A port is a number, a range up to `endPort`, or a name resolved per pod: on
//! the isolated pod for ingress, on each destination pod for egress; a name that resolves to
//! nothing allows nothing. Replies of allowed connections are not this module's concern (the
//! kernel's conntrack lets them back).

use crate::model::{NetworkPolicy, Peer, Pod, PolicyPort, PortRef, Rule};
use crate::objects::{key, Key, Objects};
use crate::ranges::{
    addr_value, disjoint, parse_cidr, AllowBox, Bounds, Elem, Family, Ranges, Service,
};
use crate::selector::Selector;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::net::IpAddr;

/// The label every namespace carries, its name as value (set here when an older API server
/// did not).
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Direction {
    Ingress,
    Egress,
}

impl Direction {
    pub const BOTH: [Direction; 2] = [Direction::Ingress, Direction::Egress];

    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Ingress => "ingress",
            Direction::Egress => "egress",
        }
    }
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What in a policy the API server would have refused: the policy and the reason. The rest
/// of the policy is enforced; what the reason names selects or allows nothing.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Problem {
    /// `namespace/name`.
    pub policy: String,
    pub what: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NetworkPolicy {}: {}", self.policy, self.what)
    }
}

/// One direction of an isolated pod's traffic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Isolation {
    /// The policies that isolate it (`namespace/name`), in order.
    pub policies: Vec<String>,
    /// What is allowed, per family of the pod's addresses: the peer's address (source for
    /// ingress, destination for egress), protocol and destination port.
    pub allowed: BTreeMap<Family, Vec<Elem>>,
}

/// A pod of this node that policies apply to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalPod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub ips: Vec<IpAddr>,
    pub ingress: Option<Isolation>,
    pub egress: Option<Isolation>,
}

impl LocalPod {
    pub fn isolation(&self, d: Direction) -> Option<&Isolation> {
        match d {
            Direction::Ingress => self.ingress.as_ref(),
            Direction::Egress => self.egress.as_ref(),
        }
    }

    pub fn families(&self) -> Vec<Family> {
        let mut f: Vec<Family> = self.ips.iter().map(Family::of).collect();
        f.sort();
        f.dedup();
        f
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Compiled {
    /// This node's policy pods, by namespace and name.
    pub pods: Vec<LocalPod>,
    pub problems: Vec<Problem>,
    /// Policies known, in every namespace.
    pub policies: usize,
}

const TCP: u8 = 6;
const UDP: u8 = 17;
const SCTP: u8 = 132;

fn protocol_number(p: &str) -> Option<u8> {
    match p.to_ascii_uppercase().as_str() {
        "TCP" => Some(TCP),
        "UDP" => Some(UDP),
        "SCTP" => Some(SCTP),
        _ => None,
    }
}

/// A rule's port as understood.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PortSpec {
    Numbers(Service),
    Named { proto: u8, name: String },
}

/// A rule's peer as understood.
#[derive(Debug, Clone)]
enum PeerSpec {
    Pods {
        /// None: the policy's own namespace.
        namespaces: Option<Selector>,
        pods: Selector,
    },
    Block(BTreeMap<Family, Ranges>),
}

#[derive(Debug, Clone)]
struct RuleSpec {
    /// None: every address.
    peers: Option<Vec<PeerSpec>>,
    /// None: every protocol and port.
    ports: Option<Vec<PortSpec>>,
}

#[derive(Debug, Clone)]
struct PolicySpec {
    key: String,
    namespace: String,
    /// None when the podSelector is one the API server refuses: it selects nothing.
    selector: Option<Selector>,
    rules: [Option<Vec<RuleSpec>>; 2],
}

fn dir_index(d: Direction) -> usize {
    match d {
        Direction::Ingress => 0,
        Direction::Egress => 1,
    }
}

fn parse_port(p: &PolicyPort, problems: &mut Vec<String>, at: &str) -> Option<PortSpec> {
    let proto_text = p.protocol.as_deref().unwrap_or("TCP");
    let Some(proto) = protocol_number(proto_text) else {
        problems.push(format!(
            "{at}: protocol {proto_text:?} is none of TCP, UDP, SCTP"
        ));
        return None;
    };
    let number = |n: i64| u16::try_from(n).ok().filter(|n| *n > 0);
    match (&p.port, p.end_port) {
        (None, None) => Some(PortSpec::Numbers(Service::ports(proto, 0, 65535))),
        (None, Some(_)) => {
            problems.push(format!("{at}: endPort without a port"));
            None
        }
        (Some(PortRef::Number(n)), end) => {
            let Some(lo) = number(*n) else {
                problems.push(format!("{at}: port {n} is not a port number (1-65535)"));
                return None;
            };
            let hi = match end {
                None => lo,
                Some(e) => match number(e).filter(|e| *e >= lo) {
                    Some(e) => e,
                    None => {
                        problems.push(format!(
                            "{at}: endPort {e} is not a port number from port {lo} to 65535"
                        ));
                        return None;
                    }
                },
            };
            Some(PortSpec::Numbers(Service::ports(proto, lo, hi)))
        }
        (Some(PortRef::Name(name)), None) => Some(PortSpec::Named {
            proto,
            name: name.clone(),
        }),
        (Some(PortRef::Name(name)), Some(_)) => {
            problems.push(format!("{at}: endPort with the named port {name:?}"));
            None
        }
        (Some(PortRef::Other(v)), _) => {
            problems.push(format!("{at}: port {v} is neither a number nor a name"));
            None
        }
    }
}

fn parse_peer(peer: &Peer, problems: &mut Vec<String>, at: &str) -> Option<PeerSpec> {
    match (&peer.ip_block, &peer.pod_selector, &peer.namespace_selector) {
        (Some(_), Some(_), _) | (Some(_), _, Some(_)) => {
            problems.push(format!(
                "{at}: ipBlock together with a podSelector or namespaceSelector"
            ));
            None
        }
        (Some(block), None, None) => {
            let (family, lo, hi) = match parse_cidr(&block.cidr) {
                Ok(c) => c,
                Err(e) => {
                    problems.push(format!("{at}: ipBlock.cidr {e}"));
                    return None;
                }
            };
            let mut ranges = Ranges::new();
            ranges.insert(lo, hi);
            for ex in &block.except {
                match parse_cidr(ex) {
                    Ok((f, elo, ehi)) if f == family => ranges.remove(elo, ehi),
                    Ok(_) => problems.push(format!(
                        "{at}: ipBlock.except {ex:?} is not of the family of {:?}",
                        block.cidr
                    )),
                    Err(e) => problems.push(format!("{at}: ipBlock.except {e}")),
                }
            }
            Some(PeerSpec::Block(BTreeMap::from([(family, ranges)])))
        }
        (None, None, None) => {
            problems.push(format!(
                "{at}: names none of podSelector, namespaceSelector, ipBlock"
            ));
            None
        }
        (None, pods, namespaces) => {
            let parse =
                |s: &crate::model::LabelSelector, which: &str, problems: &mut Vec<String>| {
                    Selector::parse(s)
                        .map_err(|e| problems.push(format!("{at}: {which} {e}")))
                        .ok()
                };
            let pods = match pods {
                Some(s) => parse(s, "podSelector", problems)?,
                None => Selector::everything(),
            };
            let namespaces = match namespaces {
                Some(s) => Some(parse(s, "namespaceSelector", problems)?),
                None => None,
            };
            Some(PeerSpec::Pods { namespaces, pods })
        }
    }
}

fn parse_rule(rule: &Rule, problems: &mut Vec<String>, at: &str) -> RuleSpec {
    let peers = (!rule.peers.is_empty()).then(|| {
        rule.peers
            .iter()
            .enumerate()
            .filter_map(|(i, p)| parse_peer(p, problems, &format!("{at} peer {i}")))
            .collect()
    });
    let ports = (!rule.ports.is_empty()).then(|| {
        rule.ports
            .iter()
            .enumerate()
            .filter_map(|(i, p)| parse_port(p, problems, &format!("{at} port {i}")))
            .collect()
    });
    RuleSpec { peers, ports }
}

fn parse_policy(p: &NetworkPolicy, problems: &mut Vec<Problem>) -> PolicySpec {
    let key = format!("{}/{}", p.metadata.namespace, p.metadata.name);
    let mut said = Vec::new();
    let selector = Selector::parse(&p.spec.pod_selector)
        .map_err(|e| said.push(format!("podSelector {e}: the policy selects no pod")))
        .ok();
    let (mut ingress, mut egress) = (false, false);
    if p.spec.policy_types.is_empty() {
        ingress = true;
        egress = !p.spec.egress.is_empty();
    }
    for t in &p.spec.policy_types {
        match t.as_str() {
            "Ingress" => ingress = true,
            "Egress" => egress = true,
            other => said.push(format!("policyTypes: unknown type {other:?}")),
        }
    }
    let mut rules = |on: bool, list: &[Rule], d: Direction| {
        on.then(|| {
            list.iter()
                .enumerate()
                .map(|(i, r)| parse_rule(r, &mut said, &format!("{d} rule {i}")))
                .collect()
        })
    };
    let rules = [
        rules(ingress, &p.spec.ingress, Direction::Ingress),
        rules(egress, &p.spec.egress, Direction::Egress),
    ];
    problems.extend(said.into_iter().map(|what| Problem {
        policy: key.clone(),
        what,
    }));
    PolicySpec {
        key,
        namespace: p.metadata.namespace.clone(),
        selector,
        rules,
    }
}

/// A policy pod and its addresses, parsed once a pass.
type PeerPod<'a> = (&'a Pod, Vec<IpAddr>);

/// The cluster as the rules read it: namespaces' labels, policy pods by namespace.
struct View<'a> {
    namespace_labels: BTreeMap<&'a str, crate::model::Labels>,
    pods_by_namespace: BTreeMap<&'a str, Vec<PeerPod<'a>>>,
}

/// A namespace's labels as selectors see them: with its name's label, also when the
/// namespace is not (yet) known.
fn labels_of_namespace(objects: &Objects, name: &str) -> crate::model::Labels {
    let mut labels = objects
        .namespaces
        .get(name)
        .map(|ns| ns.metadata.labels.clone())
        .unwrap_or_default();
    labels
        .entry(NAMESPACE_NAME_LABEL.to_string())
        .or_insert_with(|| name.to_string());
    labels
}

impl<'a> View<'a> {
    fn new(objects: &'a Objects) -> View<'a> {
        let mut namespace_labels: BTreeMap<&str, crate::model::Labels> = BTreeMap::new();
        for name in objects.namespaces.keys() {
            namespace_labels.insert(name, labels_of_namespace(objects, name));
        }
        let mut pods_by_namespace: BTreeMap<&str, Vec<PeerPod>> = BTreeMap::new();
        for ((ns, _), pod) in &objects.pods {
            let ips = pod.policy_ips();
            if ips.is_empty() {
                continue;
            }
            namespace_labels.entry(ns).or_insert_with(|| {
                crate::model::Labels::from([(NAMESPACE_NAME_LABEL.to_string(), ns.clone())])
            });
            pods_by_namespace.entry(ns).or_default().push((pod, ips));
        }
        View {
            namespace_labels,
            pods_by_namespace,
        }
    }

    /// Every policy pod, by namespace and name.
    fn all_pods(&self) -> impl Iterator<Item = &PeerPod<'a>> {
        self.pods_by_namespace.values().flatten()
    }

    /// The pods a peer selects, for a policy in `namespace`.
    fn select(
        &self,
        namespace: &str,
        namespaces: &Option<Selector>,
        pods: &Selector,
    ) -> Vec<&PeerPod<'a>> {
        let in_ns = |ns: &str| {
            self.pods_by_namespace
                .get(ns)
                .into_iter()
                .flatten()
                .filter(|(p, _)| pods.matches(&p.metadata.labels))
        };
        match namespaces {
            None => in_ns(namespace).collect(),
            Some(sel) => self
                .namespace_labels
                .iter()
                .filter(|(_, labels)| sel.matches(labels))
                .flat_map(|(ns, _)| in_ns(ns))
                .collect(),
        }
    }
}

/// A rule's peers resolved: their addresses per family, and the pods among them (the pods
/// selectors chose, and for address peers every pod inside them), for named egress ports.
struct Resolved {
    addrs: BTreeMap<Family, Ranges>,
    /// Whether `pods` was wanted: then every pod's change may change it.
    want_pods: bool,
    pods: Vec<Key>,
}

fn everything() -> BTreeMap<Family, Ranges> {
    Family::BOTH
        .into_iter()
        .map(|f| {
            let mut r = Ranges::new();
            r.insert(0, f.max());
            (f, r)
        })
        .collect()
}

fn add_ips(addrs: &mut BTreeMap<Family, Bounds>, ips: &[IpAddr]) {
    for ip in ips {
        let v = addr_value(ip);
        addrs.entry(Family::of(ip)).or_default().push((v, v));
    }
}

fn to_ranges(raw: BTreeMap<Family, Bounds>) -> BTreeMap<Family, Ranges> {
    raw.into_iter()
        .map(|(f, r)| (f, Ranges::from_unsorted(r)))
        .collect()
}

fn resolve(view: &View, namespace: &str, rule: &RuleSpec, want_pods: bool) -> Resolved {
    let mut raw: BTreeMap<Family, Bounds> = BTreeMap::new();
    let mut pods: Vec<&Pod> = Vec::new();
    match &rule.peers {
        None => {
            for (f, r) in everything() {
                raw.insert(f, r.iter().collect());
            }
        }
        Some(peers) => {
            for peer in peers {
                match peer {
                    PeerSpec::Pods {
                        namespaces,
                        pods: sel,
                    } => {
                        for (p, ips) in view.select(namespace, namespaces, sel) {
                            add_ips(&mut raw, ips);
                            if want_pods {
                                pods.push(*p);
                            }
                        }
                    }
                    PeerSpec::Block(b) => {
                        for (f, r) in b {
                            raw.entry(*f).or_default().extend(r.iter());
                        }
                    }
                }
            }
        }
    }
    let addrs = to_ranges(raw);
    if want_pods {
        // Address peers: the pods inside them too.
        let blocks = |ips: &[IpAddr]| {
            ips.iter().any(|ip| {
                addrs
                    .get(&Family::of(ip))
                    .is_some_and(|r| r.contains(addr_value(ip)))
            })
        };
        pods.extend(
            view.all_pods()
                .filter(|(_, ips)| blocks(ips))
                .map(|(p, _)| *p),
        );
        pods.sort_by(|a, b| {
            (&a.metadata.namespace, &a.metadata.name)
                .cmp(&(&b.metadata.namespace, &b.metadata.name))
        });
        pods.dedup_by(|a, b| std::ptr::eq(*a, *b));
    }
    let pods = pods
        .into_iter()
        .map(|p| (p.metadata.namespace.clone(), p.metadata.name.clone()))
        .collect();
    Resolved {
        addrs,
        want_pods,
        pods,
    }
}

fn named_services(pod: &Pod, proto: u8, name: &str) -> Vec<Service> {
    let proto_name = match proto {
        TCP => "TCP",
        UDP => "UDP",
        _ => "SCTP",
    };
    pod.named_ports(name, proto_name)
        .filter_map(|n| u16::try_from(n).ok().filter(|n| *n > 0))
        .map(|n| Service::ports(proto, n, n))
        .collect()
}

/// The boxes one rule allows for `pod` in direction `d`, each with its family.
fn rule_boxes(
    rule: &RuleSpec,
    resolved: &Resolved,
    objects: &Objects,
    pod: &Pod,
    d: Direction,
) -> Vec<(Family, AllowBox)> {
    let boxes_over = |addrs: &BTreeMap<Family, Ranges>, services: Vec<Service>| {
        addrs
            .iter()
            .map(|(f, r)| {
                (
                    *f,
                    AllowBox {
                        addrs: r.clone(),
                        services: services.clone(),
                    },
                )
            })
            .collect::<Vec<_>>()
    };
    let Some(ports) = &rule.ports else {
        return boxes_over(&resolved.addrs, vec![Service::ANY]);
    };
    let mut services = Vec::new();
    let mut out = Vec::new();
    for p in ports {
        match (p, d) {
            (PortSpec::Numbers(s), _) => services.push(*s),
            (PortSpec::Named { proto, name }, Direction::Ingress) => {
                services.extend(named_services(pod, *proto, name))
            }
            (PortSpec::Named { proto, name }, Direction::Egress) => {
                for q in resolved.pods.iter().filter_map(|k| objects.pods.get(k)) {
                    let s = named_services(q, *proto, name);
                    if s.is_empty() {
                        continue;
                    }
                    let mut raw = BTreeMap::new();
                    add_ips(&mut raw, &q.ips());
                    out.extend(boxes_over(&to_ranges(raw), s));
                }
            }
        }
    }
    if !services.is_empty() {
        out.extend(boxes_over(&resolved.addrs, services));
    }
    out
}

/// Compiles what the cluster's policies say for the pods of `node`.
pub fn compile(objects: &Objects, node: &str) -> Compiled {
    Compiler::default().compile(objects, node)
}

/// A rule's peers, resolved once for every pod its policy selects: (policy, direction, rule).
type RuleKey = (Key, usize, usize);

/// Compilations one after another, each keeping what the next can reuse: the policies parsed,
/// their rules' peers resolved and the node's pods compiled. A change drops what it can touch
/// (told before the objects take it in), so that after one event only that is compiled again;
/// a namespace's change or a new listing drops everything.
#[derive(Default)]
pub struct Compiler {
    specs: BTreeMap<Key, (PolicySpec, Vec<Problem>)>,
    resolved: HashMap<RuleKey, Resolved>,
    pods: BTreeMap<Key, LocalPod>,
    /// Local pods to compile again, and namespaces whose local pods all are.
    dirty: BTreeSet<Key>,
    dirty_namespaces: BTreeSet<String>,
}

impl Compiler {
    /// Everything is compiled again next time.
    pub fn forget(&mut self) {
        *self = Compiler::default();
    }

    /// The policy `key` was made, changed or deleted.
    pub fn policy_changed(&mut self, key: &Key) {
        self.specs.remove(key);
        self.resolved.retain(|(k, _, _), _| k != key);
        self.dirty_namespaces.insert(key.0.clone());
    }

    /// A pod changed from `old` to `new` (None: absent); `objects` as they were before.
    pub fn pod_changed(
        &mut self,
        objects: &Objects,
        node: &str,
        old: Option<&Pod>,
        new: Option<&Pod>,
    ) {
        let versions: Vec<&Pod> = [old, new].into_iter().flatten().collect();
        for p in &versions {
            if p.spec.node_name == node {
                self.dirty.insert(key(&p.metadata));
            }
        }
        let peers: Vec<(&Pod, crate::model::Labels)> = versions
            .iter()
            .filter(|p| p.is_policy_pod())
            .map(|p| (*p, labels_of_namespace(objects, &p.metadata.namespace)))
            .collect();
        let specs = &self.specs;
        let mut touched = BTreeSet::new();
        self.resolved.retain(|(k, di, ri), r| {
            let rule = specs
                .get(k)
                .and_then(|(s, _)| s.rules[*di].as_ref())
                .and_then(|rules| rules.get(*ri));
            let selects = |p: &Pod, ns_labels: &crate::model::Labels| {
                rule.and_then(|r| r.peers.as_ref()).is_some_and(|peers| {
                    peers.iter().any(|peer| match peer {
                        PeerSpec::Pods { namespaces, pods } => {
                            pods.matches(&p.metadata.labels)
                                && match namespaces {
                                    None => p.metadata.namespace == k.0,
                                    Some(sel) => sel.matches(ns_labels),
                                }
                        }
                        PeerSpec::Block(_) => false,
                    })
                })
            };
            // Pods wanted (named egress ports): every pod's change may change it.
            let any_pod = r.want_pods && !versions.is_empty();
            let keep = rule.is_some() && !any_pod && !peers.iter().any(|(p, l)| selects(p, l));
            if !keep {
                touched.insert(k.0.clone());
            }
            keep
        });
        self.dirty_namespaces.extend(touched);
    }

    /// Compiles what the cluster's policies say for the pods of `node`, again only where a
    /// change told since the last time may have changed it.
    pub fn compile(&mut self, objects: &Objects, node: &str) -> Compiled {
        let view = View::new(objects);
        self.specs.retain(|k, _| objects.policies.contains_key(k));
        for (k, p) in &objects.policies {
            if !self.specs.contains_key(k) {
                let mut problems = Vec::new();
                let spec = parse_policy(p, &mut problems);
                self.specs.insert(k.clone(), (spec, problems));
            }
        }
        let mut by_namespace: HashMap<&str, Vec<&Key>> = HashMap::new();
        for (k, (s, _)) in &self.specs {
            by_namespace
                .entry(s.namespace.as_str())
                .or_default()
                .push(k);
        }
        let mut compiled = BTreeMap::new();
        for (pk, pod) in &objects.pods {
            if pod.spec.node_name != node || !pod.is_policy_pod() {
                continue;
            }
            let clean = !self.dirty.contains(pk) && !self.dirty_namespaces.contains(&pk.0);
            if let Some(c) = self.pods.remove(pk).filter(|_| clean) {
                compiled.insert(pk.clone(), c);
                continue;
            }
            let selecting: Vec<&Key> = by_namespace
                .get(pod.metadata.namespace.as_str())
                .into_iter()
                .flatten()
                .copied()
                .filter(|k| {
                    self.specs[*k]
                        .0
                        .selector
                        .as_ref()
                        .is_some_and(|s| s.matches(&pod.metadata.labels))
                })
                .collect();
            let families: Vec<Family> = {
                let mut f: Vec<Family> = pod.ips().iter().map(Family::of).collect();
                f.sort();
                f.dedup();
                f
            };
            let resolved = &mut self.resolved;
            let specs = &self.specs;
            let mut isolation = |d: Direction| -> Option<Isolation> {
                let di = dir_index(d);
                let mut policies = Vec::new();
                let mut boxes = Vec::new();
                for &k in &selecting {
                    let spec = &specs[k].0;
                    let Some(rules) = &spec.rules[di] else {
                        continue;
                    };
                    policies.push(spec.key.clone());
                    for (ri, rule) in rules.iter().enumerate() {
                        let r = resolved.entry((k.clone(), di, ri)).or_insert_with(|| {
                            let named = rule.ports.as_ref().is_some_and(|ps| {
                                ps.iter().any(|p| matches!(p, PortSpec::Named { .. }))
                            });
                            resolve(
                                &view,
                                &spec.namespace,
                                rule,
                                named && d == Direction::Egress,
                            )
                        });
                        boxes.extend(rule_boxes(rule, r, objects, pod, d));
                    }
                }
                if policies.is_empty() {
                    return None;
                }
                let allowed = families
                    .iter()
                    .map(|&f| {
                        let mine: Vec<AllowBox> = boxes
                            .iter()
                            .filter(|(bf, _)| *bf == f)
                            .map(|(_, b)| b.clone())
                            .collect();
                        (f, disjoint(&mine))
                    })
                    .collect();
                Some(Isolation { policies, allowed })
            };
            let ingress = isolation(Direction::Ingress);
            let egress = isolation(Direction::Egress);
            compiled.insert(
                pk.clone(),
                LocalPod {
                    namespace: pod.metadata.namespace.clone(),
                    name: pod.metadata.name.clone(),
                    uid: pod.metadata.uid.clone(),
                    ips: pod.ips(),
                    ingress,
                    egress,
                },
            );
        }
        self.pods = compiled;
        self.dirty.clear();
        self.dirty_namespaces.clear();
        let mut problems: Vec<Problem> = self
            .specs
            .values()
            .flat_map(|(_, p)| p.iter().cloned())
            .collect();
        problems.sort();
        problems.dedup();
        Compiled {
            pods: self.pods.values().cloned().collect(),
            problems,
            policies: objects.policies.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Namespace;
    use serde_json::{json, Value};

    const NODE: &str = "n1";

    /// Namespaces x, y, z with pods a, b, c each (label `pod`), serving TCP and UDP on 80
    /// and 81 under the e2e suite's port names; x/c runs on another node. Addresses
    /// 10.0.<ns>.<pod> and fd00::<ns>:<pod>.
    fn cluster() -> Objects {
        let mut o = Objects::default();
        for (ni, ns) in ["x", "y", "z"].into_iter().enumerate() {
            let n: Namespace = serde_json::from_value(json!({"metadata": {"name": ns,
                "labels": {NAMESPACE_NAME_LABEL: ns}}}))
            .unwrap();
            o.namespaces.insert(ns.into(), n);
            for (pi, name) in ["a", "b", "c"].into_iter().enumerate() {
                let ports: Vec<Value> = [(80, "tcp"), (81, "tcp"), (80, "udp"), (81, "udp")]
                    .iter()
                    .map(|(p, proto)| {
                        json!({"name": format!("serve-{p}-{proto}"), "containerPort": p,
                               "protocol": proto.to_uppercase()})
                    })
                    .collect();
                let node = if (ns, name) == ("x", "c") { "n2" } else { NODE };
                let pod: Pod = serde_json::from_value(json!({
                    "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{ns}-{name}"),
                                 "labels": {"pod": name}},
                    "spec": {"nodeName": node, "containers": [{"name": "c", "ports": ports}]},
                    "status": {"phase": "Running", "podIPs": [
                        {"ip": format!("10.0.{}.{}", ni + 1, pi + 1)},
                        {"ip": format!("fd00::{}:{}", ni + 1, pi + 1)}]}
                }))
                .unwrap();
                o.pods.insert((ns.into(), name.into()), pod);
            }
        }
        o
    }

    fn add_policy(o: &mut Objects, ns: &str, name: &str, spec: Value) {
        let p: NetworkPolicy = serde_json::from_value(
            json!({"metadata": {"name": name, "namespace": ns}, "spec": spec}),
        )
        .unwrap();
        o.policies.insert((ns.into(), name.into()), p);
    }

    fn ip(o: &Objects, pod: &str, f: Family) -> IpAddr {
        let (ns, name) = pod.split_once('/').unwrap();
        *o.pods[&(ns.to_string(), name.to_string())]
            .ips()
            .iter()
            .find(|i| Family::of(i) == f)
            .unwrap()
    }

    fn admits(iso: Option<&Isolation>, peer: IpAddr, proto: u8, port: u16) -> bool {
        let Some(iso) = iso else { return true };
        let v = addr_value(&peer);
        iso.allowed.get(&Family::of(&peer)).is_some_and(|els| {
            els.iter().any(|e| {
                e.addr.0 <= v
                    && v <= e.addr.1
                    && e.proto.0 <= proto
                    && proto <= e.proto.1
                    && e.port.0 <= port
                    && port <= e.port.1
            })
        })
    }

    /// Whether `from` reaches `to` on `proto`/`port` over family `f`: the source's egress and
    /// the destination's ingress both allow it, each compiled on its own node.
    fn reaches(o: &Objects, from: &str, to: &str, proto: u8, port: u16, f: Family) -> bool {
        let local = |pod: &str| {
            let (ns, name) = pod.split_once('/').unwrap();
            let node = &o.pods[&(ns.to_string(), name.to_string())].spec.node_name;
            compile(o, node)
                .pods
                .into_iter()
                .find(|p| p.namespace == ns && p.name == name)
                .unwrap()
        };
        let (src, dst) = (local(from), local(to));
        admits(src.egress.as_ref(), ip(o, to, f), proto, port)
            && admits(dst.ingress.as_ref(), ip(o, from, f), proto, port)
    }

    const PODS: [&str; 9] = [
        "x/a", "x/b", "x/c", "y/a", "y/b", "y/c", "z/a", "z/b", "z/c",
    ];

    /// Every pair (loopback left out, as the e2e suite leaves it) that does not reach as
    /// `expect` says, on both families.
    fn wrong(
        o: &Objects,
        proto: u8,
        port: u16,
        expect: impl Fn(&str, &str) -> bool,
    ) -> Vec<String> {
        let mut out = Vec::new();
        for f in Family::BOTH {
            for from in PODS {
                for to in PODS.iter().filter(|t| **t != from) {
                    let got = reaches(o, from, to, proto, port, f);
                    if got != expect(from, to) {
                        out.push(format!("{from} -> {to} {f}: {got}"));
                    }
                }
            }
        }
        out
    }

    fn ns(pod: &str) -> &str {
        pod.split('/').next().unwrap()
    }

    #[test]
    fn default_deny_ingress_isolates_every_pod_of_the_namespace() {
        let mut o = cluster();
        add_policy(&mut o, "x", "deny-ingress", json!({"podSelector": {}}));
        assert_eq!(
            wrong(&o, TCP, 80, |_, to| ns(to) != "x"),
            Vec::<String>::new()
        );
        let c = compile(&o, NODE);
        let xa = c
            .pods
            .iter()
            .find(|p| p.name == "a" && p.namespace == "x")
            .unwrap();
        assert_eq!(xa.ingress.as_ref().unwrap().policies, ["x/deny-ingress"]);
        assert!(xa.egress.is_none(), "policyTypes defaults to Ingress alone");
        assert!(xa
            .ingress
            .as_ref()
            .unwrap()
            .allowed
            .values()
            .all(|e| e.is_empty()));
    }

    #[test]
    fn deny_all_isolates_both_ways() {
        let mut o = cluster();
        add_policy(
            &mut o,
            "x",
            "deny-all",
            json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
        );
        assert_eq!(
            wrong(&o, TCP, 80, |from, to| ns(from) != "x" && ns(to) != "x"),
            Vec::<String>::new()
        );
    }

    #[test]
    fn pod_and_namespace_selectors_alone_together_and_as_two_peers() {
        // From pod b of the policy's namespace.
        let mut o = cluster();
        add_policy(
            &mut o,
            "x",
            "p",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
        );
        assert_eq!(
            wrong(&o, TCP, 80, |from, to| to != "x/a" || from == "x/b"),
            Vec::<String>::new()
        );
        // From every pod of namespace y.
        let mut o = cluster();
        add_policy(
            &mut o,
            "x",
            "p",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: "y"}}}]}]}),
        );
        assert_eq!(
            wrong(&o, TCP, 80, |from, to| to != "x/a" || ns(from) == "y"),
            Vec::<String>::new()
        );
        // Both in one peer: pods b of namespaces other than x.
        let mut o = cluster();
        add_policy(
            &mut o,
            "x",
            "p",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{"from": [{
                "namespaceSelector": {"matchExpressions": [{"key": NAMESPACE_NAME_LABEL, "operator": "NotIn", "values": ["x"]}]},
                "podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
        );
        assert_eq!(
            wrong(&o, TCP, 80, |from, to| to != "x/a"
                || from == "y/b"
                || from == "z/b"),
            Vec::<String>::new()
        );
        // Two peers: either one.
        let mut o = cluster();
        add_policy(
            &mut o,
            "x",
            "p",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{"from": [
                {"namespaceSelector": {"matchExpressions": [{"key": NAMESPACE_NAME_LABEL, "operator": "NotIn", "values": ["x"]}]}},
                {"podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
        );
        assert_eq!(
            wrong(&o, TCP, 80, |from, to| to != "x/a"
                || ns(from) != "x"
                || from == "x/b"),
            Vec::<String>::new()
        );
        // Empty selectors: every pod of every namespace.
        let mut o = cluster();
        add_policy(&mut o, "x", "deny", json!({"podSelector": {}}));
        add_policy(
            &mut o,
            "x",
            "p",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{"from": [{"namespaceSelector": {}, "podSelector": {}}]}]}),
        );
        assert_eq!(
            wrong(&o, TCP, 80, |_, to| ns(to) != "x" || to == "x/a"),
            Vec::<String>::new()
        );
    }

    #[test]
    fn ports_by_number_range_name_and_protocol() {
        let mut o = cluster();
        add_policy(
            &mut o,
            "x",
            "p",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{"ports": [{"port": 81, "protocol": "TCP"}]}]}),
        );
        assert_eq!(wrong(&o, TCP, 81, |_, _| true), Vec::<String>::new());
        assert_eq!(
            wrong(&o, TCP, 80, |_, to| to != "x/a"),
            Vec::<String>::new()
        );
        assert_eq!(
            wrong(&o, UDP, 81, |_, to| to != "x/a"),
            Vec::<String>::new()
        );
        // endPort: 80 to 81, both.
        let mut o = cluster();
        add_policy(
            &mut o,
            "x",
            "p",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{"ports": [{"port": 80, "endPort": 81}]}]}),
        );
        assert!(
            wrong(&o, TCP, 80, |_, _| true).is_empty()
                && wrong(&o, TCP, 81, |_, _| true).is_empty()
        );
        assert_eq!(
            wrong(&o, TCP, 82, |_, to| to != "x/a"),
            Vec::<String>::new()
        );
        // A protocol with no port: every port of it.
        let mut o = cluster();
        add_policy(
            &mut o,
            "x",
            "p",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{"ports": [{"protocol": "UDP"}]}]}),
        );
        assert!(wrong(&o, UDP, 80, |_, _| true).is_empty());
        assert_eq!(
            wrong(&o, TCP, 80, |_, to| to != "x/a"),
            Vec::<String>::new()
        );
        // SCTP is not TCP.
        let mut o = cluster();
        add_policy(
            &mut o,
            "x",
            "p",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{"ports": [{"port": 81, "protocol": "SCTP"}]}]}),
        );
        assert_eq!(
            wrong(&o, TCP, 81, |_, to| to != "x/a"),
            Vec::<String>::new()
        );
        assert!(wrong(&o, SCTP, 81, |_, _| true).is_empty());
    }

    #[test]
    fn named_ports_resolve_on_the_isolated_pod_for_ingress_and_each_destination_for_egress() {
        let mut o = cluster();
        // y/a calls its port 81 serve-80-tcp; as a destination of egress, its 81 is the one.
        let ya = o.pods.get_mut(&("y".to_string(), "a".to_string())).unwrap();
        ya.spec.containers[0].ports[0].container_port = 81;
        ya.spec.containers[0].ports[1].name = "other".into();
        add_policy(
            &mut o,
            "x",
            "p",
            json!({"podSelector": {},
            "policyTypes": ["Egress"], "egress": [{"ports": [{"port": "serve-80-tcp"}]}]}),
        );
        assert_eq!(
            wrong(&o, TCP, 80, |from, to| ns(from) != "x" || to != "y/a"),
            Vec::<String>::new()
        );
        assert_eq!(
            wrong(&o, TCP, 81, |from, to| ns(from) != "x" || to == "y/a"),
            Vec::<String>::new()
        );
        // For ingress, the isolated pod's own number: y/a admits serve-80-tcp on 81.
        let mut o2 = o.clone();
        o2.policies.clear();
        add_policy(
            &mut o2,
            "y",
            "q",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{"ports": [{"port": "serve-80-tcp"}]}]}),
        );
        assert_eq!(
            wrong(&o2, TCP, 80, |_, to| to != "y/a"),
            Vec::<String>::new()
        );
        assert!(wrong(&o2, TCP, 81, |_, _| true).is_empty());
        // A name no container has allows nothing, and the policy still isolates.
        let mut o3 = cluster();
        add_policy(
            &mut o3,
            "x",
            "p",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{"ports": [{"port": "no-such-port"}]}]}),
        );
        assert_eq!(
            wrong(&o3, TCP, 80, |_, to| to != "x/a"),
            Vec::<String>::new()
        );
    }

    #[test]
    fn ip_blocks_hold_for_pod_addresses_and_except_takes_them_out() {
        let mut o = cluster();
        add_policy(
            &mut o,
            "x",
            "p",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
            "policyTypes": ["Egress"], "egress": [{"to": [
                {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.0.1.2/32"]}},
                {"ipBlock": {"cidr": "fd00::/16", "except": ["fd00::1:2/128"]}}]}]}),
        );
        assert_eq!(
            wrong(&o, TCP, 80, |from, to| from != "x/a" || to != "x/b"),
            Vec::<String>::new()
        );
        // A second policy that allows the excepted address: the union holds.
        add_policy(
            &mut o,
            "x",
            "q",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
            "policyTypes": ["Egress"], "egress": [{"to": [{"ipBlock": {"cidr": "10.0.1.2/32"}}]}]}),
        );
        assert_eq!(
            wrong(&o, TCP, 80, |from, to| from != "x/a" || to != "x/b"),
            ["x/a -> x/b IPv4: true"]
        );
    }

    #[test]
    fn egress_and_ingress_are_decided_apart_and_both_must_allow() {
        let mut o = cluster();
        add_policy(
            &mut o,
            "x",
            "egress-to-y-a",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
            "policyTypes": ["Egress"], "egress": [{"to": [{"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: "y"}},
                                "podSelector": {"matchLabels": {"pod": "a"}}}]}]}),
        );
        for target in ["a", "b"] {
            add_policy(
                &mut o,
                "y",
                &format!("from-x-a-{target}"),
                json!({
                "podSelector": {"matchLabels": {"pod": target}},
                "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: "x"}},
                                       "podSelector": {"matchLabels": {"pod": "a"}}}]}]}),
            );
        }
        assert_eq!(
            wrong(&o, TCP, 80, |from, to| {
                let from_xa = from == "x/a";
                let to_guarded = to == "y/a" || to == "y/b";
                match (from_xa, to_guarded) {
                    (true, _) => to == "y/a",
                    (false, true) => false,
                    (false, false) => true,
                }
            }),
            Vec::<String>::new()
        );
    }

    #[test]
    fn policy_types_say_which_directions_isolate() {
        let mut o = cluster();
        // Egress rules but policyTypes [Ingress]: egress is not isolated.
        add_policy(
            &mut o,
            "x",
            "p",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
            "policyTypes": ["Ingress"], "ingress": [{}], "egress": [{"ports": [{"port": 9}]}]}),
        );
        let c = compile(&o, NODE);
        let xa = c
            .pods
            .iter()
            .find(|p| p.namespace == "x" && p.name == "a")
            .unwrap();
        assert!(xa.ingress.is_some() && xa.egress.is_none());
        // No policyTypes, egress rules: both; an empty egress list: ingress only.
        let mut o = cluster();
        add_policy(&mut o, "x", "p", json!({"podSelector": {}, "egress": [{}]}));
        add_policy(&mut o, "y", "q", json!({"podSelector": {}, "egress": []}));
        let c = compile(&o, NODE);
        for p in &c.pods {
            match p.namespace.as_str() {
                "x" => assert!(p.ingress.is_some() && p.egress.is_some()),
                "y" => assert!(p.ingress.is_some() && p.egress.is_none()),
                _ => assert!(p.ingress.is_none() && p.egress.is_none()),
            }
        }
        // Only this node's pods are compiled.
        assert_eq!(c.pods.len(), 8);
        assert!(!c.pods.iter().any(|p| p.namespace == "x" && p.name == "c"));
    }

    #[test]
    fn what_the_api_server_refuses_is_said_and_allows_nothing() {
        let mut o = cluster();
        add_policy(
            &mut o,
            "x",
            "bad",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/33"}},
                                  {"podSelector": {"matchLabels": {"pod": "b"}}}],
                         "ports": [{"port": 80}, {"port": 90, "endPort": 85}, {"protocol": "ICMP"}]}]}),
        );
        let c = compile(&o, NODE);
        let said: Vec<String> = c.problems.iter().map(|p| p.to_string()).collect();
        assert_eq!(
            said,
            [
                "NetworkPolicy x/bad: ingress rule 0 peer 0: ipBlock.cidr \"10.0.0.0/33\" is not a CIDR: bad prefix length \"33\"",
                "NetworkPolicy x/bad: ingress rule 0 port 1: endPort 85 is not a port number from port 90 to 65535",
                "NetworkPolicy x/bad: ingress rule 0 port 2: protocol \"ICMP\" is none of TCP, UDP, SCTP",
            ]
        );
        // The rest of the policy holds: x/b on 80.
        assert_eq!(
            wrong(&o, TCP, 80, |from, to| to != "x/a" || from == "x/b"),
            Vec::<String>::new()
        );
        // A rule whose every port is refused allows nothing, not everything.
        let mut o = cluster();
        add_policy(
            &mut o,
            "x",
            "bad",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{"ports": [{"port": 0}]}]}),
        );
        assert_eq!(
            wrong(&o, TCP, 80, |_, to| to != "x/a"),
            Vec::<String>::new()
        );
        // A podSelector the API refuses selects nothing.
        let mut o = cluster();
        add_policy(
            &mut o,
            "x",
            "bad",
            json!({"podSelector":
            {"matchExpressions": [{"key": "pod", "operator": "In", "values": []}]}}),
        );
        assert!(wrong(&o, TCP, 80, |_, _| true).is_empty());
        assert_eq!(compile(&o, NODE).problems.len(), 1);
    }

    #[test]
    fn pods_without_addresses_finished_or_on_the_host_network_are_nobody() {
        let mut o = cluster();
        let yb = o.pods.get_mut(&("y".to_string(), "b".to_string())).unwrap();
        yb.spec.host_network = true;
        add_policy(
            &mut o,
            "x",
            "p",
            json!({"podSelector": {},
            "ingress": [{"from": [{"namespaceSelector": {}}]}]}),
        );
        let c = compile(&o, NODE);
        let xa = c
            .pods
            .iter()
            .find(|p| p.namespace == "x" && p.name == "a")
            .unwrap();
        let allowed = &xa.ingress.as_ref().unwrap().allowed[&Family::V4];
        // Every pod's address but y/b's, merged where they touch.
        let yb_ip = addr_value(&"10.0.2.2".parse().unwrap());
        assert!(allowed
            .iter()
            .all(|e| !(e.addr.0 <= yb_ip && yb_ip <= e.addr.1)));
        assert!(!c.pods.iter().any(|p| p.namespace == "y" && p.name == "b"));
    }

    #[test]
    fn compiling_again_after_each_change_is_compiling_afresh() {
        let mut o = cluster();
        add_policy(
            &mut o,
            "x",
            "from-y-b",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
                "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: "y"}},
                                       "podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
        );
        add_policy(
            &mut o,
            "y",
            "named-egress",
            json!({"podSelector": {}, "egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}],
                "ports": [{"port": "serve-80-tcp"}]}]}),
        );
        let mut c = Compiler::default();
        let mut last = c.compile(&o, NODE);
        assert_eq!(last, compile(&o, NODE));
        let key = |ns: &str, name: &str| (ns.to_string(), name.to_string());
        // Each change: the pod before and after (None: absent).
        let relabel = |o: &Objects, ns: &str, name: &str, v: &str| {
            let mut p = o.pods[&key(ns, name)].clone();
            p.metadata.labels.insert("pod".into(), v.into());
            (key(ns, name), Some(p))
        };
        let readdress = |o: &Objects, ns: &str, name: &str, ip: &str| {
            let mut p = o.pods[&key(ns, name)].clone();
            p.status.pod_ips = vec![serde_json::from_value(json!({"ip": ip})).unwrap()];
            (key(ns, name), Some(p))
        };
        let mut newcomer = o.pods[&key("y", "b")].clone();
        newcomer.metadata.name = "d".into();
        newcomer.spec.node_name = "n2".into();
        newcomer.status.pod_ips = vec![serde_json::from_value(json!({"ip": "10.0.2.9"})).unwrap()];
        let changes = [
            // A peer selected by x's policy loses its label, then gets it back.
            relabel(&o, "y", "b", "q"),
            relabel(&o, "y", "b", "b"),
            // A local pod no longer selected by x's policy.
            relabel(&o, "x", "a", "z"),
            // A peer's address (named egress ports read every pod's).
            readdress(&o, "z", "c", "10.0.3.30"),
            // A pod gone; a pod of another node selected as a peer.
            (key("z", "a"), None),
            (key("y", "d"), Some(newcomer)),
        ];
        let mut changed = 0;
        for (k, new) in changes {
            let old = o.pods.get(&k).cloned();
            c.pod_changed(&o, NODE, old.as_ref(), new.as_ref());
            match new {
                Some(p) => o.pods.insert(k.clone(), p),
                None => o.pods.remove(&k),
            };
            let got = c.compile(&o, NODE);
            assert_eq!(got, compile(&o, NODE), "after {k:?}");
            changed += usize::from(got != last);
            last = got;
        }
        assert_eq!(changed, 6, "every change changed the compilation");
        // A policy made, then deleted.
        add_policy(&mut o, "y", "deny", json!({"podSelector": {}}));
        c.policy_changed(&key("y", "deny"));
        let got = c.compile(&o, NODE);
        assert_eq!(got, compile(&o, NODE));
        assert_ne!(got, last);
        o.policies.remove(&key("y", "deny"));
        c.policy_changed(&key("y", "deny"));
        assert_eq!(c.compile(&o, NODE), last);
    }
}
