//! Per-interface sysctls, written by path (`/proc/sys/net/<family>/conf/<ifname>/<key>`)
//! because an interface name may contain dots, which a dotted sysctl name cannot express.
//! Like every /proc/sys/net file, they belong to the calling thread's namespace.

use crate::error::Error;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    Ipv4,
    Ipv6,
}

/// The file of one interface's sysctl. The name comes from configs and results, so it must be
/// a real interface name: `all` and `default` would change every interface of the namespace,
/// and `/` or `..` would leave the directory.
fn path(proto: Proto, ifname: &str, key: &str) -> Result<String, Error> {
    let problem = if ifname == "all" || ifname == "default" {
        Some("names every interface's sysctls, not one interface's")
    } else {
        ifname::problem(ifname)
    };
    if let Some(p) = problem {
        return Err(Error::invalid(
            "addressing the sysctls of interface",
            format!("{ifname:?}"),
            p,
        ));
    }
    let p = match proto {
        Proto::Ipv4 => "ipv4",
        Proto::Ipv6 => "ipv6",
    };
    Ok(format!("/proc/sys/net/{p}/conf/{ifname}/{key}"))
}

/// Reads an interface sysctl, trimmed.
pub fn get(proto: Proto, ifname: &str, key: &str) -> Result<String, Error> {
    let p = path(proto, ifname, key)?;
    std::fs::read_to_string(&p)
        .map(|v| v.trim().to_string())
        .map_err(|e| Error::io("reading", &p, &e))
}

/// Writes an interface sysctl.
pub fn set(proto: Proto, ifname: &str, key: &str, value: &str) -> Result<(), Error> {
    let p = path(proto, ifname, key)?;
    std::fs::write(&p, value).map_err(|e| Error::io(format!("writing {value} to"), &p, &e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_one_real_interface_is_addressed() {
        assert_eq!(
            path(Proto::Ipv4, "cni0.5", "route_localnet").unwrap(),
            "/proc/sys/net/ipv4/conf/cni0.5/route_localnet"
        );
        for bad in ["all", "default", "..", "a/b", "", "abcdefghijklmnop"] {
            let e = path(Proto::Ipv4, bad, "route_localnet").unwrap_err();
            assert_eq!(e.kind(), crate::error::Kind::Invalid, "{bad}");
        }
    }
}
