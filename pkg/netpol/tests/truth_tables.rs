//! The truth tables of Kubernetes' NetworkPolicy e2e suite (test/e2e/network/netpol), ported:
//! each case's policies created in the API server stand-in, then its expected reachability
//! checked as a full probe matrix (every pod of x, y, z to every other, loopback left out) on
//! the three-node cluster, with flannel-netpol on every node. The e2e suite's cases use a few
//! of the nine pods each; here every case runs on all nine, its expectations extended to them
//! by what the policies say. Cases are grouped per cluster, each group a test; between cases
//! every policy is deleted, as the suite's cleanup does. Each change is checked only once every
//! enforcer has applied it (their applied resourceVersion), so that a table that holds before
//! the change cannot pass for one that holds after it.

mod common;

use common::*;
use serde_json::{json, Value};
use testkit::cluster::Underlay;
use testkit::probe::Proto::{Tcp, Udp};

const VXLAN: &str = r#"{"Type":"vxlan"}"#;
const HOST_GW: &str = r#"{"Type":"host-gw"}"#;
const NS_LABEL: &str = "kubernetes.io/metadata.name";

fn pod_a() -> Value {
    json!({"matchLabels": {"pod": "a"}})
}

fn labels(k: &str, v: &str) -> Value {
    json!({"matchLabels": {k: v}})
}

fn ns_is(ns: &str) -> Value {
    labels(NS_LABEL, ns)
}

fn ns_not_in(ns: &str) -> Value {
    json!({"matchExpressions": [{"key": NS_LABEL, "operator": "NotIn", "values": [ns]}]})
}

