//! The other nodes as leases between a list and the watch that follows it.

use super::node::{node_entry, Annotations, Families, NodeObject};
use crate::registry::{Change, Entry};
use crate::view::BadEntry;
use std::collections::HashMap;

/// What one listing or watch event changed.
#[derive(Debug, Clone, Default)]
pub struct Delivery {
    pub changes: Vec<Change>,
    /// Nodes whose annotations could not be read (key: `node <name>`).
    pub bad: Vec<BadEntry>,
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

    /// Where the watch after the last listing starts.
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
                    reason: reason.to_string(),
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

    /// A node created or changed, as the watch tells it.
    pub fn applied(&mut self, node: &NodeObject) -> Delivery {
        let mut out = Delivery::default();
        self.update(node, &mut out);
        out
    }

    /// A node deleted, as the watch tells it.
    pub fn deleted(&mut self, node: &NodeObject) -> Delivery {
        let mut out = Delivery::default();
        self.forget(&node.metadata.name, &mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::kube::fixtures::*;
    use serde_json::{json, Value};

    fn parse(n: &str) -> NodeObject {
        serde_json::from_str(n).unwrap()
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
        let d = w.applied(&parse(&a_json("192.168.1.1", "x")));
        assert!(d.changes.is_empty());
        let d = w.applied(&parse(&a_json("192.168.1.9", "x")));
        assert_eq!(keys(&d), ["+10.5.1.0-24"]);
        // b becomes a lease when it is annotated.
        let b = flannel_node("b", "10.5.2.0/24", "192.168.1.2");
        let b_json = serde_json::to_string(&json!({
            "metadata": {"name": "b", "resourceVersion": "102", "annotations": b.metadata.annotations},
            "spec": {"podCIDR": "10.5.2.0/24"}
        }))
        .unwrap();
        assert_eq!(keys(&w.applied(&parse(&b_json))), ["+10.5.2.0-24"]);
        // A garbled annotation: logged with the node's name, the lease gone.
        let d = w.applied(&parse(&a_json("not-an-ip", "x")));
        assert_eq!(keys(&d), ["-10.5.1.0-24"]);
        assert_eq!(d.bad[0].key, "node a");
        assert!(d.bad[0].reason.contains("not-an-ip"));
        let d = w.deleted(&parse(&b_json));
        assert_eq!(keys(&d), ["-10.5.2.0-24"]);
        assert!(w.is_empty());
        // Where the next watch starts is the listing's, whatever the events said.
        assert_eq!(w.resource_version(), "100");
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
}
