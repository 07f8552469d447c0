//! scripts/install.sh run from a fresh tree: the script, the conflists, and a target/release
//! holding the workspace's built plugins, nothing installed anywhere yet.

use crate::plugins::{repo_root, PLUGINS};
use std::fs;
use std::path::Path;
use std::process::{Command, Output};
use tempfile::TempDir;

pub fn fresh_tree() -> TempDir {
    let tree = tempfile::Builder::new()
        .prefix("e2e-tree-")
        .tempdir()
        .unwrap();
    let top = repo_root();
    for dir in ["scripts", "testdata", "target/release"] {
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
    for plugin in PLUGINS {
        copy(
            &testkit::bin_dir().join(plugin),
            &tree.path().join("target/release").join(plugin),
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
