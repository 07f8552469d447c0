//! The enforcer's nftables table, pure: what it should hold for the compiled pods, what
//! `nft -j list` says it holds, and the one transaction that turns the second into the first.
//!
//! The table (`inet flannel-netpol`) holds, per family, a verdict map from each isolated pod's
//! address to its chain for each direction, and per isolated pod and direction a chain with
//! one rule per group of services its policies allow (a set of protocols and ports, `tcp 80`
//! and `udp 53`, or everything) and per group an interval set of the peer addresses allowed
//! exactly those. Two base chains look a packet up: `postrouting` (before source NAT) for
//! every packet that leaves toward a pod or from one, `input` for a pod's packets to the node
//! itself. Replies of allowed connections pass first (conntrack), then IPv6 neighbour
//! discovery, then what the node itself sends; a packet from an isolated pod goes through its
//! egress chain, one to an isolated pod through its ingress chain; a chain returns when a
//! group's set holds the packet's peer and its services the protocol and port, and drops it
//! otherwise. Per packet: one map lookup per direction and one set lookup per group of the
//! pod's services (one or two, as a rule), however many pods and policies there are; the sets
//! hold addresses only, so that they grow with the peers, not with peers times ports.
//!
//! Every rule carries a comment naming it and a hash of its text: a chain is rewritten when the
//! comments read back are not the ones wanted. Sets and maps are compared element by element.

use crate::compile::{Compiled, Direction, LocalPod};
use crate::ranges::{addr_value, by_services, Family, Service};
pub use cni_kernel::nft_elements::Element;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;

/// The table, in the `inet` family.
pub const TABLE: &str = "flannel-netpol";
/// Elements per `add element` statement (all of them still in one transaction).
const CHUNK: usize = 512;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Base {
    pub hook: String,
    pub prio: i64,
    pub policy: String,
}

/// A rule: its text, and the comment that names it (read back, only the comment is known).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub comment: String,
    pub text: String,
}

