//! `--ip-masq` and the FORWARD accept rules, in flannel's exact text so that an operator's
//! tooling, and a switch back to flannel, find what they expect: iptables chains
//! `FLANNEL-POSTRTG` (nat) and `FLANNEL-FWD` (filter), or with `EnableNFTables` (or on a host
//! without iptables) the tables `flannel-ipv4` / `flannel-ipv6` with chains `postrtg` and
//! `forward`.
//!
//! The rule text and the comparison with what the kernel holds are pure, for both backends
//! (`Wanted`, `Ours`, `Stale` give them to the firewall driver). [`plan`] has the driver of
//! the spec's backend read the rules once and plan a [`Pass`]: the batches that remove what an
//! earlier run left (the other mode's rules; with [`previous`] of the subnet.env about to be
//! replaced, an earlier subnet's), then the batch per tool that writes what is missing; its
//! [`Pass::apply`] writes exactly those. The firewall plane (`crate::planes::firewall`) plans
//! and applies a pass at start and every `--iptables-resync`; [`ensure`],
//! [`remove_other_mode`] and [`remove_stale`] are one part of a pass, planned and applied.
//! Nothing is removed at exit, so that a restart leaves the rules, and the traffic, as they
//! were.

use cni_kernel::firewall::{Backend, Batches, Family, Rules};
use cni_kernel::{Error, Result};
use ipnetwork::{IpNetwork, Ipv4Network, Ipv6Network};
use serde_json::Value;
use std::sync::Mutex;

pub const POSTRTG_CHAIN: &str = "FLANNEL-POSTRTG";
pub const FWD_CHAIN: &str = "FLANNEL-FWD";
pub const NFT_TABLE_V4: &str = "flannel-ipv4";
pub const NFT_TABLE_V6: &str = "flannel-ipv6";

/// kube-proxy's mark for packets it already masquerades.
const KUBE_PROXY_MARK: &str = "0x4000/0x4000";
const MASQ_COMMENT: &str = r#"-m comment --comment "flanneld masq""#;
const FWD_COMMENT: &str = r#"-m comment --comment "flanneld forward""#;

/// `--ip-masq` and its siblings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MasqOptions {
    /// `--ip-masq`: the masquerade chain.
    pub masq: bool,
    /// Not `--ip-masq-fully-random-disable`.
    pub random_fully: bool,
    /// `--iptables-forward-rules`: the forward accept chain.
    pub forward_rules: bool,
}

/// What the node's firewall should hold: the cluster network and this node's subnet per
/// family, and the options from the command line and the network config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MasqSpec {
    /// (network, this node's subnet).
    pub ipv4: Option<(Ipv4Network, Ipv4Network)>,
    pub ipv6: Option<(Ipv6Network, Ipv6Network)>,
    /// The rules are nftables': `EnableNFTables` in the network config, or a host without
    /// iptables (`spec::Firewall::choose`).
    pub nftables: bool,
    /// `--ip-masq`: the masquerade chain.
    pub masq: bool,
    /// Not `--ip-masq-fully-random-disable`.
    pub random_fully: bool,
    /// `--iptables-forward-rules`: the forward accept chain.
    pub forward_rules: bool,
}

/// One family's network and subnet as the tools print them (`10.5.0.0/16`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Net {
    pub family: Family,
    pub network: String,
    pub subnet: String,
}

impl Net {
    pub fn v4(network: Ipv4Network, subnet: Ipv4Network) -> Net {
        let canon = |n: Ipv4Network| format!("{}/{}", n.network(), n.prefix());
        Net {
            family: Family::V4,
            network: canon(network),
            subnet: canon(subnet),
        }
    }

    pub fn v6(network: Ipv6Network, subnet: Ipv6Network) -> Net {
        let canon = |n: Ipv6Network| format!("{}/{}", n.network(), n.prefix());
        Net {
            family: Family::V6,
            network: canon(network),
            subnet: canon(subnet),
        }
    }

    fn multicast(&self) -> &'static str {
        match self.family {
            Family::V4 => "224.0.0.0/4",
            Family::V6 => "ff00::/8",
        }
    }
}

fn nets(
    ipv4: Option<(Ipv4Network, Ipv4Network)>,
    ipv6: Option<(Ipv6Network, Ipv6Network)>,
) -> Vec<Net> {
    ipv4.map(|(n, s)| Net::v4(n, s))
        .into_iter()
        .chain(ipv6.map(|(n, s)| Net::v6(n, s)))
        .collect()
}

impl MasqSpec {
    pub fn nets(&self) -> Vec<Net> {
        nets(self.ipv4, self.ipv6)
    }
}

/// (network, subnet) of each family an earlier subnet.env names, for [`remove_stale`];
/// None for a family it lacks or cannot be read.
pub type Previous = (
    Option<(Ipv4Network, Ipv4Network)>,
    Option<(Ipv6Network, Ipv6Network)>,
);

/// The networks and subnets of an earlier subnet.env's text (subnets as written there, the
/// first address of the subnet; the rules use its network address).
pub fn previous(subnet_env: &str) -> Previous {
    let Ok(e) = subnetenv::parse_entries(subnet_env) else {
        return (None, None);
    };
    let first = |ns: &Option<Vec<IpNetwork>>| ns.as_ref().and_then(|v| v.first().copied());
    let ipv4 = match (first(&e.networks), e.subnet) {
        (Some(IpNetwork::V4(n)), Some(IpNetwork::V4(s))) => Some((n, s)),
        _ => None,
    };
    let ipv6 = match (first(&e.ipv6_networks), e.ipv6_subnet) {
        (Some(IpNetwork::V6(n)), Some(IpNetwork::V6(s))) => Some((n, s)),
        _ => None,
    };
    (ipv4, ipv6)
}

/// One iptables chain of ours and the jump to it from a built-in chain, each rule as
/// `iptables-save` prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IptablesChain {
    pub table: &'static str,
    /// The built-in chain that jumps to ours.
    pub hook: &'static str,
    pub chain: &'static str,
    pub jump: String,
    pub rules: Vec<String>,
}

/// flannel's masquerade rules for one family, in order.
pub fn iptables_postrtg(net: &Net, random_fully: bool) -> IptablesChain {
    let (n, s, c) = (&net.network, &net.subnet, MASQ_COMMENT);
    let masq = if random_fully {
        "MASQUERADE --random-fully"
    } else {
        "MASQUERADE"
    };
    let multicast = net.multicast();
    IptablesChain {
        table: "nat",
        hook: "POSTROUTING",
        chain: POSTRTG_CHAIN,
        jump: format!("-A POSTROUTING {c} -j {POSTRTG_CHAIN}"),
        rules: [
            format!("-m mark --mark {KUBE_PROXY_MARK} {c} -j RETURN"),
            format!("-s {s} -d {n} {c} -j RETURN"),
            format!("-s {n} -d {s} {c} -j RETURN"),
            format!("! -s {n} -d {s} {c} -j RETURN"),
            format!("-s {n} ! -d {multicast} {c} -j {masq}"),
            format!("! -s {n} -d {n} {c} -j {masq}"),
        ]
        .into_iter()
        .map(|r| format!("-A {POSTRTG_CHAIN} {r}"))
        .collect(),
    }
}

