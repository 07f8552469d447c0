//! Everything this node should be, derived once from what it stands on ([`Ground`]: the network
//! config, the external interface, the backend, the firewall, the route style) and its own
//! lease: its datapath (backend, devices, the families and their subnets), its firewall rules
//! and its subnet.env. Pure: the daemon and `flanneld doctor` derive the same node from the
//! same inputs.

use crate::backend::api::{Backend, Device, Peer, PeerFamily, Skip};
use crate::config::NetConfig;
use crate::entries::{is_our_nexthop_id, NexthopIds, RouteStyle, Want};
use crate::family::IpFamily;
use crate::iface::External;
use crate::lease::{Lease, SubnetKey};
use crate::masq::{MasqOptions, MasqSpec};
use cni_kernel::firewall::{self, Installed};
use cni_kernel::netlink::{Route, MAIN_TABLE};
use ipnetwork::IpNetwork;
use serde_json::value::RawValue;
use std::collections::HashSet;
use std::sync::Arc;
use subnetenv::SubnetEnv;

/// This node, as it should be.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    pub datapath: DatapathSpec,
    /// The masquerade and forward rules; None when neither `--ip-masq` nor
    /// `--iptables-forward-rules` asks for any.
    pub masq: Option<MasqSpec>,
    pub subnet_env: SubnetEnv,
}

/// How this node's firewall rules are written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Firewall {
    /// The rule backend; None when there are no rules to write (none asked for, or forward
    /// rules alone that no installed tool can write).
    pub backend: Option<firewall::Backend>,
    /// What an operator should know about that choice, for one log line and `doctor`:
    /// nftables because iptables is not installed, or forward rules left out.
    pub note: Option<String>,
}

impl Firewall {
    /// The backend for the rules `o` asks for under `cfg` on a host with the tools `have`:
    /// `EnableNFTables` or, without iptables, nftables; else iptables. `--ip-masq` with no tool
    /// to write its rules fails, saying what is missing (the start ends there); the forward
    /// rules alone are left out with a warning (the FORWARD policy then decides).
    pub fn choose(
        o: MasqOptions,
        cfg: &NetConfig,
        have: Installed,
    ) -> Result<Firewall, cni_kernel::Error> {
        if !(o.masq || o.forward_rules) {
            return Ok(Firewall {
                backend: None,
                note: None,
            });
        }
        match firewall::Backend::detect_with(cfg.enable_nftables, have) {
            Ok(d) => Ok(Firewall {
                backend: Some(d.backend),
                note: d.note,
            }),
            Err(e) if o.masq => Err(e),
            Err(e) => Ok(Firewall {
                backend: None,
                note: Some(format!(
                    "{e}: the FORWARD accept rules of --iptables-forward-rules are not written"
                )),
            }),
        }
    }
}

/// The datapath of this node: what the backend programs, for which families.
#[derive(Debug, Clone)]
pub struct DatapathSpec {
    pub backend: Arc<dyn Backend>,
    pub ext: External,
    /// This node's lease's subnets, which are not the other nodes'.
    pub own: SubnetKey,
    /// The families the network config enables, IPv4 first.
    pub families: Vec<FamilySpec>,
    pub style: RouteStyle,
}

/// One family of the datapath.
#[derive(Debug, Clone)]
pub struct FamilySpec {
    pub family: IpFamily,
    /// The cluster network.
    pub network: IpNetwork,
    /// The backend's device of this family, if it has one.
    pub device: Option<DeviceSpec>,
}

/// A device as it must be: the backend's, with this node's address on it.
#[derive(Debug, Clone)]
pub struct DeviceSpec {
    pub dev: Arc<dyn Device>,
    /// This node's subnet's network address as a host address, so that the node answers for
    /// its subnet on the overlay; None before the lease is taken.
    pub address: Option<IpNetwork>,
    /// The identity this node's lease announces for it (its backend data of the family).
    pub announced: Option<Box<RawValue>>,
}

