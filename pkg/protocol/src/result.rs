//! One result type for every spec version: parsed from any version's JSON, printed in any.
//!
//! The in-memory shape is the newest (1.1.0); older shapes are produced and read at the edges.

use crate::error::{CniError, DECODING_FAILURE, INCOMPATIBLE_VERSION};
use crate::gokeys::{self, GoKeys};
use crate::version::Version;
use cni_plugin::config::Dns;
use ipnetwork::IpNetwork;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::net::IpAddr;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    pub mac: String,
    pub sandbox: String,
    /// 1.1.0 only.
    pub mtu: Option<u32>,
    pub socket_path: String,
    pub pci_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpConfig {
    /// The address with its prefix, as `10.1.0.5/24`.
    pub address: IpNetwork,
    pub gateway: Option<IpAddr>,
    /// Index into `interfaces`.
    pub interface: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub dst: IpNetwork,
    pub gw: Option<IpAddr>,
    /// The remaining fields are 1.1.0 only.
    pub mtu: Option<u32>,
    pub advmss: Option<u32>,
    pub priority: Option<u32>,
    pub table: Option<u32>,
    pub scope: Option<u32>,
}

impl Route {
    pub fn new(dst: IpNetwork, gw: Option<IpAddr>) -> Route {
        Route {
            dst,
            gw,
            mtu: None,
            advmss: None,
            priority: None,
            table: None,
            scope: None,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct CniResult {
    pub interfaces: Vec<Interface>,
    pub ips: Vec<IpConfig>,
    pub routes: Vec<Route>,
    pub dns: Dns,
}

fn decode_err(msg: impl Into<String>) -> CniError {
    CniError::new(DECODING_FAILURE, msg)
}

fn get_str<'a>(
    obj: &'a Map<String, Value>,
    key: &str,
    what: &str,
) -> Result<Option<&'a str>, CniError> {
    match gokeys::get(obj, key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(decode_err(format!(
            "{what}.{key}: expected a string, got {other}"
        ))),
    }
}

fn get_u32(obj: &Map<String, Value>, key: &str, what: &str) -> Result<Option<u32>, CniError> {
    match gokeys::get(obj, key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| {
                decode_err(format!(
                    "{what}.{key}: expected an unsigned number, got {v}"
                ))
            }),
    }
}

fn get_array<'a>(
    obj: &'a Map<String, Value>,
    key: &str,
    what: &str,
) -> Result<&'a [Value], CniError> {
    match gokeys::get(obj, key) {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(a)) => Ok(a),
        Some(other) => Err(decode_err(format!(
            "{what}.{key}: expected a list, got {other}"
        ))),
    }
}

fn as_object<'a>(v: &'a Value, what: &str) -> Result<&'a Map<String, Value>, CniError> {
    v.as_object()
        .ok_or_else(|| decode_err(format!("{what}: expected an object, got {v}")))
}

fn parse_net(s: &str, what: &str) -> Result<IpNetwork, CniError> {
    s.parse().map_err(|_| {
        decode_err(format!(
            "{what}: {s:?} is not an address with a prefix length"
        ))
    })
}

fn parse_ip(s: &str, what: &str) -> Result<IpAddr, CniError> {
    s.parse()
        .map_err(|_| decode_err(format!("{what}: {s:?} is not an IP address")))
}

fn parse_route(v: &Value, what: &str) -> Result<Route, CniError> {
    let o = as_object(v, what)?;
    let dst =
        get_str(o, "dst", what)?.ok_or_else(|| decode_err(format!("{what}.dst is missing")))?;
    Ok(Route {
        dst: parse_net(dst, &format!("{what}.dst"))?,
        gw: get_str(o, "gw", what)?
            .map(|g| parse_ip(g, &format!("{what}.gw")))
            .transpose()?,
        mtu: get_u32(o, "mtu", what)?,
        advmss: get_u32(o, "advmss", what)?,
        priority: get_u32(o, "priority", what)?,
        table: get_u32(o, "table", what)?,
        scope: get_u32(o, "scope", what)?,
    })
}

fn parse_dns(v: Option<&Value>) -> Result<Dns, CniError> {
    match v {
        None | Some(Value::Null) => Ok(Dns::default()),
        Some(v) => Dns::deserialize(GoKeys(v)).map_err(|e| decode_err(format!("dns: {e}"))),
    }
}

