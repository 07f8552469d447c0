//! The blackhole plane of `--ip-blackhole-route`: a blackhole route to each of the node's own
//! subnets, so that a packet to an address of the subnet that no pod holds is dropped here
//! rather than sent on along a route covering the network (setups where no bridge holds the
//! subnet, as with Canal). Each pass adds what is missing, as Go's flanneld does every
//! `--iptables-resync`; a route of another kind to the subnet (a bridge's) makes the add fail
//! as it does for Go's, and is named once, where Go's logs it at every pass.

use super::{Others, PassError, Plan, Plane};
use crate::lease::SubnetKey;
use crate::report::Finding;
use cni_kernel::netlink::Conn;
use ipnetwork::IpNetwork;
use std::collections::HashSet;
use std::time::Duration;
use tracing::{error, info, warn};

pub struct BlackholePlane {
    subnets: Vec<IpNetwork>,
    /// `--iptables-resync`, as in Go's flanneld.
    resync: Duration,
    /// Subnets another route already covers, said once.
    taken: HashSet<IpNetwork>,
}

/// Each subnet, and whether its blackhole route is there.
pub struct BlackholePlan {
    subnets: Vec<(IpNetwork, bool)>,
}

impl Plan for BlackholePlan {
    fn is_empty(&self) -> bool {
        self.subnets.iter().all(|(_, there)| *there)
    }

    fn findings(&self) -> Vec<Finding> {
        self.subnets
            .iter()
            .map(|(s, there)| {
                let state = if *there { "ok" } else { "missing" };
                Finding::new("blackhole", state, format!("blackhole {s}"))
            })
            .collect()
    }
}

impl BlackholePlane {
    /// The plane for the node's lease `own`: a route per subnet it holds.
    pub fn new(own: SubnetKey, resync: Duration) -> BlackholePlane {
        let subnets = own
            .ipv4
            .map(IpNetwork::V4)
            .into_iter()
            .chain(own.ipv6.map(IpNetwork::V6))
            .collect();
        BlackholePlane {
            subnets,
            resync,
            taken: HashSet::new(),
        }
    }
}

impl Plane for BlackholePlane {
    type Plan = BlackholePlan;
    const KIND: &'static str = "blackhole";

    fn resync(&self) -> Duration {
        self.resync
    }

    async fn plan(&mut self, _: &Others) -> Result<BlackholePlan, PassError> {
        let have = Conn::open()?.blackholes().await?;
        Ok(BlackholePlan {
            subnets: self
                .subnets
                .iter()
                .map(|s| (*s, have.contains(s)))
                .collect(),
        })
    }

    async fn apply(&mut self, plan: BlackholePlan, _: &Others) {
        if plan.is_empty() {
            return;
        }
        let conn = match Conn::open() {
            Ok(c) => c,
            Err(e) => return error!("--ip-blackhole-route: {e}"),
        };
        for (subnet, _) in plan.subnets.into_iter().filter(|(_, there)| !there) {
            match conn.add_blackhole(subnet).await {
                Ok(true) => info!("blackhole route to {subnet} added (--ip-blackhole-route)"),
                Ok(false) if self.taken.insert(subnet) => warn!(
                    "--ip-blackhole-route: another route to {subnet} is there (a bridge's?), \
                     so no blackhole route is added for it"
                ),
                Ok(false) => {}
                Err(e) => error!("--ip-blackhole-route: {e}"),
            }
        }
    }

    fn failed(&mut self, e: PassError, _: &Others) {
        error!("--ip-blackhole-route: reading the routes: {e}");
    }
}
