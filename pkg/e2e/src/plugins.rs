//! Which plugin binaries a node runs, and the conflist they run with.

use serde_json::{json, Value};
use std::fmt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Every plugin of the suite, under the names a runtime execs.
pub const PLUGINS: [&str; 5] = ["flannel", "bridge", "host-local", "portmap", "loopback"];

/// The binaries a node is given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PluginSet {
    /// All five of ours, as built in this workspace.
    Ours,
    /// Our flannel delegating to Debian's Go bridge, host-local, portmap and loopback: the same
    /// runtime checks pass against the reference, so they test the runtimes, not our assumptions.
    Go,
    /// All five of ours, put in place by scripts/install.sh (`--bin-dir`) as an operator
    /// installs them.
    Installed,
}

impl PluginSet {
    /// Where `plugin` of this set comes from.
    pub fn source(self, plugin: &str) -> PathBuf {
        match self {
            PluginSet::Go if plugin != "flannel" => Path::new(testkit::GO_PLUGIN_DIR).join(plugin),
            _ => testkit::bin_dir().join(plugin),
        }
    }

    /// Puts the five plugins into `dir` as an installation does: each copied to a temporary
    /// name beside it and renamed into place, so a runtime never execs a partial file.
    pub fn install(self, dir: &Path) {
        std::fs::create_dir_all(dir).unwrap();
        if self == PluginSet::Installed {
            let tree = crate::install::fresh_tree();
            let dir = dir.display().to_string();
            crate::install::succeeded(&crate::install::run_install(
                tree.path(),
                &["--bin-dir", &dir],
            ));
            return;
        }
        for plugin in PLUGINS {
            let src = self.source(plugin);
            let tmp = dir.join(format!(".{plugin}.new"));
            std::fs::copy(&src, &tmp).unwrap_or_else(|e| {
                panic!("installing {} ({self}): {e}", src.display());
            });
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
            std::fs::rename(&tmp, dir.join(plugin)).unwrap();
        }
    }
}

impl fmt::Display for PluginSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PluginSet::Ours => "ours",
            PluginSet::Go => "go",
            PluginSet::Installed => "installed by scripts/install.sh",
        })
    }
}

/// The repository's top directory.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The conflist an operator installs: `testdata/10-flannel.conflist`, unmodified.
pub fn flannel_conflist() -> Value {
    let path = repo_root().join("testdata/10-flannel.conflist");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// `conflist` with the portmap entry carrying fixed `portMappings` in its `runtimeConfig`: the way
/// to map a port for a runtime that has no flag for it (`ctr run --cni`). libcni passes a plugin's
/// own `runtimeConfig` through untouched when the runtime supplies no capability arguments.
pub fn with_static_port_mapping(mut conflist: Value, host_port: u16, container_port: u16) -> Value {
    let portmap = conflist["plugins"]
        .as_array_mut()
        .and_then(|plugins| plugins.iter_mut().find(|p| p["type"] == "portmap"))
        .expect("the conflist has a portmap entry");
    portmap["runtimeConfig"] = json!({
        "portMappings": [
            {"hostPort": host_port, "containerPort": container_port, "protocol": "tcp"}
        ]
    });
    conflist
}
