//! Sysctls of the calling thread's network namespace.

use crate::error::Error;
use sysctl::Sysctl;

/// Sets `name` (dotted, as `net.ipv4.ip_forward`) to `value`, skipping the write when it already holds it.
pub fn set(name: &str, value: &str) -> Result<(), Error> {
    let ctl = sysctl::Ctl::new(name).map_err(|e| Error::failed("opening sysctl", name, e))?;
    if ctl
        .value_string()
        .map(|v| v.trim() == value)
        .unwrap_or(false)
    {
        return Ok(());
    }
    ctl.set_value_string(value)
        .map(|_| ())
        .map_err(|e| Error::failed("setting sysctl", format!("{name}={value}"), e))
}

pub fn get(name: &str) -> Result<String, Error> {
    sysctl::Ctl::new(name)
        .and_then(|c| c.value_string())
        .map(|v| v.trim().to_string())
        .map_err(|e| Error::failed("reading sysctl", name, e))
}

/// Whether bridged IPv4 traffic passes through iptables (`net.bridge.bridge-nf-call-iptables`);
/// None when `br_netfilter` is not loaded, or `/proc/sys/net/bridge` is not visible here.
pub fn bridge_nf_call_iptables() -> Option<bool> {
    std::fs::read_to_string("/proc/sys/net/bridge/bridge-nf-call-iptables")
        .ok()
        .map(|v| v.trim() == "1")
}
