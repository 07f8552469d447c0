//! What this node knows of the other nodes' leases, kept from watch events and resyncs, and the
//! Added/Removed events the backends get. Pure: raw registry entries in, events out.

use crate::lease::{Lease, SubnetKey};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The leases are shared between this view and the backends, not copied: at thousands of
/// nodes each copy would cost megabytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A node's lease appeared, or its attributes changed.
    Added(Arc<Lease>),
    Removed(Arc<Lease>),
}

/// A raw entry of the registry that is not a lease, with the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadEntry {
    pub key: String,
    pub reason: String,
}

/// Says that an entry of the registry at `where_` is no lease, and is skipped: the daemon
/// never dies of bad data from outside.
pub fn warn_skipped(bad: &BadEntry, where_: &str) {
    tracing::warn!("skipping lease {} in {where_}: {}", bad.key, bad.reason);
}

/// What one change did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Outcome {
    pub events: Vec<Event>,
    pub bad: Vec<BadEntry>,
    /// This node's own lease is gone from the registry.
    pub own_removed: bool,
}

#[derive(Debug, Clone, Default)]
pub struct LeaseView {
    own: Option<SubnetKey>,
    known: BTreeMap<SubnetKey, Arc<Lease>>,
}

impl LeaseView {
    pub fn new(own: SubnetKey) -> LeaseView {
        LeaseView {
            own: Some(own),
            known: BTreeMap::new(),
        }
    }

    /// The other nodes' leases as known now.
    pub fn leases(&self) -> impl Iterator<Item = &Lease> {
        self.known.values().map(|l| &**l)
    }

    pub fn len(&self) -> usize {
        self.known.len()
    }

    pub fn is_empty(&self) -> bool {
        self.known.is_empty()
    }

    /// A key was written with `value`.
    pub fn put(&mut self, key: &str, value: &[u8]) -> Outcome {
        let mut out = Outcome::default();
        match Lease::decode(key, value) {
            Ok(lease) if Some(lease.key) == self.own => {}
            Ok(lease) => {
                if self.known.get(&lease.key).is_none_or(|k| **k != lease) {
                    let lease = Arc::new(lease);
                    self.known.insert(lease.key, lease.clone());
                    out.events.push(Event::Added(lease));
                }
            }
            Err(reason) => {
                // A lease overwritten with garbage is no longer a node we can reach.
                if let Ok(k) = SubnetKey::parse(key) {
                    if let Some(old) = self.known.remove(&k) {
                        out.events.push(Event::Removed(old));
                    }
                }
                out.bad.push(BadEntry {
                    key: key.to_string(),
                    reason: reason.to_string(),
                });
            }
        }
        out
    }

    /// A key was deleted (or expired).
    pub fn delete(&mut self, key: &str) -> Outcome {
        let mut out = Outcome::default();
        if let Ok(k) = SubnetKey::parse(key) {
            if Some(k) == self.own {
                out.own_removed = true;
            } else if let Some(old) = self.known.remove(&k) {
                out.events.push(Event::Removed(old));
            }
        }
        out
    }

    /// A full listing replaces what was known; the events are the difference.
    pub fn resync<'a>(
        &mut self,
        entries: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    ) -> Outcome {
        let mut out = Outcome::default();
        let mut listed = BTreeMap::new();
        let mut own_seen = false;
        for (key, value) in entries {
            match Lease::decode(key, value) {
                Ok(lease) if Some(lease.key) == self.own => own_seen = true,
                Ok(lease) => {
                    listed.insert(lease.key, Arc::new(lease));
                }
                Err(reason) => out.bad.push(BadEntry {
                    key: key.to_string(),
                    reason: reason.to_string(),
                }),
            }
        }
        for (k, old) in &self.known {
            if !listed.contains_key(k) {
                out.events.push(Event::Removed(old.clone()));
            }
        }
        for (k, lease) in &mut listed {
            match self.known.get(k) {
                // Unchanged: the copy already shared stays.
                Some(old) if old == lease => *lease = old.clone(),
                _ => out.events.push(Event::Added(lease.clone())),
            }
        }
        self.known = listed;
        out.own_removed = self.own.is_some() && !own_seen;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = r#"{"PublicIP":"192.168.0.1","PublicIPv6":null,"BackendType":"vxlan"}"#;
    const B: &str = r#"{"PublicIP":"192.168.0.2","PublicIPv6":null,"BackendType":"vxlan"}"#;
    const OWN: &str = r#"{"PublicIP":"192.168.0.9","PublicIPv6":null,"BackendType":"vxlan"}"#;

    fn view() -> LeaseView {
        LeaseView::new(SubnetKey::parse("10.5.9.0-24").unwrap())
    }

    fn keys(out: &Outcome) -> Vec<String> {
        out.events
            .iter()
            .map(|e| match e {
                Event::Added(l) => format!("+{}", l.key),
                Event::Removed(l) => format!("-{}", l.key),
            })
            .collect()
    }

    #[test]
    fn puts_and_deletes_of_other_nodes_become_events() {
        let mut v = view();
        assert_eq!(keys(&v.put("10.5.1.0-24", A.as_bytes())), ["+10.5.1.0-24"]);
        // A renewal with the same value is not news.
        assert!(v.put("10.5.1.0-24", A.as_bytes()).events.is_empty());
        // A changed value is.
        assert_eq!(keys(&v.put("10.5.1.0-24", B.as_bytes())), ["+10.5.1.0-24"]);
        assert_eq!(keys(&v.delete("10.5.1.0-24")), ["-10.5.1.0-24"]);
        assert!(v.delete("10.5.1.0-24").events.is_empty());
        assert!(v.is_empty());
    }

    #[test]
    fn the_own_lease_is_not_an_event_but_its_removal_is_reported() {
        let mut v = view();
        assert!(v.put("10.5.9.0-24", OWN.as_bytes()).events.is_empty());
        let out = v.delete("10.5.9.0-24");
        assert!(out.own_removed && out.events.is_empty());
    }

    #[test]
    fn bad_entries_are_reported_and_skipped() {
        let mut v = view();
        v.put("10.5.1.0-24", A.as_bytes());
        let out = v.put("10.5.2.0-24", b"{not json");
        assert_eq!(out.bad.len(), 1);
        assert_eq!(out.bad[0].key, "10.5.2.0-24");
        let out = v.put("banana", A.as_bytes());
        assert_eq!(out.bad[0].key, "banana");
        // A known lease overwritten with garbage is gone.
        assert_eq!(keys(&v.put("10.5.1.0-24", b"")), ["-10.5.1.0-24"]);
        assert!(v.is_empty());
    }

    #[test]
    fn a_resync_yields_the_difference() {
        let mut v = view();
        v.put("10.5.1.0-24", A.as_bytes());
        v.put("10.5.2.0-24", B.as_bytes());
        let out = v.resync([
            ("10.5.2.0-24", B.as_bytes()),
            ("10.5.3.0-24", A.as_bytes()),
            ("10.5.9.0-24", OWN.as_bytes()),
            ("10.5.4.0-24", &b"oops"[..]),
        ]);
        assert_eq!(keys(&out), ["-10.5.1.0-24", "+10.5.3.0-24"]);
        assert_eq!(out.bad.len(), 1);
        assert!(!out.own_removed);
        assert_eq!(v.len(), 2);
        let out = v.resync([("10.5.2.0-24", B.as_bytes())]);
        assert!(out.own_removed);
        assert_eq!(keys(&out), ["-10.5.3.0-24"]);
    }
}
