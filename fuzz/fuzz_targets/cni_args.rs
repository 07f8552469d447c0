//! CNI_ARGS and the other CNI_* variables. Property: the pairs CNI_ARGS parses into, joined
//! again, parse into the same pairs.
#![no_main]

use cni_protocol::env::{parse_args, Env};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(pairs) = parse_args(&text) {
        let joined: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let again = parse_args(&joined.join(";"))
            .unwrap_or_else(|e| panic!("{pairs:?} joined again does not parse: {e}"));
        assert_eq!(pairs, again, "CNI_ARGS {text:?}");
    }
    // The whole environment: container ID, ifname, args, path, split on NUL.
    let mut parts = text.split('\0');
    let vars: Vec<String> = (0..5)
        .map(|_| parts.next().unwrap_or_default().to_string())
        .collect();
    for command in ["ADD", "DEL", "GC"] {
        let get = |k: &str| -> Option<String> {
            Some(match k {
                "CNI_COMMAND" => command.to_string(),
                "CNI_CONTAINERID" => vars[0].clone(),
                "CNI_IFNAME" => vars[1].clone(),
                "CNI_ARGS" => vars[2].clone(),
                "CNI_PATH" => vars[3].clone(),
                "CNI_NETNS" => vars[4].clone(),
                _ => return None,
            })
        };
        if let Ok(env) = Env::from_getter(&get) {
            for (k, _) in &env.args {
                let _ = env.arg(k);
            }
        }
    }
});
