//! The bridge config: every field of the Go plugin, its defaults, and the checks ADD makes.

use cni_kernel::firewall::Backend;
use cni_protocol::{decode, decode_lenient, gokeys, CniError, Dns};
use serde::Deserialize;
use serde_json::Value;

/// The bridge a network uses when the config names none.
pub const DEFAULT_BRIDGE: &str = "cni0";
/// The highest VLAN ID a port can carry (4095 is reserved).
pub const MAX_VLAN: u16 = 4094;

/// The config as ADD, DEL and CHECK use it, defaults applied.
#[derive(Debug, Clone)]
pub struct NetConf {
    /// The network name, part of the masquerade chain's hash.
    pub name: String,
    pub bridge: String,
    /// True also when only `isDefaultGateway` is set.
    pub is_gateway: bool,
    pub is_default_gateway: bool,
    pub force_address: bool,
    pub ip_masq: bool,
    /// None: chosen by what the node has (see [`Backend::choose`]).
    pub masq_backend: Option<Backend>,
    pub mtu: Option<u32>,
    pub hairpin: bool,
    pub promisc: bool,
    /// 0 for none.
    pub vlan: u16,
    /// Tagged VLANs of a trunk port, sorted, without duplicates.
    pub vlan_trunk: Vec<u16>,
    /// Whether `vlanTrunk` was given at all (an empty list still turns on VLAN filtering).
    pub has_vlan_trunk: bool,
    pub preserve_default_vlan: bool,
    pub mac_spoof_check: bool,
    pub enable_dad: bool,
    pub disable_container_interface: bool,
    pub port_isolation: bool,
    /// The container interface's MAC: runtimeConfig.mac, else args.cni.mac, else CNI_ARGS MAC.
    pub mac: Option<[u8; 6]>,
    /// `ipam.type`; None for a layer-2 only network.
    pub ipam_type: Option<String>,
    /// The config's own `dns`, which replaces IPAM's when it says anything.
    pub dns: Option<Dns>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Raw {
    bridge: Option<String>,
    is_gateway: Option<bool>,
    is_default_gateway: Option<bool>,
    force_address: Option<bool>,
    ip_masq: Option<bool>,
    ip_masq_backend: Option<String>,
    mtu: Option<i64>,
    hairpin_mode: Option<bool>,
    promisc_mode: Option<bool>,
    vlan: Option<i64>,
    vlan_trunk: Option<Vec<Option<RawTrunk>>>,
    preserve_default_vlan: Option<bool>,
    #[serde(rename = "macspoofchk")]
    mac_spoof_chk: Option<bool>,
    #[serde(rename = "enabledad")]
    enable_dad: Option<bool>,
    disable_container_interface: Option<bool>,
    port_isolation: Option<bool>,
    args: Option<RawArgs>,
    runtime_config: Option<RawMac>,
    ipam: Option<RawIpam>,
    dns: Option<RawDns>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RawTrunk {
    #[serde(rename = "minID")]
    min_id: Option<i64>,
    #[serde(rename = "maxID")]
    max_id: Option<i64>,
    id: Option<i64>,
}

#[derive(Deserialize, Default)]
struct RawArgs {
    cni: Option<RawMac>,
}

#[derive(Deserialize, Default)]
struct RawMac {
    mac: Option<String>,
}

#[derive(Deserialize, Default)]
struct RawIpam {
    #[serde(rename = "type")]
    kind: Option<String>,
}

#[derive(Deserialize, Default)]
struct RawDns {
    nameservers: Option<Vec<std::net::IpAddr>>,
    domain: Option<String>,
    search: Option<Vec<String>>,
    options: Option<Vec<String>>,
}

impl RawDns {
    /// The Go plugin's test: any list present (even empty) or a domain.
    fn into_dns(self) -> Option<Dns> {
        let set = self.nameservers.is_some()
            || self.search.is_some()
            || self.options.is_some()
            || self.domain.as_deref().is_some_and(|d| !d.is_empty());
        set.then(|| Dns {
            nameservers: self.nameservers.unwrap_or_default(),
            domain: self.domain.filter(|d| !d.is_empty()),
            search: self.search.unwrap_or_default(),
            options: self.options.unwrap_or_default(),
        })
    }
}

fn invalid(field: &str, value: impl std::fmt::Display, why: &str) -> CniError {
    CniError::invalid_config(format!("invalid {field} {value} (field {field:?}): {why}"))
}

/// Parses `aa:bb:cc:dd:ee:ff` (or with `-`), naming where it came from when it is not one.
pub fn parse_mac(s: &str, field: &str) -> Result<[u8; 6], CniError> {
    let parts: Vec<&str> = s.split([':', '-']).collect();
    let bad = || {
        invalid(
            field,
            format!("{s:?}"),
            "not a MAC address like 0a:58:0a:f4:00:02",
        )
    };
    if parts.len() != 6 {
        return Err(bad());
    }
    let mut mac = [0u8; 6];
    for (byte, part) in mac.iter_mut().zip(&parts) {
        if part.len() != 2 {
            return Err(bad());
        }
        *byte = u8::from_str_radix(part, 16).map_err(|_| bad())?;
    }
    if mac[0] & 1 == 1 {
        return Err(invalid(
            field,
            format!("{s:?}"),
            "a multicast address cannot name an interface",
        ));
    }
    Ok(mac)
}

/// `aa:bb:cc:dd:ee:ff`, lower case.
pub fn format_mac(mac: &[u8]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// An interface name the kernel accepts (`ifname::problem`), refused naming `field`.
pub fn validate_ifname_field(name: &str, field: &str) -> Result<(), CniError> {
    match ifname::problem(name) {
        Some(why) => Err(invalid(field, format!("{name:?}"), why)),
        None => Ok(()),
    }
}

fn vlan_id(v: i64, field: &str, min: i64) -> Result<u16, CniError> {
    if v < min || v > i64::from(MAX_VLAN) {
        return Err(invalid(
            field,
            v,
            &format!("must be between {min} and {MAX_VLAN}"),
        ));
    }
    Ok(v as u16)
}

/// The trunk's VLAN IDs: single `id`s and `minID`..=`maxID` ranges, sorted and deduplicated.
fn collect_trunk(items: &[Option<RawTrunk>]) -> Result<Vec<u16>, CniError> {
    let mut vids = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let Some(item) = item else { continue };
        let at = |k: &str| format!("vlanTrunk[{i}].{k}");
        match (item.min_id, item.max_id) {
            (Some(min), Some(max)) => {
                let min = vlan_id(min, &at("minID"), 1)?;
                let max = vlan_id(max, &at("maxID"), 1)?;
                if max < min {
                    return Err(invalid(
                        &at("maxID"),
                        max,
                        &format!("is smaller than minID {min}"),
                    ));
                }
                vids.extend(min..=max);
            }
            (None, Some(max)) => {
                return Err(invalid(
                    &at("maxID"),
                    max,
                    "minID and maxID must be given together: minID is missing",
                ))
            }
            (Some(min), None) => {
                return Err(invalid(
                    &at("minID"),
                    min,
                    "minID and maxID must be given together: maxID is missing",
                ))
            }
            (None, None) => {}
        }
        if let Some(id) = item.id {
            vids.push(vlan_id(id, &at("id"), 1)?);
        }
    }
    vids.sort_unstable();
    vids.dedup();
    Ok(vids)
}

/// A field's value as read, or its `default` when it is invalid and `reject` lets that pass.
fn or_default<T>(
    read: Result<T, CniError>,
    default: T,
    reject: &mut impl FnMut(CniError) -> Result<(), CniError>,
) -> Result<T, CniError> {
    read.or_else(|e| reject(e).map(|()| default))
}

/// `bridge`, a name the kernel accepts; cni0 when absent.
fn read_bridge(bridge: Option<String>) -> Result<String, CniError> {
    let bridge = bridge.unwrap_or_else(|| DEFAULT_BRIDGE.to_string());
    validate_ifname_field(&bridge, "bridge")?;
    Ok(bridge)
}

/// `mtu`: 0 or absent for the kernel's default.
fn read_mtu(mtu: Option<i64>) -> Result<Option<u32>, CniError> {
    match mtu.unwrap_or(0) {
        0 => Ok(None),
        m if (68..=65535).contains(&m) => Ok(Some(m as u32)),
        m => Err(invalid("mtu", m, "must be 0 (the default) or 68 to 65535")),
    }
}

/// `ipMasqBackend`: None leaves the choice to what the node has.
fn read_masq_backend(backend: Option<&str>) -> Result<Option<Backend>, CniError> {
    match backend {
        None => Ok(None),
        Some("iptables") => Ok(Some(Backend::Iptables)),
        Some("nftables") => Ok(Some(Backend::Nftables)),
        Some(other) => Err(invalid(
            "ipMasqBackend",
            format!("{other:?}"),
            "must be \"iptables\" or \"nftables\"",
        )),
    }
}

/// The container interface's MAC: the first non-empty of runtimeConfig.mac, args.cni.mac and
/// CNI_ARGS MAC, parsed naming where it came from.
fn read_mac(
    runtime_config: Option<RawMac>,
    args: Option<RawArgs>,
    cni_args: &[(String, String)],
) -> Result<Option<[u8; 6]>, CniError> {
    let mac = match (
        runtime_config.and_then(|r| r.mac).filter(|m| !m.is_empty()),
        args.and_then(|a| a.cni)
            .and_then(|c| c.mac)
            .filter(|m| !m.is_empty()),
        cni_args
            .iter()
            .rev()
            .find(|(k, _)| k == "MAC")
            .map(|(_, v)| v.clone())
            .filter(|m| !m.is_empty()),
    ) {
        (Some(m), _, _) => parse_mac(&m, "runtimeConfig.mac")?,
        (None, Some(m), _) => parse_mac(&m, "args.cni.mac")?,
        (None, None, Some(m)) => parse_mac(&m, "CNI_ARGS MAC")?,
        (None, None, None) => return Ok(None),
    };
    Ok(Some(mac))
}

impl NetConf {
    /// Reads the config; `cni_args` supplies `MAC=` when the config carries no MAC.
    /// Checks only what every verb needs; [`NetConf::check_for_add`] adds ADD's checks.
    pub fn parse(
        config: &Value,
        name: &str,
        cni_args: &[(String, String)],
    ) -> Result<NetConf, CniError> {
        Self::from_raw(decode(config)?, name, cni_args, Err)
    }

    /// DEL's reading: a field that does not decode or is invalid takes its default, and why is
    /// returned to be reported, so that a config broken after ADD cannot block the cleanup.
    /// An unreadable `ipMasq` or `macspoofchk` reads as true: rules are removed by name, and
    /// removing what is not there is harmless.
    pub fn parse_for_del(
        config: &Value,
        name: &str,
        cni_args: &[(String, String)],
    ) -> Result<(NetConf, Vec<CniError>), CniError> {
        let (mut raw, dropped): (Raw, _) = decode_lenient(config);
        if dropped.iter().any(|(k, _)| gokeys::fold_eq(k, "ipMasq")) {
            raw.ip_masq = Some(true);
        }
        if dropped
            .iter()
            .any(|(k, _)| gokeys::fold_eq(k, "macspoofchk"))
        {
            raw.mac_spoof_chk = Some(true);
        }
        let mut ignored: Vec<CniError> = dropped.into_iter().map(|(_, e)| e).collect();
        let conf = Self::from_raw(raw, name, cni_args, |e| {
            ignored.push(e);
            Ok(())
        })?;
        Ok((conf, ignored))
    }

    /// `reject` decides about each invalid field: its error fails the parse, Ok takes the
    /// field's default.
    fn from_raw(
        raw: Raw,
        name: &str,
        cni_args: &[(String, String)],
        mut reject: impl FnMut(CniError) -> Result<(), CniError>,
    ) -> Result<NetConf, CniError> {
        let bridge = or_default(read_bridge(raw.bridge), DEFAULT_BRIDGE.into(), &mut reject)?;
        let mtu = or_default(read_mtu(raw.mtu), None, &mut reject)?;
        let vlan = or_default(vlan_id(raw.vlan.unwrap_or(0), "vlan", 0), 0, &mut reject)?;
        let has_vlan_trunk = raw.vlan_trunk.is_some();
        let vlan_trunk = collect_trunk(raw.vlan_trunk.as_deref().unwrap_or(&[]));
        let vlan_trunk = or_default(vlan_trunk, Vec::new(), &mut reject)?;
        let masq_backend = read_masq_backend(raw.ip_masq_backend.as_deref());
        let masq_backend = or_default(masq_backend, None, &mut reject)?;
        let mac = read_mac(raw.runtime_config, raw.args, cni_args);
        let mac = or_default(mac, None, &mut reject)?;
        let is_default_gateway = raw.is_default_gateway.unwrap_or(false);
        Ok(NetConf {
            name: name.to_string(),
            bridge,
            is_gateway: raw.is_gateway.unwrap_or(false) || is_default_gateway,
            is_default_gateway,
            force_address: raw.force_address.unwrap_or(false),
            ip_masq: raw.ip_masq.unwrap_or(false),
            masq_backend,
            mtu,
            hairpin: raw.hairpin_mode.unwrap_or(false),
            promisc: raw.promisc_mode.unwrap_or(false),
            vlan,
            vlan_trunk,
            has_vlan_trunk,
            preserve_default_vlan: raw.preserve_default_vlan.unwrap_or(true),
            mac_spoof_check: raw.mac_spoof_chk.unwrap_or(false),
            enable_dad: raw.enable_dad.unwrap_or(false),
            disable_container_interface: raw.disable_container_interface.unwrap_or(false),
            port_isolation: raw.port_isolation.unwrap_or(false),
            mac,
            ipam_type: raw.ipam.and_then(|i| i.kind).filter(|t| !t.is_empty()),
            dns: raw.dns.and_then(RawDns::into_dns),
        })
    }

    /// The combinations ADD refuses (DEL and CHECK accept them, to clean up whatever exists).
    pub fn check_for_add(&self) -> Result<(), CniError> {
        if self.vlan != 0 && !self.vlan_trunk.is_empty() {
            return Err(invalid(
                "vlan",
                self.vlan,
                "cannot be set together with vlanTrunk: a port is either an access port or a trunk",
            ));
        }
        if self.hairpin && self.promisc {
            return Err(invalid(
                "promiscMode",
                true,
                "cannot be set together with hairpinMode",
            ));
        }
        if self.disable_container_interface {
            if let Some(ipam) = &self.ipam_type {
                return Err(invalid(
                    "disableContainerInterface",
                    true,
                    &format!(
                        "cannot be used with IPAM (ipam.type {ipam:?}): an interface that stays down cannot carry addresses"
                    ),
                ));
            }
        }
        if self.vlan != 0 && self.is_gateway {
            let name = self.vlan_gateway_name();
            validate_ifname_field(&name, "bridge").map_err(|e| {
                e.context(format!(
                    "the VLAN gateway interface {name:?} (bridge name, '.', vlan) is too long"
                ))
            })?;
        }
        Ok(())
    }

    /// VLAN filtering is on when the port is an access or trunk port.
    pub fn vlan_filtering(&self) -> bool {
        self.vlan != 0 || self.has_vlan_trunk
    }

    /// The host interface that carries the gateway address on a VLAN network (`cni0.100`).
    pub fn vlan_gateway_name(&self) -> String {
        format!("{}.{}", self.bridge, self.vlan)
    }

    pub fn is_layer3(&self) -> bool {
        self.ipam_type.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<NetConf, CniError> {
        NetConf::parse(&v, "net", &[])
    }

    #[test]
    fn del_reads_a_broken_config_with_defaults_and_says_why() {
        let broken = json!({
            "cniVersion": "1.0.0", "name": "net", "type": "bridge",
            "bridge": "br-test", "mtu": 10, "vlan": "x", "ipMasqBackend": "pf",
            "ipMasq": true, "macspoofchk": "yes", "runtimeConfig": {"mac": "zz"},
            "ipam": {"type": "host-local"},
        });
        assert_eq!(parse(broken.clone()).unwrap_err().code, 6);
        let (c, ignored) = NetConf::parse_for_del(&broken, "net", &[]).unwrap();
        assert_eq!((c.name.as_str(), c.bridge.as_str()), ("net", "br-test"));
        assert_eq!(c.ipam_type.as_deref(), Some("host-local"));
        assert_eq!(
            (c.mtu, c.vlan, c.masq_backend, c.mac),
            (None, 0, None, None)
        );
        // Unreadable, macspoofchk counts as on: removing absent rules is harmless.
        assert!(c.ip_masq && c.mac_spoof_check);
        let said: Vec<&str> = ignored.iter().map(|e| e.msg.as_str()).collect();
        for field in [
            "vlan",
            "mtu",
            "ipMasqBackend",
            "macspoofchk",
            "runtimeConfig.mac",
        ] {
            assert!(
                said.iter().any(|m| m.contains(field)),
                "{field} in {said:?}"
            );
        }
        let fine = json!({"cniVersion": "1.0.0", "name": "net", "type": "bridge"});
        let (c, ignored) = NetConf::parse_for_del(&fine, "net", &[]).unwrap();
        assert!(ignored.is_empty() && !c.ip_masq && !c.mac_spoof_check);
        assert_eq!(c.bridge, "cni0");
    }

    #[test]
    fn defaults_are_the_go_plugins() {
        let c = parse(json!({"cniVersion": "1.0.0", "name": "net", "type": "bridge"})).unwrap();
        assert_eq!(c.bridge, "cni0");
        assert!(!c.is_gateway && !c.is_default_gateway && !c.ip_masq && !c.hairpin);
        assert!(c.preserve_default_vlan);
        assert_eq!(c.mtu, None);
        assert_eq!(c.vlan, 0);
        assert!(!c.vlan_filtering());
        assert_eq!(c.ipam_type, None);
        assert!(c.dns.is_none());
        assert_eq!(c.mac, None);
        assert_eq!(c.masq_backend, None);
    }

    #[test]
    fn default_gateway_implies_gateway() {
        let c = parse(json!({"isDefaultGateway": true})).unwrap();
        assert!(c.is_gateway && c.is_default_gateway);
    }

    #[test]
    fn nulls_are_the_defaults_as_in_go() {
        let c = parse(json!({"isGateway": null, "bridge": null, "mtu": null})).unwrap();
        assert_eq!(c.bridge, "cni0");
        assert!(!c.is_gateway);
    }

    #[test]
    fn wrong_types_are_code_6_naming_the_field() {
        let e = parse(json!({"hairpinMode": "yes"})).unwrap_err();
        assert_eq!(e.code, 6);
        assert!(e.msg.contains("hairpinMode"), "{}", e.msg);
        let e = parse(json!({"mtu": 1500.5})).unwrap_err();
        assert_eq!(e.code, 6);
        assert!(e.msg.contains("mtu"), "{}", e.msg);
    }

    #[test]
    fn out_of_range_values_name_the_field_and_value() {
        for (cfg, field, value) in [
            (json!({"vlan": 4095}), "vlan", "4095"),
            (json!({"vlan": -1}), "vlan", "-1"),
            (json!({"mtu": 20}), "mtu", "20"),
            (json!({"mtu": -5}), "mtu", "-5"),
            (json!({"vlanTrunk": [{"id": 0}]}), "vlanTrunk[0].id", "0"),
            (
                json!({"vlanTrunk": [{"id": 5}, {"minID": 10, "maxID": 5000}]}),
                "vlanTrunk[1].maxID",
                "5000",
            ),
            (
                json!({"vlanTrunk": [{"minID": 30, "maxID": 20}]}),
                "vlanTrunk[0].maxID",
                "20",
            ),
            (
                json!({"vlanTrunk": [{"minID": 3}]}),
                "vlanTrunk[0].minID",
                "3",
            ),
            (
                json!({"vlanTrunk": [{"maxID": 3}]}),
                "vlanTrunk[0].maxID",
                "3",
            ),
            (
                json!({"ipMasqBackend": "ebtables"}),
                "ipMasqBackend",
                "ebtables",
            ),
            (json!({"bridge": ""}), "bridge", "\"\""),
            (
                json!({"bridge": "a-much-too-long-bridge"}),
                "bridge",
                "a-much-too-long-bridge",
            ),
            (
                json!({"runtimeConfig": {"mac": "zz:00:00:00:00:01"}}),
                "runtimeConfig.mac",
                "zz:00",
            ),
            (
                json!({"args": {"cni": {"mac": "01:00:00:00:00:01"}}}),
                "args.cni.mac",
                "01:00",
            ),
        ] {
            let e = parse(cfg.clone()).unwrap_err();
            assert_eq!(e.code, 7, "{cfg}: {}", e.msg);
            assert!(e.msg.contains(field), "{cfg}: {}", e.msg);
            assert!(e.msg.contains(value), "{cfg}: {}", e.msg);
        }
    }

    #[test]
    fn add_refuses_the_combinations_the_go_plugin_refuses() {
        for (cfg, field) in [
            (json!({"vlan": 5, "vlanTrunk": [{"id": 6}]}), "vlan"),
            (
                json!({"hairpinMode": true, "promiscMode": true}),
                "promiscMode",
            ),
            (
                json!({"disableContainerInterface": true, "ipam": {"type": "host-local"}}),
                "disableContainerInterface",
            ),
            (
                json!({"bridge": "bridge-name-14", "vlan": 100, "isGateway": true}),
                "bridge",
            ),
        ] {
            let c = parse(cfg.clone()).unwrap();
            let e = c.check_for_add().unwrap_err();
            assert_eq!(e.code, 7, "{cfg}");
            assert!(e.msg.contains(field), "{cfg}: {}", e.msg);
        }
        let ok = parse(json!({"disableContainerInterface": true, "hairpinMode": true})).unwrap();
        ok.check_for_add().unwrap();
    }

    #[test]
    fn trunk_ids_are_collected_sorted_once() {
        let c = parse(json!({"vlanTrunk": [{"id": 7}, {"minID": 3, "maxID": 5}, {"id": 4}, null]}))
            .unwrap();
        assert_eq!(c.vlan_trunk, vec![3, 4, 5, 7]);
        assert!(c.vlan_filtering());
        let empty = parse(json!({"vlanTrunk": []})).unwrap();
        assert!(empty.vlan_filtering() && empty.vlan_trunk.is_empty());
    }

    #[test]
    fn mac_precedence_runtime_config_then_args_then_cni_args() {
        let args = vec![("MAC".to_string(), "0a:00:00:00:00:03".to_string())];
        let all = json!({
            "runtimeConfig": {"mac": "0a:00:00:00:00:01"},
            "args": {"cni": {"mac": "0a:00:00:00:00:02"}}
        });
        let c = NetConf::parse(&all, "n", &args).unwrap();
        assert_eq!(c.mac, Some([0x0a, 0, 0, 0, 0, 1]));
        let c = NetConf::parse(
            &json!({"args": {"cni": {"mac": "0A-00-00-00-00-02"}}}),
            "n",
            &args,
        )
        .unwrap();
        assert_eq!(c.mac, Some([0x0a, 0, 0, 0, 0, 2]));
        let c = NetConf::parse(&json!({}), "n", &args).unwrap();
        assert_eq!(c.mac, Some([0x0a, 0, 0, 0, 0, 3]));
        assert_eq!(format_mac(&c.mac.unwrap()), "0a:00:00:00:00:03");
    }

    /// Keys are read in any case, as the Go plugin reads them; the exact one wins.
    #[test]
    fn keys_match_in_any_case_as_in_go() {
        for (rc, args, cni, mac) in [
            ("runtimeConfig", "args", "cni", "mac"),
            ("RuntimeConfig", "Args", "CNI", "Mac"),
            ("runtimeconfig", "ARGS", "Cni", "MAC"),
        ] {
            let c = NetConf::parse(&json!({rc: {mac: "0a:00:00:00:00:01"}}), "n", &[]).unwrap();
            assert_eq!(c.mac, Some([0x0a, 0, 0, 0, 0, 1]), "{rc}.{mac}");
            let c = NetConf::parse(&json!({args: {cni: {mac: "0a:00:00:00:00:02"}}}), "n", &[])
                .unwrap();
            assert_eq!(c.mac, Some([0x0a, 0, 0, 0, 0, 2]), "{args}.{cni}.{mac}");
        }
        let c = parse(json!({
            "Bridge": "br9", "IsGateway": true, "IPMasq": true, "MTU": 1400, "HairpinMode": true,
            "MacSpoofChk": true, "IPAM": {"Type": "host-local"},
            "DNS": {"Nameservers": ["10.0.0.1"], "Search": ["a"]}
        }))
        .unwrap();
        assert_eq!(c.bridge, "br9");
        assert!(c.is_gateway && c.ip_masq && c.hairpin && c.mac_spoof_check);
        assert_eq!(c.mtu, Some(1400));
        assert_eq!(c.ipam_type.as_deref(), Some("host-local"));
        assert_eq!(
            c.dns.unwrap().nameservers,
            ["10.0.0.1".parse::<std::net::IpAddr>().unwrap()]
        );
        let c = parse(json!({"bridge": "exact", "Bridge": "variant"})).unwrap();
        assert_eq!(c.bridge, "exact");
        // DEL's lenient reading knows a broken ipMasq in any case.
        let (c, ignored) =
            NetConf::parse_for_del(&json!({"IPMASQ": "yes", "bridge": "b"}), "n", &[]).unwrap();
        assert!(c.ip_masq && !ignored.is_empty());
    }

    #[test]
    fn dns_counts_as_set_as_in_go() {
        assert!(parse(json!({"dns": {}})).unwrap().dns.is_none());
        assert!(parse(json!({"dns": {"domain": ""}})).unwrap().dns.is_none());
        let d = parse(json!({"dns": {"nameservers": []}}))
            .unwrap()
            .dns
            .unwrap();
        assert!(d.nameservers.is_empty());
        let d = parse(json!({"dns": {"nameservers": ["10.96.0.10"], "search": ["svc"]}}))
            .unwrap()
            .dns
            .unwrap();
        assert_eq!(
            d.nameservers,
            vec!["10.96.0.10".parse::<std::net::IpAddr>().unwrap()]
        );
        assert_eq!(d.search, vec!["svc".to_string()]);
    }

    #[test]
    fn ipam_type_makes_it_layer_3() {
        assert!(parse(json!({"ipam": {"type": "host-local"}}))
            .unwrap()
            .is_layer3());
        assert!(!parse(json!({"ipam": {}})).unwrap().is_layer3());
    }
}
