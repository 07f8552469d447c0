//! What portmap takes from the previous result: the addresses to forward to and the host-side
//! interface the container is reached through.

use cni_protocol::CniResult;
use ipnetwork::IpNetwork;

/// The container's addresses that ports are forwarded to: at most one per family.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ContainerAddrs {
    pub v4: Option<IpNetwork>,
    pub v6: Option<IpNetwork>,
}

impl ContainerAddrs {
    /// The first address of each family, skipping those the result puts on an interface that is
    /// not `ifname` inside the sandbox (the Go plugin's choice).
    pub fn from_result(prev: &CniResult, ifname: &str) -> ContainerAddrs {
        let mut addrs = ContainerAddrs::default();
        for ip in &prev.ips {
            let slot = if ip.address.is_ipv4() {
                &mut addrs.v4
            } else {
                &mut addrs.v6
            };
            if slot.is_some() {
                continue;
            }
            let elsewhere = ip
                .interface
                .and_then(|i| prev.interfaces.get(i))
                .is_some_and(|i| i.name != ifname || i.sandbox.is_empty());
            if !elsewhere {
                *slot = Some(ip.address);
            }
        }
        addrs
    }

    /// IPv4 first, then IPv6.
    pub fn iter(&self) -> impl Iterator<Item = IpNetwork> {
        self.v4.into_iter().chain(self.v6)
    }

    pub fn is_empty(&self) -> bool {
        self.v4.is_none() && self.v6.is_none()
    }
}

/// The host side the container is reached through: the first interface with no sandbox, which
/// is the bridge for `bridge` (it lists the bridge before the veth) and the veth for `ptp`.
pub fn host_interface(prev: &CniResult) -> Option<&str> {
    prev.interfaces
        .iter()
        .find(|i| i.sandbox.is_empty() && !i.name.is_empty())
        .map(|i| i.name.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni_protocol::{Interface, IpConfig};

    fn iface(name: &str, sandbox: &str) -> Interface {
        Interface {
            name: name.into(),
            sandbox: sandbox.into(),
            ..Default::default()
        }
    }

    fn ip(addr: &str, interface: Option<usize>) -> IpConfig {
        IpConfig {
            address: addr.parse().unwrap(),
            gateway: None,
            interface,
        }
    }

    fn bridge_result() -> CniResult {
        CniResult {
            interfaces: vec![
                iface("cni0", ""),
                iface("veth1234", ""),
                iface("eth0", "/var/run/netns/pod"),
            ],
            ..Default::default()
        }
    }

    #[test]
    fn picks_the_first_address_of_each_family_on_ifname() {
        let mut r = bridge_result();
        r.ips = vec![
            ip("10.88.0.1/24", Some(0)),
            ip("10.88.0.5/24", Some(2)),
            ip("10.88.0.6/24", Some(2)),
            ip("fd00::5/64", Some(2)),
        ];
        let a = ContainerAddrs::from_result(&r, "eth0");
        assert_eq!(a.v4, Some("10.88.0.5/24".parse().unwrap()));
        assert_eq!(a.v6, Some("fd00::5/64".parse().unwrap()));
        assert_eq!(a.iter().count(), 2);
    }

    #[test]
    fn skips_other_interfaces_and_host_side_ones() {
        let mut r = bridge_result();
        r.ips = vec![ip("10.88.0.5/24", Some(2))];
        assert!(ContainerAddrs::from_result(&r, "net1").is_empty());
        r.ips = vec![ip("10.88.0.1/24", Some(1))];
        assert!(ContainerAddrs::from_result(&r, "veth1234").is_empty());
    }

    #[test]
    fn addresses_without_or_with_a_stray_interface_index_count() {
        let r = CniResult {
            ips: vec![ip("10.1.0.2/16", None), ip("fd00::2/64", Some(9))],
            ..Default::default()
        };
        let a = ContainerAddrs::from_result(&r, "eth0");
        assert_eq!(a.v4, Some("10.1.0.2/16".parse().unwrap()));
        assert_eq!(a.v6, Some("fd00::2/64".parse().unwrap()));
    }

    #[test]
    fn host_interface_is_the_first_without_sandbox() {
        assert_eq!(host_interface(&bridge_result()), Some("cni0"));
        let ptp = CniResult {
            interfaces: vec![iface("veth9", ""), iface("eth0", "/proc/1/ns/net")],
            ..Default::default()
        };
        assert_eq!(host_interface(&ptp), Some("veth9"));
        assert_eq!(host_interface(&CniResult::default()), None);
    }
}
