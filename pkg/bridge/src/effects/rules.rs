//! The attachment's firewall rules: masquerade (iptables or nftables) and MAC spoof-check,
//! one batch per tool per operation.

use crate::{masq, spoofchk, IpFamily, MasqBackend, NetConf};
use cni_kernel::firewall::{self, Family, Iptables, Nftables, Primed, RuleTool};
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

/// The rule tools of an ADD, started before the addresses are known so that their start-up
/// overlaps IPAM. iptables-restore for IPv4 already reads the part of its document that does
/// not depend on the addresses. Unused, they exit without committing anything.
struct Writers<'a> {
    env: &'a Env,
    conf: &'a NetConf,
    backend: MasqBackend,
    iptables_v4: Option<Primed>,
    nft: Option<Primed>,
}

impl<'a> Writers<'a> {
    /// Starts the tools `conf` will need (IPv6 iptables, rarer, starts when needed).
    fn start(env: &'a Env, conf: &'a NetConf) -> Writers<'a> {
        let backend = MasqBackend::choose(conf.masq_backend, firewall::iptables_is_default);
        let masq = conf.ip_masq && conf.is_layer3();
        let iptables_v4 = (masq && backend == MasqBackend::Iptables)
            .then(|| {
                let mut p = Iptables(Family::V4).prime().ok()?;
                let head = masq::iptables_add_head(&conf.name, &env.container_id, IpFamily::V4);
                p.feed(&head).ok()?;
                Some(p)
            })
            .flatten();
        let nft = ((masq && backend == MasqBackend::Nftables) || conf.mac_spoof_check)
            .then(|| Nftables.prime().ok())
            .flatten();
        Writers {
            env,
            conf,
            backend,
            iptables_v4,
            nft,
        }
    }

    /// Masquerades `addrs` (ipMasq) and pins the container's MAC on the host veth
    /// (macspoofchk): one batch per tool, the tools side by side.
    fn write(
        mut self,
        addrs: &[IpNetwork],
        spoof: Option<(&str, [u8; 6])>,
    ) -> Result<(), CniError> {
        let (env, conf) = (self.env, self.conf);
        let mut jobs: Vec<Box<dyn FnOnce() -> Result<(), CniError> + Send + '_>> = Vec::new();
        let mut nft = String::new();
        if conf.ip_masq && !addrs.is_empty() {
            match self.backend {
                MasqBackend::Iptables => {
                    for f in masq::families(addrs) {
                        let tail = masq::iptables_add_tail(&conf.name, &env.container_id, f, addrs);
                        match (f, self.iptables_v4.take()) {
                            (IpFamily::V4, Some(primed)) => {
                                jobs.push(Box::new(move || Ok(primed.apply(&tail)?)))
                            }
                            _ => {
                                let mut doc =
                                    masq::iptables_add_head(&conf.name, &env.container_id, f);
                                doc.push_str(&tail);
                                let tool = Iptables(family(f));
                                jobs.push(Box::new(move || Ok(tool.apply(&doc)?)));
                            }
                        }
                    }
                }
                MasqBackend::Nftables => nft.push_str(&masq::nft_add(
                    &conf.name,
                    &env.ifname,
                    &env.container_id,
                    addrs,
                )),
            }
        }
        if let Some((host_veth, mac)) = spoof {
            let id = spoofchk::ref_id(&env.container_id, &env.ifname);
            nft.push_str(&spoofchk::setup_script(host_veth, &mac, &id));
        }
        if !nft.is_empty() {
            let primed = self.nft.take();
            jobs.push(Box::new(move || Ok(Nftables.apply_with(primed, &nft)?)));
        }
        // What was started and is not needed ends here, having committed nothing.
        drop(self);
        firewall::run_side_by_side(jobs.into_iter().map(|j| move || j()).collect())
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
            let writers = Writers::start(env, conf);
            match known.recv() {
                Ok(addrs) => writers.write(&addrs, spoof.as_ref().map(|(n, m)| (n.as_str(), *m))),
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

/// Removes the attachment's rules wherever they are, found by name: the iptables chain hash
/// and comment in each of `families`, and the nftables comments (of either backend, since the
/// pod may have been added with the other one, by either implementation).
pub fn remove(env: &Env, conf: &NetConf, families: &[IpFamily]) -> Result<(), CniError> {
    let mut jobs: Vec<Box<dyn FnOnce() -> Result<(), CniError> + Send + '_>> = Vec::new();
    if conf.ip_masq && firewall::has_iptables() && !families.is_empty() {
        let families: Vec<Family> = families.iter().map(|f| family(*f)).collect();
        jobs.push(Box::new(move || {
            Ok(firewall::iptables_remove(&families, "nat", |_, saved| {
                masq::iptables_remove(saved, &conf.name, &env.container_id)
            })?)
        }));
    }
    let want_masq = conf.ip_masq;
    let want_spoof = conf.mac_spoof_check;
    if (want_masq || want_spoof) && firewall::has_nft() {
        jobs.push(Box::new(move || {
            remove_nft(env, conf, want_masq, want_spoof)
        }));
    }
    firewall::run_side_by_side(jobs.into_iter().map(|j| move || j()).collect())
}

const MASQ_CHAIN: &[&str] = &["chain", "inet", masq::NFT_TABLE, masq::NFT_CHAIN];
const SPOOF_TABLE: &[&str] = &["table", "bridge", "nat"];

fn remove_nft(env: &Env, conf: &NetConf, masq_rules: bool, spoof: bool) -> Result<(), CniError> {
    let lists: Vec<&[&str]> = [(masq_rules, MASQ_CHAIN), (spoof, SPOOF_TABLE)]
        .into_iter()
        .filter_map(|(on, l)| on.then_some(l))
        .collect();
    firewall::nft_remove(&lists, |listings| {
        let parsed = lists
            .iter()
            .zip(listings)
            .map(|(args, l)| masq::parse_nft_listing(args, l))
            .collect::<Result<Vec<Value>, _>>()?;
        let mut script = String::new();
        let mut next = parsed.iter();
        if masq_rules {
            if let Some(s) = next
                .next()
                .and_then(|l| masq::nft_remove(l, &conf.name, &env.ifname, &env.container_id))
            {
                script.push_str(&s);
            }
        }
        if spoof {
            let id = spoofchk::ref_id(&env.container_id, &env.ifname);
            if let Some(s) = next.next().and_then(|l| spoofchk::teardown_script(l, &id)) {
                script.push_str(&s);
            }
        }
        Ok((!script.is_empty()).then_some(script))
    })
}

/// GC: removes the masquerade rules of this network whose attachment is not among `keep`,
/// found by the comments (iptables: the container ID; nftables: container and interface).
pub fn collect_garbage(conf: &NetConf, keep: &[Attachment]) -> Result<(), CniError> {
    let ids: Vec<&str> = keep.iter().map(|a| a.container_id.as_str()).collect();
    let pairs: Vec<(&str, &str)> = keep
        .iter()
        .map(|a| (a.ifname.as_str(), a.container_id.as_str()))
        .collect();
    let (ids, pairs) = (&ids, &pairs);
    let mut jobs: Vec<Box<dyn FnOnce() -> Result<(), CniError> + Send + '_>> = Vec::new();
    if firewall::has_iptables() {
        jobs.push(Box::new(move || {
            Ok(firewall::iptables_remove(
                &[Family::V4, Family::V6],
                "nat",
                |_, saved| {
                    let stale: Vec<String> = masq::iptables_containers(saved, &conf.name)
                        .into_iter()
                        .filter(|id| !ids.contains(&id.as_str()))
                        .collect();
                    let stale: Vec<&str> = stale.iter().map(String::as_str).collect();
                    masq::iptables_remove_all(saved, &conf.name, &stale)
                },
            )?)
        }));
    }
    if firewall::has_nft() {
        jobs.push(Box::new(move || {
            firewall::nft_remove(&[MASQ_CHAIN], |listings| {
                let listing = masq::parse_nft_listing(MASQ_CHAIN, &listings[0])?;
                Ok(masq::nft_gc(&listing, &conf.name, pairs))
            })
        }));
    }
    firewall::run_side_by_side(jobs.into_iter().map(|j| move || j()).collect())
}
