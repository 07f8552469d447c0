//! portmap's operations in the firewall driver's terms: for each backend, what to read and the
//! text to write from it (ADD, DEL), or the check of it (CHECK). The driver reads, calls these
//! and applies; nothing here touches the kernel.

use crate::{iptables, nftables, Config, ContainerAddrs};
use cni_kernel::firewall::{Family, Rules};
use cni_protocol::CniError;
use ipnetwork::IpNetwork;

const NFT_V4: &[&str] = &["table", "ip", nftables::TABLE];
const NFT_V6: &[&str] = &["table", "ip6", nftables::TABLE];

fn nft_table(addr: IpNetwork) -> &'static [&'static str] {
    match Family::of(&addr) {
        Family::V4 => NFT_V4,
        Family::V6 => NFT_V6,
    }
}

/// The rules of a family's `cni_hostport` table as listed (none when it is absent).
fn listed_rules(listed: Option<&Option<String>>) -> Result<Vec<nftables::ListedRule>, CniError> {
    match listed.and_then(Option::as_deref) {
        Some(json) => nftables::parse_listing(json),
        None => Ok(Vec::new()),
    }
}

/// The container's address of `family` (its families are the only ones asked for).
fn addr_of(addrs: &ContainerAddrs, family: Family) -> Option<IpNetwork> {
    addrs.iter().find(|a| Family::of(a) == family)
}

/// The container's mappings of `addrs`, and what CHECK reads to compare them with.
pub struct Mappings<'a> {
    pub conf: &'a Config,
    pub container_id: &'a str,
    pub addrs: &'a ContainerAddrs,
}

impl Mappings<'_> {
    fn families(&self) -> Vec<Family> {
        self.addrs.iter().map(|a| Family::of(&a)).collect()
    }

    fn nft_tables(&self) -> Vec<&'static [&'static str]> {
        self.addrs.iter().map(nft_table).collect()
    }
}

/// ADD: forwards the container's ports to each of its addresses.
pub struct Forward<'a>(pub Mappings<'a>);

impl Rules for Forward<'_> {
    type Error = CniError;

    fn families(&self) -> Vec<Family> {
        self.0.families()
    }

    fn iptables_reads(&self) -> &[&'static str] {
        &["nat"]
    }

    fn iptables(&self, family: Family, saved: &[String]) -> Result<Option<String>, CniError> {
        let m = &self.0;
        Ok(addr_of(m.addrs, family).map(|addr| {
            let current = iptables::NatTable::parse(&saved[0]);
            iptables::add_document(m.conf, m.container_id, addr, &current)
        }))
    }

    fn nft_reads(&self) -> Vec<&'static [&'static str]> {
        self.0.nft_tables()
    }

    fn nft(&self, listed: &[Option<String>]) -> Result<Option<String>, CniError> {
        let m = &self.0;
        let mut script = String::new();
        for (i, addr) in m.addrs.iter().enumerate() {
            let rules = listed_rules(listed.get(i))?;
            script += &nftables::add_script(m.conf, m.container_id, addr, &rules)?;
        }
        Ok((!script.is_empty()).then_some(script))
    }
}

/// CHECK: fails naming the first rule of the container's mappings that is missing; writes
/// nothing.
pub struct Check<'a>(pub Mappings<'a>);

impl Rules for Check<'_> {
    type Error = CniError;

    fn families(&self) -> Vec<Family> {
        self.0.families()
    }

    fn iptables_reads(&self) -> &[&'static str] {
        &["nat"]
    }

    fn iptables(&self, family: Family, saved: &[String]) -> Result<Option<String>, CniError> {
        let m = &self.0;
        if let Some(addr) = addr_of(m.addrs, family) {
            let current = iptables::NatTable::parse(&saved[0]);
            iptables::check(m.conf, m.container_id, addr, &current)?;
        }
        Ok(None)
    }

    fn nft_reads(&self) -> Vec<&'static [&'static str]> {
        self.0.nft_tables()
    }

    fn nft(&self, listed: &[Option<String>]) -> Result<Option<String>, CniError> {
        let m = &self.0;
        for (i, addr) in m.addrs.iter().enumerate() {
            nftables::check(m.conf, m.container_id, addr, &listed_rules(listed.get(i))?)?;
        }
        Ok(None)
    }
}

/// DEL: removes the container's rules in both families, found by network name and container
/// ID.
pub struct Unforward<'a> {
    pub network: &'a str,
    pub container_id: &'a str,
}

impl Rules for Unforward<'_> {
    type Error = CniError;

    fn families(&self) -> Vec<Family> {
        vec![Family::V4, Family::V6]
    }

    fn iptables_reads(&self) -> &[&'static str] {
        &["nat"]
    }

    fn iptables(&self, _: Family, saved: &[String]) -> Result<Option<String>, CniError> {
        let current = iptables::NatTable::parse(&saved[0]);
        Ok(iptables::del_document(
            self.network,
            self.container_id,
            &current,
        ))
    }

    fn nft_reads(&self) -> Vec<&'static [&'static str]> {
        vec![NFT_V4, NFT_V6]
    }

    fn nft(&self, listed: &[Option<String>]) -> Result<Option<String>, CniError> {
        let mut rules = listed_rules(listed.first())?;
        rules.extend(listed_rules(listed.get(1))?);
        Ok(nftables::del_script(self.container_id, &rules))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Backend;
    use serde_json::json;

    fn conf() -> Config {
        let v = json!({
            "portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]
        });
        Config::parse(&v, "net", || Backend::Iptables).unwrap()
    }

    #[test]
    fn add_writes_the_document_of_each_family_the_container_has() {
        let conf = conf();
        let addrs = ContainerAddrs {
            v4: Some("10.0.0.2/24".parse().unwrap()),
            v6: None,
        };
        let m = Mappings {
            conf: &conf,
            container_id: "c1",
            addrs: &addrs,
        };
        let addr = addrs.v4.unwrap();
        let empty = iptables::NatTable::parse("");
        let forward = Forward(m);
        assert_eq!(forward.families(), [Family::V4]);
        assert_eq!(
            forward.iptables(Family::V4, &[String::new()]).unwrap(),
            Some(iptables::add_document(&conf, "c1", addr, &empty))
        );
        assert_eq!(forward.nft_reads(), [NFT_V4]);
        assert_eq!(
            forward.nft(&[None]).unwrap(),
            Some(nftables::add_script(&conf, "c1", addr, &[]).unwrap())
        );
    }

    #[test]
    fn check_of_an_empty_table_names_what_is_missing() {
        let conf = conf();
        let addrs = ContainerAddrs {
            v4: Some("10.0.0.2/24".parse().unwrap()),
            v6: None,
        };
        let check = Check(Mappings {
            conf: &conf,
            container_id: "c1",
            addrs: &addrs,
        });
        let e = check.iptables(Family::V4, &[String::new()]).unwrap_err();
        assert!(e.msg.contains("missing"), "{}", e.msg);
        let e = check.nft(&[None]).unwrap_err();
        assert!(e.msg.contains("missing"), "{}", e.msg);
    }

    #[test]
    fn del_of_nothing_there_writes_nothing() {
        let del = Unforward {
            network: "net",
            container_id: "c1",
        };
        assert_eq!(del.iptables(Family::V4, &[String::new()]).unwrap(), None);
        assert_eq!(del.nft(&[None, None]).unwrap(), None);
    }
}
