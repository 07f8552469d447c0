//! The pod side: the container interface's sysctls, state, addresses and routes.

use super::links::LinkRef;
use crate::NetConf;
use cni_kernel::netlink::Netlink;
use cni_kernel::procsys::{self, Proto};
use cni_kernel::Netns;
use cni_protocol::{CniError, CniResult};
use ipnetwork::IpNetwork;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// How long ADD waits for duplicate address detection when `enabledad` asks for it.
const DAD_TIMEOUT: Duration = Duration::from_secs(10);

/// Brings the container interface up with the result's addresses and routes. The sysctls come
/// first: `arp_notify` must be set before the link goes up to announce it.
pub fn configure(
    pod_ns: &Netns,
    pod: &Netlink,
    conf: &NetConf,
    ifname: &str,
    link: &LinkRef,
    result: &CniResult,
) -> Result<(), CniError> {
    let has_v6 = result.ips.iter().any(|ip| !ip.address.is_ipv4());
    pod_ns.run(|| set_sysctls(ifname, conf.enable_dad, has_v6))??;
    pod.set_up(link.index, true)?;
    for ip in &result.ips {
        if !pod.add_address(link.index, ip.address)? {
            return Err(CniError::internal(format!(
                "{ifname} in {} already has the address {}",
                pod_ns.path().display(),
                ip.address
            )));
        }
    }
    if conf.enable_dad && has_v6 {
        settle_addresses(pod, link, ifname)?;
    }
    let family_gateway = |v4: bool| -> Option<IpAddr> {
        result
            .ips
            .iter()
            .filter(|ip| ip.address.is_ipv4() == v4)
            .find_map(|ip| ip.gateway)
    };
    for route in &result.routes {
        let gw = route.gw.or_else(|| family_gateway(route.dst.is_ipv4()));
        pod.add_route(link.index, route.dst, gw)?;
    }
    Ok(())
}

/// DAD as configured, gratuitous ARP on up, and IPv6 enabled when an IPv6 address comes.
/// Kernels without IPv6 have no such files; the Go plugin ignores those failures too.
fn set_sysctls(ifname: &str, enable_dad: bool, has_v6: bool) -> Result<(), CniError> {
    if enable_dad {
        let _ = procsys::set(Proto::Ipv6, ifname, "enhanced_dad", "1");
        let _ = procsys::set(Proto::Ipv6, ifname, "accept_dad", "1");
    } else {
        let _ = procsys::set(Proto::Ipv6, ifname, "accept_dad", "0");
    }
    let _ = procsys::set(Proto::Ipv4, ifname, "arp_notify", "1");
    if has_v6 {
        for dev in ["lo", ifname] {
            match procsys::get(Proto::Ipv6, dev, "disable_ipv6") {
                Ok(v) if v != "0" => procsys::set(Proto::Ipv6, dev, "disable_ipv6", "0")
                    .map_err(|e| e.context(format!("enabling IPv6 on {dev}")))?,
                _ => {}
            }
        }
    }
    Ok(())
}

/// Waits until no address of the link is tentative; a failed DAD is an error.
fn settle_addresses(pod: &Netlink, link: &LinkRef, ifname: &str) -> Result<(), CniError> {
    let deadline = Instant::now() + DAD_TIMEOUT;
    loop {
        let addrs = pod.address_infos(link.index)?;
        if let Some(a) = addrs.iter().find(|a| a.dad_failed()) {
            return Err(CniError::internal(format!(
                "duplicate address detection failed for {} on {ifname}",
                a.address
            )));
        }
        if !addrs.iter().any(|a| a.tentative()) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(CniError::internal(format!(
                "{ifname} still has tentative addresses after {DAD_TIMEOUT:?}"
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The container interface as DEL finds it: its namespace, a socket there, the link, and its
/// global addresses (which tell the families of its masquerade rules).
pub struct ContainerLink {
    pub ns: Netns,
    pub pod: Netlink,
    pub link: LinkRef,
    pub addresses: Vec<IpNetwork>,
}

/// The container interface, if the namespace and the interface still exist.
pub fn find_container_link(netns: &str, ifname: &str) -> Result<Option<ContainerLink>, CniError> {
    let Some(ns) = Netns::open_if_exists(netns) else {
        return Ok(None);
    };
    let pod = Netlink::open_in(&ns)?;
    let Some(link) = pod.link_by_name(ifname)? else {
        return Ok(None);
    };
    let link = LinkRef::of(&link);
    let addresses = pod
        .addresses(link.index)?
        .into_iter()
        .filter(|a| is_global_unicast(a.ip()))
        .collect();
    Ok(Some(ContainerLink {
        ns,
        pod,
        link,
        addresses,
    }))
}

fn is_global_unicast(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => !(v4.is_loopback() || v4.is_link_local() || v4.is_multicast()),
        IpAddr::V6(v6) => !(v6.is_loopback() || v6.is_multicast() || v6.is_unicast_link_local()),
    }
}
