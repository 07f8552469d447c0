//! What this node writes with a strategic-merge PATCH of `nodes/<name>/status`: its
//! annotations as flanneld writes them, and the `NetworkUnavailable` condition.

use super::node::{Annotations, NodeObject};
use crate::lease::{Annotated, Ipv6Annotated, LeaseAttrs};
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::net::Ipv4Addr;

/// The strategic-merge PATCH of `nodes/<name>/status` that makes this node's annotations say
/// `attrs` (the families `annotated`, as the lease's backend says), as flanneld decides it:
/// None when they already do. Only the annotations that change are in the body; a user's
/// `public-ip-overwrite` wins over the public address.
pub fn annotation_patch(
    node: &NodeObject,
    attrs: &LeaseAttrs,
    annotated: Annotated,
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
    if !annotated.ipv4_needs_data || bd != "null" {
        want.insert(&names.backend_data, bd);
        let public = if overwrite.is_empty() {
            ip
        } else {
            overwrite.to_string()
        };
        want.insert(&names.public_ip, public);
    }
    let v6_written = match annotated.ipv6 {
        Ipv6Annotated::WithData => v6bd != "null" && ip6.is_some(),
        Ipv6Annotated::WithAddress => ip6.is_some(),
        Ipv6Annotated::Never => false,
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

#[cfg(test)]
mod tests {
    use super::super::node::{node_lease, node_public_ips, own_attrs, Families};
    use super::*;
    use crate::registry::kube::fixtures::*;

    fn attrs(kind: &str, data: Option<&str>, ip: &str) -> LeaseAttrs {
        LeaseAttrs {
            public_ip: Some(ip.parse().unwrap()),
            public_ipv6: None,
            backend_type: kind.into(),
            backend_data: data.map(|d| RawValue::from_string(d.into()).unwrap()),
            backend_v6_data: None,
        }
    }

    /// vxlan's and host-gw's, as their backends say.
    const VXLAN: Annotated = Annotated {
        ipv4_needs_data: true,
        ipv6: Ipv6Annotated::WithData,
    };
    const HOST_GW: Annotated = Annotated {
        ipv4_needs_data: false,
        ipv6: Ipv6Annotated::WithAddress,
    };

    #[test]
    fn the_annotation_patch_writes_what_flanneld_writes_and_only_what_changed() {
        let a = names();
        let data = format!(r#"{{"VNI":1,"VtepMAC":"{MAC}"}}"#);
        let fresh = node(
            "n1",
            &["10.5.1.0/24"],
            json!({"node.alpha.kubernetes.io/ttl": "0"}),
        );
        let patch = annotation_patch(
            &fresh,
            &attrs("vxlan", Some(&data), "192.168.1.1"),
            VXLAN,
            &a,
        );
        assert_eq!(
            patch.unwrap().to_string(),
            format!(
                r#"{{"metadata":{{"annotations":{{"flannel.alpha.coreos.com/backend-data":"{{\"VNI\":1,\"VtepMAC\":\"{MAC}\"}}","flannel.alpha.coreos.com/backend-type":"vxlan","flannel.alpha.coreos.com/kube-subnet-manager":"true","flannel.alpha.coreos.com/public-ip":"192.168.1.1"}}}}}}"#
            )
        );
        // Already so: nothing to write.
        let done = flannel_node("n1", "10.5.1.0/24", "192.168.1.1");
        assert_eq!(
            annotation_patch(
                &done,
                &attrs("vxlan", Some(&data), "192.168.1.1"),
                VXLAN,
                &a
            ),
            None
        );
        // A new address: only that annotation.
        let p = annotation_patch(
            &done,
            &attrs("vxlan", Some(&data), "192.168.1.9"),
            VXLAN,
            &a,
        )
        .unwrap();
        assert_eq!(
            p,
            json!({"metadata": {"annotations": {"flannel.alpha.coreos.com/public-ip": "192.168.1.9"}}})
        );
        // host-gw writes its data as "null".
        let p =
            annotation_patch(&fresh, &attrs("host-gw", None, "192.168.1.1"), HOST_GW, &a).unwrap();
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
        let p =
            annotation_patch(&n, &attrs("vxlan", Some(&data), "192.168.1.1"), VXLAN, &a).unwrap();
        assert_eq!(p["metadata"]["annotations"][&a.public_ip], "203.0.113.7");
        // Once written, flanneld's check still differs (it compares with its own address) but
        // the patch is empty: nothing is sent.
        n.metadata
            .annotations
            .insert(a.public_ip.clone(), "203.0.113.7".into());
        assert_eq!(
            annotation_patch(&n, &attrs("vxlan", Some(&data), "192.168.1.1"), VXLAN, &a),
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
        let p = annotation_patch(&n, &at, VXLAN, &a).unwrap();
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
        assert_eq!(annotation_patch(&written, &at, VXLAN, &a), None);
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
}
