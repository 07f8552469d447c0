//! What the enforcer knows of the cluster: every Namespace, Pod and NetworkPolicy as last
//! listed or watched, by namespace and name. Kept while the API server is unreachable, so that
//! what is enforced stays as it was.

use crate::model::{Namespace, NetworkPolicy, Pod};
use std::collections::BTreeMap;

/// (namespace, name).
pub type Key = (String, String);

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Objects {
    pub namespaces: BTreeMap<String, Namespace>,
    pub pods: BTreeMap<Key, Pod>,
    pub policies: BTreeMap<Key, NetworkPolicy>,
}

/// An object's key: its namespace and name.
pub fn key(meta: &crate::model::Meta) -> Key {
    (meta.namespace.clone(), meta.name.clone())
}

/// A change to one kind's objects, as a list or a watch brings it.
#[derive(Debug, Clone, PartialEq)]
pub enum Change<T> {
    /// Every object of the kind now: the ones known before are replaced.
    Listed(Vec<T>),
    Applied(T),
    Deleted(T),
}

/// Applies `change` to `map`; whether anything changed.
fn apply<K: Ord, T: PartialEq>(
    map: &mut BTreeMap<K, T>,
    change: Change<T>,
    key: impl Fn(&T) -> K,
) -> bool {
    match change {
        Change::Listed(items) => {
            let fresh: BTreeMap<K, T> = items.into_iter().map(|o| (key(&o), o)).collect();
            let changed = *map != fresh;
            *map = fresh;
            changed
        }
        Change::Applied(o) => {
            let k = key(&o);
            if map.get(&k) == Some(&o) {
                return false;
            }
            map.insert(k, o);
            true
        }
        Change::Deleted(o) => map.remove(&key(&o)).is_some(),
    }
}

impl Objects {
    pub fn namespaces_changed(&mut self, change: Change<Namespace>) -> bool {
        apply(&mut self.namespaces, change, |n| n.metadata.name.clone())
    }

    pub fn pods_changed(&mut self, change: Change<Pod>) -> bool {
        apply(&mut self.pods, change, |p| key(&p.metadata))
    }

    pub fn policies_changed(&mut self, change: Change<NetworkPolicy>) -> bool {
        apply(&mut self.policies, change, |p| key(&p.metadata))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, name: &str, rv: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.namespace = ns.into();
        p.metadata.name = name.into();
        p.metadata.resource_version = rv.into();
        p
    }

    #[test]
    fn a_listing_replaces_events_change_one_and_repeats_change_nothing() {
        let mut o = Objects::default();
        assert!(o.pods_changed(Change::Listed(vec![pod("x", "a", "1"), pod("x", "b", "1")])));
        assert!(!o.pods_changed(Change::Listed(vec![pod("x", "b", "1"), pod("x", "a", "1")])));
        assert!(o.pods_changed(Change::Applied(pod("y", "a", "2"))));
        assert!(!o.pods_changed(Change::Applied(pod("y", "a", "2"))));
        assert!(o.pods_changed(Change::Deleted(pod("x", "a", "3"))));
        assert!(!o.pods_changed(Change::Deleted(pod("x", "a", "3"))));
        assert_eq!(o.pods.len(), 2);
        assert!(o.pods_changed(Change::Listed(vec![])));
        assert!(o.pods.is_empty());
        let mut ns = Namespace::default();
        ns.metadata.name = "x".into();
        assert!(o.namespaces_changed(Change::Applied(ns.clone())));
        assert!(o.namespaces.contains_key("x"));
        assert!(o.namespaces_changed(Change::Deleted(ns)));
    }
}
