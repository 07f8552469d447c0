//! The plugin's config: the Go plugin's fields, defaults and checks, plus the checks it skips
//! (port range, protocol, hostIP), each error naming the mapping it is about.

use crate::container::ContainerAddrs;
use cni_protocol::{decode, CniError};
use serde::Deserialize;
use serde_json::Value;
use std::fmt;
use std::net::IpAddr;

/// Kubernetes uses mark bits 14 and 15, Calico 20 to 31.
pub const DEFAULT_MARK_BIT: i64 = 13;

pub use cni_kernel::firewall::Backend;

/// Ordered as the Go plugin sorts protocol names, which orders its multiport rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Sctp,
    Tcp,
    Udp,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Sctp => "sctp",
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        }
    }

    /// The IANA protocol number, as conntrack names it.
    pub fn number(self) -> u8 {
        match self {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
            Protocol::Sctp => 132,
        }
    }

    fn parse(s: &str) -> Option<Protocol> {
        match s.to_ascii_lowercase().as_str() {
            "tcp" => Some(Protocol::Tcp),
            "udp" => Some(Protocol::Udp),
            "sctp" => Some(Protocol::Sctp),
            _ => None,
        }
    }
}

/// One validated entry of `runtimeConfig.portMappings`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub host_port: u16,
    pub container_port: u16,
    pub protocol: Protocol,
    /// Only traffic to this address is forwarded; a wildcard (0.0.0.0, ::) still picks the family.
    pub host_ip: Option<IpAddr>,
}

impl Mapping {
    /// Whether the mapping forwards to a container address of this family: a hostIP of the
    /// other family does not.
    pub fn applies_to(&self, container: IpAddr) -> bool {
        self.host_ip
            .is_none_or(|h| h.is_ipv4() == container.is_ipv4())
    }

    /// The destination to match, if any: a wildcard hostIP matches every local address.
    pub fn host_dst(&self) -> Option<IpAddr> {
        self.host_ip.filter(|h| !h.is_unspecified())
    }
}

impl fmt::Display for Mapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{{hostPort {}, containerPort {}, protocol {}",
            self.host_port,
            self.container_port,
            self.protocol.as_str()
        )?;
        if let Some(ip) = self.host_ip {
            write!(f, ", hostIP {ip}")?;
        }
        f.write_str("}")
    }
}

/// Where the rules that ask for masquerading jump.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MarkChain {
    /// The plugin's own CNI-HOSTPORT-SETMARK chain, setting this bit.
    Own { bit: u32 },
    /// A chain someone else keeps (e.g. Kubernetes' KUBE-MARK-MASQ); iptables only.
    External(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The network name: with the container ID it names the per-container chain.
    pub network: String,
    pub backend: Backend,
    pub snat: bool,
    pub masq_all: bool,
    pub mark: MarkChain,
    pub conditions_v4: Vec<String>,
    pub conditions_v6: Vec<String>,
    pub mappings: Vec<Mapping>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawConfig {
    backend: Option<String>,
    snat: Option<bool>,
    conditions_v4: Option<Vec<String>>,
    conditions_v6: Option<Vec<String>>,
    masq_all: Option<bool>,
    mark_masq_bit: Option<i64>,
    external_set_mark_chain: Option<String>,
    runtime_config: Option<RawRuntimeConfig>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawRuntimeConfig {
    port_mappings: Option<Vec<RawMapping>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawMapping {
    host_port: Option<i64>,
    container_port: Option<i64>,
    protocol: Option<String>,
    #[serde(rename = "hostIP")]
    host_ip: Option<String>,
}

impl fmt::Display for RawMapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let num = |n: Option<i64>| n.map_or("null".to_string(), |n| n.to_string());
        write!(
            f,
            "{{hostPort {}, containerPort {}, protocol {:?}",
            num(self.host_port),
            num(self.container_port),
            self.protocol.as_deref().unwrap_or("")
        )?;
        if let Some(ip) = self.host_ip.as_deref().filter(|ip| !ip.is_empty()) {
            write!(f, ", hostIP {ip:?}")?;
        }
        f.write_str("}")
    }
}

impl RawMapping {
    fn validate(&self, index: usize) -> Result<Mapping, CniError> {
        let bad = |problem: String| {
            CniError::invalid_config(format!(
                "invalid port mapping runtimeConfig.portMappings[{index}] {self}: {problem}"
            ))
        };
        let port = |field: &str, value: Option<i64>| {
            let n = value.unwrap_or(0);
            u16::try_from(n)
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| bad(format!("{field} {n} is outside 1-65535")))
        };
        let host_port = port("hostPort", self.host_port)?;
        let container_port = port("containerPort", self.container_port)?;
        let proto = self.protocol.as_deref().unwrap_or("");
        let protocol = Protocol::parse(proto).ok_or_else(|| {
            bad(format!(
                "protocol {proto:?} is not one of \"tcp\", \"udp\", \"sctp\""
            ))
        })?;
        let host_ip = match self.host_ip.as_deref().filter(|ip| !ip.is_empty()) {
            None => None,
            Some(ip) => Some(
                ip.parse::<IpAddr>()
                    .map(unmap_v4)
                    .map_err(|_| bad(format!("hostIP {ip:?} is not an IP address")))?,
            ),
        };
        Ok(Mapping {
            host_port,
            container_port,
            protocol,
            host_ip,
        })
    }
}

