//! The iptables backend: the Go plugin's chains in the nat table.
//!
//! ```text
//! PREROUTING, OUTPUT      -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
//! CNI-HOSTPORT-DNAT       per container and protocol: multiport (15 ports a rule) -j CNI-DN-<hash>,
//!                         commented `dnat name: "<network>" id: "<container>"`
//! CNI-DN-<hash>           per mapping: hairpin and localhost traffic -j CNI-HOSTPORT-SETMARK,
//!                         then -j DNAT to the container
//! CNI-HOSTPORT-SETMARK    sets the masquerade mark
//! POSTROUTING (first)     -j CNI-HOSTPORT-MASQ, which masquerades marked packets
//! ```
//!
//! Every rule is written in the form `iptables-save` prints it, so that what the table holds
//! compares line by line with what a container needs: ADD adds only the shared rules that are
//! missing, CHECK names the rule that is gone, DEL deletes what it finds by chain name.

use crate::config::{Config, MarkChain, Protocol};
use crate::names;
use cni_protocol::CniError;
use fwnames::{restore_token, save_quote};
use ipnetwork::IpNetwork;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

pub const TOP_DNAT_CHAIN: &str = "CNI-HOSTPORT-DNAT";
pub const SETMARK_CHAIN: &str = "CNI-HOSTPORT-SETMARK";
pub const MASQ_CHAIN: &str = "CNI-HOSTPORT-MASQ";
/// Jumped to by old plugin versions' per-container SNAT chains.
pub const OLD_TOP_SNAT_CHAIN: &str = "CNI-HOSTPORT-SNAT";
/// The multiport match takes at most 15 ports.
const MULTIPORT_MAX: usize = 15;

/// The nat table as `iptables-save -t nat` prints it.
#[derive(Debug, Default, Clone)]
pub struct NatTable {
    chains: BTreeSet<String>,
    /// (chain, rule after `-A <chain> `), in order.
    rules: Vec<(String, String)>,
}

impl NatTable {
    pub fn parse(save: &str) -> NatTable {
        let mut table = NatTable::default();
        let mut in_nat = false;
        for line in save.lines().map(str::trim_end) {
            if let Some(name) = line.strip_prefix('*') {
                in_nat = name == "nat";
            } else if !in_nat {
                continue;
            } else if let Some(decl) = line.strip_prefix(':') {
                if let Some(chain) = decl.split_whitespace().next() {
                    table.chains.insert(chain.to_string());
                }
            } else if let Some(rule) = line.strip_prefix("-A ") {
                let (chain, spec) = rule.split_once(' ').unwrap_or((rule, ""));
                table.rules.push((chain.to_string(), spec.to_string()));
            }
        }
        table
    }

    pub fn has_chain(&self, chain: &str) -> bool {
        self.chains.contains(chain)
    }

    pub fn has_rule(&self, chain: &str, spec: &str) -> bool {
        self.rules.iter().any(|(c, s)| c == chain && s == spec)
    }

    /// The rules of other chains that jump to `target`.
    fn jumps_to<'a>(&'a self, target: &'a str) -> impl Iterator<Item = &'a (String, String)> {
        self.rules
            .iter()
            .filter(move |(chain, spec)| chain != target && jumps(spec, target))
    }
}

fn jumps(spec: &str, target: &str) -> bool {
    spec.strip_suffix(target)
        .is_some_and(|head| head == "-j " || head.ends_with(" -j "))
}

fn host_prefix(ip: IpAddr) -> u8 {
    if ip.is_ipv4() {
        32
    } else {
        128
    }
}

/// `a.b.c.d:port` or `[v6]:port`, as DNAT --to-destination takes it.
fn ip_port(ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(v4) => format!("{v4}:{port}"),
        IpAddr::V6(v6) => format!("[{v6}]:{port}"),
    }
}

/// A rule of a shared chain.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SharedRule {
    chain: &'static str,
    spec: String,
    /// Inserted at the top: the masquerade jump must come before the bridge and ptp plugins'
    /// own masquerading rules in POSTROUTING.
    first: bool,
}

/// A rule of CNI-HOSTPORT-DNAT that leads one protocol's ports to the per-container chain.
#[derive(Debug, Clone, PartialEq, Eq)]
struct EntryRule {
    spec: String,
    protocol: Protocol,
    ports: String,
}

