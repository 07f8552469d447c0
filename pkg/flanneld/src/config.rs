//! The cluster's network config (flannel's `net-conf.json` / `<prefix>/config`): decoding with
//! Go's key matching, defaults and refusals as flannel's config check, plus SubnetMin > SubnetMax.

use crate::family::IpFamily;
use ipnetwork::{IpNetwork, Ipv4Network, Ipv6Network};
use serde_json::{Map, Value};
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

/// The backend every node uses when the config names none: udp, as in Go's flanneld.
pub const DEFAULT_BACKEND: &str = "udp";

#[derive(Debug, Clone, PartialEq)]
pub struct NetConfig {
    pub ipv4: Option<Family<Ipv4Network>>,
    pub ipv6: Option<Family<Ipv6Network>>,
    pub enable_nftables: bool,
    /// `Backend.Type`, lower case as flannel compares it.
    pub backend_type: String,
    /// The whole `Backend` object, for the backend's own keys.
    pub backend: Value,
}

impl NetConfig {
    /// The cluster network of one family, when the config enables it.
    pub fn network(&self, family: IpFamily) -> Option<IpNetwork> {
        match family {
            IpFamily::V4 => self.ipv4.map(|f| IpNetwork::V4(f.network)),
            IpFamily::V6 => self.ipv6.map(|f| IpNetwork::V6(f.network)),
        }
    }

    /// The families the config enables, IPv4 first.
    pub fn families(&self) -> Vec<IpFamily> {
        IpFamily::BOTH
            .into_iter()
            .filter(|f| self.network(*f).is_some())
            .collect()
    }
}

/// One address family's part of the config, defaults applied and checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Family<N> {
    pub network: N,
    pub subnet_len: u8,
    /// The first and the last subnet handed out (network addresses).
    pub subnet_min: N,
    pub subnet_max: N,
}

/// A refusal: the key, the value it had, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub key: String,
    pub value: String,
    pub reason: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "network config: {} {}: {}",
            self.key, self.value, self.reason
        )
    }
}

impl std::error::Error for ConfigError {}

fn refuse(key: &str, value: impl fmt::Display, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        key: key.to_string(),
        value: value.to_string(),
        reason: reason.into(),
    }
}

/// The value of `key` as Go's decoder finds it: the exact name first, then any case.
pub fn field<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key).or_else(|| {
        obj.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v)
    })
}

/// The keys of one object of the network config (the config itself, or its `Backend`), read
/// as Go's decoder finds them; each refusal names the key as the config has it (`SubnetLen`,
/// `Backend.VNI`). The one reader of config keys: each backend reads its own through
/// [`Fields::backend`].
#[derive(Debug, Clone, Copy)]
pub struct Fields<'a> {
    obj: Option<&'a Map<String, Value>>,
    /// What a refusal puts before the key: `Backend.` for the backend's.
    prefix: &'static str,
}

