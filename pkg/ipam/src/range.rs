//! Ranges and range sets: canonicalized from config, membership, overlap and their text form.

use crate::ip::{canonical, from_int, next, to_int};
use cni_protocol::CniError;
use ipnetwork::IpNetwork;
use serde::Deserialize;
use std::collections::HashSet;
use std::fmt;
use std::net::IpAddr;

/// One range as written in the config: every field optional but `subnet`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub struct RangeConf {
    #[serde(default)]
    pub subnet: Option<String>,
    #[serde(default, rename = "rangeStart")]
    pub range_start: Option<String>,
    #[serde(default, rename = "rangeEnd")]
    pub range_end: Option<String>,
    #[serde(default)]
    pub gateway: Option<String>,
}

/// A canonical range: the network, the first and last allocatable addresses, the gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Range {
    /// The subnet, with the network address.
    pub subnet: IpNetwork,
    pub start: IpAddr,
    pub end: IpAddr,
    pub gateway: IpAddr,
}

fn invalid(field: &str, value: &str, why: impl fmt::Display) -> CniError {
    CniError::invalid_config(format!("{field} {value:?}: {why}"))
}

fn parse_member(field: &str, value: &str) -> Result<IpAddr, CniError> {
    value
        .parse::<IpAddr>()
        .map(canonical)
        .map_err(|_| invalid(field, value, "not an IP address"))
}

impl Range {
    /// Validates one range and fills its defaults, as the Go plugin does. `field` is its config path.
    pub fn from_conf(conf: &RangeConf, field: &str) -> Result<Range, CniError> {
        let subnet_field = format!("{field}.subnet");
        let text = conf
            .subnet
            .as_deref()
            .filter(|s| !s.is_empty())
            .ok_or_else(|| CniError::invalid_config(format!("{subnet_field} is missing")))?;
        let subnet = parse_subnet(&subnet_field, text)?;
        let network = subnet.network();
        let v4 = subnet.is_ipv4();
        let in_family = |ip: IpAddr| ip.is_ipv4() == v4;

        let gateway = match conf.gateway.as_deref().filter(|s| !s.is_empty()) {
            Some(g) => {
                let gw = parse_member(&format!("{field}.gateway"), g)?;
                if !in_family(gw) {
                    return Err(invalid(
                        &format!("{field}.gateway"),
                        g,
                        format_args!("not the address family of subnet {subnet}"),
                    ));
                }
                gw
            }
            None => next(network).unwrap_or(network),
        };
        let start = match conf.range_start.as_deref().filter(|s| !s.is_empty()) {
            Some(s) => {
                let ip = parse_member(&format!("{field}.rangeStart"), s)?;
                if !in_family(ip) || !subnet.contains(ip) {
                    return Err(invalid(
                        &format!("{field}.rangeStart"),
                        s,
                        format_args!("not in network {subnet}"),
                    ));
                }
                ip
            }
            None => next(network).unwrap_or(network),
        };
        let end = match conf.range_end.as_deref().filter(|s| !s.is_empty()) {
            Some(s) => {
                let ip = parse_member(&format!("{field}.rangeEnd"), s)?;
                if !in_family(ip) || !subnet.contains(ip) {
                    return Err(invalid(
                        &format!("{field}.rangeEnd"),
                        s,
                        format_args!("not in network {subnet}"),
                    ));
                }
                if to_int(ip) < to_int(start) {
                    return Err(invalid(
                        &format!("{field}.rangeEnd"),
                        s,
                        format_args!("before rangeStart {start}"),
                    ));
                }
                ip
            }
            None => last_address(&subnet),
        };
        Ok(Range {
            subnet,
            start,
            end,
            gateway,
        })
    }

    /// Whether `ip` is in the subnet and between start and end, inclusive.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        ip.is_ipv4() == self.subnet.is_ipv4()
            && self.subnet.contains(ip)
            && to_int(ip) >= to_int(self.start)
            && to_int(ip) <= to_int(self.end)
    }

    pub fn overlaps(&self, other: &Range) -> bool {
        self.subnet.is_ipv4() == other.subnet.is_ipv4()
            && (self.contains(other.start)
                || self.contains(other.end)
                || other.contains(self.start)
                || other.contains(self.end))
    }

    pub fn is_ipv4(&self) -> bool {
        self.subnet.is_ipv4()
    }

    /// The address with the subnet's prefix, as results carry it.
    pub fn with_prefix(&self, ip: IpAddr) -> IpNetwork {
        // The prefix is valid for the family by construction.
        IpNetwork::new(ip, self.subnet.prefix()).unwrap_or(self.subnet)
    }
}

