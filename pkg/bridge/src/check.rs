//! CHECK's comparisons: the prevResult's addresses and routes against what the pod has.

use cni_protocol::{CniError, IpConfig, Route};
use ipnetwork::IpNetwork;
use std::net::IpAddr;

/// A route as the kernel reports it (main table).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteEntry {
    pub dst: IpNetwork,
    pub gw: Option<IpAddr>,
}

fn subnet_of(a: &IpNetwork) -> IpNetwork {
    IpNetwork::new(a.network(), a.prefix()).unwrap_or(*a)
}

/// Every result address is on the container interface, with its subnet's route.
pub fn check_addresses(
    ifname: &str,
    expected: &[IpConfig],
    on_link: &[IpNetwork],
    routes: &[RouteEntry],
) -> Result<(), CniError> {
    for ip in expected {
        if !on_link.contains(&ip.address) {
            return Err(CniError::internal(format!(
                "address {} of the previous result is not on interface {ifname}",
                ip.address
            )));
        }
        let subnet = subnet_of(&ip.address);
        if !routes.iter().any(|r| r.dst == subnet) {
            return Err(CniError::internal(format!(
                "no route to {subnet} for address {} on interface {ifname}",
                ip.address
            )));
        }
    }
    Ok(())
}

/// Every result route is in the pod's table: same destination, and same gateway when the
/// result names one (a default route is matched by destination alone, as the Go plugin does).
pub fn check_routes(expected: &[Route], routes: &[RouteEntry]) -> Result<(), CniError> {
    for want in expected {
        let is_default = want.dst.prefix() == 0;
        let found = routes.iter().any(|r| {
            r.dst == subnet_of(&want.dst) && (is_default || want.gw.is_none() || r.gw == want.gw)
        });
        if !found {
            let via = want.gw.map(|g| format!(" via {g}")).unwrap_or_default();
            return Err(CniError::internal(format!(
                "route {}{via} of the previous result is not in the container's routing table",
                want.dst
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNetwork {
        s.parse().unwrap()
    }

    fn entry(dst: &str, gw: Option<&str>) -> RouteEntry {
        RouteEntry {
            dst: net(dst),
            gw: gw.map(|g| g.parse().unwrap()),
        }
    }

    #[test]
    fn addresses_need_the_address_and_its_subnet_route() {
        let want = vec![IpConfig {
            address: net("10.88.0.5/16"),
            gateway: None,
            interface: Some(2),
        }];
        let routes = vec![entry("10.88.0.0/16", None)];
        check_addresses("eth0", &want, &[net("10.88.0.5/16")], &routes).unwrap();
        let e = check_addresses("eth0", &want, &[net("10.88.0.6/16")], &routes).unwrap_err();
        assert!(e.msg.contains("10.88.0.5/16"));
        assert!(check_addresses("eth0", &want, &[net("10.88.0.5/16")], &[]).is_err());
    }

    #[test]
    fn routes_match_on_destination_and_gateway() {
        let have = vec![
            entry("0.0.0.0/0", Some("10.88.0.1")),
            entry("10.10.0.0/16", Some("10.88.0.9")),
        ];
        let gw = |s: &str| Some(s.parse().unwrap());
        check_routes(&[Route::new(net("0.0.0.0/0"), gw("10.88.0.254"))], &have).unwrap();
        check_routes(&[Route::new(net("10.10.0.0/16"), gw("10.88.0.9"))], &have).unwrap();
        check_routes(&[Route::new(net("10.10.0.0/16"), None)], &have).unwrap();
        let e =
            check_routes(&[Route::new(net("10.10.0.0/16"), gw("10.88.0.8"))], &have).unwrap_err();
        assert!(e.msg.contains("10.10.0.0/16 via 10.88.0.8"), "{}", e.msg);
        assert!(check_routes(&[Route::new(net("10.20.0.0/16"), None)], &have).is_err());
    }
}