/// What the other nodes' leases call for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Desired {
    pub want: Want,
    /// Leases that give no entry, with why.
    pub skipped: Vec<(SubnetKey, Skip)>,
    /// Leases with a subnet outside the network of its family, which are never programmed:
    /// the lease, the subnet and the network.
    pub outside: Vec<(SubnetKey, IpNetwork, IpNetwork)>,
}

/// Whether `subnet` lies in `network`.
fn within(network: IpNetwork, subnet: IpNetwork) -> bool {
    network.is_ipv4() == subnet.is_ipv4()
        && network.prefix() <= subnet.prefix()
        && network.contains(subnet.network())
}

/// FLANNEL_SUBNET's form: the subnet's first address with its prefix.
fn first_address(n: IpNetwork) -> IpNetwork {
    let ip = match n.network() {
        std::net::IpAddr::V4(a) => std::net::IpAddr::V4((u32::from(a).wrapping_add(1)).into()),
        std::net::IpAddr::V6(a) => std::net::IpAddr::V6((u128::from(a).wrapping_add(1)).into()),
    };
    IpNetwork::new(ip, n.prefix()).unwrap_or(n)
}

/// The subnet.env this node's lease gives.
pub fn subnet_env(cfg: &NetConfig, key: &SubnetKey, mtu: u32, ip_masq: bool) -> SubnetEnv {
    let of = |family| {
        (
            cfg.network(family).into_iter().collect::<Vec<_>>(),
            key.subnet(family).map(first_address),
        )
    };
    let ((networks, subnet), (ipv6_networks, ipv6_subnet)) = (of(IpFamily::V4), of(IpFamily::V6));
    SubnetEnv {
        networks,
        subnet,
        ipv6_networks,
        ipv6_subnet,
        mtu,
        ipmasq: ip_masq,
    }
}

/// What this node stands on before its lease: the network config, the external interface,
/// the backend the config names, how its firewall rules are written and what the flags ask of
/// them, and the route style the kernel allows.
#[derive(Debug, Clone)]
pub struct Ground {
    pub cfg: NetConfig,
    pub ext: External,
    pub backend: Arc<dyn Backend>,
    pub firewall: Firewall,
    pub masq: MasqOptions,
    pub style: RouteStyle,
}

impl NodeSpec {
    /// This node as what it stands on and its lease `own` make it.
    pub fn derive(ground: &Ground, own: &Lease) -> NodeSpec {
        let (cfg, ext, backend) = (&ground.cfg, &ground.ext, &ground.backend);
        let enabled = cfg.families();
        let families: Vec<FamilySpec> = enabled
            .iter()
            .filter_map(|&family| {
                let network = cfg.network(family)?;
                let announced = own.attrs.backend_data_of(family);
                let device = backend
                    .device(family, ext, announced)
                    .map(|dev| DeviceSpec {
                        dev,
                        address: own
                            .key
                            .subnet(family)
                            .and_then(|s| IpNetwork::new(s.network(), family.host_prefix()).ok()),
                        announced: announced.map(ToOwned::to_owned),
                    });
                Some(FamilySpec {
                    family,
                    network,
                    device,
                })
            })
            .collect();
        let o = ground.masq;
        let masq = ground.firewall.backend.map(|b| MasqSpec {
            ipv4: cfg.ipv4.zip(own.key.ipv4).map(|(f, s)| (f.network, s)),
            ipv6: cfg.ipv6.zip(own.key.ipv6).map(|(f, s)| (f.network, s)),
            nftables: b == firewall::Backend::Nftables,
            masq: o.masq,
            random_fully: o.random_fully,
            forward_rules: o.forward_rules,
        });
        // What fits through every device a pod's packet may take.
        let mtu = families
            .iter()
            .filter_map(|f| f.device.as_ref().map(|d| d.dev.mtu()))
            .min()
            .unwrap_or(ext.mtu);
        let subnet_env = subnet_env(cfg, &own.key, mtu, o.masq);
        NodeSpec {
            datapath: DatapathSpec {
                backend: backend.clone(),
                ext: ext.clone(),
                own: own.key,
                families,
                style: ground.style,
            },
            masq,
            subnet_env,
        }
    }
}

