//! The iptables dialect: flannel's chains `FLANNEL-POSTRTG` (nat) and `FLANNEL-FWD`
//! (filter), each rule as `iptables-save` prints it, compared with a family's `iptables-save`
//! text and written as one `iptables-restore --noflush` document per family.

use super::{says, Batch, Dialect, MasqSpec, Net, Plan};
use cni_kernel::firewall::{Backend, Family};
use cni_kernel::Result;

pub const POSTRTG_CHAIN: &str = "FLANNEL-POSTRTG";
pub const FWD_CHAIN: &str = "FLANNEL-FWD";

/// kube-proxy's mark for packets it already masquerades.
const KUBE_PROXY_MARK: &str = "0x4000/0x4000";
const MASQ_COMMENT: &str = r#"-m comment --comment "flanneld masq""#;
const FWD_COMMENT: &str = r#"-m comment --comment "flanneld forward""#;

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

/// flannel's rules as `iptables-save` prints them.
#[derive(Debug, Clone, Copy, Default)]
pub struct Iptables;

/// The tables it reads in each family, in this order.
const TABLES: &[&str] = &["nat", "filter"];

/// The nat and filter tables as read (empty where absent).
fn nat_and_filter<'a>(read: &[Option<&'a str>]) -> [(&'static str, &'a str); 2] {
    let at = |i: usize| read.get(i).copied().flatten().unwrap_or("");
    [("nat", at(0)), ("filter", at(1))]
}

impl Dialect for Iptables {
    fn name(&self) -> &'static str {
        "iptables"
    }

    fn backend(&self) -> Backend {
        Backend::Iptables
    }

    fn tables(&self) -> &'static [&'static str] {
        TABLES
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
        let [(_, nat), (_, filter)] = nat_and_filter(read);
        let plan = iptables_plan(nat, filter, &iptables_chains(&net, spec));
        Ok(plan.map(|p| Batch {
            says: says(format!("restoring {family:?} iptables rules"), &p.reasons),
            text: p.batch,
            reasons: p.reasons,
        }))
    }

    fn remove_all(&self, family: Family, read: &[Option<&str>]) -> Result<Option<Batch>> {
        let text: String = nat_and_filter(read)
            .into_iter()
            .filter_map(|(t, saved)| iptables_removal(t, saved))
            .collect();
        Ok((!text.is_empty()).then(|| Batch {
            text,
            says: format!("removing flannel's {family:?} iptables chains"),
            reasons: Vec::new(),
        }))
    }

    fn remove_stale(
        &self,
        old: &Net,
        spec: &MasqSpec,
        read: &[Option<&str>],
    ) -> Result<Option<Batch>> {
        let stale = iptables_stale_lines(old, spec);
        let text: String = nat_and_filter(read)
            .into_iter()
            .filter_map(|(t, saved)| iptables_stale_removal(t, saved, &stale))
            .collect();
        Ok((!text.is_empty()).then(|| Batch {
            text,
            says: format!(
                "removing {:?} iptables rules of the previous subnet {} in {}",
                old.family, old.subnet, old.network
            ),
            reasons: Vec::new(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{spec, v4};
    use super::*;

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
}
