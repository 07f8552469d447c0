//! The host side: the bridge, the veth pair, the port's flags and VLANs, the gateway addresses.

use crate::gateway::{plan_bridge_address, AddressPlan, Gateways};
use crate::{host_veth_name, local_mac, NetConf};
use cni_kernel::netlink::{BridgeSpec, Link, Netlink, VethSpec};
use cni_kernel::procsys::{self, Proto};
use cni_kernel::{sysctl, Netns};
use cni_protocol::{CniError, Interface};
use std::io::Read;

/// A link as ADD reports it.
#[derive(Debug, Clone)]
pub struct LinkRef {
    pub index: u32,
    pub name: String,
    pub mac: Vec<u8>,
}

impl LinkRef {
    pub fn of(link: &Link) -> LinkRef {
        LinkRef {
            index: link.index,
            name: link.name.clone(),
            mac: link.mac.clone(),
        }
    }

    pub fn interface(&self, sandbox: &str) -> Interface {
        Interface {
            name: self.name.clone(),
            mac: crate::config::format_mac(&self.mac),
            sandbox: sandbox.to_string(),
            ..Default::default()
        }
    }
}

/// Random bytes for interface names and addresses.
pub fn entropy<const N: usize>() -> Result<[u8; N], CniError> {
    let mut buf = [0u8; N];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(|e| CniError::io(format!("reading /dev/urandom: {e}")))?;
    Ok(buf)
}

/// The bridge, created (configured and up in one request) when missing. Concurrent ADDs may
/// all try: whoever finds it made already uses it.
pub fn ensure_bridge(host: &Netlink, conf: &NetConf) -> Result<LinkRef, CniError> {
    let link = match host.link_by_name(&conf.bridge)? {
        Some(link) => link,
        None => {
            let created = host.create_bridge(&BridgeSpec {
                name: &conf.bridge,
                mtu: conf.mtu,
                promisc: conf.promisc,
                vlan_filtering: conf.vlan_filtering(),
                mac: local_mac(entropy()?),
            })?;
            if created {
                // The plugin owns the bridge's routes: no router advertisements. No IPv6, no file.
                let _ = procsys::set(Proto::Ipv6, &conf.bridge, "accept_ra", "0");
            }
            host.link_by_name(&conf.bridge)?.ok_or_else(|| {
                CniError::io(format!("bridge {:?} vanished after creation", conf.bridge))
            })?
        }
    };
    if !link.is_bridge() {
        return Err(CniError::invalid_config(format!(
            "{:?} (field \"bridge\") already exists and is not a bridge",
            conf.bridge
        )));
    }
    if conf.promisc && !link.promisc {
        host.set_promisc(link.index, true)?;
    }
    if !link.up {
        host.set_up(link.index, true)?;
    }
    Ok(LinkRef::of(&link))
}

/// A pod's veth pair: the host end on the bridge, the container end in the pod.
pub struct Veth {
    pub host: LinkRef,
    pub container: LinkRef,
}

/// Creates the pair in one request: the host end (random `veth…` name, up, on the bridge)
/// and the container end, named `ifname`, made directly inside the pod's namespace.
pub fn create_veth(
    host: &Netlink,
    pod: &Netlink,
    pod_ns: &Netns,
    bridge: &LinkRef,
    conf: &NetConf,
    ifname: &str,
) -> Result<Veth, CniError> {
    for _ in 0..10 {
        let name = host_veth_name(entropy()?);
        let created = host.create_veth(&VethSpec {
            name: &name,
            mtu: conf.mtu,
            controller: Some(bridge.index),
            up: true,
            peer_name: ifname,
            peer_ns: pod_ns,
            peer_mac: conf.mac,
        })?;
        if !created {
            if host.link_by_name(&name)?.is_some() {
                continue;
            }
            return Err(CniError::internal(format!(
                "container interface {ifname:?} (CNI_IFNAME) already exists in {}",
                pod_ns.path().display()
            )));
        }
        return read_back_or_remove(host, pod, pod_ns, &name, ifname);
    }
    Err(CniError::internal(
        "could not find a free host veth name in 10 tries",
    ))
}

