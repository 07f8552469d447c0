//! `loopback`: brings `lo` up inside the container's namespace, whatever CNI_IFNAME says.

use cni_kernel::netlink::Netlink;
use cni_kernel::Netns;
use cni_protocol::{CniError, CniResult, Interface, IpConfig, Plugin, Request};

const LO: &str = "lo";

struct Loopback;

/// Brings `lo` up or down in `ns` and returns its addresses.
fn set_lo(ns: &Netns, up: bool) -> Result<Vec<ipnetwork::IpNetwork>, CniError> {
    let nl = Netlink::open_in(ns)?;
    let link = nl
        .link_by_name(LO)?
        .ok_or_else(|| CniError::io(format!("no {LO} link in {}", ns.path().display())))?;
    nl.set_up(link.index, up)?;
    Ok(nl.addresses(link.index)?)
}

impl Plugin for Loopback {
    fn about(&self) -> &'static str {
        "CNI loopback plugin (Rust)"
    }

    fn add(&self, req: &Request) -> Result<CniResult, CniError> {
        let prev = req.prev_result()?;
        let ns = Netns::open(&req.env.netns)?;
        let addrs = set_lo(&ns, true)?;
        if let Some(prev) = prev {
            return Ok(prev);
        }
        let mut result = CniResult {
            interfaces: vec![Interface {
                name: LO.to_string(),
                mac: "00:00:00:00:00:00".to_string(),
                sandbox: req.env.netns.clone(),
                ..Default::default()
            }],
            ..Default::default()
        };
        // One loopback address per family, as the Go plugin reports.
        for v4 in [true, false] {
            if let Some(a) = addrs
                .iter()
                .find(|a| a.is_ipv4() == v4 && a.ip().is_loopback())
            {
                result.ips.push(IpConfig {
                    address: *a,
                    gateway: None,
                    interface: Some(0),
                });
            }
        }
        Ok(result)
    }

    fn del(&self, req: &Request) -> Result<(), CniError> {
        // A namespace that is already gone has no loopback left to set down.
        match Netns::open_if_exists(&req.env.netns) {
            Some(ns) => set_lo(&ns, false).map(|_| ()),
            None => Ok(()),
        }
    }

    fn check(&self, req: &Request) -> Result<(), CniError> {
        let ns = Netns::open(&req.env.netns)?;
        let nl = Netlink::open_in(&ns)?;
        match nl.link_by_name(LO)? {
            Some(link) if link.up => Ok(()),
            Some(_) => Err(CniError::internal(format!(
                "loopback interface is down in {}",
                req.env.netns
            ))),
            None => Err(CniError::internal(format!(
                "no {LO} link in {}",
                req.env.netns
            ))),
        }
    }
}

fn main() {
    cni_protocol::run(&Loopback)
}