/// Everything one container's mappings need in one family.
#[derive(Debug)]
struct Plan {
    dnat_chain: String,
    /// The per-container chain's rules, each with the index of the mapping it serves.
    dnat_rules: Vec<(usize, String)>,
    entry_rules: Vec<EntryRule>,
    /// Entry rules carrying user conditions, whose printed form iptables decides.
    conditioned: bool,
    shared_chains: Vec<&'static str>,
    shared_rules: Vec<SharedRule>,
}

fn plan(conf: &Config, container_id: &str, addr: IpNetwork) -> Plan {
    let dnat_chain = names::dnat_chain(&conf.network, container_id);
    let conditions = entry_conditions(conf, addr.ip());
    let (shared_chains, shared_rules) = shared_chains_and_rules(conf);
    Plan {
        dnat_rules: dnat_rules(conf, addr),
        entry_rules: entry_rules(conf, container_id, &dnat_chain, &conditions),
        dnat_chain,
        conditioned: !conditions.is_empty(),
        shared_chains,
        shared_rules,
    }
}

/// The per-container chain's rules for the mappings of `addr`'s family: hairpin and localhost
/// traffic marked for masquerading when `snat` is on, then the DNAT to the container.
fn dnat_rules(conf: &Config, addr: IpNetwork) -> Vec<(usize, String)> {
    let ip = addr.ip();
    let mark_target = match &conf.mark {
        MarkChain::Own { .. } => SETMARK_CHAIN,
        MarkChain::External(chain) => chain.as_str(),
    };
    let source = format!("-s {}/{} ", addr.network(), addr.prefix());

    let mut dnat_rules = Vec::new();
    for (i, m) in conf.mappings.iter().enumerate() {
        if !m.applies_to(ip) {
            continue;
        }
        let dst = m
            .host_dst()
            .map(|h| format!("-d {h}/{} ", host_prefix(h)))
            .unwrap_or_default();
        let proto = m.protocol.as_str();
        let l4 = format!("-p {proto} -m {proto} --dport {}", m.host_port);
        if conf.snat {
            // Hairpin traffic from the container's subnet (any source with masqAll).
            let src = if conf.masq_all { "" } else { source.as_str() };
            dnat_rules.push((i, format!("{src}{dst}{l4} -j {mark_target}")));
            if ip.is_ipv4() && !conf.masq_all {
                dnat_rules.push((i, format!("-s 127.0.0.1/32 {dst}{l4} -j {mark_target}")));
            }
        }
        dnat_rules.push((
            i,
            format!(
                "{dst}{l4} -j DNAT --to-destination {}",
                ip_port(ip, m.container_port)
            ),
        ));
    }
    dnat_rules
}

/// The user's conditions for `ip`'s family, each a token of the entry rules, in their order.
fn entry_conditions(conf: &Config, ip: IpAddr) -> String {
    conf.conditions(ip)
        .iter()
        .filter(|c| !c.is_empty())
        .map(|c| format!(" {}", restore_token(c)))
        .collect()
}

/// CNI-HOSTPORT-DNAT's rules for the container: one per protocol and 15 ports, jumping to its
/// chain.
fn entry_rules(
    conf: &Config,
    container_id: &str,
    dnat_chain: &str,
    conditions: &str,
) -> Vec<EntryRule> {
    // Every mapping's host port goes into the multiport list, whatever its hostIP's family, as
    // in the Go plugin: the per-container chain decides.
    let mut by_protocol: BTreeMap<Protocol, Vec<String>> = BTreeMap::new();
    for m in &conf.mappings {
        by_protocol
            .entry(m.protocol)
            .or_default()
            .push(m.host_port.to_string());
    }
    let comment = save_quote(&names::dnat_comment(&conf.network, container_id));
    let mut entry_rules = Vec::new();
    for (protocol, ports) in by_protocol {
        for chunk in ports.chunks(MULTIPORT_MAX) {
            let ports = chunk.join(",");
            let proto = protocol.as_str();
            entry_rules.push(EntryRule {
                spec: format!(
                    "-p {proto} -m comment --comment {comment} -m multiport --dports {ports}{conditions} -j {dnat_chain}"
                ),
                protocol,
                ports,
            });
        }
    }
    entry_rules
}