#[test]
fn ingress_by_pod_and_namespace_selectors() {
    let w = World::new("npi", 121, VXLAN, Underlay::V4, &[]);
    w.expect("before any policy", Tcp, 80, &Reach::all(true));

    // should support a 'default-deny-ingress' policy
    w.policy("x", "deny-ingress", json!({"podSelector": {}}));
    w.expect(
        "default-deny-ingress",
        Tcp,
        80,
        &Reach::all(true).peer("*", "x/*", false),
    );
    w.clean();

    // should enforce policy to allow traffic from pods within server namespace based on PodSelector
    w.policy(
        "x",
        "x-a-allows-x-b",
        json!({"podSelector": pod_a(),
        "ingress": [{"from": [{"podSelector": labels("pod", "b")}]}]}),
    );
    let a_from_x_b = Reach::all(true)
        .peer("*", "x/a", false)
        .peer("x/b", "x/a", true);
    w.expect("allow from x/b", Tcp, 80, &a_from_x_b);
    w.clean();

    // should enforce policy based on PodSelector with MatchExpressions
    w.policy(
        "x",
        "x-a-allows-x-b",
        json!({"podSelector": pod_a(),
        "ingress": [{"from": [{"podSelector": {"matchExpressions": [
            {"key": "pod", "operator": "In", "values": ["b"]}]}}]}]}),
    );
    w.expect("allow from pod In [b]", Tcp, 80, &a_from_x_b);
    w.clean();

    // should enforce policy to allow ingress traffic for a target
    w.policy("x", "deny-all", json!({"podSelector": {}}));
    w.policy(
        "x",
        "allow-all-to-a",
        json!({"podSelector": pod_a(),
        "ingress": [{"from": [{"podSelector": {}, "namespaceSelector": {}}]}]}),
    );
    w.expect(
        "deny x, allow all to x/a",
        Tcp,
        80,
        &Reach::all(true)
            .peer("*", "x/*", false)
            .peer("*", "x/a", true),
    );
    w.clean();

    // should enforce policy to allow ingress traffic from pods in all namespaces
    w.policy(
        "x",
        "allow-from-another-ns",
        json!({"podSelector": pod_a(),
        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {}}}]}]}),
    );
    w.expect("allow from all namespaces", Tcp, 80, &Reach::all(true));
    w.clean();

    // should enforce policy to allow traffic only from a different namespace, based on
    // NamespaceSelector; the same with MatchExpressions; and with the default namespace label
    let from_y = Reach::all(true)
        .peer("x/*", "x/a", false)
        .peer("z/*", "x/a", false);
    for (what, sel) in [
        ("from namespace y by matchLabels", ns_is("y")),
        (
            "from namespace y by matchExpressions",
            json!({"matchExpressions": [{"key": NS_LABEL, "operator": "In", "values": ["y"]}]}),
        ),
    ] {
        w.policy(
            "x",
            "allow-client-a-via-ns-selector",
            json!({"podSelector": pod_a(),
            "ingress": [{"from": [{"namespaceSelector": sel}]}]}),
        );
        w.expect(what, Tcp, 80, &from_y);
        w.clean();
    }

    // should enforce policy based on PodSelector or NamespaceSelector
    w.policy(
        "x",
        "allow-ns-y-match-selector",
        json!({"podSelector": pod_a(),
        "ingress": [{"from": [{"namespaceSelector": ns_not_in("x")},
                              {"podSelector": labels("pod", "b")}]}]}),
    );
    w.expect(
        "from other namespaces or x/b",
        Tcp,
        80,
        &Reach::all(true).peer("x/c", "x/a", false),
    );
    w.clean();

    // should enforce policy based on PodSelector and NamespaceSelector
    w.policy(
        "x",
        "allow-ns-y-podselector-and-nsselector",
        json!({"podSelector": pod_a(),
        "ingress": [{"from": [{"namespaceSelector": ns_not_in("x"),
                               "podSelector": labels("pod", "b")}]}]}),
    );
    w.expect(
        "from pods b of other namespaces",
        Tcp,
        80,
        &Reach::all(true)
            .peer("*", "x/a", false)
            .peer("y/b", "x/a", true)
            .peer("z/b", "x/a", true),
    );
    w.clean();

    // should enforce policy based on Multiple PodSelectors and NamespaceSelectors
    w.policy("x", "allow-ns-y-z-pod-b-c", json!({"podSelector": pod_a(),
        "ingress": [{"from": [{"namespaceSelector": ns_not_in("x"),
            "podSelector": {"matchExpressions": [{"key": "pod", "operator": "In", "values": ["b", "c"]}]}}]}]}));
    w.expect(
        "from pods b and c of other namespaces",
        Tcp,
        80,
        &Reach::all(true)
            .peer("x/*", "x/a", false)
            .peer("*/a", "x/a", false),
    );
    w.clean();

    // should enforce policy based on any PodSelectors
    w.policy("x", "allow-ns-x-pod-b-c", json!({"podSelector": pod_a(),
        "ingress": [{"from": [{"podSelector": labels("pod", "b")}, {"podSelector": labels("pod", "c")}]}]}));
    w.expect(
        "from x/b or x/c",
        Tcp,
        80,
        &Reach::all(true)
            .peer("*", "x/a", false)
            .peer("x/b", "x/a", true)
            .peer("x/c", "x/a", true),
    );
    w.clean();

    // should enforce policy to allow traffic only from a pod in a different namespace based on
    // PodSelector and NamespaceSelector
    w.policy(
        "x",
        "allow-ns-y-pod-a-via-namespace-pod-selector",
        json!({"podSelector": pod_a(),
        "ingress": [{"from": [{"namespaceSelector": ns_is("y"), "podSelector": pod_a()}]}]}),
    );
    w.expect(
        "from y/a only",
        Tcp,
        80,
        &Reach::all(true)
            .peer("*", "x/a", false)
            .peer("y/a", "x/a", true),
    );
    w.clean();

    // should deny ingress from pods on other namespaces
    w.policy(
        "x",
        "deny-empty-policy",
        json!({"podSelector": {},
        "ingress": [{"from": [{"podSelector": {"matchLabels": {}}}]}]}),
    );
    w.expect(
        "from x only",
        Tcp,
        80,
        &Reach::all(true)
            .peer("y/*", "x/*", false)
            .peer("z/*", "x/*", false),
    );
    w.clean();
}

