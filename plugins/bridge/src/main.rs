//! `bridge`: puts a container on a Linux bridge of the host through a veth pair, with its
//! addresses from an IPAM plugin, the bridge as its gateway, and masquerading.
//!
//! Independent slow work overlaps: IPAM runs while the links are made, the rule batch while
//! the pod and the bridge get their addresses, and on DEL the IPAM release and the rule
//! removal while the veth is deleted.

use cni_bridge::effects::ipam::Ipam;
use cni_bridge::effects::links::LinkRef;
use cni_bridge::effects::undo::Undo;
use cni_bridge::effects::{check, links, pod, rules};
use cni_bridge::gateway::{apply_gateways, Gateways};
use cni_bridge::{families_to_clean, spoofchk, NetConf};
use cni_kernel::netlink::Netlink;
use cni_kernel::Netns;
use cni_protocol::invoke::delegate;
use cni_protocol::{CniError, CniResult, Command, Plugin, Request};
use ipnetwork::IpNetwork;
use std::thread::{self, Scope, ScopedJoinHandle};
use std::time::Duration;

/// How long ADD waits for the host end of the veth to come up on the bridge.
const PORT_UP_TIMEOUT: Duration = Duration::from_millis(2500);

struct Bridge;

fn load(req: &Request) -> Result<NetConf, CniError> {
    NetConf::parse(&req.config, &req.name, &req.env.args)
}

/// The config of the cleanup verbs, DEL and GC: invalid fields take their defaults (reported on
/// stderr), since a config that broke after ADD must not block removing what ADD made; ADD and
/// CHECK still refuse it.
fn load_for_cleanup(req: &Request) -> Result<NetConf, CniError> {
    let (conf, ignored) = NetConf::parse_for_del(&req.config, &req.name, &req.env.args)?;
    for e in ignored {
        eprintln!(
            "{} ignores an invalid field, using its default: {e}",
            req.env.command
        );
    }
    Ok(conf)
}

fn joined<T>(h: ScopedJoinHandle<'_, Result<T, CniError>>) -> Result<T, CniError> {
    h.join()
        .unwrap_or_else(|_| Err(CniError::internal("a worker thread panicked")))
}

impl Plugin for Bridge {
    fn about(&self) -> &'static str {
        "CNI bridge plugin (Rust)"
    }

    fn add(&self, req: &Request) -> Result<CniResult, CniError> {
        let conf = load(req)?;
        conf.check_for_add()?;
        if conf.mac_spoof_check {
            spoofchk::check_names_fit(&req.env.container_id, &req.env.ifname)?;
        }
        let pod_ns = Netns::open(&req.env.netns)?;
        thread::scope(|s| {
            // IPAM allocates while the links are made.
            let mut ipam = Ipam::start(s, req, &conf);
            let mut undo = Undo::default();
            let added = attach(s, req, &conf, &pod_ns, &mut ipam, &mut undo);
            if added.is_err() {
                undo.run(req, &conf, &mut ipam);
            }
            added
        })
    }

    fn del(&self, req: &Request) -> Result<(), CniError> {
        let conf = load_for_cleanup(req)?;
        let (env, conf) = (&req.env, &conf);
        thread::scope(|s| {
            // IPAM releases the address while the interface goes.
            let released = conf
                .ipam_type
                .as_deref()
                .map(|t| s.spawn(move || delegate(env, Command::Del, t, &req.config)));
            // The interface, while its namespace lasts, tells which families of rules exist.
            let found = pod::find_container_link(&env.netns, &env.ifname);
            let families = families_to_clean(
                found
                    .as_ref()
                    .ok()
                    .and_then(Option::as_ref)
                    .map(|c| c.addresses.as_slice()),
            );
            // The rules are found by name, so they go even when the namespace is gone.
            let removed = (conf.ip_masq || conf.mac_spoof_check)
                .then(|| s.spawn(move || rules::remove(env, conf, &families)));
            // Deleting the container end deletes the pair; DEL returns once both are gone
            // from the namespaces, not when the kernel has finished freeing them.
            let deleted = found.and_then(|c| {
                Ok(c.map(|c| c.pod.delete_link_detached(&c.ns, c.link.index))
                    .transpose()?)
            });
            let released = released.map(joined).transpose();
            let removed = removed.map(joined).transpose();
            deleted?;
            released?;
            removed?;
            Ok(())
        })
    }

    fn check(&self, req: &Request) -> Result<(), CniError> {
        let conf = load(req)?;
        let prev = req.prev_result()?.ok_or_else(|| {
            CniError::invalid_config("CHECK needs the previous result (field \"prevResult\")")
        })?;
        if let Some(t) = &conf.ipam_type {
            delegate(&req.env, Command::Check, t, &req.config)?;
        }
        check::attachment(req, &conf, &prev)
    }

    fn gc(&self, req: &Request) -> Result<(), CniError> {
        let conf = load_for_cleanup(req)?;
        let keep = req.valid_attachments()?;
        let (env, conf, keep) = (&req.env, &conf, &keep);
        thread::scope(|s| {
            // IPAM releases what no attachment holds while the stale rules go.
            let released = conf
                .ipam_type
                .as_deref()
                .map(|t| s.spawn(move || delegate(env, Command::Gc, t, &req.config)));
            let removed = conf.ip_masq.then(|| rules::collect_garbage(conf, keep));
            released.map(joined).transpose()?;
            removed.transpose()?;
            Ok(())
        })
    }

    fn status(&self, req: &Request) -> Result<(), CniError> {
        let conf = load(req)?;
        match &conf.ipam_type {
            Some(t) => delegate(&req.env, Command::Status, t, &req.config),
            None => Ok(()),
        }
    }
}

