//! A PATH for a daemon under test: a directory holding every program of this machine's PATH
//! (as symlinks), except those hidden, with some replaced by wrappers that log each call and
//! run the real program. It shows which rule tools a daemon ran, and how it behaves on a host
//! without some of them, without touching the machine's own programs.

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};

pub struct ToolPath {
    dir: tempfile::TempDir,
}

/// The rule tools flanneld and the plugins run.
pub const RULE_TOOLS: &[&str] = &[
    "iptables",
    "iptables-save",
    "iptables-restore",
    "ip6tables",
    "ip6tables-save",
    "ip6tables-restore",
    "nft",
];

fn is_executable(p: &Path) -> bool {
    fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

impl ToolPath {
    /// Every program on this process's PATH, except those whose name starts with one of
    /// `hidden`, with the ones named in `traced` logging their calls.
    pub fn new(hidden: &[&str], traced: &[&str]) -> ToolPath {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let bin = dir.path().join("bin");
        fs::create_dir(&bin).unwrap_or_else(|e| panic!("creating {}: {e}", bin.display()));
        let log = dir.path().join("calls.log");
        fs::write(&log, "").unwrap_or_else(|e| panic!("creating {}: {e}", log.display()));
        let path = std::env::var_os("PATH").unwrap_or_default();
        for src in std::env::split_paths(&path) {
            let Ok(entries) = fs::read_dir(&src) else {
                continue;
            };
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let target = bin.join(&name);
                if hidden.iter().any(|h| name.starts_with(h))
                    || target.symlink_metadata().is_ok()
                    || !is_executable(&e.path())
                {
                    continue;
                }
                if traced.contains(&name.as_str()) {
                    let script = format!(
                        "#!/bin/sh\nprintf '%s %s\\n' {name} \"$*\" >> {}\nexec {} \"$@\"\n",
                        log.display(),
                        e.path().display()
                    );
                    fs::write(&target, script)
                        .unwrap_or_else(|e| panic!("writing {}: {e}", target.display()));
                    fs::set_permissions(&target, fs::Permissions::from_mode(0o755))
                        .unwrap_or_else(|e| panic!("chmod {}: {e}", target.display()));
                } else {
                    symlink(e.path(), &target)
                        .unwrap_or_else(|e| panic!("linking {}: {e}", target.display()));
                }
            }
        }
        ToolPath { dir }
    }

    /// This machine's PATH with the rule tools traced.
    pub fn traced() -> ToolPath {
        ToolPath::new(&[], RULE_TOOLS)
    }

    /// Replaces `name` by a program that logs its call (as a traced one), prints `message` on
    /// stderr and exits with `code`, as the tool fails on some host (ip6tables where the kernel
    /// has no IPv6).
    pub fn failing(&self, name: &str, message: &str, code: i32) {
        let target = self.bin().join(name);
        let _ = fs::remove_file(&target);
        let quoted = message.replace('\'', "'\\''");
        let log = self.dir.path().join("calls.log");
        fs::write(
            &target,
            format!(
                "#!/bin/sh\nprintf '%s %s\\n' {name} \"$*\" >> {}\nprintf '%s\\n' '{quoted}' >&2\nexit {code}\n",
                log.display()
            ),
        )
        .unwrap_or_else(|e| panic!("writing {}: {e}", target.display()));
        fs::set_permissions(&target, fs::Permissions::from_mode(0o755))
            .unwrap_or_else(|e| panic!("chmod {}: {e}", target.display()));
    }

    /// The value of PATH that finds only this directory's programs.
    pub fn path(&self) -> String {
        self.bin().display().to_string()
    }

    pub fn bin(&self) -> PathBuf {
        self.dir.path().join("bin")
    }

    /// Each traced call so far, `<program> <arguments>`, in order.
    pub fn calls(&self) -> Vec<String> {
        let log = self.dir.path().join("calls.log");
        fs::read_to_string(&log)
            .unwrap_or_else(|e| panic!("reading {}: {e}", log.display()))
            .lines()
            .map(str::to_string)
            .collect()
    }
}

/// Whether a traced call (`<program> <arguments>`) writes rules: a restore, an nft that is not
/// a listing, an iptables command that changes a chain.
pub fn writes_rules(call: &str) -> bool {
    let mut words = call.split_whitespace();
    let program = words.next().unwrap_or_default();
    let args: Vec<&str> = words.collect();
    if program.ends_with("-restore") {
        return !args.contains(&"--test");
    }
    if program == "nft" {
        return !args.iter().any(|a| *a == "list" || *a == "monitor");
    }
    if program.ends_with("tables") {
        const CHANGES: &[&str] = &["-A", "-I", "-D", "-R", "-N", "-X", "-F", "-P", "-Z", "-E"];
        return args.iter().any(|a| CHANGES.contains(a));
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_are_told_from_reads() {
        assert!(writes_rules("iptables-restore --noflush -w 5"));
        assert!(writes_rules("nft -f -"));
        assert!(writes_rules("iptables -t nat -A POSTROUTING -j X"));
        assert!(!writes_rules("iptables-save -t nat"));
        assert!(!writes_rules("nft -j list table ip flannel-ipv4"));
        assert!(!writes_rules("iptables -t nat -S"));
    }

    #[test]
    fn hidden_programs_are_absent_and_traced_ones_log_their_calls() {
        let p = ToolPath::new(&["iptables"], &["true"]);
        assert!(!p.bin().join("iptables-save").exists());
        assert!(p.bin().join("sh").exists());
        let st = std::process::Command::new(p.bin().join("true"))
            .args(["a", "b"])
            .status()
            .unwrap();
        assert!(st.success());
        assert_eq!(p.calls(), ["true a b"]);
    }
}
