//! The subnet.env plane: the file the flannel CNI plugin reads, as this node's lease and spec
//! give it (both families' networks and subnets, the MTU, IPMASQ). The start writes it whatever
//! it holds, as flanneld does; every pass after reads it and writes it again only when it
//! differs.

use super::{Others, PassError, Plan, Plane};
use crate::lease::SubnetKey;
use crate::report::Finding;
use crate::retrying::Retrying;
use ipnetwork::IpNetwork;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use subnetenv::SubnetEnv;
use tracing::{error, info};

/// How often the file is looked at when nothing asks.
pub const RESYNC: Duration = Duration::from_secs(10);

/// How FLANNEL_MTU comes about, for `doctor`: the external interface's MTU, and the device's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MtuChain {
    pub ext: String,
    pub ext_mtu: u32,
    pub device_mtu: Option<u32>,
}

pub struct SubnetEnvPlane {
    path: PathBuf,
    want: SubnetEnv,
    own: SubnetKey,
    chain: MtuChain,
    /// Set once the file is written: the daemon is ready.
    written: Option<Arc<AtomicBool>>,
    /// The next pass writes it whatever it holds (the start's).
    rewrite: bool,
    failing: Retrying,
}

/// What the file holds, against what it should.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Held {
    Missing,
    Unreadable(String),
    Holds(subnetenv::Entries),
}

pub struct SubnetEnvPlan {
    path: PathBuf,
    want: SubnetEnv,
    own: SubnetKey,
    chain: MtuChain,
    held: Held,
    rewrite: bool,
}

/// One key of the file, as held and as wanted.
fn key_finding(kind: &str, name: &str, held: String, want: String, lease: &str) -> Finding {
    let state = if held == want { "ok" } else { "wrong" };
    let detail = if held == want {
        format!("{name} {held}{lease}")
    } else {
        format!("{name} {held}{lease}, wanted {want}")
    };
    Finding::new(kind, state, detail)
}

fn show_subnet(s: Option<IpNetwork>) -> String {
    s.map(|s| s.to_string()).unwrap_or_else(|| "(none)".into())
}

fn show_networks(n: &[IpNetwork]) -> String {
    match n {
        [] => "(none)".into(),
        n => n
            .iter()
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(","),
    }
}

impl SubnetEnvPlan {
    /// Each key against the spec: the subnets of both families, the networks, IPMASQ, and the
    /// MTU chain.
    fn compare(&self, held: &subnetenv::Entries) -> Vec<Finding> {
        let want = &self.want;
        let lease = format!(" for lease {}", self.own);
        let mut out = Vec::new();
        let subnets = [
            ("FLANNEL_SUBNET", held.subnet, want.subnet),
            ("FLANNEL_IPV6_SUBNET", held.ipv6_subnet, want.ipv6_subnet),
        ];
        for (name, h, w) in subnets {
            if h.is_some() || w.is_some() {
                out.push(key_finding(
                    "subnet.env",
                    name,
                    show_subnet(h),
                    show_subnet(w),
                    &lease,
                ));
            }
        }
        let networks = [
            ("FLANNEL_NETWORK", &held.networks, &want.networks),
            (
                "FLANNEL_IPV6_NETWORK",
                &held.ipv6_networks,
                &want.ipv6_networks,
            ),
        ];
        for (name, h, w) in networks {
            let h = show_networks(h.as_deref().unwrap_or_default());
            if h != show_networks(w) {
                out.push(key_finding("subnet.env", name, h, show_networks(w), ""));
            }
        }
        if held.ipmasq != Some(want.ipmasq) {
            let h = held
                .ipmasq
                .map(|m| m.to_string())
                .unwrap_or_else(|| "(none)".into());
            out.push(key_finding(
                "subnet.env",
                "FLANNEL_IPMASQ",
                h,
                want.ipmasq.to_string(),
                "",
            ));
        }
        let env_mtu = held.mtu.unwrap_or(0);
        let c = &self.chain;
        out.push(Finding::new(
            "mtu",
            if env_mtu == want.mtu && env_mtu != 0 {
                "ok"
            } else {
                "wrong"
            },
            format!(
                "{} {} -> device {} -> FLANNEL_MTU {env_mtu}",
                c.ext,
                c.ext_mtu,
                c.device_mtu
                    .map(|m| m.to_string())
                    .unwrap_or_else(|| "-".into())
            ),
        ));
        out
    }
}

impl Plan for SubnetEnvPlan {
    fn is_empty(&self) -> bool {
        !self.rewrite && self.findings().iter().all(|f| f.state == "ok")
    }

    fn findings(&self) -> Vec<Finding> {
        let file = self.path.display().to_string();
        match &self.held {
            Held::Missing => vec![Finding::new("subnet.env", "missing", file)],
            Held::Unreadable(why) => {
                vec![Finding::new(
                    "subnet.env",
                    "wrong",
                    format!("{file}: {why}"),
                )]
            }
            Held::Holds(entries) => self.compare(entries),
        }
    }
}

impl SubnetEnvPlane {
    /// The plane of the file at `path` as `want` says; `written` is set once the daemon has
    /// written it (None: `doctor`, which writes only with `--fix`).
    pub fn new(
        path: PathBuf,
        want: SubnetEnv,
        own: SubnetKey,
        chain: MtuChain,
        written: Option<Arc<AtomicBool>>,
    ) -> SubnetEnvPlane {
        SubnetEnvPlane {
            path,
            want,
            own,
            chain,
            rewrite: written.is_some(),
            written,
            failing: Retrying::default(),
        }
    }
}

impl Plane for SubnetEnvPlane {
    type Plan = SubnetEnvPlan;
    const KIND: &'static str = "subnet.env";

    fn resync(&self) -> Duration {
        RESYNC
    }

    async fn plan(&mut self, _: &Others) -> Result<SubnetEnvPlan, PassError> {
        let held = match std::fs::read_to_string(&self.path) {
            Ok(text) => match subnetenv::parse_entries(&text) {
                Ok(e) => Held::Holds(e),
                Err(e) => Held::Unreadable(e.to_string()),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Held::Missing,
            Err(e) => Held::Unreadable(e.to_string()),
        };
        Ok(SubnetEnvPlan {
            path: self.path.clone(),
            want: self.want.clone(),
            own: self.own,
            chain: self.chain.clone(),
            held,
            rewrite: self.rewrite,
        })
    }

    async fn apply(&mut self, plan: SubnetEnvPlan, _: &Others) {
        if plan.is_empty() {
            return;
        }
        match self.want.write(&self.path) {
            // The plugin cannot work without it; the next pass tries again.
            Err(e) => {
                let e = e.to_string();
                if self.failing.failed(&e) {
                    error!("writing {}: {e}", self.path.display());
                }
            }
            Ok(()) => {
                info!("wrote {}", self.path.display());
                self.rewrite = false;
                self.failing.passed();
                if let Some(w) = &self.written {
                    w.store(true, Ordering::SeqCst);
                }
            }
        }
    }

    fn failed(&mut self, e: PassError, _: &Others) {
        error!("reading {}: {e}", self.path.display());
    }
}
