//! `host-gw`: a route to each other node's subnet via its public address on the external
//! interface, which therefore must be on one link with every node.

use super::api::{Backend, Here, Peer};
use crate::entries::{Hop, Want};
use crate::family::IpFamily;
use crate::iface::External;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostGw;

impl Backend for HostGw {
    fn name(&self) -> &'static str {
        "host-gw"
    }

    fn check(&self, ext: &External, families: &[IpFamily]) -> Result<(), String> {
        for &family in families {
            if ext.public(family) != ext.iface_ip(family) {
                let flag = match family {
                    IpFamily::V4 => "--public-ip",
                    IpFamily::V6 => "--public-ipv6",
                };
                return Err(format!(
                    "host-gw needs the public address to be the external interface's: {flag} {} is not an address of {}",
                    ext.public(family).map(|a| a.to_string()).unwrap_or_default(),
                    ext.name
                ));
            }
        }
        Ok(())
    }

    fn peer(&self, here: &Here<'_>, peer: &Peer<'_>, want: &mut Want) -> Result<(), String> {
        want.route(Hop {
            dst: peer.subnet,
            gw: peer.public,
            dev: here.ext.index,
            onlink: false,
        });
        Ok(())
    }
}
