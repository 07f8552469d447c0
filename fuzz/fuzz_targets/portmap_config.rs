//! portmap's config: runtimeConfig portMappings, marks, conditions, backend; then the rule
//! text it would write for the prevResult's addresses, in both backends.
#![no_main]

use cni_fuzz::request;
use cni_portmap::iptables::{add_document, del_document, NatTable};
use cni_portmap::nftables::{add_script, del_script};
use cni_portmap::{Backend, Config, ContainerAddrs};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some(req) = request("ADD", data) else {
        return;
    };
    for backend in [Backend::Iptables, Backend::Nftables] {
        let Ok(conf) = Config::parse(&req.config, &req.name, || backend) else {
            continue;
        };
        let Ok(Some(prev)) = req.prev_result() else {
            continue;
        };
        let addrs = ContainerAddrs::from_result(&prev, &req.env.ifname);
        let _ = conf.check_families(&addrs);
        let empty = NatTable::parse("");
        for addr in addrs.iter() {
            let _ = add_document(&conf, &req.env.container_id, addr, &empty);
            let _ = add_script(&conf, &req.env.container_id, addr, &[]);
        }
        let _ = del_document(&conf.network, &req.env.container_id, &empty);
        let _ = del_script(&req.env.container_id, &[]);
    }
});
