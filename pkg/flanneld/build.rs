//! The revision `flanneld --version` prints after the version: the commit's first 12 hex digits,
//! `-dirty` when `git diff --quiet HEAD` found changes. From, in order: FLANNELD_BUILD_REVISION
//! (for builds without .git, such as the image's), git, the commit `git archive` writes into
//! `revision` (export-subst), else none.

use std::path::{Path, PathBuf};
use std::process::Command;

fn git(root: &Path, args: &[&str]) -> Option<std::process::Output> {
    Command::new("git")
        .arg("-C")
        .arg(root)
        .args(args)
        .output()
        .ok()
}

fn git_line(root: &Path, args: &[&str]) -> Option<String> {
    let out = git(root, args)?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
}

fn is_commit(s: &str) -> bool {
    s.len() >= 12 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The revision from git, when this crate's workspace is the root of a git work tree (not a
/// directory inside some other repository); also what to watch so that a new commit rebuilds.
fn from_git(root: &Path) -> Option<(String, Vec<PathBuf>)> {
    let top = git_line(root, &["rev-parse", "--show-toplevel"])?;
    if Path::new(&top).canonicalize().ok()? != root.canonicalize().ok()? {
        return None;
    }
    let head = git_line(root, &["rev-parse", "HEAD"]).filter(|h| is_commit(h))?;
    let dirty = git(root, &["diff", "--quiet", "HEAD"]).is_some_and(|o| o.status.code() == Some(1));
    let mut watch = Vec::new();
    let mut paths = vec!["HEAD".to_string(), "packed-refs".to_string()];
    if let Some(branch) = git_line(root, &["symbolic-ref", "-q", "HEAD"]) {
        paths.push(branch);
    }
    for p in paths {
        if let Some(path) = git_line(
            root,
            &["rev-parse", "--path-format=absolute", "--git-path", &p],
        ) {
            watch.push(PathBuf::from(path));
        }
    }
    let revision = format!("{}{}", &head[..12], if dirty { "-dirty" } else { "" });
    Some((revision, watch))
}

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let root = manifest.join("../..");
    let archived = manifest.join("revision");
    println!("cargo:rerun-if-env-changed=FLANNELD_BUILD_REVISION");
    // The daemon's own sources: their edits rebuild it anyway, and then `-dirty` is looked at
    // again (edits elsewhere are seen at the next commit or edit here).
    for p in ["src", "Cargo.toml", "revision"] {
        println!("cargo:rerun-if-changed={}", manifest.join(p).display());
    }
    let revision = match std::env::var("FLANNELD_BUILD_REVISION") {
        Ok(r) if !r.trim().is_empty() => {
            let r = r.trim();
            let commit = r.strip_suffix("-dirty").unwrap_or(r);
            assert!(
                commit.len() == 12 && is_commit(commit),
                "FLANNELD_BUILD_REVISION={r:?}: 12 hex digits of a commit, then -dirty or nothing"
            );
            r.to_string()
        }
        _ => match from_git(&root) {
            Some((revision, watch)) => {
                for p in watch.iter().filter(|p| p.exists()) {
                    println!("cargo:rerun-if-changed={}", p.display());
                }
                revision
            }
            None => std::fs::read_to_string(&archived)
                .ok()
                .map(|s| s.trim().to_string())
                .filter(|s| is_commit(s))
                .map(|s| s[..12].to_string())
                .unwrap_or_default(),
        },
    };
    println!("cargo:rustc-env=FLANNELD_REVISION={revision}");
}