/// flannel's forward accept rules for one family.
pub fn iptables_forward(net: &Net) -> IptablesChain {
    let (n, c) = (&net.network, FWD_COMMENT);
    IptablesChain {
        table: "filter",
        hook: "FORWARD",
        chain: FWD_CHAIN,
        jump: format!("-A FORWARD {c} -j {FWD_CHAIN}"),
        rules: vec![
            format!("-A {FWD_CHAIN} -s {n} {c} -j ACCEPT"),
            format!("-A {FWD_CHAIN} -d {n} {c} -j ACCEPT"),
        ],
    }
}

/// The iptables chains `spec` asks for in `net`'s family.
pub fn iptables_chains(net: &Net, spec: &MasqSpec) -> Vec<IptablesChain> {
    let mut chains = Vec::new();
    if spec.masq {
        chains.push(iptables_postrtg(net, spec.random_fully));
    }
    if spec.forward_rules {
        chains.push(iptables_forward(net));
    }
    chains
}

/// A batch to write and why it is needed, for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub batch: String,
    pub reasons: Vec<String>,
}

/// The lines of one table's section in `iptables-save -t <table>` output.
fn section<'a>(saved: &'a str, table: &str) -> Vec<&'a str> {
    let head = format!("*{table}");
    saved
        .lines()
        .skip_while(|l| *l != head)
        .skip(1)
        .take_while(|l| *l != "COMMIT")
        .collect()
}

fn chain_exists(lines: &[&str], chain: &str) -> bool {
    let decl = format!(":{chain} ");
    lines.iter().any(|l| l.starts_with(&decl))
}

fn rules_of<'a>(lines: &[&'a str], chain: &str) -> Vec<&'a str> {
    let head = format!("-A {chain} ");
    lines
        .iter()
        .copied()
        .filter(|l| l.starts_with(&head))
        .collect()
}

/// The `iptables-restore --noflush` section that makes one table hold `chains` exactly (our
/// chains' rules in order, one jump to each), given the table as `iptables-save` printed it;
/// None when it already does.
pub fn iptables_table_plan(
    table: &str,
    saved: &str,
    chains: &[IptablesChain],
    reasons: &mut Vec<String>,
) -> Option<String> {
    let lines = section(saved, table);
    let mut body = String::new();
    for c in chains.iter().filter(|c| c.table == table) {
        let actual = rules_of(&lines, c.chain);
        if !chain_exists(&lines, c.chain) {
            reasons.push(format!("{table} chain {} missing", c.chain));
        } else if actual != c.rules {
            let missing: Vec<_> = c
                .rules
                .iter()
                .map(String::as_str)
                .filter(|r| !actual.contains(r))
                .collect();
            reasons.push(if missing.is_empty() {
                format!("{table} chain {}: rules out of order or extra", c.chain)
            } else {
                format!("{table} chain {}: missing {}", c.chain, missing.join("; "))
            });
        }
        if !chain_exists(&lines, c.chain) || actual != c.rules {
            // Declaring a chain that exists flushes it, under --noflush too.
            body.push_str(&format!(":{} - [0:0]\n", c.chain));
            for r in &c.rules {
                body.push_str(r);
                body.push('\n');
            }
        }
        let jumps = rules_of(&lines, c.hook)
            .into_iter()
            .filter(|l| *l == c.jump)
            .count();
        if jumps == 0 {
            reasons.push(format!("{table} jump from {} missing", c.hook));
            body.push_str(&c.jump);
            body.push('\n');
        }
        for _ in 1..jumps {
            reasons.push(format!("{table} jump from {} duplicated", c.hook));
            body.push_str(&delete_line(&c.jump));
        }
    }
    (!body.is_empty()).then(|| format!("*{table}\n{body}COMMIT\n"))
}

/// `-A CHAIN spec` as the line that deletes that rule.
fn delete_line(append: &str) -> String {
    format!("-D {}\n", append.strip_prefix("-A ").unwrap_or(append))
}

/// The one `iptables-restore` document (nat and filter) that brings a family to `chains`.
pub fn iptables_plan(
    saved_nat: &str,
    saved_filter: &str,
    chains: &[IptablesChain],
) -> Option<Plan> {
    let mut reasons = Vec::new();
    let batch: String = [("nat", saved_nat), ("filter", saved_filter)]
        .into_iter()
        .filter_map(|(t, saved)| iptables_table_plan(t, saved, chains, &mut reasons))
        .collect();
    (!batch.is_empty()).then_some(Plan { batch, reasons })
}

/// The section of `table` that removes our chains and every jump to them (None: none there).
pub fn iptables_removal(table: &str, saved: &str) -> Option<String> {
    let lines = section(saved, table);
    let ours: &[&str] = match table {
        "nat" => &[POSTRTG_CHAIN],
        _ => &[FWD_CHAIN],
    };
    let mut body = String::new();
    for l in &lines {
        if l.starts_with("-A ") && ours.iter().any(|c| l.ends_with(&format!(" -j {c}"))) {
            body.push_str(&delete_line(l));
        }
    }
    for c in ours.iter().filter(|c| chain_exists(&lines, c)) {
        body.push_str(&format!("-F {c}\n-X {c}\n"));
    }
    (!body.is_empty()).then(|| format!("*{table}\n{body}COMMIT\n"))
}

/// The section of `table` that deletes the lines of `stale` it holds.
pub fn iptables_stale_removal(table: &str, saved: &str, stale: &[String]) -> Option<String> {
    let lines = section(saved, table);
    let body: String = lines
        .iter()
        .filter(|l| stale.iter().any(|s| s == *l))
        .map(|l| delete_line(l))
        .collect();
    (!body.is_empty()).then(|| format!("*{table}\n{body}COMMIT\n"))
}

/// The rule lines written for `old` (with today's options) that `spec` does not want now.
pub fn iptables_stale_lines(old: &Net, spec: &MasqSpec) -> Vec<String> {
    let lines = |n: &Net| -> Vec<String> {
        iptables_chains(n, spec)
            .into_iter()
            .flat_map(|c| std::iter::once(c.jump).chain(c.rules))
            .collect()
    };
    let wanted: Vec<String> = spec
        .nets()
        .iter()
        .filter(|n| n.family == old.family)
        .flat_map(lines)
        .collect();
    lines(old)
        .into_iter()
        .filter(|l| !wanted.contains(l))
        .collect()
}

/// One nftables base chain of ours: its attributes and rules as `nft list` prints them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftChain {
    pub name: &'static str,
    pub comment: &'static str,
    pub kind: &'static str,
    pub hook: &'static str,
    /// The priority as written (`srcnat`) and as listed in JSON (100).
    pub priority: &'static str,
    pub prio: i64,
    pub rules: Vec<String>,
}

