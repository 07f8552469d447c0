//! bridge's config: every field, CNI_ARGS MAC=, runtimeConfig mac, the lenient reading DEL
//! uses, and ADD's extra checks.
#![no_main]

use cni_bridge::NetConf;
use cni_fuzz::request;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some(req) = request("ADD", data) else {
        return;
    };
    if let Ok(conf) = NetConf::parse(&req.config, &req.name, &req.env.args) {
        let _ = conf.check_for_add();
    }
    let _ = NetConf::parse_for_del(&req.config, &req.name, &req.env.args);
});
