//! The checks every runtime test makes, as a user of the node would make them.

use crate::image::PAGE;
use crate::node::{Node, FLANNEL_MTU, FLANNEL_NETWORK, NODE_ADDR};
use crate::session::Transcript;
use std::net::Ipv4Addr;

/// From the session's `addr`, `link`, `routes` and `ping` steps (run inside the container):
/// eth0 has a pod address of FLANNEL_SUBNET as a /24, FLANNEL_MTU, a route to FLANNEL_NETWORK
/// through the gateway, and the gateway answers. Returns the address.
pub fn assert_on_flannel_network(node: &Node, t: &Transcript) -> Ipv4Addr {
    let addr = t.ok("addr");
    let cidr =
        field_after(addr, "inet").unwrap_or_else(|| panic!("no IPv4 address on eth0: {addr}\n{t}"));
    let (ip, prefix) = cidr.split_once('/').expect("address/prefix");
    let ip: Ipv4Addr = ip.parse().expect("an IPv4 address");
    assert!(
        node.is_pod_address(ip) && prefix == "24",
        "eth0 has {cidr}, not a pod address of FLANNEL_SUBNET {}/24\n{t}",
        node.gateway()
    );

    let link = t.ok("link");
    assert_eq!(
        field_after(link, "mtu"),
        Some(FLANNEL_MTU.to_string().as_str()),
        "eth0 does not have FLANNEL_MTU: {link}"
    );

    let routes = t.ok("routes");
    let via_gateway = format!("{FLANNEL_NETWORK} via {}", node.gateway());
    assert!(
        routes.lines().any(|r| r.trim().starts_with(&via_gateway)),
        "no route {via_gateway} in the container:\n{routes}"
    );

    t.ok("ping");
    ip
}

/// The container's server answers on its own address, and through the node's address on the
/// mapped host port.
pub fn assert_serves(node: &Node, ip: Ipv4Addr, port: u16, host_port: u16) {
    assert_eq!(node.http_get(ip, port).as_deref(), Ok(PAGE));
    assert_eq!(
        node.http_get(NODE_ADDR, host_port).as_deref(),
        Ok(PAGE),
        "the mapped port {NODE_ADDR}:{host_port} does not reach the container"
    );
}

/// While the container runs: its lease (its address, naming it), flannel's saved delegate, and
/// port-forwarding rules naming it.
pub fn assert_footprint_present(node: &Node, container_id: &str, ip: Ipv4Addr) {
    let fp = node.footprint(container_id);
    assert!(
        fp.leases.len() == 1 && fp.leases[0].starts_with(&format!("{ip}:")),
        "expected the one lease {ip} of {container_id}: {fp:#?}"
    );
    assert_eq!(
        fp.delegates,
        vec![container_id.to_string()],
        "flannel's saved delegate"
    );
    assert!(
        !fp.rules.is_empty(),
        "no rule names {container_id}: {fp:#?}"
    );
}

/// After removal: no lease, saved delegate, cached result or rule of the container.
pub fn assert_footprint_gone(node: &Node, container_id: &str) {
    let fp = node.footprint(container_id);
    assert!(fp.is_empty(), "left behind by {container_id}: {fp:#?}");
}

/// With every container removed, nothing container-specific is left on the node, whoever made it.
pub fn assert_no_attachments(node: &Node) {
    let left = node.attachments();
    assert!(left.is_empty(), "left on the node: {left:#?}");
}

/// The whitespace-separated word after `key` in `text`.
fn field_after<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let mut words = text.split_whitespace();
    words.find(|w| *w == key)?;
    words.next()
}
