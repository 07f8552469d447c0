//! Allocation: one address per range set, round robin from after the last reserved one.
//!
//! The decisions live here; the files are touched through [`Reservations`], which the
//! disk store implements and the tests fake.

use crate::config::{IpamConfig, Rangeset, Requested};
use crate::ip::{next, to_int};
use crate::range::RangeSet;
use cni_protocol::{CniError, IpConfig};
use std::net::IpAddr;

/// Who holds an address: a container's interface.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Key {
    pub container_id: String,
    pub ifname: String,
}

impl Key {
    pub fn new(container_id: &str, ifname: &str) -> Key {
        Key {
            container_id: container_id.trim().to_string(),
            ifname: ifname.to_string(),
        }
    }

    /// The reservation file's content: `<containerID>\r\n<ifname>`, no trailing newline.
    pub fn record(&self) -> String {
        format!("{}\r\n{}", self.container_id, self.ifname)
    }

    /// What files written before ifnames were recorded hold: the container ID alone.
    pub fn legacy_record(&self) -> &str {
        &self.container_id
    }
}

/// The reservations of one network, as the allocator needs them.
pub trait Reservations {
    /// Creates the reservation of `ip` for `key`; false when the address is taken.
    fn reserve(&mut self, key: &Key, ip: IpAddr) -> Result<bool, CniError>;
    /// Removes the reservation of `ip` if `key` holds it.
    fn release_ip(&mut self, key: &Key, ip: IpAddr) -> Result<(), CniError>;
    /// Every address held by `key`, or by its container ID in the one-line format.
    fn held_by(&mut self, key: &Key) -> Result<Vec<IpAddr>, CniError>;
    /// `last_reserved_ip.<set>`, when readable.
    fn last_reserved(&mut self, set: usize) -> Option<IpAddr>;
    fn set_last_reserved(&mut self, set: usize, ip: IpAddr) -> Result<(), CniError>;
}

/// The round-robin walk over a range set: starts after `last` when the set holds it
/// (else at the first range's start), skips gateways, wraps, and visits each address once.
pub struct RangeIter<'a> {
    set: &'a RangeSet,
    idx: usize,
    cur: Option<IpAddr>,
    first: Option<IpAddr>,
}

impl<'a> RangeIter<'a> {
    pub fn new(set: &'a RangeSet, last: Option<IpAddr>) -> RangeIter<'a> {
        let found = last.and_then(|ip| {
            set.ranges
                .iter()
                .position(|r| r.contains(ip))
                .map(|idx| (idx, ip))
        });
        match found {
            Some((idx, ip)) => RangeIter {
                set,
                idx,
                cur: Some(ip),
                first: None,
            },
            None => RangeIter {
                set,
                idx: 0,
                cur: None,
                first: None,
            },
        }
    }
}

impl Iterator for RangeIter<'_> {
    type Item = IpAddr;

    fn next(&mut self) -> Option<IpAddr> {
        loop {
            let ranges = &self.set.ranges;
            let cur = match self.cur {
                None => {
                    let start = ranges[self.idx].start;
                    self.first = Some(start);
                    start
                }
                Some(c) => {
                    let advanced = if to_int(c) >= to_int(ranges[self.idx].end) {
                        self.idx = (self.idx + 1) % ranges.len();
                        ranges[self.idx].start
                    } else {
                        // Below the range's end there is always a next address.
                        next(c)?
                    };
                    match self.first {
                        None => self.first = Some(advanced),
                        Some(f) if f == advanced => return None,
                        Some(_) => {}
                    }
                    advanced
                }
            };
            self.cur = Some(cur);
            if cur != ranges[self.idx].gateway {
                return Some(cur);
            }
        }
    }
}

fn internal(msg: String) -> CniError {
    CniError::internal(msg)
}