#[test]
fn ports_named_ports_port_ranges_and_protocols_dual_stack() {
    let w = World::new("npp", 122, VXLAN, Underlay::Dual, &[]);

    // should enforce policy based on Ports (from y, TCP 81 only)
    let from_y_81 = json!({"podSelector": pod_a(), "ingress": [{"from": [{"namespaceSelector": ns_is("y")}],
        "ports": [{"port": 81, "protocol": "TCP"}]}]});
    w.policy("x", "allow-client-a-via-ns-selector", from_y_81.clone());
    let y_only = Reach::all(true)
        .peer("x/*", "x/a", false)
        .peer("z/*", "x/a", false);
    w.expect("from y on 81", Tcp, 81, &y_only);
    // should enforce multiple, stacked policies with overlapping podSelectors
    w.expect(
        "from y on 81: port 80 closed",
        Tcp,
        80,
        &Reach::all(true).peer("*", "x/a", false),
    );
    w.policy("x", "allow-client-a-via-ns-selector-80", json!({"podSelector": pod_a(),
        "ingress": [{"from": [{"namespaceSelector": ns_is("y")}], "ports": [{"port": 80, "protocol": "TCP"}]}]}));
    w.expect("a second policy opens 80 to y", Tcp, 80, &y_only);
    w.clean();

    // should support allow-all policy
    w.policy(
        "x",
        "allow-all",
        json!({"podSelector": {}, "ingress": [{}]}),
    );
    w.expect("allow-all on 80", Tcp, 80, &Reach::all(true));
    w.expect("allow-all on 81", Tcp, 81, &Reach::all(true));
    w.clean();

    // should allow ingress access on one named port
    w.policy(
        "x",
        "allow-all",
        json!({"podSelector": {}, "ingress": [{"ports": [{"port": "serve-81-tcp"}]}]}),
    );
    w.expect("serve-81-tcp open", Tcp, 81, &Reach::all(true));
    w.expect(
        "80 closed",
        Tcp,
        80,
        &Reach::all(true).peer("*", "x/*", false),
    );
    w.clean();

    // should allow ingress access from namespace on one named port
    w.policy(
        "x",
        "allow-client-a-via-ns-selector-80",
        json!({"podSelector": pod_a(),
        "ingress": [{"from": [{"namespaceSelector": ns_is("y")}],
                     "ports": [{"port": "serve-80-tcp", "protocol": "TCP"}]}]}),
    );
    w.expect("serve-80-tcp from y", Tcp, 80, &y_only);
    w.expect(
        "81 closed",
        Tcp,
        81,
        &Reach::all(true).peer("*", "x/a", false),
    );
    w.clean();

    // endPort: a range of ports, and a range beside the port
    w.policy(
        "x",
        "allow-80-81",
        json!({"podSelector": pod_a(),
        "ingress": [{"ports": [{"port": 80, "endPort": 81, "protocol": "TCP"}]}]}),
    );
    w.expect("80-81: 80", Tcp, 80, &Reach::all(true));
    w.expect("80-81: 81", Tcp, 81, &Reach::all(true));
    w.expect(
        "80-81 is TCP",
        Udp,
        80,
        &Reach::all(true).peer("*", "x/a", false),
    );
    w.policy(
        "x",
        "allow-80-81",
        json!({"podSelector": pod_a(),
        "ingress": [{"ports": [{"port": 81, "endPort": 1000, "protocol": "UDP"}]}]}),
    );
    w.expect("UDP 81-1000: 81", Udp, 81, &Reach::all(true));
    w.expect(
        "UDP 81-1000: 80",
        Udp,
        80,
        &Reach::all(true).peer("*", "x/a", false),
    );
    w.clean();

    // should enforce ingress policy allowing any port traffic to a server on a specific protocol
    w.policy(
        "x",
        "allow-ingress-by-proto",
        json!({"podSelector": pod_a(),
        "ingress": [{"ports": [{"protocol": "TCP"}]}]}),
    );
    w.expect("TCP, any port", Tcp, 80, &Reach::all(true));
    w.expect(
        "not UDP",
        Udp,
        80,
        &Reach::all(true).peer("*", "x/a", false),
    );
    w.clean();

    // should enforce multiple ingress policies with ingress allow-all policy taking precedence
    w.policy(
        "x",
        "allow-ingress-port-80",
        json!({"podSelector": {}, "ingress": [{"ports": [{"port": 80}]}]}),
    );
    w.expect(
        "only 80",
        Tcp,
        81,
        &Reach::all(true).peer("*", "x/*", false),
    );
    w.policy(
        "x",
        "allow-ingress",
        json!({"podSelector": {}, "ingress": [{}]}),
    );
    w.expect("allow-all beside it", Tcp, 81, &Reach::all(true));
    w.clean();

    // should not mistakenly treat 'protocol: SCTP' as 'protocol: TCP', even if the plugin
    // doesn't support SCTP
    w.policy("x", "deny-ingress", json!({"podSelector": {}}));
    w.policy(
        "x",
        "allow-only-sctp-ingress-on-port-81",
        json!({"podSelector": pod_a(),
        "ingress": [{"ports": [{"port": 81, "protocol": "SCTP"}]}]}),
    );
    w.expect(
        "SCTP 81 is not TCP 81",
        Tcp,
        81,
        &Reach::all(true).peer("*", "x/*", false),
    );
    w.clean();

    // should properly isolate pods that are selected by a policy allowing SCTP
    w.policy(
        "x",
        "allow-only-sctp-ingress-on-port-80",
        json!({"podSelector": pod_a(),
        "ingress": [{"ports": [{"port": 80, "protocol": "SCTP"}]}]}),
    );
    w.expect(
        "isolated by an SCTP rule",
        Tcp,
        81,
        &Reach::all(true).peer("*", "x/a", false),
    );
    w.clean();

    // should not allow access by TCP when a policy specifies only UDP
    w.policy(
        "x",
        "allow-only-udp-ingress-on-port-81",
        json!({"podSelector": pod_a(),
        "ingress": [{"ports": [{"port": 81, "protocol": "UDP"}]}]}),
    );
    w.expect(
        "UDP 81 is not TCP 81",
        Tcp,
        81,
        &Reach::all(true).peer("*", "x/a", false),
    );
    w.expect("UDP 81 is UDP 81", Udp, 81, &Reach::all(true));
    w.clean();

    // UDP: should support a 'default-deny-ingress' policy
    w.policy("x", "deny-all", json!({"podSelector": {}}));
    w.expect(
        "UDP default-deny-ingress",
        Udp,
        80,
        &Reach::all(true).peer("*", "x/*", false),
    );
    w.clean();

    // UDP: should enforce policy based on Ports
    w.policy("x", "allow-ingress-on-port-81-ns-x", json!({"podSelector": pod_a(),
        "ingress": [{"from": [{"namespaceSelector": ns_is("y")}], "ports": [{"port": 81, "protocol": "UDP"}]}]}));
    w.expect("UDP 81 from y", Udp, 81, &y_only);
    w.clean();

    // UDP: should enforce policy to allow traffic only from a pod in a different namespace
    // based on PodSelector and NamespaceSelector
    w.policy(
        "x",
        "allow-ns-y-pod-a-via-namespace-pod-selector",
        json!({"podSelector": pod_a(),
        "ingress": [{"from": [{"namespaceSelector": ns_is("y"), "podSelector": pod_a()}]}]}),
    );
    w.expect(
        "UDP from y/a only",
        Udp,
        80,
        &Reach::all(true)
            .peer("*", "x/a", false)
            .peer("y/a", "x/a", true),
    );
    w.clean();
}