/// nftables' family keyword and our table in it.
pub fn nft_table(family: Family) -> (&'static str, &'static str) {
    match family {
        Family::V4 => ("ip", NFT_TABLE_V4),
        Family::V6 => ("ip6", NFT_TABLE_V6),
    }
}

/// flannel's nftables chains for one family. As in flannel, the third return skips traffic
/// into the network from outside this node's subnet (iptables: from outside the network).
pub fn nft_chains(net: &Net, spec: &MasqSpec) -> Vec<NftChain> {
    let (ip, _) = nft_table(net.family);
    let (n, s, multicast) = (&net.network, &net.subnet, net.multicast());
    let masq = if spec.random_fully {
        "masquerade fully-random"
    } else {
        "masquerade"
    };
    let mut chains = Vec::new();
    if spec.masq {
        chains.push(NftChain {
            name: "postrtg",
            comment: "chain to manage traffic masquerading by flannel",
            kind: "nat",
            hook: "postrouting",
            priority: "srcnat",
            prio: 100,
            rules: vec![
                "meta mark 0x4000 return".to_string(),
                format!("{ip} saddr {s} {ip} daddr {n} return"),
                format!("{ip} saddr {n} {ip} daddr {s} return"),
                format!("{ip} saddr != {s} {ip} daddr {n} return"),
                format!("{ip} saddr {n} {ip} daddr != {multicast} {masq}"),
                format!("{ip} saddr != {n} {ip} daddr {n} {masq}"),
            ],
        });
    }
    if spec.forward_rules {
        chains.push(NftChain {
            name: "forward",
            comment: "chain to accept flannel traffic",
            kind: "filter",
            hook: "forward",
            priority: "filter",
            prio: 0,
            rules: vec![
                format!("{ip} saddr {n} accept"),
                format!("{ip} daddr {n} accept"),
            ],
        });
    }
    chains
}

/// A chain as the kernel holds it, read from `nft -j list table`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ListedChain {
    pub name: String,
    pub kind: Option<String>,
    pub hook: Option<String>,
    pub prio: Option<i64>,
    pub policy: Option<String>,
    /// (handle, rule in `nft list` syntax); a rule with expressions this module never writes
    /// reads as `?`, so that it never equals one of ours.
    pub rules: Vec<(u64, String)>,
}

/// The chains of one table from its `nft -j list table` output.
pub fn nft_listed(json: &str) -> Result<Vec<ListedChain>> {
    let doc: Value = serde_json::from_str(json)
        .map_err(|e| Error::failed("reading", "nft -j list output", e))?;
    let items = doc
        .get("nftables")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut chains: Vec<ListedChain> = Vec::new();
    for item in &items {
        if let Some(c) = item.get("chain") {
            let s = |k: &str| c.get(k).and_then(Value::as_str).map(str::to_string);
            chains.push(ListedChain {
                name: s("name").unwrap_or_default(),
                kind: s("type"),
                hook: s("hook"),
                prio: c.get("prio").and_then(Value::as_i64),
                policy: s("policy"),
                rules: Vec::new(),
            });
        }
    }
    for item in &items {
        let Some(r) = item.get("rule") else { continue };
        let chain = r.get("chain").and_then(Value::as_str).unwrap_or_default();
        let handle = r.get("handle").and_then(Value::as_u64).unwrap_or_default();
        let text = r
            .get("expr")
            .and_then(Value::as_array)
            .map(|exprs| render_rule(exprs))
            .unwrap_or_else(|| "?".to_string());
        if let Some(c) = chains.iter_mut().find(|c| c.name == chain) {
            c.rules.push((handle, text));
        }
    }
    Ok(chains)
}

fn render_rule(exprs: &[Value]) -> String {
    exprs
        .iter()
        .map(|e| render_expr(e).unwrap_or_else(|| "?".to_string()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// One expression of a rule in `nft list` syntax, for the kinds this module writes.
fn render_expr(e: &Value) -> Option<String> {
    let obj = e.as_object()?;
    let (key, val) = obj.iter().next()?;
    match key.as_str() {
        "return" | "accept" | "drop" => Some(key.clone()),
        "masquerade" => match val.get("flags") {
            None => Some("masquerade".to_string()),
            Some(Value::String(f)) => Some(format!("masquerade {f}")),
            Some(Value::Array(fs)) => {
                let fs: Vec<_> = fs.iter().filter_map(Value::as_str).collect();
                Some(format!("masquerade {}", fs.join(",")))
            }
            Some(_) => None,
        },
        "match" => {
            let op = match val.get("op")?.as_str()? {
                "==" => "",
                "!=" => "!= ",
                _ => return None,
            };
            let left = val.get("left")?;
            let right = val.get("right")?;
            if let Some(p) = left.get("payload") {
                let proto = p.get("protocol")?.as_str()?;
                let field = p.get("field")?.as_str()?;
                let addr = match right {
                    Value::String(a) if a.contains(':') => format!("{a}/128"),
                    Value::String(a) => format!("{a}/32"),
                    _ => {
                        let p = right.get("prefix")?;
                        format!("{}/{}", p.get("addr")?.as_str()?, p.get("len")?.as_u64()?)
                    }
                };
                Some(format!("{proto} {field} {op}{addr}"))
            } else if left.get("meta")?.get("key")?.as_str()? == "mark" {
                Some(format!("meta mark {op}0x{:x}", right.as_u64()?))
            } else {
                None
            }
        }
        _ => None,
    }
}

/// Whether a listed chain is `want` exactly: attributes and rules in order.
fn chain_matches(listed: &ListedChain, want: &NftChain) -> bool {
    listed.kind.as_deref() == Some(want.kind)
        && listed.hook.as_deref() == Some(want.hook)
        && listed.prio == Some(want.prio)
        && listed.policy.as_deref().unwrap_or("accept") == "accept"
        && listed.rules.iter().map(|(_, r)| r).eq(want.rules.iter())
}

/// The nft statements that bring one family's table to `chains`, given its listing (None:
/// the table is absent); None when it already holds them.
pub fn nft_plan(
    family: Family,
    listing: Option<&str>,
    chains: &[NftChain],
) -> Result<Option<Plan>> {
    let (ip, table) = nft_table(family);
    let listed = listing.map(nft_listed).transpose()?;
    let mut reasons = Vec::new();
    let mut script = String::new();
    if listed.is_none() {
        reasons.push(format!("table {ip} {table} missing"));
    }
    for want in chains {
        let found = listed
            .as_ref()
            .and_then(|l| l.iter().find(|c| c.name == want.name));
        match found {
            Some(c) if chain_matches(c, want) => continue,
            Some(c) => {
                reasons.push(format!("chain {ip} {table} {} differs", want.name));
                let same_base = c.kind.as_deref() == Some(want.kind)
                    && c.hook.as_deref() == Some(want.hook)
                    && c.prio == Some(want.prio);
                if !same_base {
                    // A base chain's hook cannot change in place.
                    script.push_str(&format!(
                        "flush chain {ip} {table} {n}\ndelete chain {ip} {table} {n}\n",
                        n = want.name
                    ));
                }
            }
            None if listed.is_some() => {
                reasons.push(format!("chain {ip} {table} {} missing", want.name))
            }
            None => {}
        }
        script.push_str(&nft_chain_statements(ip, table, want));
    }
    if script.is_empty() {
        return Ok(None);
    }
    let head = format!("add table {ip} {table} {{ comment \"rules for {table}\"; }}\n");
    Ok(Some(Plan {
        batch: head + &script,
        reasons,
    }))
}

/// The statements that (re)write one chain whole.
pub fn nft_chain_statements(ip: &str, table: &str, c: &NftChain) -> String {
    let mut s = format!(
        "add chain {ip} {table} {n} {{ comment \"{comment}\"; type {kind} hook {hook} priority {prio}; policy accept; }}\nflush chain {ip} {table} {n}\n",
        n = c.name,
        comment = c.comment,
        kind = c.kind,
        hook = c.hook,
        prio = c.priority,
    );
    for r in &c.rules {
        s.push_str(&format!("add rule {ip} {table} {} {r}\n", c.name));
    }
    s
}

/// The statements deleting the rules of `stale` that a family's table holds.
pub fn nft_stale_removal(
    family: Family,
    listing: &str,
    stale: &[String],
) -> Result<Option<String>> {
    let (ip, table) = nft_table(family);
    let script: String = nft_listed(listing)?
        .iter()
        .flat_map(|c| {
            c.rules
                .iter()
                .filter(|(_, r)| stale.contains(r))
                .map(move |(h, _)| format!("delete rule {ip} {table} {} handle {h}\n", c.name))
        })
        .collect();
    Ok((!script.is_empty()).then_some(script))
}

/// The nftables rules written for `old` (with today's options) that `spec` does not want now.
pub fn nft_stale_rules(old: &Net, spec: &MasqSpec) -> Vec<String> {
    let wanted: Vec<String> = spec
        .nets()
        .iter()
        .filter(|n| n.family == old.family)
        .flat_map(|n| nft_chains(n, spec))
        .flat_map(|c| c.rules)
        .collect();
    nft_chains(old, spec)
        .into_iter()
        .flat_map(|c| c.rules)
        .filter(|r| !wanted.contains(r))
        .collect()
}

/// `nft -j list` of our table in each family.
const NFT_V4: &[&str] = &["table", "ip", NFT_TABLE_V4];
const NFT_V6: &[&str] = &["table", "ip6", NFT_TABLE_V6];

fn nft_read(family: Family) -> &'static [&'static str] {
    match family {
        Family::V4 => NFT_V4,
        Family::V6 => NFT_V6,
    }
}

impl MasqSpec {
    /// The driver that writes the rules, chosen once at start (`spec::Firewall::choose`).
    pub fn backend(&self) -> Backend {
        match self.nftables {
            true => Backend::Nftables,
            false => Backend::Iptables,
        }
    }
}

/// What a planner planned and why, for the log and doctor: collected while the driver plans
/// (on the tools' threads), read after.
#[derive(Default)]
struct Notes(Mutex<Vec<(String, Vec<String>)>>);

impl Notes {
    fn add(&self, what: String, reasons: Vec<String>) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((what, reasons));
    }

    fn take(&self) -> Vec<(String, Vec<String>)> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// The rules `spec` asks for, in both backends' terms: each tool's plan, noted with its
/// reasons.
struct Wanted<'a> {
    spec: &'a MasqSpec,
    notes: Notes,
}

impl Wanted<'_> {
    fn net(&self, family: Family) -> Option<Net> {
        self.spec.nets().into_iter().find(|n| n.family == family)
    }
}

