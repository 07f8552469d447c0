//! What a failing ADD has made so far, undone in reverse: rules, veth, address.

use super::ipam::Ipam;
use super::rules;
use crate::{IpFamily, NetConf};
use cni_kernel::netlink::Netlink;
use cni_protocol::Request;

#[derive(Default)]
pub struct Undo {
    host_veth: Option<(Netlink, u32)>,
    rules: Option<Vec<IpFamily>>,
}

impl Undo {
    pub fn veth_made(&mut self, host: &Netlink, host_index: u32) {
        self.host_veth = Some((host.clone(), host_index));
    }

    /// Recorded before the batch runs: a batch that half failed is removed too.
    pub fn rules_made(&mut self, families: Vec<IpFamily>) {
        self.rules = Some(families);
    }

    /// Removes everything recorded and gives the address back; what fails here is reported on
    /// stderr, since the error the runtime sees is the one that made ADD fail.
    pub fn run(self, req: &Request, conf: &NetConf, ipam: &mut Ipam) {
        if let Some(families) = &self.rules {
            if let Err(e) = rules::remove(&req.env, conf, families) {
                eprintln!("rolling back: removing the rules failed: {e}");
            }
        }
        if let Some((host, index)) = self.host_veth {
            // Deleting one end deletes the pair, the container end with it.
            if let Err(e) = host.delete_link(index) {
                eprintln!("rolling back: deleting the veth failed: {e}");
            }
        }
        ipam.release();
    }
}
