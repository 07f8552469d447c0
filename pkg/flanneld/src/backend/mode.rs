//! The backend the network config asks for, with its own keys (`Backend` in flannel's config).

use crate::config::{field, ConfigError, NetConfig};
use serde_json::Value;

/// vxlan's keys and their defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VxlanParams {
    pub vni: u32,
    pub port: u16,
    /// The underlay MTU to derive the device's from; None: the external interface's.
    pub mtu: Option<u32>,
    pub gbp: bool,
    pub learning: bool,
    pub direct_routing: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    Vxlan(VxlanParams),
    HostGw,
    /// flannel's `alloc`: subnets only, nothing programmed.
    Alloc,
}

fn refuse(key: &str, v: &Value, reason: &str) -> ConfigError {
    ConfigError {
        key: format!("Backend.{key}"),
        value: v.to_string(),
        reason: reason.to_string(),
    }
}

fn uint(
    b: &serde_json::Map<String, Value>,
    key: &str,
    max: u64,
) -> Result<Option<u64>, ConfigError> {
    match field(b, key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n <= max => Ok(Some(n)),
            _ => Err(refuse(
                key,
                v,
                &format!("must be a whole number up to {max}"),
            )),
        },
    }
}

fn flag(b: &serde_json::Map<String, Value>, key: &str) -> Result<bool, ConfigError> {
    match field(b, key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(x)) => Ok(*x),
        Some(v) => Err(refuse(key, v, "must be true or false")),
    }
}

/// The backend of the config, its keys checked; each refusal names the key.
pub fn mode(cfg: &NetConfig) -> Result<Mode, ConfigError> {
    let empty = serde_json::Map::new();
    let b = cfg.backend.as_object().unwrap_or(&empty);
    match cfg.backend_type.as_str() {
        "vxlan" => {
            let vni = uint(b, "VNI", (1 << 24) - 1)?.unwrap_or(1) as u32;
            let port = uint(b, "Port", 65535)?.filter(|p| *p != 0).unwrap_or(8472) as u16;
            let mtu = uint(b, "MTU", 65535)?.map(|m| m as u32);
            if let Some(m) = mtu.filter(|m| *m < 1280) {
                return Err(refuse("MTU", &Value::from(m), "must be at least 1280"));
            }
            Ok(Mode::Vxlan(VxlanParams {
                vni,
                port,
                mtu,
                gbp: flag(b, "GBP")?,
                learning: flag(b, "Learning")?,
                direct_routing: flag(b, "DirectRouting")?,
            }))
        }
        "host-gw" => Ok(Mode::HostGw),
        "alloc" => Ok(Mode::Alloc),
        other => Err(ConfigError {
            key: "Backend.Type".into(),
            value: other.into(),
            reason: "is not supported: use vxlan, host-gw or alloc".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config;

    fn m(text: &str) -> Result<Mode, ConfigError> {
        mode(&config::parse(text).unwrap())
    }

    #[test]
    fn vxlan_defaults_and_keys() {
        assert_eq!(
            m(r#"{"Network":"10.5.0.0/16"}"#).unwrap(),
            Mode::Vxlan(VxlanParams {
                vni: 1,
                port: 8472,
                mtu: None,
                gbp: false,
                learning: false,
                direct_routing: false
            })
        );
        let got = m(r#"{"Network":"10.5.0.0/16","Backend":{"Type":"vxlan","vni":7,"Port":4789,"MTU":9000,"DirectRouting":true}}"#).unwrap();
        let Mode::Vxlan(p) = got else {
            panic!("{got:?}")
        };
        assert_eq!(
            (p.vni, p.port, p.mtu, p.direct_routing),
            (7, 4789, Some(9000), true)
        );
    }

    #[test]
    fn other_types_and_refusals() {
        assert_eq!(
            m(r#"{"Network":"10.5.0.0/16","Backend":{"Type":"host-gw"}}"#).unwrap(),
            Mode::HostGw
        );
        assert_eq!(
            m(r#"{"Network":"10.5.0.0/16","Backend":{"Type":"alloc"}}"#).unwrap(),
            Mode::Alloc
        );
        let e = m(r#"{"Network":"10.5.0.0/16","Backend":{"Type":"udp"}}"#).unwrap_err();
        assert_eq!((e.key.as_str(), e.value.as_str()), ("Backend.Type", "udp"));
        let e = m(r#"{"Network":"10.5.0.0/16","Backend":{"VNI":"one"}}"#).unwrap_err();
        assert_eq!(e.key, "Backend.VNI");
        let e = m(r#"{"Network":"10.5.0.0/16","Backend":{"VNI":16777216}}"#).unwrap_err();
        assert_eq!(e.value, "16777216");
        let e = m(r#"{"Network":"10.5.0.0/16","Backend":{"DirectRouting":"yes"}}"#).unwrap_err();
        assert_eq!(e.key, "Backend.DirectRouting");
    }
}