#[test]
fn egress_and_both_directions_dual_stack() {
    let w = World::new("npe", 123, VXLAN, Underlay::Dual, &[]);

    // should support a 'default-deny-all' policy
    w.policy(
        "x",
        "deny-all",
        json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
    );
    let x_cut_off = Reach::all(true)
        .peer("*", "x/*", false)
        .peer("x/*", "*", false);
    w.expect("default-deny-all", Tcp, 80, &x_cut_off);
    // should stop enforcing policies after they are deleted
    w.delete_policy("x", "deny-all");
    w.expect("deleted", Tcp, 80, &Reach::all(true));

    // should allow egress access on one named port
    w.policy(
        "x",
        "allow-egress",
        json!({"podSelector": {}, "policyTypes": ["Egress"],
        "egress": [{"ports": [{"port": "serve-80-tcp"}]}]}),
    );
    w.expect("egress on serve-80-tcp", Tcp, 80, &Reach::all(true));
    w.expect(
        "not on 81",
        Tcp,
        81,
        &Reach::all(true).peer("x/*", "*", false),
    );
    w.clean();

    // should deny egress from pods based on PodSelector
    w.policy(
        "x",
        "deny-egress-pod-a",
        json!({"podSelector": pod_a(), "policyTypes": ["Egress"]}),
    );
    w.expect(
        "x/a cannot send",
        Tcp,
        80,
        &Reach::all(true).peer("x/a", "*", false),
    );
    w.clean();

    // should deny egress from all pods in a namespace
    w.policy(
        "x",
        "deny-egress-ns-x",
        json!({"podSelector": {}, "policyTypes": ["Egress"]}),
    );
    w.expect(
        "x cannot send",
        Tcp,
        80,
        &Reach::all(true).peer("x/*", "*", false),
    );
    w.clean();

    // should work with Ingress, Egress specified together
    w.policy(
        "x",
        "allow-client-a-via-pod-selector",
        json!({"podSelector": pod_a(),
        "policyTypes": ["Egress", "Ingress"],
        "ingress": [{"from": [{"podSelector": labels("pod", "b")}]}],
        "egress": [{"ports": [{"port": 80}]}]}),
    );
    let from_x_b = Reach::all(true)
        .peer("*", "x/a", false)
        .peer("x/b", "x/a", true);
    w.expect("both, on 80", Tcp, 80, &from_x_b);
    w.expect(
        "both, on 81",
        Tcp,
        81,
        &Reach::all(true)
            .peer("*", "x/a", false)
            .peer("x/a", "*", false)
            .peer("x/b", "x/a", true),
    );
    w.clean();

    // should support denying of egress traffic on the client side (even if the server
    // explicitly allows this traffic)
    w.policy(
        "x",
        "allow-to-ns-y-pod-a",
        json!({"podSelector": pod_a(), "policyTypes": ["Egress"],
        "egress": [{"to": [{"namespaceSelector": ns_is("y"), "podSelector": pod_a()}]}]}),
    );
    let from_x_a = json!([{"from": [{"namespaceSelector": ns_is("x"), "podSelector": pod_a()}]}]);
    w.policy(
        "y",
        "allow-from-xa-on-ya-match-selector",
        json!({"podSelector": pod_a(), "ingress": from_x_a}),
    );
    w.policy(
        "y",
        "allow-from-xa-on-yb-match-selector",
        json!({"podSelector": labels("pod", "b"), "ingress": from_x_a}),
    );
    w.expect(
        "x/a to y/a only; y/a and y/b from x/a only",
        Tcp,
        80,
        &Reach::all(true)
            .peer("x/a", "*", false)
            .peer("*", "y/a", false)
            .peer("x/a", "y/a", true)
            .peer("*", "y/b", false),
    );
    w.clean();

    // should enforce egress policy allowing traffic to a server in a different namespace
    // based on PodSelector and NamespaceSelector
    w.policy(
        "x",
        "allow-to-ns-y-pod-a",
        json!({"podSelector": pod_a(), "policyTypes": ["Egress"],
        "egress": [{"to": [{"namespaceSelector": ns_is("y"), "podSelector": pod_a()}]}]}),
    );
    w.expect(
        "x/a to y/a only",
        Tcp,
        80,
        &Reach::all(true)
            .peer("x/a", "*", false)
            .peer("x/a", "y/a", true),
    );
    w.clean();

    // should enforce multiple egress policies with egress allow-all policy taking precedence
    w.policy(
        "x",
        "allow-egress-port-80",
        json!({"podSelector": {}, "policyTypes": ["Egress"],
        "egress": [{"ports": [{"port": 80}]}]}),
    );
    w.expect(
        "egress only to 80",
        Tcp,
        81,
        &Reach::all(true).peer("x/*", "*", false),
    );
    w.policy(
        "x",
        "allow-egress",
        json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": [{}]}),
    );
    w.expect("allow-all egress beside it", Tcp, 81, &Reach::all(true));
    w.clean();

    // should enforce policies to check ingress and egress policies can be controlled
    // independently based on PodSelector
    w.policy(
        "x",
        "allow-egress-for-target",
        json!({"podSelector": pod_a(), "policyTypes": ["Egress"],
        "egress": [{}]}),
    );
    w.expect("egress allowed to all", Tcp, 80, &Reach::all(true));
    w.policy(
        "x",
        "deny-ingress-via-label-selector",
        json!({"podSelector": pod_a(),
        "policyTypes": ["Ingress"]}),
    );
    w.expect(
        "ingress denied apart",
        Tcp,
        80,
        &Reach::all(true).peer("*", "x/a", false),
    );
    w.clean();

    // should enforce policy based on NamespaceSelector with MatchExpressions using default ns
    // label (egress)
    w.policy(
        "x",
        "allow-ns-y-match-selector-for-immutable-ns-label",
        json!({"podSelector": pod_a(),
        "policyTypes": ["Egress"], "egress": [{"to": [{"namespaceSelector": ns_not_in("y")}]}]}),
    );
    w.expect(
        "x/a not to y",
        Tcp,
        80,
        &Reach::all(true).peer("x/a", "y/*", false),
    );
    w.clean();
}

