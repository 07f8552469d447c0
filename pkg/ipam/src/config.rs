//! The host-local config: decoded, validated and defaulted as the Go plugin does it.

use crate::ip::parse_addr_or_cidr;
use crate::range::{Range, RangeConf, RangeSet};
use cni_protocol::{decode, decode_lenient, CniError, Request, Route, Version};
use ipnetwork::IpNetwork;
use serde::Deserialize;
use std::net::IpAddr;
use std::path::PathBuf;

pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/networks";

#[derive(Debug, Default, Deserialize)]
struct NetConf {
    #[serde(default)]
    ipam: Option<IpamConf>,
    #[serde(default, rename = "runtimeConfig")]
    runtime_config: Option<RuntimeConf>,
    #[serde(default)]
    args: Option<ArgsConf>,
}

#[derive(Debug, Default, Deserialize)]
struct IpamConf {
    #[serde(default)]
    subnet: Option<String>,
    #[serde(default, rename = "rangeStart")]
    range_start: Option<String>,
    #[serde(default, rename = "rangeEnd")]
    range_end: Option<String>,
    #[serde(default)]
    gateway: Option<String>,
    #[serde(default)]
    routes: Option<Vec<RouteConf>>,
    #[serde(default, rename = "dataDir")]
    data_dir: Option<String>,
    #[serde(default, rename = "resolvConf")]
    resolv_conf: Option<String>,
    #[serde(default)]
    ranges: Option<Vec<Vec<RangeConf>>>,
    #[serde(default, rename = "rangeFromFile")]
    range_from_file: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct RouteConf {
    #[serde(default)]
    dst: Option<String>,
    #[serde(default)]
    gw: Option<String>,
    #[serde(default)]
    mtu: Option<u32>,
    #[serde(default)]
    advmss: Option<u32>,
    #[serde(default)]
    priority: Option<u32>,
    #[serde(default)]
    table: Option<u32>,
    #[serde(default)]
    scope: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
struct RuntimeConf {
    #[serde(default, rename = "ipRanges")]
    ip_ranges: Option<Vec<Vec<RangeConf>>>,
    #[serde(default)]
    ips: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
struct ArgsConf {
    #[serde(default)]
    cni: Option<CniArgs>,
}

#[derive(Debug, Default, Deserialize)]
struct CniArgs {
    #[serde(default)]
    ips: Option<Vec<String>>,
}

/// The part of the config that DEL and GC read: `ipam.dataDir` alone.
#[derive(Debug, Default, Deserialize)]
struct StoreNetConf {
    #[serde(default)]
    ipam: Option<StoreIpamConf>,
}

#[derive(Debug, Default, Deserialize)]
struct StoreIpamConf {
    #[serde(default, rename = "dataDir")]
    data_dir: Option<String>,
}

fn data_dir_or_default(data_dir: Option<String>) -> PathBuf {
    PathBuf::from(
        data_dir
            .filter(|d| !d.is_empty())
            .unwrap_or_else(|| DEFAULT_DATA_DIR.to_string()),
    )
}

/// Where a network's reservations live: all that DEL and GC need. Ranges, `rangeFromFile`
/// and requested addresses are not read, so a config edited into an invalid one (or a range
/// file removed) after ADD cannot keep an address reserved forever.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    pub network: String,
    pub data_dir: PathBuf,
}

impl StoreConfig {
    pub fn from_request(req: &Request) -> Result<StoreConfig, CniError> {
        Self::load(&req.config, &req.name)
    }

    /// Wrong JSON types in `ipam` or `ipam.dataDir` are still decode errors (code 6).
    pub fn load(config: &serde_json::Value, network: &str) -> Result<StoreConfig, CniError> {
        let net: StoreNetConf = decode(config)?;
        Ok(StoreConfig {
            network: network.to_string(),
            data_dir: data_dir_or_default(net.ipam.and_then(|i| i.data_dir)),
        })
    }

    /// DEL's reading: an `ipam` that does not decode leaves the default data directory, and
    /// why is returned to be reported. The addresses are found by container ID, so releasing
    /// where they are not is harmless, while failing would keep them reserved forever.
    pub fn load_for_del(config: &serde_json::Value, network: &str) -> (StoreConfig, Vec<CniError>) {
        let (net, dropped): (StoreNetConf, _) = decode_lenient(config);
        let conf = StoreConfig {
            network: network.to_string(),
            data_dir: data_dir_or_default(net.ipam.and_then(|i| i.data_dir)),
        };
        (conf, dropped.into_iter().map(|(_, e)| e).collect())
    }

    /// The network's directory: `<dataDir>/<network>`.
    pub fn network_dir(&self) -> PathBuf {
        self.data_dir.join(&self.network)
    }
}

/// An address the runtime asked for, and where it asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requested {
    pub ip: IpAddr,
    /// The field that carried it, for messages (`CNI_ARGS IP`, `args.cni.ips[0]`, ...).
    pub source: String,
}

/// A range set and the config field it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rangeset {
    pub set: RangeSet,
    pub field: String,
}

