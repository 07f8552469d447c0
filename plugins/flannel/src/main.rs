//! `flannel`: turns the fabric daemon's subnet.env into a delegate config (bridge with
//! host-local unless configured otherwise), saves it per container and runs it. DEL runs
//! exactly what ADD saved, so a changed subnet.env or config cannot strand a pod's state.

use cni_flannel::{
    build_delegate, delegate_type, read_subnet_env, subnet_env_status, wait_for_subnet_env,
    NetConf, Saved, Store,
};
use cni_protocol::error::UNKNOWN_CONTAINER;
use cni_protocol::invoke::{delegate, delegate_add};
use cni_protocol::{CniError, CniResult, Command, Plugin, Request};
use serde_json::{json, Value};
use std::collections::HashSet;

struct Flannel;

impl Plugin for Flannel {
    fn about(&self) -> &'static str {
        "CNI flannel meta-plugin (Rust)"
    }

    fn add(&self, req: &Request) -> Result<CniResult, CniError> {
        let conf = NetConf::parse(&req.config)?;
        // A config or ID error is reported at once, not after waiting for subnet.env.
        conf.check_delegate()?;
        Store::check_file_name(&req.env.container_id)?;
        let subnet_env = wait_for_subnet_env(&conf.subnet_file, conf.subnet_file_wait)?;
        let config = build_delegate(&conf, &subnet_env)?;
        let plugin = delegate_type(&config)?;
        let store = Store::new(&conf.data_dir);
        let id = &req.env.container_id;
        store.save(id, &config)?;
        // A failed delegate ADD has already been undone by its DEL; nothing is left to remember.
        delegate_add(&req.env, plugin, &config, req.version).inspect_err(|_| {
            if let Err(e) = store.remove(id) {
                eprintln!("after the failed ADD: {e}");
            }
        })
    }

    fn del(&self, req: &Request) -> Result<(), CniError> {
        let (conf, ignored) = NetConf::parse_for_del(&req.config);
        for e in ignored {
            eprintln!("DEL ignores an invalid field, using its default: {e}");
        }
        let store = Store::new(&conf.data_dir);
        let id = &req.env.container_id;
        let saved = match store.load(id)? {
            Saved::Missing => return Ok(()),
            Saved::Config(c) if delegate_type(&c).is_ok() => Ok(c),
            Saved::Config(c) => Err(format!(
                "{} names no plugin type: {c}",
                store.path(id).display()
            )),
            Saved::Corrupt(why) => Err(why),
        };
        let config = match saved {
            Ok(c) => c,
            Err(why) => match rebuilt_for_del(&conf, &why) {
                Some(c) => c,
                None => return store.remove(id),
            },
        };
        delegate(&req.env, Command::Del, delegate_type(&config)?, &config)?;
        store.remove(id)
    }

    fn check(&self, req: &Request) -> Result<(), CniError> {
        let conf = NetConf::parse(&req.config)?;
        let store = Store::new(&conf.data_dir);
        let id = &req.env.container_id;
        let mut config = match store.load(id)? {
            Saved::Config(c) => c,
            Saved::Missing => {
                return Err(CniError::new(
                    UNKNOWN_CONTAINER,
                    format!(
                        "no saved delegate config {} for container {id}: ADD has not run on this node, or DEL already has",
                        store.path(id).display()
                    ),
                ))
            }
            Saved::Corrupt(why) => return Err(CniError::decode(why)),
        };
        // The delegate checks what it made against the result the runtime holds.
        if let Some(o) = config.as_object_mut() {
            o.insert("cniVersion".into(), json!(req.version.as_str()));
            if let Some(prev) = req.field("prevResult") {
                o.insert("prevResult".into(), prev.clone());
            }
        }
        delegate(&req.env, Command::Check, delegate_type(&config)?, &config)
    }

    fn status(&self, req: &Request) -> Result<(), CniError> {
        let conf = NetConf::parse(&req.config)?;
        let subnet_env = subnet_env_status(&conf.subnet_file)?;
        let config = build_delegate(&conf, &subnet_env)?;
        delegate(&req.env, Command::Status, delegate_type(&config)?, &config)
    }

    fn gc(&self, req: &Request) -> Result<(), CniError> {
        let conf = NetConf::parse(&req.config)?;
        let valid = req.valid_attachments()?;
        let subnet_env = read_subnet_env(&conf.subnet_file)?;
        let mut config = build_delegate(&conf, &subnet_env)?;
        let list: Vec<Value> = valid
            .iter()
            .map(|a| json!({"containerID": a.container_id, "ifname": a.ifname}))
            .collect();
        if let Some(o) = config.as_object_mut() {
            o.insert("cni.dev/valid-attachments".into(), Value::Array(list));
        }
        delegate(&req.env, Command::Gc, delegate_type(&config)?, &config)?;
        let keep: HashSet<&str> = valid.iter().map(|a| a.container_id.as_str()).collect();
        let store = Store::new(&conf.data_dir);
        for id in store.remove_stale(&conf.name, &keep)? {
            eprintln!("gc: removed the saved delegate config of container {id}");
        }
        Ok(())
    }
}

/// A saved file that cannot be run (torn by a crash during the Go plugin's non-atomic write):
/// the delegate built from the current config and subnet.env undoes the same container, since
/// the delegate finds what it made by container ID. None when that cannot be built either.
fn rebuilt_for_del(conf: &NetConf, why: &str) -> Option<Value> {
    let rebuilt = read_subnet_env(&conf.subnet_file).and_then(|env| build_delegate(conf, &env));
    match rebuilt {
        Ok(c) => {
            eprintln!("{why}: running DEL with the delegate config built from the current config and subnet.env");
            Some(c)
        }
        Err(e) => {
            eprintln!("{why}, and no delegate config can be built ({e}): removing it");
            None
        }
    }
}

fn main() {
    cni_protocol::run(&Flannel)
}