/// The chains every container shares, and their rules: the DNAT entry from PREROUTING and
/// OUTPUT, and with `snat` the mark and masquerade chains.
fn shared_chains_and_rules(conf: &Config) -> (Vec<&'static str>, Vec<SharedRule>) {
    let mut shared_chains = vec![TOP_DNAT_CHAIN];
    let mut shared_rules = Vec::new();
    if let (true, Some(mark)) = (conf.snat, conf.mark_value()) {
        let mark = format!("{mark:#x}/{mark:#x}");
        shared_chains.extend([SETMARK_CHAIN, MASQ_CHAIN]);
        shared_rules.extend([
            SharedRule {
                chain: SETMARK_CHAIN,
                spec: format!(
                    "-m comment --comment \"CNI portfwd masquerade mark\" -j MARK --set-xmark {mark}"
                ),
                first: false,
            },
            SharedRule {
                chain: MASQ_CHAIN,
                spec: format!("-m mark --mark {mark} -j MASQUERADE"),
                first: false,
            },
            SharedRule {
                chain: "POSTROUTING",
                spec: format!(
                    "-m comment --comment \"CNI portfwd requiring masquerade\" -j {MASQ_CHAIN}"
                ),
                first: true,
            },
        ]);
    }
    for chain in ["PREROUTING", "OUTPUT"] {
        shared_rules.push(SharedRule {
            chain,
            spec: format!("-m addrtype --dst-type LOCAL -j {TOP_DNAT_CHAIN}"),
            first: false,
        });
    }
    (shared_chains, shared_rules)
}

/// The `iptables-restore --noflush` document that forwards the container's ports in the family
/// of `addr`, given the nat table as it is: missing shared chains and rules are added, the
/// container's own chain is (re)written, and its old entry rules are replaced.
pub fn add_document(
    conf: &Config,
    container_id: &str,
    addr: IpNetwork,
    current: &NatTable,
) -> String {
    let plan = plan(conf, container_id, addr);
    let dn = &plan.dnat_chain;
    let mut doc = String::from("*nat\n");
    for chain in &plan.shared_chains {
        if !current.has_chain(chain) {
            doc += &format!(":{chain} - [0:0]\n");
        }
    }
    // Declaring the chain creates it, or empties it when it exists.
    doc += &format!(":{dn} - [0:0]\n");
    for rule in &plan.shared_rules {
        if !current.has_rule(rule.chain, &rule.spec) {
            doc += &match rule.first {
                true => format!("-I {} 1 {}\n", rule.chain, rule.spec),
                false => format!("-A {} {}\n", rule.chain, rule.spec),
            };
        }
    }
    for (chain, spec) in current.jumps_to(dn) {
        doc += &format!("-D {chain} {spec}\n");
    }
    for (_, rule) in &plan.dnat_rules {
        doc += &format!("-A {dn} {rule}\n");
    }
    for entry in &plan.entry_rules {
        doc += &format!("-A {TOP_DNAT_CHAIN} {}\n", entry.spec);
    }
    doc += "COMMIT\n";
    doc
}

/// The document that removes one container's rules from a family's nat table, found by the
/// chain names its network name and container ID hash to; None when nothing of it is there.
/// Shared chains and their jumps stay: other containers use them.
pub fn del_document(network: &str, container_id: &str, current: &NatTable) -> Option<String> {
    let mut body = String::new();
    for own in [
        names::dnat_chain(network, container_id),
        names::old_snat_chain(network, container_id),
    ] {
        if !current.has_chain(&own) {
            continue;
        }
        for (chain, spec) in current.jumps_to(&own) {
            body += &format!("-D {chain} {spec}\n");
        }
        body += &format!("-F {own}\n-X {own}\n");
    }
    (!body.is_empty()).then(|| format!("*nat\n{body}COMMIT\n"))
}

fn missing(what: String) -> CniError {
    CniError::internal(what)
}

