//! The truth tables of Kubernetes' NetworkPolicy e2e suite (test/e2e/network/netpol), ported:
//! each case's policies created in the API server stand-in, then its expected reachability
//! checked as a full probe matrix (every pod of x, y, z to every other, loopback left out) on
//! the three-node cluster, with flannel-netpol on every node.

mod common;

use common::*;
use serde_json::json;
use testkit::cluster::Underlay;
use testkit::probe::Proto;

const VXLAN: &str = r#"{"Type":"vxlan"}"#;

#[test]
fn default_deny_ingress() {
    let w = World::new("npt", 120, VXLAN, Underlay::V4, &[]);
    w.check("no policy", Proto::Tcp, 80, |_, _| true);
    w.policy("x", "deny-ingress", json!({"podSelector": {}}));
    w.check("deny ingress", Proto::Tcp, 80, |_, to| ns_of(to) != "x");
}