impl<'a> Fields<'a> {
    fn of(obj: Option<&'a Map<String, Value>>, prefix: &'static str) -> Fields<'a> {
        Fields { obj, prefix }
    }

    /// The keys of the config's `Backend` object.
    pub fn backend(cfg: &'a NetConfig) -> Fields<'a> {
        Fields::of(cfg.backend.as_object(), "Backend.")
    }

    /// The value of `key`; None when it is absent or null.
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.obj
            .and_then(|o| field(o, key))
            .filter(|v| !v.is_null())
    }

    /// A refusal of `key`'s `value`, saying why.
    pub fn refuse(
        &self,
        key: &str,
        value: impl fmt::Display,
        reason: impl Into<String>,
    ) -> ConfigError {
        refuse(&format!("{}{key}", self.prefix), value, reason)
    }

    /// `true` or `false`.
    pub fn bool(&self, key: &str) -> Result<Option<bool>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.refuse(key, v, "must be true or false")),
        }
    }

    /// A string, the empty one included.
    pub fn text(&self, key: &str) -> Result<Option<&'a str>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.refuse(key, v, "must be a string")),
        }
    }

    /// A whole number within `range`; any other value is refused saying `reason`.
    pub fn number(
        &self,
        key: &str,
        range: std::ops::RangeInclusive<u64>,
        reason: &str,
    ) -> Result<Option<u64>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_u64().filter(|n| range.contains(n)) {
                Some(n) => Ok(Some(n)),
                None => Err(self.refuse(key, v, reason)),
            },
        }
    }

    /// A prefix length; 0 is none.
    fn prefix_len(&self, key: &str) -> Result<Option<u8>, ConfigError> {
        let len = self.number(key, 0..=128, "must be a prefix length")?;
        Ok(len.filter(|n| *n != 0).map(|n| n as u8))
    }

    /// A string that is not empty.
    fn some_text(&self, key: &str) -> Result<Option<&'a str>, ConfigError> {
        Ok(self.text(key)?.filter(|s| !s.is_empty()))
    }

    fn network<N: std::str::FromStr>(
        &self,
        key: &str,
        what: &str,
    ) -> Result<Option<N>, ConfigError> {
        self.some_text(key)?
            .map(|s| {
                let bad = || self.refuse(key, s, format!("must be an {what} network in CIDR form"));
                if !s.contains('/') {
                    return Err(bad());
                }
                s.parse::<N>().map_err(|_| bad())
            })
            .transpose()
    }

    fn address<A: std::str::FromStr>(
        &self,
        key: &str,
        what: &str,
    ) -> Result<Option<A>, ConfigError> {
        self.some_text(key)?
            .map(|s| {
                s.parse::<A>()
                    .map_err(|_| self.refuse(key, s, format!("must be an {what} address")))
            })
            .transpose()
    }
}

/// The rules one family's check follows (flannel's, per family).
struct Limits {
    bits: u8,
    max_subnet_len: u8,
    max_network_prefix: u8,
    large_network_prefix: u8,
    large_network_subnet_len: u8,
}

const V4: Limits = Limits {
    bits: 32,
    max_subnet_len: 30,
    max_network_prefix: 28,
    large_network_prefix: 22,
    large_network_subnet_len: 24,
};

const V6: Limits = Limits {
    bits: 128,
    max_subnet_len: 126,
    max_network_prefix: 124,
    large_network_prefix: 62,
    large_network_subnet_len: 64,
};

struct Keys {
    network: &'static str,
    subnet_len: &'static str,
    subnet_min: &'static str,
    subnet_max: &'static str,
}

/// Applies the defaults and checks to one family, on addresses as integers.
fn check_family(
    keys: &Keys,
    limits: &Limits,
    network: (u128, u8),
    subnet_len: Option<u8>,
    min: Option<u128>,
    max: Option<u128>,
    show: &dyn Fn(u128) -> String,
) -> Result<(u8, u128, u128), ConfigError> {
    let (net, prefix) = network;
    let net_text = format!("{}/{prefix}", show(net));
    let subnet_len = match subnet_len {
        Some(len) => {
            if len > limits.max_subnet_len {
                return Err(refuse(
                    keys.subnet_len,
                    len,
                    format!("must be at most {}", limits.max_subnet_len),
                ));
            }
            if u16::from(len) < u16::from(prefix) + 2 {
                return Err(refuse(
                    keys.subnet_len,
                    len,
                    format!(
                        "{} {net_text} must hold at least four subnets",
                        keys.network
                    ),
                ));
            }
            len
        }
        None if prefix > limits.max_network_prefix => {
            return Err(refuse(
                keys.network,
                net_text,
                format!(
                    "is too small: the smallest useful network is a /{}",
                    limits.max_network_prefix
                ),
            ))
        }
        None if prefix <= limits.large_network_prefix => limits.large_network_subnet_len,
        None => prefix + 2,
    };
    let size: u128 = 1u128 << (limits.bits - subnet_len);
    let host_bits = u32::from(limits.bits - prefix);
    let last = if host_bits >= 128 {
        u128::MAX
    } else {
        net | ((1u128 << host_bits) - 1)
    };
    let contains = |a: u128| a >= net && a <= last;
    let on_boundary = |a: u128| a.is_multiple_of(size);
    let check = |key: &str, a: u128| -> Result<u128, ConfigError> {
        if !contains(a) {
            return Err(refuse(
                key,
                show(a),
                format!("is outside {} {net_text}", keys.network),
            ));
        }
        if !on_boundary(a) {
            return Err(refuse(
                key,
                show(a),
                format!("is not on a /{subnet_len} subnet boundary"),
            ));
        }
        Ok(a)
    };
    let min = match min {
        Some(a) => check(keys.subnet_min, a)?,
        None => net + size,
    };
    let max = match max {
        Some(a) => check(keys.subnet_max, a)?,
        None => last - (size - 1),
    };
    if min > max {
        return Err(refuse(
            keys.subnet_min,
            show(min),
            format!(
                "is above {} {}: no subnet can be handed out",
                keys.subnet_max,
                show(max)
            ),
        ));
    }
    Ok((subnet_len, min, max))
}

