//! Masquerade rules named and written as the Go plugin writes them, so that either
//! implementation removes the other's.
//!
//! iptables: a nat chain `CNI-<24 hex of sha512(network + containerID)>` holding
//! `-d <subnet> -j ACCEPT` and `! -d <multicast> -j MASQUERADE`, reached from POSTROUTING by
//! `-s <pod ip> -j CNI-...`, every rule commented `name: "<network>" id: "<containerID>"`.
//!
//! nftables: table `inet cni_plugins_masquerade`, chain `masq_checks` with one rule per pod
//! address, commented with a hash of (network, ifname, containerID) first.

use cni_protocol::CniError;
use fwnames::{go_quote, hash_with_prefix, save_quote};
use ipnetwork::IpNetwork;
use serde_json::Value;

/// An address family, for the tool that handles it (iptables or ip6tables).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpFamily {
    V4,
    V6,
}

impl IpFamily {
    pub fn of(net: &IpNetwork) -> IpFamily {
        if net.is_ipv4() {
            IpFamily::V4
        } else {
            IpFamily::V6
        }
    }

    fn multicast(self) -> &'static str {
        match self {
            IpFamily::V4 => "224.0.0.0/4",
            IpFamily::V6 => "ff00::/8",
        }
    }

    fn host_prefix(self) -> u8 {
        match self {
            IpFamily::V4 => 32,
            IpFamily::V6 => 128,
        }
    }
}

/// The iptables chain of one container on one network: `CNI-` and 24 hex digits.
pub fn chain_name(network: &str, container_id: &str) -> String {
    fwnames::chain_name(network, container_id)
}

/// The comment on every iptables rule of one container: `name: "<network>" id: "<containerID>"`.
pub fn comment(network: &str, container_id: &str) -> String {
    format!("name: {} id: {}", go_quote(network), go_quote(container_id))
}

/// The start of a family's ADD document, known before IPAM answers: the container's chain,
/// declared (and so emptied), with its MASQUERADE rule. A tool can read it while IPAM runs.
pub fn iptables_add_head(network: &str, container_id: &str, family: IpFamily) -> String {
    let chain = chain_name(network, container_id);
    let c = save_quote(&comment(network, container_id));
    format!(
        "*nat\n:{chain} - [0:0]\n-A {chain} ! -d {} -m comment --comment {c} -j MASQUERADE\n",
        family.multicast()
    )
}

/// The rest once the addresses are known: each subnet's ACCEPT inserted above the MASQUERADE
/// rule (the order the Go plugin's appends give), the POSTROUTING jumps, COMMIT.
pub fn iptables_add_tail(
    network: &str,
    container_id: &str,
    family: IpFamily,
    addrs: &[IpNetwork],
) -> String {
    let chain = chain_name(network, container_id);
    let c = save_quote(&comment(network, container_id));
    let ours: Vec<&IpNetwork> = addrs.iter().filter(|a| IpFamily::of(a) == family).collect();
    let mut subnets: Vec<IpNetwork> = Vec::new();
    for a in &ours {
        let subnet = IpNetwork::new(a.network(), a.prefix()).unwrap_or(**a);
        if !subnets.contains(&subnet) {
            subnets.push(subnet);
        }
    }
    let mut doc = String::new();
    for (i, subnet) in subnets.iter().enumerate() {
        doc.push_str(&format!(
            "-I {chain} {} -d {subnet} -m comment --comment {c} -j ACCEPT\n",
            i + 1
        ));
    }
    for a in &ours {
        doc.push_str(&format!(
            "-A POSTROUTING -s {}/{} -m comment --comment {c} -j {chain}\n",
            a.ip(),
            family.host_prefix()
        ));
    }
    doc.push_str("COMMIT\n");
    doc
}

/// The families `addrs` has, IPv4 first.
pub fn families(addrs: &[IpNetwork]) -> Vec<IpFamily> {
    [IpFamily::V4, IpFamily::V6]
        .into_iter()
        .filter(|f| addrs.iter().any(|a| IpFamily::of(a) == *f))
        .collect()
}

