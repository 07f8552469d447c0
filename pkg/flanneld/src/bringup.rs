//! One bring-up for the daemon and `flanneld doctor`: the network config, the external
//! interface, the firewall, the backend and the route style ([`Ground`]), this node's lease,
//! the node it makes ([`NodeSpec`]) and the planes that keep it. The daemon waits for what is
//! not there yet, makes its devices and takes its lease; `doctor` reads once, finds the lease
//! among the listed ones and writes nothing. Each step says what it found through `say`: the
//! daemon logs it, `doctor` lists it.

use crate::alloc::{self, Node};
use crate::backend;
use crate::config::{self, NetConfig};
use crate::entries::RouteStyle;
use crate::error::StartError;
use crate::family::IpFamily;
use crate::iface::{self, Interfaces, Wanted};
use crate::lease::{Lease, LeaseAttrs, SubnetKey};
use crate::masq;
use crate::metrics::{self, METRICS};
use crate::planes::blackhole::BlackholePlane;
use crate::planes::firewall::FirewallPlane;
use crate::planes::netlink::{self as netlink_plane, NetlinkPlane};
use crate::planes::subnet_env::{MtuChain, SubnetEnvPlane};
use crate::planes::{DynPlane, Leases};
use crate::registry::{LeaseRequest, Registry};
use crate::retrying::Retrying;
use crate::settings::Settings;
use crate::spec::{Firewall, Ground, NodeSpec};
use cni_kernel::firewall::{self, xtables, Installed, IptablesMode};
use cni_kernel::netlink::Conn;
use ipnetwork::{IpNetwork, Ipv4Network, Ipv6Network};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// What the bring-up is for.
#[derive(Debug, Clone)]
pub enum Purpose {
    /// The daemon's start: it waits for the network config, makes its devices and takes its
    /// lease; `ready` is set once subnet.env is written.
    Serve { ready: Arc<AtomicBool> },
    /// `flanneld doctor`: one look, nothing written.
    Examine,
}

/// How much a step's finding matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// What was found: an info line, an `ok` finding.
    Fine,
    /// Something to know that works as it is: a warning, an `ok` finding.
    Notice,
    /// Something wrong that the start goes on without: a warning, a `wrong` finding.
    Wrong,
}

/// One step's finding: `kind` as `doctor` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub kind: &'static str,
    pub level: Level,
    pub text: String,
}

impl Note {
    fn new(kind: &'static str, level: Level, text: impl Into<String>) -> Note {
        Note {
            kind,
            level,
            text: text.into(),
        }
    }
}

/// The node brought up: what it should be, the planes that keep it, and its lease.
pub struct Prepared {
    pub spec: NodeSpec,
    /// The datapath, the firewall, subnet.env: in the order the start passes them.
    pub planes: Vec<Box<dyn DynPlane>>,
    pub own: Lease,
    /// When the lease expires; None where it does not (a podCIDR).
    pub expiry: Option<SystemTime>,
    /// `doctor`: the other nodes' leases as listed.
    pub others: Leases,
}

/// What a host without `br_netfilter` means, for the warning at start (Go's flanneld stops
/// there: flannel-io/flannel#2068).
const BR_NETFILTER_ABSENT: &str = "/proc/sys/net/bridge is absent (br_netfilter is not loaded): \
flanneld does not need it, and pods still reach each other and the outside; but traffic \
between pods on one node's bridge then bypasses iptables, so kube-proxy's Services and \
network policies may not see it (modprobe br_netfilter where they are used)";

/// Brings the node up for `purpose`; each step's finding goes to `say`.
pub async fn prepare(
    settings: &Settings,
    reg: &dyn Registry,
    ifaces: &Interfaces,
    purpose: &Purpose,
    say: &mut (dyn FnMut(Note) + Send),
) -> Result<Prepared, StartError> {
    let cfg = match purpose {
        Purpose::Serve { .. } => wait_for_config(reg).await?,
        Purpose::Examine => read_config(reg).await?,
    };
    say(Note::new("config", Level::Fine, describe_config(&cfg)));
    reg.use_config(&cfg);
    let examine = matches!(purpose, Purpose::Examine);
    let mut wanted = settings.wanted.clone();
    reg.public_ips(&mut wanted).await;
    let (ground, conn) = ground(settings, cfg, &wanted, ifaces, examine, say).await?;
    let (own, expiry, others) = match purpose {
        Purpose::Serve { .. } => {
            let (own, expiry) = take_lease(settings, reg, &ground, conn.as_ref()).await?;
            (own, expiry, Leases::new())
        }
        Purpose::Examine => find_lease(reg, &ground, say).await?,
    };
    let spec = NodeSpec::derive(&ground, &own);
    let planes = planes(settings, &spec, conn, purpose);
    Ok(Prepared {
        spec,
        planes,
        own,
        expiry,
        others,
    })
}