/// What parsing one family's keys needs of its network type.
trait FamilyNet: std::str::FromStr + Copy + fmt::Display {
    type Addr: std::str::FromStr + Copy + fmt::Display;
    /// `IPv4`, `IPv6`.
    const NAME: &'static str;
    /// The key that turns the family on.
    const ENABLE: &'static str;
    const KEYS: Keys;
    const LIMITS: Limits;

    fn make(addr: Self::Addr, prefix: u8) -> Result<Self, ipnetwork::IpNetworkError>;
    fn addr(&self) -> Self::Addr;
    fn prefix_len(&self) -> u8;
    fn to_int(a: Self::Addr) -> u128;
    fn from_int(a: u128) -> Self::Addr;
}

impl FamilyNet for Ipv4Network {
    type Addr = Ipv4Addr;
    const NAME: &'static str = "IPv4";
    const ENABLE: &'static str = "EnableIPv4";
    const KEYS: Keys = Keys {
        network: "Network",
        subnet_len: "SubnetLen",
        subnet_min: "SubnetMin",
        subnet_max: "SubnetMax",
    };
    const LIMITS: Limits = V4;

    fn make(addr: Ipv4Addr, prefix: u8) -> Result<Self, ipnetwork::IpNetworkError> {
        Ipv4Network::new(addr, prefix)
    }
    fn addr(&self) -> Ipv4Addr {
        self.network()
    }
    fn prefix_len(&self) -> u8 {
        self.prefix()
    }
    fn to_int(a: Ipv4Addr) -> u128 {
        u128::from(u32::from(a))
    }
    fn from_int(a: u128) -> Ipv4Addr {
        Ipv4Addr::from(a as u32)
    }
}

impl FamilyNet for Ipv6Network {
    type Addr = Ipv6Addr;
    const NAME: &'static str = "IPv6";
    const ENABLE: &'static str = "EnableIPv6";
    const KEYS: Keys = Keys {
        network: "IPv6Network",
        subnet_len: "IPv6SubnetLen",
        subnet_min: "IPv6SubnetMin",
        subnet_max: "IPv6SubnetMax",
    };
    const LIMITS: Limits = V6;

    fn make(addr: Ipv6Addr, prefix: u8) -> Result<Self, ipnetwork::IpNetworkError> {
        Ipv6Network::new(addr, prefix)
    }
    fn addr(&self) -> Ipv6Addr {
        self.network()
    }
    fn prefix_len(&self) -> u8 {
        self.prefix()
    }
    fn to_int(a: Ipv6Addr) -> u128 {
        u128::from(a)
    }
    fn from_int(a: u128) -> Ipv6Addr {
        Ipv6Addr::from(a)
    }
}

