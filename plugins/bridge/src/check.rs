//! CHECK: the previous result's interfaces, addresses and routes are still what the kernel has.

use cni_bridge::check::{check_addresses, check_routes, RouteEntry};
use cni_bridge::config::format_mac;
use cni_bridge::NetConf;
use cni_kernel::netlink::{
    controller_of, is_bridge, is_promisc, is_veth, mac_bytes, peer_index_of, LinkMessage, Netlink,
};
use cni_kernel::Netns;
use cni_protocol::{CniError, CniResult, Interface, Request};

fn fail(msg: String) -> CniError {
    CniError::internal(msg)
}

fn same_mac(want: &Interface, link: &LinkMessage) -> bool {
    want.mac.is_empty()
        || mac_bytes(link).is_some_and(|m| format_mac(m).eq_ignore_ascii_case(&want.mac))
}

/// The bridge, the container veth in CNI_NETNS, its peer on the bridge, then the addresses
/// and routes, as the Go plugin checks them.
pub fn attachment(req: &Request, conf: &NetConf, prev: &CniResult) -> Result<(), CniError> {
    let env = &req.env;
    let bridge_want = prev
        .interfaces
        .iter()
        .find(|i| i.name == conf.bridge)
        .ok_or_else(|| {
            fail(format!(
                "bridge {} is not in the previous result",
                conf.bridge
            ))
        })?;
    let cont_want = prev
        .interfaces
        .iter()
        .find(|i| i.name == env.ifname && i.sandbox == env.netns)
        .ok_or_else(|| {
            fail(format!(
                "the previous result has no interface {} in sandbox {}",
                env.ifname, env.netns
            ))
        })?;

    let host = Netlink::open()?;
    let bridge = host
        .link_by_name(&conf.bridge)?
        .ok_or_else(|| fail(format!("bridge {} was not found", conf.bridge)))?;
    if !is_bridge(&bridge) {
        return Err(fail(format!("{} is not a bridge", conf.bridge)));
    }
    if !same_mac(bridge_want, &bridge) {
        return Err(fail(format!(
            "bridge {} has not the MAC {} of the previous result",
            conf.bridge, bridge_want.mac
        )));
    }
    if is_promisc(&bridge) != conf.promisc {
        return Err(fail(format!(
            "bridge {} promiscuous mode is {}, the config says {}",
            conf.bridge,
            is_promisc(&bridge),
            conf.promisc
        )));
    }

    let ns = Netns::open(&env.netns)?;
    let pod = Netlink::open_in(&ns)?;
    let cont = pod
        .link_by_name(&env.ifname)?
        .ok_or_else(|| fail(format!("{} was not found in {}", env.ifname, env.netns)))?;
    if !is_veth(&cont) {
        return Err(fail(format!(
            "{} in {} is not a veth",
            env.ifname, env.netns
        )));
    }
    if !same_mac(cont_want, &cont) {
        return Err(fail(format!(
            "{} has not the MAC {} of the previous result",
            env.ifname, cont_want.mac
        )));
    }

    let peer_found = prev
        .interfaces
        .iter()
        .filter(|i| i.name != conf.bridge && i.name != env.ifname && i.sandbox.is_empty())
        .map(|i| Ok((i, host.link_by_name(&i.name)?)))
        .collect::<Result<Vec<_>, CniError>>()?
        .into_iter()
        .any(|(want, link)| {
            link.is_some_and(|l| {
                is_veth(&l)
                    && peer_index_of(&cont) == Some(l.header.index)
                    && peer_index_of(&l) == Some(cont.header.index)
                    && controller_of(&l) == Some(bridge.header.index)
                    && same_mac(want, &l)
            })
        });
    if !peer_found {
        return Err(fail(format!(
            "the host end of {}'s veth is not on bridge {}",
            env.ifname, conf.bridge
        )));
    }

    let addrs = pod.addresses(cont.header.index)?;
    let routes: Vec<RouteEntry> = pod
        .routes()?
        .into_iter()
        .map(|r| RouteEntry {
            dst: r.dst,
            gw: r.gw,
        })
        .collect();
    check_addresses(&env.ifname, &prev.ips, &addrs, &routes)?;
    check_routes(&prev.routes, &routes)
}
