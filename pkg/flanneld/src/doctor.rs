//! `flanneld doctor`: what the daemon would find, with nothing written. It reads the registry
//! and derives the node as the daemon does (`NodeSpec`), then asks each plane of the
//! reconciler for its look (devices, each other node's entries, the masquerade rules) and
//! compares subnet.env and the MTU chain. `--fix` then applies what the planes found, once,
//! writes subnet.env if it is wrong, and looks again.

use crate::alloc::{self, Node};
use crate::backend;
use crate::config::{self, NetConfig};
use crate::iface::Interfaces;
use crate::lease::Lease;
use crate::planes::firewall::FirewallPlane;
use crate::planes::netlink::{self as netlink_plane, NetlinkPlane};
use crate::reconcile::{Leases, Others, Plane};
use crate::registry::Registry;
use crate::report::{Finding, Report};
use crate::settings::Settings;
use crate::spec::{external, Firewall, NodeSpec};
use cni_kernel::firewall::Installed;
use cni_kernel::netlink::Conn;
use serde::Serialize;
use std::path::Path;
use std::sync::Arc;

/// What `doctor` prints: the look, and with `--fix` the look after the fix.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Examination {
    #[serde(flatten)]
    pub before: Report,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after_fix: Option<Report>,
}

impl Examination {
    /// What is still wrong: after the fix when there was one.
    pub fn problems(&self) -> usize {
        self.after_fix.as_ref().unwrap_or(&self.before).problems()
    }

    pub fn text(&self) -> String {
        let mut out = self.before.text();
        if let Some(after) = &self.after_fix {
            out.push_str("--fix: wrote what was missing or wrong; looking again:\n");
            out.push_str(&after.text());
        }
        out
    }
}

/// The node as the daemon would derive it, and the other nodes' leases.
struct Examined {
    spec: NodeSpec,
    others: Leases,
}

/// The network config, the interface, the leases and this node's own: a finding for each,
/// and the node derived from them when all are there.
async fn derive<R: Registry>(
    reg: &R,
    settings: &Settings,
    ifaces: &Interfaces,
    f: &mut Vec<Finding>,
) -> Option<Examined> {
    let cfg: NetConfig = match reg.config().await {
        Ok(Some(b)) => match config::parse(&String::from_utf8_lossy(&b)) {
            Ok(c) => c,
            Err(e) => {
                f.push(Finding::new("config", "wrong", e.to_string()));
                return None;
            }
        },
        Ok(None) => {
            f.push(Finding::new(
                "config",
                "missing",
                format!("no network config at {}", reg.config_location()),
            ));
            return None;
        }
        Err(e) => {
            f.push(Finding::new(
                "registry",
                "wrong",
                format!("{}: {e}", reg.describe()),
            ));
            return None;
        }
    };
    if let Err(e) = backend::select(&cfg) {
        f.push(Finding::new("config", "wrong", e.to_string()));
        return None;
    }
    let ext = match external(settings, &cfg, ifaces) {
        Ok(e) => e,
        Err(e) => {
            f.push(Finding::new("interface", "wrong", e.to_string()));
            return None;
        }
    };
    f.push(Finding::new(
        "interface",
        "ok",
        format!("{} (mtu {})", ext.name, ext.mtu),
    ));
    let listing = match reg.list().await {
        Ok(l) => l,
        Err(e) => {
            f.push(Finding::new(
                "registry",
                "wrong",
                format!("{}: {e}", reg.describe()),
            ));
            return None;
        }
    };
    let mut leases = Vec::new();
    for e in &listing.entries {
        match Lease::decode(&e.key, &e.value) {
            Ok(l) => leases.push(l),
            Err(why) => f.push(Finding::new("lease", "wrong", format!("{}: {why}", e.key))),
        }
    }
    let node = Node {
        public_ip: ext.public_ip,
        public_ipv6: ext.public_ipv6,
    };
    let Some(own) = leases
        .iter()
        .find(|l| alloc::is_mine(&cfg, &node, l))
        .cloned()
    else {
        f.push(Finding::new(
            "lease",
            "missing",
            format!("no lease carries this node's address in {}", reg.describe()),
        ));
        return None;
    };
    f.push(Finding::new("lease", "ok", format!("{own}")));
    let fw = match Firewall::choose(settings, &cfg, Installed::here()) {
        Ok(fw) => {
            if let Some(note) = &fw.note {
                let state = if fw.backend.is_some() { "ok" } else { "wrong" };
                f.push(Finding::new("firewall", state, note.clone()));
            }
            fw
        }
        Err(e) => {
            f.push(Finding::new("firewall", "wrong", e.to_string()));
            Firewall {
                backend: None,
                note: None,
            }
        }
    };
    let spec = match NodeSpec::derive(settings, &cfg, &ext, &own, &fw) {
        Ok(s) => s,
        Err(e) => {
            f.push(Finding::new("config", "wrong", e.to_string()));
            return None;
        }
    };
    let others = leases
        .into_iter()
        .filter(|l| l.key != own.key)
        .map(|l| (l.key, Arc::new(l)))
        .collect();
    Some(Examined { spec, others })
}

