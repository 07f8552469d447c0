//! Per-interface sysctls, written by path (`/proc/sys/net/<family>/conf/<ifname>/<key>`)
//! because an interface name may contain dots, which a dotted sysctl name cannot express.
//! Like every /proc/sys/net file, they belong to the calling thread's namespace.

use cni_protocol::CniError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    Ipv4,
    Ipv6,
}

fn path(proto: Proto, ifname: &str, key: &str) -> String {
    let p = match proto {
        Proto::Ipv4 => "ipv4",
        Proto::Ipv6 => "ipv6",
    };
    format!("/proc/sys/net/{p}/conf/{ifname}/{key}")
}

/// Reads an interface sysctl, trimmed.
pub fn get(proto: Proto, ifname: &str, key: &str) -> Result<String, CniError> {
    let p = path(proto, ifname, key);
    std::fs::read_to_string(&p)
        .map(|v| v.trim().to_string())
        .map_err(|e| CniError::io(format!("reading {p}: {e}")))
}

/// Writes an interface sysctl.
pub fn set(proto: Proto, ifname: &str, key: &str, value: &str) -> Result<(), CniError> {
    let p = path(proto, ifname, key);
    std::fs::write(&p, value).map_err(|e| CniError::io(format!("writing {value} to {p}: {e}")))
}