/// Everything host-local needs from one request's config.
#[derive(Debug, Clone)]
pub struct IpamConfig {
    /// The network name: the directory under `data_dir`.
    pub network: String,
    pub data_dir: PathBuf,
    /// In order: `runtimeConfig.ipRanges`, the legacy single range, `ipam.ranges`.
    /// A set's index names its `last_reserved_ip.<index>` file.
    pub rangesets: Vec<Rangeset>,
    pub routes: Vec<Route>,
    pub resolv_conf: Option<PathBuf>,
    /// In order: CNI_ARGS `IP`, `args.cni.ips`, `runtimeConfig.ips`, without repeats.
    pub requested: Vec<Requested>,
}

/// Where the range sets come from, each with the field that names it: runtimeConfig.ipRanges,
/// the legacy single range, ipam.ranges; rangeFromFile only when none of those is given.
fn range_sources(
    ip_ranges: Vec<Vec<RangeConf>>,
    ipam: &IpamConf,
) -> Result<Vec<(String, Vec<RangeConf>)>, CniError> {
    let mut sources: Vec<(String, Vec<RangeConf>)> = Vec::new();
    for (i, set) in ip_ranges.into_iter().enumerate() {
        sources.push((format!("runtimeConfig.ipRanges[{i}]"), set));
    }
    if ipam.subnet.as_deref().is_some_and(|s| !s.is_empty()) {
        sources.push((
            "ipam".to_string(),
            vec![RangeConf {
                subnet: ipam.subnet.clone(),
                range_start: ipam.range_start.clone(),
                range_end: ipam.range_end.clone(),
                gateway: ipam.gateway.clone(),
            }],
        ));
    }
    for (i, set) in ipam.ranges.iter().flatten().enumerate() {
        sources.push((format!("ipam.ranges[{i}]"), set.clone()));
    }
    if sources.is_empty() {
        if let Some(file) = ipam.range_from_file.as_deref().filter(|f| !f.is_empty()) {
            sources.push((
                "ipam.rangeFromFile".to_string(),
                vec![range_from_file(file)?],
            ));
        }
    }
    if sources.is_empty() {
        return Err(CniError::invalid_config(
            "no IP ranges specified: set ipam.subnet, ipam.ranges or runtimeConfig.ipRanges",
        ));
    }
    Ok(sources)
}

/// Each source's range set, checked; an error names the set's index.
fn build_rangesets(sources: &[(String, Vec<RangeConf>)]) -> Result<Vec<Rangeset>, CniError> {
    let mut rangesets = Vec::with_capacity(sources.len());
    for (i, (field, confs)) in sources.iter().enumerate() {
        // The legacy fields are one range named by its own fields (`ipam.subnet`).
        let set = if field == "ipam" || field == "ipam.rangeFromFile" {
            Range::from_conf(&confs[0], field).map(|r| RangeSet { ranges: vec![r] })
        } else {
            RangeSet::from_conf(confs, field)
        }
        .map_err(|e| e.context(format!("invalid range set {i}")))?;
        rangesets.push(Rangeset {
            set,
            field: field.clone(),
        });
    }
    Ok(rangesets)
}

/// No two range sets share an address.
fn check_no_overlap(rangesets: &[Rangeset]) -> Result<(), CniError> {
    for (i, a) in rangesets.iter().enumerate() {
        for (j, b) in rangesets.iter().enumerate().skip(i + 1) {
            if a.set.overlaps(&b.set) {
                return Err(CniError::invalid_config(format!(
                    "range set {i} ({} = {}) overlaps with range set {j} ({} = {})",
                    a.field, a.set, b.field, b.set
                )));
            }
        }
    }
    Ok(())
}

