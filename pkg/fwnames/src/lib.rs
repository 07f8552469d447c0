//! Firewall names shared with the Go plugins.
//!
//! A container's rules are found again with nothing but its network name and container ID, so
//! the names and comments must come out byte for byte as the Go plugins form them: chains named
//! by a SHA-512 hash, comments quoted as Go's `%q` does, and rule text quoted as `iptables-save`
//! prints it (what the table is read back as).

use sha2::{Digest, Sha512};
use std::fmt::Write;

/// iptables chain names are limited to 28 characters.
pub const MAX_CHAIN_LEN: usize = 28;

/// `prefix` followed by the hex SHA-512 of `to_hash`, the whole cut to `len` characters, as
/// the Go utils' hash-with-prefix does.
pub fn hash_with_prefix(len: usize, prefix: &str, to_hash: &str) -> String {
    let digest = Sha512::digest(to_hash.as_bytes());
    let mut out = String::with_capacity(prefix.len() + 2 * digest.len());
    out.push_str(prefix);
    for byte in digest {
        if out.len() >= len {
            break;
        }
        let _ = write!(out, "{byte:02x}");
    }
    out.truncate(len);
    out
}

/// The chain of one container on one network: `CNI-<prefix>` and the hash of network name and
/// container ID, 28 characters in all (`CNI-DN-...` for portmap's DNAT chain).
pub fn chain_name_with_prefix(prefix: &str, network: &str, container_id: &str) -> String {
    hash_with_prefix(
        MAX_CHAIN_LEN,
        &format!("CNI-{prefix}"),
        &format!("{network}{container_id}"),
    )
}

/// The chain of one container on one network with no prefix: `CNI-` and 24 hex digits.
pub fn chain_name(network: &str, container_id: &str) -> String {
    chain_name_with_prefix("", network, container_id)
}

/// Go's `%q` of a string: double-quoted, with `"` and `\` escaped, the C escapes `\a \b \f \n
/// \r \t \v`, other ASCII control characters as `\xNN` and the C1 controls as `\u00NN`.
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\x07' => out.push_str("\\a"),
            '\x08' => out.push_str("\\b"),
            '\x0c' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\x0b' => out.push_str("\\v"),
            c if c.is_ascii_control() => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A string as `iptables-save` prints it (libxtables' `xtables_save_string`): bare when it is
/// non-empty and holds only ASCII letters, digits, `_` and `-`, otherwise double-quoted with
/// `"`, `\` and `'` backslash-escaped. iptables-restore reads it back to the same string.
pub fn save_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return s.to_string();
    }
    let mut quoted = String::with_capacity(s.len() + 2);
    quoted.push('"');
    for c in s.chars() {
        if matches!(c, '"' | '\\' | '\'') {
            quoted.push('\\');
        }
        quoted.push(c);
    }
    quoted.push('"');
    quoted
}

/// A user-given token of an iptables-restore line (a config's extra match arguments), quoted
/// as [`save_quote`] does only when it would otherwise split or lose a quote: `10.0.0.0/8`
/// stays bare, `a b` becomes `"a b"`.
pub fn restore_token(s: &str) -> String {
    if s.chars()
        .any(|c| c.is_whitespace() || matches!(c, '"' | '\\' | '\''))
    {
        save_quote(s)
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_names_are_the_go_plugins() {
        // The Go bridge plugin's masquerade chain of network "btnet", container "c1".
        assert_eq!(chain_name("btnet", "c1"), "CNI-639df9ed42b720f22f559a6c");
        // The Go portmap plugin's chains: sha512("test" + "abc123") starts 0c4de534d2...
        assert_eq!(
            chain_name_with_prefix("DN-", "test", "abc123"),
            "CNI-DN-0c4de534d24965339ca8c"
        );
        assert_eq!(
            chain_name_with_prefix("SN-", "test", "abc123"),
            "CNI-SN-0c4de534d24965339ca8c"
        );
        assert_eq!(
            chain_name_with_prefix("DN-", "test", "ctr1"),
            "CNI-DN-3a53437c165fe05c780a9"
        );
        assert_eq!(chain_name("btnet", "c1").len(), MAX_CHAIN_LEN);
        // Network name and container ID are hashed as one string.
        assert_eq!(chain_name("tes", "tabc123"), chain_name("test", "abc123"));
        assert_ne!(chain_name("test", "abc124"), chain_name("test", "abc123"));
    }

    #[test]
    fn hashes_are_cut_to_the_length_asked() {
        let h = hash_with_prefix(16, "", "net");
        assert_eq!(h.len(), 16);
        assert!(h.chars().all(|c| c.is_ascii_hexdigit()));
        assert!(hash_with_prefix(128, "", "net").starts_with(&h));
        assert_eq!(hash_with_prefix(200, "", "net").len(), 128);
        assert_eq!(hash_with_prefix(3, "CNI-", "net"), "CNI");
    }

    #[test]
    fn go_quote_is_go_percent_q() {
        assert_eq!(go_quote("btnet"), r#""btnet""#);
        assert_eq!(go_quote("a\"b\\c"), r#""a\"b\\c""#);
        assert_eq!(go_quote(""), r#""""#);
        assert_eq!(go_quote("\x07\x08\x0c\n\r\t\x0b"), r#""\a\b\f\n\r\t\v""#);
        assert_eq!(go_quote("\x00\x1b\x7f"), r#""\x00\x1b\x7f""#);
        assert_eq!(go_quote("\u{85}"), r#""\u0085""#);
        assert_eq!(go_quote("é'ü"), "\"é'ü\"");
    }

    #[test]
    fn save_quote_is_iptables_saves() {
        assert_eq!(save_quote("abc-_9"), "abc-_9");
        assert_eq!(save_quote(""), r#""""#);
        assert_eq!(save_quote("a.b"), "\"a.b\"");
        assert_eq!(save_quote(r#"a "b" \ 'c'"#), r#""a \"b\" \\ \'c\'""#);
        // The bridge plugin's comment as iptables-save lists it.
        assert_eq!(
            save_quote(r#"name: "btnet" id: "c1""#),
            r#""name: \"btnet\" id: \"c1\"""#
        );
    }

    #[test]
    fn restore_tokens_are_quoted_only_when_they_would_split() {
        assert_eq!(restore_token("10.0.0.0/8"), "10.0.0.0/8");
        assert_eq!(restore_token("-s"), "-s");
        assert_eq!(restore_token("a b"), "\"a b\"");
        assert_eq!(restore_token("it's"), r#""it\'s""#);
    }
}
