//! The attachment's firewall rules: masquerade (iptables or nftables, through the firewall
//! driver) and MAC spoof-check (nftables), one batch per tool per operation.

use crate::{masq, spoofchk, IpFamily, NetConf};
use cni_kernel::firewall::{self, Backend, Family, Nftables, Rules, Writers};
use cni_protocol::{Attachment, CniError, Env};
use ipnetwork::IpNetwork;
use serde_json::Value;
use std::sync::mpsc::{channel, Sender};
use std::thread::{Scope, ScopedJoinHandle};

fn family(f: IpFamily) -> Family {
    match f {
        IpFamily::V4 => Family::V4,
        IpFamily::V6 => Family::V6,
    }
}

fn ip_family(f: Family) -> IpFamily {
    match f {
        Family::V4 => IpFamily::V4,
        Family::V6 => IpFamily::V6,
    }
}

/// ADD's masquerade of `addrs`, written without reading: the Go plugin's text.
struct Masquerade<'a> {
    env: &'a Env,
    conf: &'a NetConf,
    addrs: &'a [IpNetwork],
}

impl Rules for Masquerade<'_> {
    type Error = CniError;

    fn families(&self) -> Vec<Family> {
        masq::families(self.addrs).into_iter().map(family).collect()
    }

    fn iptables_head(&self, f: Family) -> String {
        masq::iptables_add_head(&self.conf.name, &self.env.container_id, ip_family(f))
    }

    fn iptables(&self, f: Family, _: &[String]) -> Result<Option<String>, CniError> {
        let tail = masq::iptables_add_tail(
            &self.conf.name,
            &self.env.container_id,
            ip_family(f),
            self.addrs,
        );
        Ok(Some(self.iptables_head(f) + &tail))
    }

    fn nft(&self, _: &[Option<String>]) -> Result<Option<String>, CniError> {
        Ok((!self.addrs.is_empty()).then(|| {
            masq::nft_add(
                &self.conf.name,
                &self.env.ifname,
                &self.env.container_id,
                self.addrs,
            )
        }))
    }
}

/// The rule tools of an ADD, started before the addresses are known so that their start-up
/// overlaps IPAM. iptables-restore for IPv4 already reads the part of its document that does
/// not depend on the addresses. Unused, they exit without committing anything.
struct Started<'a> {
    env: &'a Env,
    conf: &'a NetConf,
    backend: Backend,
    writers: Writers,
}

impl<'a> Started<'a> {
    /// Starts the tools `conf` will need (IPv6 iptables, rarer, starts when needed).
    fn start(env: &'a Env, conf: &'a NetConf) -> Started<'a> {
        let backend = Backend::choose(conf.masq_backend);
        let mut writers = Writers::default();
        if conf.ip_masq && conf.is_layer3() {
            let head = Masquerade {
                env,
                conf,
                addrs: &[],
            };
            writers = Writers::start(backend, &[Family::V4], &head);
        }
        if conf.mac_spoof_check {
            writers.prime(&Nftables, "");
        }
        Started {
            env,
            conf,
            backend,
            writers,
        }
    }

    /// Masquerades `addrs` (ipMasq) and pins the container's MAC on the host veth
    /// (macspoofchk): one batch per tool, the tools side by side.
    fn write(self, addrs: &[IpNetwork], spoof: Option<(&str, [u8; 6])>) -> Result<(), CniError> {
        let (env, conf) = (self.env, self.conf);
        let mut batches = firewall::Batches::default();
        if conf.ip_masq && !addrs.is_empty() {
            batches = self.backend.plan(&Masquerade { env, conf, addrs })?;
        }
        if let Some((host_veth, mac)) = spoof {
            let id = spoofchk::ref_id(&env.container_id, &env.ifname);
            batches.push(&Nftables, &spoofchk::setup_script(host_veth, &mac, &id));
        }
        Ok(self.writers.write(batches)?)
    }
}

/// ADD's rule writer: a thread that starts the tools at once and writes the rules when it is
/// told the addresses (never told, it commits nothing).
pub struct RuleWriter<'scope> {
    addrs: Sender<Vec<IpNetwork>>,
    thread: ScopedJoinHandle<'scope, Result<(), CniError>>,
}

impl<'scope> RuleWriter<'scope> {
    /// `spoof`: the host veth and the container MAC, for macspoofchk.
    pub fn start<'env>(
        s: &'scope Scope<'scope, 'env>,
        env: &'env Env,
        conf: &'env NetConf,
        spoof: Option<(String, [u8; 6])>,
    ) -> RuleWriter<'scope> {
        let (addrs, known) = channel::<Vec<IpNetwork>>();
        let thread = s.spawn(move || {
            let started = Started::start(env, conf);
            match known.recv() {
                Ok(addrs) => started.write(&addrs, spoof.as_ref().map(|(n, m)| (n.as_str(), *m))),
                Err(_) => Ok(()),
            }
        });
        RuleWriter { addrs, thread }
    }

    pub fn write(&self, addrs: Vec<IpNetwork>) {
        let _ = self.addrs.send(addrs);
    }

    pub fn join(self) -> Result<(), CniError> {
        drop(self.addrs);
        self.thread
            .join()
            .unwrap_or_else(|_| Err(CniError::internal("the rule writer thread panicked")))
    }
}

