//! The names that find one container's rules again with nothing but its network name and
//! container ID, exactly as the Go plugin forms them, so either implementation removes the other's.

/// iptables comments are limited to 255 characters.
const MAX_COMMENT_LEN: usize = 255;

/// The per-container chain holding the DNAT rules: `CNI-DN-<hash>`.
pub fn dnat_chain(network: &str, container_id: &str) -> String {
    fwnames::chain_name_with_prefix("DN-", network, container_id)
}

/// The per-container SNAT chain of old plugin versions, still removed on DEL.
pub fn old_snat_chain(network: &str, container_id: &str) -> String {
    fwnames::chain_name_with_prefix("SN-", network, container_id)
}

/// The comment on the rules that jump to the per-container chain.
pub fn dnat_comment(network: &str, container_id: &str) -> String {
    let comment = format!("dnat name: \"{network}\" id: \"{container_id}\"");
    if comment.chars().count() <= MAX_COMMENT_LEN {
        return comment;
    }
    // The Go plugin cuts to 256, which iptables refuses; 255 fits and DEL finds rules by chain.
    let mut cut: String = comment.chars().take(MAX_COMMENT_LEN - 3).collect();
    cut.push_str("...");
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_names_are_the_go_plugins() {
        // sha512("test" + "abc123") starts with 0c4de534d24965339ca8c.
        assert_eq!(dnat_chain("test", "abc123"), "CNI-DN-0c4de534d24965339ca8c");
        assert_eq!(
            old_snat_chain("test", "abc123"),
            "CNI-SN-0c4de534d24965339ca8c"
        );
        assert_eq!(dnat_chain("test", "abc123").len(), 28);
        assert_ne!(dnat_chain("test", "abc124"), dnat_chain("test", "abc123"));
        assert_ne!(dnat_chain("tes", "tabc123x"), dnat_chain("test", "abc123"));
    }

    #[test]
    fn comments_name_network_and_container_and_stay_under_the_limit() {
        assert_eq!(dnat_comment("cbr0", "c1"), r#"dnat name: "cbr0" id: "c1""#);
        let long = dnat_comment("net", &"x".repeat(300));
        assert_eq!(long.len(), 255);
        assert!(long.ends_with("xx..."));
        assert!(long.starts_with(r#"dnat name: "net" id: "xxx"#));
    }
}