/// `::ffff:a.b.c.d` is an IPv4 address, as the Go plugin's To4() sees it.
fn unmap_v4(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Which backend a list of conditions was written for: iptables options start with '-' (or
/// are negated with a lone "!"), nftables expressions never do. None for no conditions.
fn backend_of_conditions(conditions: &[String]) -> Option<Backend> {
    let first = conditions.first().filter(|c| !c.is_empty())?;
    let option = match first.as_str() {
        "!" => conditions.get(1).map_or("", String::as_str),
        _ => first,
    };
    Some(if option.starts_with('-') {
        Backend::Iptables
    } else {
        Backend::Nftables
    })
}

impl Config {
    /// Reads and validates the config. `default_backend` is asked only when the config
    /// names none (the Go plugin prefers iptables when it is usable).
    pub fn parse(
        config: &Value,
        network: &str,
        default_backend: impl FnOnce() -> Backend,
    ) -> Result<Config, CniError> {
        let raw: RawConfig = decode(config)?;
        let bad = CniError::invalid_config;

        if raw.mark_masq_bit.is_some() && raw.external_set_mark_chain.is_some() {
            return Err(bad(format!(
                "markMasqBit {} and externalSetMarkChain {:?} cannot both be set: the external chain sets its own mark",
                raw.mark_masq_bit.unwrap_or_default(),
                raw.external_set_mark_chain.as_deref().unwrap_or_default()
            )));
        }
        let mark = match raw.external_set_mark_chain {
            Some(chain) if chain.is_empty() || chain.contains(char::is_whitespace) => {
                return Err(bad(format!(
                    "externalSetMarkChain {chain:?} is not an iptables chain name"
                )))
            }
            Some(chain) => MarkChain::External(chain),
            None => {
                let bit = raw.mark_masq_bit.unwrap_or(DEFAULT_MARK_BIT);
                if !(0..=31).contains(&bit) {
                    return Err(bad(format!("markMasqBit {bit} is outside 0-31")));
                }
                MarkChain::Own { bit: bit as u32 }
            }
        };

        let conditions_v4 = raw.conditions_v4.unwrap_or_default();
        let conditions_v6 = raw.conditions_v6.unwrap_or_default();
        let backend = match raw.backend.as_deref() {
            None => default_backend(),
            Some("iptables") => Backend::Iptables,
            Some("nftables") => Backend::Nftables,
            Some(other) => {
                return Err(bad(format!(
                    "backend {other:?} is not \"iptables\" or \"nftables\""
                )))
            }
        };
        let mut foreign = Vec::new();
        if backend == Backend::Nftables && matches!(mark, MarkChain::External(_)) {
            foreign.push("externalSetMarkChain");
        }
        for (field, conditions) in [
            ("conditionsV4", &conditions_v4),
            ("conditionsV6", &conditions_v6),
        ] {
            if backend_of_conditions(conditions).is_some_and(|b| b != backend) {
                foreign.push(field);
            }
        }
        if !foreign.is_empty() {
            let other = backend.other();
            return Err(bad(format!(
                "the {} backend is in use but the config holds {}-specific options [{}]",
                backend.as_str(),
                other.as_str(),
                foreign.join(", ")
            )));
        }

        let mappings = raw
            .runtime_config
            .and_then(|r| r.port_mappings)
            .unwrap_or_default()
            .iter()
            .enumerate()
            .map(|(i, m)| m.validate(i))
            .collect::<Result<Vec<_>, _>>()?;

        Ok(Config {
            network: network.to_string(),
            backend,
            snat: raw.snat.unwrap_or(true),
            masq_all: raw.masq_all.unwrap_or(false),
            mark,
            conditions_v4,
            conditions_v6,
            mappings,
        })
    }

    /// The conditions for rules of the container address's family.
    pub fn conditions(&self, container: IpAddr) -> &[String] {
        if container.is_ipv4() {
            &self.conditions_v4
        } else {
            &self.conditions_v6
        }
    }

    /// The mark value that asks for masquerading (`1 << markMasqBit`); None with an external chain.
    pub fn mark_value(&self) -> Option<u32> {
        match self.mark {
            MarkChain::Own { bit } => Some(1u32 << bit),
            MarkChain::External(_) => None,
        }
    }

    /// Refuses a mapping that would forward nothing: a hostIP of a family the container
    /// has no address of. The Go plugin skips such a mapping without a word.
    pub fn check_families(&self, addrs: &ContainerAddrs) -> Result<(), CniError> {
        if addrs.is_empty() {
            return Ok(());
        }
        for (i, m) in self.mappings.iter().enumerate() {
            let Some(ip) = m.host_ip else { continue };
            if !addrs.iter().any(|a| m.applies_to(a.ip())) {
                let have: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
                return Err(CniError::invalid_config(format!(
                    "invalid port mapping runtimeConfig.portMappings[{i}] {m}: hostIP {ip} is IPv{} but the container's addresses ({}) are not",
                    if ip.is_ipv4() { 4 } else { 6 },
                    have.join(", ")
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni_protocol::error::{DECODING_FAILURE, INVALID_NETWORK_CONFIG};
    use serde_json::json;

    fn parse(v: Value) -> Result<Config, CniError> {
        Config::parse(&v, "net", || Backend::Iptables)
    }

    fn with_mappings(m: Value) -> Value {
        json!({"cniVersion": "1.0.0", "name": "net", "type": "portmap",
               "runtimeConfig": {"portMappings": m}})
    }

    fn err_msg(v: Value) -> String {
        let e = parse(v).unwrap_err();
        assert_eq!(e.code, INVALID_NETWORK_CONFIG, "{e}");
        e.msg
    }

    #[test]
    fn defaults_are_the_go_plugins() {
        let c = parse(json!({"name": "net"})).unwrap();
        assert_eq!(c.backend, Backend::Iptables);
        assert!(c.snat);
        assert!(!c.masq_all);
        assert_eq!(c.mark, MarkChain::Own { bit: 13 });
        assert_eq!(c.mark_value(), Some(0x2000));
        assert!(c.mappings.is_empty());
        assert!(c.conditions_v4.is_empty() && c.conditions_v6.is_empty());
    }

    #[test]
    fn null_fields_count_as_absent() {
        let c = parse(
            json!({"snat": null, "markMasqBit": null, "conditionsV4": null,
                             "runtimeConfig": {"portMappings": null}}),
        )
        .unwrap();
        assert!(c.snat);
        assert_eq!(c.mark, MarkChain::Own { bit: 13 });
        assert!(parse(json!({"runtimeConfig": null}))
            .unwrap()
            .mappings
            .is_empty());
    }

    #[test]
    fn default_backend_is_asked_only_when_none_is_named() {
        let v = json!({"backend": "iptables"});
        let c = Config::parse(&v, "n", || panic!("not asked")).unwrap();
        assert_eq!(c.backend, Backend::Iptables);
        let c = Config::parse(&json!({}), "n", || Backend::Nftables).unwrap();
        assert_eq!(c.backend, Backend::Nftables);
    }

    #[test]
    fn options_are_read() {
        let c = parse(json!({"snat": false, "masqAll": true, "markMasqBit": 0,
                             "backend": "nftables", "conditionsV4": ["ip", "saddr", "1.2.3.4"],
                             "conditionsV6": ["ip6", "saddr", "::1"]}))
        .unwrap();
        assert!(!c.snat && c.masq_all);
        assert_eq!(c.mark_value(), Some(1));
        assert_eq!(c.backend, Backend::Nftables);
        assert_eq!(
            c.conditions("1.1.1.1".parse().unwrap()),
            ["ip", "saddr", "1.2.3.4"]
        );
        assert_eq!(
            c.conditions("::2".parse().unwrap()),
            ["ip6", "saddr", "::1"]
        );
        let c = parse(json!({"markMasqBit": 31})).unwrap();
        assert_eq!(c.mark_value(), Some(0x8000_0000));
        let c = parse(json!({"externalSetMarkChain": "KUBE-MARK-MASQ"})).unwrap();
        assert_eq!(c.mark, MarkChain::External("KUBE-MARK-MASQ".into()));
        assert_eq!(c.mark_value(), None);
    }

    #[test]
    fn mark_bit_out_of_range_is_refused() {
        for bit in [-1, 32, 1000] {
            let msg = err_msg(json!({"markMasqBit": bit}));
            assert!(msg.contains(&format!("markMasqBit {bit}")), "{msg}");
        }
    }

    #[test]
    fn mark_bit_and_external_chain_are_exclusive() {
        let msg = err_msg(json!({"markMasqBit": 13, "externalSetMarkChain": "KUBE-MARK-MASQ"}));
        assert!(
            msg.contains("markMasqBit 13") && msg.contains("KUBE-MARK-MASQ"),
            "{msg}"
        );
        let msg = err_msg(json!({"externalSetMarkChain": ""}));
        assert!(msg.contains("externalSetMarkChain \"\""), "{msg}");
    }

    #[test]
    fn unknown_backend_is_refused() {
        let msg = err_msg(json!({"backend": "ebtables"}));
        assert!(msg.contains("\"ebtables\""), "{msg}");
    }

    #[test]
    fn options_of_the_other_backend_are_refused() {
        let msg = err_msg(json!({"backend": "iptables", "conditionsV6": ["ip6", "saddr", "::1"]}));
        assert!(
            msg.contains("nftables-specific options [conditionsV6]"),
            "{msg}"
        );
        let msg = err_msg(json!({"backend": "nftables", "externalSetMarkChain": "X",
                                 "conditionsV4": ["-s", "1.2.3.4"]}));
        assert!(
            msg.contains("iptables-specific options [externalSetMarkChain, conditionsV4]"),
            "{msg}"
        );
        // An empty first condition says nothing about the backend, as in the Go plugin.
        parse(json!({"backend": "iptables", "conditionsV4": [""]})).unwrap();
        // A negated iptables option is still iptables (the Go plugin takes it for nftables).
        parse(json!({"backend": "iptables", "conditionsV4": ["!", "-s", "10.0.0.0/8"]})).unwrap();
        let msg = err_msg(json!({"backend": "iptables", "conditionsV4": ["!=", "x"]}));
        assert!(msg.contains("[conditionsV4]"), "{msg}");
    }

    #[test]
    fn mappings_are_read() {
        let c = parse(with_mappings(json!([
            {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"},
            {"hostPort": 5353, "containerPort": 53, "protocol": "UDP", "hostIP": "192.0.2.1"},
            {"hostPort": 9, "containerPort": 9, "protocol": "sctp", "hostIP": ""},
            {"hostPort": 1, "containerPort": 65535, "protocol": "tcp", "hostIP": "::ffff:10.0.0.1"},
            {"hostPort": 65535, "containerPort": 1, "protocol": "tcp", "hostIP": "2001:db8::1"},
        ])))
        .unwrap();
        assert_eq!(
            c.mappings[0],
            Mapping {
                host_port: 8080,
                container_port: 80,
                protocol: Protocol::Tcp,
                host_ip: None
            }
        );
        assert_eq!(c.mappings[1].protocol, Protocol::Udp);
        assert_eq!(c.mappings[1].host_ip, Some("192.0.2.1".parse().unwrap()));
        assert_eq!(c.mappings[2].host_ip, None);
        assert_eq!(c.mappings[3].host_ip, Some("10.0.0.1".parse().unwrap()));
        assert_eq!(c.mappings[4].host_ip, Some("2001:db8::1".parse().unwrap()));
    }

    /// containerd's go-cni sends Go's field names (`HostPort`); any case is read, as in Go.
    #[test]
    fn mapping_and_option_keys_match_in_any_case_as_in_go() {
        let want = Mapping {
            host_port: 8083,
            container_port: 80,
            protocol: Protocol::Tcp,
            host_ip: None,
        };
        for m in [
            json!({"HostPort": 8083, "ContainerPort": 80, "Protocol": "tcp", "HostIP": ""}),
            json!({"hostport": 8083, "containerport": 80, "protocol": "tcp", "hostip": ""}),
            json!({"HOSTPORT": 8083, "containerPORT": 80, "PROTOCOL": "tcp", "hostIp": ""}),
        ] {
            let c = parse(with_mappings(json!([m.clone()]))).unwrap();
            assert_eq!(c.mappings, std::slice::from_ref(&want), "{m}");
        }
        let c = parse(json!({"SNAT": false, "MarkMasqBit": 5, "conditionsv4": ["-s", "x"],
                             "RuntimeConfig": {"portMappings": [{"HostPort": 1, "ContainerPort": 2, "Protocol": "udp"}]}}))
        .unwrap();
        assert!(!c.snat);
        assert_eq!(c.mark, MarkChain::Own { bit: 5 });
        assert_eq!(c.conditions_v4, ["-s", "x"]);
        assert_eq!(c.mappings[0].host_port, 1);
        // The exact key wins over a case variant.
        let c = parse(with_mappings(json!([
            {"hostPort": 8083, "HostPort": 1, "containerPort": 80, "protocol": "tcp"}
        ])))
        .unwrap();
        assert_eq!(c.mappings, [want]);
    }

    #[test]
    fn bad_mappings_are_refused_naming_the_mapping() {
        let cases = [
            (
                json!({"hostPort": 0, "containerPort": 80, "protocol": "tcp"}),
                "hostPort 0 is outside 1-65535",
            ),
            (
                json!({"hostPort": 70000, "containerPort": 80, "protocol": "tcp"}),
                "hostPort 70000 is outside 1-65535",
            ),
            (
                json!({"hostPort": -1, "containerPort": 80, "protocol": "tcp"}),
                "hostPort -1",
            ),
            (
                json!({"containerPort": 80, "protocol": "tcp"}),
                "hostPort 0",
            ),
            (
                json!({"hostPort": 80, "containerPort": 0, "protocol": "tcp"}),
                "containerPort 0 is outside",
            ),
            (
                json!({"hostPort": 80, "containerPort": 65536, "protocol": "tcp"}),
                "containerPort 65536",
            ),
            (
                json!({"hostPort": 80, "containerPort": 80, "protocol": "icmp"}),
                "protocol \"icmp\" is not one of",
            ),
            (
                json!({"hostPort": 80, "containerPort": 80}),
                "protocol \"\" is not one of",
            ),
            (
                json!({"hostPort": 80, "containerPort": 80, "protocol": "tcp", "hostIP": "my-host"}),
                "hostIP \"my-host\" is not an IP address",
            ),
            (
                json!({"hostPort": 80, "containerPort": 80, "protocol": "tcp", "hostIP": "10.0.0.1/24"}),
                "hostIP \"10.0.0.1/24\"",
            ),
        ];
        for (m, want) in cases {
            let ok = json!({"hostPort": 1, "containerPort": 1, "protocol": "tcp"});
            let msg = err_msg(with_mappings(json!([ok, m])));
            assert!(msg.contains("runtimeConfig.portMappings[1]"), "{msg}");
            assert!(msg.contains(want), "{msg} lacks {want}");
        }
    }

    #[test]
    fn wrong_types_are_decode_errors_naming_the_field() {
        let e = parse(with_mappings(json!([{"hostPort": "80"}]))).unwrap_err();
        assert_eq!(e.code, DECODING_FAILURE);
        assert!(
            e.msg.contains("runtimeConfig.portMappings[0].hostPort"),
            "{}",
            e.msg
        );
        let e = parse(json!({"snat": "yes"})).unwrap_err();
        assert_eq!(e.code, DECODING_FAILURE);
        assert!(e.msg.contains("snat"), "{}", e.msg);
    }

    #[test]
    fn a_host_ip_of_a_family_the_container_lacks_is_refused() {
        let c = parse(with_mappings(json!([
            {"hostPort": 80, "containerPort": 80, "protocol": "tcp"},
            {"hostPort": 81, "containerPort": 80, "protocol": "tcp", "hostIP": "2001:db8::1"},
        ])))
        .unwrap();
        let v4 = ContainerAddrs {
            v4: Some("10.0.0.2/24".parse().unwrap()),
            v6: None,
        };
        let e = c.check_families(&v4).unwrap_err();
        assert_eq!(e.code, INVALID_NETWORK_CONFIG);
        assert!(
            e.msg.contains("portMappings[1]") && e.msg.contains("2001:db8::1"),
            "{}",
            e.msg
        );
        let dual = ContainerAddrs {
            v4: Some("10.0.0.2/24".parse().unwrap()),
            v6: Some("fd00::2/64".parse().unwrap()),
        };
        c.check_families(&dual).unwrap();
        c.check_families(&ContainerAddrs::default()).unwrap();
    }

    #[test]
    fn a_wildcard_host_ip_applies_to_its_family_only() {
        let m = Mapping {
            host_port: 1,
            container_port: 1,
            protocol: Protocol::Tcp,
            host_ip: Some("0.0.0.0".parse().unwrap()),
        };
        assert!(m.applies_to("10.0.0.1".parse().unwrap()));
        assert!(!m.applies_to("fd00::1".parse().unwrap()));
        assert_eq!(m.host_dst(), None);
        assert_eq!(
            m.to_string(),
            "{hostPort 1, containerPort 1, protocol tcp, hostIP 0.0.0.0}"
        );
    }
}