/// The subnet must be `addr/prefix`, the network address, and hold at least two hosts.
fn parse_subnet(field: &str, text: &str) -> Result<IpNetwork, CniError> {
    if !text.contains('/') {
        return Err(invalid(field, text, "not a CIDR (address/prefix)"));
    }
    let subnet: IpNetwork = text
        .parse()
        .map_err(|_| invalid(field, text, "not a CIDR (address/prefix)"))?;
    if let IpNetwork::V6(n) = subnet {
        if n.ip().to_ipv4_mapped().is_some() {
            return Err(invalid(
                field,
                text,
                "IPv4-mapped IPv6 subnets are not allowed: write the IPv4 subnet",
            ));
        }
    }
    let bits = if subnet.is_ipv4() { 32 } else { 128 };
    if subnet.prefix() > bits - 2 {
        return Err(invalid(
            field,
            text,
            format_args!("network {subnet} is too small to allocate from"),
        ));
    }
    if subnet.ip() != subnet.network() {
        return Err(invalid(
            field,
            text,
            format_args!(
                "host bits are set: for a /{} the network address is {}",
                subnet.prefix(),
                subnet.network()
            ),
        ));
    }
    Ok(subnet)
}

/// The last address of a subnet, less the broadcast address for IPv4.
fn last_address(subnet: &IpNetwork) -> IpAddr {
    let bits = if subnet.is_ipv4() { 32 } else { 128 };
    let host_bits = bits - subnet.prefix() as u32;
    let mask = if host_bits >= 128 {
        u128::MAX
    } else {
        (1u128 << host_bits) - 1
    };
    let last = to_int(subnet.network()) | mask;
    if subnet.is_ipv4() {
        from_int(last - 1, true)
    } else {
        from_int(last, false)
    }
}

impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.start, self.end)
    }
}

/// Ranges of one family handing out one address per ADD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeSet {
    pub ranges: Vec<Range>,
}

impl RangeSet {
    /// Validates a set: not empty, one family, no two ranges overlapping.
    pub fn from_conf(confs: &[RangeConf], field: &str) -> Result<RangeSet, CniError> {
        if confs.is_empty() {
            return Err(CniError::invalid_config(format!(
                "{field} is an empty range set"
            )));
        }
        let ranges = confs
            .iter()
            .enumerate()
            .map(|(i, c)| Range::from_conf(c, &format!("{field}[{i}]")))
            .collect::<Result<Vec<_>, _>>()?;
        let v4 = ranges[0].is_ipv4();
        if let Some((i, r)) = ranges.iter().enumerate().find(|(_, r)| r.is_ipv4() != v4) {
            return Err(CniError::invalid_config(format!(
                "{field}[{i}].subnet {:?}: mixed address families in one range set ({field}[0] is {})",
                r.subnet.to_string(),
                ranges[0].subnet
            )));
        }
        for (i, a) in ranges.iter().enumerate() {
            for (j, b) in ranges.iter().enumerate().skip(i + 1) {
                if a.overlaps(b) {
                    return Err(CniError::invalid_config(format!(
                        "{field}[{i}] ({a} in {}) and {field}[{j}] ({b} in {}) overlap",
                        a.subnet, b.subnet
                    )));
                }
            }
        }
        Ok(RangeSet { ranges })
    }

    pub fn range_for(&self, ip: IpAddr) -> Option<&Range> {
        self.ranges.iter().find(|r| r.contains(ip))
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        self.range_for(ip).is_some()
    }

    pub fn overlaps(&self, other: &RangeSet) -> bool {
        self.ranges
            .iter()
            .any(|a| other.ranges.iter().any(|b| a.overlaps(b)))
    }

    pub fn is_ipv4(&self) -> bool {
        self.ranges[0].is_ipv4()
    }

    /// How many addresses the set hands out: those of its ranges, less each range's gateway.
    pub fn capacity(&self) -> u128 {
        self.ranges.iter().fold(0u128, |n, r| {
            let span = (to_int(r.end) - to_int(r.start)).saturating_add(1);
            n.saturating_add(span - u128::from(r.contains(r.gateway)))
        })
    }