/// FNV-1a, 32 bits: a rule's text in its comment, so that a changed text is a changed rule.
fn text_hash(text: &str) -> u32 {
    text.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

impl Rule {
    fn new(name: &str, text: String) -> Rule {
        Rule {
            comment: format!("np:{name}:{:08x}", text_hash(&text)),
            text,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Chain {
    pub base: Option<Base>,
    pub rules: Vec<Rule>,
}

impl Chain {
    fn comments(&self) -> Vec<&str> {
        self.rules.iter().map(|r| r.comment.as_str()).collect()
    }
}

/// An allow set: peer addresses of one family, intervals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Set {
    pub family: Family,
    pub elems: BTreeSet<(u128, u128)>,
    /// Elements read back that are not of that form (the set is then written afresh).
    pub foreign: usize,
}

/// A verdict map from an address to the chain it jumps to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VMap {
    pub family: Family,
    pub elems: BTreeMap<u128, String>,
    pub foreign: usize,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Table {
    pub chains: BTreeMap<String, Chain>,
    pub sets: BTreeMap<String, Set>,
    pub maps: BTreeMap<String, VMap>,
    /// Anything read back that the table never holds (another set type, another map type).
    pub foreign: Vec<String>,
}

/// What the kernel holds besides the table's shape: packets each pod chain dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listing {
    pub table: Table,
    pub dropped: BTreeMap<String, u64>,
}

fn prefix(d: Direction) -> &'static str {
    d.as_str()
}

/// The chain, map and set names of a pod: its UID where that is a plain name, else a hash
/// of its namespace and name.
pub fn pod_id(pod: &LocalPod) -> String {
    let plain = !pod.uid.is_empty()
        && pod.uid.len() <= 64
        && pod
            .uid
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if plain {
        pod.uid.clone()
    } else {
        format!(
            "{:08x}",
            text_hash(&format!("{}/{}", pod.namespace, pod.name))
        )
    }
}

pub fn chain_name(d: Direction, id: &str) -> String {
    format!("{}-{id}", prefix(d))
}

/// The set of the peers allowed `services`: named by the services, so that it keeps its name
/// while the pod's other groups come and go.
pub fn set_name(d: Direction, f: Family, id: &str, services: &[Service]) -> String {
    format!(
        "{}{}-{id}-{:08x}",
        prefix(d),
        f.digit(),
        text_hash(&services_text(services))
    )
}

fn range_text_of(lo: u32, hi: u32) -> String {
    range_text(lo, hi)
}

/// `6 . 80, 17 . 53-54`: services as the elements of a concatenation's set.
fn services_text(services: &[Service]) -> String {
    services
        .iter()
        .map(|s| {
            format!(
                "{} . {}",
                range_text_of(s.proto.0.into(), s.proto.1.into()),
                range_text_of(s.port.0.into(), s.port.1.into())
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The match of a group's services: nothing for every protocol and port.
fn services_match(services: &[Service]) -> String {
    if services == [Service::ANY] {
        String::new()
    } else {
        format!(" meta l4proto . th dport {{ {} }}", services_text(services))
    }
}

pub fn map_name(d: Direction, f: Family) -> String {
    format!("{}{}", prefix(d), f.digit())
}

fn ip_word(f: Family) -> &'static str {
    match f {
        Family::V4 => "ip",
        Family::V6 => "ip6",
    }
}

fn addr_type(f: Family) -> &'static str {
    match f {
        Family::V4 => "ipv4_addr",
        Family::V6 => "ipv6_addr",
    }
}

/// Which end of a packet is the pod's peer: the source of ingress, the destination of egress.
fn peer_field(d: Direction) -> &'static str {
    match d {
        Direction::Ingress => "saddr",
        Direction::Egress => "daddr",
    }
}

/// Which end is the pod itself.
fn pod_field(d: Direction) -> &'static str {
    match d {
        Direction::Ingress => "daddr",
        Direction::Egress => "saddr",
    }
}

const ND_TYPES: &str =
    "nd-neighbor-solicit, nd-neighbor-advert, nd-router-solicit, nd-router-advert, nd-redirect";

fn base_chains(chains: &mut BTreeMap<String, Chain>) {
    let common = || {
        vec![
            Rule::new("established", "ct state established,related accept".into()),
            Rule::new("nd", format!("icmpv6 type {{ {ND_TYPES} }} accept")),
        ]
    };
    let lookup = |d: Direction, f: Family| {
        Rule::new(
            &map_name(d, f),
            format!("{} {} vmap @{}", ip_word(f), pod_field(d), map_name(d, f)),
        )
    };
    let mut post = common();
    // The node's own packets (kubelet's probes) to its pods stay allowed.
    post.push(Rule::new("node", "fib saddr type local accept".into()));
    for d in [Direction::Egress, Direction::Ingress] {
        for f in Family::BOTH {
            post.push(lookup(d, f));
        }
    }
    chains.insert(
        "postrouting".into(),
        Chain {
            // Before source NAT (srcnat, 100), so that a pod's own address is seen.
            base: Some(Base {
                hook: "postrouting".into(),
                prio: 95,
                policy: "accept".into(),
            }),
            rules: post,
        },
    );
    let mut input = common();
    for f in Family::BOTH {
        input.push(lookup(Direction::Egress, f));
    }
    chains.insert(
        "input".into(),
        Chain {
            base: Some(Base {
                hook: "input".into(),
                prio: 0,
                policy: "accept".into(),
            }),
            rules: input,
        },
    );
}

/// What the table holds for one pod: its chains, its sets, and its maps' jumps.
#[derive(Debug, Clone, Default)]
struct Fragment {
    chains: Vec<(String, Chain)>,
    sets: Vec<(String, Set)>,
    /// (map, address, chain).
    jumps: Vec<(String, u128, String)>,
}

fn fragment(pod: &LocalPod) -> Fragment {
    let mut out = Fragment::default();
    let id = pod_id(pod);
    for d in Direction::BOTH {
        let Some(iso) = pod.isolation(d) else {
            continue;
        };
        let chain = chain_name(d, &id);
        let mut rules = Vec::new();
        for f in pod.families() {
            let elems = iso.allowed.get(&f).map(Vec::as_slice).unwrap_or_default();
            for (services, addrs) in by_services(elems) {
                let set = set_name(d, f, &id, &services);
                rules.push(Rule::new(
                    &format!("allow{}", f.digit()),
                    format!(
                        "{} {} @{set}{} return",
                        ip_word(f),
                        peer_field(d),
                        services_match(&services)
                    ),
                ));
                out.sets.push((
                    set,
                    Set {
                        family: f,
                        elems: addrs.iter().collect(),
                        foreign: 0,
                    },
                ));
            }
        }
        rules.push(Rule::new("deny", "counter drop".into()));
        for ip in &pod.ips {
            out.jumps
                .push((map_name(d, Family::of(ip)), addr_value(ip), chain.clone()));
        }
        out.chains.push((chain, Chain { base: None, rules }));
    }
    out
}

/// What the table should hold for `compiled`.
pub fn desired(compiled: &Compiled) -> Table {
    Desired::default().table(compiled)
}

/// Tables made one after another, each pod's part made again only when the pod's compilation
/// changed.
#[derive(Debug, Default)]
pub struct Desired {
    parts: HashMap<(String, String), (LocalPod, Fragment)>,
}

impl Desired {
    /// What the table should hold for `compiled`.
    pub fn table(&mut self, compiled: &Compiled) -> Table {
        let mut t = Table::default();
        base_chains(&mut t.chains);
        for d in Direction::BOTH {
            for f in Family::BOTH {
                t.maps.insert(
                    map_name(d, f),
                    VMap {
                        family: f,
                        elems: BTreeMap::new(),
                        foreign: 0,
                    },
                );
            }
        }
        let mut parts = HashMap::with_capacity(compiled.pods.len());
        for pod in &compiled.pods {
            let key = (pod.namespace.clone(), pod.name.clone());
            let part = match self.parts.remove(&key) {
                Some((was, part)) if was == *pod => part,
                _ => fragment(pod),
            };
            t.chains.extend(part.chains.iter().cloned());
            t.sets.extend(part.sets.iter().cloned());
            for (map, addr, chain) in &part.jumps {
                if let Some(m) = t.maps.get_mut(map) {
                    m.elems.insert(*addr, chain.clone());
                }
            }
            parts.insert(key, (pod.clone(), part));
        }
        self.parts = parts;
        t
    }
}

fn range_text<T: PartialEq + std::fmt::Display>(lo: T, hi: T) -> String {
    if lo == hi {
        lo.to_string()
    } else {
        format!("{lo}-{hi}")
    }
}

pub fn elem_text(f: Family, (lo, hi): &(u128, u128)) -> String {
    range_text(f.addr(*lo), f.addr(*hi))
}

/// A change to the elements of one set or map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Elements {
    pub name: String,
    pub add: bool,
    pub elems: Vec<Element>,
}

