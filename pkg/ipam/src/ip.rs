//! Address arithmetic: addresses as integers within their family, and the canonical form.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The address as an integer; IPv4 addresses stay below 2^32.
pub fn to_int(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u32::from(a) as u128,
        IpAddr::V6(a) => u128::from(a),
    }
}

/// The address of family `v4` with integer value `n` (truncated to the family's width).
pub fn from_int(n: u128, v4: bool) -> IpAddr {
    if v4 {
        IpAddr::V4(Ipv4Addr::from(n as u32))
    } else {
        IpAddr::V6(Ipv6Addr::from(n))
    }
}

/// IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`) become IPv4, as the Go plugin canonicalizes them.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(a) => match a.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => ip,
        },
        v4 => v4,
    }
}

/// Parses `addr` or `addr/prefix` (the prefix is ignored), canonicalized.
pub fn parse_addr_or_cidr(s: &str) -> Option<IpAddr> {
    let addr = match s.split_once('/') {
        Some((a, prefix)) => {
            prefix.parse::<u8>().ok()?;
            a
        }
        None => s,
    };
    addr.parse::<IpAddr>().ok().map(canonical)
}

/// The next address, or None past the family's last one.
pub fn next(ip: IpAddr) -> Option<IpAddr> {
    let v4 = ip.is_ipv4();
    let n = to_int(ip).checked_add(1)?;
    if v4 && n > u32::MAX as u128 {
        return None;
    }
    Some(from_int(n, v4))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_and_limits() {
        assert_eq!(
            next("10.0.0.255".parse().unwrap()),
            Some("10.0.1.0".parse().unwrap())
        );
        assert_eq!(next("255.255.255.255".parse().unwrap()), None);
        assert_eq!(
            next("2001:db8::ffff".parse().unwrap()),
            Some("2001:db8::1:0".parse().unwrap())
        );
        assert_eq!(
            next("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff".parse().unwrap()),
            None
        );
    }

    #[test]
    fn mapped_addresses_become_ipv4() {
        assert_eq!(
            parse_addr_or_cidr("::ffff:10.1.2.3"),
            Some("10.1.2.3".parse().unwrap())
        );
        assert_eq!(
            parse_addr_or_cidr("10.1.2.3/24"),
            Some("10.1.2.3".parse().unwrap())
        );
        assert_eq!(parse_addr_or_cidr("10.1.2.3/x"), None);
        assert_eq!(parse_addr_or_cidr("nope"), None);
    }

    #[test]
    fn ipv6_text_is_what_go_prints() {
        // Go's net.IP.String: RFC 5952, "::" only for a run of two or more zero groups.
        for (input, go) in [
            ("2001:0db8:0000:0000:0000:0000:0000:0005", "2001:db8::5"),
            ("2001:db8:0:1:0:0:0:1", "2001:db8:0:1::1"),
            ("2001:db8:0:0:1:0:0:1", "2001:db8::1:0:0:1"),
            ("fd00:0:0:0:0:0:0:0", "fd00::"),
            ("2001:db8:1:2:3:4:0:6", "2001:db8:1:2:3:4:0:6"),
            ("::0102:0304", "::102:304"),
        ] {
            let ip: IpAddr = input.parse().unwrap();
            assert_eq!(ip.to_string(), go, "{input}");
        }
    }
}
