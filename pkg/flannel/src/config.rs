//! The flannel plugin's own config, with the Go plugin's field names and defaults.

use cni_protocol::{decode, decode_lenient, gokeys, CniError};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::path::PathBuf;
use std::time::Duration;

pub const DEFAULT_SUBNET_FILE: &str = subnetenv::DEFAULT_PATH;
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/flannel";
/// How long ADD waits for a subnet.env the fabric daemon has not written yet.
pub const DEFAULT_SUBNET_FILE_WAIT: Duration = Duration::from_secs(5);
/// A runtime gives up on a plugin long before this; a larger wait is a mistake in the config.
pub const MAX_SUBNET_FILE_WAIT: Duration = Duration::from_secs(600);

/// The `delegate` keys flannel sets or reads; a case variant of one names it, as the
/// delegate's Go-style decoder would read it.
const DELEGATE_FIELDS: &[&str] = &[
    "name",
    "type",
    "ipMasq",
    "mtu",
    "isGateway",
    "cniVersion",
    "ipam",
    "runtimeConfig",
];
/// The `ipam` keys flannel sets or reads.
const IPAM_FIELDS: &[&str] = &["type", "ranges", "routes"];

#[derive(Debug, Clone, PartialEq)]
pub struct NetConf {
    /// The network's name: the delegate's name.
    pub name: String,
    /// `cniVersion` as given, copied into the delegate.
    pub cni_version: Option<String>,
    /// `subnetFile`.
    pub subnet_file: PathBuf,
    /// `dataDir`: where each container's delegate config is kept for DEL.
    pub data_dir: PathBuf,
    /// `subnetFileWait` (seconds): how long ADD waits for a missing subnet.env.
    pub subnet_file_wait: Duration,
    /// `delegate`: the start of the delegate's config.
    pub delegate: Map<String, Value>,
    /// `ipam`: the start of the delegate's `ipam`.
    pub ipam: Option<Map<String, Value>>,
    /// `runtimeConfig`, passed on to the delegate.
    pub runtime_config: Option<Map<String, Value>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Raw {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    cni_version: Option<String>,
    #[serde(default)]
    subnet_file: Option<String>,
    #[serde(default)]
    data_dir: Option<String>,
    #[serde(default)]
    subnet_file_wait: Option<f64>,
    #[serde(default)]
    delegate: Option<Map<String, Value>>,
    #[serde(default)]
    ipam: Option<Map<String, Value>>,
    #[serde(default)]
    runtime_config: Option<Map<String, Value>>,
}

impl NetConf {
    /// Decodes the config (wrong types are code 6 naming the field) and applies the defaults.
    pub fn parse(config: &Value) -> Result<NetConf, CniError> {
        let raw: Raw = decode(config)?;
        let wait = Self::check_wait(raw.subnet_file_wait)?;
        Ok(Self::from_raw(raw, wait))
    }

    /// DEL's reading: a field that does not decode or is invalid takes its default, and why is
    /// returned to be reported, so that a config broken after ADD cannot keep the delegate's
    /// state (its address, its rules, the saved config) on the node.
    pub fn parse_for_del(config: &Value) -> (NetConf, Vec<CniError>) {
        let (raw, dropped): (Raw, _) = decode_lenient(config);
        let mut ignored: Vec<CniError> = dropped.into_iter().map(|(_, e)| e).collect();
        let wait = Self::check_wait(raw.subnet_file_wait).unwrap_or_else(|e| {
            ignored.push(e);
            DEFAULT_SUBNET_FILE_WAIT
        });
        (Self::from_raw(raw, wait), ignored)
    }

    fn check_wait(wait: Option<f64>) -> Result<Duration, CniError> {
        match wait {
            None => Ok(DEFAULT_SUBNET_FILE_WAIT),
            Some(s) => Duration::try_from_secs_f64(s)
                .ok()
                .filter(|d| *d <= MAX_SUBNET_FILE_WAIT)
                .ok_or_else(|| {
                    CniError::invalid_config(format!(
                        "field \"subnetFileWait\": {s} is not a number of seconds from 0 to {}",
                        MAX_SUBNET_FILE_WAIT.as_secs()
                    ))
                }),
        }
    }

    fn from_raw(raw: Raw, subnet_file_wait: Duration) -> NetConf {
        let path_or = |v: Option<String>, default: &str| {
            PathBuf::from(v.filter(|s| !s.is_empty()).as_deref().unwrap_or(default))
        };
        NetConf {
            name: raw.name.unwrap_or_default(),
            cni_version: raw.cni_version.filter(|v| !v.is_empty()),
            subnet_file: path_or(raw.subnet_file, DEFAULT_SUBNET_FILE),
            data_dir: path_or(raw.data_dir, DEFAULT_DATA_DIR),
            subnet_file_wait,
            delegate: raw
                .delegate
                .map(|mut d| {
                    gokeys::canonicalise(&mut d, DELEGATE_FIELDS);
                    d
                })
                .unwrap_or_default(),
            ipam: raw.ipam.map(|mut i| {
                gokeys::canonicalise(&mut i, IPAM_FIELDS);
                i
            }),
            runtime_config: raw.runtime_config,
        }
    }

