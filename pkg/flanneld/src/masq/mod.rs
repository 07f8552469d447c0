//! `--ip-masq` and the FORWARD accept rules, in flannel's exact text so that an operator's
//! tooling, and a switch back to flannel, find what they expect: iptables chains
//! `FLANNEL-POSTRTG` (nat) and `FLANNEL-FWD` (filter), or with `EnableNFTables` (or on a host
//! without iptables) the tables `flannel-ipv4` / `flannel-ipv6` with chains `postrtg` and
//! `forward`.
//!
//! Each way of writing the rules is a [`Dialect`] in a file of its own ([`iptables`], [`nft`]):
//! its text, and the pure comparison of it with what the kernel holds. Which tool runs a
//! dialect's text, and for iptables in which mode, is the firewall driver's. [`plan`] has the
//! driver read the rules once and plan a [`Pass`]: the batches that remove what an earlier run
//! left (the other dialects' rules, ours in the iptables mode not chosen; with [`previous`] of
//! the subnet.env about to be replaced, an earlier subnet's), then the batch per tool that
//! writes what is missing; its [`Pass::apply`] writes exactly those. The firewall plane
//! (`crate::planes::firewall`) plans and applies a pass at start and every
//! `--iptables-resync`; [`ensure`], [`remove_other_mode`] and [`remove_stale`] are one part of
//! a pass, planned and applied. Nothing is removed at exit, so that a restart leaves the rules,
//! and the traffic, as they were. A third dialect is a file implementing [`Dialect`], a line in
//! [`DIALECTS`] and its choice in [`MasqSpec::dialect`].

pub mod iptables;
pub mod nft;

pub use iptables::{FWD_CHAIN, POSTRTG_CHAIN};
pub use nft::{NFT_TABLE_V4, NFT_TABLE_V6};

use cni_kernel::firewall::{Backend, Batches, Family, Rules};
use cni_kernel::{Error, Result};
use ipnetwork::{IpNetwork, Ipv4Network, Ipv6Network};
use std::sync::Mutex;

/// `--ip-masq` and its siblings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MasqOptions {
    /// `--ip-masq`: the masquerade chain.
    pub masq: bool,
    /// Not `--ip-masq-fully-random-disable`.
    pub random_fully: bool,
    /// `--iptables-forward-rules`: the forward accept chain.
    pub forward_rules: bool,
}

/// What the node's firewall should hold: the cluster network and this node's subnet per
/// family, and the options from the command line and the network config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MasqSpec {
    /// (network, this node's subnet).
    pub ipv4: Option<(Ipv4Network, Ipv4Network)>,
    pub ipv6: Option<(Ipv6Network, Ipv6Network)>,
    /// The rules are nftables': `EnableNFTables` in the network config, or a host without
    /// iptables (`spec::Firewall::choose`).
    pub nftables: bool,
    /// `--ip-masq`: the masquerade chain.
    pub masq: bool,
    /// Not `--ip-masq-fully-random-disable`.
    pub random_fully: bool,
    /// `--iptables-forward-rules`: the forward accept chain.
    pub forward_rules: bool,
}

/// One family's network and subnet as the tools print them (`10.5.0.0/16`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Net {
    pub family: Family,
    pub network: String,
    pub subnet: String,
}

impl Net {
    pub fn v4(network: Ipv4Network, subnet: Ipv4Network) -> Net {
        let canon = |n: Ipv4Network| format!("{}/{}", n.network(), n.prefix());
        Net {
            family: Family::V4,
            network: canon(network),
            subnet: canon(subnet),
        }
    }

    pub fn v6(network: Ipv6Network, subnet: Ipv6Network) -> Net {
        let canon = |n: Ipv6Network| format!("{}/{}", n.network(), n.prefix());
        Net {
            family: Family::V6,
            network: canon(network),
            subnet: canon(subnet),
        }
    }

    fn multicast(&self) -> &'static str {
        match self.family {
            Family::V4 => "224.0.0.0/4",
            Family::V6 => "ff00::/8",
        }
    }
}

fn nets(
    ipv4: Option<(Ipv4Network, Ipv4Network)>,
    ipv6: Option<(Ipv6Network, Ipv6Network)>,
) -> Vec<Net> {
    ipv4.map(|(n, s)| Net::v4(n, s))
        .into_iter()
        .chain(ipv6.map(|(n, s)| Net::v6(n, s)))
        .collect()
}

