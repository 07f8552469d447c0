//! `ipip`: not carried by this flanneld. A config naming it ends the start, saying what this
//! node lacks for it (the kernel's `ipip` module, as Go's backend needs) and what to use.

use super::api::{Backend, Refusal};
use crate::family::IpFamily;
use crate::iface::External;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipip;

/// Whether the kernel has ipip: its module loaded (or built in, with its parameters), or
/// the fallback device it makes in every namespace.
fn kernel_has_ipip() -> bool {
    std::path::Path::new("/sys/module/ipip").exists()
        || std::fs::read_to_string("/proc/net/dev").is_ok_and(|d| d.contains("tunl0:"))
}

impl Backend for Ipip {
    fn name(&self) -> &'static str {
        "ipip"
    }

    fn check(&self, _ext: &External, _families: &[IpFamily]) -> Result<(), Refusal> {
        let lack = if kernel_has_ipip() {
            "this flanneld does not carry ipip"
        } else {
            "this kernel has no ipip module (no /sys/module/ipip, no tunl0), which Go's ipip backend needs"
        };
        Err(format!(
            "Backend.Type ipip: {lack}; vxlan (or host-gw between nodes on one link) carries the same traffic"
        )
        .into())
    }
}
