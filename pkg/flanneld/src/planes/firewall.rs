//! The firewall plane: the masquerade and forward rules of `--ip-masq` and
//! `--iptables-forward-rules`, in flannel's exact text (`crate::masq`). Its first pass also
//! removes what an earlier run left that the spec no longer wants (the other mode's rules, an
//! earlier subnet's); every pass after reads the rules and restores what is missing or wrong,
//! and writes nothing when all is right. The rule tools block, so each pass runs off the
//! async threads.

use super::{Others, Plan, Plane};
use crate::error::PassError;
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
    /// removes; taken by it.
    cleanup: Option<Previous>,
}

/// What is missing or wrong in the rules, and whether the first pass's cleanup is due.
pub struct FirewallPlan {
    reasons: Vec<String>,
    cleanup: bool,
}

impl Plan for FirewallPlan {
    fn is_empty(&self) -> bool {
        self.reasons.is_empty() && !self.cleanup
    }

    fn findings(&self) -> Vec<Finding> {
        if self.reasons.is_empty() {
            return vec![Finding::new("masquerade", "ok", "the rules are flannel's")];
        }
        self.reasons
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

    /// The rules read and compared off the async threads (the tools block).
    async fn plan(&mut self, _: &Others) -> Result<FirewallPlan, PassError> {
        let spec = self.spec.clone();
        let reasons = tokio::task::spawn_blocking(move || masq::check(&spec)).await??;
        Ok(FirewallPlan {
            reasons,
            cleanup: self.cleanup.is_some(),
        })
    }

    /// The cleanup if it is due, then the rules, off the async threads.
    async fn apply(&mut self, plan: FirewallPlan, _: &Others) {
        if plan.is_empty() {
            return;
        }
        let spec = self.spec.clone();
        let cleanup = self.cleanup.take();
        let first = cleanup.is_some();
        let pass = tokio::task::spawn_blocking(move || -> cni_kernel::Result<bool> {
            if let Some((old4, old6)) = cleanup {
                masq::remove_other_mode(&spec)?;
                masq::remove_stale(old4, old6, &spec)?;
            }
            masq::ensure(&spec)
        });
        match pass.await.map_err(PassError::from).and_then(|r| Ok(r?)) {
            Ok(true) if !first => {
                metrics::inc(&METRICS.masq_restores);
                info!("masquerade rules restored")
            }
            Ok(_) => {}
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
