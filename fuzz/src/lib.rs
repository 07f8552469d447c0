//! What the fuzz targets share: a request built as a plugin builds it from its environment
//! and stdin, and the one property every result must keep.

use cni_protocol::skel::build_request;
use cni_protocol::version::Version;
use cni_protocol::{CniResult, Request};
use serde_json::Value;

/// A request for `command` whose CNI_ARGS is the input up to the first newline and whose
/// stdin is the rest, as the skeleton builds it; None when the skeleton refuses it.
pub fn request(command: &str, data: &[u8]) -> Option<Request> {
    let (args, stdin) = match data.iter().position(|b| *b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (&b""[..], data),
    };
    let args = String::from_utf8_lossy(args).into_owned();
    let command = command.to_string();
    let get = move |k: &str| -> Option<String> {
        Some(match k {
            "CNI_COMMAND" => command.clone(),
            "CNI_CONTAINERID" => "fuzz-container".into(),
            "CNI_NETNS" => "/var/run/netns/fuzz".into(),
            "CNI_IFNAME" => "eth0".into(),
            "CNI_ARGS" => args.clone(),
            "CNI_PATH" => "/opt/cni/bin".into(),
            _ => return None,
        })
    };
    build_request(&get, stdin.to_vec()).ok()
}

/// A result that parses prints, in any version it can be printed in, a JSON that parses
/// again and prints the same: nothing is lost or invented on the way through a chain.
pub fn assert_result_round_trips(result: &CniResult) {
    for version in Version::ALL {
        let Ok(printed) = result.to_json(version) else {
            continue;
        };
        let again = CniResult::parse(&printed, version).unwrap_or_else(|e| {
            panic!("{version:?}: the printed result does not parse: {e}\n{printed}")
        });
        let reprinted = again
            .to_json(version)
            .unwrap_or_else(|e| panic!("{version:?}: the reparsed result does not print: {e}"));
        assert_eq!(
            printed, reprinted,
            "{version:?}: print, parse, print changed the result"
        );
    }
}

/// The versions a config may name, picked by one byte.
pub fn version_of(b: u8) -> Version {
    Version::ALL[b as usize % Version::ALL.len()]
}

/// The JSON of `data`, when it is JSON.
pub fn json(data: &[u8]) -> Option<Value> {
    serde_json::from_slice(data).ok()
}