/// The whole `iptables-restore --noflush` documents that masquerade `addrs` for one
/// container: one per family present.
pub fn iptables_add(
    network: &str,
    container_id: &str,
    addrs: &[IpNetwork],
) -> Vec<(IpFamily, String)> {
    families(addrs)
        .into_iter()
        .map(|f| {
            let mut doc = iptables_add_head(network, container_id, f);
            doc.push_str(&iptables_add_tail(network, container_id, f, addrs));
            (f, doc)
        })
        .collect()
}

/// From `iptables-save -t nat`, the document that removes one container's masquerade rules:
/// every POSTROUTING rule that jumps to its chain or carries its comment, then the chain.
/// None when nothing of it is there.
pub fn iptables_remove(saved: &str, network: &str, container_id: &str) -> Option<String> {
    iptables_remove_all(saved, network, &[container_id])
}

/// The same for several containers of `network`, in one document.
pub fn iptables_remove_all(saved: &str, network: &str, container_ids: &[&str]) -> Option<String> {
    let mut doc = String::from("*nat\n");
    let mut found = false;
    for id in container_ids {
        let chain = chain_name(network, id);
        let quoted_comment = format!("--comment {}", save_quote(&comment(network, id)));
        let jump = format!("-j {chain}");
        let mut chain_exists = false;
        for line in saved.lines() {
            if line.starts_with(&format!(":{chain} ")) {
                chain_exists = true;
            } else if let Some(rule) = line.strip_prefix("-A POSTROUTING ") {
                let jumps = rule.ends_with(&jump) || rule.contains(&format!("{jump} "));
                if jumps || rule.contains(&quoted_comment) {
                    doc.push_str(&format!("-D POSTROUTING {rule}\n"));
                    found = true;
                }
            }
        }
        if chain_exists {
            doc.push_str(&format!("-F {chain}\n-X {chain}\n"));
            found = true;
        }
    }
    doc.push_str("COMMIT\n");
    found.then_some(doc)
}

/// The containers of `network` that have masquerade rules, read from the comments of
/// `iptables-save -t nat`: what GC compares with the attachments to keep.
pub fn iptables_containers(saved: &str, network: &str) -> Vec<String> {
    let head = format!(
        "--comment {}",
        save_quote(&format!("name: {} id: ", go_quote(network)))
    );
    // The quoted comment ends `id: \"<id>\""`: cut the prefix's closing quote off.
    let head = &head[..head.len() - 1];
    let mut ids: Vec<String> = saved
        .lines()
        .filter(|l| l.starts_with("-A POSTROUTING "))
        .filter_map(|l| {
            let rest = &l[l.find(head)? + head.len()..];
            let rest = rest.strip_prefix("\\\"")?;
            Some(rest[..rest.find("\\\"")?].to_string())
        })
        .collect();
    ids.sort();
    ids.dedup();
    ids
}

/// The nftables table the Go plugin's nftables backend uses.
pub const NFT_TABLE: &str = "cni_plugins_masquerade";
/// Its chain holding one rule per masqueraded address.
pub const NFT_CHAIN: &str = "masq_checks";
/// knftables' limit on comments.
const NFT_COMMENT_MAX: usize = 128;

/// The per-network hash that starts every rule comment of a network.
pub fn nft_network_hash(network: &str) -> String {
    hash_with_prefix(16, "", network)
}

/// The hash that starts the comments of one attachment's rules.
pub fn nft_instance_hash(network: &str, ifname: &str, container_id: &str) -> String {
    format!(
        "{}-{}",
        nft_network_hash(network),
        hash_with_prefix(16, "", &format!("{ifname}:{container_id}"))
    )
}

