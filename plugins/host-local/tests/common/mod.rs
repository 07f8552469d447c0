//! Shared by the integration tests: a throwaway dataDir, configs, and both implementations.
#![allow(dead_code)]

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use testkit::{Invocation, GO_PLUGIN_DIR};

/// CNI_NETNS is required for ADD and CHECK, and host-local never opens it.
pub const NETNS: &str = "/var/run/netns/host-local-test";
pub const INDEX: &str = ".host-local.index";

pub fn ours(command: &str) -> Invocation {
    Invocation::new("host-local", command).netns(NETNS)
}

pub fn go_binary() -> PathBuf {
    Path::new(GO_PLUGIN_DIR).join("host-local")
}

/// The Go reference, when installed (it is in CI).
pub fn go(command: &str) -> Option<Invocation> {
    let bin = go_binary();
    testkit::runs_here(testkit::go_plugins_available(), testkit::GO_PLUGINS)
        .then(|| Invocation::at(bin, command).netns(NETNS))
}

/// One network in its own temporary dataDir.
pub struct Net {
    pub tmp: tempfile::TempDir,
    pub name: String,
}

impl Net {
    pub fn new() -> Net {
        Net {
            tmp: tempfile::tempdir().expect("temp dir"),
            name: "testnet".to_string(),
        }
    }

    pub fn data_dir(&self) -> PathBuf {
        self.tmp.path().join("networks")
    }

    pub fn dir(&self) -> PathBuf {
        self.data_dir().join(&self.name)
    }

    /// A config of `version` whose ipam section is `ipam` plus type and dataDir.
    pub fn conf(&self, version: &str, ipam: Value) -> Value {
        let mut ipam = ipam;
        ipam["type"] = json!("host-local");
        ipam["dataDir"] = json!(self.data_dir());
        json!({"cniVersion": version, "name": self.name, "ipam": ipam})
    }

    /// The usual single-range config.
    pub fn subnet(&self, version: &str, subnet: &str) -> Value {
        self.conf(version, json!({"subnet": subnet}))
    }

    /// Every name in the network directory, sorted, hidden ones included.
    pub fn files(&self) -> Vec<String> {
        let mut names: Vec<String> = match std::fs::read_dir(self.dir()) {
            Ok(rd) => rd
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect(),
            Err(_) => Vec::new(),
        };
        names.sort();
        names
    }

    /// The names, less the index (which the Go plugin does not know about).
    pub fn files_but_index(&self) -> Vec<String> {
        self.files().into_iter().filter(|n| n != INDEX).collect()
    }

    /// Reservation file name -> content.
    pub fn reservations(&self) -> BTreeMap<String, String> {
        self.files()
            .into_iter()
            .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
            .map(|n| {
                let content = std::fs::read_to_string(self.dir().join(&n)).unwrap();
                (n, content)
            })
            .collect()
    }

    pub fn mode_of(&self, name: &str) -> u32 {
        std::fs::metadata(self.dir().join(name))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    }

    /// Writes a reservation as the Go plugin would.
    pub fn write_reservation(&self, ip: &str, content: &str) {
        std::fs::create_dir_all(self.dir()).unwrap();
        std::fs::write(self.dir().join(ip), content).unwrap();
    }

    /// Only the bookkeeping files are left.
    pub fn assert_empty(&self) {
        let left: Vec<String> = self
            .files()
            .into_iter()
            .filter(|n| n != "lock" && !n.starts_with("last_reserved_ip."))
            .collect();
        assert!(left.is_empty(), "left behind: {left:?}");
    }
}

/// The address (without prefix) of each `ips` entry of a result.
pub fn addresses(result: &Value) -> Vec<String> {
    result["ips"]
        .as_array()
        .map(|ips| {
            ips.iter()
                .map(|ip| {
                    let a = ip["address"].as_str().unwrap();
                    a.split('/').next().unwrap().to_string()
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The single address a one-range ADD returned.
pub fn address(result: &Value) -> String {
    let a = addresses(result);
    assert_eq!(a.len(), 1, "one address expected in {result}");
    a[0].clone()
}
