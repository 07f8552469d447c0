//! The delegate's config, built from the flannel config and subnet.env as the Go plugin builds it.

use crate::config::NetConf;
use cni_protocol::{gokeys, CniError};
use serde_json::{json, Map, Value};
use subnetenv::SubnetEnv;

pub const DEFAULT_TYPE: &str = "bridge";
pub const DEFAULT_IPAM_TYPE: &str = "host-local";

/// The delegate config ADD runs and saves: `conf.delegate` with the network's name, the
/// type (bridge), ipMasq (unless flannel masquerades), the fabric's MTU, isGateway for
/// bridge, the config's cniVersion and runtimeConfig, and an IPAM section over the node's
/// subnets with a route to every cluster network. Fields the user set are kept.
pub fn build_delegate(conf: &NetConf, env: &SubnetEnv) -> Result<Value, CniError> {
    conf.check_delegate()?;
    let mut d = conf.delegate.clone();
    if let Some(rc) = &conf.runtime_config {
        d.insert("runtimeConfig".into(), Value::Object(rc.clone()));
    }
    d.insert("name".into(), json!(conf.name));
    d.entry("type").or_insert_with(|| json!(DEFAULT_TYPE));
    d.entry("ipMasq").or_insert_with(|| json!(!env.ipmasq));
    d.entry("mtu").or_insert_with(|| json!(env.mtu));
    if d.get("type").and_then(Value::as_str) == Some(DEFAULT_TYPE) {
        d.entry("isGateway").or_insert(Value::Bool(true));
    }
    if let Some(v) = &conf.cni_version {
        d.insert("cniVersion".into(), json!(v));
    }
    d.insert("ipam".into(), Value::Object(delegate_ipam(conf, env)?));
    Ok(Value::Object(d))
}

/// The delegate's `ipam`: the config's `ipam` with `type` defaulting to host-local, `ranges`
/// set to the node's subnets (IPv4 first) and `routes` extended with the cluster networks.
fn delegate_ipam(conf: &NetConf, env: &SubnetEnv) -> Result<Map<String, Value>, CniError> {
    let mut ipam = conf.ipam.clone().unwrap_or_default();
    ipam.entry("type")
        .or_insert_with(|| json!(DEFAULT_IPAM_TYPE));
    let ranges: Vec<Value> = [env.subnet_network(), env.ipv6_subnet_network()]
        .into_iter()
        .flatten()
        .map(|subnet| json!([{"subnet": subnet.to_string()}]))
        .collect();
    ipam.insert("ranges".into(), Value::Array(ranges));
    let mut routes = configured_routes(ipam.get("routes"))?;
    routes.extend(
        env.networks
            .iter()
            .chain(&env.ipv6_networks)
            .map(|n| json!({"dst": n.to_string()})),
    );
    ipam.insert("routes".into(), Value::Array(routes));
    Ok(ipam)
}

/// `ipam.routes` as the Go plugin re-encodes them: `dst` required, `gw` and the 1.1.0
/// fields kept when set, anything else dropped.
fn configured_routes(routes: Option<&Value>) -> Result<Vec<Value>, CniError> {
    let list = match routes {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(list)) => list,
        Some(other) => {
            return Err(CniError::invalid_config(format!(
                "field \"ipam.routes\" must be a list of routes, got {other}"
            )))
        }
    };
    list.iter()
        .enumerate()
        .map(|(i, r)| normalise_route(r, &format!("ipam.routes[{i}]")))
        .collect()
}