/// Whether the nat table holds every rule the container's mappings need in the family of `addr`;
/// the error names the first rule that is gone.
pub fn check(
    conf: &Config,
    container_id: &str,
    addr: IpNetwork,
    current: &NatTable,
) -> Result<(), CniError> {
    let plan = plan(conf, container_id, addr);
    let dn = &plan.dnat_chain;
    if !current.has_chain(dn) {
        return Err(missing(format!(
            "chain {dn} of container {container_id} on network {:?} is missing from the nat table",
            conf.network
        )));
    }
    for (i, rule) in &plan.dnat_rules {
        if !current.has_rule(dn, rule) {
            return Err(missing(format!(
                "port mapping {}: rule \"-A {dn} {rule}\" is missing from the nat table",
                conf.mappings[*i]
            )));
        }
    }
    for entry in &plan.entry_rules {
        let present = if plan.conditioned {
            let proto = format!("-p {} ", entry.protocol.as_str());
            let ports = format!("--dports {} ", entry.ports);
            current.jumps_to(dn).any(|(chain, spec)| {
                chain == TOP_DNAT_CHAIN && spec.contains(&proto) && spec.contains(&ports)
            })
        } else {
            current.has_rule(TOP_DNAT_CHAIN, &entry.spec)
        };
        if !present {
            return Err(missing(format!(
                "{} ports {}: the rule of {TOP_DNAT_CHAIN} that jumps to {dn} is missing from the nat table",
                entry.protocol.as_str(),
                entry.ports
            )));
        }
    }
    for rule in &plan.shared_rules {
        if !current.has_rule(rule.chain, &rule.spec) {
            return Err(missing(format!(
                "shared rule \"-A {} {}\" is missing from the nat table",
                rule.chain, rule.spec
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Backend;
    use serde_json::{json, Value};

    const ID: &str = "ctr1";
    const DN: &str = "CNI-DN-3a53437c165fe05c780a9"; // sha512("testctr1")

    fn conf(extra: Value) -> Config {
        let mut v = json!({"name": "test", "runtimeConfig": {"portMappings": [
            {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"},
            {"hostPort": 8081, "containerPort": 81, "protocol": "tcp", "hostIP": "192.168.0.2"},
            {"hostPort": 5353, "containerPort": 53, "protocol": "udp"},
            {"hostPort": 8082, "containerPort": 82, "protocol": "tcp", "hostIP": "2001:db8:a::1"},
        ]}});
        for (k, val) in extra.as_object().unwrap() {
            v[k] = val.clone();
        }
        Config::parse(&v, "test", || Backend::Iptables).unwrap()
    }

    fn v4() -> IpNetwork {
        "10.88.0.2/24".parse().unwrap()
    }

    fn v6() -> IpNetwork {
        "2001:db8::2/64".parse().unwrap()
    }

    #[test]
    fn the_chain_name_is_the_hash_of_network_and_container() {
        assert_eq!(names::dnat_chain("test", ID), DN);
    }

    #[test]
    fn add_into_an_empty_table_writes_everything_in_save_form() {
        let doc = add_document(&conf(json!({})), ID, v4(), &NatTable::default());
        let want = format!(
            r#"*nat
:CNI-HOSTPORT-DNAT - [0:0]
:CNI-HOSTPORT-SETMARK - [0:0]
:CNI-HOSTPORT-MASQ - [0:0]
:{DN} - [0:0]
-A CNI-HOSTPORT-SETMARK -m comment --comment "CNI portfwd masquerade mark" -j MARK --set-xmark 0x2000/0x2000
-A CNI-HOSTPORT-MASQ -m mark --mark 0x2000/0x2000 -j MASQUERADE
-I POSTROUTING 1 -m comment --comment "CNI portfwd requiring masquerade" -j CNI-HOSTPORT-MASQ
-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A OUTPUT -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A {DN} -s 10.88.0.0/24 -p tcp -m tcp --dport 8080 -j CNI-HOSTPORT-SETMARK
-A {DN} -s 127.0.0.1/32 -p tcp -m tcp --dport 8080 -j CNI-HOSTPORT-SETMARK
-A {DN} -p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.88.0.2:80
-A {DN} -s 10.88.0.0/24 -d 192.168.0.2/32 -p tcp -m tcp --dport 8081 -j CNI-HOSTPORT-SETMARK
-A {DN} -s 127.0.0.1/32 -d 192.168.0.2/32 -p tcp -m tcp --dport 8081 -j CNI-HOSTPORT-SETMARK
-A {DN} -d 192.168.0.2/32 -p tcp -m tcp --dport 8081 -j DNAT --to-destination 10.88.0.2:81
-A {DN} -s 10.88.0.0/24 -p udp -m udp --dport 5353 -j CNI-HOSTPORT-SETMARK
-A {DN} -s 127.0.0.1/32 -p udp -m udp --dport 5353 -j CNI-HOSTPORT-SETMARK
-A {DN} -p udp -m udp --dport 5353 -j DNAT --to-destination 10.88.0.2:53
-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"test\" id: \"ctr1\"" -m multiport --dports 8080,8081,8082 -j {DN}
-A CNI-HOSTPORT-DNAT -p udp -m comment --comment "dnat name: \"test\" id: \"ctr1\"" -m multiport --dports 5353 -j {DN}
COMMIT
"#
        );
        assert_eq!(doc, want);
    }

    #[test]
    fn ipv6_has_no_localhost_rule_and_brackets_the_destination() {
        let doc = add_document(&conf(json!({})), ID, v6(), &NatTable::default());
        assert!(doc.contains(&format!(
            "-A {DN} -s 2001:db8::/64 -d 2001:db8:a::1/128 -p tcp -m tcp --dport 8082 -j CNI-HOSTPORT-SETMARK\n"
        )));
        assert!(doc.contains(&format!(
            "-A {DN} -d 2001:db8:a::1/128 -p tcp -m tcp --dport 8082 -j DNAT --to-destination [2001:db8::2]:82\n"
        )));
        assert!(!doc.contains("127.0.0.1"));
        // The IPv4 hostIP mapping is not forwarded over IPv6.
        assert!(!doc.contains("--dport 8081 "));
        assert!(doc.contains("--dport 8080 -j DNAT --to-destination [2001:db8::2]:80\n"));
    }

    #[test]
    fn what_exists_is_not_added_again_and_old_entry_rules_are_replaced() {
        let first = add_document(&conf(json!({})), ID, v4(), &NatTable::default());
        // The table after the first ADD, as iptables-save prints it.
        let mut save = String::from(
            "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n",
        );
        for line in first.lines() {
            if let Some(decl) = line.strip_prefix(':') {
                save += &format!(":{decl}\n");
            } else if let Some(rest) = line.strip_prefix("-I POSTROUTING 1 ") {
                save += &format!("-A POSTROUTING {rest}\n");
            } else if line.starts_with("-A ") {
                save += &format!("{line}\n");
            }
        }
        save += "COMMIT\n";
        let table = NatTable::parse(&save);
        let again = add_document(&conf(json!({})), ID, v4(), &table);
        assert!(!again.contains(":CNI-HOSTPORT"));
        assert!(!again.contains("-A CNI-HOSTPORT-SETMARK"));
        assert!(!again.contains("-A PREROUTING") && !again.contains("-I POSTROUTING"));
        assert!(again.contains(&format!(":{DN} - [0:0]\n")));
        assert!(again.contains(&format!(
            "-D CNI-HOSTPORT-DNAT -p tcp -m comment --comment \"dnat name: \\\"test\\\" id: \\\"ctr1\\\"\" -m multiport --dports 8080,8081,8082 -j {DN}\n"
        )));
        assert_eq!(again.matches("-A CNI-HOSTPORT-DNAT ").count(), 2);
        check(&conf(json!({})), ID, v4(), &table).unwrap();
    }

    #[test]
    fn snat_off_writes_no_mark_rules_and_no_shared_masquerade() {
        let doc = add_document(
            &conf(json!({"snat": false})),
            ID,
            v4(),
            &NatTable::default(),
        );
        assert!(!doc.contains("SETMARK") && !doc.contains("MASQ"), "{doc}");
        assert_eq!(doc.matches(&format!("-A {DN} ")).count(), 3);
    }

    #[test]
    fn masq_all_marks_every_source_and_drops_the_localhost_rule() {
        let doc = add_document(
            &conf(json!({"masqAll": true})),
            ID,
            v4(),
            &NatTable::default(),
        );
        assert!(doc.contains(&format!(
            "-A {DN} -p tcp -m tcp --dport 8080 -j CNI-HOSTPORT-SETMARK\n"
        )));
        assert!(
            !doc.contains("127.0.0.1") && !doc.contains("-s 10.88"),
            "{doc}"
        );
    }

    #[test]
    fn the_mark_bit_sets_the_mark_value() {
        let doc = add_document(
            &conf(json!({"markMasqBit": 5})),
            ID,
            v4(),
            &NatTable::default(),
        );
        assert!(doc.contains("-j MARK --set-xmark 0x20/0x20\n"));
        assert!(doc.contains("-m mark --mark 0x20/0x20 -j MASQUERADE\n"));
        let doc = add_document(
            &conf(json!({"markMasqBit": 0})),
            ID,
            v4(),
            &NatTable::default(),
        );
        assert!(doc.contains("--set-xmark 0x1/0x1\n"));
    }

    #[test]
    fn an_external_mark_chain_replaces_the_own_chains() {
        let c = conf(json!({"externalSetMarkChain": "KUBE-MARK-MASQ"}));
        let doc = add_document(&c, ID, v4(), &NatTable::default());
        assert!(!doc.contains("CNI-HOSTPORT-SETMARK") && !doc.contains("CNI-HOSTPORT-MASQ"));
        assert!(doc.contains(&format!(
            "-A {DN} -s 10.88.0.0/24 -p tcp -m tcp --dport 8080 -j KUBE-MARK-MASQ\n"
        )));
    }

    #[test]
    fn conditions_of_the_family_end_the_entry_rules() {
        let c = conf(
            json!({"conditionsV4": ["-s", "192.0.2.0/24", "-m", "comment", "--comment", "a b"],
                            "conditionsV6": ["!", "-s", "fd00::/8"]}),
        );
        let doc = add_document(&c, ID, v4(), &NatTable::default());
        assert!(doc.contains(&format!(
            "--dports 5353 -s 192.0.2.0/24 -m comment --comment \"a b\" -j {DN}\n"
        )));
        let doc = add_document(&c, ID, v6(), &NatTable::default());
        assert!(doc.contains(&format!("--dports 5353 ! -s fd00::/8 -j {DN}\n")));
    }

    #[test]
    fn more_than_fifteen_ports_are_split() {
        let maps: Vec<Value> = (1..=20)
            .map(|p| json!({"hostPort": 1000 + p, "containerPort": p, "protocol": "sctp"}))
            .collect();
        let v = json!({"runtimeConfig": {"portMappings": maps}});
        let c = Config::parse(&v, "test", || Backend::Iptables).unwrap();
        let doc = add_document(&c, ID, v4(), &NatTable::default());
        let entries: Vec<&str> = doc
            .lines()
            .filter(|l| l.starts_with("-A CNI-HOSTPORT-DNAT"))
            .collect();
        assert_eq!(entries.len(), 2);
        assert!(entries[0].contains(
            "--dports 1001,1002,1003,1004,1005,1006,1007,1008,1009,1010,1011,1012,1013,1014,1015 "
        ));
        assert!(entries[1].contains("--dports 1016,1017,1018,1019,1020 "));
        assert!(
            doc.contains("-p sctp -m sctp --dport 1020 -j DNAT --to-destination 10.88.0.2:20\n")
        );
    }

    const SAVE: &str = r#"# Generated by iptables-save
*filter
:INPUT ACCEPT [0:0]
-A INPUT -j CNI-DN-3a53437c165fe05c780a9
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CNI-DN-3a53437c165fe05c780a9 - [0:0]
:CNI-DN-othercontainer12345 - [0:0]
:CNI-HOSTPORT-DNAT - [0:0]
-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A CNI-DN-3a53437c165fe05c780a9 -p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.88.0.2:80
-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"test\" id: \"ctr1\"" -m multiport --dports 8080 -j CNI-DN-3a53437c165fe05c780a9
-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"test\" id: \"ctr2\"" -m multiport --dports 8080 -j CNI-DN-othercontainer12345
-A CNI-HOSTPORT-DNAT -s 1.2.3.4/32 -p udp -m comment --comment "dnat name: \"test\" id: \"ctr1\"" -m multiport --dports 53 -j CNI-DN-3a53437c165fe05c780a9
COMMIT
"#;

    #[test]
    fn the_table_is_read_from_save_output_nat_only() {
        let t = NatTable::parse(SAVE);
        assert!(t.has_chain(DN) && t.has_chain("PREROUTING") && !t.has_chain("INPUT"));
        assert_eq!(t.jumps_to(DN).count(), 2);
        assert!(t.has_rule(
            "PREROUTING",
            "-m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT"
        ));
        assert!(jumps("-j X", "X") && jumps("-p tcp -j X", "X"));
        assert!(!jumps("-p tcp -j XY", "Y") && !jumps("-j MARK --set-xmark X", "X"));
    }

    #[test]
    fn del_removes_the_containers_chain_and_jumps_only() {
        let doc = del_document("test", ID, &NatTable::parse(SAVE)).unwrap();
        assert_eq!(
            doc,
            format!(
                r#"*nat
-D CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"test\" id: \"ctr1\"" -m multiport --dports 8080 -j {DN}
-D CNI-HOSTPORT-DNAT -s 1.2.3.4/32 -p udp -m comment --comment "dnat name: \"test\" id: \"ctr1\"" -m multiport --dports 53 -j {DN}
-F {DN}
-X {DN}
COMMIT
"#
            )
        );
    }

    #[test]
    fn del_of_what_is_gone_does_nothing() {
        assert_eq!(del_document("test", "ctr3", &NatTable::parse(SAVE)), None);
        assert_eq!(del_document("other", ID, &NatTable::parse(SAVE)), None);
        assert_eq!(del_document("test", ID, &NatTable::default()), None);
    }

    #[test]
    fn del_removes_the_old_snat_chain_too() {
        let sn = names::old_snat_chain("test", ID);
        let save = format!(
            "*nat\n:POSTROUTING ACCEPT [0:0]\n:CNI-HOSTPORT-SNAT - [0:0]\n:{sn} - [0:0]\n-A CNI-HOSTPORT-SNAT -j {sn}\nCOMMIT\n"
        );
        let doc = del_document("test", ID, &NatTable::parse(&save)).unwrap();
        assert_eq!(
            doc,
            format!("*nat\n-D CNI-HOSTPORT-SNAT -j {sn}\n-F {sn}\n-X {sn}\nCOMMIT\n")
        );
    }

    #[test]
    fn check_names_the_missing_rule() {
        let c = Config::parse(
            &json!({"runtimeConfig": {"portMappings": [
                {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]}, "snat": false}),
            "test",
            || Backend::Iptables,
        )
        .unwrap();
        let e = check(&c, ID, v4(), &NatTable::default()).unwrap_err();
        assert!(e.msg.contains(DN) && e.msg.contains("missing"), "{}", e.msg);
        let mut t = NatTable::parse(SAVE);
        // ... the same table without the OUTPUT jump.
        let e = check(&c, ID, v4(), &t).unwrap_err();
        assert!(e.msg.contains("-A OUTPUT"), "{}", e.msg);
        t.rules.push((
            "OUTPUT".into(),
            "-m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT".into(),
        ));
        check(&c, ID, v4(), &t).unwrap();
        t.rules.retain(|(chain, _)| chain != DN);
        let e = check(&c, ID, v4(), &t).unwrap_err();
        assert!(
            e.msg
                .contains("{hostPort 8080, containerPort 80, protocol tcp}"),
            "{}",
            e.msg
        );
    }

    #[test]
    fn check_with_conditions_looks_for_ports_and_protocol() {
        let c = Config::parse(
            &json!({"runtimeConfig": {"portMappings": [
                {"hostPort": 53, "containerPort": 53, "protocol": "udp"}]},
                "snat": false, "conditionsV4": ["-s", "1.2.3.4"]}),
            "test",
            || Backend::Iptables,
        )
        .unwrap();
        let mut t = NatTable::parse(SAVE);
        t.rules.retain(|(chain, _)| chain != DN);
        t.rules.push((
            DN.into(),
            "-p udp -m udp --dport 53 -j DNAT --to-destination 10.88.0.2:53".into(),
        ));
        t.rules.push((
            "OUTPUT".into(),
            "-m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT".into(),
        ));
        check(&c, ID, v4(), &t).unwrap();
        t.rules.retain(|(_, spec)| !spec.contains("--dports 53 "));
        assert!(check(&c, ID, v4(), &t).is_err());
    }

    #[test]
    fn quoting_follows_iptables_save() {
        assert_eq!(save_quote("abc-_9"), "abc-_9");
        assert_eq!(save_quote("a.b"), "\"a.b\"");
        assert_eq!(save_quote(r#"a "b" \ 'c'"#), r#""a \"b\" \\ \'c\'""#);
        assert_eq!(restore_token("10.0.0.0/8"), "10.0.0.0/8");
        assert_eq!(restore_token("a b"), "\"a b\"");
    }
}