#[test]
fn named_ports_resolve_on_each_destination_pod() {
    // y/a calls its port 81 serve-80-tcp: egress to serve-80-tcp means 81 there, 80 elsewhere;
    // ingress to y/a on serve-80-tcp means 81.
    let w = World::new("npn", 124, VXLAN, Underlay::V4, &[]);
    w.cluster
        .kube()
        .delete(testkit::kube_api::Kind::Pod, "y", "a")
        .unwrap();
    let ya = w.pod("y/a");
    let ips: Vec<Value> = ya.ips.iter().map(|ip| json!({"ip": ip})).collect();
    let api = w.cluster.kube();
    api.create(
        testkit::kube_api::Kind::Pod,
        "y",
        json!({"metadata": {"name": "a", "labels": {"pod": "a"}},
        "spec": {"nodeName": "node1", "containers": [{"name": "c", "ports": [
            {"name": "serve-80-tcp", "containerPort": 81, "protocol": "TCP"}]}]}}),
    )
    .unwrap();
    let p = api
        .patch(
            testkit::kube_api::Kind::Pod,
            "y",
            "a",
            true,
            &json!({"status": {"phase": "Running", "podIP": ya.ip, "podIPs": ips}}),
        )
        .unwrap();
    w.settle(version(&p));
    w.policy(
        "x",
        "allow-egress",
        json!({"podSelector": {}, "policyTypes": ["Egress"],
        "egress": [{"ports": [{"port": "serve-80-tcp"}]}]}),
    );
    w.expect(
        "to y/a on 81",
        Tcp,
        81,
        &Reach::all(true)
            .peer("x/*", "*", false)
            .peer("x/*", "y/a", true),
    );
    w.expect(
        "to the others on 80",
        Tcp,
        80,
        &Reach::all(true).peer("x/*", "y/a", false),
    );
    w.clean();
    w.policy(
        "y",
        "allow-named",
        json!({"podSelector": pod_a(),
        "ingress": [{"ports": [{"port": "serve-80-tcp"}]}]}),
    );
    w.expect("y/a admits 81", Tcp, 81, &Reach::all(true));
    w.expect(
        "y/a admits nothing on 80",
        Tcp,
        80,
        &Reach::all(true).peer("*", "y/a", false),
    );
}