fn normalise_route(route: &Value, what: &str) -> Result<Value, CniError> {
    let bad = |field: &str, why: String| {
        CniError::invalid_config(format!("field \"{what}.{field}\": {why}"))
    };
    let o = route.as_object().ok_or_else(|| {
        CniError::invalid_config(format!(
            "field \"{what}\" must be a route object, got {route}"
        ))
    })?;
    let dst = match gokeys::get(o, "dst") {
        Some(Value::String(s)) => {
            subnetenv::parse_cidr(s).map_err(|e| bad("dst", format!("{s:?}: {e}")))?
        }
        Some(other) => return Err(bad("dst", format!("expected a CIDR string, got {other}"))),
        None => return Err(bad("dst", "missing".into())),
    };
    let mut out = Map::new();
    out.insert("dst".into(), json!(dst.to_string()));
    match gokeys::get(o, "gw") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s.is_empty() => {}
        Some(Value::String(s)) => {
            let gw: std::net::IpAddr = s
                .parse()
                .map_err(|_| bad("gw", format!("{s:?} is not an IP address")))?;
            out.insert("gw".into(), json!(gw.to_string()));
        }
        Some(other) => return Err(bad("gw", format!("expected an IP string, got {other}"))),
    }
    // Zero means unset for these three, as in the Go encoding; table and scope keep a zero.
    for (field, keep_zero) in [
        ("mtu", false),
        ("advmss", false),
        ("priority", false),
        ("table", true),
        ("scope", true),
    ] {
        match gokeys::get(o, field) {
            None | Some(Value::Null) => {}
            Some(v) => {
                let n = v
                    .as_i64()
                    .ok_or_else(|| bad(field, format!("expected an integer, got {v}")))?;
                if n != 0 || keep_zero {
                    out.insert(field.into(), json!(n));
                }
            }
        }
    }
    Ok(Value::Object(out))
}