/// How a difference is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// One `nft -f` transaction: the table written afresh, or mended where elements of
    /// another form were found in it.
    Whole(String),
    /// `nft -f` of the new chains, which nothing jumps to yet, and the sets they use; then one
    /// batch of the other new sets and every element change (the maps' jumps with the sets
    /// they lead to); then `nft -f` of the changed chains' rules and of what nothing uses any
    /// more. Only `nft`'s writing of elements reads all of the table's first: it is left out.
    Steps {
        before: String,
        /// Sets the batch makes (empty) before its elements.
        sets: Vec<(String, Family)>,
        elements: Vec<Elements>,
        after: String,
    },
}

fn element_text(e: &Element, add: bool) -> String {
    match e {
        Element::Range(lo, hi) => range_text(*lo, *hi),
        Element::Jump(a, c) if add => format!("{a} : jump {c}"),
        Element::Jump(a, _) => a.to_string(),
    }
}

impl Plan {
    /// The same as one `nft -f` transaction.
    pub fn text(&self) -> String {
        match self {
            Plan::Whole(t) => t.clone(),
            Plan::Steps {
                before,
                sets,
                elements,
                after,
            } => {
                let mut out = before.clone();
                for (name, family) in sets {
                    write_set(&mut out, name, *family);
                }
                write_elements(&mut out, elements);
                out.push_str(after);
                out
            }
        }
    }

    /// Lines of `text`, without writing it.
    pub fn lines(&self) -> usize {
        match self {
            Plan::Whole(t) => t.lines().count(),
            Plan::Steps {
                before,
                sets,
                elements,
                after,
            } => {
                before.lines().count()
                    + sets.len()
                    + elements
                        .iter()
                        .map(|e| e.elems.len().div_ceil(CHUNK))
                        .sum::<usize>()
                    + after.lines().count()
            }
        }
    }
}

fn write_elements(out: &mut String, elements: &[Elements]) {
    for e in elements {
        let verb = if e.add { "add" } else { "delete" };
        for chunk in e.elems.chunks(CHUNK) {
            let text: Vec<String> = chunk.iter().map(|x| element_text(x, e.add)).collect();
            let _ = writeln!(
                out,
                "{verb} element inet {TABLE} {} {{ {} }}",
                e.name,
                text.join(", ")
            );
        }
    }
}

/// The change of `elems` to the set or map `name`; None when there are none.
fn element_change(name: &str, add: bool, elems: impl Iterator<Item = Element>) -> Option<Elements> {
    let elems: Vec<Element> = elems.collect();
    (!elems.is_empty()).then(|| Elements {
        name: name.to_string(),
        add,
        elems,
    })
}

fn set_elements<'a>(
    name: &str,
    add: bool,
    f: Family,
    elems: impl IntoIterator<Item = &'a (u128, u128)>,
) -> Option<Elements> {
    let elems = elems.into_iter();
    element_change(
        name,
        add,
        elems.map(|(lo, hi)| Element::Range(f.addr(*lo), f.addr(*hi))),
    )
}

fn map_elements<'a>(
    name: &str,
    add: bool,
    f: Family,
    elems: impl IntoIterator<Item = (&'a u128, &'a String)>,
) -> Option<Elements> {
    let elems = elems.into_iter();
    element_change(
        name,
        add,
        elems.map(|(a, c)| Element::Jump(f.addr(*a), c.clone())),
    )
}

fn write_set(out: &mut String, name: &str, family: Family) {
    let _ = writeln!(
        out,
        "add set inet {TABLE} {name} {{ type {}; flags interval; }}",
        addr_type(family)
    );
}

fn write_chain(out: &mut String, name: &str, c: &Chain) {
    match &c.base {
        Some(b) => {
            let _ = writeln!(
                out,
                "add chain inet {TABLE} {name} {{ type filter hook {} priority {}; policy {}; }}",
                b.hook, b.prio, b.policy
            );
        }
        None => {
            let _ = writeln!(out, "add chain inet {TABLE} {name}");
        }
    }
    write_rules(out, name, c);
}

fn write_rules(out: &mut String, name: &str, c: &Chain) {
    for r in &c.rules {
        let _ = writeln!(
            out,
            "add rule inet {TABLE} {name} {} comment \"{}\"",
            r.text, r.comment
        );
    }
}

/// The whole table, its shape (sets and maps empty) and then its elements.
fn whole(t: &Table) -> (String, Vec<Elements>) {
    let mut out = String::new();
    let _ = writeln!(out, "add table inet {TABLE}");
    for (name, m) in &t.maps {
        let _ = writeln!(
            out,
            "add map inet {TABLE} {name} {{ type {} : verdict; }}",
            addr_type(m.family)
        );
    }
    for (name, s) in &t.sets {
        write_set(&mut out, name, s.family);
    }
    for (name, c) in t.chains.iter().filter(|(_, c)| c.base.is_none()) {
        write_chain(&mut out, name, c);
    }
    for (name, c) in t.chains.iter().filter(|(_, c)| c.base.is_some()) {
        write_chain(&mut out, name, c);
    }
    let sets = t
        .sets
        .iter()
        .filter_map(|(name, s)| set_elements(name, true, s.family, &s.elems));
    let maps = t
        .maps
        .iter()
        .filter_map(|(name, m)| map_elements(name, true, m.family, &m.elems));
    (out, sets.chain(maps).collect())
}