#[test]
fn ip_blocks_with_except_on_pod_addresses_dual_stack() {
    let w = World::new("npb", 125, VXLAN, Underlay::Dual, &[]);
    let host = |pod: &str| -> Vec<Value> {
        w.families
            .iter()
            .map(|f| {
                let a = w.addr(pod, *f);
                let len = if a.is_ipv4() { 32 } else { 128 };
                json!({"ipBlock": {"cidr": format!("{a}/{len}")}})
            })
            .collect()
    };
    // The /4 around a pod's address, less the address itself.
    let around = |pod: &str| -> Vec<Value> {
        w.families
            .iter()
            .map(|f| {
                let a = w.addr(pod, *f);
                let (cidr, len) = match a {
                    std::net::IpAddr::V4(v) => (format!("{}.0.0.0/4", v.octets()[0] & 0xf0), 32),
                    std::net::IpAddr::V6(v) => (format!("{:x}::/4", v.segments()[0] & 0xf000), 128),
                };
                json!({"ipBlock": {"cidr": cidr, "except": [format!("{a}/{len}")]}})
            })
            .collect()
    };

    // should allow egress access to server in CIDR block
    w.policy(
        "x",
        "allow-client-a-via-cidr-egress-rule",
        json!({"podSelector": pod_a(),
        "policyTypes": ["Egress"], "egress": [{"to": host("y/b")}]}),
    );
    w.expect(
        "x/a to y/b's address only",
        Tcp,
        80,
        &Reach::all(true)
            .peer("x/a", "*", false)
            .peer("x/a", "y/b", true),
    );
    w.clean();

    // should enforce except clause while egress access to server in CIDR block
    w.policy(
        "x",
        "allow-client-a-via-cidr-egress-rule",
        json!({"podSelector": pod_a(),
        "policyTypes": ["Egress"], "egress": [{"to": around("x/b")}]}),
    );
    w.expect(
        "all but x/b",
        Tcp,
        80,
        &Reach::all(true).peer("x/a", "x/b", false),
    );

    // should ensure an IP overlapping both IPBlock.CIDR and IPBlock.Except is allowed (the
    // policy replaced by one that allows x/b alone)
    w.policy(
        "x",
        "allow-client-a-via-cidr-egress-rule",
        json!({"podSelector": pod_a(),
        "policyTypes": ["Egress"], "egress": [{"to": host("x/b")}]}),
    );
    w.expect(
        "x/b alone",
        Tcp,
        80,
        &Reach::all(true)
            .peer("x/a", "*", false)
            .peer("x/a", "x/b", true),
    );
    // ...and beside the except, as a second policy: the union holds.
    w.policy(
        "x",
        "around",
        json!({"podSelector": pod_a(), "policyTypes": ["Egress"],
        "egress": [{"to": around("x/b")}]}),
    );
    w.expect("the union", Tcp, 80, &Reach::all(true));
    w.clean();

    // ingress from an ipBlock with except: pods' addresses are addresses
    w.policy(
        "x",
        "from-around-y-b",
        json!({"podSelector": pod_a(),
        "ingress": [{"from": around("y/b")}]}),
    );
    w.expect(
        "all but y/b to x/a",
        Tcp,
        80,
        &Reach::all(true).peer("y/b", "x/a", false),
    );
}