/// ADD's work after the checks; `undo` records what to take back if a later step fails.
fn attach<'scope, 'env>(
    s: &'scope Scope<'scope, 'env>,
    req: &'env Request,
    conf: &'env NetConf,
    pod_ns: &Netns,
    ipam: &mut Ipam<'scope, 'env>,
    undo: &mut Undo,
) -> Result<CniResult, CniError> {
    let env = &req.env;
    let host = &Netlink::open()?;
    let pod = &Netlink::open_in(pod_ns)?;
    let bridge = links::ensure_bridge(host, conf)?;
    let veth = links::create_veth(host, pod, pod_ns, &bridge, conf, &env.ifname)?;
    undo.veth_made(host, veth.host.index);
    // The rule tools start while IPAM finishes; they write once the addresses are known.
    let spoof = conf.mac_spoof_check.then(|| {
        let mac: [u8; 6] = veth.container.mac.as_slice().try_into().unwrap_or([0; 6]);
        (veth.host.name.clone(), mac)
    });
    let rules = (conf.ip_masq || conf.mac_spoof_check)
        .then(|| rules::RuleWriter::start(s, env, conf, spoof));
    links::configure_port(host, &veth.host, conf)?;
    let mut result = CniResult {
        interfaces: vec![
            bridge.interface(""),
            veth.host.interface(""),
            veth.container.interface(&env.netns),
        ],
        ..Default::default()
    };

    let mut gateways = Gateways::default();
    if let Some(allocated) = ipam.result()? {
        result.ips = allocated.ips;
        result.routes = allocated.routes;
        result.dns = allocated.dns;
        gateways = apply_gateways(&mut result, conf)?;
    }

    // The rules are written while the pod and the bridge get their addresses.
    let addrs: Vec<IpNetwork> = result.ips.iter().map(|ip| ip.address).collect();
    if let Some(rules) = &rules {
        undo.rules_made(families_to_clean(Some(&addrs)));
        rules.write(addrs);
    }

    let configured = configure(
        req,
        conf,
        host,
        pod_ns,
        pod,
        &bridge,
        &veth,
        &gateways,
        &mut result,
    );
    let written = rules.map(rules::RuleWriter::join).transpose();
    configured?;
    written?;
    report_links(host, conf, &bridge, &veth, &mut result)?;

    if let Some(dns) = &conf.dns {
        result.dns = dns.clone();
    }
    Ok(result)
}

/// The pod's addresses and routes, and the gateways on the bridge.
#[allow(clippy::too_many_arguments)]
fn configure(
    req: &Request,
    conf: &NetConf,
    host: &Netlink,
    pod_ns: &Netns,
    pod: &Netlink,
    bridge: &LinkRef,
    veth: &links::Veth,
    gateways: &Gateways,
    result: &mut CniResult,
) -> Result<(), CniError> {
    let ifname = &req.env.ifname;
    if conf.is_layer3() {
        pod::configure(pod_ns, pod, conf, ifname, &veth.container, result)?;
    } else if !conf.disable_container_interface {
        pod.set_up(veth.container.index, true)?;
    }
    if let Some(vlan_gateway) = links::ensure_gateways(host, bridge, conf, gateways)? {
        result.interfaces.push(vlan_gateway.interface(""));
    }
    Ok(())
}

/// Waits for the port to be up (it usually is by now), then reports the host end's and the
/// bridge's MACs as they are: they may change while ports come and go.
fn report_links(
    host: &Netlink,
    conf: &NetConf,
    bridge: &LinkRef,
    veth: &links::Veth,
    result: &mut CniResult,
) -> Result<(), CniError> {
    if !conf.disable_container_interface {
        let up = host.wait_oper_up(veth.host.index, PORT_UP_TIMEOUT)?;
        result.interfaces[1] = LinkRef::of(&up).interface("");
    }
    if let Some(now) = host.link_by_index(bridge.index)? {
        result.interfaces[0] = LinkRef::of(&now).interface("");
    }
    Ok(())
}

fn main() {
    cni_protocol::run(&Bridge)
}
