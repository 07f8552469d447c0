//! The firewall plane: the masquerade and forward rules of `--ip-masq` and
//! `--iptables-forward-rules`, in flannel's exact text (`crate::masq`). Its first pass also
//! removes what an earlier run left that the spec no longer wants (the other mode's rules, an
//! earlier subnet's); every pass after reads the rules and restores what is missing or wrong,
//! and writes nothing when all is right. The rule tools block, so each pass runs off the
//! async threads.

use crate::error::PassError;
use crate::masq::{self, MasqSpec, Previous};
use crate::metrics::{self, METRICS};
use crate::reconcile::{Leases, Others, Plane};
use crate::report::Finding;
use futures::future::BoxFuture;
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

    /// One pass off the async threads: the cleanup if it is due, then the rules; whether the
    /// rules had to be written.
    async fn pass(&mut self) -> Result<bool, PassError> {
        let spec = self.spec.clone();
        let cleanup = self.cleanup.take();
        let restored = tokio::task::spawn_blocking(move || -> cni_kernel::Result<bool> {
            if let Some((old4, old6)) = cleanup {
                masq::remove_other_mode(&spec)?;
                masq::remove_stale(old4, old6, &spec)?;
            }
            masq::ensure(&spec)
        })
        .await??;
        Ok(restored)
    }
}

impl Plane for FirewallPlane {
    fn resync(&self) -> Duration {
        self.resync
    }

    fn repair(&mut self, _others: Others) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let first = self.cleanup.is_some();
            match self.pass().await {
                Ok(true) if !first => {
                    metrics::inc(&METRICS.masq_restores);
                    info!("masquerade rules restored")
                }
                Ok(_) => {}
                Err(e) if first => error!(
                    "setting up the masquerade and forward rules: {e}; retrying every {:?}",
                    self.resync
                ),
                Err(e) => error!("checking the masquerade rules: {e}"),
            }
        })
    }

    fn examine<'a>(&'a mut self, _: &'a Leases) -> BoxFuture<'a, Vec<Finding>> {
        Box::pin(async move {
            let spec = self.spec.clone();
            let checked = tokio::task::spawn_blocking(move || masq::check(&spec)).await;
            match checked
                .map_err(PassError::from)
                .and_then(|r| r.map_err(PassError::from))
            {
                Ok(reasons) if reasons.is_empty() => {
                    vec![Finding::new("masquerade", "ok", "the rules are flannel's")]
                }
                Ok(reasons) => reasons
                    .into_iter()
                    .map(|r| Finding::new("masquerade", "wrong", r))
                    .collect(),
                Err(e) => vec![Finding::new("masquerade", "wrong", e.to_string())],
            }
        })
    }
}