/// subnet.env against the lease and the spec, and the MTU chain.
fn subnet_env_findings(spec: &NodeSpec, file: &Path, device_mtu: Option<u32>) -> Vec<Finding> {
    let Some(env) = std::fs::read_to_string(file)
        .ok()
        .and_then(|t| subnetenv::parse_entries(&t).ok())
    else {
        return vec![Finding::new(
            "subnet.env",
            "missing",
            file.display().to_string(),
        )];
    };
    let own = spec.datapath.own;
    let ext = &spec.datapath.ext;
    let sub = env.subnet.map(|s| s.network().to_string());
    let leased = own.ipv4.map(|s| s.network().to_string());
    let env_mtu = env.mtu.unwrap_or(0);
    vec![
        Finding::new(
            "subnet.env",
            if sub == leased { "ok" } else { "wrong" },
            format!(
                "FLANNEL_SUBNET {} for lease {own}",
                env.subnet
                    .map(|s| s.to_string())
                    .unwrap_or_else(|| "(none)".into())
            ),
        ),
        Finding::new(
            "mtu",
            if env_mtu == spec.subnet_env.mtu && env_mtu != 0 {
                "ok"
            } else {
                "wrong"
            },
            format!(
                "{} {} -> device {} -> FLANNEL_MTU {env_mtu}",
                ext.name,
                ext.mtu,
                device_mtu
                    .map(|m| m.to_string())
                    .unwrap_or_else(|| "-".into())
            ),
        ),
    ]
}

/// The planes of the node as the daemon runs them, for a look.
struct Planes {
    netlink: Option<NetlinkPlane>,
    firewall: Option<FirewallPlane>,
}

impl Planes {
    async fn of(node: &Examined, settings: &Settings, f: &mut Vec<Finding>) -> Option<Planes> {
        let netlink = if node.spec.datapath.backend.programs() {
            match Conn::open() {
                Ok(conn) => {
                    // The style the daemon would choose, asked of the kernel as it asks.
                    let (style, why) = netlink_plane::route_style(&conn, settings.nexthops).await;
                    f.push(Finding::new("routes", "ok", why));
                    let mut spec = node.spec.datapath.clone();
                    spec.style = style;
                    Some(NetlinkPlane::new(conn, spec))
                }
                Err(e) => {
                    f.push(Finding::new("kernel", "wrong", e.to_string()));
                    return None;
                }
            }
        } else {
            None
        };
        let firewall = node
            .spec
            .masq
            .clone()
            .map(|m| FirewallPlane::new(m, settings.iptables_resync, None));
        Some(Planes { netlink, firewall })
    }

    /// Every plane's look, in the order the daemon sets the node up, with subnet.env between
    /// the datapath and the firewall.
    async fn examine(&mut self, node: &Examined, file: &Path) -> Vec<Finding> {
        let mut out = Vec::new();
        let mut device_mtu = None;
        if let Some(p) = &mut self.netlink {
            out.extend(p.examine(&node.others).await);
            device_mtu = p.device_mtu();
        }
        out.extend(subnet_env_findings(&node.spec, file, device_mtu));
        if let Some(p) = &mut self.firewall {
            out.extend(p.examine(&node.others).await);
        }
        out
    }

    /// Every plane's pass, once, as the daemon would make it.
    async fn repair(&mut self, node: &Examined) {
        let others = Others::Known {
            leases: Arc::new(node.others.clone()),
            changed: true,
        };
        if let Some(p) = &mut self.netlink {
            p.repair(others.clone()).await;
        }
        if let Some(p) = &mut self.firewall {
            p.repair(others).await;
        }
    }
}

/// One look: the findings, and the node and its planes when it got that far.
async fn look<R: Registry>(
    reg: &R,
    settings: &Settings,
    ifaces: &Interfaces,
) -> (Report, Option<(Examined, Planes)>) {
    let mut report = Report::default();
    let Some(node) = derive(reg, settings, ifaces, &mut report.findings).await else {
        return (report, None);
    };
    let Some(mut planes) = Planes::of(&node, settings, &mut report.findings).await else {
        return (report, None);
    };
    report
        .findings
        .extend(planes.examine(&node, &settings.subnet_file).await);
    (report, Some((node, planes)))
}

/// The whole check; with `fix`, when anything is wrong, every plane's pass, subnet.env
/// written if it is wrong, and a second look.
pub async fn examine<R: Registry>(
    reg: &R,
    settings: &Settings,
    ifaces: &Interfaces,
    fix: bool,
) -> Examination {
    let (before, found) = look(reg, settings, ifaces).await;
    let Some((node, mut planes)) = found.filter(|_| fix && before.problems() > 0) else {
        return Examination {
            before,
            after_fix: None,
        };
    };
    planes.repair(&node).await;
    let file = &settings.subnet_file;
    let env_wrong = before
        .findings
        .iter()
        .any(|f| (f.kind == "subnet.env" || f.kind == "mtu") && f.state != "ok");
    if env_wrong {
        if let Err(e) = node.spec.subnet_env.write(file) {
            tracing::error!("writing {}: {e}", file.display());
        }
    }
    let (after, _) = look(reg, settings, ifaces).await;
    Examination {
        before,
        after_fix: Some(after),
    }
}
