//! What every backend type supplies: its checks of the node, its device per family (a value of
//! its own type behind [`Device`]), and the entries one family of another node's lease calls
//! for. The datapath plane does the rest (reading, diffing, writing, the route style) the same
//! for every type.

pub use crate::entries::DevicePeer;
use crate::entries::Want;
use crate::family::IpFamily;
use crate::iface::External;
use crate::lease::{Annotated, Lease, SubnetKey};
use crate::planes::DynPlane;
use cni_kernel::netlink::{Conn, Link};
use futures::future::BoxFuture;
use ipnetwork::IpNetwork;
use serde_json::value::RawValue;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

/// Another node's lease, as a backend programs it: the whole lease, and each of its families
/// this node programs (in the network, with a public address), IPv4 first.
#[derive(Debug, Clone)]
pub struct Peer<'a> {
    pub lease: &'a Lease,
    pub families: Vec<PeerFamily<'a>>,
}

/// One family of another node's lease, with this node's side of the path to it.
#[derive(Debug, Clone, Copy)]
pub struct PeerFamily<'a> {
    pub family: IpFamily,
    pub subnet: IpNetwork,
    pub public: IpAddr,
    /// Its backend data of this family (`BackendData`, `BackendV6Data`).
    pub data: Option<&'a RawValue>,
    /// This node's device of the family, once the kernel holds it.
    pub dev: Option<u32>,
}

impl<'a> PeerFamily<'a> {
    /// `lease`'s family `family` with this node's device `dev`, when the lease holds a subnet
    /// and a public address of it.
    pub fn of(lease: &'a Lease, family: IpFamily, dev: Option<u32>) -> Option<PeerFamily<'a>> {
        Some(PeerFamily {
            family,
            subnet: lease.key.subnet(family)?,
            public: lease.attrs.public(family)?,
            data: lease.attrs.backend_data_of(family),
            dev,
        })
    }
}

/// Why one family of another node's lease gives no entry: logged, and shown by `doctor`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skip {
    /// The lease is of another backend type than this node's.
    OtherBackend { theirs: String, ours: &'static str },
    /// The lease has a subnet of the family but no public address of it.
    NoPublicAddress(IpNetwork),
    /// Its backend data lacks what this backend needs to reach it (`what`: vxlan's VtepMAC).
    NoBackendData {
        what: &'static str,
        subnet: IpNetwork,
    },
}

impl fmt::Display for Skip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Skip::OtherBackend { theirs, ours } => {
                write!(f, "its backend is {theirs:?}, this node's is {ours}")
            }
            Skip::NoPublicAddress(subnet) => write!(f, "no public address for {subnet}"),
            Skip::NoBackendData { what, subnet } => write!(f, "no {what} for {subnet}"),
        }
    }
}

/// Why a backend cannot serve this node as it is: the start ends with status 2.
pub type Refusal = Box<dyn std::error::Error + Send + Sync>;

pub trait Backend: Send + Sync + fmt::Debug {
    /// `Backend.Type`, as the config names it and leases carry it.
    fn name(&self) -> &'static str;

    /// The `BackendType` its leases carry and the leases it serves carry: its name, but for
    /// `udp`, whose leases Go's flanneld writes without one.
    fn lease_type(&self) -> &'static str {
        self.name()
    }

    /// Whether it programs the kernel at all (`alloc` hands out subnets only).
    fn programs(&self) -> bool {
        true
    }

    /// Refuses a node it cannot serve, saying why.
    fn check(&self, _ext: &External, _families: &[IpFamily]) -> Result<(), Refusal> {
        Ok(())
    }

    /// Its device of one family as it must be, with the identity `announced` gives (this
    /// node's lease's backend data of the family; None: whatever identity it has or gets);
    /// None when it needs none.
    fn device(
        &self,
        _family: IpFamily,
        _ext: &External,
        _announced: Option<&RawValue>,
    ) -> Option<Arc<dyn Device>> {
        None
    }

    /// Which families of this node's lease its Node annotations carry (`--kube-subnet-mgr`):
    /// by default IPv4's alone, as flannel's IPv4-only backends write them.
    fn annotated(&self) -> Annotated {
        Annotated::default()
    }

    /// The entries another node's lease calls for, added to `want`, this node's external
    /// interface being `ext`; and why each of its families that gives none gives none.
    fn peer(&self, _ext: &External, _peer: &Peer<'_>, _want: &mut Want) -> Vec<Skip> {
        Vec::new()
    }

    /// What a backend without devices announces in this node's lease, made before the lease
    /// is taken (`extension`'s PreStartupCommand's output); a failure ends the start.
    fn announce<'a>(
        &'a self,
        _ext: &'a External,
    ) -> BoxFuture<'a, Result<Option<Box<RawValue>>, Refusal>> {
        Box::pin(async { Ok(None) })
    }

    /// Runs once this node's lease `own` is held (`extension`'s PostStartupCommand); a
    /// failure ends the start.
    fn leased<'a>(
        &'a self,
        _own: &'a Lease,
        _ext: &'a External,
    ) -> BoxFuture<'a, Result<(), Refusal>> {
        Box::pin(async { Ok(()) })
    }

    /// A plane of its own that keeps what the other nodes' leases call for, where that is not
    /// the kernel's entries (`extension`'s commands), for the node whose lease is `own`;
    /// `runs` false for `doctor`, which writes nothing.
    fn plane(&self, _own: SubnetKey, _runs: bool) -> Option<Box<dyn DynPlane>> {
        None
    }
}