/// Reserves one address in range set `index` for `key`: `requested`, or the next free one.
pub fn allocate_in(
    store: &mut impl Reservations,
    rs: &Rangeset,
    index: usize,
    key: &Key,
    requested: Option<&Requested>,
) -> Result<IpConfig, CniError> {
    let set = &rs.set;
    let (ip, range) = match requested {
        Some(req) => {
            let ip = req.ip;
            // Messages name where the address was asked for and which set was asked.
            let range = set.range_for(ip).ok_or_else(|| {
                CniError::invalid_config(format!(
                    "requested IP {ip} ({}) is not in range set {index} ({} = {set})",
                    req.source, rs.field
                ))
            })?;
            if ip == range.gateway {
                return Err(CniError::invalid_config(format!(
                    "requested IP {ip} ({}) is the gateway of range {range} in range set {index} ({})",
                    req.source, rs.field
                )));
            }
            if !store.reserve(key, ip)? {
                return Err(internal(format!(
                    "requested IP address {ip} ({}) is not available in range set {index} ({} = {set})",
                    req.source, rs.field
                )));
            }
            (ip, range)
        }
        None => {
            if let Some(held) = store.held_by(key)?.into_iter().find(|ip| set.contains(*ip)) {
                return Err(internal(format!(
                    "{held} has been allocated to {} (ifname {}), duplicate allocation is not allowed",
                    key.container_id, key.ifname
                )));
            }
            let last = store.last_reserved(index);
            let mut found = None;
            for candidate in RangeIter::new(set, last) {
                if store.reserve(key, candidate)? {
                    found = Some(candidate);
                    break;
                }
            }
            let ip = found.ok_or_else(|| {
                internal(format!("no IP addresses available in range set: {set}"))
            })?;
            let range = set
                .range_for(ip)
                .ok_or_else(|| internal(format!("{ip} not in range set {set}")))?;
            (ip, range)
        }
    };
    store.set_last_reserved(index, ip)?;
    Ok(IpConfig {
        address: range.with_prefix(ip),
        gateway: Some(range.gateway),
        interface: None,
    })
}

