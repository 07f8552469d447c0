//! resolv.conf into the result's DNS, as the Go plugin reads it.

use cni_protocol::{CniError, Dns};
use std::net::IpAddr;
use std::path::Path;

/// Reads `path`; an unreadable file is code 7 naming `ipam.resolvConf` and the path.
pub fn load_resolv_conf(path: &Path) -> Result<Dns, CniError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        CniError::invalid_config(format!(
            "ipam.resolvConf {:?}: cannot read it: {e}",
            path.display().to_string()
        ))
    })?;
    Ok(parse_resolv_conf(&text))
}

/// `nameserver`, `domain`, `search` and `options` lines; `#` and `;` start comments.
pub fn parse_resolv_conf(text: &str) -> Dns {
    let mut dns = Dns::default();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 2 {
            continue;
        }
        let rest = fields[1..].iter().map(|s| s.to_string());
        match fields[0] {
            "nameserver" => match fields[1].parse::<IpAddr>() {
                Ok(ip) => dns.nameservers.push(ip),
                // A scoped address (fe80::1%eth0) has no place in the result's address list.
                Err(_) => eprintln!("resolvConf: skipping nameserver {:?}", fields[1]),
            },
            "domain" => dns.domain = Some(fields[1].to_string()),
            "search" => dns.search.extend(rest),
            "options" => dns.options.extend(rest),
            _ => {}
        }
    }
    dns
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_kind_of_line_and_skips_comments() {
        let dns = parse_resolv_conf(
            "# a comment\n; another\n  nameserver 10.0.0.10\nnameserver 2001:db8::53\n\
             domain example.com\nsearch a.example.com b.example.com\nsearch c\n\
             options ndots:5 timeout:1\nnameserver\nsortlist 10.0.0.0\n",
        );
        assert_eq!(
            dns.nameservers,
            vec![
                "10.0.0.10".parse::<IpAddr>().unwrap(),
                "2001:db8::53".parse().unwrap()
            ]
        );
        assert_eq!(dns.domain.as_deref(), Some("example.com"));
        assert_eq!(dns.search, ["a.example.com", "b.example.com", "c"]);
        assert_eq!(dns.options, ["ndots:5", "timeout:1"]);
    }

    #[test]
    fn a_missing_file_is_code_7_naming_it() {
        let e = load_resolv_conf(Path::new("/nonexistent/resolv.conf")).unwrap_err();
        assert_eq!(e.code, 7);
        assert!(
            e.msg
                .contains("ipam.resolvConf \"/nonexistent/resolv.conf\""),
            "{}",
            e.msg
        );
    }
}
