//! scripts/install.sh run from a fresh tree: the script, the conflists, the systemd unit and its
//! environment file, and a target/release holding the workspace's built plugins and daemon,
//! nothing installed anywhere yet.

use crate::plugins::{repo_root, PLUGINS};
use std::fs;
use std::path::Path;
use std::process::{Command, Output};
use tempfile::TempDir;

/// The fabric daemon's binary, which goes beside the systemd unit, not among the plugins.
pub const DAEMON: &str = "flanneld";
/// The wireguard backend's userspace tunnel, installed beside flanneld, which runs it from there.
pub const TUNNEL: &str = "flannel-wireguard";
/// The udp backend's tunnel, installed beside flanneld, which runs it from there.
pub const UDP_TUNNEL: &str = "flannel-udp";
/// The NetworkPolicy enforcer, installed beside flanneld with a unit of its own.
pub const ENFORCER: &str = "flannel-netpol";

pub fn fresh_tree() -> TempDir {
    let tree = tempfile::Builder::new()
        .prefix("e2e-tree-")
        .tempdir()
        .unwrap();
    let top = repo_root();
    for dir in ["scripts", "testdata", "target/release", "deploy/systemd"] {
        fs::create_dir_all(tree.path().join(dir)).unwrap();
    }
    copy(
        &top.join("scripts/install.sh"),
        &tree.path().join("scripts/install.sh"),
    );
    for entry in fs::read_dir(top.join("testdata")).unwrap().flatten() {
        if entry.path().extension().is_some_and(|e| e == "conflist") {
            copy(
                &entry.path(),
                &tree.path().join("testdata").join(entry.file_name()),
            );
        }
    }
    for file in [
        "flanneld.service",
        "flanneld.env",
        "flannel-netpol.service",
        "flannel-netpol.env",
    ] {
        let rel = Path::new("deploy/systemd").join(file);
        copy(&top.join(&rel), &tree.path().join(rel));
    }
    for binary in PLUGINS
        .iter()
        .chain([&DAEMON, &TUNNEL, &UDP_TUNNEL, &ENFORCER])
    {
        copy(
            &testkit::bin_dir().join(binary),
            &tree.path().join("target/release").join(binary),
        );
    }
    tree
}

fn copy(from: &Path, to: &Path) {
    fs::copy(from, to).unwrap_or_else(|e| panic!("copying {}: {e}", from.display()));
}

/// Runs the tree's install.sh with `args`, never building.
pub fn run_install(tree: &Path, args: &[&str]) -> Output {
    Command::new(tree.join("scripts/install.sh"))
        .arg("--no-build")
        .args(args)
        .env_remove("CARGO_TARGET_DIR")
        .output()
        .expect("running install.sh")
}

/// The stdout of a run that must have succeeded.
pub fn succeeded(out: &Output) -> String {
    assert!(
        out.status.success(),
        "install.sh failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
