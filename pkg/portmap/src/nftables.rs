//! The nftables backend: the Go plugin's `cni_hostport` table, one in each family (`ip`, `ip6`).
//!
//! ```text
//! prerouting, output   nat hooks at -100: [conditions] fib daddr type local jump hostports_all
//! hostports_all        jump hostip_hostports; jump hostports
//! hostip_hostports     hostIP rules of older plugin versions, still read and removed
//! hostports            per mapping: mark hairpin traffic, then dnat to the container
//! masquerading         nat postrouting at 100: masquerade marked traffic, and 127.0.0.1 (IPv4)
//! ```
//!
//! Each container's rules carry its container ID as their comment: that is how DEL, with no
//! prevResult, finds exactly them, whichever implementation wrote them.

use crate::config::Config;
use cni_protocol::CniError;
use ipnetwork::IpNetwork;
use serde_json::Value;
use std::net::IpAddr;

pub const TABLE: &str = "cni_hostport";
pub const HOSTPORTS: &str = "hostports";
pub const HOSTIP_HOSTPORTS: &str = "hostip_hostports";
pub const HOSTPORTS_ALL: &str = "hostports_all";
pub const MASQUERADING: &str = "masquerading";
/// The chains that hold per-container rules.
pub const CONTAINER_CHAINS: [&str; 3] = [HOSTPORTS, HOSTIP_HOSTPORTS, MASQUERADING];
/// nftables refuses longer comments, and a rule's comment is its container ID.
pub const MAX_COMMENT_LEN: usize = 128;

/// The nftables family of an address: `ip` or `ip6`.
pub fn family(ip: IpAddr) -> &'static str {
    if ip.is_ipv4() {
        "ip"
    } else {
        "ip6"
    }
}

/// A rule of the table as `nft -j list table` reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct ListedRule {
    pub family: String,
    pub chain: String,
    pub handle: u64,
    pub comment: Option<String>,
    pub expr: Value,
}

impl ListedRule {
    fn owned_by(&self, container_id: &str) -> bool {
        self.comment.as_deref() == Some(container_id)
    }

    /// Whether one of the rule's statements is `{key: ...}` for which `f` holds.
    fn has_statement(&self, key: &str, f: impl Fn(&Value) -> bool) -> bool {
        self.expr
            .as_array()
            .is_some_and(|stmts| stmts.iter().filter_map(|s| s.get(key)).any(f))
    }

    fn matches_dport(&self, protocol: &str, port: u16) -> bool {
        self.has_statement("match", |m| {
            m["left"]["payload"]["protocol"] == protocol
                && m["left"]["payload"]["field"] == "dport"
                && m["right"] == port
        })
    }

    fn jumps_to(&self, chain: &str) -> bool {
        self.has_statement("jump", |j| j["target"] == chain)
    }
}

/// The rules in `nft -j list table <family> cni_hostport` output.
pub fn parse_listing(json: &str) -> Result<Vec<ListedRule>, CniError> {
    let v: Value = serde_json::from_str(json).map_err(|e| {
        CniError::io(format!(
            "nft -j list table cni_hostport: the output is not JSON: {e}"
        ))
    })?;
    let items = v["nftables"].as_array().cloned().unwrap_or_default();
    Ok(items
        .iter()
        .filter_map(|item| {
            let r = item.get("rule")?;
            Some(ListedRule {
                family: r["family"].as_str()?.to_string(),
                chain: r["chain"].as_str()?.to_string(),
                handle: r["handle"].as_u64()?,
                comment: r["comment"].as_str().map(str::to_string),
                expr: r["expr"].clone(),
            })
        })
        .collect())
}

/// `delete rule` lines for the container's rules among `listed`.
fn delete_lines(container_id: &str, listed: &[ListedRule]) -> String {
    listed
        .iter()
        .filter(|r| r.owned_by(container_id) && CONTAINER_CHAINS.contains(&r.chain.as_str()))
        .map(|r| {
            format!(
                "delete rule {} {TABLE} {} handle {}\n",
                r.family, r.chain, r.handle
            )
        })
        .collect()
}

