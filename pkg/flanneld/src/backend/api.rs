//! What every backend type supplies: its checks of the node, its device per family and what
//! that device announces in the lease, the MTU it leaves the pods, and the entries one family
//! of another node's lease calls for. The datapath plane does the rest (reading, diffing,
//! writing, the route style) the same for every type.

use crate::entries::Want;
use crate::family::IpFamily;
use crate::iface::External;
use crate::lease::SubnetKey;
use cni_kernel::netlink::VxlanSpec;
use ipnetwork::IpNetwork;
use serde_json::value::RawValue;
use std::fmt;
use std::net::IpAddr;

/// One family of another node's lease, as a backend needs it.
#[derive(Debug, Clone, Copy)]
pub struct Peer<'a> {
    pub key: SubnetKey,
    pub subnet: IpNetwork,
    pub public: IpAddr,
    /// Its backend data of this family (`BackendData`, `BackendV6Data`).
    pub data: Option<&'a RawValue>,
}

/// This node's side of a path to a peer of one family.
#[derive(Debug, Clone, Copy)]
pub struct Here<'a> {
    pub ext: &'a External,
    /// This node's device of the peer's family, once the kernel holds it.
    pub dev: Option<u32>,
}

pub trait Backend: Send + Sync + fmt::Debug {
    /// `Backend.Type`, as the config names it and leases carry it.
    fn name(&self) -> &'static str;

    /// Whether it programs the kernel at all (`alloc` hands out subnets only).
    fn programs(&self) -> bool {
        true
    }

    /// Refuses a node it cannot serve, saying why (the start ends with status 2).
    fn check(&self, _ext: &External, _families: &[IpFamily]) -> Result<(), String> {
        Ok(())
    }

    /// FLANNEL_MTU: what fits through every device a pod's packet may take.
    fn mtu(&self, ext: &External, _families: &[IpFamily]) -> u32 {
        ext.mtu
    }

    /// Its device of one family as it must be, with `mac` (None: whatever it has); None when
    /// it needs none.
    fn device(
        &self,
        _family: IpFamily,
        _ext: &External,
        _mac: Option<[u8; 6]>,
    ) -> Option<VxlanSpec> {
        None
    }

    /// The lease's backend data that announces a device's MAC to the other nodes...
    fn lease_data(&self, _mac: [u8; 6]) -> Option<Box<RawValue>> {
        None
    }

    /// ...and the MAC a lease's backend data announces.
    fn announced_mac(&self, _data: Option<&RawValue>) -> Option<[u8; 6]> {
        None
    }

    /// The entries one family of another node's lease calls for, added to `want`; or why it
    /// gives none.
    fn peer(&self, _here: &Here<'_>, _peer: &Peer<'_>, _want: &mut Want) -> Result<(), String> {
        Ok(())
    }
}
