//! Gateways: which address the bridge carries for each pod subnet, and the default routes.

use crate::config::NetConf;
use cni_protocol::{CniError, CniResult, Route};
use ipnetwork::IpNetwork;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Where the container interface sits in the result's `interfaces`: [bridge, host veth, container].
pub const CONTAINER_INTERFACE: usize = 2;

/// The gateway addresses for the bridge, with the pod subnets' prefix lengths.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Gateways {
    pub v4: Vec<IpNetwork>,
    pub v6: Vec<IpNetwork>,
}

impl Gateways {
    pub fn all(&self) -> impl Iterator<Item = &IpNetwork> {
        self.v4.iter().chain(self.v6.iter())
    }
}

/// The first address after the network address: 10.88.0.1 for 10.88.0.7/16.
pub fn gateway_of(addr: &IpNetwork) -> IpAddr {
    match addr.network() {
        IpAddr::V4(n) => IpAddr::V4(Ipv4Addr::from(u32::from(n).wrapping_add(1))),
        IpAddr::V6(n) => IpAddr::V6(Ipv6Addr::from(u128::from(n).wrapping_add(1))),
    }
}

fn default_route_dst(v4: bool) -> IpNetwork {
    if v4 {
        IpNetwork::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0)
    } else {
        IpNetwork::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0)
    }
    .expect("a /0 network is valid")
}

/// Completes IPAM's result as the Go plugin does: every address belongs to the container
/// interface; with `isGateway` an address without a gateway gets network+1; with
/// `isDefaultGateway` each family gets a default route via its gateway unless IPAM gave one.
/// Returns the addresses the bridge must carry.
pub fn apply_gateways(result: &mut CniResult, conf: &NetConf) -> Result<Gateways, CniError> {
    let mut gws = Gateways::default();
    let mut default_found = [false, false];
    for i in 0..result.ips.len() {
        let ip = &mut result.ips[i];
        ip.interface = Some(CONTAINER_INTERFACE);
        if ip.gateway.is_none() && conf.is_gateway {
            ip.gateway = Some(gateway_of(&ip.address));
        }
        let (address, gateway) = (ip.address, ip.gateway);
        let v4 = address.is_ipv4();
        let family = usize::from(!v4);
        if conf.is_default_gateway && !default_found[family] {
            let dst = default_route_dst(v4);
            default_found[family] = result.routes.iter().any(|r| r.gw.is_some() && r.dst == dst);
            if !default_found[family] {
                result.routes.push(Route::new(dst, gateway));
                default_found[family] = true;
            }
        }
        if conf.is_gateway {
            let gw = gateway.unwrap_or_else(|| gateway_of(&address));
            let net = IpNetwork::new(gw, address.prefix()).map_err(|e| {
                CniError::internal(format!("gateway {gw}/{}: {e}", address.prefix()))
            })?;
            if v4 {
                gws.v4.push(net);
            } else {
                gws.v6.push(net);
            }
        }
    }
    Ok(gws)
}

/// What to do about the bridge's addresses so that it carries `want`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddressPlan {
    /// Already there.
    Keep,
    /// Remove these conflicting addresses (forceAddress), then add.
    Add { remove: Vec<IpNetwork> },
}