/// One family's keys, defaults applied and checked.
fn parse_family<N: FamilyNet>(obj: &Fields<'_>) -> Result<Family<N>, ConfigError> {
    let k = &N::KEYS;
    let network: N = obj.network(k.network, N::NAME)?.ok_or_else(|| {
        refuse(
            k.network,
            "(missing)",
            format!("is required when {} is on", N::ENABLE),
        )
    })?;
    let network = N::make(network.addr(), network.prefix_len())
        .map_err(|e| refuse(k.network, network, e.to_string()))?;
    let min: Option<N::Addr> = obj.address(k.subnet_min, N::NAME)?;
    let max: Option<N::Addr> = obj.address(k.subnet_max, N::NAME)?;
    let (len, min, max) = check_family(
        k,
        &N::LIMITS,
        (N::to_int(network.addr()), network.prefix_len()),
        obj.prefix_len(k.subnet_len)?,
        min.map(N::to_int),
        max.map(N::to_int),
        &|a| N::from_int(a).to_string(),
    )?;
    let subnet = |a: u128| {
        N::make(N::from_int(a), len).map_err(|e| refuse(k.subnet_len, len, e.to_string()))
    };
    Ok(Family {
        network,
        subnet_len: len,
        subnet_min: subnet(min)?,
        subnet_max: subnet(max)?,
    })
}