/// `ipam.routes`, each checked and named by its index.
fn read_routes(routes: &[RouteConf]) -> Result<Vec<Route>, CniError> {
    routes
        .iter()
        .enumerate()
        .map(|(i, r)| route(r, &format!("ipam.routes[{i}]")))
        .collect()
}

impl IpamConfig {
    /// Reads the request's config, CNI_ARGS and runtime config.
    pub fn from_request(req: &Request) -> Result<IpamConfig, CniError> {
        Self::load(&req.config, req.version, &req.name, req.env.arg("IP"))
    }

    /// The same from its parts: `env_ip` is the CNI_ARGS `IP` value.
    pub fn load(
        config: &serde_json::Value,
        version: Version,
        network: &str,
        env_ip: Option<&str>,
    ) -> Result<IpamConfig, CniError> {
        let net: NetConf = decode(config)?;
        let ipam = net.ipam.ok_or_else(|| {
            CniError::invalid_config("the network config has no \"ipam\" section")
        })?;
        let runtime = net.runtime_config.unwrap_or_default();

        let requested = requested_ips(
            env_ip,
            net.args
                .and_then(|a| a.cni)
                .and_then(|c| c.ips)
                .unwrap_or_default(),
            runtime.ips.clone().unwrap_or_default(),
        )?;

        let sources = range_sources(runtime.ip_ranges.unwrap_or_default(), &ipam)?;
        let rangesets = build_rangesets(&sources)?;
        check_families(&rangesets, version)?;
        check_no_overlap(&rangesets)?;
        let routes = read_routes(ipam.routes.as_deref().unwrap_or_default())?;

        Ok(IpamConfig {
            network: network.to_string(),
            data_dir: data_dir_or_default(ipam.data_dir),
            rangesets,
            routes,
            resolv_conf: ipam
                .resolv_conf
                .filter(|r| !r.is_empty())
                .map(PathBuf::from),
            requested,
        })
    }

    /// The network's directory: `<dataDir>/<network>`.
    pub fn network_dir(&self) -> PathBuf {
        self.data_dir.join(&self.network)
    }

    /// Which requested address each range set must hand out, or an error naming
    /// every address that no set can honour.
    pub fn assign_requested(&self) -> Result<Vec<Option<&Requested>>, CniError> {
        let mut left: Vec<&Requested> = self.requested.iter().collect();
        let mut plan = Vec::with_capacity(self.rangesets.len());
        for (i, rs) in self.rangesets.iter().enumerate() {
            let pick = left.iter().position(|r| rs.set.contains(r.ip));
            let Some(pos) = pick else {
                plan.push(None);
                continue;
            };
            let req = left.remove(pos);
            if let Some(range) = rs.set.range_for(req.ip) {
                if range.gateway == req.ip {
                    return Err(CniError::invalid_config(format!(
                        "requested IP {} ({}) is the gateway of range {} in range set {i} ({})",
                        req.ip, req.source, range, rs.field
                    )));
                }
            }
            plan.push(Some(req));
        }
        if !left.is_empty() {
            let names: Vec<String> = left
                .iter()
                .map(|r| format!("{} ({})", r.ip, r.source))
                .collect();
            let sets: Vec<String> = self
                .rangesets
                .iter()
                .enumerate()
                .map(|(i, rs)| format!("{i}: {}", rs.set))
                .collect();
            return Err(CniError::invalid_config(format!(
                "failed to allocate all requested IPs: {}: no range set left that contains it (range sets: {})",
                names.join(", "),
                sets.join("; ")
            )));
        }
        Ok(plan)
    }
}

