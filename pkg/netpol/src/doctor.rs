//! `flannel-netpol doctor`: what the enforcer would do, with nothing written. One listing of
//! the cluster, the policies compiled for this node, the table read back; then one finding per
//! thing looked at (the API, br_netfilter, each policy problem, the table) and each local
//! pod's verdicts: for each direction, isolated or not, by which policies, and what it allows,
//! peers named by their pods where they are pods.

use crate::compile::{Compiled, Direction, LocalPod};
use crate::nft::{chain_name, pod_id, Listing};
use crate::objects::Objects;
use crate::ranges::{addr_value, Elem, Family};
use std::collections::HashMap;
use std::fmt::Write as _;

/// One thing looked at: ok or not, what, and the detail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub ok: bool,
    pub kind: &'static str,
    pub detail: String,
}

/// What one look found.
#[derive(Debug, Clone)]
pub struct Look {
    pub node: String,
    pub findings: Vec<Finding>,
    pub compiled: Compiled,
    pub listing: Option<Listing>,
    /// What would make the table right; None when it is.
    pub transaction: Option<String>,
}

impl Look {
    pub fn problems(&self) -> usize {
        self.findings.iter().filter(|f| !f.ok).count()
    }
}

fn proto_text(e: &Elem) -> String {
    let proto = match e.proto {
        (0, 255) => return "any protocol".into(),
        (6, 6) => "tcp".to_string(),
        (17, 17) => "udp".to_string(),
        (132, 132) => "sctp".to_string(),
        (a, b) if a == b => format!("protocol {a}"),
        (a, b) => format!("protocols {a}-{b}"),
    };
    match e.port {
        (0, 65535) => format!("{proto} any port"),
        (a, b) if a == b => format!("{proto} {a}"),
        (a, b) => format!("{proto} {a}-{b}"),
    }
}

fn addr_text(f: Family, e: &Elem, pods: &HashMap<u128, String>) -> String {
    let (lo, hi) = e.addr;
    if lo == 0 && hi == f.max() {
        return "anywhere".into();
    }
    if lo == hi {
        return match pods.get(&lo) {
            Some(p) => format!("{} ({p})", f.addr(lo)),
            None => f.addr(lo).to_string(),
        };
    }
    format!("{}-{}", f.addr(lo), f.addr(hi))
}

fn pod_lines(out: &mut String, pod: &LocalPod, look: &Look, names: &HashMap<u128, String>) {
    let ips: Vec<String> = pod.ips.iter().map(|i| i.to_string()).collect();
    let _ = writeln!(out, "{}/{} {}", pod.namespace, pod.name, ips.join(" "));
    for d in Direction::BOTH {
        let Some(iso) = pod.isolation(d) else {
            let every = match d {
                Direction::Ingress => "every source",
                Direction::Egress => "every destination",
            };
            let _ = writeln!(out, "  {:<8} not isolated: {every}", d.as_str());
            continue;
        };
        let dropped = look
            .listing
            .as_ref()
            .and_then(|l| l.dropped.get(&chain_name(d, &pod_id(pod))))
            .map(|n| format!(", {n} packets dropped"))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "  {:<8} isolated by {}{dropped}",
            d.as_str(),
            iso.policies.join(", ")
        );
        let peer = match d {
            Direction::Ingress => "from",
            Direction::Egress => "to",
        };
        let mut any = false;
        for (f, elems) in &iso.allowed {
            for e in elems {
                any = true;
                let _ = writeln!(
                    out,
                    "           allows {peer} {} {}",
                    addr_text(*f, e, names),
                    proto_text(e)
                );
            }
        }
        if !any {
            let _ = writeln!(out, "           allows nothing");
        }
    }
}

/// The look as text.
pub fn text(look: &Look, objects: &Objects) -> String {
    let mut out = String::new();
    for f in &look.findings {
        let mark = if f.ok { "ok  " } else { "FAIL" };
        let _ = writeln!(out, "{mark} {:<8} {}", f.kind, f.detail);
    }
    let names: HashMap<u128, String> = objects
        .pods
        .values()
        .filter(|p| p.is_policy_pod())
        .flat_map(|p| {
            let name = format!("{}/{}", p.metadata.namespace, p.metadata.name);
            p.ips()
                .into_iter()
                .map(move |ip| (addr_value(&ip), name.clone()))
        })
        .collect();
    let _ = writeln!(out, "pods on {}:", look.node);
    if look.compiled.pods.is_empty() {
        let _ = writeln!(out, "  none");
    }
    for pod in &look.compiled.pods {
        pod_lines(&mut out, pod, look, &names);
    }
    let _ = match look.problems() {
        0 => writeln!(out, "all right"),
        n => writeln!(out, "{n} problem(s)"),
    };
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::compile;
    use crate::model::{NetworkPolicy, Pod};
    use crate::nft::{desired, transaction};
    use serde_json::json;

    #[test]
    fn each_pod_says_what_isolates_it_and_what_it_allows_peers_by_name() {
        let mut o = Objects::default();
        for (name, ip, node) in [("a", "10.0.0.2", "n1"), ("b", "10.0.0.3", "n2")] {
            let p: Pod = serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "x", "uid": format!("u{name}"), "labels": {"pod": name}},
                "spec": {"nodeName": node}, "status": {"podIP": ip}}))
            .unwrap();
            o.pods.insert(("x".into(), name.into()), p);
        }
        let p: NetworkPolicy = serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "x"},
            "spec": {"podSelector": {"matchLabels": {"pod": "a"}},
                     "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}], "ports": [{"port": 80}]},
                                 {"from": [{"ipBlock": {"cidr": "192.168.0.0/24"}}]}]}}))
        .unwrap();
        o.policies.insert(("x".into(), "p".into()), p);
        let compiled = compile(&o, "n1");
        let want = desired(&compiled);
        let look = Look {
            node: "n1".into(),
            findings: vec![Finding {
                ok: false,
                kind: "table",
                detail: "inet flannel-netpol is missing".into(),
            }],
            transaction: transaction(&want, None),
            compiled,
            listing: None,
        };
        assert_eq!(
            text(&look, &o),
            "FAIL table    inet flannel-netpol is missing\n\
             pods on n1:\n\
             x/a 10.0.0.2\n\
             \x20 ingress  isolated by x/p\n\
             \x20          allows from 10.0.0.3 (x/b) tcp 80\n\
             \x20          allows from 192.168.0.0-192.168.0.255 any protocol\n\
             \x20 egress   not isolated: every destination\n\
             1 problem(s)\n"
        );
    }
}