fn dns_is_empty(d: &Dns) -> bool {
    d.nameservers.is_empty()
        && d.domain.as_deref().unwrap_or("").is_empty()
        && d.search.is_empty()
        && d.options.is_empty()
}

impl CniResult {
    /// Parses a result of any version. `hint` is the version to assume when the
    /// JSON names none (a prevResult takes its config's version).
    pub fn parse(v: &Value, hint: Version) -> Result<CniResult, CniError> {
        let o = as_object(v, "result")?;
        let version = match get_str(o, "cniVersion", "result")? {
            Some(s) if !s.is_empty() => Version::parse(s)?,
            _ => hint,
        };
        if version.has_legacy_result()
            || gokeys::get(o, "ip4").is_some()
            || gokeys::get(o, "ip6").is_some()
        {
            return Self::parse_legacy(o);
        }
        let mut r = CniResult {
            dns: parse_dns(gokeys::get(o, "dns"))?,
            ..Default::default()
        };
        for (i, iv) in get_array(o, "interfaces", "result")?.iter().enumerate() {
            let what = format!("interfaces[{i}]");
            let io = as_object(iv, &what)?;
            r.interfaces.push(Interface {
                name: get_str(io, "name", &what)?.unwrap_or_default().to_string(),
                mac: get_str(io, "mac", &what)?.unwrap_or_default().to_string(),
                sandbox: get_str(io, "sandbox", &what)?
                    .unwrap_or_default()
                    .to_string(),
                mtu: get_u32(io, "mtu", &what)?,
                socket_path: get_str(io, "socketPath", &what)?
                    .unwrap_or_default()
                    .to_string(),
                pci_id: get_str(io, "pciID", &what)?.unwrap_or_default().to_string(),
            });
        }
        for (i, ipv) in get_array(o, "ips", "result")?.iter().enumerate() {
            let what = format!("ips[{i}]");
            let io = as_object(ipv, &what)?;
            let address = get_str(io, "address", &what)?
                .ok_or_else(|| decode_err(format!("{what}.address is missing")))?;
            let interface = match gokeys::get(io, "interface") {
                None | Some(Value::Null) => None,
                Some(n) => Some(n.as_u64().map(|n| n as usize).ok_or_else(|| {
                    decode_err(format!("{what}.interface: expected an index, got {n}"))
                })?),
            };
            r.ips.push(IpConfig {
                address: parse_net(address, &format!("{what}.address"))?,
                gateway: get_str(io, "gateway", &what)?
                    .map(|g| parse_ip(g, &format!("{what}.gateway")))
                    .transpose()?,
                interface,
            });
        }
        for (i, rv) in get_array(o, "routes", "result")?.iter().enumerate() {
            r.routes.push(parse_route(rv, &format!("routes[{i}]"))?);
        }
        Ok(r)
    }

    fn parse_legacy(o: &Map<String, Value>) -> Result<CniResult, CniError> {
        let mut r = CniResult {
            dns: parse_dns(gokeys::get(o, "dns"))?,
            ..Default::default()
        };
        for key in ["ip4", "ip6"] {
            let Some(v) = gokeys::get(o, key).filter(|v| !v.is_null()) else {
                continue;
            };
            let io = as_object(v, key)?;
            let ip = get_str(io, "ip", key)?
                .ok_or_else(|| decode_err(format!("{key}.ip is missing")))?;
            r.ips.push(IpConfig {
                address: parse_net(ip, &format!("{key}.ip"))?,
                gateway: get_str(io, "gateway", key)?
                    .map(|g| parse_ip(g, &format!("{key}.gateway")))
                    .transpose()?,
                interface: None,
            });
            for (i, rv) in get_array(io, "routes", key)?.iter().enumerate() {
                r.routes
                    .push(parse_route(rv, &format!("{key}.routes[{i}]"))?);
            }
        }
        Ok(r)
    }

    /// Prints the result in `version`'s shape. A conversion that would drop
    /// addresses (two of one family into 0.2.0) is refused.
    pub fn to_json(&self, version: Version) -> Result<Value, CniError> {
        let mut out = Map::new();
        out.insert("cniVersion".into(), json!(version.as_str()));
        if version.has_legacy_result() {
            self.fill_legacy(version, &mut out)?;
        } else {
            self.fill_current(version, &mut out);
        }
        if !dns_is_empty(&self.dns) {
            out.insert(
                "dns".into(),
                serde_json::to_value(&self.dns).unwrap_or(Value::Null),
            );
        }
        Ok(Value::Object(out))
    }

