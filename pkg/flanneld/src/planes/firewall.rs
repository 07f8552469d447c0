//! The firewall plane: the masquerade and forward rules of `--ip-masq` and
//! `--iptables-forward-rules`, in flannel's exact text (`crate::masq`). Its first pass also
//! removes what an earlier run left that the spec no longer wants (the other mode's rules, an
//! earlier subnet's); every pass after reads the rules and restores what is missing or wrong,
//! and writes nothing when all is right. A plan reads the rules once and holds the batches
//! that its apply writes, so that `doctor --fix` writes what `doctor` found. The rule tools
//! block, so each pass runs off the async threads.

use super::{Others, PassError, Plan, Plane};
use crate::masq::{self, MasqSpec, Previous};
use crate::metrics::{self, METRICS};
use crate::report::Finding;
use std::sync::Arc;
use std::time::Duration;
use tracing::{error, info};

pub struct FirewallPlane {
    spec: Arc<MasqSpec>,
    /// `--iptables-resync`.
    resync: Duration,
    /// The networks and subnets of the subnet.env being replaced, whose rules the first pass
    /// removes; kept until a pass has written its cleanup.
    cleanup: Option<Previous>,
}

/// What one read of the rules found to write: the batches apply writes, in order, and why.
pub struct FirewallPlan {
    pass: masq::Pass,
    /// The pass includes the first pass's cleanup (which may find nothing to remove).
    cleans: bool,
}

impl Plan for FirewallPlan {
    fn is_empty(&self) -> bool {
        self.pass.is_empty()
    }

    fn findings(&self) -> Vec<Finding> {
        if self.pass.reasons.is_empty() {
            return vec![Finding::new("masquerade", "ok", "the rules are flannel's")];
        }
        self.pass
            .reasons
            .iter()
            .map(|r| Finding::new("masquerade", "wrong", r.clone()))
            .collect()
    }
}

impl FirewallPlane {
    /// The plane for `spec`; `previous` (from the old subnet.env) when the first pass should
    /// remove what an earlier run left.
    pub fn new(spec: MasqSpec, resync: Duration, previous: Option<Previous>) -> FirewallPlane {
        FirewallPlane {
            spec: Arc::new(spec),
            resync,
            cleanup: previous,
        }
    }
}

impl Plane for FirewallPlane {
    type Plan = FirewallPlan;
    const KIND: &'static str = "masquerade";

    fn resync(&self) -> Duration {
        self.resync
    }

    /// The rules read once and the pass planned, off the async threads (the tools block).
    async fn plan(&mut self, _: &Others) -> Result<FirewallPlan, PassError> {
        let spec = self.spec.clone();
        let cleanup = self.cleanup;
        let pass = tokio::task::spawn_blocking(move || masq::plan(&spec, cleanup)).await??;
        Ok(FirewallPlan {
            pass,
            cleans: cleanup.is_some(),
        })
    }

    /// Writes the plan's batches, off the async threads.
    async fn apply(&mut self, plan: FirewallPlan, _: &Others) {
        let first = plan.cleans;
        if plan.is_empty() {
            if first {
                self.cleanup = None;
            }
            return;
        }
        let pass = tokio::task::spawn_blocking(move || plan.pass.apply());
        match pass.await.map_err(PassError::from).and_then(|r| Ok(r?)) {
            Ok(applied) => {
                if first {
                    self.cleanup = None;
                } else if applied.restored {
                    metrics::inc(&METRICS.masq_restores);
                    info!("masquerade rules restored")
                }
            }
            Err(e) => self.report(e, first),
        }
    }

    fn failed(&mut self, e: PassError, _: &Others) {
        let first = self.cleanup.is_some();
        self.report(e, first);
    }
}

impl FirewallPlane {
    fn report(&self, e: PassError, first: bool) {
        if first {
            error!(
                "setting up the masquerade and forward rules: {e}; retrying every {:?}",
                self.resync
            );
        } else {
            error!("checking the masquerade rules: {e}");
        }
    }
}