/// The two ends of a pair just made, read back by name; when that fails the pair is deleted,
/// since no undo record can name it yet.
fn read_back_or_remove(
    host: &Netlink,
    pod: &Netlink,
    pod_ns: &Netns,
    host_name: &str,
    ifname: &str,
) -> Result<Veth, CniError> {
    let made = read_back(host, pod, pod_ns, host_name, ifname);
    if made.is_err() {
        remove_pair(host, pod, host_name, ifname);
    }
    made
}

fn read_back(
    host: &Netlink,
    pod: &Netlink,
    pod_ns: &Netns,
    host_name: &str,
    ifname: &str,
) -> Result<Veth, CniError> {
    let host_end = host
        .link_by_name(host_name)?
        .ok_or_else(|| CniError::io(format!("veth {host_name} vanished after creation")))?;
    // The host end takes no router advertisements either.
    let _ = procsys::set(Proto::Ipv6, host_name, "accept_ra", "0");
    let container_end = pod.link_by_name(ifname)?.ok_or_else(|| {
        CniError::io(format!(
            "{ifname} vanished from {} after creation",
            pod_ns.path().display()
        ))
    })?;
    Ok(Veth {
        host: LinkRef::of(&host_end),
        container: LinkRef::of(&container_end),
    })
}

/// Deletes a pair this ADD made but could not hand on (either end takes the other with it);
/// a failure goes to stderr, the caller returns the error that got it here.
fn remove_pair(host: &Netlink, pod: &Netlink, host_name: &str, ifname: &str) {
    let delete = |nl: &Netlink, name: &str| -> Result<bool, CniError> {
        match nl.link_by_name(name)? {
            Some(link) => Ok(nl.delete_link(link.index)?),
            None => Ok(false),
        }
    };
    let deleted = match delete(host, host_name) {
        Ok(true) => Ok(true),
        Ok(false) | Err(_) => delete(pod, ifname),
    };
    if let Err(e) = deleted {
        eprintln!("rolling back: deleting the veth {host_name} failed: {e}");
    }
}

/// The port's hairpin and isolation flags and its VLANs (access or trunk).
pub fn configure_port(host: &Netlink, port: &LinkRef, conf: &NetConf) -> Result<(), CniError> {
    if conf.hairpin || conf.port_isolation {
        host.set_bridge_port(port.index, conf.hairpin, conf.port_isolation)?;
    }
    set_port_vlans(
        host,
        port,
        conf.vlan,
        &conf.vlan_trunk,
        conf.preserve_default_vlan,
    )
}

fn set_port_vlans(
    host: &Netlink,
    port: &LinkRef,
    access: u16,
    trunk: &[u16],
    preserve_default: bool,
) -> Result<(), CniError> {
    if (access != 0 || !trunk.is_empty()) && !preserve_default {
        let current = host.bridge_vlans(port.index)?;
        if !current.is_empty() {
            host.del_bridge_vlans(port.index, &current)?;
        }
    }
    if access != 0 {
        host.add_bridge_vlans(port.index, &[access], true)?;
    }
    if !trunk.is_empty() {
        host.add_bridge_vlans(port.index, trunk, false)?;
    }
    Ok(())
}