/// The whole table as one transaction: `delete` first when one is there.
pub fn full(t: &Table, replace: bool) -> String {
    let mut out = String::new();
    if replace {
        let _ = writeln!(out, "delete table inet {TABLE}");
    }
    let (shape, elements) = whole(t);
    out.push_str(&shape);
    write_elements(&mut out, &elements);
    out
}

/// Whether the table read back has the shape wanted (base chains, maps, set types), so that
/// element and rule changes make it equal; else it is written afresh.
fn same_shape(want: &Table, have: &Table) -> bool {
    if !have.foreign.is_empty() {
        return false;
    }
    let bases = |t: &Table| -> Vec<(String, Base)> {
        t.chains
            .iter()
            .filter_map(|(n, c)| c.base.clone().map(|b| (n.clone(), b)))
            .collect()
    };
    let map_types = |t: &Table| -> Vec<(String, Family)> {
        t.maps.iter().map(|(n, m)| (n.clone(), m.family)).collect()
    };
    let set_types_agree = want
        .sets
        .iter()
        .all(|(n, s)| have.sets.get(n).is_none_or(|h| h.family == s.family));
    bases(want) == bases(have) && map_types(want) == map_types(have) && set_types_agree
}

/// How to make `have` (None: no table) into `want`; None when they are equal already.
pub fn plan(want: &Table, have: Option<&Table>) -> Option<Plan> {
    let Some(have) = have else {
        let (before, elements) = whole(want);
        return Some(Plan::Steps {
            before,
            sets: Vec::new(),
            elements,
            after: String::new(),
        });
    };
    if !same_shape(want, have) {
        return Some(Plan::Whole(full(want, true)));
    }
    let mut before = String::new();
    let mut elements = Vec::new();
    let mut after = String::new();
    // Elements of another form are flushed with the rest: then one transaction for all.
    let mut flushed = false;
    // New sets in the batch, before their elements; but where there are new chains, which
    // the batch's jumps lead to, made before it, with the new sets (those they use among them).
    let mut sets = Vec::new();
    for (name, s) in want
        .sets
        .iter()
        .filter(|(n, _)| !have.sets.contains_key(*n))
    {
        sets.push((name.clone(), s.family));
        elements.extend(set_elements(name, true, s.family, &s.elems));
    }
    for (name, c) in want
        .chains
        .iter()
        .filter(|(n, _)| !have.chains.contains_key(*n))
    {
        write_chain(&mut before, name, c);
    }
    if !before.is_empty() {
        let mut with_sets = String::new();
        for (name, family) in sets.drain(..) {
            write_set(&mut with_sets, &name, family);
        }
        before.insert_str(0, &with_sets);
    }
    // Elements of the sets both have.
    for (name, s) in &want.sets {
        let Some(h) = have.sets.get(name) else {
            continue;
        };
        if h.foreign > 0 {
            let _ = writeln!(before, "flush set inet {TABLE} {name}");
            flushed = true;
            elements.extend(set_elements(name, true, s.family, &s.elems));
            continue;
        }
        // Stale ones first: an element that grew must not meet its old self.
        elements.extend(set_elements(
            name,
            false,
            s.family,
            h.elems.difference(&s.elems),
        ));
        elements.extend(set_elements(
            name,
            true,
            s.family,
            s.elems.difference(&h.elems),
        ));
    }
    // The maps: jumps to new chains in, jumps to going ones out.
    for (name, m) in &want.maps {
        let Some(h) = have.maps.get(name) else {
            continue;
        };
        if h.foreign > 0 {
            let _ = writeln!(before, "flush map inet {TABLE} {name}");
            flushed = true;
            elements.extend(map_elements(name, true, m.family, &m.elems));
            continue;
        }
        let stale = h.elems.iter().filter(|(a, c)| m.elems.get(a) != Some(c));
        elements.extend(map_elements(name, false, m.family, stale));
        let fresh = m.elems.iter().filter(|(a, c)| h.elems.get(a) != Some(c));
        elements.extend(map_elements(name, true, m.family, fresh));
    }
    // Chains both have whose rules differ.
    for (name, c) in &want.chains {
        if have
            .chains
            .get(name)
            .is_some_and(|h| h.comments() != c.comments())
        {
            let _ = writeln!(after, "flush chain inet {TABLE} {name}");
            write_rules(&mut after, name, c);
        }
    }
    // What is no longer wanted, after nothing jumps to it or uses it.
    for name in have.chains.keys().filter(|n| !want.chains.contains_key(*n)) {
        let _ = writeln!(after, "flush chain inet {TABLE} {name}");
        let _ = writeln!(after, "delete chain inet {TABLE} {name}");
    }
    for name in have.sets.keys().filter(|n| !want.sets.contains_key(*n)) {
        let _ = writeln!(after, "delete set inet {TABLE} {name}");
    }
    if before.is_empty() && sets.is_empty() && elements.is_empty() && after.is_empty() {
        return None;
    }
    let steps = Plan::Steps {
        before,
        sets,
        elements,
        after,
    };
    Some(if flushed {
        Plan::Whole(steps.text())
    } else {
        steps
    })
}

/// The one transaction that makes `have` (None: no table) into `want`; None when they are
/// equal already.
pub fn transaction(want: &Table, have: Option<&Table>) -> Option<String> {
    plan(want, have).map(|p| p.text())
}

fn family_of_type(t: &str) -> Option<Family> {
    match t {
        "ipv4_addr" => Some(Family::V4),
        "ipv6_addr" => Some(Family::V6),
        _ => None,
    }
}