impl MasqSpec {
    pub fn nets(&self) -> Vec<Net> {
        nets(self.ipv4, self.ipv6)
    }
}

/// (network, subnet) of each family an earlier subnet.env names, for [`remove_stale`];
/// None for a family it lacks or cannot be read.
pub type Previous = (
    Option<(Ipv4Network, Ipv4Network)>,
    Option<(Ipv6Network, Ipv6Network)>,
);

/// The networks and subnets of an earlier subnet.env's text (subnets as written there, the
/// first address of the subnet; the rules use its network address).
pub fn previous(subnet_env: &str) -> Previous {
    let Ok(e) = subnetenv::parse_entries(subnet_env) else {
        return (None, None);
    };
    let first = |ns: &Option<Vec<IpNetwork>>| ns.as_ref().and_then(|v| v.first().copied());
    let ipv4 = match (first(&e.networks), e.subnet) {
        (Some(IpNetwork::V4(n)), Some(IpNetwork::V4(s))) => Some((n, s)),
        _ => None,
    };
    let ipv6 = match (first(&e.ipv6_networks), e.ipv6_subnet) {
        (Some(IpNetwork::V6(n)), Some(IpNetwork::V6(s))) => Some((n, s)),
        _ => None,
    };
    (ipv4, ipv6)
}

impl MasqSpec {
    /// Its network and subnet of `family`, when it has that family.
    pub fn net(&self, family: Family) -> Option<Net> {
        self.nets().into_iter().find(|n| n.family == family)
    }

    /// The dialect its rules are written in, chosen once at start (`spec::Firewall::choose`).
    pub fn dialect(&self) -> &'static dyn Dialect {
        match self.nftables {
            true => &nft::Nft,
            false => &iptables::Iptables,
        }
    }

    /// The families it asks rules for: none without the masquerade or the forward chain.
    fn families(&self) -> Vec<Family> {
        match self.masq || self.forward_rules {
            true => self.nets().iter().map(|n| n.family).collect(),
            false => Vec::new(),
        }
    }
}

/// A batch to write and why it is needed, for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub batch: String,
    pub reasons: Vec<String>,
}

/// A batch a dialect planned from what was read: its text, what the log says once it is
/// written, and what it found missing or wrong (`doctor`'s findings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    pub text: String,
    pub says: String,
    pub reasons: Vec<String>,
}

/// One way of writing flannel's rules: its text, planned per family from what its tool read.
/// The firewall driver reads and writes it through [`Dialect::backend`]'s tools; which
/// program, and for iptables which mode, is the driver's alone.
pub trait Dialect: Sync {
    /// How the log names it (`iptables`, `nftables`).
    fn name(&self) -> &'static str;

    /// The driver's backend whose tools read and write its text.
    fn backend(&self) -> Backend;

    /// An iptables dialect: the tables it reads in each family, in order.
    fn tables(&self) -> &'static [&'static str] {
        &[]
    }

    /// An nftables dialect: the `nft -j list` arguments of one family's table.
    fn listing(&self, _family: Family) -> Option<&'static [&'static str]> {
        None
    }

    /// The batch that makes one family's rules those `spec` asks for, given what was read
    /// (the tables in order, or the listing; None where absent); None when they already are.
    fn restore(
        &self,
        spec: &MasqSpec,
        family: Family,
        read: &[Option<&str>],
    ) -> Result<Option<Batch>>;

    /// The batch that removes every rule of ours in one family.
    fn remove_all(&self, family: Family, read: &[Option<&str>]) -> Result<Option<Batch>>;

    /// The batch that removes the rules written for `old` (with today's options) that `spec`
    /// does not want now.
    fn remove_stale(
        &self,
        old: &Net,
        spec: &MasqSpec,
        read: &[Option<&str>],
    ) -> Result<Option<Batch>>;
}

/// Every dialect, so that the rules of those a node does not use are removed.
pub const DIALECTS: &[&dyn Dialect] = &[&iptables::Iptables, &nft::Nft];

