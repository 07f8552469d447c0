//! Which subnet a node takes: pure, over the leases a registry listed.

use crate::config::NetConfig;
use crate::family::IpFamily;
use crate::lease::{Lease, SubnetKey};
use ipnetwork::IpNetwork;
use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// How many free subnets, from SubnetMin up, the random pick chooses among (flannel's figure).
pub const CANDIDATES: usize = 100;

/// This node's public addresses, as they go into its lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Node {
    pub public_ip: Option<Ipv4Addr>,
    pub public_ipv6: Option<Ipv6Addr>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// The node's own lease from before: renew it as it is.
    Reuse(SubnetKey),
    /// A subnet nobody holds: create its lease, guarded by the key not existing.
    Create(SubnetKey),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Leases of this node that no longer fit the config: delete them first.
    pub stale: Vec<SubnetKey>,
    /// Reservations of this node that do not fit the config: an operator's, left as they are.
    pub kept: Vec<SubnetKey>,
    pub action: Action,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutOfSubnets {
    pub family: IpFamily,
}

impl std::fmt::Display for OutOfSubnets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "out of {} subnets: every subnet from SubnetMin to SubnetMax is leased",
            self.family.name()
        )
    }
}

impl std::error::Error for OutOfSubnets {}

/// A network's address as an integer, the same for both families.
fn int(n: IpNetwork) -> u128 {
    match n.network() {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

/// How many host bits a network of `family` with this prefix has.
fn host_bits(family: IpFamily, prefix: u8) -> u32 {
    u32::from(family.host_prefix()) - u32::from(prefix)
}

/// One family of the config as the allocator counts it: the subnets it hands out, their
/// network addresses as integers.
struct Span {
    family: IpFamily,
    subnet_len: u8,
    min: u128,
    max: u128,
}

impl Span {
    fn of(cfg: &NetConfig, family: IpFamily) -> Option<Span> {
        let (subnet_len, min, max) = match family {
            IpFamily::V4 => cfg.ipv4.map(|f| {
                let (lo, hi) = (f.subnet_min.into(), f.subnet_max.into());
                (f.subnet_len, int(lo), int(hi))
            })?,
            IpFamily::V6 => cfg.ipv6.map(|f| {
                let (lo, hi) = (f.subnet_min.into(), f.subnet_max.into());
                (f.subnet_len, int(lo), int(hi))
            })?,
        };
        Some(Span {
            family,
            subnet_len,
            min,
            max,
        })
    }

    fn bits(&self) -> u32 {
        host_bits(self.family, self.subnet_len)
    }

    /// Whether `sn` is a subnet it hands out.
    fn holds(&self, sn: IpNetwork) -> bool {
        sn.prefix() == self.subnet_len && int(sn) >= self.min && int(sn) <= self.max
    }

    /// The subnet at `at`.
    fn subnet(&self, at: u128) -> Option<IpNetwork> {
        let ip = match self.family {
            IpFamily::V4 => IpAddr::V4(Ipv4Addr::from(u32::try_from(at).ok()?)),
            IpFamily::V6 => IpAddr::V6(Ipv6Addr::from(at)),
        };
        IpNetwork::new(ip, self.subnet_len).ok()
    }
}

/// Whether a lease's subnets are ones this config could hand out.
pub fn fits(cfg: &NetConfig, key: &SubnetKey) -> bool {
    IpFamily::BOTH
        .into_iter()
        .all(|f| match (Span::of(cfg, f), key.subnet(f)) {
            (None, None) => true,
            (Some(span), Some(sn)) => span.holds(sn),
            _ => false,
        })
}

/// Whether the lease was this node's: flannel matches on the public address of the first
/// enabled family.
pub fn is_mine(cfg: &NetConfig, node: &Node, lease: &Lease) -> bool {
    if cfg.ipv4.is_some() {
        node.public_ip.is_some() && lease.attrs.public_ip == node.public_ip
    } else {
        node.public_ipv6.is_some() && lease.attrs.public_ipv6 == node.public_ipv6
    }
}

/// The address space held by leases of one family: the networks of leases of the config's
/// subnet length (looked up at once), and the ranges of any other length, left by an earlier
/// SubnetLen, which a candidate must not overlap either (as flanneld checks).
#[derive(Debug, Default)]
struct Taken {
    same: HashSet<u128>,
    other: Vec<(u128, u128)>,
}

impl Taken {
    /// `subnets` as (network, host bits) pairs; `bits` is the config's host bits.
    fn new(subnets: impl Iterator<Item = (u128, u32)>, bits: u32) -> Taken {
        let mut t = Taken::default();
        for (net, host) in subnets {
            if host == bits {
                t.same.insert(net);
            } else {
                let last = net.saturating_add(size(host) - 1);
                t.other.push((net, last));
            }
        }
        t
    }

    /// Whether the subnet at `at` of `bits` host bits overlaps a held one.
    fn holds(&self, at: u128, bits: u32) -> bool {
        let last = at.saturating_add(size(bits) - 1);
        self.same.contains(&at) || self.other.iter().any(|&(s, e)| s <= last && at <= e)
    }
}

/// The number of addresses of a subnet with `host` host bits (2^128 saturates).
fn size(host: u32) -> u128 {
    1u128.checked_shl(host).unwrap_or(u128::MAX)
}

/// Up to `limit` free subnet starts from `min` to `max`, of `bits` host bits each.
fn free(min: u128, max: u128, bits: u32, used: &Taken, limit: usize) -> Vec<u128> {
    let mut out = Vec::new();
    let mut at = min;
    while at <= max && out.len() < limit {
        if !used.holds(at, bits) {
            out.push(at);
        }
        match at.checked_add(size(bits)) {
            Some(next) => at = next,
            None => break,
        }
    }
    out
}

/// Decides the node's subnet: its own earlier lease if it still fits, else the subnet of the
/// previous subnet.env if nobody holds it, else a random one among the first free ones.
/// Of `reserved` (leases an operator wrote to last), none is ever deleted or free.
/// `pick(n)` returns an index below n.
pub fn choose(
    cfg: &NetConfig,
    leases: &[Lease],
    reserved: &[SubnetKey],
    node: &Node,
    previous: Option<SubnetKey>,
    pick: &mut dyn FnMut(usize) -> usize,
) -> Result<Plan, OutOfSubnets> {
    let mine: Vec<&Lease> = leases.iter().filter(|l| is_mine(cfg, node, l)).collect();
    let (kept, stale): (Vec<SubnetKey>, Vec<SubnetKey>) = mine
        .iter()
        .filter(|l| !fits(cfg, &l.key))
        .map(|l| l.key)
        .partition(|k| reserved.contains(k));
    if let Some(own) = mine.iter().find(|l| fits(cfg, &l.key)) {
        return Ok(Plan {
            stale,
            kept,
            action: Action::Reuse(own.key),
        });
    }
    let others: Vec<&Lease> = leases.iter().filter(|l| !stale.contains(&l.key)).collect();
    // Per family the config has: its span, and what the other leases hold of it.
    let spans: Vec<(Span, Taken)> = IpFamily::BOTH
        .into_iter()
        .filter_map(|f| {
            let span = Span::of(cfg, f)?;
            let held = others
                .iter()
                .filter_map(|l| l.key.subnet(f))
                .map(|n| (int(n), host_bits(f, n.prefix())));
            let taken = Taken::new(held, span.bits());
            Some((span, taken))
        })
        .collect();
    if let Some(prev) = previous.filter(|p| fits(cfg, p)) {
        let free = spans.iter().all(|(span, taken)| {
            prev.subnet(span.family)
                .is_none_or(|n| !taken.holds(int(n), span.bits()))
        });
        if free {
            return Ok(Plan {
                stale,
                kept,
                action: Action::Create(prev),
            });
        }
    }
    let mut key = SubnetKey {
        ipv4: None,
        ipv6: None,
    };
    for (span, taken) in &spans {
        let cands = free(span.min, span.max, span.bits(), taken, CANDIDATES);
        if cands.is_empty() {
            return Err(OutOfSubnets {
                family: span.family,
            });
        }
        let at = cands[pick(cands.len()).min(cands.len() - 1)];
        if let Some(sn) = span.subnet(at) {
            key = key.with(sn);
        }
    }
    Ok(Plan {
        stale,
        kept,
        action: Action::Create(key),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config;
    use crate::lease::LeaseAttrs;

    fn cfg(text: &str) -> NetConfig {
        config::parse(text).unwrap()
    }

    fn lease(key: &str, ip: &str) -> Lease {
        Lease {
            key: SubnetKey::parse(key).unwrap(),
            attrs: LeaseAttrs {
                public_ip: Some(ip.parse().unwrap()),
                public_ipv6: None,
                backend_type: "vxlan".into(),
                backend_data: None,
                backend_v6_data: None,
            },
        }
    }

    fn me() -> Node {
        Node {
            public_ip: Some(Ipv4Addr::new(192, 168, 0, 9)),
            public_ipv6: None,
        }
    }

    fn first(_: usize) -> usize {
        0
    }

    #[test]
    fn a_lease_carrying_this_nodes_address_is_reused() {
        let c = cfg(r#"{"Network":"10.5.0.0/16"}"#);
        let leases = [
            lease("10.5.7.0-24", "192.168.0.1"),
            lease("10.5.9.0-24", "192.168.0.9"),
        ];
        let plan = choose(&c, &leases, &[], &me(), None, &mut first).unwrap();
        assert_eq!(
            plan.action,
            Action::Reuse(SubnetKey::parse("10.5.9.0-24").unwrap())
        );
        assert!(plan.stale.is_empty());
    }

    #[test]
    fn a_lease_of_this_node_that_no_longer_fits_is_deleted_and_replaced() {
        let c = cfg(r#"{"Network":"10.5.0.0/16","SubnetLen":25}"#);
        let leases = [lease("10.5.1.0-24", "192.168.0.9")];
        let plan = choose(&c, &leases, &[], &me(), None, &mut first).unwrap();
        assert_eq!(plan.stale, vec![SubnetKey::parse("10.5.1.0-24").unwrap()]);
        // Its subnet is free again once it is deleted.
        assert_eq!(
            plan.action,
            Action::Create(SubnetKey::parse("10.5.0.128-25").unwrap())
        );
    }

    #[test]
    fn a_subnet_overlapping_a_lease_of_another_length_is_never_chosen() {
        // Leases of an earlier SubnetLen 24 stay live after the config moved to 25: neither
        // half of a held /24 may be handed out, nor a /25 previous subnet inside one.
        let c = cfg(r#"{"Network":"10.5.0.0/16","SubnetLen":25}"#);
        let held = [
            lease("10.5.1.0-24", "192.168.0.1"),
            lease("10.5.2.0-24", "192.168.0.2"),
            lease("10.5.3.0-25", "192.168.0.3"),
        ];
        let mut all = |n: usize| n - 1;
        // SubnetMin is 10.5.0.128, the second /25; then 10.5.3.128 is the next free one.
        let mut second = |_: usize| 1;
        let plan = choose(&c, &held, &[], &me(), None, &mut second).unwrap();
        assert_eq!(
            plan.action,
            Action::Create(SubnetKey::parse("10.5.3.128-25").unwrap())
        );
        // Of the first 100 free /25s, none is inside 10.5.1.0/24 or 10.5.2.0/24.
        let plan = choose(&c, &held, &[], &me(), None, &mut all).unwrap();
        let Action::Create(last) = plan.action else {
            panic!("{plan:?}")
        };
        assert_eq!(last, SubnetKey::parse("10.5.52.128-25").unwrap());
        let prev = SubnetKey::parse("10.5.2.128-25").ok();
        let plan = choose(&c, &held, &[], &me(), prev, &mut first).unwrap();
        assert_eq!(
            plan.action,
            Action::Create(SubnetKey::parse("10.5.0.128-25").unwrap())
        );
        // And the other way round: a /23 lease holds both /24s inside it.
        let c = cfg(r#"{"Network":"10.5.0.0/16"}"#);
        let plan = choose(
            &c,
            &[lease("10.5.0.0-23", "192.168.0.1")],
            &[],
            &me(),
            None,
            &mut first,
        )
        .unwrap();
        assert_eq!(
            plan.action,
            Action::Create(SubnetKey::parse("10.5.2.0-24").unwrap())
        );
    }

    #[test]
    fn a_reservation_that_no_longer_fits_is_kept_and_never_free() {
        let c = cfg(r#"{"Network":"10.5.0.0/16","SubnetLen":25}"#);
        let leases = [lease("10.5.0.0-24", "192.168.0.9")];
        let reserved = [SubnetKey::parse("10.5.0.0-24").unwrap()];
        let plan = choose(&c, &leases, &reserved, &me(), None, &mut first).unwrap();
        assert!(plan.stale.is_empty(), "never deleted");
        assert_eq!(plan.kept, reserved);
        // Neither half of it is handed out.
        assert_eq!(
            plan.action,
            Action::Create(SubnetKey::parse("10.5.1.0-25").unwrap())
        );
        // Another node's reservation is no more free than its lease.
        let theirs = [lease("10.5.0.0-25", "192.168.0.1")];
        let reserved = [SubnetKey::parse("10.5.0.0-25").unwrap()];
        let plan = choose(&c, &theirs, &reserved, &me(), None, &mut first).unwrap();
        assert_eq!(
            plan.action,
            Action::Create(SubnetKey::parse("10.5.0.128-25").unwrap())
        );
    }

    #[test]
    fn the_previous_subnet_is_taken_again_when_free() {
        let c = cfg(r#"{"Network":"10.5.0.0/16"}"#);
        let prev = SubnetKey::parse("10.5.77.0-24").ok();
        let plan = choose(
            &c,
            &[lease("10.5.1.0-24", "192.168.0.1")],
            &[],
            &me(),
            prev,
            &mut first,
        )
        .unwrap();
        assert_eq!(plan.action, Action::Create(prev.unwrap()));
        // Held by someone else: a fresh one instead.
        let plan = choose(
            &c,
            &[lease("10.5.77.0-24", "192.168.0.1")],
            &[],
            &me(),
            prev,
            &mut first,
        )
        .unwrap();
        assert_eq!(
            plan.action,
            Action::Create(SubnetKey::parse("10.5.1.0-24").unwrap())
        );
        // Outside the config: ignored.
        let prev = SubnetKey::parse("10.9.77.0-24").ok();
        let plan = choose(&c, &[], &[], &me(), prev, &mut first).unwrap();
        assert_eq!(
            plan.action,
            Action::Create(SubnetKey::parse("10.5.1.0-24").unwrap())
        );
    }

    #[test]
    fn a_fresh_subnet_is_picked_among_the_first_hundred_free_ones() {
        let c = cfg(r#"{"Network":"10.5.0.0/16"}"#);
        let leases = [
            lease("10.5.1.0-24", "192.168.0.1"),
            lease("10.5.3.0-24", "192.168.0.3"),
        ];
        let mut seen = 0;
        let plan = choose(&c, &leases, &[], &me(), None, &mut |n| {
            seen = n;
            n - 1
        })
        .unwrap();
        assert_eq!(seen, CANDIDATES);
        // Free ones are 2, 4, 5, ... : the 100th free is 10.5.102.0.
        assert_eq!(
            plan.action,
            Action::Create(SubnetKey::parse("10.5.102.0-24").unwrap())
        );
        let plan = choose(&c, &leases, &[], &me(), None, &mut |_| 1).unwrap();
        assert_eq!(
            plan.action,
            Action::Create(SubnetKey::parse("10.5.4.0-24").unwrap())
        );
    }

    #[test]
    fn out_of_subnets_when_every_one_is_held() {
        let c = cfg(r#"{"Network":"10.5.0.0/16","SubnetMin":"10.5.1.0","SubnetMax":"10.5.2.0"}"#);
        let leases = [
            lease("10.5.1.0-24", "192.168.0.1"),
            lease("10.5.2.0-24", "192.168.0.2"),
        ];
        let e = choose(&c, &leases, &[], &me(), None, &mut first).unwrap_err();
        assert!(e.to_string().contains("out of IPv4 subnets"), "{e}");
        let plan = choose(&c, &leases[..1], &[], &me(), None, &mut first).unwrap();
        assert_eq!(
            plan.action,
            Action::Create(SubnetKey::parse("10.5.2.0-24").unwrap())
        );
    }

    #[test]
    fn dual_stack_picks_one_subnet_of_each_family() {
        let c = cfg(r#"{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fc00::/48"}"#);
        let node = Node {
            public_ip: Some(Ipv4Addr::new(192, 168, 0, 9)),
            public_ipv6: Some("fd00::9".parse().unwrap()),
        };
        let leases = [Lease {
            key: SubnetKey::parse("10.5.1.0-24&fc00:0:0:1::-64").unwrap(),
            ..lease("10.5.1.0-24", "192.168.0.1")
        }];
        let plan = choose(&c, &leases, &[], &node, None, &mut first).unwrap();
        assert_eq!(
            plan.action,
            Action::Create(SubnetKey::parse("10.5.2.0-24&fc00:0:0:2::-64").unwrap())
        );
        // A v4-only lease of this node does not fit a dual-stack config.
        let plan = choose(
            &c,
            &[lease("10.5.9.0-24", "192.168.0.9")],
            &[],
            &node,
            None,
            &mut first,
        )
        .unwrap();
        assert_eq!(plan.stale.len(), 1);
    }
}