    fn fill_current(&self, version: Version, out: &mut Map<String, Value>) {
        let v110 = version >= Version::V1_1_0;
        if !self.interfaces.is_empty() {
            let ifs: Vec<Value> = self
                .interfaces
                .iter()
                .map(|i| {
                    let mut m = Map::new();
                    m.insert("name".into(), json!(i.name));
                    if !i.mac.is_empty() {
                        m.insert("mac".into(), json!(i.mac));
                    }
                    if v110 {
                        if let Some(mtu) = i.mtu.filter(|m| *m > 0) {
                            m.insert("mtu".into(), json!(mtu));
                        }
                    }
                    if !i.sandbox.is_empty() {
                        m.insert("sandbox".into(), json!(i.sandbox));
                    }
                    if v110 && !i.socket_path.is_empty() {
                        m.insert("socketPath".into(), json!(i.socket_path));
                    }
                    if v110 && !i.pci_id.is_empty() {
                        m.insert("pciID".into(), json!(i.pci_id));
                    }
                    Value::Object(m)
                })
                .collect();
            out.insert("interfaces".into(), Value::Array(ifs));
        }
        if !self.ips.is_empty() {
            let ips: Vec<Value> = self
                .ips
                .iter()
                .map(|ip| {
                    let mut m = Map::new();
                    if version < Version::V1_0_0 {
                        m.insert(
                            "version".into(),
                            json!(if ip.address.is_ipv4() { "4" } else { "6" }),
                        );
                    }
                    if let Some(i) = ip.interface {
                        m.insert("interface".into(), json!(i));
                    }
                    m.insert("address".into(), json!(ip.address.to_string()));
                    if let Some(gw) = ip.gateway {
                        m.insert("gateway".into(), json!(gw.to_string()));
                    }
                    Value::Object(m)
                })
                .collect();
            out.insert("ips".into(), Value::Array(ips));
        }
        if !self.routes.is_empty() {
            let routes: Vec<Value> = self.routes.iter().map(|r| route_json(r, v110)).collect();
            out.insert("routes".into(), Value::Array(routes));
        }
    }

    fn fill_legacy(&self, version: Version, out: &mut Map<String, Value>) -> Result<(), CniError> {
        for (key, want_v4) in [("ip4", true), ("ip6", false)] {
            let family: Vec<&IpConfig> = self
                .ips
                .iter()
                .filter(|ip| ip.address.is_ipv4() == want_v4)
                .collect();
            if family.len() > 1 {
                let list: Vec<String> = family.iter().map(|ip| ip.address.to_string()).collect();
                return Err(CniError::new(
                    INCOMPATIBLE_VERSION,
                    format!(
                        "cannot print the result as cniVersion {version}: it holds {} IPv{} addresses ({}) and that version holds one per family",
                        family.len(),
                        if want_v4 { 4 } else { 6 },
                        list.join(", ")
                    ),
                ));
            }
            let Some(ip) = family.first() else { continue };
            let mut m = Map::new();
            m.insert("ip".into(), json!(ip.address.to_string()));
            if let Some(gw) = ip.gateway {
                m.insert("gateway".into(), json!(gw.to_string()));
            }
            let routes: Vec<Value> = self
                .routes
                .iter()
                .filter(|r| r.dst.is_ipv4() == want_v4)
                .map(|r| route_json(r, false))
                .collect();
            if !routes.is_empty() {
                m.insert("routes".into(), Value::Array(routes));
            }
            out.insert(key.into(), Value::Object(m));
        }
        Ok(())
    }

    /// Addresses of one family, in order.
    pub fn addresses(&self, v4: bool) -> impl Iterator<Item = &IpConfig> {
        self.ips.iter().filter(move |ip| ip.address.is_ipv4() == v4)
    }
}

fn route_json(r: &Route, v110: bool) -> Value {
    let mut m = Map::new();
    m.insert("dst".into(), json!(r.dst.to_string()));
    if let Some(gw) = r.gw {
        m.insert("gw".into(), json!(gw.to_string()));
    }
    if v110 {
        for (k, v) in [
            ("mtu", r.mtu),
            ("advmss", r.advmss),
            ("priority", r.priority),
            ("table", r.table),
            ("scope", r.scope),
        ] {
            if let Some(v) = v {
                m.insert(k.into(), json!(v));
            }
        }
    }
    Value::Object(m)
}