/// The comment on one attachment's rules: the hash, then a readable (maybe cut) description.
pub fn nft_comment(network: &str, ifname: &str, container_id: &str) -> String {
    let mut c = format!(
        "{}, net: {}, if: {}, id: {}",
        nft_instance_hash(network, ifname, container_id),
        network.replace('"', ""),
        ifname.replace('"', ""),
        container_id.replace('"', "")
    );
    if c.len() > NFT_COMMENT_MAX {
        let mut end = NFT_COMMENT_MAX;
        while !c.is_char_boundary(end) {
            end -= 1;
        }
        c.truncate(end);
    }
    c
}

/// The `nft -f` transaction that masquerades `addrs` for one attachment, creating the table
/// and chains as the Go plugin does (it rewrites `postrouting` each time, idempotently).
pub fn nft_add(network: &str, ifname: &str, container_id: &str, addrs: &[IpNetwork]) -> String {
    let t = format!("inet {NFT_TABLE}");
    let mut s = format!(
        "add table {t} {{ comment \"Masquerading for plugins from github.com/containernetworking/plugins\" ; }}\n\
         add chain {t} {NFT_CHAIN} {{ comment \"Masquerade traffic from certain IPs to any (non-multicast) IP outside their subnet\" ; }}\n\
         add chain {t} postrouting {{ type nat hook postrouting priority srcnat ; }}\n\
         flush chain {t} postrouting\n\
         add rule {t} postrouting ip daddr == 224.0.0.0/4 return\n\
         add rule {t} postrouting ip6 daddr == ff00::/8 return\n\
         add rule {t} postrouting goto {NFT_CHAIN}\n"
    );
    let c = nft_comment(network, ifname, container_id);
    for a in addrs {
        let proto = if a.is_ipv4() { "ip" } else { "ip6" };
        let subnet = IpNetwork::new(a.network(), a.prefix()).unwrap_or(*a);
        s.push_str(&format!(
            "add rule {t} {NFT_CHAIN} {proto} saddr == {} {proto} daddr != {subnet} masquerade comment {}\n",
            a.ip(),
            go_quote(&c)
        ));
    }
    s
}

/// The JSON of `nft -j list <args>` (`args` as run, for the message); empty output (a table or
/// chain that does not exist) is null. Output that is not JSON is code 5, since reading it as
/// "no rules" would leave the rules in place.
pub fn parse_nft_listing(args: &[&str], output: &str) -> Result<Value, CniError> {
    if output.trim().is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_str(output).map_err(|e| {
        CniError::io(format!(
            "nft -j list {}: the output is not JSON: {e}",
            args.join(" ")
        ))
    })
}

