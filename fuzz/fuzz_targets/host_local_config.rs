//! host-local's config: ranges, rangeset files aside, routes, dataDir, CNI_ARGS IP=,
//! runtimeConfig ips and ipRanges, args.cni.ips.
#![no_main]

use cni_fuzz::request;
use cni_ipam::{IpamConfig, StoreConfig};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for command in ["ADD", "DEL"] {
        let Some(req) = request(command, data) else {
            continue;
        };
        let _ = StoreConfig::from_request(&req);
        if let Ok(conf) = IpamConfig::from_request(&req) {
            let _ = conf.assign_requested();
            let _ = conf.network_dir();
        }
    }
});
