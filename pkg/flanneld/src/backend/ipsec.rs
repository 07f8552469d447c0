//! `ipsec`: not carried by this flanneld. A config naming it ends the start, saying what this
//! node lacks for it (the kernel's AEAD `rfc4106(gcm(aes))` for ESP, as Go's backend needs,
//! and the IKE daemon Go's runs) and what to use.

use super::api::{Backend, Refusal};
use crate::family::IpFamily;
use crate::iface::External;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipsec;

/// The AEAD Go's ipsec backend asks the kernel for ESP.
const AEAD: &str = "rfc4106(gcm(aes))";

impl Backend for Ipsec {
    fn name(&self) -> &'static str {
        "ipsec"
    }

    fn check(&self, _ext: &External, _families: &[IpFamily]) -> Result<(), Refusal> {
        let crypto = std::fs::read_to_string("/proc/crypto").unwrap_or_default();
        let kernel = if crypto.contains(AEAD) {
            String::new()
        } else {
            format!("this kernel has no AEAD {AEAD} (not in /proc/crypto) for ESP, and ")
        };
        Err(format!(
            "Backend.Type ipsec: {kernel}this flanneld runs no IKE daemon (Go's runs strongSwan's charon); \
             wireguard encrypts the same traffic"
        )
        .into())
    }
}