/// What a device holds itself, as [`Device::inspect`] read it.
#[derive(Debug, Default)]
pub struct Held {
    /// How it differs from what the device must hold, one entry per attribute (empty: it
    /// fits); making the device mends them.
    pub differences: Vec<String>,
    /// Its per-peer state.
    pub peers: Vec<Arc<dyn DevicePeer>>,
}

/// A device a backend wants, as a value of the backend's own type: how it compares with the
/// link the kernel holds, how it is made, what it announces in the lease, and its MTU. The
/// datapath plane plans and writes devices through this alone, as it does the entries; its
/// address and its being up are the plane's, the same for every type.
pub trait Device: Send + Sync + fmt::Debug {
    /// The link's name, by which the kernel's is found.
    fn name(&self) -> &str;

    /// Its type as log lines say it (`vxlan`).
    fn kind(&self) -> &'static str;

    /// Its MTU: the underlay's, less what the encapsulation takes.
    fn mtu(&self) -> u32;

    /// How the link the kernel holds under its name differs from it, one entry per attribute
    /// (empty: it fits).
    fn differences(&self, held: &Link) -> Vec<String>;

    /// What `doctor` says of the link it found, beside the differences (vxlan: its MAC and the
    /// one the lease announces).
    fn show(&self, held: &Link) -> String {
        held.name.clone()
    }

    /// Makes it as it must be, mending or replacing the link of its name that differs; the
    /// link made.
    fn make<'a>(&'a self, conn: &'a Conn) -> BoxFuture<'a, cni_kernel::Result<Link>>;

    /// Before this node's lease is taken: makes it with the identity the kernel's device of
    /// its name has when that fits, else the one `earlier` (this node's earlier lease's
    /// backend data of its family) announced, else a new one; returns the backend data that
    /// announces it in the lease.
    fn establish<'a>(
        &'a self,
        conn: &'a Conn,
        earlier: Option<&'a RawValue>,
    ) -> BoxFuture<'a, cni_kernel::Result<Option<Box<RawValue>>>>;

    /// What the device holds itself beside the link and the kernel's tables (WireGuard's key,
    /// port and peers), as `link` holds it now: a read that writes nothing and blocks no async
    /// thread. A device without such state holds none.
    fn inspect<'a>(&'a self, _link: &'a Link) -> BoxFuture<'a, cni_kernel::Result<Held>> {
        Box::pin(async { Ok(Held::default()) })
    }

    /// Removes the peers `remove` and sets `put` in `link`; the failures, each naming its peer.
    fn write_peers<'a>(
        &'a self,
        _link: &'a Link,
        _put: &'a [&'a dyn DevicePeer],
        _remove: &'a [&'a dyn DevicePeer],
    ) -> BoxFuture<'a, Vec<cni_kernel::Error>> {
        Box::pin(async { Vec::new() })
    }
}

#[cfg(test)]
pub mod testing {
    use super::*;
    use crate::lease::{LeaseAttrs, SubnetKey};

    /// A lease of `backend` holding each of `families`: (subnet, public address, its backend
    /// data).
    pub fn lease(backend: &str, families: &[(&str, &str, Option<&str>)]) -> Lease {
        let mut key = SubnetKey {
            ipv4: None,
            ipv6: None,
        };
        let mut attrs = LeaseAttrs {
            public_ip: None,
            public_ipv6: None,
            backend_type: backend.into(),
            backend_data: None,
            backend_v6_data: None,
        };
        for (subnet, public, data) in families {
            let subnet: IpNetwork = subnet.parse().unwrap();
            key = key.with(subnet);
            match public.parse().unwrap() {
                IpAddr::V4(a) => attrs.public_ip = Some(a),
                IpAddr::V6(a) => attrs.public_ipv6 = Some(a),
            }
            let data = data.map(|d| RawValue::from_string(d.to_string()).unwrap());
            attrs.set_backend_data(IpFamily::of(subnet.ip()), data);
        }
        Lease { key, attrs }
    }

    /// The lease as the datapath gives it to the backend, this node's devices at `dev4` and
    /// `dev6`.
    pub fn peer(lease: &Lease, dev4: Option<u32>, dev6: Option<u32>) -> Peer<'_> {
        let families = [(IpFamily::V4, dev4), (IpFamily::V6, dev6)]
            .into_iter()
            .filter_map(|(f, dev)| PeerFamily::of(lease, f, dev))
            .collect();
        Peer { lease, families }
    }
}