fn requested_ips(
    env_ip: Option<&str>,
    args_ips: Vec<String>,
    runtime_ips: Vec<String>,
) -> Result<Vec<Requested>, CniError> {
    let mut out: Vec<Requested> = Vec::new();
    let mut push = |text: &str, source: String| -> Result<(), CniError> {
        let ip = parse_addr_or_cidr(text.trim()).ok_or_else(|| {
            CniError::invalid_config(format!("{source} {text:?}: not an IP address"))
        })?;
        if !out.iter().any(|r| r.ip == ip) {
            out.push(Requested { ip, source });
        }
        Ok(())
    };
    if let Some(list) = env_ip.filter(|s| !s.is_empty()) {
        for item in list.split(',') {
            push(item, "CNI_ARGS IP".to_string())?;
        }
    }
    for (i, s) in args_ips.iter().enumerate() {
        push(s, format!("args.cni.ips[{i}]"))?;
    }
    for (i, s) in runtime_ips.iter().enumerate() {
        push(s, format!("runtimeConfig.ips[{i}]"))?;
    }
    Ok(out)
}

/// cniVersion below 0.3.0 carries one address per family.
fn check_families(sets: &[Rangeset], version: Version) -> Result<(), CniError> {
    if !version.has_legacy_result() {
        return Ok(());
    }
    for v4 in [true, false] {
        let fields: Vec<&str> = sets
            .iter()
            .filter(|s| s.set.is_ipv4() == v4)
            .map(|s| s.field.as_str())
            .collect();
        if fields.len() > 1 {
            return Err(CniError::invalid_config(format!(
                "cniVersion {:?} does not support more than 1 address per family: {} IPv{} range sets ({})",
                version.as_str(),
                fields.len(),
                if v4 { 4 } else { 6 },
                fields.join(", ")
            )));
        }
    }
    Ok(())
}

fn route(r: &RouteConf, field: &str) -> Result<Route, CniError> {
    let dst_text = r
        .dst
        .as_deref()
        .ok_or_else(|| CniError::invalid_config(format!("{field}.dst is missing")))?;
    let dst: IpNetwork = dst_text
        .parse()
        .ok()
        .filter(|_| dst_text.contains('/'))
        .ok_or_else(|| {
            CniError::invalid_config(format!(
                "{field}.dst {dst_text:?}: not a CIDR (address/prefix)"
            ))
        })?;
    let gw = match r.gw.as_deref().filter(|g| !g.is_empty()) {
        None => None,
        Some(g) => Some(g.parse::<IpAddr>().map_err(|_| {
            CniError::invalid_config(format!("{field}.gw {g:?}: not an IP address"))
        })?),
    };
    Ok(Route {
        dst,
        gw,
        mtu: r.mtu,
        advmss: r.advmss,
        priority: r.priority,
        table: r.table,
        scope: r.scope,
    })
}

