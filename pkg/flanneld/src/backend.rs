//! The seam between leases and the kernel: a backend receives the other nodes' lease events.
//! Until the vxlan and host-gw backends exist, `Logging` programs nothing and logs each event.

use crate::lease::SubnetKey;
use crate::view::Event;
use serde_json::value::RawValue;
use std::collections::BTreeSet;

pub trait Backend: Send + 'static {
    /// What this node's lease says in `BackendData`.
    fn backend_data(&self) -> Option<Box<RawValue>>;

    /// FLANNEL_MTU.
    fn mtu(&self) -> u32;

    /// Brings the datapath in line with one batch of events.
    fn handle(&mut self, events: &[Event]);
}

/// Programs nothing: logs the events and counts the leases.
pub struct Logging {
    pub mtu: u32,
    known: BTreeSet<SubnetKey>,
}

impl Logging {
    pub fn new(mtu: u32) -> Logging {
        Logging {
            mtu,
            known: BTreeSet::new(),
        }
    }
}

impl Backend for Logging {
    fn backend_data(&self) -> Option<Box<RawValue>> {
        None
    }

    fn mtu(&self) -> u32 {
        self.mtu
    }

    fn handle(&mut self, events: &[Event]) {
        for e in events {
            match e {
                Event::Added(l) => {
                    self.known.insert(l.key);
                    tracing::info!("lease added: {l}");
                }
                Event::Removed(l) => {
                    self.known.remove(&l.key);
                    tracing::info!("lease removed: {l}");
                }
            }
        }
        tracing::debug!("{} other leases known", self.known.len());
    }
}
