//! The protocol layer every plugin (loopback included) runs first: environment, stdin JSON,
//! cniVersion, name, prevResult, runtimeConfig and GC's valid attachments.
#![no_main]

use cni_fuzz::{assert_result_round_trips, request};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for command in ["ADD", "DEL", "CHECK", "GC", "STATUS"] {
        let Some(req) = request(command, data) else {
            continue;
        };
        if let Ok(Some(prev)) = req.prev_result() {
            assert_result_round_trips(&prev);
        }
        let _ = req.valid_attachments();
        let _ = req.runtime_config();
    }
});