impl Rules for Wanted<'_> {
    type Error = Error;

    fn families(&self) -> Vec<Family> {
        self.spec
            .nets()
            .iter()
            .filter(|n| !iptables_chains(n, self.spec).is_empty())
            .map(|n| n.family)
            .collect()
    }

    fn iptables_reads(&self) -> &[&'static str] {
        &["nat", "filter"]
    }

    fn iptables(&self, family: Family, saved: &[String]) -> Result<Option<String>> {
        let Some(net) = self.net(family) else {
            return Ok(None);
        };
        let plan = iptables_plan(&saved[0], &saved[1], &iptables_chains(&net, self.spec));
        Ok(plan.map(|p| {
            self.notes
                .add(format!("{family:?} iptables rules"), p.reasons);
            p.batch
        }))
    }

    fn nft_reads(&self) -> Vec<&'static [&'static str]> {
        self.spec
            .nets()
            .iter()
            .map(|n| nft_read(n.family))
            .collect()
    }

    fn nft(&self, listed: &[Option<String>]) -> Result<Option<String>> {
        let mut batch = String::new();
        for (net, listing) in self.spec.nets().iter().zip(listed) {
            let chains = nft_chains(net, self.spec);
            if let Some(p) = nft_plan(net.family, listing.as_deref(), &chains)? {
                self.notes.add("nftables rules".to_string(), p.reasons);
                batch.push_str(&p.batch);
            }
        }
        Ok((!batch.is_empty()).then_some(batch))
    }
}

/// One write of a pass: a batch per tool, planned from what was read, and what it says once
/// written.
struct Step {
    batches: Batches,
    says: Vec<String>,
}

impl Step {
    /// The batches `backend` plans for `rules`, with what the planners noted; None: nothing to
    /// write.
    fn plan<R: Rules<Error = Error>>(
        backend: Backend,
        rules: &R,
        notes: &Notes,
    ) -> Result<Option<Step>> {
        let batches = backend.plan(rules)?;
        let says = notes
            .take()
            .into_iter()
            .map(|(what, why)| says(what, why))
            .collect();
        Ok((!batches.is_empty()).then_some(Step { batches, says }))
    }

    fn apply(self) -> Result<()> {
        self.batches.apply()?;
        for line in self.says {
            tracing::info!("{line}");
        }
        Ok(())
    }
}

/// A note as the log says it: `restoring IPv4 iptables rules: nat chain FLANNEL-POSTRTG missing`.
fn says(what: String, reasons: Vec<String>) -> String {
    if reasons.is_empty() {
        what
    } else {
        format!("{what}: {}", reasons.join("; "))
    }
}

/// What one pass of the firewall plane writes, planned from one read of the rules: the first
/// pass's cleanup (the other mode's rules, an earlier subnet's), then the rules `spec` asks
/// for. Applying it writes exactly these batches, in this order, reading nothing again.
pub struct Pass {
    /// What is missing or wrong in the rules `spec` asks for.
    pub reasons: Vec<String>,
    cleanup: Vec<Step>,
    restore: Option<Step>,
}

/// What applying a [`Pass`] wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Applied {
    /// Something of the cleanup.
    pub cleaned: bool,
    /// Rules `spec` asks for that were missing or wrong.
    pub restored: bool,
}

impl Pass {
    pub fn is_empty(&self) -> bool {
        self.cleanup.is_empty() && self.restore.is_none()
    }

    /// Each tool's program and batch, in the order they are written.
    pub fn batches(&self) -> Vec<(&'static str, &str)> {
        self.cleanup
            .iter()
            .chain(&self.restore)
            .flat_map(|s| s.batches.iter())
            .collect()
    }

