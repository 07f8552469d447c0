//! `macspoofchk`: frames entering the bridge from a pod's veth must carry the pod's MAC.
//! Table `bridge nat`, base chain `PREROUTING`, and per attachment the chains
//! `cni-br-iface-<containerID>-<ifname>` and `...-mac`, as the Go plugin names them.

use crate::config::format_mac;
use crate::masq::{nft_chains, nft_rules};
use cni_protocol::CniError;
use fwnames::go_quote;
use serde_json::Value;

const TABLE: &str = "bridge nat";
const BASE_CHAIN: &str = "PREROUTING";

/// What names one attachment's chains and comments: `<containerID>-<ifname>`.
pub fn ref_id(container_id: &str, ifname: &str) -> String {
    format!("{container_id}-{ifname}")
}

/// nftables' limit on a rule comment, the tighter of its two limits on these names.
const MAX_COMMENT_LEN: usize = 128;

/// ADD's check that the attachment's names fit nftables: its rule comments carry the
/// container ID, so a long one cannot have macspoofchk. Code 7 naming the field and the limit.
pub fn check_names_fit(container_id: &str, ifname: &str) -> Result<(), CniError> {
    let comment = rule_comment(&ref_id(container_id, ifname));
    if comment.len() <= MAX_COMMENT_LEN {
        return Ok(());
    }
    Err(CniError::invalid_config(format!(
        "macspoofchk: the nftables rules are commented \"macspoofchk-<containerID>-<ifname>\", which nftables limits to {MAX_COMMENT_LEN} characters; with CNI_IFNAME {ifname:?} the container ID may have at most {} bytes, it has {}",
        MAX_COMMENT_LEN - (comment.len() - container_id.len()),
        container_id.len()
    )))
}

fn iface_chain(ref_id: &str) -> String {
    format!("cni-br-iface-{ref_id}")
}

fn mac_chain(ref_id: &str) -> String {
    format!("{}-mac", iface_chain(ref_id))
}

fn rule_comment(ref_id: &str) -> String {
    format!("macspoofchk-{ref_id}")
}

/// One `nft -f` transaction: the table and chains (created if missing, emptied if present),
/// the jump for `host_veth`, and the rule that lets only `mac` through.
pub fn setup_script(host_veth: &str, mac: &[u8; 6], ref_id: &str) -> String {
    // Chain names go unquoted: nft takes identifiers there (container IDs and interface
    // names only hold characters identifiers allow).
    let (iface, macc) = (iface_chain(ref_id), mac_chain(ref_id));
    let c = go_quote(&rule_comment(ref_id));
    format!(
        "add table {TABLE}\n\
         add chain {TABLE} {BASE_CHAIN} {{ type filter hook prerouting priority -300 ; policy accept ; }}\n\
         add chain {TABLE} {iface}\n\
         add chain {TABLE} {macc}\n\
         flush chain {TABLE} {iface}\n\
         flush chain {TABLE} {macc}\n\
         add rule {TABLE} {BASE_CHAIN} iifname {} jump {iface} comment {c}\n\
         add rule {TABLE} {iface} jump {macc} comment {c}\n\
         add rule {TABLE} {macc} ether saddr {} return comment {c}\n\
         add rule {TABLE} {macc} drop comment {c}\n",
        go_quote(host_veth),
        format_mac(mac),
    )
}

/// From `nft -j list table bridge nat`, the transaction that removes one attachment's jump
/// and chains; None when none of them is there.
pub fn teardown_script(listing: &Value, ref_id: &str) -> Option<String> {
    let comment = rule_comment(ref_id);
    let mut s: String = nft_rules(listing)
        .into_iter()
        .filter(|(chain, _, c)| chain == BASE_CHAIN && *c == comment)
        .map(|(_, handle, _)| format!("delete rule {TABLE} {BASE_CHAIN} handle {handle}\n"))
        .collect();
    let chains = nft_chains(listing);
    for chain in [iface_chain(ref_id), mac_chain(ref_id)] {
        if chains.contains(&chain) {
            s.push_str(&format!(
                "flush chain {TABLE} {chain}\ndelete chain {TABLE} {chain}\n"
            ));
        }
    }
    (!s.is_empty()).then_some(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn container_ids_too_long_for_the_comment_are_refused_naming_the_limit() {
        // "macspoofchk-" + ID + "-eth0": 111 bytes of ID fill 128.
        check_names_fit(&"a".repeat(111), "eth0").unwrap();
        let e = check_names_fit(&"a".repeat(112), "eth0").unwrap_err();
        assert_eq!(e.code, cni_protocol::error::INVALID_NETWORK_CONFIG);
        assert!(e.msg.contains("at most 111 bytes, it has 112"), "{}", e.msg);
        check_names_fit(&"a".repeat(100), "abcdefghijklmno").unwrap();
        assert!(check_names_fit(&"a".repeat(1000), "eth0").is_err());
    }

    #[test]
    fn setup_names_chains_and_comments_as_go() {
        let s = setup_script("veth1234", &[0x0a, 0x58, 0, 0, 0, 2], &ref_id("c1", "eth0"));
        assert!(s.contains("add chain bridge nat PREROUTING { type filter hook prerouting priority -300 ; policy accept ; }"));
        assert!(s.contains(
            "add rule bridge nat PREROUTING iifname \"veth1234\" jump cni-br-iface-c1-eth0 comment \"macspoofchk-c1-eth0\"\n"
        ));
        assert!(s.contains(
            "add rule bridge nat cni-br-iface-c1-eth0-mac ether saddr 0a:58:00:00:00:02 return comment \"macspoofchk-c1-eth0\"\n"
        ));
        assert!(s.contains("add rule bridge nat cni-br-iface-c1-eth0-mac drop"));
    }

    #[test]
    fn teardown_removes_the_jump_then_the_chains() {
        let listing = json!({"nftables": [
            {"table": {"family": "bridge", "name": "nat"}},
            {"chain": {"family": "bridge", "table": "nat", "name": "PREROUTING"}},
            {"chain": {"family": "bridge", "table": "nat", "name": "cni-br-iface-c1-eth0"}},
            {"chain": {"family": "bridge", "table": "nat", "name": "cni-br-iface-c1-eth0-mac"}},
            {"chain": {"family": "bridge", "table": "nat", "name": "cni-br-iface-c2-eth0"}},
            {"rule": {"family": "bridge", "table": "nat", "chain": "PREROUTING", "handle": 5, "comment": "macspoofchk-c1-eth0"}},
            {"rule": {"family": "bridge", "table": "nat", "chain": "PREROUTING", "handle": 6, "comment": "macspoofchk-c2-eth0"}}
        ]});
        assert_eq!(
            teardown_script(&listing, "c1-eth0").unwrap(),
            "delete rule bridge nat PREROUTING handle 5\n\
             flush chain bridge nat cni-br-iface-c1-eth0\ndelete chain bridge nat cni-br-iface-c1-eth0\n\
             flush chain bridge nat cni-br-iface-c1-eth0-mac\ndelete chain bridge nat cni-br-iface-c1-eth0-mac\n"
        );
        assert_eq!(teardown_script(&listing, "c9-eth0"), None);
    }
}