    /// Whether the network's reserved addresses (`taken`) leave none of the set's free.
    pub fn is_exhausted(&self, taken: &HashSet<IpAddr>) -> bool {
        let used = taken
            .iter()
            .filter(|ip| {
                self.range_for(**ip)
                    .is_some_and(|r| r.gateway != canonical(**ip))
            })
            .count();
        used as u128 >= self.capacity()
    }
}

impl fmt::Display for RangeSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.ranges.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taken(ips: &[&str]) -> HashSet<IpAddr> {
        ips.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn a_set_is_exhausted_when_every_address_but_the_gateways_is_taken() {
        let small = RangeConf {
            range_start: Some("10.0.0.1".into()),
            range_end: Some("10.0.0.3".into()),
            ..conf("10.0.0.0/24")
        };
        let set = RangeSet::from_conf(&[small, conf("10.1.0.0/30")], "ranges[0]").unwrap();
        // 10.0.0.2-3 (.1 is the gateway) and 10.1.0.2 (.1 is the gateway).
        assert_eq!(set.capacity(), 3);
        let full = ["10.0.0.2", "10.0.0.3", "10.1.0.2"];
        assert!(set.is_exhausted(&taken(&full)));
        assert!(!set.is_exhausted(&taken(&full[..2])));
        // Reservations outside the set, or of a gateway, leave its addresses free.
        assert!(!set.is_exhausted(&taken(&["10.0.0.2", "10.0.0.3", "10.0.0.1", "10.2.0.2"])));
        let v6 = RangeSet::from_conf(&[conf("fd00::/64")], "ranges[1]").unwrap();
        assert_eq!(v6.capacity(), (1u128 << 64) - 2);
        assert!(!v6.is_exhausted(&taken(&["fd00::2"])));
        let huge = RangeSet::from_conf(&[conf("::/1")], "r").unwrap();
        assert!(huge.capacity() > 1 << 120);
    }

