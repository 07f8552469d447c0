//! Results of every spec version, as a delegate prints them (bytes on stdout, success or a
//! CNI error) and as a prevResult in the next plugin's config. Property: a result that
//! parses prints, parses again and prints the same.
#![no_main]

use cni_fuzz::{assert_result_round_trips, json, request, version_of};
use cni_protocol::{CniError, CniResult};
use libfuzzer_sys::fuzz_target;
use serde_json::json;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let Some(v) = json(body) else {
        return;
    };
    let version = version_of(pick);
    if let Ok(result) = CniResult::parse(&v, version) {
        assert_result_round_trips(&result);
    }
    let _ = CniError::from_json(&v);
    let conf = json!({"cniVersion": version.as_str(), "name": "fuzz", "type": "portmap",
                      "prevResult": v});
    if let Some(req) = request("ADD", format!("\n{conf}").as_bytes()) {
        if let Ok(Some(prev)) = req.prev_result() {
            assert_result_round_trips(&prev);
            let _ = cni_portmap::host_interface(&prev);
            let _ = cni_portmap::ContainerAddrs::from_result(&prev, "eth0");
        }
    }
});
