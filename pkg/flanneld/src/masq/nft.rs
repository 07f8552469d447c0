//! The nftables dialect: flannel's tables `flannel-ipv4` / `flannel-ipv6` with chains
//! `postrtg` and `forward`, each rule as `nft list` prints it, compared with the table's
//! `nft -j list` and written in one `nft -f` transaction for both families.

use super::{says, Batch, Dialect, MasqSpec, Net, Plan};
use cni_kernel::firewall::{Backend, Family};
use cni_kernel::{Error, Result};
use serde_json::Value;

pub const NFT_TABLE_V4: &str = "flannel-ipv4";
pub const NFT_TABLE_V6: &str = "flannel-ipv6";

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

/// flannel's rules as `nft list` prints them.
#[derive(Debug, Clone, Copy, Default)]
pub struct Nft;

impl Dialect for Nft {
    fn name(&self) -> &'static str {
        "nftables"
    }

    fn backend(&self) -> Backend {
        Backend::Nftables
    }

    fn listing(&self, family: Family) -> Option<&'static [&'static str]> {
        Some(nft_read(family))
    }

    fn restore(
        &self,
        spec: &MasqSpec,
        family: Family,
        read: &[Option<&str>],
    ) -> Result<Option<Batch>> {
        let Some(net) = spec.net(family) else {
            return Ok(None);
        };
        let listing = read.first().copied().flatten();
        let plan = nft_plan(family, listing, &nft_chains(&net, spec))?;
        Ok(plan.map(|p| Batch {
            says: says("restoring nftables rules".to_string(), &p.reasons),
            text: p.batch,
            reasons: p.reasons,
        }))
    }

    fn remove_all(&self, family: Family, read: &[Option<&str>]) -> Result<Option<Batch>> {
        if read.first().copied().flatten().is_none() {
            return Ok(None);
        }
        let (ip, table) = nft_table(family);
        Ok(Some(Batch {
            text: format!("delete table {ip} {table}\n"),
            says: "removing flannel's nftables tables".to_string(),
            reasons: Vec::new(),
        }))
    }

    fn remove_stale(
        &self,
        old: &Net,
        spec: &MasqSpec,
        read: &[Option<&str>],
    ) -> Result<Option<Batch>> {
        let Some(listing) = read.first().copied().flatten() else {
            return Ok(None);
        };
        let stale = nft_stale_rules(old, spec);
        let text = nft_stale_removal(old.family, listing, &stale)?;
        Ok(text.map(|text| Batch {
            text,
            says: "removing nftables rules of a previous subnet".to_string(),
            reasons: Vec::new(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{spec, v4};
    use super::*;

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
