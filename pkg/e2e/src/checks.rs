//! The checks every runtime test makes, as a user of the node would make them.

use crate::image::PAGE;
use crate::node::{Node, FLANNEL_IPV6_NETWORK, FLANNEL_NETWORK};
use crate::session::Transcript;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

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
        Some(node.mtu().to_string().as_str()),
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

/// From the session's `inspect6`, `addr6`, `routes6` and `ping6` steps on a dual-stack node:
/// eth0 has a pod address of FLANNEL_IPV6_SUBNET as a /64 (the one the runtime reports), a route
/// to FLANNEL_IPV6_NETWORK through the IPv6 gateway, and that gateway answers. Returns it.
pub fn assert_on_flannel_network6(node: &Node, t: &Transcript) -> Ipv6Addr {
    let gw = node
        .gateway6()
        .expect("a dual-stack node (Node::dual_stack)");
    let addr = t.ok("addr6");
    let cidr = field_after(addr, "inet6")
        .unwrap_or_else(|| panic!("no global IPv6 address on eth0: {addr}\n{t}"));
    let (ip, prefix) = cidr.split_once('/').expect("address/prefix");
    let ip: Ipv6Addr = ip.parse().expect("an IPv6 address");
    assert!(
        node.is_pod_address6(ip) && prefix == "64",
        "eth0 has {cidr}, not a pod address of FLANNEL_IPV6_SUBNET {gw}/64\n{t}"
    );
    assert_eq!(
        t.ok("inspect6"),
        ip.to_string(),
        "the runtime's IPv6 address"
    );
    let routes = t.ok("routes6");
    let via_gateway = format!("{FLANNEL_IPV6_NETWORK} via {gw}");
    assert!(
        routes.lines().any(|r| r.trim().starts_with(&via_gateway)),
        "no route {via_gateway} in the container:\n{routes}"
    );
    t.ok("ping6");
    ip
}

/// The container's server answers on its own address, and through the node's address of the
/// same family on the mapped host port.
pub fn assert_serves(node: &Node, ip: impl Into<IpAddr>, port: u16, host_port: u16) {
    let ip = ip.into();
    assert_eq!(node.http_get(ip, port).as_deref(), Ok(PAGE), "{ip}:{port}");
    let node_addr = node.address_like(ip);
    assert_eq!(
        node.http_get(node_addr, host_port).as_deref(),
        Ok(PAGE),
        "the mapped port {node_addr}:{host_port} does not reach the container"
    );
}

/// While the container runs: its lease (its address, naming it), flannel's saved delegate, and
/// port-forwarding rules naming it.
pub fn assert_footprint_present(node: &Node, container_id: &str, ip: Ipv4Addr) {
    assert_footprint_present_for(node, container_id, &[ip.into()]);
}

/// As `assert_footprint_present` for a container with the addresses `ips`: a lease for each,
/// and none other; with an IPv6 address, port-forwarding rules in ip6tables too.
pub fn assert_footprint_present_for(node: &Node, container_id: &str, ips: &[IpAddr]) {
    let fp = node.footprint(container_id);
    let mut leased: Vec<&str> = fp
        .leases
        .iter()
        .filter_map(|l| l.split(": ").next())
        .collect();
    leased.sort();
    let mut want: Vec<String> = ips.iter().map(IpAddr::to_string).collect();
    want.sort();
    assert_eq!(
        leased, want,
        "expected the leases {want:?} of {container_id}: {fp:#?}"
    );
    if ips.iter().any(IpAddr::is_ipv6) {
        assert!(
            fp.rules.iter().any(|r| r.starts_with("ip6tables-save:")),
            "no ip6tables rule names {container_id}: {fp:#?}"
        );
    }
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