/// `restoring V4 iptables rules: nat chain FLANNEL-POSTRTG missing`: what a batch does and,
/// when there are any, why.
pub fn says(what: String, reasons: &[String]) -> String {
    if reasons.is_empty() {
        what
    } else {
        format!("{what}: {}", reasons.join("; "))
    }
}

/// What a pass asks of a dialect.
#[derive(Debug, Clone, Copy)]
enum Job<'a> {
    Restore(&'a MasqSpec),
    RemoveAll,
    RemoveStale { old: &'a [Net], spec: &'a MasqSpec },
}

/// What the dialect's planners said, collected while the driver plans (on the tools'
/// threads), read after.
#[derive(Default)]
struct Notes(Mutex<Vec<(String, Vec<String>)>>);

impl Notes {
    fn add(&self, says: String, reasons: Vec<String>) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((says, reasons));
    }

    fn take(&self) -> Vec<(String, Vec<String>)> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// A job in one dialect as the firewall driver runs it: the driver reads what the dialect
/// reads and the dialect plans each family in turn.
struct InDialect<'a> {
    dialect: &'a dyn Dialect,
    job: Job<'a>,
    families: Vec<Family>,
    notes: Notes,
}

impl InDialect<'_> {
    fn plan_family(&self, family: Family, read: &[Option<&str>]) -> Result<Option<String>> {
        let batch = match self.job {
            Job::Restore(spec) => self.dialect.restore(spec, family, read)?,
            Job::RemoveAll => self.dialect.remove_all(family, read)?,
            Job::RemoveStale { old, spec } => match old.iter().find(|n| n.family == family) {
                Some(net) => self.dialect.remove_stale(net, spec, read)?,
                None => None,
            },
        };
        Ok(batch.map(|b| {
            self.notes.add(b.says, b.reasons);
            b.text
        }))
    }
}

impl Rules for InDialect<'_> {
    type Error = Error;

    fn families(&self) -> Vec<Family> {
        self.families.clone()
    }

    fn iptables_reads(&self) -> &[&'static str] {
        self.dialect.tables()
    }

    fn iptables(&self, family: Family, saved: &[String]) -> Result<Option<String>> {
        let read: Vec<Option<&str>> = saved.iter().map(|s| Some(s.as_str())).collect();
        self.plan_family(family, &read)
    }

    fn nft_reads(&self) -> Vec<&'static [&'static str]> {
        self.families
            .iter()
            .filter_map(|f| self.dialect.listing(*f))
            .collect()
    }

    fn nft(&self, listed: &[Option<String>]) -> Result<Option<String>> {
        let mut batch = String::new();
        for (family, listing) in self.families.iter().zip(listed) {
            batch.extend(self.plan_family(*family, &[listing.as_deref()])?);
        }
        Ok((!batch.is_empty()).then_some(batch))
    }
}

/// One write of a pass: a batch per tool, planned from what was read, what the log says once
/// they are written, and what the planners found missing or wrong.
struct Step {
    batches: Batches,
    says: Vec<String>,
    reasons: Vec<String>,
}

impl Step {
    /// The batches `job` calls for in `families` of `dialect`, planned from one read; None:
    /// nothing to write.
    fn plan(dialect: &dyn Dialect, job: Job<'_>, families: Vec<Family>) -> Result<Option<Step>> {
        let rules = InDialect {
            dialect,
            job,
            families,
            notes: Notes::default(),
        };
        let batches = dialect.backend().plan(&rules)?;
        let mut says = Vec::new();
        let mut reasons = Vec::new();
        for (line, why) in rules.notes.take() {
            if !says.contains(&line) {
                says.push(line);
            }
            reasons.extend(why);
        }
        Ok((!batches.is_empty()).then_some(Step {
            batches,
            says,
            reasons,
        }))
    }

    fn apply(self) -> Result<()> {
        self.batches.apply()?;
        for line in self.says {
            tracing::info!("{line}");
        }
        Ok(())
    }
}

/// What one pass of the firewall plane writes, planned from one read of the rules: the first
/// pass's cleanup (the other dialects' rules, ours in the iptables mode not chosen, an earlier
/// subnet's), then the rules `spec` asks for. Applying it writes exactly these batches, in this
/// order, reading nothing again.
pub struct Pass {
    /// What is missing or wrong in the rules `spec` asks for.
    pub reasons: Vec<String>,
    cleanup: Vec<Step>,
    restore: Option<Step>,
}

