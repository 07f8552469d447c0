//! The other nodes as leases between a list and the watch that follows it.

use super::node::{node_entry, Annotations, Families, NodeObject};
use crate::registry::{Change, Entry};
use crate::view::BadEntry;
use kube::core::WatchEvent;
use std::collections::HashMap;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::kube::fixtures::*;
    use serde_json::{json, Value};

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
}