/// Parses and checks the config text, applying flannel's defaults.
pub fn parse(text: &str) -> Result<NetConfig, ConfigError> {
    let value: Value = serde_json::from_str(text).map_err(|e| ConfigError {
        key: "(document)".into(),
        value: String::new(),
        reason: format!("is not valid JSON: {e}"),
    })?;
    let Value::Object(map) = value else {
        return Err(refuse("(document)", "", "must be a JSON object"));
    };
    let obj = Fields::of(Some(&map), "");
    let enable_ipv4 = obj.bool("EnableIPv4")?.unwrap_or(true);
    let enable_ipv6 = obj.bool("EnableIPv6")?.unwrap_or(false);
    let enable_nftables = obj.bool("EnableNFTables")?.unwrap_or(false);
    if !enable_ipv4 && !enable_ipv6 {
        return Err(refuse(
            "EnableIPv4",
            false,
            "and EnableIPv6 is not true: at least one family must be on",
        ));
    }

    let ipv4 = enable_ipv4
        .then(|| parse_family::<Ipv4Network>(&obj))
        .transpose()?;
    let ipv6 = enable_ipv6
        .then(|| parse_family::<Ipv6Network>(&obj))
        .transpose()?;

    let backend = match obj.get("Backend") {
        None => Value::Object(Map::new()),
        Some(v @ Value::Object(_)) => v.clone(),
        Some(v) => return Err(refuse("Backend", v, "must be an object")),
    };
    let backend_type = Fields::of(backend.as_object(), "Backend.")
        .some_text("Type")?
        .map_or(DEFAULT_BACKEND.to_string(), str::to_ascii_lowercase);

    Ok(NetConfig {
        ipv4,
        ipv6,
        enable_nftables,
        backend_type,
        backend,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(text: &str) -> Family<Ipv4Network> {
        parse(text).unwrap().ipv4.unwrap()
    }

    fn err(text: &str) -> ConfigError {
        parse(text).unwrap_err()
    }

    #[test]
    fn fields_match_keys_in_any_case_and_refusals_name_the_key_as_the_config_has_it() {
        let c = parse(
            r#"{"Network":"10.5.0.0/16","Backend":{"Type":"vxlan","vni":7,"Flag":"yes","Name":"","Gone":null}}"#,
        )
        .unwrap();
        let b = Fields::backend(&c);
        assert_eq!(b.number("VNI", 0..=10, "unused").unwrap(), Some(7));
        let e = b.number("VNI", 0..=5, "must be at most 5").unwrap_err();
        assert_eq!(
            (e.key.as_str(), e.value.as_str(), e.reason.as_str()),
            ("Backend.VNI", "7", "must be at most 5")
        );
        assert_eq!(b.bool("Flag").unwrap_err().key, "Backend.Flag");
        assert_eq!(b.text("Name").unwrap(), Some(""));
        assert_eq!((b.get("Gone"), b.get("Missing")), (None, None));
        assert_eq!(
            err(r#"{"Network":"10.5.0.0/16","SubnetLen":"x"}"#).key,
            "SubnetLen"
        );
    }

    #[test]
    fn subnet_len_defaults_follow_the_network_size() {
        assert_eq!(v4(r#"{"Network":"10.5.0.0/16"}"#).subnet_len, 24);
        assert_eq!(v4(r#"{"Network":"10.5.0.0/22"}"#).subnet_len, 24);
        assert_eq!(v4(r#"{"Network":"10.5.0.0/23"}"#).subnet_len, 25);
        assert_eq!(v4(r#"{"Network":"10.5.0.0/28"}"#).subnet_len, 30);
        let e = err(r#"{"Network":"10.5.0.0/29"}"#);
        assert_eq!(
            (e.key.as_str(), e.value.as_str()),
            ("Network", "10.5.0.0/29")
        );
    }

    #[test]
    fn subnet_min_and_max_default_to_the_second_and_the_last_subnet() {
        let f = v4(r#"{"Network":"10.5.0.0/16"}"#);
        assert_eq!(f.network.to_string(), "10.5.0.0/16");
        assert_eq!(f.subnet_min.to_string(), "10.5.1.0/24");
        assert_eq!(f.subnet_max.to_string(), "10.5.255.0/24");
        let f = v4(r#"{"Network":"10.5.0.0/16","SubnetLen":20}"#);
        assert_eq!(f.subnet_min.to_string(), "10.5.16.0/20");
        assert_eq!(f.subnet_max.to_string(), "10.5.240.0/20");
    }

    #[test]
    fn the_network_is_masked_as_go_parses_it() {
        assert_eq!(
            v4(r#"{"Network":"10.5.7.9/16"}"#).network.to_string(),
            "10.5.0.0/16"
        );
    }

    #[test]
    fn explicit_min_and_max_are_kept() {
        let f = v4(r#"{"Network":"10.5.0.0/16","SubnetMin":"10.5.10.0","SubnetMax":"10.5.20.0"}"#);
        assert_eq!(f.subnet_min.to_string(), "10.5.10.0/24");
        assert_eq!(f.subnet_max.to_string(), "10.5.20.0/24");
    }

    #[test]
    fn every_refusal_names_the_key_and_the_value() {
        let cases = [
            (r#"{}"#, "Network", "(missing)"),
            (r#"{"Network":"10.5.0.0"}"#, "Network", "10.5.0.0"),
            (r#"{"Network":"banana/16"}"#, "Network", "banana/16"),
            (
                r#"{"Network":"10.5.0.0/16","SubnetLen":31}"#,
                "SubnetLen",
                "31",
            ),
            (
                r#"{"Network":"10.5.0.0/16","SubnetLen":17}"#,
                "SubnetLen",
                "17",
            ),
            (
                r#"{"Network":"10.5.0.0/16","SubnetLen":"24"}"#,
                "SubnetLen",
                "\"24\"",
            ),
            (
                r#"{"Network":"10.5.0.0/16","SubnetMin":"10.6.0.0"}"#,
                "SubnetMin",
                "10.6.0.0",
            ),
            (
                r#"{"Network":"10.5.0.0/16","SubnetMax":"10.5.3.7"}"#,
                "SubnetMax",
                "10.5.3.7",
            ),
            (
                r#"{"Network":"10.5.0.0/16","SubnetMin":"10.5.9.0","SubnetMax":"10.5.3.0"}"#,
                "SubnetMin",
                "10.5.9.0",
            ),
            (
                r#"{"Network":"10.5.0.0/16","EnableIPv4":"yes"}"#,
                "EnableIPv4",
                "\"yes\"",
            ),
            (r#"{"EnableIPv4":false}"#, "EnableIPv4", "false"),
            (
                r#"{"EnableIPv6":true,"EnableIPv4":false}"#,
                "IPv6Network",
                "(missing)",
            ),
            (
                r#"{"EnableIPv6":true,"EnableIPv4":false,"IPv6Network":"fc00::/125"}"#,
                "IPv6Network",
                "fc00::/125",
            ),
            (
                r#"{"EnableIPv6":true,"EnableIPv4":false,"IPv6Network":"fc00::/48","IPv6SubnetLen":127}"#,
                "IPv6SubnetLen",
                "127",
            ),
            (
                r#"{"Network":"10.5.0.0/16","Backend":"vxlan"}"#,
                "Backend",
                "\"vxlan\"",
            ),
            (r#"[1]"#, "(document)", ""),
        ];
        for (text, key, value) in cases {
            let e = err(text);
            assert_eq!(
                (e.key.as_str(), e.value.as_str()),
                (key, value),
                "{text}: {e}"
            );
            assert!(e.to_string().contains(key), "{e}");
        }
        assert!(err("{").to_string().contains("not valid JSON"));
    }

    #[test]
    fn ipv6_defaults_follow_flannel() {
        let c =
            parse(r#"{"EnableIPv6":true,"EnableIPv4":false,"IPv6Network":"fc00::/48"}"#).unwrap();
        assert!(c.ipv4.is_none());
        let f = c.ipv6.unwrap();
        assert_eq!(f.subnet_len, 64);
        assert_eq!(f.subnet_min.to_string(), "fc00:0:0:1::/64");
        assert_eq!(f.subnet_max.to_string(), "fc00:0:0:ffff::/64");
        let f = parse(r#"{"EnableIPv6":true,"EnableIPv4":false,"IPv6Network":"fc00::/120"}"#)
            .unwrap()
            .ipv6
            .unwrap();
        assert_eq!(f.subnet_len, 122);
        let f = parse(r#"{"EnableIPv6":true,"EnableIPv4":false,"IPv6Network":"fc00::/124"}"#)
            .unwrap()
            .ipv6
            .unwrap();
        assert_eq!(f.subnet_len, 126);
    }

    #[test]
    fn dual_stack_keeps_both_families() {
        let c = parse(
            r#"{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fc00::/48","IPv6SubnetLen":64}"#,
        )
        .unwrap();
        assert!(c.ipv4.is_some() && c.ipv6.is_some());
    }

    #[test]
    fn keys_match_as_go_decodes_them() {
        let c = parse(
            r#"{"network":"10.5.0.0/16","SUBNETLEN":26,"backend":{"type":"Host-GW","vni":4}}"#,
        )
        .unwrap();
        assert_eq!(c.ipv4.unwrap().subnet_len, 26);
        assert_eq!(c.backend_type, "host-gw");
        assert_eq!(
            field(c.backend.as_object().unwrap(), "VNI"),
            Some(&Value::from(4))
        );
        // An exact match wins over a case-insensitive one.
        let c = parse(r#"{"network":"10.6.0.0/16","Network":"10.5.0.0/16"}"#).unwrap();
        assert_eq!(c.ipv4.unwrap().network.to_string(), "10.5.0.0/16");
    }

    #[test]
    fn a_missing_backend_means_udp_as_in_go() {
        let c = parse(r#"{"Network":"10.5.0.0/16"}"#).unwrap();
        assert_eq!(c.backend_type, "udp");
        assert!(!c.enable_nftables);
        let c = parse(r#"{"Network":"10.5.0.0/16","Backend":{"Port":9000},"EnableNFTables":true}"#)
            .unwrap();
        assert_eq!(c.backend_type, "udp");
        assert!(c.enable_nftables);
        let c = parse(r#"{"Network":"10.5.0.0/16","Backend":{"Type":""}}"#).unwrap();
        assert_eq!(c.backend_type, "udp");
    }
}