    /// Writes the batches in order; the first that fails ends it.
    pub fn apply(self) -> Result<Applied> {
        let mut done = Applied::default();
        for step in self.cleanup {
            step.apply()?;
            done.cleaned = true;
        }
        if let Some(step) = self.restore {
            step.apply()
                .map_err(|e| e.context("writing the masquerade rules"))?;
            done.restored = true;
        }
        Ok(done)
    }
}

/// Reads the rules once and plans a pass: with `previous` (the old subnet.env's networks and
/// subnets), the first pass's cleanup too.
pub fn plan(spec: &MasqSpec, previous: Option<Previous>) -> Result<Pass> {
    let mut cleanup = Vec::new();
    if let Some((old4, old6)) = previous {
        cleanup.extend(other_mode(spec)?);
        cleanup.extend(stale(old4, old6, spec)?);
    }
    let wanted = Wanted {
        spec,
        notes: Notes::default(),
    };
    let batches = spec.backend().plan(&wanted)?;
    let notes = wanted.notes.take();
    let reasons = notes.iter().flat_map(|(_, r)| r.clone()).collect();
    let says = notes
        .into_iter()
        .map(|(what, why)| says(format!("restoring {what}"), why))
        .collect();
    Ok(Pass {
        reasons,
        cleanup,
        restore: (!batches.is_empty()).then_some(Step { batches, says }),
    })
}

/// Makes the firewall hold exactly the rules `spec` asks for, writing whatever is missing or
/// wrong in one batch per tool (iptables: one per family; nftables: one transaction), and
/// nothing when all is right. Returns whether it wrote anything.
pub fn ensure(spec: &MasqSpec) -> Result<bool> {
    Ok(plan(spec, None)?.apply()?.restored)
}

/// `rules` with its iptables half limited to one family.
struct OneFamily<'a, R>(&'a R, Family);

impl<R: Rules> Rules for OneFamily<'_, R> {
    type Error = R::Error;

    fn families(&self) -> Vec<Family> {
        vec![self.1]
    }

    fn iptables_reads(&self) -> &[&'static str] {
        self.0.iptables_reads()
    }

    fn iptables(
        &self,
        family: Family,
        saved: &[String],
    ) -> std::result::Result<Option<String>, R::Error> {
        self.0.iptables(family, saved)
    }

    fn nft_reads(&self) -> Vec<&'static [&'static str]> {
        self.0.nft_reads()
    }

    fn nft(&self, listed: &[Option<String>]) -> std::result::Result<Option<String>, R::Error> {
        self.0.nft(listed)
    }
}

/// The steps that remove what `rules` plan in `backend`. An iptables family whose rules
/// cannot be read (its iptables unusable) holds none to remove: skipped with a warning.
fn removal<R: Rules<Error = Error>>(
    backend: Backend,
    rules: &R,
    notes: &Notes,
) -> Result<Vec<Step>> {
    if backend == Backend::Nftables {
        return Ok(Step::plan(backend, rules, notes)?.into_iter().collect());
    }
    let mut steps = Vec::new();
    for family in rules.families() {
        match Step::plan(backend, &OneFamily(rules, family), notes) {
            Ok(step) => steps.extend(step),
            Err(e) => tracing::warn!("taking no iptables rules to remove there: {e}"),
        }
    }
    Ok(steps)
}

/// Every rule of ours, whichever the spec: what a switch to the other mode removes.
struct Ours {
    notes: Notes,
}

impl Rules for Ours {
    type Error = Error;

    fn families(&self) -> Vec<Family> {
        vec![Family::V4, Family::V6]
    }

    fn iptables_reads(&self) -> &[&'static str] {
        &["nat", "filter"]
    }

    fn iptables(&self, family: Family, saved: &[String]) -> Result<Option<String>> {
        let batch: String = [("nat", &saved[0]), ("filter", &saved[1])]
            .into_iter()
            .filter_map(|(t, saved)| iptables_removal(t, saved))
            .collect();
        if batch.is_empty() {
            return Ok(None);
        }
        self.notes.add(
            format!("nftables mode: removing flannel's {family:?} iptables chains"),
            Vec::new(),
        );
        Ok(Some(batch))
    }

    fn nft_reads(&self) -> Vec<&'static [&'static str]> {
        vec![NFT_V4, NFT_V6]
    }

    fn nft(&self, listed: &[Option<String>]) -> Result<Option<String>> {
        let script: String = [Family::V4, Family::V6]
            .into_iter()
            .zip(listed)
            .filter(|(_, l)| l.is_some())
            .map(|(f, _)| {
                let (ip, table) = nft_table(f);
                format!("delete table {ip} {table}\n")
            })
            .collect();
        if script.is_empty() {
            return Ok(None);
        }
        self.notes.add(
            "iptables mode: removing flannel's nftables tables".to_string(),
            Vec::new(),
        );
        Ok(Some(script))
    }
}

/// The removal of the rules of the mode `spec` does not use (iptables chains in nftables mode,
/// our nftables tables in iptables mode), so that a switch leaves one policy in force. A mode
/// whose tool is not installed holds none at all.
fn other_mode(spec: &MasqSpec) -> Result<Vec<Step>> {
    let mut steps = unused_iptables();
    let other = spec.backend().other();
    if !other.installed() {
        return Ok(steps);
    }
    let ours = Ours {
        notes: Notes::default(),
    };
    steps.extend(removal(other, &ours, &ours.notes)?);
    Ok(steps)
}

/// The removal of our iptables chains from the iptables mode this process did not choose,
/// where a run before the host's rules moved (or before `--iptables-mode`) wrote them. A
/// family whose rules there cannot be read holds none: skipped with a warning.
fn unused_iptables() -> Vec<Step> {
    let Some(mode) = cni_kernel::firewall::xtables::chosen_mode() else {
        return Vec::new();
    };
    let ours = Ours {
        notes: Notes::default(),
    };
    let mut steps: Vec<Step> = Vec::new();
    for family in [Family::V4, Family::V6] {
        match cni_kernel::firewall::plan_in_unused_iptables(&OneFamily(&ours, family)) {
            Ok(batches) if !batches.is_empty() => steps.push(Step {
                batches,
                says: Vec::new(),
            }),
            Ok(_) => {}
            Err(e) => tracing::warn!("taking no iptables rules to remove there: {e}"),
        }
        ours.notes.take();
    }
    // Said once, after the last family's.
    if let Some(last) = steps.last_mut() {
        last.says.push(format!(
            "removed flannel's iptables chains from iptables-{}: the rules are in iptables-{mode}",
            mode.other()
        ));
    }
    steps
}

/// Removes the rules of the mode `spec` does not use; whether it removed anything.
pub fn remove_other_mode(spec: &MasqSpec) -> Result<bool> {
    let pass = Pass {
        reasons: Vec::new(),
        cleanup: other_mode(spec)?,
        restore: None,
    };
    Ok(pass.apply()?.cleaned)
}