fn range_from_file(path: &str) -> Result<RangeConf, CniError> {
    let field = "ipam.rangeFromFile";
    let text = std::fs::read(path)
        .map_err(|e| CniError::invalid_config(format!("{field} {path:?}: cannot read it: {e}")))?;
    let value: serde_json::Value = serde_json::from_slice(&text).map_err(|e| {
        CniError::invalid_config(format!("{field} {path:?}: not a JSON range: {e}"))
    })?;
    let conf: RangeConf = decode(&value).map_err(|e| e.context(format!("{field} {path:?}")))?;
    if conf.subnet.as_deref().is_none_or(str::is_empty) {
        return Err(CniError::invalid_config(format!(
            "{field} {path:?}: the range in it has no subnet"
        )));
    }
    Ok(conf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn load(v: serde_json::Value) -> Result<IpamConfig, CniError> {
        load_with(v, Version::V1_0_0, None)
    }

    fn load_with(
        v: serde_json::Value,
        version: Version,
        env_ip: Option<&str>,
    ) -> Result<IpamConfig, CniError> {
        IpamConfig::load(&v, version, "net1", env_ip)
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn legacy_fields_make_the_first_rangeset_and_defaults_apply() {
        let c = load(json!({"ipam": {
            "type": "host-local", "subnet": "10.1.0.0/16",
            "rangeStart": "10.1.0.10", "rangeEnd": "10.1.0.20", "gateway": "10.1.0.254",
            "ranges": [[{"subnet": "10.2.0.0/24"}]]
        }}))
        .unwrap();
        assert_eq!(c.rangesets.len(), 2);
        assert_eq!(c.rangesets[0].field, "ipam");
        assert_eq!(c.rangesets[0].set.to_string(), "10.1.0.10-10.1.0.20");
        assert_eq!(c.rangesets[0].set.ranges[0].gateway, ip("10.1.0.254"));
        assert_eq!(c.rangesets[1].field, "ipam.ranges[0]");
        assert_eq!(c.data_dir, PathBuf::from("/var/lib/cni/networks"));
        assert_eq!(c.network_dir(), PathBuf::from("/var/lib/cni/networks/net1"));
        assert!(c.resolv_conf.is_none() && c.routes.is_empty() && c.requested.is_empty());
    }

    #[test]
    fn runtime_ranges_are_prepended() {
        let c = load(json!({
            "ipam": {"subnet": "10.1.0.0/24", "ranges": [[{"subnet": "2001:db8::/64"}]]},
            "runtimeConfig": {"ipRanges": [[{"subnet": "10.9.0.0/24"}]]}
        }))
        .unwrap();
        let fields: Vec<&str> = c.rangesets.iter().map(|r| r.field.as_str()).collect();
        assert_eq!(
            fields,
            ["runtimeConfig.ipRanges[0]", "ipam", "ipam.ranges[0]"]
        );
    }

    #[test]
    fn data_dir_routes_and_resolv_conf() {
        let c = load(json!({"ipam": {
            "subnet": "10.1.0.0/24", "dataDir": "/tmp/x", "resolvConf": "/etc/r.conf",
            "routes": [{"dst": "0.0.0.0/0"}, {"dst": "192.168.0.0/16", "gw": "10.1.0.1", "mtu": 1400}]
        }}))
        .unwrap();
        assert_eq!(c.data_dir, PathBuf::from("/tmp/x"));
        assert_eq!(c.resolv_conf, Some(PathBuf::from("/etc/r.conf")));
        assert_eq!(c.routes.len(), 2);
        assert_eq!(c.routes[1].gw, Some(ip("10.1.0.1")));
        assert_eq!(c.routes[1].mtu, Some(1400));
    }

    fn err(v: serde_json::Value) -> String {
        let e = load(v).unwrap_err();
        assert_eq!(e.code, 7, "{}", e.msg);
        e.msg
    }

    #[test]
    fn config_errors_name_field_and_value() {
        assert!(err(json!({})).contains("\"ipam\""));
        assert!(err(json!({"ipam": {"type": "host-local"}})).contains("no IP ranges"));
        let m = err(json!({"ipam": {"ranges": [[{"subnet": "10.0.0.0/31"}]]}}));
        assert!(
            m.starts_with("invalid range set 0: ipam.ranges[0][0].subnet \"10.0.0.0/31\""),
            "{m}"
        );
        let m = err(json!({"ipam": {"ranges": [[{"subnet": "10.0.0.0/24"}], []]}}));
        assert!(
            m.contains("invalid range set 1: ipam.ranges[1] is an empty range set"),
            "{m}"
        );
        let m = err(
            json!({"ipam": {"subnet": "10.0.0.0/16", "ranges": [[{"subnet": "10.0.5.0/24"}]]}}),
        );
        assert!(m.contains("range set 0 (ipam = 10.0.0.1-10.0.255.254) overlaps with range set 1 (ipam.ranges[0] = 10.0.5.1-10.0.5.254)"), "{m}");
        let m = err(json!({"ipam": {"subnet": "10.0.0.0/24", "routes": [{"dst": "10.0.0.0"}]}}));
        assert!(m.contains("ipam.routes[0].dst \"10.0.0.0\""), "{m}");
        let m = err(
            json!({"ipam": {"subnet": "10.0.0.0/24", "routes": [{"dst": "0.0.0.0/0", "gw": "x"}]}}),
        );
        assert!(m.contains("ipam.routes[0].gw \"x\""), "{m}");
        let m = err(
            json!({"ipam": {"subnet": "10.0.0.0/24"}, "args": {"cni": {"ips": ["10.0.0.5", "bad"]}}}),
        );
        assert!(
            m.contains("args.cni.ips[1] \"bad\": not an IP address"),
            "{m}"
        );
        let m =
            err(json!({"ipam": {"subnet": "10.0.0.0/24"}, "runtimeConfig": {"ips": ["1.2.3"]}}));
        assert!(m.contains("runtimeConfig.ips[0] \"1.2.3\""), "{m}");
        let e = load_with(
            json!({"ipam": {"subnet": "10.0.0.0/24"}}),
            Version::V1_0_0,
            Some("10.0.0.5,zz"),
        )
        .unwrap_err();
        assert_eq!(e.code, 7);
        assert!(e.msg.contains("CNI_ARGS IP \"zz\""), "{}", e.msg);
    }

    #[test]
    fn wrong_json_types_are_code_6_naming_the_path() {
        let e = load(json!({"ipam": {"ranges": [[{"subnet": 5}]]}})).unwrap_err();
        assert_eq!(e.code, 6);
        assert!(e.msg.contains("ipam.ranges[0][0].subnet"), "{}", e.msg);
    }

    #[test]
    fn two_rangesets_of_one_family_need_0_3_0() {
        let v =
            json!({"ipam": {"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "10.0.1.0/24"}]]}});
        for version in [Version::V0_1_0, Version::V0_2_0] {
            let e = load_with(v.clone(), version, None).unwrap_err();
            assert_eq!(e.code, 7);
            assert!(
                e.msg.contains("more than 1 address per family"),
                "{}",
                e.msg
            );
            assert!(
                e.msg.contains(&format!("{:?}", version.as_str())),
                "{}",
                e.msg
            );
        }
        for version in [Version::V0_3_0, Version::V0_4_0, Version::V1_1_0] {
            load_with(v.clone(), version, None).unwrap();
        }
        let dual = json!({"ipam": {"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "2001:db8::/64"}]]}});
        load_with(dual, Version::V0_2_0, None).unwrap();
    }

    #[test]
    fn requested_addresses_in_order_and_assigned_per_set() {
        let c = load_with(
            json!({
                "ipam": {"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "2001:db8::/64"}]]},
                "args": {"cni": {"ips": ["2001:db8::9/64"]}},
                "runtimeConfig": {"ips": ["10.0.0.7"]}
            }),
            Version::V1_0_0,
            Some("10.0.0.5"),
        )
        .unwrap();
        let ips: Vec<IpAddr> = c.requested.iter().map(|r| r.ip).collect();
        assert_eq!(ips, [ip("10.0.0.5"), ip("2001:db8::9"), ip("10.0.0.7")]);
        // 10.0.0.7 has no set left to go to.
        let e = c.assign_requested().unwrap_err();
        assert_eq!(e.code, 7);
        assert!(
            e.msg.contains("10.0.0.7 (runtimeConfig.ips[0])"),
            "{}",
            e.msg
        );

        let c = load_with(
            json!({"ipam": {"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "2001:db8::/64"}]]}}),
            Version::V1_0_0,
            Some("2001:db8::9,10.0.0.5,10.0.0.5"),
        )
        .unwrap();
        assert_eq!(c.requested.len(), 2);
        let plan: Vec<Option<IpAddr>> = c
            .assign_requested()
            .unwrap()
            .iter()
            .map(|r| r.map(|r| r.ip))
            .collect();
        assert_eq!(plan, [Some(ip("10.0.0.5")), Some(ip("2001:db8::9"))]);
    }

    /// containerd's go-cni sends ipRanges with Go's field names; any case is read, as in Go.
    #[test]
    fn keys_match_in_any_case_as_in_go() {
        for (subnet, start, end, gw, ips) in [
            ("Subnet", "RangeStart", "RangeEnd", "Gateway", "ips"),
            ("subnet", "rangestart", "rangeend", "gateway", "IPs"),
            ("SUBNET", "rangeSTART", "RangeEND", "GateWay", "Ips"),
        ] {
            let c = load(json!({
                "IPAM": {"Subnet": "10.1.0.0/24", "DataDir": "/tmp/x", "RANGES": [[{subnet: "10.2.0.0/24"}]]},
                "Args": {"CNI": {ips: ["10.9.0.4"]}},
                "RuntimeConfig": {
                    "ipRanges": [[{subnet: "10.9.0.0/24", start: "10.9.0.3", end: "10.9.0.9", gw: "10.9.0.1"}]],
                    "ips": ["10.9.0.5"]
                }
            }))
            .unwrap();
            assert_eq!(c.data_dir, PathBuf::from("/tmp/x"), "{subnet}");
            let sets: Vec<String> = c.rangesets.iter().map(|r| r.set.to_string()).collect();
            assert_eq!(
                sets,
                [
                    "10.9.0.3-10.9.0.9",
                    "10.1.0.1-10.1.0.254",
                    "10.2.0.1-10.2.0.254"
                ],
                "{subnet}"
            );
            assert_eq!(c.rangesets[0].set.ranges[0].gateway, ip("10.9.0.1"));
            let requested: Vec<IpAddr> = c.requested.iter().map(|r| r.ip).collect();
            assert_eq!(requested, [ip("10.9.0.4"), ip("10.9.0.5")], "{ips}");
        }
        // The exact key wins over a case variant, whatever the order.
        let c = load(json!({"ipam": {"subnet": "10.1.0.0/24", "dataDir": "/a", "DataDir": "/b"}}))
            .unwrap();
        assert_eq!(c.data_dir, PathBuf::from("/a"));
        let s = StoreConfig::load(&json!({"IPAM": {"DATADIR": "/c"}}), "n").unwrap();
        assert_eq!(s.data_dir, PathBuf::from("/c"));
    }

    #[test]
    fn requested_gateway_or_outside_address_is_refused() {
        let v = json!({"ipam": {"subnet": "10.0.0.0/24"}});
        let c = load_with(v.clone(), Version::V1_0_0, Some("10.0.0.1")).unwrap();
        let e = c.assign_requested().unwrap_err();
        assert!(
            e.msg.contains("10.0.0.1 (CNI_ARGS IP) is the gateway"),
            "{}",
            e.msg
        );
        let c = load_with(v, Version::V1_0_0, Some("10.9.0.1")).unwrap();
        let e = c.assign_requested().unwrap_err();
        assert!(e.msg.contains("10.9.0.1 (CNI_ARGS IP)"), "{}", e.msg);
    }

    #[test]
    fn del_and_gc_read_only_the_data_dir() {
        // Ranges that ADD would refuse, a missing range file: not read at all.
        let v = json!({"ipam": {"subnet": "10.0.0.5/24", "rangeFromFile": "/nonexistent/r.json",
            "ranges": [[{"subnet": "bad"}]], "dataDir": "/tmp/x"}});
        let c = StoreConfig::load(&v, "net1").unwrap();
        assert_eq!(c.network_dir(), PathBuf::from("/tmp/x/net1"));
        for v in [json!({}), json!({"ipam": {"dataDir": ""}})] {
            let c = StoreConfig::load(&v, "net1").unwrap();
            assert_eq!(c.network_dir(), PathBuf::from("/var/lib/cni/networks/net1"));
        }
        let (c, ignored) = StoreConfig::load_for_del(&json!({"ipam": {"dataDir": 5}}), "net1");
        assert_eq!(c.data_dir, PathBuf::from(DEFAULT_DATA_DIR));
        assert!(ignored[0].msg.contains("ipam.dataDir"), "{ignored:?}");
        let (c, ignored) = StoreConfig::load_for_del(&json!({"ipam": {"dataDir": "/x"}}), "net1");
        assert_eq!((c.data_dir, ignored), (PathBuf::from("/x"), vec![]));
        let e = StoreConfig::load(&json!({"ipam": {"dataDir": 5}}), "net1").unwrap_err();
        assert_eq!(e.code, 6);
        assert!(e.msg.contains("ipam.dataDir"), "{}", e.msg);
        let e = StoreConfig::load(&json!({"ipam": "x"}), "net1").unwrap_err();
        assert_eq!(e.code, 6);
    }

    #[test]
    fn range_from_file_is_used_when_nothing_else_is_set() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("range.json");
        std::fs::write(
            &f,
            r#"{"subnet": "10.5.0.0/24", "rangeStart": "10.5.0.100"}"#,
        )
        .unwrap();
        let c = load(json!({"ipam": {"rangeFromFile": f.to_str().unwrap()}})).unwrap();
        assert_eq!(c.rangesets[0].set.to_string(), "10.5.0.100-10.5.0.254");
        let m = err(json!({"ipam": {"rangeFromFile": "/nonexistent/r.json"}}));
        assert!(
            m.contains("ipam.rangeFromFile \"/nonexistent/r.json\""),
            "{m}"
        );
    }
}
