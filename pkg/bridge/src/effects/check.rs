//! CHECK: the previous result's interfaces, addresses and routes are still what the kernel has.

use crate::check::{check_addresses, check_routes, RouteEntry};
use crate::config::format_mac;
use crate::NetConf;
use cni_kernel::netlink::{Link, Netlink};
use cni_kernel::Netns;
use cni_protocol::{CniError, CniResult, Interface, Request};

fn fail(msg: String) -> CniError {
    CniError::internal(msg)
}

fn same_mac(want: &Interface, link: &Link) -> bool {
    want.mac.is_empty()
        || (!link.mac.is_empty() && format_mac(&link.mac).eq_ignore_ascii_case(&want.mac))
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
    if !bridge.is_bridge() {
        return Err(fail(format!("{} is not a bridge", conf.bridge)));
    }
    if !same_mac(bridge_want, &bridge) {
        return Err(fail(format!(
            "bridge {} has not the MAC {} of the previous result",
            conf.bridge, bridge_want.mac
        )));
    }
    if bridge.promisc != conf.promisc {
        return Err(fail(format!(
            "bridge {} promiscuous mode is {}, the config says {}",
            conf.bridge, bridge.promisc, conf.promisc
        )));
    }

    let ns = Netns::open(&env.netns)?;
    let pod = Netlink::open_in(&ns)?;
    let cont = pod
        .link_by_name(&env.ifname)?
        .ok_or_else(|| fail(format!("{} was not found in {}", env.ifname, env.netns)))?;
    if !cont.is_veth() {
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
                l.is_veth()
                    && cont.peer_index == Some(l.index)
                    && l.peer_index == Some(cont.index)
                    && l.controller == Some(bridge.index)
                    && same_mac(want, &l)
            })
        });
    if !peer_found {
        return Err(fail(format!(
            "the host end of {}'s veth is not on bridge {}",
            env.ifname, conf.bridge
        )));
    }

    let addrs = pod.addresses(cont.index)?;
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
