//! `portmap`: forwards host ports to the container, chained after the plugin that gave the
//! container its address (`prevResult`), with the Go plugin's chains so that either
//! implementation removes the other's rules.

use cni_kernel::firewall::{self, Backend, Family};
use cni_kernel::{conntrack, procsys, Netlink};
use cni_portmap::rules::{Check, Forward, Mappings, Unforward};
use cni_portmap::{host_interface, Config, ContainerAddrs, Protocol};
use cni_protocol::{CniError, CniResult, Plugin, Request};
use std::net::IpAddr;

struct Portmap;

fn load_config(req: &Request) -> Result<Config, CniError> {
    Config::parse(&req.config, &req.name, || Backend::choose(None))
}

/// Forwards the container's ports to each of its addresses, reading and writing under the
/// host's rules lock; a half-written ADD (one family's rules in) is taken out again.
fn forward(conf: &Config, container_id: &str, addrs: &ContainerAddrs) -> Result<(), CniError> {
    let forward = Forward(Mappings {
        conf,
        container_id,
        addrs,
    });
    let written = firewall::with_rules_lock(|| conf.backend.write(&forward));
    if written.is_err() && conf.backend.tools(&forward_families(addrs)).len() > 1 {
        if let Err(e) = unforward(conf.backend, &conf.network, container_id) {
            eprintln!("removing the rules of the failed ADD: {e}");
        }
    }
    written.map(drop)
}

fn forward_families(addrs: &ContainerAddrs) -> Vec<Family> {
    addrs.iter().map(|a| Family::of(&a)).collect()
}

/// Removes the container's rules from `backend`.
fn unforward(backend: Backend, network: &str, container_id: &str) -> Result<(), CniError> {
    let del = Unforward {
        network,
        container_id,
    };
    firewall::with_rules_lock(|| backend.remove(&del))?
        .readable()?
        .warn_on_stderr();
    Ok(())
}

/// The host interface the container is reached through: the one prevResult names, else the
/// one the route to its address leaves by (0.1.0 and 0.2.0 results name no interface, nor do
/// some plugins' later ones). A failed lookup only costs localhost hairpin: logged, as Go ignores it.
fn host_side_interface(prev: &CniResult, container: IpAddr) -> Option<String> {
    if let Some(dev) = host_interface(prev) {
        return Some(dev.to_string());
    }
    let routed =
        Netlink::open().and_then(|nl| match nl.route_get(container)?.and_then(|r| r.oif) {
            Some(oif) => Ok(nl.link_by_index(oif)?.map(|l| l.name)),
            None => Ok(None),
        });
    routed.unwrap_or_else(|e| {
        eprintln!("finding the host interface that routes to {container}: {e}");
        None
    })
}

/// Lets packets from 127.0.0.1, DNATed towards the container, be routed out of `dev`.
fn allow_localhost_sources(dev: &str) -> Result<(), CniError> {
    procsys::set(procsys::Proto::Ipv4, dev, "route_localnet", "1").map_err(|e| {
        CniError::from(e).context(format!(
            "enabling route_localnet on {dev:?}, the host interface the container is reached through"
        ))
    })
}

/// Drops the UDP flows conntrack tracks to the mapped host ports in `families`: at ADD those
/// from before the mapping, so that the next datagram meets the new rules; at DEL those
/// still NATed to the container, which would otherwise keep steering datagrams to it.
/// Only logged when it fails, as in the Go plugin.
fn forget_udp_flows(conf: &Config, families: impl IntoIterator<Item = Family>) {
    let ports: Vec<u16> = conf
        .mappings
        .iter()
        .filter(|m| m.protocol == Protocol::Udp)
        .map(|m| m.host_port)
        .collect();
    for family in families {
        if let Err(e) = conntrack::delete_by_dst_port(family, Protocol::Udp.number(), &ports) {
            eprintln!("deleting UDP conntrack entries to ports {ports:?} ({family:?}): {e}");
        }
    }
}

impl Plugin for Portmap {
    fn about(&self) -> &'static str {
        "CNI portmap plugin (Rust)"
    }

    fn add(&self, req: &Request) -> Result<CniResult, CniError> {
        let conf = load_config(req)?;
        let prev = req.prev_result()?.ok_or_else(|| {
            CniError::invalid_config(
                "portmap must be called as a chained plugin: the config has no prevResult",
            )
        })?;
        if conf.mappings.is_empty() {
            return Ok(prev);
        }
        let addrs = ContainerAddrs::from_result(&prev, &req.env.ifname);
        conf.check_families(&addrs)?;
        if let Some(v4) = addrs.v4.filter(|_| conf.snat) {
            if let Some(dev) = host_side_interface(&prev, v4.ip()) {
                allow_localhost_sources(&dev)?;
            }
        }
        forward(&conf, &req.env.container_id, &addrs)?;
        forget_udp_flows(&conf, forward_families(&addrs));
        Ok(prev)
    }

    fn del(&self, req: &Request) -> Result<(), CniError> {
        let id = &req.env.container_id;
        match load_config(req) {
            // Without mappings ADD made nothing, as in the Go plugin.
            Ok(conf) if conf.mappings.is_empty() => Ok(()),
            Ok(conf) => {
                unforward(conf.backend, &conf.network, id)?;
                // DEL below 0.4.0 has no prevResult to tell the container's families.
                forget_udp_flows(&conf, [Family::V4, Family::V6]);
                Ok(())
            }
            // The rules are found by network name and container ID alone: a config DEL cannot
            // use must not keep them, nor stop the runtime from running the rest of the chain.
            Err(e) => {
                eprintln!("DEL ignores a config it cannot use ({e}): removing container {id}'s rules from every backend");
                let del = Unforward {
                    network: &req.name,
                    container_id: id,
                };
                firewall::with_rules_lock(|| firewall::remove_everywhere(&del))?.warn_on_stderr();
                Ok(())
            }
        }
    }

    fn check(&self, req: &Request) -> Result<(), CniError> {
        let conf = load_config(req)?;
        let prev = req.prev_result()?.ok_or_else(|| {
            CniError::invalid_config("portmap CHECK needs the prevResult: the config has none")
        })?;
        if conf.mappings.is_empty() {
            return Ok(());
        }
        let addrs = ContainerAddrs::from_result(&prev, &req.env.ifname);
        let check = Check(Mappings {
            conf: &conf,
            container_id: &req.env.container_id,
            addrs: &addrs,
        });
        conf.backend.plan(&check).map(drop)
    }
}

fn main() {
    cni_protocol::run(&Portmap)
}
