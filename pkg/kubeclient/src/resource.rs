//! What is asked for: a kind of object (where its collection lives in the API), which of its
//! objects (a namespace, label and field selectors), and the type an object is read into.

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};

/// A kind of object, by where its collection lives in the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kind {
    /// The path of its group and version: `/api/v1`, `/apis/networking.k8s.io/v1`.
    pub group_path: &'static str,
    /// Its plural, which is also RBAC's name of the resource: `nodes`.
    pub plural: &'static str,
    /// Whether its objects live in namespaces.
    pub namespaced: bool,
}

pub const NODES: Kind = Kind {
    group_path: "/api/v1",
    plural: "nodes",
    namespaced: false,
};
pub const PODS: Kind = Kind {
    group_path: "/api/v1",
    plural: "pods",
    namespaced: true,
};
pub const NAMESPACES: Kind = Kind {
    group_path: "/api/v1",
    plural: "namespaces",
    namespaced: false,
};
pub const NETWORK_POLICIES: Kind = Kind {
    group_path: "/apis/networking.k8s.io/v1",
    plural: "networkpolicies",
    namespaced: true,
};

impl Kind {
    /// The URL path of its collection: in `namespace` (a namespaced kind), else in all.
    pub fn collection(&self, namespace: Option<&str>) -> String {
        match namespace.filter(|_| self.namespaced) {
            Some(ns) => format!("{}/namespaces/{ns}/{}", self.group_path, self.plural),
            None => format!("{}/{}", self.group_path, self.plural),
        }
    }
}

/// Which objects of a kind a list or a watch is about.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    /// For a namespaced kind, one namespace; None for all of them.
    pub namespace: Option<String>,
    /// `labelSelector`: `app=web,tier!=db`.
    pub labels: Option<String>,
    /// `fieldSelector`: `spec.nodeName=node1`.
    pub fields: Option<String>,
}

impl Selector {
    /// Every object of the kind.
    pub fn all() -> Selector {
        Selector::default()
    }

    /// The objects whose fields match `selector` (`spec.nodeName=node1`).
    pub fn fields(selector: impl Into<String>) -> Selector {
        Selector {
            fields: Some(selector.into()),
            ..Selector::default()
        }
    }
}

/// An object as it is read from the API: a type of the caller's (only the fields it needs,
/// the rest skipped unread), a k8s-openapi type, or a `serde_json::Value`. A watch resumes
/// from the resourceVersion of the last object it delivered.
pub trait Object: DeserializeOwned + Send + 'static {
    /// Fields this type never reads, as paths of one or two keys (`status`,
    /// `metadata.managedFields`): a list cuts them out of each object before it is parsed.
    const UNREAD: &'static [&'static str] = &[];

    /// `metadata.resourceVersion`; empty when the object has none.
    fn resource_version(&self) -> &str;
}

impl Object for serde_json::Value {
    fn resource_version(&self) -> &str {
        self["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default()
    }
}

macro_rules! typed_objects {
    ($($t:ty),*) => {$(
        impl Object for $t {
            fn resource_version(&self) -> &str {
                self.metadata.resource_version.as_deref().unwrap_or_default()
            }
        }
    )*};
}

typed_objects!(Node, Pod, Namespace, NetworkPolicy);

/// For a field the API may send as `null`: its default then, as Go's decoder gives it.
pub fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_collection_is_in_one_namespace_or_in_all() {
        assert_eq!(NODES.collection(None), "/api/v1/nodes");
        assert_eq!(NODES.collection(Some("x")), "/api/v1/nodes");
        assert_eq!(PODS.collection(None), "/api/v1/pods");
        assert_eq!(
            PODS.collection(Some("kube-system")),
            "/api/v1/namespaces/kube-system/pods"
        );
        assert_eq!(
            NETWORK_POLICIES.collection(Some("x")),
            "/apis/networking.k8s.io/v1/namespaces/x/networkpolicies"
        );
    }

    #[test]
    fn the_resource_version_of_any_form_of_object() {
        let v = serde_json::json!({"metadata": {"name": "a", "resourceVersion": "42"}});
        assert_eq!(v.resource_version(), "42");
        let pod: Pod = serde_json::from_value(v).unwrap();
        assert_eq!(pod.resource_version(), "42");
        assert_eq!(serde_json::json!({}).resource_version(), "");
    }
}
