//! `host-local`: hands out addresses from the configured ranges and records each one as a
//! file under `<dataDir>/<network>`, in the Go plugin's format.

use cni_ipam::dns::load_resolv_conf;
use cni_ipam::store::{check_usable, reserved_addresses, Store};
use cni_ipam::{allocate, IpamConfig, Key, StoreConfig};
use cni_protocol::error::PLUGIN_NOT_AVAILABLE;
use cni_protocol::{CniError, CniResult, Dns, Plugin, Request};

struct HostLocal;

fn key_of(req: &Request) -> Key {
    Key::new(&req.env.container_id, &req.env.ifname)
}

impl Plugin for HostLocal {
    fn about(&self) -> &'static str {
        "CNI host-local IPAM plugin (Rust)"
    }

    fn add(&self, req: &Request) -> Result<CniResult, CniError> {
        let conf = IpamConfig::from_request(req)?;
        let dns = match &conf.resolv_conf {
            Some(path) => load_resolv_conf(path)?,
            None => Dns::default(),
        };
        let key = key_of(req);
        // One address per range set: their files are made before the lock is taken.
        let mut store =
            Store::open_to_reserve(&conf.network_dir(), Some(&key), conf.rangesets.len())?;
        let ips = allocate(&mut store, &conf, &key);
        store.close();
        Ok(CniResult {
            ips: ips?,
            routes: conf.routes,
            dns,
            ..Default::default()
        })
    }

    fn del(&self, req: &Request) -> Result<(), CniError> {
        // Only where the reservations are: a config that no longer validates must not
        // keep its addresses reserved.
        let (conf, ignored) = StoreConfig::load_for_del(&req.config, &req.name);
        for e in ignored {
            eprintln!("DEL ignores an invalid field, using its default: {e}");
        }
        // No directory: nothing was ever held here.
        let Some(mut store) = Store::open_existing(&conf.network_dir())? else {
            return Ok(());
        };
        let released = store.release(&key_of(req));
        store.close();
        released.map(|_| ())
    }

    fn check(&self, req: &Request) -> Result<(), CniError> {
        let conf = IpamConfig::from_request(req)?;
        let key = key_of(req);
        let held = match Store::open_existing(&conf.network_dir())? {
            Some(mut store) => store.holds(&key)?,
            None => false,
        };
        if held {
            return Ok(());
        }
        Err(CniError::internal(format!(
            "host-local: failed to find an address held by container {} (ifname {}) in {}",
            key.container_id,
            key.ifname,
            conf.network_dir().display()
        )))
    }

    fn status(&self, req: &Request) -> Result<(), CniError> {
        let conf = IpamConfig::from_request(req)?;
        check_usable(&conf.data_dir)?;
        // ADD takes one address from every range set: one exhausted set fails every ADD.
        let taken = reserved_addresses(&conf.network_dir())?;
        let exhausted: Vec<String> = conf
            .rangesets
            .iter()
            .enumerate()
            .filter(|(_, rs)| rs.set.is_exhausted(&taken))
            .map(|(i, rs)| format!("range set {i} ({} = {})", rs.field, rs.set))
            .collect();
        if exhausted.is_empty() {
            return Ok(());
        }
        Err(CniError::new(
            PLUGIN_NOT_AVAILABLE,
            format!(
                "host-local: no addresses left in {} of network {:?} in {}: every address is reserved, so ADD would fail",
                exhausted.join(", "),
                conf.network,
                conf.network_dir().display()
            ),
        ))
    }

    fn gc(&self, req: &Request) -> Result<(), CniError> {
        let conf = StoreConfig::from_request(req)?;
        let valid: Vec<Key> = req
            .valid_attachments()?
            .iter()
            .map(|a| Key::new(&a.container_id, &a.ifname))
            .collect();
        let Some(mut store) = Store::open_existing(&conf.network_dir())? else {
            return Ok(());
        };
        let outcome = store.gc(&valid);
        store.close();
        match outcome {
            Ok(_) => Ok(()),
            Err(failures) => Err(CniError::io(format!(
                "host-local GC in {}: {} failure(s): {}",
                conf.network_dir().display(),
                failures.len(),
                failures.join("; ")
            ))),
        }
    }
}

fn main() {
    cni_protocol::run(&HostLocal)
}