/// What applying a [`Pass`] wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Applied {
    /// Something of the cleanup.
    pub cleaned: bool,
    /// Rules `spec` asks for that were missing or wrong.
    pub restored: bool,
}

impl Pass {
    pub fn is_empty(&self) -> bool {
        self.cleanup.is_empty() && self.restore.is_none()
    }

    /// Each tool's program and batch, in the order they are written.
    pub fn batches(&self) -> Vec<(&'static str, &str)> {
        self.cleanup
            .iter()
            .chain(&self.restore)
            .flat_map(|s| s.batches.iter())
            .collect()
    }

    /// Writes the batches in order; the first that fails ends it.
    pub fn apply(self) -> Result<Applied> {
        let mut done = Applied::default();
        for step in self.cleanup {
            step.apply()?;
            done.cleaned = true;
        }
        if let Some(step) = self.restore {
            step.apply()
                .map_err(|e| e.context("writing the masquerade rules"))?;
            done.restored = true;
        }
        Ok(done)
    }
}

/// Reads the rules once and plans a pass: with `previous` (the old subnet.env's networks and
/// subnets), the first pass's cleanup too.
pub fn plan(spec: &MasqSpec, previous: Option<Previous>) -> Result<Pass> {
    let mut cleanup = Vec::new();
    if let Some((old4, old6)) = previous {
        cleanup.extend(other_dialects(spec)?);
        cleanup.extend(stale(old4, old6, spec)?);
    }
    let restore = Step::plan(spec.dialect(), Job::Restore(spec), spec.families())?;
    Ok(Pass {
        reasons: restore
            .as_ref()
            .map(|s| s.reasons.clone())
            .unwrap_or_default(),
        cleanup,
        restore,
    })
}

/// Makes the firewall hold exactly the rules `spec` asks for, writing whatever is missing or
/// wrong in one batch per tool (iptables: one per family; nftables: one transaction), and
/// nothing when all is right. Returns whether it wrote anything.
pub fn ensure(spec: &MasqSpec) -> Result<bool> {
    Ok(plan(spec, None)?.apply()?.restored)
}

/// The steps that remove what `job` plans in `dialect`. An iptables family whose rules cannot
/// be read (its iptables unusable) holds none to remove: skipped with a warning.
fn removal(dialect: &dyn Dialect, job: Job<'_>, families: &[Family]) -> Result<Vec<Step>> {
    if dialect.backend() != Backend::Iptables {
        return Ok(Step::plan(dialect, job, families.to_vec())?
            .into_iter()
            .collect());
    }
    let mut steps = Vec::new();
    for &family in families {
        match Step::plan(dialect, job, vec![family]) {
            Ok(step) => steps.extend(step),
            Err(e) => tracing::warn!("taking no iptables rules to remove there: {e}"),
        }
    }
    Ok(steps)
}

/// The removal of the rules of every dialect `spec` does not use (iptables chains in
/// nftables mode, our nftables tables in iptables mode), so that a switch leaves one policy in
/// force, and of ours in the iptables mode not chosen. A dialect whose tool is not installed
/// holds none at all.
fn other_dialects(spec: &MasqSpec) -> Result<Vec<Step>> {
    let mut steps = unused_iptables();
    let ours = spec.dialect();
    let others = DIALECTS
        .iter()
        .filter(|d| d.name() != ours.name() && d.backend().installed());
    for other in others {
        for mut step in removal(*other, Job::RemoveAll, &[Family::V4, Family::V6])? {
            for line in &mut step.says {
                *line = format!("{} mode: {line}", ours.name());
            }
            steps.push(step);
        }
    }
    Ok(steps)
}