/// One address from every range set. On failure, what this call reserved is released.
pub fn allocate(
    store: &mut impl Reservations,
    conf: &IpamConfig,
    key: &Key,
) -> Result<Vec<IpConfig>, CniError> {
    let plan = conf.assign_requested()?;
    let mut taken: Vec<IpConfig> = Vec::with_capacity(plan.len());
    for (index, (rs, requested)) in conf.rangesets.iter().zip(plan).enumerate() {
        match allocate_in(store, rs, index, key, requested) {
            Ok(ipc) => taken.push(ipc),
            Err(e) => {
                for ipc in &taken {
                    if let Err(undo) = store.release_ip(key, ipc.address.ip()) {
                        eprintln!("releasing {} after a failed ADD: {undo}", ipc.address.ip());
                    }
                }
                return Err(e.context(format!(
                    "failed to allocate for range {index} ({})",
                    rs.field
                )));
            }
        }
    }
    Ok(taken)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::range::RangeConf;
    use cni_protocol::Version;
    use serde_json::json;
    use std::collections::HashMap;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// subnet, rangeStart, rangeEnd, gateway
    type RangeRow<'a> = (&'a str, Option<&'a str>, Option<&'a str>, Option<&'a str>);

    fn set(ranges: &[RangeRow]) -> RangeSet {
        let confs: Vec<RangeConf> = ranges
            .iter()
            .map(|(subnet, start, end, gw)| RangeConf {
                subnet: Some(subnet.to_string()),
                range_start: start.map(str::to_string),
                range_end: end.map(str::to_string),
                gateway: gw.map(str::to_string),
            })
            .collect();
        RangeSet::from_conf(&confs, "t").unwrap()
    }

    fn walk(s: &RangeSet, last: Option<&str>) -> Vec<String> {
        RangeIter::new(s, last.map(ip))
            .map(|i| i.to_string())
            .collect()
    }

    #[test]
    fn walks_from_the_start_skipping_the_gateway() {
        let s = set(&[("10.0.0.0/29", None, None, None)]);
        assert_eq!(
            walk(&s, None),
            ["10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6"]
        );
    }

    #[test]
    fn round_robin_from_after_the_last_reserved_and_wraps_once() {
        let s = set(&[("10.0.0.0/29", None, None, None)]);
        assert_eq!(
            walk(&s, Some("10.0.0.4")),
            ["10.0.0.5", "10.0.0.6", "10.0.0.2", "10.0.0.3", "10.0.0.4"]
        );
        // A last address outside the set starts over.
        assert_eq!(walk(&s, Some("192.168.0.1")).len(), 5);
        assert_eq!(walk(&s, Some("10.0.0.6"))[0], "10.0.0.2");
    }

    #[test]
    fn walks_across_ranges_of_a_set() {
        let s = set(&[
            ("10.0.0.0/29", Some("10.0.0.5"), None, None),
            ("10.0.1.0/29", None, Some("10.0.1.2"), Some("10.0.1.2")),
        ]);
        assert_eq!(walk(&s, None), ["10.0.0.5", "10.0.0.6", "10.0.1.1"]);
        assert_eq!(
            walk(&s, Some("10.0.0.6")),
            ["10.0.1.1", "10.0.0.5", "10.0.0.6"]
        );
    }

    #[test]
    fn a_set_of_only_the_gateway_is_empty() {
        let s = set(&[("10.0.0.0/30", Some("10.0.0.1"), Some("10.0.0.1"), None)]);
        assert!(walk(&s, None).is_empty());
        assert!(walk(&s, Some("10.0.0.1")).is_empty());
    }

    #[test]
    fn ipv6_walk() {
        let s = set(&[("2001:db8::/126", None, None, None)]);
        assert_eq!(walk(&s, None), ["2001:db8::2", "2001:db8::3"]);
    }

    /// Reservations in memory, for the decisions alone.
    #[derive(Default)]
    struct Fake {
        held: HashMap<IpAddr, String>,
        last: HashMap<usize, IpAddr>,
    }

    impl Reservations for Fake {
        fn reserve(&mut self, key: &Key, ip: IpAddr) -> Result<bool, CniError> {
            if self.held.contains_key(&ip) {
                return Ok(false);
            }
            self.held.insert(ip, key.record());
            Ok(true)
        }
        fn release_ip(&mut self, key: &Key, ip: IpAddr) -> Result<(), CniError> {
            if self.held.get(&ip) == Some(&key.record()) {
                self.held.remove(&ip);
            }
            Ok(())
        }
        fn held_by(&mut self, key: &Key) -> Result<Vec<IpAddr>, CniError> {
            Ok(self
                .held
                .iter()
                .filter(|(_, v)| **v == key.record() || v.as_str() == key.legacy_record())
                .map(|(k, _)| *k)
                .collect())
        }
        fn last_reserved(&mut self, set: usize) -> Option<IpAddr> {
            self.last.get(&set).copied()
        }
        fn set_last_reserved(&mut self, set: usize, ip: IpAddr) -> Result<(), CniError> {
            self.last.insert(set, ip);
            Ok(())
        }
    }

    fn conf(v: serde_json::Value, env_ip: Option<&str>) -> IpamConfig {
        IpamConfig::load(&v, Version::V1_0_0, "n", env_ip).unwrap()
    }

    #[test]
    fn one_address_per_set_with_prefix_and_gateway() {
        let c = conf(
            json!({"ipam": {"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "2001:db8::/64", "gateway": "2001:db8::ff"}]]}}),
            None,
        );
        let mut f = Fake::default();
        let ips = allocate(&mut f, &c, &Key::new("c1", "eth0")).unwrap();
        assert_eq!(ips[0].address.to_string(), "10.0.0.2/24");
        assert_eq!(ips[0].gateway, Some(ip("10.0.0.1")));
        assert_eq!(ips[1].address.to_string(), "2001:db8::1/64");
        assert_eq!(ips[1].gateway, Some(ip("2001:db8::ff")));
        assert_eq!(f.last[&0], ip("10.0.0.2"));
        assert_eq!(f.held[&ip("10.0.0.2")], "c1\r\neth0");

        let ips = allocate(&mut f, &c, &Key::new("c2", "eth0")).unwrap();
        assert_eq!(ips[0].address.to_string(), "10.0.0.3/24");
    }

    #[test]
    fn a_second_add_for_the_same_attachment_names_the_holder() {
        let c = conf(json!({"ipam": {"subnet": "10.0.0.0/24"}}), None);
        let mut f = Fake::default();
        allocate(&mut f, &c, &Key::new("c1", "eth0")).unwrap();
        let e = allocate(&mut f, &c, &Key::new("c1", "eth0")).unwrap_err();
        assert!(
            e.msg.contains("10.0.0.2 has been allocated to c1"),
            "{}",
            e.msg
        );
        // Another interface of the same container is another attachment.
        allocate(&mut f, &c, &Key::new("c1", "eth1")).unwrap();
        assert_eq!(f.held.len(), 2);
    }

    #[test]
    fn a_full_set_names_the_range_and_releases_the_others() {
        let c = conf(
            json!({"ipam": {"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "10.1.0.0/30"}]]}}),
            None,
        );
        let mut f = Fake::default();
        allocate(&mut f, &c, &Key::new("c1", "eth0")).unwrap();
        let e = allocate(&mut f, &c, &Key::new("c2", "eth0")).unwrap_err();
        assert!(
            e.msg
                .contains("failed to allocate for range 1 (ipam.ranges[1])")
                && e.msg
                    .contains("no IP addresses available in range set: 10.1.0.1-10.1.0.2"),
            "{}",
            e.msg
        );
        assert_eq!(f.held.len(), 2, "c2's address in set 0 was released");
    }

    #[test]
    fn requested_addresses_are_honoured_or_refused() {
        let c = conf(
            json!({"ipam": {"subnet": "10.0.0.0/24"}}),
            Some("10.0.0.50"),
        );
        let mut f = Fake::default();
        let ips = allocate(&mut f, &c, &Key::new("c1", "eth0")).unwrap();
        assert_eq!(ips[0].address.to_string(), "10.0.0.50/24");
        assert_eq!(f.last[&0], ip("10.0.0.50"));
        let e = allocate(&mut f, &c, &Key::new("c2", "eth0")).unwrap_err();
        assert!(
            e.msg.contains(
                "requested IP address 10.0.0.50 (CNI_ARGS IP) is not available in range set 0 (ipam = 10.0.0.1-10.0.0.254)"
            ),
            "{}",
            e.msg
        );
    }

    #[test]
    fn requested_address_errors_name_their_source_and_the_range_set() {
        let c = conf(
            json!({
                "ipam": {"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "10.1.0.0/24"}]]},
                "args": {"cni": {"ips": ["10.1.0.7"]}},
                "runtimeConfig": {"ips": ["10.1.0.1"]}
            }),
            None,
        );
        let (by_args, by_runtime) = (&c.requested[0], &c.requested[1]);
        let key = Key::new("c1", "eth0");
        let mut f = Fake::default();
        let e = allocate_in(&mut f, &c.rangesets[1], 1, &key, Some(by_runtime)).unwrap_err();
        assert_eq!(e.code, 7);
        assert!(
            e.msg
                .contains("requested IP 10.1.0.1 (runtimeConfig.ips[0]) is the gateway of range")
                && e.msg.contains("in range set 1 (ipam.ranges[1])"),
            "{}",
            e.msg
        );
        let e = allocate_in(&mut f, &c.rangesets[0], 0, &key, Some(by_args)).unwrap_err();
        assert_eq!(e.code, 7);
        assert!(
            e.msg.contains(
                "requested IP 10.1.0.7 (args.cni.ips[0]) is not in range set 0 (ipam.ranges[0] = 10.0.0.1-10.0.0.254)"
            ),
            "{}",
            e.msg
        );
        assert!(f.held.is_empty(), "nothing reserved on refusal");
        allocate_in(&mut f, &c.rangesets[1], 1, &key, Some(by_args)).unwrap();
        let e = allocate_in(
            &mut f,
            &c.rangesets[1],
            1,
            &Key::new("c2", "eth0"),
            Some(by_args),
        )
        .unwrap_err();
        assert!(
            e.msg.contains("10.1.0.7 (args.cni.ips[0]) is not available in range set 1 (ipam.ranges[1] = 10.1.0.1-10.1.0.254)"),
            "{}",
            e.msg
        );
    }

    #[test]
    fn legacy_one_line_reservations_count_as_held() {
        let c = conf(json!({"ipam": {"subnet": "10.0.0.0/24"}}), None);
        let mut f = Fake::default();
        f.held.insert(ip("10.0.0.9"), "old".into());
        let e = allocate(&mut f, &c, &Key::new("old", "eth0")).unwrap_err();
        assert!(
            e.msg.contains("10.0.0.9 has been allocated to old"),
            "{}",
            e.msg
        );
    }
}
