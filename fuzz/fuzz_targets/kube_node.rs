//! A Node object as the Kubernetes API sends it (or a broken one), read as flanneld's kube mode
//! reads other nodes and its own. Properties: nothing panics; a lease read from a node encodes
//! to a value that decodes to the same lease; the annotations flanneld would write, once
//! written, need no further write and read back as the same lease; a node added then deleted
//! leaves the watch's state empty.
#![no_main]

use flanneld::lease::{Annotated, Ipv6Annotated, LeaseAttrs, SubnetKey};
use flanneld::registry::kube::{
    annotation_patch, node_lease, own_attrs, own_subnet, pod_cidrs, Annotations, Families,
    NodeObject, NodeWatch,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(node) = serde_json::from_slice::<NodeObject>(data) else {
        return;
    };
    let names = Annotations::new("flannel.alpha.coreos.com").expect("the default prefix");
    let _ = pod_cidrs(&node.spec);
    let _ = own_attrs(&node, &names);
    for cfg in [
        r#"{"Network":"10.244.0.0/16"}"#,
        r#"{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00::/56"}"#,
    ] {
        let cfg = flanneld::config::parse(cfg).expect("a valid network config");
        let _ = own_subnet(&node, &cfg);
    }
    for families in [
        Families {
            ipv4: true,
            ipv6: false,
        },
        Families {
            ipv4: true,
            ipv6: true,
        },
        Families {
            ipv4: false,
            ipv6: true,
        },
    ] {
        let Ok(Some(lease)) = node_lease(&node, &names, families) else {
            continue;
        };
        let value = lease.attrs.encode();
        let back = LeaseAttrs::decode(value.as_bytes())
            .unwrap_or_else(|e| panic!("{value} does not decode: {e}"));
        assert_eq!(back, lease.attrs, "{value}");
        let key = lease.key.to_string();
        assert_eq!(SubnetKey::parse(&key).ok(), Some(lease.key), "{key}");

        // Written as flanneld writes them, whichever families the backend annotates, the
        // annotations need no second write.
        for ipv4_needs_data in [false, true] {
            for ipv6 in [
                Ipv6Annotated::Never,
                Ipv6Annotated::WithAddress,
                Ipv6Annotated::WithData,
            ] {
                let annotated = Annotated {
                    ipv4_needs_data,
                    ipv6,
                };
                let Some(patch) = annotation_patch(&node, &lease.attrs, annotated, &names) else {
                    continue;
                };
                let mut written = node.clone();
                for (k, v) in patch["metadata"]["annotations"]
                    .as_object()
                    .into_iter()
                    .flatten()
                {
                    written
                        .metadata
                        .annotations
                        .insert(k.clone(), v.as_str().unwrap_or_default().to_string());
                }
                assert_eq!(
                    annotation_patch(&written, &lease.attrs, annotated, &names),
                    None,
                    "a second write after {patch}"
                );
            }
        }
    }
    let mut w = NodeWatch::new(
        names,
        Families {
            ipv4: true,
            ipv6: false,
        },
    );
    let _ = w.applied(&node);
    let _ = w.deleted(&node);
    assert!(w.is_empty(), "a deleted node left a lease");
});
