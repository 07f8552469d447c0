//! The IPAM plugin, run in a thread of its own so that it allocates while the links are made.

use crate::NetConf;
use cni_protocol::invoke::{delegate, delegate_add};
use cni_protocol::{CniError, CniResult, Command, Request};
use std::thread::{Scope, ScopedJoinHandle};

/// An IPAM ADD under way, or done.
pub struct Ipam<'scope, 'env> {
    req: &'env Request,
    plugin: Option<&'env str>,
    pending: Option<ScopedJoinHandle<'scope, Result<CniResult, CniError>>>,
    allocated: bool,
}

impl<'scope, 'env> Ipam<'scope, 'env> {
    /// Starts IPAM ADD (none for a layer-2 network). On failure the plugin's DEL has run.
    pub fn start(
        s: &'scope Scope<'scope, 'env>,
        req: &'env Request,
        conf: &'env NetConf,
    ) -> Ipam<'scope, 'env> {
        let plugin = conf.ipam_type.as_deref();
        let pending =
            plugin.map(|t| s.spawn(move || delegate_add(&req.env, t, &req.config, req.version)));
        Ipam {
            req,
            plugin,
            pending,
            allocated: false,
        }
    }

    /// Waits for the allocation: None for a layer-2 network.
    pub fn result(&mut self) -> Result<Option<CniResult>, CniError> {
        let Some(handle) = self.pending.take() else {
            return Ok(None);
        };
        let result = handle
            .join()
            .unwrap_or_else(|_| Err(CniError::internal("the IPAM thread panicked")))?;
        self.allocated = true;
        if result.ips.is_empty() {
            return Err(CniError::internal(format!(
                "IPAM plugin {:?} returned no IP configuration",
                self.plugin.unwrap_or_default()
            )));
        }
        Ok(Some(result))
    }

    /// Gives back what ADD allocated, waiting for it first if it is still under way.
    pub fn release(&mut self) {
        if self.pending.is_some() {
            let _ = self.result();
        }
        if let (true, Some(t)) = (self.allocated, self.plugin) {
            if let Err(e) = delegate(&self.req.env, Command::Del, t, &self.req.config) {
                eprintln!("rolling back: IPAM plugin {t:?} DEL failed: {e}");
            }
            self.allocated = false;
        }
    }
}