fn ip_port(ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(v4) => format!("{v4}:{port}"),
        IpAddr::V6(v6) => format!("[{v6}]:{port}"),
    }
}

/// The script lines that forward the container's ports in the family of `addr`: the table's
/// structure (hook chains flushed and rewritten with this config's conditions), the removal
/// of rules an earlier ADD of the same container left (`listed`: the family's table as it
/// is), then the container's rules. Several families' lines make one transaction.
pub fn add_script(
    conf: &Config,
    container_id: &str,
    addr: IpNetwork,
    listed: &[ListedRule],
) -> Result<String, CniError> {
    if container_id.len() > MAX_COMMENT_LEN {
        return Err(CniError::invalid_config(format!(
            "the nftables backend marks rules with the container ID, and nftables comments hold at most {MAX_COMMENT_LEN} characters; container ID {container_id:?} has {}",
            container_id.len()
        )));
    }
    let ip = addr.ip();
    let fam = family(ip);
    let t = format!("{fam} {TABLE}");
    let conditions: String = conf
        .conditions(ip)
        .iter()
        .filter(|c| !c.is_empty())
        .map(|c| format!("{c} "))
        .collect();
    let comment = format!("comment \"{container_id}\"");

    let mut s = format!("add table {t} {{ comment \"CNI portmap plugin\" ; }}\n");
    for chain in [HOSTPORTS, HOSTIP_HOSTPORTS, HOSTPORTS_ALL] {
        s += &format!("add chain {t} {chain}\n");
    }
    s += &format!("flush chain {t} {HOSTPORTS_ALL}\n");
    s += &format!("add rule {t} {HOSTPORTS_ALL} jump {HOSTIP_HOSTPORTS}\n");
    s += &format!("add rule {t} {HOSTPORTS_ALL} jump {HOSTPORTS}\n");
    for (chain, hook) in [("prerouting", "prerouting"), ("output", "output")] {
        s += &format!("add chain {t} {chain} {{ type nat hook {hook} priority -100 ; }}\n");
        s += &format!("flush chain {t} {chain}\n");
        s += &format!(
            "add rule {t} {chain} {conditions}fib daddr type local jump {HOSTPORTS_ALL}\n"
        );
    }
    let mark = conf.mark_value().filter(|_| conf.snat);
    if mark.is_some() {
        s += &format!(
            "add chain {t} {MASQUERADING} {{ type nat hook postrouting priority 100 ; }}\n"
        );
    }
    s += &delete_lines(container_id, listed);

    let source = format!("{fam} saddr {}/{} ", addr.network(), addr.prefix());
    for m in conf.mappings.iter().filter(|m| m.applies_to(ip)) {
        let dst = m
            .host_dst()
            .map(|h| format!("{fam} daddr {h} "))
            .unwrap_or_default();
        let l4 = format!("{} dport {}", m.protocol.as_str(), m.host_port);
        if let Some(mark) = mark {
            // Hairpin traffic from the container's subnet (any source with masqAll).
            let src = if conf.masq_all { "" } else { source.as_str() };
            s += &format!(
                "add rule {t} {HOSTPORTS} {dst}{src}{l4} meta mark set meta mark or {mark:#x} {comment}\n"
            );
        }
        s += &format!(
            "add rule {t} {HOSTPORTS} {dst}{l4} dnat to {} {comment}\n",
            ip_port(ip, m.container_port)
        );
    }
    if let Some(mark) = mark {
        s += &format!(
            "add rule {t} {MASQUERADING} meta mark & {mark:#x} == {mark:#x} {fam} daddr {ip} masquerade {comment}\n"
        );
        if ip.is_ipv4() && !conf.masq_all {
            s += &format!(
                "add rule {t} {MASQUERADING} ip saddr 127.0.0.1 ip daddr {ip} masquerade {comment}\n"
            );
        }
    }
    Ok(s)
}

/// The script that removes the container's rules from the listed tables (both families at
/// once); None when none of them is there. Chains and hook rules stay: others use them.
pub fn del_script(container_id: &str, listed: &[ListedRule]) -> Option<String> {
    let lines = delete_lines(container_id, listed);
    (!lines.is_empty()).then_some(lines)
}