    fn conf(subnet: &str) -> RangeConf {
        RangeConf {
            subnet: Some(subnet.into()),
            ..Default::default()
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn defaults_for_ipv4_and_ipv6() {
        let r = Range::from_conf(&conf("10.1.2.0/24"), "ipam").unwrap();
        assert_eq!(r.start, ip("10.1.2.1"));
        assert_eq!(r.end, ip("10.1.2.254"));
        assert_eq!(r.gateway, ip("10.1.2.1"));
        assert_eq!(r.to_string(), "10.1.2.1-10.1.2.254");

        let r = Range::from_conf(&conf("2001:db8:1::/64"), "ipam").unwrap();
        assert_eq!(r.start, ip("2001:db8:1::1"));
        assert_eq!(r.end, ip("2001:db8:1::ffff:ffff:ffff:ffff"));
        assert_eq!(r.gateway, ip("2001:db8:1::1"));

        let r = Range::from_conf(&conf("10.0.0.0/30"), "ipam").unwrap();
        assert_eq!((r.start, r.end), (ip("10.0.0.1"), ip("10.0.0.2")));
    }

    #[test]
    fn explicit_fields_are_kept() {
        let c = RangeConf {
            subnet: Some("10.1.2.0/24".into()),
            range_start: Some("10.1.2.10".into()),
            range_end: Some("10.1.2.20".into()),
            gateway: Some("10.1.2.254".into()),
        };
        let r = Range::from_conf(&c, "ipam").unwrap();
        assert_eq!(
            (r.start, r.end, r.gateway),
            (ip("10.1.2.10"), ip("10.1.2.20"), ip("10.1.2.254"))
        );
        assert!(r.contains(ip("10.1.2.10")) && r.contains(ip("10.1.2.20")));
        assert!(!r.contains(ip("10.1.2.9")) && !r.contains(ip("10.1.2.21")));
        assert!(!r.contains(ip("2001:db8::1")));
        assert_eq!(r.with_prefix(ip("10.1.2.15")).to_string(), "10.1.2.15/24");
    }

    fn err_of(c: RangeConf) -> String {
        let e = Range::from_conf(&c, "ipam.ranges[0][0]").unwrap_err();
        assert_eq!(e.code, 7, "{}", e.msg);
        e.msg
    }

    #[test]
    fn each_rule_is_code_7_naming_field_and_value() {
        for (subnet, words) in [
            ("10.0.0.0/31", "too small"),
            ("10.0.0.0/32", "too small"),
            ("2001:db8::/127", "too small"),
            ("2001:db8::/128", "too small"),
            ("10.0.0.5/24", "network address is 10.0.0.0"),
            ("10.0.0.0", "not a CIDR"),
            ("banana/8", "not a CIDR"),
            ("10.0.0.0/33", "not a CIDR"),
        ] {
            let m = err_of(conf(subnet));
            assert!(m.contains("ipam.ranges[0][0].subnet"), "{m}");
            assert!(m.contains(&format!("{subnet:?}")), "{m}");
            assert!(m.contains(words), "{subnet}: {m}");
        }
        let m = err_of(RangeConf::default());
        assert!(m.contains("ipam.ranges[0][0].subnet is missing"), "{m}");

        let with = |f: fn(&mut RangeConf)| {
            let mut c = conf("10.0.0.0/24");
            f(&mut c);
            err_of(c)
        };
        let m = with(|c| c.range_start = Some("10.0.1.5".into()));
        assert!(
            m.contains("rangeStart \"10.0.1.5\": not in network 10.0.0.0/24"),
            "{m}"
        );
        let m = with(|c| c.range_end = Some("10.0.1.5".into()));
        assert!(m.contains("rangeEnd \"10.0.1.5\": not in network"), "{m}");
        let m = with(|c| {
            c.range_start = Some("10.0.0.50".into());
            c.range_end = Some("10.0.0.40".into());
        });
        assert!(
            m.contains("rangeEnd \"10.0.0.40\": before rangeStart 10.0.0.50"),
            "{m}"
        );
        let m = with(|c| c.gateway = Some("nope".into()));
        assert!(m.contains("gateway \"nope\": not an IP address"), "{m}");
        let m = with(|c| c.gateway = Some("2001:db8::1".into()));
        assert!(m.contains("gateway \"2001:db8::1\""), "{m}");
        let m = with(|c| c.range_start = Some("2001:db8::1".into()));
        assert!(m.contains("rangeStart \"2001:db8::1\""), "{m}");
    }

    #[test]
    fn sets_refuse_mixed_families_overlaps_and_emptiness() {
        let e = RangeSet::from_conf(&[], "ipam.ranges[1]").unwrap_err();
        assert_eq!(e.code, 7);
        assert!(e.msg.contains("ipam.ranges[1] is an empty range set"));

        let e = RangeSet::from_conf(
            &[conf("10.0.0.0/24"), conf("2001:db8::/64")],
            "ipam.ranges[0]",
        )
        .unwrap_err();
        assert!(e.msg.contains("mixed address families"), "{}", e.msg);
        assert!(e.msg.contains("\"2001:db8::/64\""), "{}", e.msg);

        let e = RangeSet::from_conf(
            &[conf("10.0.0.0/24"), conf("10.0.0.0/16")],
            "ipam.ranges[0]",
        )
        .unwrap_err();
        assert!(e.msg.contains("overlap"), "{}", e.msg);
        assert!(e.msg.contains("10.0.0.0/16"), "{}", e.msg);

        let s = RangeSet::from_conf(&[conf("10.0.0.0/24"), conf("10.0.1.0/24")], "r").unwrap();
        assert_eq!(s.to_string(), "10.0.0.1-10.0.0.254,10.0.1.1-10.0.1.254");
        assert_eq!(s.range_for(ip("10.0.1.7")), Some(&s.ranges[1]));
        assert!(!s.contains(ip("10.0.2.7")));
    }

    #[test]
    fn overlap_needs_shared_addresses_not_just_subnets() {
        let a = Range::from_conf(
            &RangeConf {
                subnet: Some("10.0.0.0/24".into()),
                range_end: Some("10.0.0.99".into()),
                ..Default::default()
            },
            "a",
        )
        .unwrap();
        let b = Range::from_conf(
            &RangeConf {
                subnet: Some("10.0.0.0/24".into()),
                range_start: Some("10.0.0.100".into()),
                ..Default::default()
            },
            "b",
        )
        .unwrap();
        assert!(!a.overlaps(&b));
        let v6 = Range::from_conf(&conf("2001:db8::/64"), "c").unwrap();
        assert!(!a.overlaps(&v6));
    }
}