fn parse_ip(v: &Value, f: Family) -> Option<u128> {
    let ip: std::net::IpAddr = v.as_str()?.parse().ok()?;
    (Family::of(&ip) == f).then(|| addr_value(&ip))
}

fn parse_addr(v: &Value, f: Family) -> Option<(u128, u128)> {
    if let Some(p) = v.get("prefix") {
        let lo = parse_ip(&p["addr"], f)?;
        let len = u32::try_from(p["len"].as_u64()?)
            .ok()
            .filter(|l| *l <= f.bits())?;
        let host_bits = f.bits() - len;
        let host = if host_bits == 128 {
            u128::MAX
        } else {
            (1u128 << host_bits) - 1
        };
        return Some((lo, lo | host));
    }
    if let Some(r) = v.get("range") {
        return Some((parse_ip(&r[0], f)?, parse_ip(&r[1], f)?));
    }
    let a = parse_ip(v, f)?;
    Some((a, a))
}

/// An element as `nft -j` writes it; a wrapped one (`{"elem": {"val": ...}}`) unwrapped.
fn unwrap_elem(v: &Value) -> &Value {
    v.get("elem").and_then(|e| e.get("val")).unwrap_or(v)
}

fn strings(v: &Value) -> Vec<&str> {
    match v {
        Value::String(s) => vec![s.as_str()],
        Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    }
}