/// The rules written for previous networks and subnets (from the old subnet.env) that the spec
/// no longer wants.
struct Stale<'a> {
    old: Vec<Net>,
    spec: &'a MasqSpec,
    notes: Notes,
}

impl Rules for Stale<'_> {
    type Error = Error;

    fn families(&self) -> Vec<Family> {
        self.old.iter().map(|n| n.family).collect()
    }

    fn iptables_reads(&self) -> &[&'static str] {
        &["nat", "filter"]
    }

    fn iptables(&self, family: Family, saved: &[String]) -> Result<Option<String>> {
        let Some(old) = self.old.iter().find(|n| n.family == family) else {
            return Ok(None);
        };
        let stale = iptables_stale_lines(old, self.spec);
        let batch: String = [("nat", &saved[0]), ("filter", &saved[1])]
            .into_iter()
            .filter_map(|(t, saved)| iptables_stale_removal(t, saved, &stale))
            .collect();
        if batch.is_empty() {
            return Ok(None);
        }
        let what = format!(
            "removing {:?} iptables rules of the previous subnet {} in {}",
            old.family, old.subnet, old.network
        );
        self.notes.add(what, Vec::new());
        Ok(Some(batch))
    }

    fn nft_reads(&self) -> Vec<&'static [&'static str]> {
        self.old.iter().map(|n| nft_read(n.family)).collect()
    }

    fn nft(&self, listed: &[Option<String>]) -> Result<Option<String>> {
        let mut script = String::new();
        for (old, listing) in self.old.iter().zip(listed) {
            if let Some(listing) = listing {
                let stale = nft_stale_rules(old, self.spec);
                script.extend(nft_stale_removal(old.family, listing, &stale)?);
            }
        }
        if script.is_empty() {
            return Ok(None);
        }
        self.notes.add(
            "removing nftables rules of a previous subnet".to_string(),
            Vec::new(),
        );
        Ok(Some(script))
    }
}

/// The removal of the rules written for a previous network and subnet (from the old
/// subnet.env) that `spec` no longer wants; the current rules stay.
fn stale(
    old_ipv4: Option<(Ipv4Network, Ipv4Network)>,
    old_ipv6: Option<(Ipv6Network, Ipv6Network)>,
    spec: &MasqSpec,
) -> Result<Vec<Step>> {
    let stale = Stale {
        old: nets(old_ipv4, old_ipv6),
        spec,
        notes: Notes::default(),
    };
    removal(spec.backend(), &stale, &stale.notes)
}