/// `network config: 10.5.0.0/16 /24 subnets, backend vxlan`.
fn describe_config(cfg: &NetConfig) -> String {
    format!(
        "network config: {}{}backend {}",
        cfg.ipv4
            .map(|f| format!("{} /{} subnets, ", f.network, f.subnet_len))
            .unwrap_or_default(),
        cfg.ipv6
            .map(|f| format!("{} /{} subnets, ", f.network, f.subnet_len))
            .unwrap_or_default(),
        cfg.backend_type
    )
}

/// The network config as the registry has it now.
async fn read_config(reg: &dyn Registry) -> Result<NetConfig, StartError> {
    match reg.config().await {
        Ok(Some(bytes)) => parse_config(reg, &bytes),
        Ok(None) => Err(StartError::NoConfig(reg.config_location())),
        Err(error) => Err(StartError::Registry {
            where_: reg.describe(),
            error,
        }),
    }
}

fn parse_config(reg: &dyn Registry, bytes: &[u8]) -> Result<NetConfig, StartError> {
    config::parse(&String::from_utf8_lossy(bytes)).map_err(|mut e| {
        e.reason = format!("{} (in {})", e.reason, reg.config_location());
        StartError::Config(e)
    })
}

/// The network config, waited for while there is none or the registry does not answer; each
/// trouble is logged when it starts, not at every retry.
async fn wait_for_config(reg: &dyn Registry) -> Result<NetConfig, StartError> {
    let mut trouble = Retrying::default();
    loop {
        let what = match reg.config().await {
            Ok(Some(bytes)) => return parse_config(reg, &bytes),
            Ok(None) => format!("no network config yet at {}", reg.config_location()),
            Err(e) => format!(
                "reading the network config at {}: {e}",
                reg.config_location()
            ),
        };
        if trouble.failed(&what) {
            tracing::warn!("{what}; retrying");
        }
        // Short: a node started while etcd has no quorum reads its config within a fraction
        // of a second of quorum's return (the registry's own tries pace the requests).
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// What the node stands on: the external interface, the firewall, the backend (checked
/// against the node) and the route style; and the netlink connection of a backend that
/// programs the kernel. `doctor` goes on without firewall rules no tool can write.
async fn ground(
    settings: &Settings,
    cfg: NetConfig,
    wanted: &Wanted,
    ifaces: &Interfaces,
    examine: bool,
    say: &mut (dyn FnMut(Note) + Send),
) -> Result<(Ground, Option<Conn>), StartError> {
    let wanted = Wanted {
        ipv4: cfg.ipv4.is_some(),
        ipv6: cfg.ipv6.is_some(),
        ..wanted.clone()
    };
    let ext = iface::choose(&ifaces.links, &ifaces.routes, &wanted)?;
    let public: Vec<String> = IpFamily::BOTH
        .into_iter()
        .filter_map(|f| ext.public(f).map(|a| a.to_string()))
        .collect();
    say(Note::new(
        "interface",
        Level::Fine,
        format!(
            "external interface {} (mtu {}), public address {}",
            ext.name,
            ext.mtu,
            public.join(" ")
        ),
    ));
    let firewall = match Firewall::choose(settings.masq, &cfg, Installed::here())
        .map_err(StartError::Firewall)
    {
        Ok(fw) => fw,
        Err(e) if examine => {
            say(Note::new("firewall", Level::Wrong, e.to_string()));
            Firewall {
                backend: None,
                note: None,
            }
        }
        Err(e) => return Err(e),
    };
    if let Some(note) = &firewall.note {
        let level = match firewall.backend {
            Some(_) => Level::Fine,
            None => Level::Wrong,
        };
        say(Note::new("firewall", level, note.clone()));
    }
    let mode = match firewall.backend {
        Some(firewall::Backend::Iptables) => {
            match iptables_mode(settings.iptables_mode, say).await {
                Ok(mode) => 1 + u64::from(mode == IptablesMode::Nft),
                Err(e) if examine => {
                    say(Note::new("firewall", Level::Wrong, e.to_string()));
                    0
                }
                Err(e) => return Err(e),
            }
        }
        Some(firewall::Backend::Nftables) => 3,
        None => 0,
    };
    metrics::set(&METRICS.firewall_mode, mode);
    if cni_kernel::sysctl::bridge_nf_call_iptables().is_none() {
        say(Note::new("bridge", Level::Notice, BR_NETFILTER_ABSENT));
    }
    let backend = backend::select(&cfg)?;
    backend
        .check(&ext, &cfg.families())
        .map_err(StartError::Backend)?;
    let (style, conn) = if backend.programs() {
        let conn = Conn::open()?;
        let (style, why) = netlink_plane::route_style(&conn, settings.nexthops).await;
        say(Note::new("routes", Level::Fine, why));
        metrics::set(
            &METRICS.route_style,
            1 + u64::from(style == RouteStyle::Nexthop),
        );
        (style, Some(conn))
    } else {
        (RouteStyle::Plain, None)
    };
    let ground = Ground {
        cfg,
        ext,
        backend,
        firewall,
        masq: settings.masq,
        style,
    };
    Ok((ground, conn))
}

/// The iptables mode the rules go through, chosen for the whole process: `asked`, else the one
/// the host's rules are in. Said with why.
async fn iptables_mode(
    asked: Option<IptablesMode>,
    say: &mut (dyn FnMut(Note) + Send),
) -> Result<IptablesMode, StartError> {
    let chosen = tokio::task::spawn_blocking(move || {
        xtables::choose(asked, &[masq::POSTRTG_CHAIN, masq::FWD_CHAIN])
    })
    .await
    .map_err(|e| {
        StartError::IptablesMode(cni_kernel::Error::failed(
            "choosing the iptables mode",
            "",
            e,
        ))
    })?
    .map_err(StartError::IptablesMode)?;
    say(Note::new(
        "firewall",
        Level::Fine,
        format!(
            "iptables mode {} ({}): {}",
            chosen.mode, chosen.program, chosen.reason
        ),
    ));
    Ok(chosen.mode)
}

/// The subnet(s) of an earlier subnet.env, if it is readable.
pub fn previous_key(path: &std::path::Path) -> Option<SubnetKey> {
    previous_key_in(&std::fs::read_to_string(path).ok()?)
}

/// The subnet(s) an earlier subnet.env's text names, if any.
pub fn previous_key_in(text: &str) -> Option<SubnetKey> {
    let entries = subnetenv::parse_entries(text).ok()?;
    let ipv4 = match entries.subnet {
        Some(IpNetwork::V4(n)) => Ipv4Network::new(n.network(), n.prefix()).ok(),
        _ => None,
    };
    let ipv6 = match entries.ipv6_subnet {
        Some(IpNetwork::V6(n)) => Ipv6Network::new(n.network(), n.prefix()).ok(),
        _ => None,
    };
    (ipv4.is_some() || ipv6.is_some()).then_some(SubnetKey { ipv4, ipv6 })
}

fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The daemon's lease: the devices made first, so that what identifies them goes into it.
async fn take_lease(
    settings: &Settings,
    reg: &dyn Registry,
    ground: &Ground,
    conn: Option<&Conn>,
) -> Result<(Lease, Option<SystemTime>), StartError> {
    let node = Node {
        public_ip: ground.ext.public_ip,
        public_ipv6: ground.ext.public_ipv6,
    };
    // This node's lease from before, for what its devices announced.
    let earlier = reg.earlier_lease(&ground.cfg, &node).await;
    let mut attrs = LeaseAttrs {
        public_ip: node.public_ip,
        public_ipv6: node.public_ipv6,
        backend_type: ground.backend.lease_type().to_string(),
        backend_data: None,
        backend_v6_data: None,
    };
    if let Some(conn) = conn {
        let families = ground.cfg.families();
        let backend = ground.backend.as_ref();
        let data =
            netlink_plane::prepare(conn, backend, &ground.ext, &families, earlier.as_ref()).await?;
        for (family, data) in data {
            attrs.set_backend_data(family, data);
        }
    } else {
        attrs.backend_data = ground
            .backend
            .announce(&ground.ext)
            .await
            .map_err(StartError::Backend)?;
    }
    let request = LeaseRequest {
        config: &ground.cfg,
        node,
        previous: previous_key(&settings.subnet_file),
        attrs: &attrs,
        annotated: ground.backend.annotated(),
        ttl: settings.ttl,
    };
    let acquired = reg.acquire(&request).await.map_err(StartError::Lease)?;
    tracing::info!("leased subnet {} in {}", acquired.key, reg.describe());
    if let Some(expiry) = acquired.expiry {
        metrics::set(&METRICS.lease_expiry, unix_secs(expiry));
    }
    let own = Lease {
        key: acquired.key,
        attrs,
    };
    ground
        .backend
        .leased(&own, &ground.ext)
        .await
        .map_err(StartError::Backend)?;
    Ok((own, acquired.expiry))
}

/// `doctor`'s lease: the listed one that carries this node's address, and the others.
async fn find_lease(
    reg: &dyn Registry,
    ground: &Ground,
    say: &mut (dyn FnMut(Note) + Send),
) -> Result<(Lease, Option<SystemTime>, Leases), StartError> {
    let listing = reg.list().await.map_err(|error| StartError::Registry {
        where_: reg.describe(),
        error,
    })?;
    let mut leases = Vec::new();
    for e in &listing.entries {
        match Lease::decode(&e.key, &e.value) {
            Ok(l) => leases.push(l),
            Err(why) => say(Note::new(
                "lease",
                Level::Wrong,
                format!("{}: {why}", e.key),
            )),
        }
    }
    let node = Node {
        public_ip: ground.ext.public_ip,
        public_ipv6: ground.ext.public_ipv6,
    };
    let own = leases
        .iter()
        .find(|l| alloc::is_mine(&ground.cfg, &node, l))
        .cloned()
        .ok_or_else(|| StartError::NoLease(reg.describe()))?;
    say(Note::new("lease", Level::Fine, own.to_string()));
    let others = leases
        .into_iter()
        .filter(|l| l.key != own.key)
        .map(|l| (l.key, Arc::new(l)))
        .collect();
    Ok((own, None, others))
}

/// The planes that keep `spec`, in the order the start passes them: the datapath (its
/// devices before the plugin is told the subnet), the firewall, the blackhole routes,
/// subnet.env.
fn planes(
    settings: &Settings,
    spec: &NodeSpec,
    conn: Option<Conn>,
    purpose: &Purpose,
) -> Vec<Box<dyn DynPlane>> {
    let mut planes: Vec<Box<dyn DynPlane>> = Vec::new();
    if let Some(conn) = conn {
        planes.push(Box::new(NetlinkPlane::new(conn, spec.datapath.clone())));
    }
    let serve = match purpose {
        Purpose::Serve { ready } => Some(ready.clone()),
        Purpose::Examine => None,
    };
    let backend = &spec.datapath.backend;
    if let Some(own) = backend.plane(spec.datapath.own, serve.is_some()) {
        planes.push(own);
    }
    if let Some(m) = spec.masq.clone() {
        // The old subnet.env says which rules an earlier lease left behind.
        let old = serve.as_ref().map(|_| {
            std::fs::read_to_string(&settings.subnet_file)
                .map(|t| masq::previous(&t))
                .unwrap_or((None, None))
        });
        planes.push(Box::new(FirewallPlane::new(
            m,
            settings.iptables_resync,
            old,
        )));
    }
    if settings.blackhole_route {
        planes.push(Box::new(BlackholePlane::new(
            spec.datapath.own,
            settings.iptables_resync,
        )));
    }
    let ext = &spec.datapath.ext;
    let chain = MtuChain {
        ext: ext.name.clone(),
        ext_mtu: ext.mtu,
        device_mtu: spec
            .datapath
            .families
            .iter()
            .find_map(|f| f.device.as_ref().map(|d| d.dev.mtu())),
    };
    planes.push(Box::new(SubnetEnvPlane::new(
        settings.subnet_file.clone(),
        spec.subnet_env.clone(),
        spec.datapath.own,
        chain,
        serve,
    )));
    planes
}