/// What `nft -j list table inet flannel-netpol` printed.
pub fn parse(json: &str) -> Result<Listing, String> {
    let doc: Value = serde_json::from_str(json).map_err(|e| format!("nft's JSON listing: {e}"))?;
    let items = doc["nftables"]
        .as_array()
        .ok_or("nft's JSON listing has no \"nftables\" list")?;
    let mut l = Listing::default();
    let t = &mut l.table;
    for item in items {
        if let Some(c) = item.get("chain") {
            let name = c["name"].as_str().unwrap_or_default().to_string();
            let base = c.get("hook").map(|h| Base {
                hook: h.as_str().unwrap_or_default().to_string(),
                prio: c["prio"].as_i64().unwrap_or(i64::MIN),
                policy: c["policy"].as_str().unwrap_or_default().to_string(),
            });
            t.chains.entry(name).or_default().base = base;
        } else if let Some(r) = item.get("rule") {
            let chain = r["chain"].as_str().unwrap_or_default().to_string();
            let comment = r["comment"].as_str().unwrap_or_default().to_string();
            let exprs = r["expr"].as_array().map(Vec::as_slice).unwrap_or_default();
            let dropped: Option<u64> = exprs
                .iter()
                .find_map(|e| e.get("counter")?.get("packets")?.as_u64());
            if comment.starts_with("np:deny:") {
                if let Some(n) = dropped {
                    l.dropped.insert(chain.clone(), n);
                }
            }
            t.chains.entry(chain).or_default().rules.push(Rule {
                comment,
                text: String::new(),
            });
        } else if let Some(s) = item.get("set") {
            let name = s["name"].as_str().unwrap_or_default().to_string();
            let types = strings(&s["type"]);
            let family = match types.as_slice() {
                [a] => family_of_type(a),
                _ => None,
            };
            let interval = strings(&s["flags"]).contains(&"interval");
            let (Some(family), true) = (family, interval) else {
                t.foreign.push(format!("set {name} of type {types:?}"));
                continue;
            };
            let raw = s["elem"].as_array().map(Vec::as_slice).unwrap_or_default();
            let elems: BTreeSet<(u128, u128)> = raw
                .iter()
                .filter_map(|e| parse_addr(unwrap_elem(e), family))
                .collect();
            t.sets.insert(
                name,
                Set {
                    family,
                    foreign: raw.len() - elems.len(),
                    elems,
                },
            );
        } else if let Some(m) = item.get("map") {
            let name = m["name"].as_str().unwrap_or_default().to_string();
            let family = m["type"].as_str().and_then(family_of_type);
            let (Some(family), Some("verdict")) = (family, m["map"].as_str()) else {
                t.foreign.push(format!("map {name}"));
                continue;
            };
            let raw = m["elem"].as_array().map(Vec::as_slice).unwrap_or_default();
            let mut elems = BTreeMap::new();
            for e in raw {
                let key = e.get(0).map(unwrap_elem).and_then(|k| parse_ip(k, family));
                let target = e.get(1).and_then(|v| v["jump"]["target"].as_str());
                if let (Some(k), Some(c)) = (key, target) {
                    elems.insert(k, c.to_string());
                }
            }
            t.maps.insert(
                name,
                VMap {
                    family,
                    foreign: raw.len() - elems.len(),
                    elems,
                },
            );
        }
    }
    Ok(l)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::Isolation;
    use crate::ranges::Elem;

    fn v(ip: &str) -> u128 {
        addr_value(&ip.parse().unwrap())
    }

    fn elem(lo: &str, hi: &str, s: Service) -> Elem {
        Elem {
            addr: (v(lo), v(hi)),
            proto: s.proto,
            port: s.port,
        }
    }

    const TCP80: &str = "d3de144d";

    /// x/a on 10.0.1.1 and fd00::1:1, isolated for ingress: 10.0.2.0/24 on TCP 80, fd00::2:1
    /// on anything.
    fn compiled() -> Compiled {
        let ingress = Isolation {
            policies: vec!["x/p".into()],
            allowed: BTreeMap::from([
                (
                    Family::V4,
                    vec![elem("10.0.2.0", "10.0.2.255", Service::ports(6, 80, 80))],
                ),
                (
                    Family::V6,
                    vec![elem("fd00::2:1", "fd00::2:1", Service::ANY)],
                ),
            ]),
        };
        Compiled {
            pods: vec![LocalPod {
                namespace: "x".into(),
                name: "a".into(),
                uid: "u-1".into(),
                ips: vec!["10.0.1.1".parse().unwrap(), "fd00::1:1".parse().unwrap()],
                ingress: Some(ingress),
                egress: None,
            }],
            problems: vec![],
            policies: 1,
        }
    }

    fn any() -> String {
        set_name(Direction::Ingress, Family::V6, "u-1", &[Service::ANY])
    }

    fn tcp80() -> String {
        set_name(
            Direction::Ingress,
            Family::V4,
            "u-1",
            &[Service::ports(6, 80, 80)],
        )
    }

    #[test]
    fn an_isolated_pod_gets_a_chain_a_set_per_group_of_services_and_its_addresses_in_the_maps() {
        let t = desired(&compiled());
        assert_eq!(tcp80(), format!("ingress4-u-1-{TCP80}"));
        assert_eq!(
            t.chains.keys().collect::<Vec<_>>(),
            ["ingress-u-1", "input", "postrouting"]
        );
        let texts: Vec<&str> = t.chains["ingress-u-1"]
            .rules
            .iter()
            .map(|r| r.text.as_str())
            .collect();
        let (tcp80, any) = (tcp80(), any());
        assert_eq!(
            texts,
            [
                format!("ip saddr @{tcp80} meta l4proto . th dport {{ 6 . 80 }} return").as_str(),
                format!("ip6 saddr @{any} return").as_str(),
                "counter drop"
            ]
        );
        assert_eq!(
            t.maps["ingress4"].elems,
            BTreeMap::from([(v("10.0.1.1"), "ingress-u-1".to_string())])
        );
        assert!(t.maps["egress4"].elems.is_empty());
        let text = full(&t, false);
        for line in [
            format!("add set inet flannel-netpol {tcp80} {{ type ipv4_addr; flags interval; }}"),
            format!("add element inet flannel-netpol {tcp80} {{ 10.0.2.0-10.0.2.255 }}"),
            format!("add element inet flannel-netpol {any} {{ fd00::2:1 }}"),
            "add element inet flannel-netpol ingress6 { fd00::1:1 : jump ingress-u-1 }".into(),
            "add chain inet flannel-netpol postrouting { type filter hook postrouting priority 95; policy accept; }".into(),
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in {text}");
        }
        // The maps come before the chains that look them up, the chains before the jumps.
        let at = |s: &str| text.find(s).unwrap_or_else(|| panic!("{s} in {text}"));
        assert!(
            at("add map inet flannel-netpol ingress4")
                < at("add chain inet flannel-netpol postrouting")
        );
        assert!(at("add chain inet flannel-netpol ingress-u-1") < at("ingress4 { 10.0.1.1 : jump"));
    }

    /// The table as `nft -j list` prints it after `full` was applied (nftables 1.0.6).
    fn listed(t: &Table) -> Listing {
        let mut items = vec![serde_json::json!({"metainfo": {"version": "1.0.6"}})];
        items.push(serde_json::json!({"table": {"family": "inet", "name": TABLE}}));
        for (name, s) in &t.sets {
            let elems: Vec<Value> = s
                .elems
                .iter()
                .map(|(lo, hi)| {
                    if lo == hi {
                        Value::from(s.family.addr(*lo).to_string())
                    } else {
                        serde_json::json!({"range": [s.family.addr(*lo).to_string(),
                                                     s.family.addr(*hi).to_string()]})
                    }
                })
                .collect();
            items.push(
                serde_json::json!({"set": {"family": "inet", "table": TABLE, "name": name,
                "type": addr_type(s.family), "flags": ["interval"], "elem": elems}}),
            );
        }
        for (name, m) in &t.maps {
            let elems: Vec<Value> = m
                .elems
                .iter()
                .map(|(a, c)| serde_json::json!([m.family.addr(*a).to_string(), {"jump": {"target": c}}]))
                .collect();
            items.push(
                serde_json::json!({"map": {"family": "inet", "table": TABLE, "name": name,
                "type": addr_type(m.family), "map": "verdict", "elem": elems}}),
            );
        }
        for (name, c) in &t.chains {
            let mut chain = serde_json::json!({"family": "inet", "table": TABLE, "name": name});
            if let Some(b) = &c.base {
                chain["type"] = "filter".into();
                chain["hook"] = b.hook.clone().into();
                chain["prio"] = b.prio.into();
                chain["policy"] = b.policy.clone().into();
            }
            items.push(serde_json::json!({"chain": chain}));
            for r in &c.rules {
                let expr = if r.text.starts_with("counter") {
                    serde_json::json!([{"counter": {"packets": 7, "bytes": 420}}, {"drop": null}])
                } else {
                    serde_json::json!([{"accept": null}])
                };
                items.push(
                    serde_json::json!({"rule": {"family": "inet", "table": TABLE,
                    "chain": name, "comment": r.comment, "expr": expr}}),
                );
            }
        }
        parse(&serde_json::json!({"nftables": items}).to_string()).unwrap()
    }

    #[test]
    fn what_is_read_back_as_written_needs_no_transaction() {
        let t = desired(&compiled());
        let l = listed(&t);
        assert_eq!(l.dropped, BTreeMap::from([("ingress-u-1".to_string(), 7)]));
        assert_eq!(transaction(&t, Some(&l.table)), None);
        assert!(transaction(&t, None)
            .unwrap()
            .starts_with("add table inet flannel-netpol\n"));
    }

    #[test]
    fn a_change_writes_only_the_difference_in_an_order_the_kernel_takes() {
        let before = desired(&compiled());
        let have = listed(&before).table;
        // The allowed range grows; x/a gets egress isolation too.
        let mut c = compiled();
        c.pods[0].ingress.as_mut().unwrap().allowed.insert(
            Family::V4,
            vec![elem("10.0.2.0", "10.0.3.255", Service::ports(6, 80, 80))],
        );
        c.pods[0].egress = Some(Isolation {
            policies: vec!["x/q".into()],
            allowed: BTreeMap::new(),
        });
        let tx = transaction(&desired(&c), Some(&have)).unwrap();
        let lines: Vec<&str> = tx.lines().collect();
        let tcp80 = tcp80();
        assert!(
            lines.contains(
                &format!("delete element inet flannel-netpol {tcp80} {{ 10.0.2.0-10.0.2.255 }}")
                    .as_str()
            ),
            "{tx}"
        );
        assert!(
            lines.contains(
                &format!("add element inet flannel-netpol {tcp80} {{ 10.0.2.0-10.0.3.255 }}")
                    .as_str()
            ),
            "{tx}"
        );
        let at = |s: &str| tx.find(s).unwrap_or_else(|| panic!("{s} in {tx}"));
        assert!(
            at("add chain inet flannel-netpol egress-u-1")
                < at("egress4 { 10.0.1.1 : jump egress-u-1 }")
        );
        assert!(
            !tx.contains("ingress-u-1 {") && !tx.contains("flush"),
            "{tx}"
        );
        // Another port for the same peers: another group, its set and its rule.
        let mut c = compiled();
        c.pods[0].ingress.as_mut().unwrap().allowed.insert(
            Family::V4,
            vec![elem("10.0.2.0", "10.0.2.255", Service::ports(6, 81, 81))],
        );
        let tx = transaction(&desired(&c), Some(&have)).unwrap();
        assert!(
            tx.contains("flush chain inet flannel-netpol ingress-u-1\n"),
            "{tx}"
        );
        assert!(
            tx.contains(&format!("delete set inet flannel-netpol {tcp80}\n")),
            "{tx}"
        );
        // x/a goes: its jumps out before its chain and sets.
        let gone = transaction(&desired(&Compiled::default()), Some(&have)).unwrap();
        let at = |s: &str| gone.find(s).unwrap_or_else(|| panic!("{s} in {gone}"));
        assert!(
            at("delete element inet flannel-netpol ingress4 { 10.0.1.1 }")
                < at("delete chain inet flannel-netpol ingress-u-1")
        );
        assert!(
            at("flush chain inet flannel-netpol ingress-u-1")
                < at("delete chain inet flannel-netpol ingress-u-1")
        );
        assert!(
            at("delete chain inet flannel-netpol ingress-u-1")
                < at(&format!("delete set inet flannel-netpol {tcp80}"))
        );
    }

    #[test]
    fn changes_behind_its_back_are_undone() {
        let want = desired(&compiled());
        // A rule gone, one of another's added, an element gone, a jump redirected.
        let mut have = listed(&want).table;
        have.chains.get_mut("postrouting").unwrap().rules.remove(2);
        have.chains.get_mut("input").unwrap().rules.push(Rule {
            comment: String::new(),
            text: String::new(),
        });
        have.sets.get_mut(&tcp80()).unwrap().elems.clear();
        have.maps
            .get_mut("ingress6")
            .unwrap()
            .elems
            .insert(v("fd00::1:1"), "input".into());
        let tx = transaction(&want, Some(&have)).unwrap();
        for line in [
            "flush chain inet flannel-netpol postrouting".to_string(),
            "flush chain inet flannel-netpol input".into(),
            format!(
                "add element inet flannel-netpol {} {{ 10.0.2.0-10.0.2.255 }}",
                tcp80()
            ),
            "delete element inet flannel-netpol ingress6 { fd00::1:1 }".into(),
            "add element inet flannel-netpol ingress6 { fd00::1:1 : jump ingress-u-1 }".into(),
        ] {
            assert!(tx.lines().any(|l| l == line), "{line} in {tx}");
        }
        // A base chain of another priority, or an element of another form: written afresh.
        let mut have = listed(&want).table;
        have.chains
            .get_mut("input")
            .unwrap()
            .base
            .as_mut()
            .unwrap()
            .prio = 10;
        assert!(transaction(&want, Some(&have))
            .unwrap()
            .starts_with("delete table inet flannel-netpol\nadd table"));
        let mut have = listed(&want).table;
        have.sets.get_mut(&any()).unwrap().foreign = 1;
        let tx = transaction(&want, Some(&have)).unwrap();
        assert!(
            tx.starts_with(&format!(
                "flush set inet flannel-netpol {}\nadd element",
                any()
            )),
            "{tx}"
        );
    }

    #[test]
    fn elements_read_as_nft_prints_them() {
        let json = r#"{"nftables": [{"set": {"name": "s", "type": "ipv4_addr",
            "flags": ["interval"], "elem": [
              {"prefix": {"addr": "10.0.0.0", "len": 24}},
              {"range": ["10.0.1.0", "10.0.1.6"]},
              {"elem": {"val": "10.0.2.1", "counter": {"packets": 1}}},
              {"set": ["weird"]}]}},
            {"map": {"name": "m", "type": "ipv4_addr", "map": "verdict",
              "elem": [["10.0.0.1", {"jump": {"target": "c1"}}], ["10.0.0.2", {"goto": {"target": "c2"}}]]}},
            {"set": {"name": "other", "type": ["ipv4_addr", "inet_service"]}}]}"#;
        let t = parse(json).unwrap().table;
        let s = &t.sets["s"];
        assert_eq!(s.foreign, 1);
        assert_eq!(
            s.elems
                .iter()
                .map(|e| elem_text(Family::V4, e))
                .collect::<Vec<_>>(),
            ["10.0.0.0-10.0.0.255", "10.0.1.0-10.0.1.6", "10.0.2.1"]
        );
        assert_eq!(t.maps["m"].elems.len(), 1);
        assert_eq!(t.maps["m"].foreign, 1);
        assert_eq!(
            t.foreign,
            ["set other of type [\"ipv4_addr\", \"inet_service\"]"]
        );
    }

    #[test]
    fn elements_go_apart_from_the_shape_new_sets_before_them_rules_and_removals_after() {
        let want = desired(&compiled());
        // From no table: the shape with empty sets and maps, then every element.
        let Some(Plan::Steps {
            before,
            elements,
            after,
            ..
        }) = plan(&want, None)
        else {
            panic!("steps from no table");
        };
        assert!(
            before.starts_with("add table inet flannel-netpol\n"),
            "{before}"
        );
        assert!(!before.contains("element"), "{before}");
        assert!(after.is_empty());
        let names: Vec<&str> = elements.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, [tcp80().as_str(), &any(), "ingress4", "ingress6"]);
        let have = listed(&want).table;
        // Only an element changed: no `nft` at all.
        let mut c = compiled();
        c.pods[0].ingress.as_mut().unwrap().allowed.insert(
            Family::V4,
            vec![elem("10.0.2.0", "10.0.3.255", Service::ports(6, 80, 80))],
        );
        let range = |lo: &str, hi: &str| Element::Range(lo.parse().unwrap(), hi.parse().unwrap());
        assert_eq!(
            plan(&desired(&c), Some(&have)),
            Some(Plan::Steps {
                before: String::new(),
                sets: vec![],
                elements: vec![
                    Elements {
                        name: tcp80(),
                        add: false,
                        elems: vec![range("10.0.2.0", "10.0.2.255")]
                    },
                    Elements {
                        name: tcp80(),
                        add: true,
                        elems: vec![range("10.0.2.0", "10.0.3.255")]
                    },
                ],
                after: String::new(),
            })
        );
        // Another group of services: its set made and filled in the batch, the chain's rules
        // and the old set's removal after.
        let mut c = compiled();
        c.pods[0].ingress.as_mut().unwrap().allowed.insert(
            Family::V4,
            vec![elem("10.0.2.0", "10.0.2.255", Service::ports(6, 81, 81))],
        );
        let Some(Plan::Steps {
            before,
            sets,
            elements,
            after,
        }) = plan(&desired(&c), Some(&have))
        else {
            panic!("steps");
        };
        assert_eq!(before, "");
        let tcp81 = set_name(
            Direction::Ingress,
            Family::V4,
            "u-1",
            &[Service::ports(6, 81, 81)],
        );
        assert_eq!(sets, [(tcp81.clone(), Family::V4)]);
        assert_eq!(elements.len(), 1);
        assert_eq!(elements[0].name, tcp81);
        assert!(
            after.starts_with("flush chain inet flannel-netpol ingress-u-1\n"),
            "{after}"
        );
        assert!(after.ends_with(&format!("delete set inet flannel-netpol {}\n", tcp80())));
        // A new chain (egress isolation): made before the batch, with the sets it uses.
        let mut c = compiled();
        c.pods[0].egress = Some(Isolation {
            policies: vec!["x/q".into()],
            allowed: BTreeMap::from([(
                Family::V4,
                vec![elem("10.9.0.0", "10.9.0.0", Service::ANY)],
            )]),
        });
        let Some(Plan::Steps { before, sets, .. }) = plan(&desired(&c), Some(&have)) else {
            panic!("steps");
        };
        assert!(sets.is_empty());
        assert!(
            before.starts_with("add set inet flannel-netpol egress4-u-1-"),
            "{before}"
        );
        assert!(
            before.contains("add chain inet flannel-netpol egress-u-1\n"),
            "{before}"
        );
        // Elements of another form are flushed: one transaction.
        let mut odd = have.clone();
        odd.sets.get_mut(&any()).unwrap().foreign = 1;
        assert!(matches!(plan(&want, Some(&odd)), Some(Plan::Whole(_))));
    }

    #[test]
    fn tables_made_one_after_another_are_each_the_table_made_afresh() {
        let mut d = Desired::default();
        let first = compiled();
        let mut second = compiled();
        second.pods[0].egress = Some(Isolation {
            policies: vec!["x/q".into()],
            allowed: BTreeMap::new(),
        });
        let mut third = second.clone();
        third.pods[0].ips.pop();
        for c in [
            &first,
            &second,
            &first,
            &third,
            &Compiled::default(),
            &first,
        ] {
            assert_eq!(d.table(c), desired(c));
        }
    }
}