/// Rules of an `nft -j list ...` answer: (chain, handle, comment).
pub fn nft_rules(listing: &Value) -> Vec<(String, u64, String)> {
    listing
        .get("nftables")
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .filter_map(|i| i.get("rule"))
                .filter_map(|r| {
                    Some((
                        r.get("chain")?.as_str()?.to_string(),
                        r.get("handle")?.as_u64()?,
                        r.get("comment")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_string(),
                    ))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Chains of an `nft -j list ...` answer.
pub fn nft_chains(listing: &Value) -> Vec<String> {
    listing
        .get("nftables")
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .filter_map(|i| i.get("chain")?.get("name")?.as_str())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// From `nft -j list chain inet cni_plugins_masquerade masq_checks`, the transaction that
/// deletes one attachment's rules; None when it has none.
pub fn nft_remove(
    listing: &Value,
    network: &str,
    ifname: &str,
    container_id: &str,
) -> Option<String> {
    let prefix = nft_instance_hash(network, ifname, container_id);
    let lines: String = nft_rules(listing)
        .into_iter()
        .filter(|(chain, _, comment)| chain == NFT_CHAIN && comment.starts_with(&prefix))
        .map(|(_, handle, _)| format!("delete rule inet {NFT_TABLE} {NFT_CHAIN} handle {handle}\n"))
        .collect();
    (!lines.is_empty()).then_some(lines)
}

/// From the `masq_checks` listing, the transaction that deletes the rules of `network` whose
/// comment is none of the attachments to keep (ifname, container ID); None when all are kept.
pub fn nft_gc(listing: &Value, network: &str, keep: &[(&str, &str)]) -> Option<String> {
    let net = format!("{}-", nft_network_hash(network));
    let kept: Vec<String> = keep
        .iter()
        .map(|(ifname, id)| nft_comment(network, ifname, id))
        .collect();
    let lines: String = nft_rules(listing)
        .into_iter()
        .filter(|(chain, _, c)| chain == NFT_CHAIN && c.starts_with(&net) && !kept.contains(c))
        .map(|(_, handle, _)| format!("delete rule inet {NFT_TABLE} {NFT_CHAIN} handle {handle}\n"))
        .collect();
    (!lines.is_empty()).then_some(lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_nft_listing_that_is_not_json_is_code_5_naming_the_command() {
        let args = ["chain", "inet", NFT_TABLE, NFT_CHAIN];
        assert_eq!(parse_nft_listing(&args, "").unwrap(), Value::Null);
        assert_eq!(
            parse_nft_listing(&args, "{\"nftables\": []}").unwrap()["nftables"],
            serde_json::json!([])
        );
        let e = parse_nft_listing(&args, "table inet x {").unwrap_err();
        assert_eq!(e.code, 5);
        assert!(
            e.msg
                .contains("nft -j list chain inet cni_plugins_masquerade"),
            "{}",
            e.msg
        );
        assert!(e.msg.contains("not JSON: expected"), "{}", e.msg);
    }
    use serde_json::json;

    fn nets(s: &[&str]) -> Vec<IpNetwork> {
        s.iter().map(|a| a.parse().unwrap()).collect()
    }

    #[test]
    fn chain_name_is_the_go_plugins() {
        // What the Go plugin named the chain of network "btnet", container "c1".
        assert_eq!(chain_name("btnet", "c1"), "CNI-639df9ed42b720f22f559a6c");
        assert_eq!(chain_name("btnet", "c1").len(), 28);
    }

    #[test]
    fn comment_is_the_go_plugins() {
        assert_eq!(comment("btnet", "c1"), r#"name: "btnet" id: "c1""#);
        assert_eq!(go_quote("a\"b\\c"), r#""a\"b\\c""#);
    }

    #[test]
    fn add_document_for_one_v4_address() {
        let docs = iptables_add("btnet", "c1", &nets(&["10.88.0.2/16"]));
        assert_eq!(docs.len(), 1);
        assert_eq!(docs[0].0, IpFamily::V4);
        let c = r#""name: \"btnet\" id: \"c1\"""#;
        let ch = "CNI-639df9ed42b720f22f559a6c";
        // The MASQUERADE rule comes first (it is known before IPAM answers); the ACCEPT is
        // inserted above it, so the chain reads as the Go plugin's.
        assert_eq!(
            docs[0].1,
            format!(
                "*nat\n:{ch} - [0:0]\n\
                 -A {ch} ! -d 224.0.0.0/4 -m comment --comment {c} -j MASQUERADE\n\
                 -I {ch} 1 -d 10.88.0.0/16 -m comment --comment {c} -j ACCEPT\n\
                 -A POSTROUTING -s 10.88.0.2/32 -m comment --comment {c} -j {ch}\n\
                 COMMIT\n"
            )
        );
        assert_eq!(
            iptables_add_head("btnet", "c1", IpFamily::V4)
                + &iptables_add_tail("btnet", "c1", IpFamily::V4, &nets(&["10.88.0.2/16"])),
            docs[0].1
        );
    }

    #[test]
    fn add_documents_per_family() {
        let docs = iptables_add(
            "n",
            "c",
            &nets(&["10.1.0.2/24", "fd00::2/64", "10.2.0.2/24"]),
        );
        assert_eq!(docs.len(), 2);
        assert!(docs[0].1.contains("-I CNI-") && docs[0].1.contains(" 1 -d 10.1.0.0/24"));
        assert!(docs[0].1.contains(" 2 -d 10.2.0.0/24"));
        assert_eq!(docs[0].1.matches("MASQUERADE").count(), 1);
        assert_eq!(docs[0].1.matches("-A POSTROUTING").count(), 2);
        assert_eq!(docs[1].0, IpFamily::V6);
        assert!(docs[1].1.contains("! -d ff00::/8"));
        assert!(docs[1].1.contains("-A POSTROUTING -s fd00::2/128"));
        assert!(iptables_add("n", "c", &[]).is_empty());
    }

    #[test]
    fn remove_finds_rules_by_chain_and_by_comment() {
        let ch = chain_name("btnet", "c1");
        let other = chain_name("btnet", "c2");
        let saved = format!(
            "# Generated by iptables-save\n*nat\n:PREROUTING ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n\
             :{ch} - [0:0]\n:{other} - [0:0]\n\
             -A POSTROUTING -s 10.88.0.2/32 -m comment --comment \"name: \\\"btnet\\\" id: \\\"c1\\\"\" -j {ch}\n\
             -A POSTROUTING -s 10.88.0.2/24 -j {ch}\n\
             -A POSTROUTING -s 10.88.0.3/32 -m comment --comment \"name: \\\"btnet\\\" id: \\\"c2\\\"\" -j {other}\n\
             -A {ch} -d 10.88.0.0/16 -j ACCEPT\nCOMMIT\n"
        );
        let doc = iptables_remove(&saved, "btnet", "c1").unwrap();
        assert_eq!(
            doc,
            format!(
                "*nat\n\
                 -D POSTROUTING -s 10.88.0.2/32 -m comment --comment \"name: \\\"btnet\\\" id: \\\"c1\\\"\" -j {ch}\n\
                 -D POSTROUTING -s 10.88.0.2/24 -j {ch}\n\
                 -F {ch}\n-X {ch}\nCOMMIT\n"
            )
        );
        assert!(!doc.contains(&other));
        assert_eq!(iptables_remove("*nat\nCOMMIT\n", "btnet", "c1"), None);
        // A leftover jump whose chain is gone is still removed.
        let orphan = format!("*nat\n-A POSTROUTING -s 10.0.0.1/32 -j {ch}\nCOMMIT\n");
        assert!(iptables_remove(&orphan, "btnet", "c1")
            .unwrap()
            .contains("-D POSTROUTING"));
    }

    #[test]
    fn gc_finds_the_networks_containers_and_removes_them_at_once() {
        let a = iptables_add("net", "ctr-a", &nets(&["10.1.0.2/24"]));
        let b = iptables_add("net", "ctr-b", &nets(&["10.1.0.3/24"]));
        let other = iptables_add("other", "ctr-c", &nets(&["10.2.0.3/24"]));
        // As iptables-save lists them: chains, then the rules.
        let saved: String = [&a[0].1, &b[0].1, &other[0].1]
            .iter()
            .flat_map(|d| d.lines())
            .filter(|l| !l.starts_with('*') && *l != "COMMIT")
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(iptables_containers(&saved, "net"), vec!["ctr-a", "ctr-b"]);
        assert_eq!(iptables_containers(&saved, "other"), vec!["ctr-c"]);
        let doc = iptables_remove_all(&saved, "net", &["ctr-a", "ctr-b"]).unwrap();
        assert_eq!(doc.matches("-D POSTROUTING").count(), 2);
        assert!(doc.contains(&format!("-X {}", chain_name("net", "ctr-a"))));
        assert!(doc.contains(&format!("-X {}", chain_name("net", "ctr-b"))));
        assert!(!doc.contains(&chain_name("other", "ctr-c")));
    }

    #[test]
    fn comments_are_written_as_iptables_save_prints_them_so_gc_reads_them_back() {
        // iptables-save escapes a single quote too: the rule must be written the same way
        // for its comment to be found in the saved table.
        let doc = iptables_add("it's", "c1", &nets(&["10.1.0.2/24"]));
        assert!(doc[0]
            .1
            .contains(r#"--comment "name: \"it\'s\" id: \"c1\"" -j CNI-"#));
        let saved = r#"-A POSTROUTING -s 10.1.0.2/32 -m comment --comment "name: \"it\'s\" id: \"c1\"" -j CNI-x"#;
        assert_eq!(iptables_containers(saved, "it's"), vec!["c1"]);
    }

    #[test]
    fn nft_gc_keeps_the_valid_attachments_and_other_networks() {
        let rule = |h: u64, c: String| json!({"rule": {"family": "inet", "table": NFT_TABLE, "chain": NFT_CHAIN, "handle": h, "comment": c}});
        let listing = json!({"nftables": [
            rule(1, nft_comment("net", "eth0", "keep")),
            rule(2, nft_comment("net", "eth0", "stale")),
            rule(3, nft_comment("other", "eth0", "stale")),
        ]});
        assert_eq!(
            nft_gc(&listing, "net", &[("eth0", "keep")]).unwrap(),
            "delete rule inet cni_plugins_masquerade masq_checks handle 2\n"
        );
        assert_eq!(
            nft_gc(&listing, "net", &[("eth0", "keep"), ("eth0", "stale")]),
            None
        );
    }

    #[test]
    fn nft_names_are_the_go_plugins() {
        let h = nft_instance_hash("net", "eth0", "c1");
        assert_eq!(h.len(), 33);
        assert!(h.starts_with(&nft_network_hash("net")));
        assert_eq!(nft_network_hash("net"), hash_with_prefix(16, "", "net"));
        let c = nft_comment("net", "eth0", "c1");
        assert_eq!(c, format!("{h}, net: net, if: eth0, id: c1"));
        let long = nft_comment("net", "eth0", &"x".repeat(200));
        assert_eq!(long.len(), 128);
    }

    #[test]
    fn nft_add_script() {
        let s = nft_add("net", "eth0", "c1", &nets(&["10.88.0.2/16", "fd00::2/64"]));
        let c = nft_comment("net", "eth0", "c1");
        assert!(s.starts_with("add table inet cni_plugins_masquerade"));
        assert!(s.contains("add chain inet cni_plugins_masquerade postrouting { type nat hook postrouting priority srcnat ; }"));
        assert!(s.contains(&format!(
            "add rule inet cni_plugins_masquerade masq_checks ip saddr == 10.88.0.2 ip daddr != 10.88.0.0/16 masquerade comment \"{c}\"\n"
        )));
        assert!(s.contains("ip6 saddr == fd00::2 ip6 daddr != fd00::/64 masquerade"));
    }

    #[test]
    fn nft_remove_picks_the_attachments_rules() {
        let mine = nft_comment("net", "eth0", "c1");
        let theirs = nft_comment("net", "eth0", "c2");
        let listing = json!({"nftables": [
            {"metainfo": {"version": "1.0.6"}},
            {"chain": {"family": "inet", "table": NFT_TABLE, "name": NFT_CHAIN, "handle": 2}},
            {"rule": {"family": "inet", "table": NFT_TABLE, "chain": NFT_CHAIN, "handle": 7, "comment": mine, "expr": []}},
            {"rule": {"family": "inet", "table": NFT_TABLE, "chain": NFT_CHAIN, "handle": 8, "comment": theirs, "expr": []}},
            {"rule": {"family": "inet", "table": NFT_TABLE, "chain": NFT_CHAIN, "handle": 9, "expr": []}}
        ]});
        assert_eq!(
            nft_remove(&listing, "net", "eth0", "c1").unwrap(),
            "delete rule inet cni_plugins_masquerade masq_checks handle 7\n"
        );
        assert_eq!(nft_remove(&listing, "net", "eth1", "c1"), None);
        assert_eq!(nft_chains(&listing), vec![NFT_CHAIN.to_string()]);
    }
}
