//! The two rule backends behind one trait. Each reads the rules the kernel holds, has
//! cni-portmap write the text, and applies it in one batch (one `iptables-restore` per family,
//! one `nft` transaction).

use cni_kernel::firewall::{self, Family, RuleTool};
use cni_portmap::nftables::{self, ListedRule};
use cni_portmap::{iptables, Backend, Config, ContainerAddrs};
use cni_protocol::CniError;
use ipnetwork::IpNetwork;

pub trait Rules {
    /// Forwards the container's ports to each of its addresses.
    fn forward(
        &self,
        conf: &Config,
        container_id: &str,
        addrs: &ContainerAddrs,
    ) -> Result<(), CniError>;
    /// Removes the container's rules in both families, found by network name and container ID.
    fn unforward(&self, network: &str, container_id: &str) -> Result<(), CniError>;
    /// Fails naming the first rule of the container's mappings that is missing.
    fn check(
        &self,
        conf: &Config,
        container_id: &str,
        addrs: &ContainerAddrs,
    ) -> Result<(), CniError>;
}

pub fn of(conf: &Config) -> &'static dyn Rules {
    match conf.backend {
        Backend::Iptables => &Iptables,
        Backend::Nftables => &Nftables,
    }
}

/// Removes the container's rules from each backend whose tool is installed, for a DEL whose
/// config does not say which backend ADD used.
pub fn unforward_everywhere(network: &str, container_id: &str) -> Result<(), CniError> {
    let mut first_error = None;
    let backends: [(bool, &dyn Rules); 2] = [
        (firewall::has_iptables(), &Iptables),
        (firewall::has_nft(), &Nftables),
    ];
    for (installed, rules) in backends {
        if installed {
            if let Err(e) = rules.unforward(network, container_id) {
                first_error.get_or_insert(e);
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// The backend when the config names none: the Go plugins' rule, iptables unless only nft
/// is installed.
pub fn default_backend() -> Backend {
    if firewall::iptables_is_default() {
        Backend::Iptables
    } else {
        Backend::Nftables
    }
}

pub fn family(addr: IpNetwork) -> Family {
    if addr.is_ipv4() {
        Family::V4
    } else {
        Family::V6
    }
}

struct Iptables;

impl Iptables {
    fn nat_table(family: Family) -> Result<iptables::NatTable, CniError> {
        let save = firewall::Iptables(family).list(&["nat"])?;
        Ok(iptables::NatTable::parse(&save.unwrap_or_default()))
    }
}

impl Rules for Iptables {
    fn forward(
        &self,
        conf: &Config,
        container_id: &str,
        addrs: &ContainerAddrs,
    ) -> Result<(), CniError> {
        let written = firewall::with_rules_lock(|| {
            for addr in addrs.iter() {
                let current = Self::nat_table(family(addr))?;
                let doc = iptables::add_document(conf, container_id, addr, &current);
                firewall::Iptables(family(addr)).apply(&doc)?;
            }
            Ok(())
        });
        if written.is_err() && addrs.v4.is_some() && addrs.v6.is_some() {
            // One family's rules may be in: take them out again.
            if let Err(e) = self.unforward(&conf.network, container_id) {
                eprintln!("removing the rules of the failed ADD: {e}");
            }
        }
        written
    }

    fn unforward(&self, network: &str, container_id: &str) -> Result<(), CniError> {
        firewall::with_rules_lock(|| {
            let mut unusable = Vec::new();
            for fam in [Family::V4, Family::V6] {
                // A family without a usable iptables had no rules written either.
                let current = match Self::nat_table(fam) {
                    Ok(t) => t,
                    Err(e) => {
                        unusable.push(e);
                        continue;
                    }
                };
                if let Some(doc) = iptables::del_document(network, container_id, &current) {
                    firewall::Iptables(fam).apply(&doc)?;
                }
            }
            match unusable.len() {
                2 => Err(unusable
                    .swap_remove(0)
                    .context("neither iptables nor ip6tables is usable")),
                _ => Ok(()),
            }
        })
    }

    fn check(
        &self,
        conf: &Config,
        container_id: &str,
        addrs: &ContainerAddrs,
    ) -> Result<(), CniError> {
        for addr in addrs.iter() {
            let current = Self::nat_table(family(addr))?;
            iptables::check(conf, container_id, addr, &current)?;
        }
        Ok(())
    }
}

struct Nftables;

impl Nftables {
    fn rules(family: &str) -> Result<Vec<ListedRule>, CniError> {
        match firewall::Nftables.list(&["table", family, nftables::TABLE])? {
            Some(json) => nftables::parse_listing(&json),
            None => Ok(Vec::new()),
        }
    }
}

impl Rules for Nftables {
    fn forward(
        &self,
        conf: &Config,
        container_id: &str,
        addrs: &ContainerAddrs,
    ) -> Result<(), CniError> {
        firewall::with_rules_lock(|| {
            let mut script = String::new();
            for addr in addrs.iter() {
                let listed = Self::rules(nftables::family(addr.ip()))?;
                script += &nftables::add_script(conf, container_id, addr, &listed)?;
            }
            if script.is_empty() {
                return Ok(());
            }
            Ok(firewall::Nftables.apply(&script)?)
        })
    }

    fn unforward(&self, _network: &str, container_id: &str) -> Result<(), CniError> {
        firewall::with_rules_lock(|| {
            let mut listed = Self::rules("ip")?;
            listed.extend(Self::rules("ip6")?);
            match nftables::del_script(container_id, &listed) {
                Some(script) => Ok(firewall::Nftables.apply(&script)?),
                None => Ok(()),
            }
        })
    }

    fn check(
        &self,
        conf: &Config,
        container_id: &str,
        addrs: &ContainerAddrs,
    ) -> Result<(), CniError> {
        for addr in addrs.iter() {
            let listed = Self::rules(nftables::family(addr.ip()))?;
            nftables::check(conf, container_id, addr, &listed)?;
        }
        Ok(())
    }
}