/// The removal of our iptables chains from the iptables mode this process did not choose,
/// where a run before the host's rules moved (or before `--iptables-mode`) wrote them. A
/// family whose rules there cannot be read holds none: skipped with a warning.
fn unused_iptables() -> Vec<Step> {
    let Some(mode) = cni_kernel::firewall::xtables::chosen_mode() else {
        return Vec::new();
    };
    let mut steps: Vec<Step> = Vec::new();
    for family in [Family::V4, Family::V6] {
        let rules = InDialect {
            dialect: &iptables::Iptables,
            job: Job::RemoveAll,
            families: vec![family],
            notes: Notes::default(),
        };
        match cni_kernel::firewall::plan_in_unused_iptables(&rules) {
            Ok(batches) if !batches.is_empty() => steps.push(Step {
                batches,
                says: Vec::new(),
                reasons: Vec::new(),
            }),
            Ok(_) => {}
            Err(e) => tracing::warn!("taking no iptables rules to remove there: {e}"),
        }
    }
    // Said once, after the last family's.
    if let Some(last) = steps.last_mut() {
        last.says.push(format!(
            "removed flannel's iptables chains from iptables-{}: the rules are in iptables-{mode}",
            mode.other()
        ));
    }
    steps
}

/// Removes the rules of the dialects `spec` does not use; whether it removed anything.
pub fn remove_other_mode(spec: &MasqSpec) -> Result<bool> {
    let pass = Pass {
        reasons: Vec::new(),
        cleanup: other_dialects(spec)?,
        restore: None,
    };
    Ok(pass.apply()?.cleaned)
}

/// The removal of the rules written for a previous network and subnet (from the old
/// subnet.env) that `spec` no longer wants; the current rules stay.
fn stale(
    old_ipv4: Option<(Ipv4Network, Ipv4Network)>,
    old_ipv6: Option<(Ipv6Network, Ipv6Network)>,
    spec: &MasqSpec,
) -> Result<Vec<Step>> {
    let old = nets(old_ipv4, old_ipv6);
    let families: Vec<Family> = old.iter().map(|n| n.family).collect();
    let job = Job::RemoveStale { old: &old, spec };
    removal(spec.dialect(), job, &families)
}

/// Removes the rules written for a previous network and subnet that `spec` no longer wants;
/// whether it removed anything.
pub fn remove_stale(
    old_ipv4: Option<(Ipv4Network, Ipv4Network)>,
    old_ipv6: Option<(Ipv6Network, Ipv6Network)>,
    spec: &MasqSpec,
) -> Result<bool> {
    let pass = Pass {
        reasons: Vec::new(),
        cleanup: stale(old_ipv4, old_ipv6, spec)?,
        restore: None,
    };
    Ok(pass.apply()?.cleaned)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The spec of the dialects' tests: both families, every option on.
    pub(crate) fn spec() -> MasqSpec {
        MasqSpec {
            ipv4: Some((
                "10.5.0.0/16".parse().unwrap(),
                "10.5.1.0/24".parse().unwrap(),
            )),
            ipv6: Some((
                "fd00:5::/56".parse().unwrap(),
                "fd00:5:0:1::/64".parse().unwrap(),
            )),
            nftables: false,
            masq: true,
            random_fully: true,
            forward_rules: true,
        }
    }

    pub(crate) fn v4() -> Net {
        spec().nets()[0].clone()
    }

    #[test]
    fn previous_reads_an_old_subnet_env() {
        let (v4, v6) = previous(
            "FLANNEL_NETWORK=10.5.0.0/16\nFLANNEL_SUBNET=10.5.52.1/24\nFLANNEL_IPV6_NETWORK=fc00::/48\nFLANNEL_IPV6_SUBNET=fc00:0:0:1::1/64\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n",
        );
        let (n, s) = v4.unwrap();
        let net = Net::v4(n, s);
        assert_eq!(
            (net.network.as_str(), net.subnet.as_str()),
            ("10.5.0.0/16", "10.5.52.0/24")
        );
        let (n, s) = v6.unwrap();
        let net = Net::v6(n, s);
        assert_eq!(
            (net.network.as_str(), net.subnet.as_str()),
            ("fc00::/48", "fc00:0:0:1::/64")
        );
        assert_eq!(previous("FLANNEL_MTU=1450\n"), (None, None));
        assert_eq!(previous("FLANNEL_SUBNET=nonsense\n"), (None, None));
    }

    #[test]
    fn an_unmasked_network_is_printed_as_its_network_address() {
        let n = Net::v4(
            "10.5.3.7/16".parse().unwrap(),
            "10.5.1.9/24".parse().unwrap(),
        );
        assert_eq!(
            (n.network.as_str(), n.subnet.as_str()),
            ("10.5.0.0/16", "10.5.1.0/24")
        );
    }
}