/// The Go plugin's rule: an IPv4 bridge carries one address; IPv6 ones may differ when their
/// subnets do not overlap. A conflicting address is replaced only with `forceAddress`.
pub fn plan_bridge_address(
    bridge: &str,
    existing: &[IpNetwork],
    want: IpNetwork,
    force: bool,
) -> Result<AddressPlan, CniError> {
    let same_family = existing.iter().filter(|a| a.is_ipv4() == want.is_ipv4());
    if same_family.clone().any(|a| *a == want) {
        return Ok(AddressPlan::Keep);
    }
    let conflicts: Vec<IpNetwork> = same_family
        .filter(|a| want.is_ipv4() || a.contains(want.ip()) || want.contains(a.ip()))
        .copied()
        .collect();
    if !conflicts.is_empty() && !force {
        let list: Vec<String> = conflicts.iter().map(ToString::to_string).collect();
        return Err(CniError::invalid_config(format!(
            "bridge {bridge:?} already has the address {} and the gateway {want} differs from it: set forceAddress (field \"forceAddress\") to replace it",
            list.join(", ")
        )));
    }
    Ok(AddressPlan::Add { remove: conflicts })
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni_protocol::IpConfig;
    use serde_json::json;

    fn conf(v: serde_json::Value) -> NetConf {
        NetConf::parse(&v, "net", &[]).unwrap()
    }

    fn net(s: &str) -> IpNetwork {
        s.parse().unwrap()
    }

    fn result(ips: &[(&str, Option<&str>)]) -> CniResult {
        CniResult {
            ips: ips
                .iter()
                .map(|(a, g)| IpConfig {
                    address: net(a),
                    gateway: g.map(|g| g.parse().unwrap()),
                    interface: None,
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn gateway_is_network_plus_one() {
        assert_eq!(gateway_of(&net("10.88.3.7/16")).to_string(), "10.88.0.1");
        assert_eq!(gateway_of(&net("fd00:1::9/64")).to_string(), "fd00:1::1");
    }

    #[test]
    fn is_gateway_fills_gateways_and_the_bridge_addresses() {
        let mut r = result(&[("10.88.0.5/16", None), ("fd00::5/64", Some("fd00::fe"))]);
        let gws = apply_gateways(&mut r, &conf(json!({"isGateway": true}))).unwrap();
        assert_eq!(r.ips[0].gateway.unwrap().to_string(), "10.88.0.1");
        assert_eq!(r.ips[1].gateway.unwrap().to_string(), "fd00::fe");
        assert!(r.ips.iter().all(|i| i.interface == Some(2)));
        assert_eq!(gws.v4, vec![net("10.88.0.1/16")]);
        assert_eq!(gws.v6, vec![net("fd00::fe/64")]);
        assert!(r.routes.is_empty());
    }

    #[test]
    fn without_is_gateway_nothing_is_invented() {
        let mut r = result(&[("10.88.0.5/16", None)]);
        let gws = apply_gateways(&mut r, &conf(json!({}))).unwrap();
        assert_eq!(r.ips[0].gateway, None);
        assert_eq!(r.ips[0].interface, Some(2));
        assert_eq!(gws, Gateways::default());
    }

    #[test]
    fn default_gateway_adds_one_default_route_per_family() {
        let mut r = result(&[
            ("10.88.0.5/16", None),
            ("10.99.0.5/16", None),
            ("fd00::5/64", None),
        ]);
        apply_gateways(&mut r, &conf(json!({"isDefaultGateway": true}))).unwrap();
        let routes: Vec<String> = r
            .routes
            .iter()
            .map(|r| format!("{} via {}", r.dst, r.gw.unwrap()))
            .collect();
        assert_eq!(routes, vec!["0.0.0.0/0 via 10.88.0.1", "::/0 via fd00::1"]);
    }

    #[test]
    fn default_gateway_keeps_ipams_default_route() {
        let mut r = result(&[("10.88.0.5/16", None)]);
        r.routes.push(Route::new(
            net("0.0.0.0/0"),
            Some("10.88.0.254".parse().unwrap()),
        ));
        apply_gateways(&mut r, &conf(json!({"isDefaultGateway": true}))).unwrap();
        assert_eq!(r.routes.len(), 1);
        // A default route without a gateway does not count.
        let mut r = result(&[("10.88.0.5/16", None)]);
        r.routes.push(Route::new(net("0.0.0.0/0"), None));
        apply_gateways(&mut r, &conf(json!({"isDefaultGateway": true}))).unwrap();
        assert_eq!(r.routes.len(), 2);
    }

    #[test]
    fn bridge_address_plans() {
        let want = net("10.88.0.1/16");
        assert_eq!(
            plan_bridge_address("cni0", &[want], want, false).unwrap(),
            AddressPlan::Keep
        );
        assert_eq!(
            plan_bridge_address("cni0", &[net("fe80::1/64")], want, false).unwrap(),
            AddressPlan::Add { remove: vec![] }
        );
        let e = plan_bridge_address("cni0", &[net("10.99.0.1/16")], want, false).unwrap_err();
        assert_eq!(e.code, 7);
        assert!(
            e.msg.contains("10.99.0.1/16") && e.msg.contains("forceAddress"),
            "{}",
            e.msg
        );
        assert_eq!(
            plan_bridge_address("cni0", &[net("10.99.0.1/16")], want, true).unwrap(),
            AddressPlan::Add {
                remove: vec![net("10.99.0.1/16")]
            }
        );
        // IPv6 subnets that do not overlap live side by side.
        let v6 = net("fd00:2::1/64");
        assert_eq!(
            plan_bridge_address("cni0", &[net("fd00:1::1/64"), net("fe80::1/64")], v6, false)
                .unwrap(),
            AddressPlan::Add { remove: vec![] }
        );
        assert!(plan_bridge_address("cni0", &[net("fd00:2::9/64")], v6, false).is_err());
    }
}