    /// The `delegate` fields flannel owns or needs typed: error 7 naming the field and value.
    pub fn check_delegate(&self) -> Result<(), CniError> {
        if let Some(name) = self.delegate.get("name") {
            return Err(CniError::invalid_config(format!(
                "field \"delegate.name\" ({name}) must not be set: flannel names the delegate after the network"
            )));
        }
        if let Some(ipam) = self.delegate.get("ipam") {
            return Err(CniError::invalid_config(format!(
                "field \"delegate.ipam\" ({ipam}) must not be set: flannel builds it from subnet.env; put IPAM settings in the top-level \"ipam\""
            )));
        }
        match self.delegate.get("type") {
            None | Some(Value::String(_)) => Ok(()),
            Some(other) => Err(CniError::invalid_config(format!(
                "field \"delegate.type\" must be a string naming the delegate plugin, got {other}"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_are_the_go_plugins() {
        let c = NetConf::parse(&json!({"name": "cbr0", "type": "flannel"})).unwrap();
        assert_eq!(
            c,
            NetConf {
                name: "cbr0".into(),
                cni_version: None,
                subnet_file: PathBuf::from("/run/flannel/subnet.env"),
                data_dir: PathBuf::from("/var/lib/cni/flannel"),
                subnet_file_wait: Duration::from_secs(5),
                delegate: Map::new(),
                ipam: None,
                runtime_config: None,
            }
        );
    }

    #[test]
    fn every_field_is_read() {
        let c = NetConf::parse(&json!({
            "name": "n", "cniVersion": "1.1.0", "type": "flannel",
            "subnetFile": "/x/subnet.env", "dataDir": "/x/data", "subnetFileWait": 0.25,
            "delegate": {"type": "ipvlan"}, "ipam": {"dataDir": "/x/ipam"},
            "runtimeConfig": {"portMappings": []}
        }))
        .unwrap();
        assert_eq!(c.cni_version.as_deref(), Some("1.1.0"));
        assert_eq!(c.subnet_file, PathBuf::from("/x/subnet.env"));
        assert_eq!(c.data_dir, PathBuf::from("/x/data"));
        assert_eq!(c.subnet_file_wait, Duration::from_millis(250));
        assert_eq!(c.delegate["type"], "ipvlan");
        assert_eq!(c.ipam.unwrap()["dataDir"], "/x/ipam");
        assert_eq!(c.runtime_config.unwrap()["portMappings"], json!([]));
    }

    #[test]
    fn null_and_empty_take_the_defaults() {
        let c = NetConf::parse(&json!({
            "name": "n", "subnetFile": "", "dataDir": null, "delegate": null,
            "ipam": null, "runtimeConfig": null, "subnetFileWait": null, "cniVersion": ""
        }))
        .unwrap();
        assert_eq!(c.subnet_file, PathBuf::from(DEFAULT_SUBNET_FILE));
        assert_eq!(c.data_dir, PathBuf::from(DEFAULT_DATA_DIR));
        assert_eq!(c.cni_version, None);
        assert!(c.delegate.is_empty() && c.ipam.is_none() && c.runtime_config.is_none());
    }

    #[test]
    fn wrong_types_are_code_6_naming_the_field() {
        for (field, value) in [
            ("delegate", json!("bridge")),
            ("ipam", json!([])),
            ("subnetFile", json!(5)),
            ("dataDir", json!(true)),
            ("runtimeConfig", json!("x")),
            ("subnetFileWait", json!("5s")),
        ] {
            let mut conf = json!({"name": "n"});
            conf[field] = value;
            let e = NetConf::parse(&conf).unwrap_err();
            assert_eq!(e.code, 6, "{field}: {e}");
            assert!(e.msg.contains(field), "{field}: {e}");
        }
    }

    #[test]
    fn a_negative_or_huge_wait_is_code_7_naming_it() {
        for (wait, shown) in [
            (json!(-1), "-1"),
            (json!(1e18), "1000000000000000000"),
            (json!(601), "601"),
        ] {
            let e = NetConf::parse(&json!({"name": "n", "subnetFileWait": wait})).unwrap_err();
            assert_eq!(e.code, 7);
            assert!(
                e.msg.contains("subnetFileWait") && e.msg.contains(shown),
                "{e}"
            );
        }
        let c = NetConf::parse(&json!({"name": "n", "subnetFileWait": 600})).unwrap();
        assert_eq!(c.subnet_file_wait, MAX_SUBNET_FILE_WAIT);
    }

    #[test]
    fn delegate_name_ipam_or_non_string_type_is_code_7_naming_it() {
        for (delegate, field, value) in [
            (json!({"name": "mine"}), "delegate.name", "\"mine\""),
            (
                json!({"ipam": {"type": "dhcp"}}),
                "delegate.ipam",
                "\"dhcp\"",
            ),
            (json!({"type": 5}), "delegate.type", "5"),
            (json!({"type": null}), "delegate.type", "null"),
        ] {
            let c = NetConf::parse(&json!({"name": "n", "delegate": delegate})).unwrap();
            let e = c.check_delegate().unwrap_err();
            assert_eq!(e.code, 7, "{e}");
            assert!(e.msg.contains(field) && e.msg.contains(value), "{e}");
        }
        let ok = NetConf::parse(&json!({"name": "n", "delegate": {"type": "macvlan"}})).unwrap();
        assert!(ok.check_delegate().is_ok());
    }
}