/// Whether the family's table (`listed`) holds every rule the container's mappings need; the
/// error names what is gone.
pub fn check(
    conf: &Config,
    container_id: &str,
    addr: IpNetwork,
    listed: &[ListedRule],
) -> Result<(), CniError> {
    let ip = addr.ip();
    let fam = family(ip);
    let missing =
        |what: String| CniError::internal(format!("{what} is missing from table {fam} {TABLE}"));
    for chain in ["prerouting", "output"] {
        if !listed
            .iter()
            .any(|r| r.chain == chain && r.jumps_to(HOSTPORTS_ALL))
        {
            return Err(missing(format!("the jump from {chain} to {HOSTPORTS_ALL}")));
        }
    }
    for chain in [HOSTPORTS, HOSTIP_HOSTPORTS] {
        if !listed
            .iter()
            .any(|r| r.chain == HOSTPORTS_ALL && r.jumps_to(chain))
        {
            return Err(missing(format!("the jump from {HOSTPORTS_ALL} to {chain}")));
        }
    }
    let own: Vec<&ListedRule> = listed.iter().filter(|r| r.owned_by(container_id)).collect();
    for m in conf.mappings.iter().filter(|m| m.applies_to(ip)) {
        let found = own.iter().any(|r| {
            (r.chain == HOSTPORTS || r.chain == HOSTIP_HOSTPORTS)
                && r.has_statement("dnat", |_| true)
                && r.matches_dport(m.protocol.as_str(), m.host_port)
        });
        if !found {
            return Err(missing(format!(
                "port mapping {m}: the dnat rule of container {container_id}"
            )));
        }
    }
    if conf.snat && conf.mark_value().is_some() {
        let want = if ip.is_ipv4() && !conf.masq_all { 2 } else { 1 };
        let have = own.iter().filter(|r| r.chain == MASQUERADING).count();
        if have < want {
            return Err(missing(format!(
                "a masquerading rule of container {container_id} ({have} of {want} found)"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Backend;
    use serde_json::json;

    const ID: &str = "icee6giejonei6so";

    fn conf(extra: Value) -> Config {
        let mut v = json!({"name": "test", "backend": "nftables", "runtimeConfig": {"portMappings": [
            {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"},
            {"hostPort": 8083, "containerPort": 83, "protocol": "tcp", "hostIP": "192.168.0.2"},
            {"hostPort": 8084, "containerPort": 84, "protocol": "tcp", "hostIP": "0.0.0.0"},
            {"hostPort": 8085, "containerPort": 85, "protocol": "udp", "hostIP": "2001:db8:a::1"},
        ]}});
        for (k, val) in extra.as_object().unwrap() {
            v[k] = val.clone();
        }
        Config::parse(&v, "test", || Backend::Nftables).unwrap()
    }

    fn v4() -> IpNetwork {
        "10.0.0.2/24".parse().unwrap()
    }

    fn v6() -> IpNetwork {
        "2001:db8::2/64".parse().unwrap()
    }

    #[test]
    fn add_writes_the_table_and_the_containers_rules() {
        let s = add_script(&conf(json!({"conditionsV4": ["a", "b"]})), ID, v4(), &[]).unwrap();
        let want = r#"add table ip cni_hostport { comment "CNI portmap plugin" ; }
add chain ip cni_hostport hostports
add chain ip cni_hostport hostip_hostports
add chain ip cni_hostport hostports_all
flush chain ip cni_hostport hostports_all
add rule ip cni_hostport hostports_all jump hostip_hostports
add rule ip cni_hostport hostports_all jump hostports
add chain ip cni_hostport prerouting { type nat hook prerouting priority -100 ; }
flush chain ip cni_hostport prerouting
add rule ip cni_hostport prerouting a b fib daddr type local jump hostports_all
add chain ip cni_hostport output { type nat hook output priority -100 ; }
flush chain ip cni_hostport output
add rule ip cni_hostport output a b fib daddr type local jump hostports_all
add chain ip cni_hostport masquerading { type nat hook postrouting priority 100 ; }
add rule ip cni_hostport hostports ip saddr 10.0.0.0/24 tcp dport 8080 meta mark set meta mark or 0x2000 comment "icee6giejonei6so"
add rule ip cni_hostport hostports tcp dport 8080 dnat to 10.0.0.2:80 comment "icee6giejonei6so"
add rule ip cni_hostport hostports ip daddr 192.168.0.2 ip saddr 10.0.0.0/24 tcp dport 8083 meta mark set meta mark or 0x2000 comment "icee6giejonei6so"
add rule ip cni_hostport hostports ip daddr 192.168.0.2 tcp dport 8083 dnat to 10.0.0.2:83 comment "icee6giejonei6so"
add rule ip cni_hostport hostports ip saddr 10.0.0.0/24 tcp dport 8084 meta mark set meta mark or 0x2000 comment "icee6giejonei6so"
add rule ip cni_hostport hostports tcp dport 8084 dnat to 10.0.0.2:84 comment "icee6giejonei6so"
add rule ip cni_hostport masquerading meta mark & 0x2000 == 0x2000 ip daddr 10.0.0.2 masquerade comment "icee6giejonei6so"
add rule ip cni_hostport masquerading ip saddr 127.0.0.1 ip daddr 10.0.0.2 masquerade comment "icee6giejonei6so"
"#;
        assert_eq!(s, want);
    }

    #[test]
    fn ipv6_without_snat_has_only_dnat_rules() {
        let s = add_script(
            &conf(json!({"snat": false, "conditionsV6": ["c"]})),
            ID,
            v6(),
            &[],
        )
        .unwrap();
        assert!(s.contains(
            "add rule ip6 cni_hostport prerouting c fib daddr type local jump hostports_all\n"
        ));
        assert!(s.contains("add rule ip6 cni_hostport hostports ip6 daddr 2001:db8:a::1 udp dport 8085 dnat to [2001:db8::2]:85 comment \"icee6giejonei6so\"\n"));
        assert!(s.contains(
            "add rule ip6 cni_hostport hostports tcp dport 8080 dnat to [2001:db8::2]:80"
        ));
        assert!(!s.contains("8083") && !s.contains("8084"), "{s}");
        assert!(!s.contains("masquerad") && !s.contains("mark"), "{s}");
    }

    #[test]
    fn masq_all_marks_any_source_and_needs_no_localhost_rule() {
        let s = add_script(
            &conf(json!({"masqAll": true, "markMasqBit": 4})),
            ID,
            v4(),
            &[],
        )
        .unwrap();
        assert!(s.contains("hostports tcp dport 8080 meta mark set meta mark or 0x10 comment"));
        assert!(s.contains("masquerading meta mark & 0x10 == 0x10 ip daddr 10.0.0.2 masquerade"));
        assert!(!s.contains("127.0.0.1") && !s.contains("saddr"), "{s}");
    }

    #[test]
    fn long_container_ids_do_not_fit_a_comment() {
        let e = add_script(&conf(json!({})), &"a".repeat(129), v4(), &[]).unwrap_err();
        assert_eq!(e.code, cni_protocol::error::INVALID_NETWORK_CONFIG);
        add_script(&conf(json!({})), &"a".repeat(128), v4(), &[]).unwrap();
    }

    fn listing() -> String {
        json!({"nftables": [
            {"metainfo": {"version": "1.0.6"}},
            {"table": {"family": "ip", "name": "cni_hostport", "handle": 2}},
            {"chain": {"family": "ip", "table": "cni_hostport", "name": "hostports", "handle": 1}},
            {"rule": {"family": "ip", "table": "cni_hostport", "chain": "prerouting", "handle": 3,
                      "expr": [{"jump": {"target": "hostports_all"}}]}},
            {"rule": {"family": "ip", "table": "cni_hostport", "chain": "output", "handle": 4,
                      "expr": [{"jump": {"target": "hostports_all"}}]}},
            {"rule": {"family": "ip", "table": "cni_hostport", "chain": "hostports_all", "handle": 5,
                      "expr": [{"jump": {"target": "hostip_hostports"}}]}},
            {"rule": {"family": "ip", "table": "cni_hostport", "chain": "hostports_all", "handle": 6,
                      "expr": [{"jump": {"target": "hostports"}}]}},
            {"rule": {"family": "ip", "table": "cni_hostport", "chain": "hostports", "handle": 11, "comment": ID,
                      "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 8080}},
                               {"dnat": {"addr": "10.0.0.2", "port": 80}}]}},
            {"rule": {"family": "ip", "table": "cni_hostport", "chain": "hostip_hostports", "handle": 12, "comment": ID,
                      "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 8083}},
                               {"dnat": {"addr": "10.0.0.2", "port": 83}}]}},
            {"rule": {"family": "ip", "table": "cni_hostport", "chain": "hostports", "handle": 13, "comment": "other",
                      "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 8084}},
                               {"dnat": {"addr": "10.0.0.9", "port": 84}}]}},
            {"rule": {"family": "ip", "table": "cni_hostport", "chain": "masquerading", "handle": 14, "comment": ID,
                      "expr": [{"masquerade": null}]}},
            {"rule": {"family": "ip", "table": "cni_hostport", "chain": "prerouting", "handle": 15, "comment": ID,
                      "expr": []}},
        ]})
        .to_string()
    }

    #[test]
    fn the_listing_gives_rules_with_handles_and_comments() {
        let rules = parse_listing(&listing()).unwrap();
        assert_eq!(rules.len(), 9);
        assert_eq!(rules[4].handle, 11);
        assert_eq!(rules[4].comment.as_deref(), Some(ID));
        assert!(rules[4].matches_dport("tcp", 8080) && !rules[4].matches_dport("udp", 8080));
        assert!(parse_listing("{}").unwrap().is_empty());
        assert!(parse_listing("not json").is_err());
    }

    #[test]
    fn del_removes_the_containers_rules_in_its_chains_only() {
        let rules = parse_listing(&listing()).unwrap();
        assert_eq!(
            del_script(ID, &rules).unwrap(),
            "delete rule ip cni_hostport hostports handle 11\n\
             delete rule ip cni_hostport hostip_hostports handle 12\n\
             delete rule ip cni_hostport masquerading handle 14\n"
        );
        assert_eq!(del_script("gone", &rules), None);
        assert_eq!(del_script(ID, &[]), None);
    }

    #[test]
    fn a_second_add_replaces_the_rules_of_the_first() {
        let rules = parse_listing(&listing()).unwrap();
        let s = add_script(&conf(json!({})), ID, v4(), &rules).unwrap();
        let delete_at = s
            .find("delete rule ip cni_hostport hostports handle 11")
            .unwrap();
        assert!(delete_at < s.find("dnat to").unwrap());
        assert!(!s.contains("handle 13"));
    }

    #[test]
    fn check_finds_each_mapping_and_names_the_missing_one() {
        let rules = parse_listing(&listing()).unwrap();
        let only = |maps: Value, snat: bool| {
            Config::parse(
                &json!({"snat": snat, "runtimeConfig": {"portMappings": maps}}),
                "test",
                || Backend::Nftables,
            )
            .unwrap()
        };
        let c = only(
            json!([{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"},
                            {"hostPort": 8083, "containerPort": 83, "protocol": "tcp", "hostIP": "192.168.0.2"}]),
            false,
        );
        check(&c, ID, v4(), &rules).unwrap();
        let c = only(
            json!([{"hostPort": 8084, "containerPort": 84, "protocol": "tcp"}]),
            false,
        );
        let e = check(&c, ID, v4(), &rules).unwrap_err();
        assert!(e.msg.contains("hostPort 8084"), "{}", e.msg);
        let c = only(
            json!([{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]),
            true,
        );
        let e = check(&c, ID, v4(), &rules).unwrap_err();
        assert!(e.msg.contains("1 of 2"), "{}", e.msg);
        check(&c, ID, v6(), &rules).unwrap();
        let without_hooks: Vec<ListedRule> = rules
            .iter()
            .filter(|r| r.chain != "output")
            .cloned()
            .collect();
        let e = check(&c, ID, v6(), &without_hooks).unwrap_err();
        assert!(e.msg.contains("from output"), "{}", e.msg);
    }
}