/// The `type` of a delegate config (saved or built), which names the plugin to exec.
pub fn delegate_type(delegate: &Value) -> Result<&str, CniError> {
    match delegate.as_object().and_then(|o| gokeys::get(o, "type")) {
        Some(Value::String(t)) if !t.is_empty() => Ok(t),
        other => Err(CniError::invalid_config(format!(
            "the delegate config has no plugin type (field \"type\": {})",
            other
                .map(Value::to_string)
                .unwrap_or_else(|| "missing".into())
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(text: &str) -> SubnetEnv {
        SubnetEnv::parse(text).unwrap()
    }

    fn sample(name: &str) -> SubnetEnv {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../testdata")
            .join(name);
        SubnetEnv::read(&path).unwrap()
    }

    fn conf(v: Value) -> NetConf {
        NetConf::parse(&v).unwrap()
    }

    #[test]
    fn stock_kube_flannel_config_on_ipv4() {
        let c = conf(json!({
            "name": "cbr0", "cniVersion": "0.3.1", "type": "flannel",
            "delegate": {"hairpinMode": true, "isDefaultGateway": true}
        }));
        assert_eq!(
            build_delegate(&c, &sample("subnet-ipv4.env")).unwrap(),
            json!({
                "cniVersion": "0.3.1",
                "name": "cbr0",
                "type": "bridge",
                "hairpinMode": true,
                "isDefaultGateway": true,
                "isGateway": true,
                "ipMasq": false,
                "mtu": 1450,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": "10.244.1.0/24"}]],
                    "routes": [{"dst": "10.244.0.0/16"}]
                }
            })
        );
    }

    #[test]
    fn ipv6_only() {
        let c = conf(json!({"name": "v6", "cniVersion": "1.0.0"}));
        assert_eq!(
            build_delegate(&c, &sample("subnet-ipv6.env")).unwrap(),
            json!({
                "cniVersion": "1.0.0",
                "name": "v6",
                "type": "bridge",
                "isGateway": true,
                "ipMasq": true,
                "mtu": 1430,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": "fd00:10:244:1::/64"}]],
                    "routes": [{"dst": "fd00:10:244::/56"}]
                }
            })
        );
    }

    #[test]
    fn dual_stack_puts_ipv4_first() {
        let c = conf(json!({"name": "dual", "cniVersion": "1.1.0"}));
        assert_eq!(
            build_delegate(&c, &sample("subnet-dual.env")).unwrap(),
            json!({
                "cniVersion": "1.1.0",
                "name": "dual",
                "type": "bridge",
                "isGateway": true,
                "ipMasq": false,
                "mtu": 1450,
                "ipam": {
                    "type": "host-local",
                    "ranges": [
                        [{"subnet": "10.244.1.0/24"}],
                        [{"subnet": "fd00:10:244:1::/64"}]
                    ],
                    "routes": [{"dst": "10.244.0.0/16"}, {"dst": "fd00:10:244::/56"}]
                }
            })
        );
    }

    /// A key in another case names the same field, as the Go decoders read them: the user's
    /// values are kept under the CNI names rather than overridden by flannel's defaults.
    #[test]
    fn delegate_and_ipam_keys_match_in_any_case() {
        let c = conf(json!({
            "Name": "cbr0", "CNIVersion": "1.0.0", "SubnetFile": "/x/subnet.env",
            "Delegate": {"Type": "bridge", "IPMasq": true, "MTU": 1300, "IsGateway": false, "HairpinMode": true},
            "IPAM": {"Type": "my-ipam", "Routes": [{"Dst": "192.168.7.0/24", "GW": "10.244.1.254", "MTU": 9}]}
        }));
        assert_eq!(c.subnet_file, std::path::PathBuf::from("/x/subnet.env"));
        assert_eq!(
            build_delegate(&c, &sample("subnet-ipv4.env")).unwrap(),
            json!({
                "cniVersion": "1.0.0",
                "name": "cbr0",
                "type": "bridge",
                "HairpinMode": true,
                "isGateway": false,
                "ipMasq": true,
                "mtu": 1300,
                "ipam": {
                    "type": "my-ipam",
                    "ranges": [[{"subnet": "10.244.1.0/24"}]],
                    "routes": [
                        {"dst": "192.168.7.0/24", "gw": "10.244.1.254", "mtu": 9},
                        {"dst": "10.244.0.0/16"}
                    ]
                }
            })
        );
        // flannel names the delegate: a "Name" in the delegate is refused like "name".
        let named = conf(json!({"name": "n", "delegate": {"NAME": "x"}}));
        assert!(build_delegate(&named, &sample("subnet-ipv4.env")).is_err());
        assert_eq!(delegate_type(&json!({"Type": "ipvlan"})).unwrap(), "ipvlan");
        // Capability args no plugin of the suite reads reach the delegate as the runtime sent them.
        let rc = json!({
            "bandwidth": {"IngressRate": 1, "IngressBurst": 2, "EgressRate": 3, "EgressBurst": 4},
            "dns": {"Servers": ["10.0.0.10"], "Searches": ["svc"], "Options": ["ndots:5"]},
            "aliases": {"net": ["a"]},
            "portMappings": [{"HostPort": 8083, "ContainerPort": 80, "Protocol": "tcp", "HostIP": ""}]
        });
        let c = conf(json!({"name": "n", "RuntimeConfig": rc}));
        let d = build_delegate(&c, &sample("subnet-ipv4.env")).unwrap();
        assert_eq!(d["runtimeConfig"], rc);
    }

    #[test]
    fn several_networks_each_get_a_route_after_the_configured_ones() {
        let c = conf(json!({
            "name": "multi", "cniVersion": "0.4.0",
            "ipam": {
                "dataDir": "/x/ipam",
                "routes": [{"dst": "192.168.7.0/24", "gw": "10.244.1.254", "junk": 1}]
            }
        }));
        assert_eq!(
            build_delegate(&c, &sample("subnet-multi.env")).unwrap(),
            json!({
                "cniVersion": "0.4.0",
                "name": "multi",
                "type": "bridge",
                "isGateway": true,
                "ipMasq": true,
                "mtu": 8951,
                "ipam": {
                    "type": "host-local",
                    "dataDir": "/x/ipam",
                    "ranges": [
                        [{"subnet": "10.244.1.0/24"}],
                        [{"subnet": "fd00:10:244:1::/64"}]
                    ],
                    "routes": [
                        {"dst": "192.168.7.0/24", "gw": "10.244.1.254"},
                        {"dst": "10.244.0.0/16"},
                        {"dst": "10.245.0.0/16"},
                        {"dst": "fd00:10:244::/56"},
                        {"dst": "fd00:10:245::/56"}
                    ]
                }
            })
        );
    }

    #[test]
    fn every_user_setting_overrides_its_default() {
        let c = conf(json!({
            "name": "n", "cniVersion": "1.0.0",
            "delegate": {
                "type": "bridge", "ipMasq": true, "mtu": 9000, "isGateway": false,
                "bridge": "cni9", "cniVersion": "0.1.0"
            },
            "ipam": {
                "type": "static-ish",
                "ranges": [[{"subnet": "1.2.3.0/24"}]],
                "routes": [{"dst": "0.0.0.0/0", "mtu": 0, "advmss": 1400, "table": 0}]
            },
            "runtimeConfig": {"portMappings": [{"hostPort": 80, "containerPort": 8080}]}
        }));
        assert_eq!(
            build_delegate(&c, &sample("subnet-ipv4.env")).unwrap(),
            json!({
                "cniVersion": "1.0.0",
                "name": "n",
                "type": "bridge",
                "bridge": "cni9",
                "isGateway": false,
                "ipMasq": true,
                "mtu": 9000,
                "runtimeConfig": {"portMappings": [{"hostPort": 80, "containerPort": 8080}]},
                "ipam": {
                    "type": "static-ish",
                    "ranges": [[{"subnet": "10.244.1.0/24"}]],
                    "routes": [
                        {"dst": "0.0.0.0/0", "advmss": 1400, "table": 0},
                        {"dst": "10.244.0.0/16"}
                    ]
                }
            })
        );
    }

    #[test]
    fn is_gateway_is_for_bridge_only() {
        let c = conf(json!({"name": "n", "delegate": {"type": "ipvlan", "master": "eth0"}}));
        let d = build_delegate(&c, &sample("subnet-ipv4.env")).unwrap();
        assert_eq!(
            d,
            json!({
                "name": "n",
                "type": "ipvlan",
                "master": "eth0",
                "ipMasq": false,
                "mtu": 1450,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": "10.244.1.0/24"}]],
                    "routes": [{"dst": "10.244.0.0/16"}]
                }
            })
        );
    }

    #[test]
    fn ipmasq_in_subnet_env_turns_the_delegates_off_and_back() {
        let text = |masq: &str| {
            format!("FLANNEL_NETWORK=10.1.0.0/16\nFLANNEL_SUBNET=10.1.2.1/24\nFLANNEL_MTU=1400\nFLANNEL_IPMASQ={masq}\n")
        };
        let c = conf(json!({"name": "n"}));
        for (masq, delegate_masq) in [("true", false), ("false", true), ("yes", true)] {
            let d = build_delegate(&c, &env(&text(masq))).unwrap();
            assert_eq!(d["ipMasq"], delegate_masq, "{masq}");
            assert_eq!(d["mtu"], 1400);
        }
    }

    #[test]
    fn a_present_null_is_kept_as_the_go_plugin_keeps_it() {
        let c = conf(json!({"name": "n", "delegate": {"ipMasq": null, "mtu": null}}));
        let d = build_delegate(&c, &sample("subnet-ipv4.env")).unwrap();
        assert_eq!(d["ipMasq"], Value::Null);
        assert_eq!(d["mtu"], Value::Null);
    }

    #[test]
    fn bad_ipam_routes_are_code_7_naming_the_route() {
        for (routes, field) in [
            (json!("0.0.0.0/0"), "ipam.routes"),
            (json!([{"dst": "0.0.0.0/0"}, 5]), "ipam.routes[1]"),
            (json!([{"gw": "10.0.0.1"}]), "ipam.routes[0].dst"),
            (json!([{"dst": "10.0.0.0"}]), "ipam.routes[0].dst"),
            (
                json!([{"dst": "0.0.0.0/0", "gw": "x"}]),
                "ipam.routes[0].gw",
            ),
            (
                json!([{"dst": "0.0.0.0/0", "mtu": "9"}]),
                "ipam.routes[0].mtu",
            ),
        ] {
            let c = conf(json!({"name": "n", "ipam": {"routes": routes}}));
            let e = build_delegate(&c, &sample("subnet-ipv4.env")).unwrap_err();
            assert_eq!(e.code, 7, "{e}");
            assert!(e.msg.contains(&format!("\"{field}")), "{field}: {e}");
        }
    }

    #[test]
    fn a_forbidden_delegate_field_is_refused_when_building() {
        let c = conf(json!({"name": "n", "delegate": {"ipam": {}}}));
        assert_eq!(
            build_delegate(&c, &sample("subnet-ipv4.env"))
                .unwrap_err()
                .code,
            7
        );
    }

    #[test]
    fn delegate_type_names_the_plugin_or_refuses() {
        assert_eq!(delegate_type(&json!({"type": "bridge"})).unwrap(), "bridge");
        for bad in [
            json!({}),
            json!({"type": ""}),
            json!({"type": 1}),
            json!([]),
        ] {
            assert_eq!(delegate_type(&bad).unwrap_err().code, 7, "{bad}");
        }
    }
}
