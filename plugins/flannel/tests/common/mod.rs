//! A node for the flannel tests: a temporary directory holding subnet.env, flannel's dataDir,
//! the delegate's IPAM dataDir and a CNI_PATH directory, and the configs that point into it.
#![allow(dead_code)]

use serde_json::{json, Value};
use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use testkit::{bin_dir, Invocation, PluginOutput, GO_PLUGIN_DIR};

/// The network name of the stock conflist.
pub const NETWORK: &str = "cbr0";

/// Which bridge, host-local and portmap the delegate chain runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stack {
    /// The workspace's own binaries.
    Ours,
    /// Debian's Go plugins in /usr/lib/cni.
    Go,
}

/// The stack the kernel tests run.
pub const STACK: Stack = Stack::Ours;

pub struct Node {
    pub dir: tempfile::TempDir,
}

impl Node {
    /// A node whose CNI_PATH holds our flannel and `stack`'s bridge, host-local and portmap.
    pub fn new(stack: Stack) -> Node {
        let node = Node {
            dir: tempfile::tempdir().expect("temporary directory"),
        };
        fs::create_dir_all(node.cni_path()).unwrap();
        symlink(bin_dir().join("flannel"), node.cni_path().join("flannel")).unwrap();
        let from = match stack {
            Stack::Ours => bin_dir(),
            Stack::Go => PathBuf::from(GO_PLUGIN_DIR),
        };
        for plugin in ["bridge", "host-local", "portmap"] {
            symlink(from.join(plugin), node.cni_path().join(plugin)).unwrap();
        }
        node
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    pub fn cni_path(&self) -> PathBuf {
        self.root().join("bin")
    }

    pub fn subnet_file(&self) -> PathBuf {
        self.root().join("run/flannel/subnet.env")
    }

    pub fn data_dir(&self) -> PathBuf {
        self.root().join("lib/cni/flannel")
    }

    pub fn ipam_dir(&self) -> PathBuf {
        self.root().join("lib/cni/networks")
    }

    /// The saved delegate file of a container.
    pub fn saved(&self, container: &str) -> PathBuf {
        self.data_dir().join(container)
    }

    /// Writes subnet.env from one of the testdata samples.
    pub fn write_subnet_env(&self, sample: &str) {
        fs::create_dir_all(self.subnet_file().parent().unwrap()).unwrap();
        fs::copy(testdata(sample), self.subnet_file()).unwrap();
    }

    /// The fields that point flannel and its delegate into this node's directory.
    pub fn locations(&self) -> Value {
        json!({
            "subnetFile": self.subnet_file(),
            "dataDir": self.data_dir(),
            "ipam": {"dataDir": self.ipam_dir()},
        })
    }

    /// testdata/10-flannel.conflist with flannel's files pointed into this node.
    pub fn conflist(&self) -> Value {
        let mut list: Value =
            serde_json::from_str(&fs::read_to_string(testdata("10-flannel.conflist")).unwrap())
                .unwrap();
        let flannel = list["plugins"][0].as_object_mut().unwrap();
        for (k, v) in self.locations().as_object().unwrap() {
            flannel.insert(k.clone(), v.clone());
        }
        list
    }

    /// A flannel config as a runtime hands it over, with `extra` merged in.
    pub fn flannel_config(&self, cni_version: &str, extra: Value) -> Value {
        let mut conf = json!({"cniVersion": cni_version, "name": NETWORK, "type": "flannel"});
        let o = conf.as_object_mut().unwrap();
        for (k, v) in self.locations().as_object().unwrap() {
            o.insert(k.clone(), v.clone());
        }
        for (k, v) in extra.as_object().unwrap() {
            o.insert(k.clone(), v.clone());
        }
        conf
    }

    /// An invocation of our flannel with this node's CNI_PATH.
    pub fn flannel(&self, command: &str) -> Invocation {
        Invocation::new("flannel", command).path(&self.cni_path().display().to_string())
    }

    /// The address files host-local holds for the network (its lock and cursor files aside).
    pub fn allocations(&self) -> Vec<String> {
        let dir = self.ipam_dir().join(NETWORK);
        let Ok(entries) = fs::read_dir(&dir) else {
            return Vec::new();
        };
        let mut out: Vec<String> = entries
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
            .collect();
        out.sort();
        out
    }

    /// Installs a delegate plugin named `fake` that records each call's config in
    /// `calls/<COMMAND>.json` (and its environment in `calls/<COMMAND>.env`), prints `result`
    /// for ADD, and fails with code 42 for each command that has a `fail-<COMMAND>` file.
    pub fn install_fake_delegate(&self, result: &Value) {
        let calls = self.root().join("calls");
        fs::create_dir_all(&calls).unwrap();
        fs::write(self.root().join("result.json"), result.to_string()).unwrap();
        let script = format!(
            r#"#!/bin/sh
calls={calls}
cat > "$calls/$CNI_COMMAND.json"
env | grep '^CNI_' | sort > "$calls/$CNI_COMMAND.env"
if [ -e "{root}/fail-$CNI_COMMAND" ]; then
    echo '{{"cniVersion":"1.0.0","code":42,"msg":"fake delegate refuses '"$CNI_COMMAND"'"}}'
    exit 1
fi
if [ "$CNI_COMMAND" = ADD ]; then cat "{root}/result.json"; fi
"#,
            calls = calls.display(),
            root = self.root().display()
        );
        let path = self.cni_path().join("fake");
        fs::write(&path, script).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// Makes the fake delegate fail `command`.
    pub fn fail_fake(&self, command: &str) {
        fs::write(self.root().join(format!("fail-{command}")), "").unwrap();
    }

    /// The config the fake delegate received for `command`, if it was called.
    pub fn fake_call(&self, command: &str) -> Option<Value> {
        let text = fs::read_to_string(self.root().join(format!("calls/{command}.json"))).ok()?;
        Some(serde_json::from_str(&text).unwrap())
    }

    /// The CNI_* environment the fake delegate received for `command`.
    pub fn fake_env(&self, command: &str) -> String {
        fs::read_to_string(self.root().join(format!("calls/{command}.env"))).unwrap_or_default()
    }
}

pub fn testdata(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata")
        .join(name)
}

/// The JSON of a file.
pub fn read_json(path: &Path) -> Value {
    let text =
        fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}: {text}", path.display()))
}

/// Asserts the run failed with `code` and returns the message.
pub fn error_message(out: &PluginOutput, code: u64) -> String {
    out.err(code);
    out.msg()
}