/// The kernel's index of this node's device of each family, once it holds them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceIndex(pub Vec<(IpFamily, u32)>);

impl DeviceIndex {
    pub fn of(&self, family: IpFamily) -> Option<u32> {
        self.0.iter().find(|(f, _)| *f == family).map(|(_, i)| *i)
    }

    pub fn contains(&self, index: u32) -> bool {
        self.0.iter().any(|(_, i)| *i == index)
    }
}

impl DatapathSpec {
    /// This datapath over the external interface `ext` (the same one made again): its devices
    /// as the backend wants them over it, with the identities the lease announces.
    pub fn over(&self, ext: External) -> DatapathSpec {
        let families = self
            .families
            .iter()
            .map(|f| FamilySpec {
                device: f.device.as_ref().and_then(|d| {
                    let dev = self
                        .backend
                        .device(f.family, &ext, d.announced.as_deref())?;
                    Some(DeviceSpec { dev, ..d.clone() })
                }),
                ..f.clone()
            })
            .collect();
        DatapathSpec {
            ext,
            families,
            ..self.clone()
        }
    }

    /// The entries the other nodes' leases call for, with this node's devices at `devs`; the
    /// ids of nexthops another program holds (`taken`) are left to it.
    pub fn desired<'a>(
        &self,
        devs: &DeviceIndex,
        taken: &HashSet<u32>,
        others: impl IntoIterator<Item = &'a Lease>,
    ) -> Desired {
        let others = others.into_iter();
        let has_devices = self.families.iter().any(|f| f.device.is_some());
        let ids = NexthopIds::new(
            self.families.iter().map(|f| f.network).collect(),
            taken.clone(),
        );
        let mut d = Desired {
            want: Want::new(self.style, ids, others.size_hint().0, has_devices),
            skipped: Vec::new(),
            outside: Vec::new(),
        };
        if !self.backend.programs() {
            return d;
        }
        for lease in others.filter(|l| l.key != self.own) {
            if lease.attrs.backend_type != self.backend.lease_type() {
                d.skipped.push((
                    lease.key,
                    Skip::OtherBackend {
                        theirs: lease.attrs.backend_type.clone(),
                        ours: self.backend.name(),
                    },
                ));
                continue;
            }
            let mut peer = Peer {
                lease,
                families: Vec::with_capacity(self.families.len()),
            };
            for f in &self.families {
                let Some(subnet) = lease.key.subnet(f.family) else {
                    continue;
                };
                if !within(f.network, subnet) {
                    d.outside.push((lease.key, subnet, f.network));
                    continue;
                }
                match PeerFamily::of(lease, f.family, devs.of(f.family)) {
                    Some(family) => peer.families.push(family),
                    None => d.skipped.push((lease.key, Skip::NoPublicAddress(subnet))),
                }
            }
            if peer.families.is_empty() {
                continue;
            }
            for why in self.backend.peer(&self.ext, &peer, &mut d.want) {
                d.skipped.push((lease.key, why));
            }
        }
        d
    }

    /// Whether a route of the kernel is one this datapath owns: into the cluster network (not
    /// this node's own subnet), through a device of ours, via a gateway on the external link
    /// or through a nexthop of ours.
    pub fn owns_route(&self, devs: &DeviceIndex, r: &Route) -> bool {
        if r.table != MAIN_TABLE || !self.backend.programs() {
            return false;
        }
        let family = IpFamily::of(r.dst.ip());
        let within = |n: IpNetwork| n.prefix() <= r.dst.prefix() && n.contains(r.dst.network());
        // Into this node's own subnet is never the datapath's: the bridge's route, or the
        // kernel's route to an IPv6 device's own /128 address.
        let inside = self
            .families
            .iter()
            .any(|f| f.family == family && within(f.network))
            && !self.own.subnet(family).is_some_and(within);
        let ours = r.oif.is_some_and(|o| devs.contains(o))
            || (r.oif == Some(self.ext.index) && r.gw.is_some())
            || r.nhid.is_some_and(is_our_nexthop_id);
        inside && ours
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::select;
    use crate::config;
    use crate::lease::LeaseAttrs;
    use cni_kernel::netlink::{FdbEntry, Neighbour, Nexthop};
    use serde_json::value::RawValue;
    use std::net::IpAddr;

    /// The firewall on a host with both tools.
    fn fw(s: MasqOptions, cfg: &NetConfig) -> Firewall {
        let both = Installed {
            iptables: true,
            nft: true,
        };
        Firewall::choose(s, cfg, both).unwrap()
    }

    /// The node with the rules `o` asks for, under `cfg`, with its lease `own`.
    fn node(o: MasqOptions, cfg: &NetConfig, own: &Lease) -> NodeSpec {
        let ground = Ground {
            cfg: cfg.clone(),
            ext: ext(),
            backend: select(cfg).unwrap(),
            firewall: fw(o, cfg),
            masq: o,
            style: RouteStyle::Plain,
        };
        NodeSpec::derive(&ground, own)
    }

    #[test]
    fn the_firewall_is_nftables_when_asked_or_when_iptables_is_missing() {
        let have = |iptables, nft| Installed { iptables, nft };
        let plain =
            config::parse(r#"{"Network":"10.5.0.0/16","Backend":{"Type":"vxlan"}}"#).unwrap();
        let nft = config::parse(r#"{"Network":"10.5.0.0/16","EnableNFTables":true}"#).unwrap();
        let masq = settings(&["--ip-masq"]);
        let choose = |s: &MasqOptions, cfg: &NetConfig, h| Firewall::choose(*s, cfg, h);
        let f = choose(&masq, &plain, have(true, true)).unwrap();
        assert_eq!(
            (f.backend, f.note),
            (Some(firewall::Backend::Iptables), None)
        );
        let f = choose(&masq, &nft, have(true, true)).unwrap();
        assert_eq!(f.backend, Some(firewall::Backend::Nftables));
        // No iptables: nftables, and one line says why.
        let f = choose(&masq, &plain, have(false, true)).unwrap();
        assert_eq!(f.backend, Some(firewall::Backend::Nftables));
        assert!(f.note.unwrap().contains("using nftables"));
        // --ip-masq that nothing can write fails, saying what is missing.
        let e = choose(&masq, &plain, have(false, false)).unwrap_err();
        assert_eq!(e.kind(), cni_kernel::Kind::Invalid, "{e}");
        assert!(e.to_string().contains("neither iptables"), "{e}");
        let e = choose(&masq, &nft, have(true, false)).unwrap_err();
        assert!(e.to_string().contains("EnableNFTables is set"), "{e}");
        // Forward rules alone: left out, with a warning.
        let fwd = settings(&[]);
        let f = choose(&fwd, &plain, have(false, false)).unwrap();
        assert_eq!(f.backend, None);
        assert!(f.note.unwrap().contains("not written"));
        // No rules asked: no tool needed.
        let none = settings(&["--iptables-forward-rules=false"]);
        assert_eq!(
            choose(&none, &plain, have(false, false)).unwrap().backend,
            None
        );
    }

    /// The masquerade options the flags `args` give.
    fn settings(args: &[&str]) -> MasqOptions {
        MasqOptions {
            masq: args.contains(&"--ip-masq"),
            random_fully: !args.contains(&"--ip-masq-fully-random-disable"),
            forward_rules: !args.contains(&"--iptables-forward-rules=false"),
        }
    }

    fn ext() -> External {
        External::example()
    }

    const MAC: [u8; 6] = [0xc6, 0xd2, 0x32, 0x6f, 0x8f, 0x44];

    fn data(mac: &str) -> Option<Box<RawValue>> {
        RawValue::from_string(format!(r#"{{"VNI":1,"VtepMAC":"{mac}"}}"#)).ok()
    }

    fn lease(key: &str, ip: &str, ty: &str, mac: Option<&str>) -> Lease {
        Lease {
            key: SubnetKey::parse(key).unwrap(),
            attrs: LeaseAttrs {
                public_ip: ip.parse().ok(),
                public_ipv6: None,
                backend_type: ty.into(),
                backend_data: mac.and_then(data),
                backend_v6_data: None,
            },
        }
    }

    fn dual() -> NetConfig {
        config::parse(r#"{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fc00::/48","Backend":{"Type":"vxlan"}}"#)
            .unwrap()
    }

    fn own() -> Lease {
        let mut l = lease(
            "10.5.1.0-24&fc00:0:0:1::-64",
            "192.168.0.1",
            "vxlan",
            Some("c6:d2:32:6f:8f:44"),
        );
        l.attrs.public_ipv6 = "fd00::1".parse().ok();
        l.attrs.backend_v6_data = data("c6:d2:32:6f:8f:46");
        l
    }

    fn spec(cfg: &NetConfig) -> DatapathSpec {
        node(settings(&[]), cfg, &own()).datapath
    }

    /// flannel.1 as the kernel holds it, with `mac`.
    fn vxlan_link(mac: [u8; 6]) -> cni_kernel::netlink::Link {
        cni_kernel::netlink::Link {
            index: 10,
            name: "flannel.1".into(),
            kind: Some("vxlan".into()),
            mac: mac.to_vec(),
            mtu: Some(1450),
            vxlan: Some(cni_kernel::netlink::Vxlan {
                vni: 1,
                port: 8472,
                local: "192.168.0.1".parse().ok(),
                device: Some(2),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn devs() -> DeviceIndex {
        DeviceIndex(vec![(IpFamily::V4, 10), (IpFamily::V6, 11)])
    }

    #[test]
    fn the_node_follows_the_flags_the_config_the_interface_and_the_lease() {
        let s = settings(&[
            "--ip-masq",
            "--ip-masq-fully-random-disable",
            "--iptables-forward-rules=false",
        ]);
        let cfg = config::parse(
            r#"{"Network":"10.5.0.0/16","IPv6Network":"fd00:5::/56","EnableIPv6":true,"EnableNFTables":true,"Backend":{"Type":"vxlan"}}"#,
        )
        .unwrap();
        let mut own = lease(
            "10.5.1.0-24",
            "192.168.0.1",
            "vxlan",
            Some("c6:d2:32:6f:8f:44"),
        );
        own.key.ipv6 = None;
        let node = node(s, &cfg, &own);
        assert_eq!(
            node.masq,
            Some(MasqSpec {
                ipv4: Some((
                    "10.5.0.0/16".parse().unwrap(),
                    "10.5.1.0/24".parse().unwrap()
                )),
                ipv6: None,
                nftables: true,
                masq: true,
                random_fully: false,
                forward_rules: false,
            })
        );
        let d = &node.datapath;
        assert_eq!(d.backend.name(), "vxlan");
        assert_eq!(d.families.len(), 2);
        let v4 = d.families[0].device.as_ref().unwrap();
        assert_eq!(v4.dev.name(), "flannel.1");
        assert!(v4.dev.differences(&vxlan_link(MAC)).is_empty());
        assert!(v4
            .dev
            .show(&vxlan_link(MAC))
            .contains("(the lease says c6:d2:32:6f:8f:44)"));
        assert_eq!(v4.address, "10.5.1.0/32".parse().ok());
        let v6 = d.families[1].device.as_ref().unwrap();
        assert_eq!((v6.dev.name(), v6.address), ("flannel-v6.1", None));
        assert!(v6
            .dev
            .show(&vxlan_link(MAC))
            .contains("(the lease says nothing)"));
        // Both families' devices: the IPv6 one's MTU is the pods'.
        assert_eq!(node.subnet_env.mtu, 1430);
        // Neither masquerade nor forward rules: no firewall rules at all.
        let none = settings(&["--iptables-forward-rules=false"]);
        assert_eq!(super::tests::node(none, &cfg, &own).masq, None);
    }

    #[test]
    fn subnet_env_is_flannels_byte_for_byte() {
        let cfg = config::parse(r#"{"Network":"10.5.0.0/16","Backend":{"Type":"vxlan"}}"#).unwrap();
        let key = SubnetKey::parse("10.5.52.0-24").unwrap();
        assert_eq!(
            subnet_env(&cfg, &key, 1450, true).render(),
            "FLANNEL_NETWORK=10.5.0.0/16\nFLANNEL_SUBNET=10.5.52.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"
        );
        let key = SubnetKey::parse("10.5.52.0-24&fc00:0:0:1::-64").unwrap();
        let cfg = config::parse(
            r#"{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fc00::/48","Backend":{"Type":"vxlan"}}"#,
        )
        .unwrap();
        assert_eq!(
            subnet_env(&cfg, &key, 1500, false).render(),
            "FLANNEL_NETWORK=10.5.0.0/16\nFLANNEL_SUBNET=10.5.52.1/24\nFLANNEL_IPV6_NETWORK=fc00::/48\nFLANNEL_IPV6_SUBNET=fc00:0:0:1::1/64\nFLANNEL_MTU=1500\nFLANNEL_IPMASQ=false\n"
        );
        let cfg =
            config::parse(r#"{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fc00::/48"}"#)
                .unwrap();
        let key = SubnetKey::parse("0.0.0.0-0&fc00:0:0:7::-64").unwrap();
        assert_eq!(
            subnet_env(&cfg, &key, 1500, false).render(),
            "FLANNEL_IPV6_NETWORK=fc00::/48\nFLANNEL_IPV6_SUBNET=fc00:0:0:7::1/64\nFLANNEL_MTU=1500\nFLANNEL_IPMASQ=false\n"
        );
        // The node's own derivation writes the same.
        let (s, cfg) = (
            settings(&["--ip-masq"]),
            config::parse(r#"{"Network":"10.5.0.0/16","Backend":{"Type":"vxlan"}}"#).unwrap(),
        );
        let node = node(
            s,
            &cfg,
            &lease(
                "10.5.52.0-24",
                "192.168.0.1",
                "vxlan",
                Some("c6:d2:32:6f:8f:44"),
            ),
        );
        assert_eq!(
            node.subnet_env.render(),
            "FLANNEL_NETWORK=10.5.0.0/16\nFLANNEL_SUBNET=10.5.52.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"
        );
    }

    #[test]
    fn vxlan_gives_each_peer_a_route_a_neighbour_and_an_fdb_entry_per_family() {
        let s = spec(&dual());
        let mut peer = lease(
            "10.5.2.0-24&fc00:0:0:2::-64",
            "192.168.0.2",
            "vxlan",
            Some("c6:d2:32:6f:8f:44"),
        );
        peer.attrs.public_ipv6 = "fd00::2".parse().ok();
        peer.attrs.backend_v6_data = data("c6:d2:32:6f:8f:46");
        let d = s.desired(&devs(), &HashSet::new(), &[peer, own()]);
        let e = &d.want.entries;
        let gw: IpAddr = "10.5.2.0".parse().unwrap();
        assert_eq!(e.routes.len(), 2);
        assert_eq!(
            e.routes[0],
            Route::new("10.5.2.0/24".parse().unwrap(), Some(gw), Some(10)).onlink()
        );
        assert_eq!(e.routes[1].oif, Some(11));
        assert_eq!(e.neighbours[0], Neighbour::permanent(10, gw, MAC));
        assert_eq!(e.neighbours[1].mac[5], 0x46);
        assert_eq!(
            e.fdb[0],
            FdbEntry::permanent(10, MAC, "192.168.0.2".parse().unwrap())
        );
        assert_eq!(e.fdb[1].dst, "fd00::2".parse().ok());
        assert!(d.skipped.is_empty(), "{:?}", d.skipped);
    }

    #[test]
    fn leases_of_another_backend_or_without_an_address_are_skipped_with_why() {
        let cfg = config::parse(r#"{"Network":"10.5.0.0/16","Backend":{"Type":"vxlan"}}"#).unwrap();
        let s = spec(&cfg);
        let d = s.desired(
            &devs(),
            &HashSet::new(),
            &[
                lease("10.5.2.0-24", "192.168.0.2", "host-gw", None),
                lease("10.5.3.0-24", "192.168.0.3", "vxlan", None),
                lease("10.5.4.0-24", "", "vxlan", Some("c6:d2:32:6f:8f:44")),
            ],
        );
        assert_eq!(d.want.entries, Default::default());
        let why: Vec<String> = d.skipped.iter().map(|(_, w)| w.to_string()).collect();
        assert_eq!(why.len(), 3);
        assert!(why[0].contains("host-gw"));
        assert!(why[1].contains("VtepMAC"));
        assert!(why[2].contains("no public address for 10.5.4.0/24"));
    }

    #[test]
    fn host_gw_routes_via_the_public_address_and_alloc_programs_nothing() {
        let cfg =
            config::parse(r#"{"Network":"10.5.0.0/16","Backend":{"Type":"host-gw"}}"#).unwrap();
        let mut own = own();
        own.attrs.backend_type = "host-gw".into();
        let s = node(settings(&[]), &cfg, &own).datapath;
        assert!(s.families[0].device.is_none());
        let d = s.desired(
            &DeviceIndex::default(),
            &HashSet::new(),
            &[lease("10.5.2.0-24", "192.168.0.2", "host-gw", None)],
        );
        assert_eq!(
            d.want.entries.routes,
            [Route::new(
                "10.5.2.0/24".parse().unwrap(),
                "192.168.0.2".parse().ok(),
                Some(2)
            )]
        );
        let cfg = config::parse(r#"{"Network":"10.5.0.0/16","Backend":{"Type":"alloc"}}"#).unwrap();
        let s = node(settings(&[]), &cfg, &own).datapath;
        let d = s.desired(
            &DeviceIndex::default(),
            &HashSet::new(),
            &[lease("10.5.2.0-24", "192.168.0.2", "alloc", None)],
        );
        assert!(d.skipped.is_empty());
        assert_eq!(d.want.entries, Default::default());
        let r = Route::new(
            "10.5.2.0/24".parse().unwrap(),
            "192.168.0.2".parse().ok(),
            Some(2),
        );
        assert!(!s.owns_route(&DeviceIndex::default(), &r));
    }

    #[test]
    fn only_routes_into_the_network_through_our_devices_are_owned() {
        let s = spec(&dual());
        let r = |dst: &str, gw: Option<&str>, oif: u32| {
            Route::new(
                dst.parse().unwrap(),
                gw.and_then(|g| g.parse().ok()),
                Some(oif),
            )
        };
        let d = devs();
        assert!(s.owns_route(&d, &r("10.5.2.0/24", Some("10.5.2.0"), 10)));
        assert!(s.owns_route(&d, &r("10.5.2.0/24", Some("192.168.0.2"), 2)));
        assert!(s.owns_route(&d, &r("fc00:0:0:2::/64", Some("fc00:0:0:2::"), 11)));
        assert!(
            !s.owns_route(&d, &r("10.5.1.0/24", None, 5)),
            "own subnet (cni0)"
        );
        assert!(
            !s.owns_route(&d, &r("10.5.1.0/24", Some("10.5.1.0"), 10)),
            "own subnet"
        );
        assert!(
            !s.owns_route(&d, &r("192.168.0.0/24", None, 2)),
            "outside the network"
        );
        assert!(
            !s.owns_route(&d, &r("10.5.9.0/24", None, 2)),
            "no gateway on the external link"
        );
        assert!(
            !s.owns_route(&d, &r("10.5.9.0/24", Some("10.0.0.1"), 7)),
            "another device"
        );
        assert!(
            !s.owns_route(&d, &r("10.0.0.0/8", Some("10.5.2.0"), 10)),
            "wider than the network"
        );
        let through = |dst: &str, id: u32| Route::via_nexthop(dst.parse().unwrap(), id);
        assert!(s.owns_route(&d, &through("10.5.2.0/24", 4_000_000_002)));
        assert!(s.owns_route(&d, &through("fc00:0:0:2::/64", 4_100_000_002)));
        assert!(
            !s.owns_route(&d, &through("10.5.2.0/24", 7)),
            "through another program's nexthop"
        );
        assert!(
            !s.owns_route(&d, &through("10.5.1.0/24", 4_000_000_001)),
            "own subnet"
        );
    }

    #[test]
    fn the_nexthop_style_gives_every_backend_a_nexthop_per_path_with_the_subnets_id() {
        let mut s = spec(&dual());
        s.style = RouteStyle::Nexthop;
        let mut peer = lease(
            "10.5.2.0-24&fc00:0:0:2::-64",
            "192.168.0.2",
            "vxlan",
            Some("c6:d2:32:6f:8f:44"),
        );
        peer.attrs.public_ipv6 = "fd00::2".parse().ok();
        peer.attrs.backend_v6_data = data("c6:d2:32:6f:8f:46");
        let d = s.desired(&devs(), &HashSet::new(), std::slice::from_ref(&peer));
        let e = &d.want.entries;
        let gw: IpAddr = "10.5.2.0".parse().unwrap();
        assert_eq!(
            e.nexthops,
            [
                Nexthop::onlink(4_000_000_002, gw, 10),
                Nexthop::onlink(4_100_000_002, "fc00:0:0:2::".parse().unwrap(), 11)
            ]
        );
        assert_eq!(
            e.routes,
            [
                Route::via_nexthop("10.5.2.0/24".parse().unwrap(), 4_000_000_002),
                Route::via_nexthop("fc00:0:0:2::/64".parse().unwrap(), 4_100_000_002)
            ]
        );
        assert_eq!(e.neighbours.len(), 2);
        assert_eq!(e.fdb.len(), 2);
        // host-gw: via the public address on the external interface, not onlink.
        let cfg =
            config::parse(r#"{"Network":"10.5.0.0/16","Backend":{"Type":"host-gw"}}"#).unwrap();
        let mut own = own();
        own.attrs.backend_type = "host-gw".into();
        let none = settings(&[]);
        let mut s = node(none, &cfg, &own).datapath;
        s.style = RouteStyle::Nexthop;
        let d = s.desired(
            &DeviceIndex::default(),
            &HashSet::new(),
            &[lease("10.5.2.0-24", "192.168.0.2", "host-gw", None)],
        );
        let mut via = Nexthop::onlink(4_000_000_002, "192.168.0.2".parse().unwrap(), 2);
        via.onlink = false;
        assert_eq!(d.want.entries.nexthops, [via]);
        // An id another program's nexthop holds is left to it: a plain route instead.
        let taken = HashSet::from([4_000_000_002]);
        let d = s.desired(
            &DeviceIndex::default(),
            &taken,
            &[lease("10.5.2.0-24", "192.168.0.2", "host-gw", None)],
        );
        assert!(d.want.entries.nexthops.is_empty());
        assert_eq!(d.want.entries.routes[0].gw, "192.168.0.2".parse().ok());
    }

    #[test]
    fn leases_outside_the_network_are_never_programmed() {
        let cfg = config::parse(r#"{"Network":"10.5.0.0/16","Backend":{"Type":"vxlan"}}"#).unwrap();
        let s = spec(&cfg);
        let mac = Some("c6:d2:32:6f:8f:44");
        let d = s.desired(
            &devs(),
            &HashSet::new(),
            &[
                lease("10.6.2.0-24", "192.168.0.2", "vxlan", mac),
                lease("10.0.0.0-8", "192.168.0.3", "vxlan", mac),
                lease("10.5.3.0-24", "192.168.0.4", "vxlan", mac),
            ],
        );
        assert_eq!(d.want.entries.routes.len(), 1);
        assert_eq!(d.want.entries.neighbours.len(), 1);
        let outside: Vec<String> = d
            .outside
            .iter()
            .map(|(k, s, n)| format!("{k} {s} {n}"))
            .collect();
        assert_eq!(
            outside,
            [
                "10.6.2.0-24 10.6.2.0/24 10.5.0.0/16",
                "10.0.0.0-8 10.0.0.0/8 10.5.0.0/16"
            ]
        );
    }
}