const MASQ_CHAIN: &[&str] = &["chain", "inet", masq::NFT_TABLE, masq::NFT_CHAIN];
const SPOOF_TABLE: &[&str] = &["table", "bridge", "nat"];

/// An nftables listing as JSON (null for a table or chain that is absent).
fn listing(args: &[&str], listed: Option<&Option<String>>) -> Result<Value, CniError> {
    let text = listed.and_then(Option::as_deref).unwrap_or_default();
    masq::parse_nft_listing(args, text)
}

/// DEL's removal of one attachment's rules, found by name: the iptables chain hash and
/// comment in each family, and the nftables comments.
struct Removal<'a> {
    env: &'a Env,
    conf: &'a NetConf,
    families: &'a [IpFamily],
}

impl Rules for Removal<'_> {
    type Error = CniError;

    fn families(&self) -> Vec<Family> {
        match self.conf.ip_masq {
            true => self.families.iter().map(|f| family(*f)).collect(),
            false => Vec::new(),
        }
    }

    fn iptables_reads(&self) -> &[&'static str] {
        &["nat"]
    }

    fn iptables(&self, _: Family, saved: &[String]) -> Result<Option<String>, CniError> {
        Ok(masq::iptables_remove(
            &saved[0],
            &self.conf.name,
            &self.env.container_id,
        ))
    }

    fn nft_reads(&self) -> Vec<&'static [&'static str]> {
        [
            (self.conf.ip_masq, MASQ_CHAIN),
            (self.conf.mac_spoof_check, SPOOF_TABLE),
        ]
        .into_iter()
        .filter_map(|(on, l)| on.then_some(l))
        .collect()
    }

    fn nft(&self, listed: &[Option<String>]) -> Result<Option<String>, CniError> {
        let (env, conf) = (self.env, self.conf);
        let mut script = String::new();
        let mut next = self.nft_reads().into_iter().zip(listed);
        if conf.ip_masq {
            if let Some((args, l)) = next.next() {
                let l = listing(args, Some(l))?;
                script.extend(masq::nft_remove(
                    &l,
                    &conf.name,
                    &env.ifname,
                    &env.container_id,
                ));
            }
        }
        if conf.mac_spoof_check {
            if let Some((args, l)) = next.next() {
                let id = spoofchk::ref_id(&env.container_id, &env.ifname);
                script.extend(spoofchk::teardown_script(&listing(args, Some(l))?, &id));
            }
        }
        Ok((!script.is_empty()).then_some(script))
    }
}

/// Removes the attachment's rules wherever they are (either backend, since the pod may have
/// been added with the other one, by either implementation).
pub fn remove(env: &Env, conf: &NetConf, families: &[IpFamily]) -> Result<(), CniError> {
    firewall::remove_everywhere(&Removal {
        env,
        conf,
        families,
    })?
    .warn_on_stderr();
    Ok(())
}

/// GC's removal of the masquerade rules of this network whose attachment is not among those
/// kept, found by the comments (iptables: the container ID; nftables: container and
/// interface).
struct Garbage<'a> {
    conf: &'a NetConf,
    ids: Vec<&'a str>,
    pairs: Vec<(&'a str, &'a str)>,
}

impl Rules for Garbage<'_> {
    type Error = CniError;

    fn families(&self) -> Vec<Family> {
        vec![Family::V4, Family::V6]
    }

    fn iptables_reads(&self) -> &[&'static str] {
        &["nat"]
    }

    fn iptables(&self, _: Family, saved: &[String]) -> Result<Option<String>, CniError> {
        let saved = &saved[0];
        let stale: Vec<String> = masq::iptables_containers(saved, &self.conf.name)
            .into_iter()
            .filter(|id| !self.ids.contains(&id.as_str()))
            .collect();
        let stale: Vec<&str> = stale.iter().map(String::as_str).collect();
        Ok(masq::iptables_remove_all(saved, &self.conf.name, &stale))
    }

    fn nft_reads(&self) -> Vec<&'static [&'static str]> {
        vec![MASQ_CHAIN]
    }

    fn nft(&self, listed: &[Option<String>]) -> Result<Option<String>, CniError> {
        let l = listing(MASQ_CHAIN, listed.first())?;
        Ok(masq::nft_gc(&l, &self.conf.name, &self.pairs))
    }
}

/// GC: removes the masquerade rules of this network whose attachment is not among `keep`.
pub fn collect_garbage(conf: &NetConf, keep: &[Attachment]) -> Result<(), CniError> {
    firewall::remove_everywhere(&Garbage {
        conf,
        ids: keep.iter().map(|a| a.container_id.as_str()).collect(),
        pairs: keep
            .iter()
            .map(|a| (a.ifname.as_str(), a.container_id.as_str()))
            .collect(),
    })?
    .warn_on_stderr();
    Ok(())
}
