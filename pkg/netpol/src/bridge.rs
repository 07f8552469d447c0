//! Traffic between two pods on this node's bridge is bridged, not routed: it passes the
//! enforcer's table only through br_netfilter, with `bridge-nf-call-iptables` (and
//! `-ip6tables`) on, as kube-proxy needs them too. The enforcer turns them on when they are
//! off, and says when br_netfilter is not there at all.

use cni_kernel::sysctl;

const CALLS: [&str; 2] = [
    "net.bridge.bridge-nf-call-iptables",
    "net.bridge.bridge-nf-call-ip6tables",
];

/// What the bridge's traffic meets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bridge {
    /// br_netfilter calls into the table for both families.
    On,
    /// It did not for these sysctls, and now does.
    TurnedOn(Vec<&'static str>),
    /// These are off (and were left so, or could not be set: the reason).
    Off(Vec<&'static str>, Option<String>),
    /// br_netfilter is not loaded (no /proc/sys/net/bridge).
    Absent,
}

impl Bridge {
    pub fn is_ok(&self) -> bool {
        matches!(self, Bridge::On | Bridge::TurnedOn(_))
    }

    pub fn describe(&self) -> String {
        match self {
            Bridge::On => {
                "br_netfilter passes bridged traffic between this node's pods to the table".into()
            }
            Bridge::TurnedOn(s) => format!(
                "turned on {} = 1: bridged traffic between this node's pods now passes the table",
                s.join(", ")
            ),
            Bridge::Off(s, why) => format!(
                "{} = 0: traffic between two pods of this node bypasses the policies{}",
                s.join(", "),
                why.as_ref()
                    .map(|w| format!(" (setting it: {w})"))
                    .unwrap_or_default()
            ),
            Bridge::Absent => {
                "br_netfilter is not loaded (no /proc/sys/net/bridge): traffic between \
                two pods of this node bypasses the policies; modprobe br_netfilter"
                    .into()
            }
        }
    }
}

/// Looks, and with `fix` turns on what is off.
pub fn check(fix: bool) -> Bridge {
    if !std::path::Path::new("/proc/sys/net/bridge").exists() {
        return Bridge::Absent;
    }
    let off: Vec<&'static str> = CALLS
        .into_iter()
        .filter(|s| sysctl::get(s).map(|v| v != "1").unwrap_or(true))
        .collect();
    if off.is_empty() {
        return Bridge::On;
    }
    if !fix {
        return Bridge::Off(off, None);
    }
    match off.iter().try_for_each(|s| sysctl::set(s, "1")) {
        Ok(()) => Bridge::TurnedOn(off),
        Err(e) => Bridge::Off(off, Some(e.to_string())),
    }
}