/// Puts the gateway addresses on the bridge (on `<bridge>.<vlan>` for a VLAN network, which
/// is then returned to be reported) and turns forwarding on for their families.
pub fn ensure_gateways(
    host: &Netlink,
    bridge: &LinkRef,
    conf: &NetConf,
    gateways: &Gateways,
) -> Result<Option<LinkRef>, CniError> {
    if gateways.all().next().is_none() {
        return Ok(None);
    }
    let vlan_gateway = match conf.vlan {
        0 => None,
        _ => Some(ensure_vlan_gateway(host, bridge, conf)?),
    };
    let target = vlan_gateway.as_ref().unwrap_or(bridge);
    for gw in gateways.all() {
        // Every pod after the first finds its gateway there already: no address dump then.
        if !host.add_address(target.index, *gw)? {
            continue;
        }
        // Newly added: the Go plugin's rule about the other addresses of the family.
        let others: Vec<_> = host
            .address_infos(target.index)?
            .into_iter()
            .map(|a| a.address)
            .filter(|a| a != gw)
            .collect();
        let remove = match plan_bridge_address(&target.name, &others, *gw, conf.force_address) {
            Ok(AddressPlan::Add { remove }) => remove,
            Ok(AddressPlan::Keep) => Vec::new(),
            Err(e) => {
                let _ = host.del_address(target.index, *gw);
                return Err(e);
            }
        };
        if !remove.is_empty() {
            for old in remove {
                host.del_address(target.index, old)?;
            }
            // Removing a primary IPv4 address removes its secondaries, ours among them.
            host.add_address(target.index, *gw)?;
        }
        if vlan_gateway.is_none() {
            // Pin the bridge's MAC: it would otherwise follow whichever port has the lowest.
            if let Some(link) = host.link_by_index(target.index)? {
                if !link.mac.is_empty() {
                    host.set_mac(target.index, &link.mac)?;
                }
            }
        }
    }
    if !gateways.v4.is_empty() {
        sysctl::set("net.ipv4.ip_forward", "1")?;
    }
    if !gateways.v6.is_empty() {
        sysctl::set("net.ipv6.conf.all.forwarding", "1")?;
    }
    Ok(vlan_gateway)
}

/// `<bridge>.<vlan>`: a veth in the host whose other end is an access port of the VLAN, to
/// carry the gateway address as the Go plugin does. Made once, by whichever ADD comes first.
fn ensure_vlan_gateway(
    host: &Netlink,
    bridge: &LinkRef,
    conf: &NetConf,
) -> Result<LinkRef, CniError> {
    let name = conf.vlan_gateway_name();
    let here = Netns::current()?;
    for _ in 0..10 {
        if let Some(link) = host.link_by_name(&name)? {
            if !link.up {
                host.set_up(link.index, true)?;
            }
            return Ok(LinkRef::of(&link));
        }
        let port_name = host_veth_name(entropy()?);
        let created = host.create_veth(&VethSpec {
            name: &port_name,
            mtu: conf.mtu,
            controller: Some(bridge.index),
            up: true,
            peer_name: &name,
            peer_ns: &here,
            peer_mac: None,
        })?;
        if created {
            let port = host
                .link_by_name(&port_name)?
                .ok_or_else(|| CniError::io(format!("veth {port_name} vanished after creation")))?;
            // A gateway whose port never got its VLAN would be found and reused by every later
            // ADD, so one that cannot be finished is removed (with its peer) before failing.
            if let Err(e) = set_port_vlans(
                host,
                &LinkRef::of(&port),
                conf.vlan,
                &[],
                conf.preserve_default_vlan,
            ) {
                if let Err(del) = host.delete_link(port.index) {
                    eprintln!("removing the unfinished VLAN gateway {port_name}: {del}");
                }
                return Err(e);
            }
        }
    }
    Err(CniError::internal(format!(
        "could not create the VLAN gateway interface {name:?}"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use testkit::{unique_name, TestNs};

    #[test]
    fn a_pair_that_cannot_be_read_back_is_removed() {
        let (host_ns, pod_ns) = (TestNs::new("blh"), TestNs::new("blp"));
        let (hns, pns) = (
            Netns::open(host_ns.path()).unwrap(),
            Netns::open(pod_ns.path()).unwrap(),
        );
        let (host, pod) = (
            Netlink::open_in(&hns).unwrap(),
            Netlink::open_in(&pns).unwrap(),
        );
        let name = unique_name("vt");
        let made = host
            .create_veth(&VethSpec {
                name: &name,
                mtu: None,
                controller: None,
                up: false,
                peer_name: "eth0",
                peer_ns: &pns,
                peer_mac: None,
            })
            .unwrap();
        assert!(made && host_ns.link(&name).is_some() && pod_ns.link("eth0").is_some());
        // The container end looked for under another name: as if it vanished after creation.
        let err = read_back_or_remove(&host, &pod, &pns, &name, "eth9")
            .err()
            .expect("reading back a missing end fails");
        assert_eq!(err.code, cni_protocol::error::IO_FAILURE, "{}", err.msg);
        assert!(host_ns.link(&name).is_none(), "host end left");
        assert!(pod_ns.link("eth0").is_none(), "container end left");
    }
}