/// Removes the rules written for a previous network and subnet that `spec` no longer wants;
/// whether it removed anything.
pub fn remove_stale(
    old_ipv4: Option<(Ipv4Network, Ipv4Network)>,
    old_ipv6: Option<(Ipv6Network, Ipv6Network)>,
    spec: &MasqSpec,
) -> Result<bool> {
    let pass = Pass {
        reasons: Vec::new(),
        cleanup: stale(old_ipv4, old_ipv6, spec)?,
        restore: None,
    };
    Ok(pass.apply()?.cleaned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> MasqSpec {
        MasqSpec {
            ipv4: Some((
                "10.5.0.0/16".parse().unwrap(),
                "10.5.1.0/24".parse().unwrap(),
            )),
            ipv6: Some((
                "fd00:5::/56".parse().unwrap(),
                "fd00:5:0:1::/64".parse().unwrap(),
            )),
            nftables: false,
            masq: true,
            random_fully: true,
            forward_rules: true,
        }
    }

    fn v4() -> Net {
        spec().nets()[0].clone()
    }

    #[test]
    fn iptables_masquerade_rules_are_flannels_text_in_order() {
        let c = iptables_postrtg(&v4(), true);
        assert_eq!(
            c.jump,
            r#"-A POSTROUTING -m comment --comment "flanneld masq" -j FLANNEL-POSTRTG"#
        );
        let expected = r#"-A FLANNEL-POSTRTG -m mark --mark 0x4000/0x4000 -m comment --comment "flanneld masq" -j RETURN
-A FLANNEL-POSTRTG -s 10.5.1.0/24 -d 10.5.0.0/16 -m comment --comment "flanneld masq" -j RETURN
-A FLANNEL-POSTRTG -s 10.5.0.0/16 -d 10.5.1.0/24 -m comment --comment "flanneld masq" -j RETURN
-A FLANNEL-POSTRTG ! -s 10.5.0.0/16 -d 10.5.1.0/24 -m comment --comment "flanneld masq" -j RETURN
-A FLANNEL-POSTRTG -s 10.5.0.0/16 ! -d 224.0.0.0/4 -m comment --comment "flanneld masq" -j MASQUERADE --random-fully
-A FLANNEL-POSTRTG ! -s 10.5.0.0/16 -d 10.5.0.0/16 -m comment --comment "flanneld masq" -j MASQUERADE --random-fully"#;
        assert_eq!(c.rules.join("\n"), expected);
    }

    #[test]
    fn without_random_fully_the_masquerade_rules_drop_the_option() {
        let c = iptables_postrtg(&v4(), false);
        assert_eq!(
            c.rules[4],
            r#"-A FLANNEL-POSTRTG -s 10.5.0.0/16 ! -d 224.0.0.0/4 -m comment --comment "flanneld masq" -j MASQUERADE"#
        );
        assert_eq!(
            c.rules[5],
            r#"-A FLANNEL-POSTRTG ! -s 10.5.0.0/16 -d 10.5.0.0/16 -m comment --comment "flanneld masq" -j MASQUERADE"#
        );
    }

    #[test]
    fn ipv6_rules_use_the_ipv6_multicast_range() {
        let v6 = &spec().nets()[1];
        let c = iptables_postrtg(v6, true);
        assert_eq!(
            c.rules[4],
            r#"-A FLANNEL-POSTRTG -s fd00:5::/56 ! -d ff00::/8 -m comment --comment "flanneld masq" -j MASQUERADE --random-fully"#
        );
        assert_eq!(
            c.rules[1],
            r#"-A FLANNEL-POSTRTG -s fd00:5:0:1::/64 -d fd00:5::/56 -m comment --comment "flanneld masq" -j RETURN"#
        );
    }

    #[test]
    fn forward_rules_accept_the_network_both_ways() {
        let c = iptables_forward(&v4());
        assert_eq!(
            c.jump,
            r#"-A FORWARD -m comment --comment "flanneld forward" -j FLANNEL-FWD"#
        );
        assert_eq!(
            c.rules.join("\n"),
            r#"-A FLANNEL-FWD -s 10.5.0.0/16 -m comment --comment "flanneld forward" -j ACCEPT
-A FLANNEL-FWD -d 10.5.0.0/16 -m comment --comment "flanneld forward" -j ACCEPT"#
        );
        let no_fwd = MasqSpec {
            forward_rules: false,
            ..spec()
        };
        assert_eq!(iptables_chains(&v4(), &no_fwd).len(), 1);
    }

    #[test]
    fn previous_reads_an_old_subnet_env() {
        let (v4, v6) = previous(
            "FLANNEL_NETWORK=10.5.0.0/16\nFLANNEL_SUBNET=10.5.52.1/24\nFLANNEL_IPV6_NETWORK=fc00::/48\nFLANNEL_IPV6_SUBNET=fc00:0:0:1::1/64\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n",
        );
        let (n, s) = v4.unwrap();
        let net = Net::v4(n, s);
        assert_eq!(
            (net.network.as_str(), net.subnet.as_str()),
            ("10.5.0.0/16", "10.5.52.0/24")
        );
        let (n, s) = v6.unwrap();
        let net = Net::v6(n, s);
        assert_eq!(
            (net.network.as_str(), net.subnet.as_str()),
            ("fc00::/48", "fc00:0:0:1::/64")
        );
        assert_eq!(previous("FLANNEL_MTU=1450\n"), (None, None));
        assert_eq!(previous("FLANNEL_SUBNET=nonsense\n"), (None, None));
    }

    #[test]
    fn an_unmasked_network_is_printed_as_its_network_address() {
        let n = Net::v4(
            "10.5.3.7/16".parse().unwrap(),
            "10.5.1.9/24".parse().unwrap(),
        );
        assert_eq!(
            (n.network.as_str(), n.subnet.as_str()),
            ("10.5.0.0/16", "10.5.1.0/24")
        );
    }

    fn saved(table: &str, extra: &[String]) -> String {
        let mut s = format!("# Generated by iptables-save\n*{table}\n:POSTROUTING ACCEPT [0:0]\n");
        for l in extra {
            s.push_str(l);
            s.push('\n');
        }
        s + "COMMIT\n"
    }

    fn full_nat(c: &IptablesChain) -> Vec<String> {
        let mut v = vec![":FLANNEL-POSTRTG - [0:0]".to_string(), c.jump.clone()];
        v.extend(c.rules.iter().cloned());
        v
    }

    #[test]
    fn an_empty_table_gets_the_chain_its_rules_and_the_jump_in_one_document() {
        let chains = iptables_chains(&v4(), &spec());
        let plan = iptables_plan(&saved("nat", &[]), &saved("filter", &[]), &chains).unwrap();
        let c = &chains[0];
        let f = &chains[1];
        let expected = format!(
            "*nat\n:FLANNEL-POSTRTG - [0:0]\n{}\n{}\nCOMMIT\n*filter\n:FLANNEL-FWD - [0:0]\n{}\n{}\nCOMMIT\n",
            c.rules.join("\n"),
            c.jump,
            f.rules.join("\n"),
            f.jump
        );
        assert_eq!(plan.batch, expected);
        assert!(plan
            .reasons
            .iter()
            .any(|r| r.contains("FLANNEL-POSTRTG missing")));
    }

    #[test]
    fn rules_already_right_need_no_batch() {
        let chains = iptables_chains(
            &v4(),
            &MasqSpec {
                forward_rules: false,
                ..spec()
            },
        );
        let nat = saved("nat", &full_nat(&chains[0]));
        assert_eq!(iptables_plan(&nat, &saved("filter", &[]), &chains), None);
    }

    #[test]
    fn a_missing_rule_rewrites_the_chain_in_order_and_keeps_the_jump() {
        let chains = iptables_chains(
            &v4(),
            &MasqSpec {
                forward_rules: false,
                ..spec()
            },
        );
        let mut lines = full_nat(&chains[0]);
        let gone = lines.remove(4);
        let plan = iptables_plan(&saved("nat", &lines), "", &chains).unwrap();
        let expected = format!(
            "*nat\n:FLANNEL-POSTRTG - [0:0]\n{}\nCOMMIT\n",
            chains[0].rules.join("\n")
        );
        assert_eq!(plan.batch, expected);
        assert!(plan.reasons[0].contains(&gone), "{:?}", plan.reasons);
    }

    #[test]
    fn a_duplicated_jump_is_deleted_once() {
        let chains = iptables_chains(
            &v4(),
            &MasqSpec {
                forward_rules: false,
                ..spec()
            },
        );
        let mut lines = full_nat(&chains[0]);
        lines.push(chains[0].jump.clone());
        let plan = iptables_plan(&saved("nat", &lines), "", &chains).unwrap();
        assert_eq!(
            plan.batch,
            "*nat\n-D POSTROUTING -m comment --comment \"flanneld masq\" -j FLANNEL-POSTRTG\nCOMMIT\n"
        );
    }

    #[test]
    fn removal_deletes_jumps_then_flushes_and_deletes_our_chain() {
        let chains = iptables_chains(&v4(), &spec());
        let nat = saved("nat", &full_nat(&chains[0]));
        assert_eq!(
            iptables_removal("nat", &nat).unwrap(),
            "*nat\n-D POSTROUTING -m comment --comment \"flanneld masq\" -j FLANNEL-POSTRTG\n-F FLANNEL-POSTRTG\n-X FLANNEL-POSTRTG\nCOMMIT\n"
        );
        assert_eq!(iptables_removal("nat", &saved("nat", &[])), None);
    }

    #[test]
    fn stale_lines_are_the_old_subnets_rules_only() {
        let old = Net::v4(
            "10.5.0.0/16".parse().unwrap(),
            "10.5.9.0/24".parse().unwrap(),
        );
        let stale = iptables_stale_lines(&old, &spec());
        assert!(
            stale.iter().all(|l| l.contains("10.5.9.0/24")),
            "{stale:#?}"
        );
        assert_eq!(stale.len(), 3, "{stale:#?}");
        let mut lines = full_nat(&iptables_postrtg(&v4(), true));
        lines.push(iptables_postrtg(&old, true).rules[1].clone());
        assert_eq!(
            iptables_stale_removal("nat", &saved("nat", &lines), &stale).unwrap(),
            "*nat\n-D FLANNEL-POSTRTG -s 10.5.9.0/24 -d 10.5.0.0/16 -m comment --comment \"flanneld masq\" -j RETURN\nCOMMIT\n"
        );
    }

    #[test]
    fn nftables_chains_are_flannels_text() {
        let script: String = nft_chains(&v4(), &spec())
            .iter()
            .map(|c| nft_chain_statements("ip", NFT_TABLE_V4, c))
            .collect();
        let expected = r#"add chain ip flannel-ipv4 postrtg { comment "chain to manage traffic masquerading by flannel"; type nat hook postrouting priority srcnat; policy accept; }
flush chain ip flannel-ipv4 postrtg
add rule ip flannel-ipv4 postrtg meta mark 0x4000 return
add rule ip flannel-ipv4 postrtg ip saddr 10.5.1.0/24 ip daddr 10.5.0.0/16 return
add rule ip flannel-ipv4 postrtg ip saddr 10.5.0.0/16 ip daddr 10.5.1.0/24 return
add rule ip flannel-ipv4 postrtg ip saddr != 10.5.1.0/24 ip daddr 10.5.0.0/16 return
add rule ip flannel-ipv4 postrtg ip saddr 10.5.0.0/16 ip daddr != 224.0.0.0/4 masquerade fully-random
add rule ip flannel-ipv4 postrtg ip saddr != 10.5.0.0/16 ip daddr 10.5.0.0/16 masquerade fully-random
add chain ip flannel-ipv4 forward { comment "chain to accept flannel traffic"; type filter hook forward priority filter; policy accept; }
flush chain ip flannel-ipv4 forward
add rule ip flannel-ipv4 forward ip saddr 10.5.0.0/16 accept
add rule ip flannel-ipv4 forward ip daddr 10.5.0.0/16 accept
"#;
        assert_eq!(script, expected);
        let v6 = &spec().nets()[1];
        let plain = MasqSpec {
            random_fully: false,
            ..spec()
        };
        assert_eq!(
            nft_chains(v6, &plain)[0].rules[4],
            "ip6 saddr fd00:5::/56 ip6 daddr != ff00::/8 masquerade"
        );
    }

    /// `nft -j list table ip flannel-ipv4` of the table as written, from nft 1.0.6.
    fn listing(rules: &[(&str, &str)]) -> String {
        let chain = |name: &str, kind: &str, hook: &str, prio: i64| {
            format!(
                r#"{{"chain": {{"family": "ip", "table": "flannel-ipv4", "name": "{name}", "handle": 1, "type": "{kind}", "hook": "{hook}", "prio": {prio}, "policy": "accept"}}}}"#
            )
        };
        let mut items = vec![
            r#"{"metainfo": {"version": "1.0.6"}}"#.to_string(),
            r#"{"table": {"family": "ip", "name": "flannel-ipv4", "handle": 1}}"#.to_string(),
            chain("postrtg", "nat", "postrouting", 100),
            chain("forward", "filter", "forward", 0),
        ];
        for (i, (c, expr)) in rules.iter().enumerate() {
            items.push(format!(
                r#"{{"rule": {{"family": "ip", "table": "flannel-ipv4", "chain": "{c}", "handle": {}, "expr": {expr}}}}}"#,
                i + 10
            ));
        }
        format!(r#"{{"nftables": [{}]}}"#, items.join(", "))
    }

    fn pfx(field: &str, op: &str, addr: &str, len: u8) -> String {
        format!(
            r#"{{"match": {{"op": "{op}", "left": {{"payload": {{"protocol": "ip", "field": "{field}"}}}}, "right": {{"prefix": {{"addr": "{addr}", "len": {len}}}}}}}}}"#
        )
    }

    fn written_rules() -> Vec<(&'static str, String)> {
        let mark = r#"{"match": {"op": "==", "left": {"meta": {"key": "mark"}}, "right": 16384}}"#;
        let masq = r#"{"masquerade": {"flags": "fully-random"}}"#;
        vec![
            ("postrtg", format!(r#"[{mark}, {{"return": null}}]"#)),
            (
                "postrtg",
                format!(
                    r#"[{}, {}, {{"return": null}}]"#,
                    pfx("saddr", "==", "10.5.1.0", 24),
                    pfx("daddr", "==", "10.5.0.0", 16)
                ),
            ),
            (
                "postrtg",
                format!(
                    r#"[{}, {}, {{"return": null}}]"#,
                    pfx("saddr", "==", "10.5.0.0", 16),
                    pfx("daddr", "==", "10.5.1.0", 24)
                ),
            ),
            (
                "postrtg",
                format!(
                    r#"[{}, {}, {{"return": null}}]"#,
                    pfx("saddr", "!=", "10.5.1.0", 24),
                    pfx("daddr", "==", "10.5.0.0", 16)
                ),
            ),
            (
                "postrtg",
                format!(
                    r#"[{}, {}, {masq}]"#,
                    pfx("saddr", "==", "10.5.0.0", 16),
                    pfx("daddr", "!=", "224.0.0.0", 4)
                ),
            ),
            (
                "postrtg",
                format!(
                    r#"[{}, {}, {masq}]"#,
                    pfx("saddr", "!=", "10.5.0.0", 16),
                    pfx("daddr", "==", "10.5.0.0", 16)
                ),
            ),
            (
                "forward",
                format!(
                    r#"[{}, {{"accept": null}}]"#,
                    pfx("saddr", "==", "10.5.0.0", 16)
                ),
            ),
            (
                "forward",
                format!(
                    r#"[{}, {{"accept": null}}]"#,
                    pfx("daddr", "==", "10.5.0.0", 16)
                ),
            ),
        ]
    }

    #[test]
    fn a_listing_reads_back_as_the_rules_written() {
        let rules = written_rules();
        let refs: Vec<_> = rules.iter().map(|(c, e)| (*c, e.as_str())).collect();
        let listed = nft_listed(&listing(&refs)).unwrap();
        let want = nft_chains(&v4(), &spec());
        for (l, w) in listed.iter().zip(&want) {
            let texts: Vec<_> = l.rules.iter().map(|(_, r)| r.clone()).collect();
            assert_eq!(texts, w.rules);
        }
        assert_eq!(
            nft_plan(Family::V4, Some(&listing(&refs)), &want).unwrap(),
            None
        );
    }

    #[test]
    fn a_missing_nft_rule_or_table_rewrites_the_chain() {
        let want = nft_chains(&v4(), &spec());
        let rules = written_rules();
        let refs: Vec<_> = rules
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != 2)
            .map(|(_, (c, e))| (*c, e.as_str()))
            .collect();
        let plan = nft_plan(Family::V4, Some(&listing(&refs)), &want)
            .unwrap()
            .unwrap();
        assert_eq!(
            plan.batch,
            format!(
                "add table ip flannel-ipv4 {{ comment \"rules for flannel-ipv4\"; }}\n{}",
                nft_chain_statements("ip", NFT_TABLE_V4, &want[0])
            )
        );
        let plan = nft_plan(Family::V4, None, &want).unwrap().unwrap();
        assert_eq!(plan.reasons, ["table ip flannel-ipv4 missing"]);
        assert!(plan.batch.contains("add chain ip flannel-ipv4 forward"));
    }

    #[test]
    fn an_unknown_expression_never_equals_one_of_ours() {
        let odd = r#"[{"counter": {"packets": 0, "bytes": 0}}, {"return": null}]"#;
        let listed = nft_listed(&listing(&[("postrtg", odd)])).unwrap();
        assert_eq!(listed[0].rules, [(10, "? return".to_string())]);
    }

    #[test]
    fn nft_stale_rules_are_deleted_by_handle() {
        let old = Net::v4(
            "10.5.0.0/16".parse().unwrap(),
            "10.5.9.0/24".parse().unwrap(),
        );
        let stale = nft_stale_rules(&old, &spec());
        assert_eq!(stale.len(), 3, "{stale:#?}");
        let e = format!(
            r#"[{}, {}, {{"return": null}}]"#,
            pfx("saddr", "==", "10.5.9.0", 24),
            pfx("daddr", "==", "10.5.0.0", 16)
        );
        let script = nft_stale_removal(Family::V4, &listing(&[("postrtg", &e)]), &stale)
            .unwrap()
            .unwrap();
        assert_eq!(script, "delete rule ip flannel-ipv4 postrtg handle 10\n");
    }
}