#[test]
fn updates_of_policies_pods_and_namespaces_on_host_gw() {
    let w = World::new("npu", 126, HOST_GW, Underlay::V4, &[]);

    // should enforce updated policy
    w.policy(
        "x",
        "allow-all-mutate-to-deny-all",
        json!({"podSelector": {}, "ingress": [{}]}),
    );
    w.expect("allow all", Tcp, 81, &Reach::all(true));
    w.policy(
        "x",
        "allow-all-mutate-to-deny-all",
        json!({"podSelector": {}, "ingress": []}),
    );
    w.expect(
        "updated to deny all",
        Tcp,
        81,
        &Reach::all(true).peer("*", "x/*", false),
    );
    w.clean();

    // should allow ingress access from updated namespace
    w.policy(
        "x",
        "allow-client-a-via-ns-selector",
        json!({"podSelector": pod_a(),
        "ingress": [{"from": [{"namespaceSelector": labels("ns2", "updated")}]}]}),
    );
    w.expect(
        "no namespace has the label",
        Tcp,
        80,
        &Reach::all(true).peer("*", "x/a", false),
    );
    w.label_namespace("y", json!({"ns2": "updated"}));
    w.expect(
        "y has it now",
        Tcp,
        80,
        &Reach::all(true)
            .peer("*", "x/a", false)
            .peer("y/*", "x/a", true),
    );
    w.label_namespace("y", json!({"ns2": null}));
    w.expect(
        "y lost it again",
        Tcp,
        80,
        &Reach::all(true).peer("*", "x/a", false),
    );
    w.clean();

    // should allow ingress access from updated pod
    w.policy("x", "allow-client-a-via-pod-selector", json!({"podSelector": pod_a(),
        "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b", "pod2": "updated"}}}]}]}));
    w.expect(
        "no pod has the labels",
        Tcp,
        80,
        &Reach::all(true).peer("*", "x/a", false),
    );
    w.label_pod("x/b", json!({"pod2": "updated"}));
    w.expect(
        "x/b has them",
        Tcp,
        80,
        &Reach::all(true)
            .peer("*", "x/a", false)
            .peer("x/b", "x/a", true),
    );
    w.label_pod("x/b", json!({"pod2": null}));
    w.clean();

    // should deny ingress access to updated pod
    w.policy(
        "x",
        "deny-ingress-via-label-selector",
        json!({"podSelector": labels("target", "isolated"),
        "policyTypes": ["Ingress"]}),
    );
    w.expect("no pod is selected", Tcp, 80, &Reach::all(true));
    w.label_pod("x/a", json!({"target": "isolated"}));
    w.expect(
        "x/a is now",
        Tcp,
        80,
        &Reach::all(true).peer("*", "x/a", false),
    );
    w.label_pod("x/a", json!({"target": null}));
    w.expect("and no longer", Tcp, 80, &Reach::all(true));
    w.clean();

    // should stop enforcing policies after they are deleted
    w.policy(
        "x",
        "deny-all",
        json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
    );
    w.expect(
        "deny all",
        Tcp,
        80,
        &Reach::all(true)
            .peer("x/*", "*", false)
            .peer("*", "x/*", false),
    );
    w.clean();
    w.expect("deleted", Tcp, 80, &Reach::all(true));
}
