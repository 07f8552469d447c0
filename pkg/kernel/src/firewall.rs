//! Firewall rules, written in one batch per operation: one `iptables-restore --noflush`
//! or one `nft -f` transaction, so that an ADD or DEL pays the nf_tables commit once.

use crate::error::Error;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    fn restore_cmd(self) -> &'static str {
        match self {
            Family::V4 => "iptables-restore",
            Family::V6 => "ip6tables-restore",
        }
    }
    fn save_cmd(self) -> &'static str {
        match self {
            Family::V4 => "iptables-save",
            Family::V6 => "ip6tables-save",
        }
    }
}

/// Whether `p` is a regular file (after symlinks) with an execute bit set.
fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Where `program` is on PATH: the first executable file of that name. Each program is
/// looked up once per process.
pub fn find_tool(program: &str) -> Option<PathBuf> {
    static FOUND: Mutex<Vec<(String, Option<PathBuf>)>> = Mutex::new(Vec::new());
    let mut found = FOUND.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, path)) = found.iter().find(|(p, _)| p == program) {
        return path.clone();
    }
    let path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|p| is_executable(p))
    });
    found.push((program.to_string(), path.clone()));
    path
}

/// Whether `program` is an executable on PATH.
pub fn has_tool(program: &str) -> bool {
    find_tool(program).is_some()
}

/// Whether iptables (iptables-restore) is installed.
pub fn has_iptables() -> bool {
    has_tool("iptables-restore")
}

/// Whether nft is installed.
pub fn has_nft() -> bool {
    has_tool("nft")
}

/// The Go plugins' default backend when a config names none: iptables, unless only nftables
/// is installed. False means nftables.
pub fn iptables_is_default() -> bool {
    iptables_is_default_with(has_iptables(), has_nft)
}

fn iptables_is_default_with(has_iptables: bool, has_nft: impl FnOnce() -> bool) -> bool {
    has_iptables || !has_nft()
}

fn run_with_input(program: &str, args: &[&str], input: &str) -> Result<String, Error> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::io("running", program, &e))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(input.as_bytes())
            .map_err(|e| Error::io("writing to", program, &e))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| Error::io("waiting for", program, &e))?;
    if !out.status.success() {
        return Err(Error::failed(
            "running",
            format!("{program} {}", args.join(" ")),
            format!(
                "failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        )
        .with_input(input));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Applies an `iptables-restore` document without flushing what is not in it.
/// `-w` waits for the xtables lock that other writers hold.
pub fn iptables_restore(family: Family, document: &str) -> Result<(), Error> {
    run_with_input(family.restore_cmd(), &["--noflush", "-w", "5"], document).map(|_| ())
}

/// The current rules of one table, in `iptables-save` format.
pub fn iptables_save(family: Family, table: &str) -> Result<String, Error> {
    let out = Command::new(family.save_cmd())
        .args(["-t", table])
        .output()
        .map_err(|e| Error::io("running", family.save_cmd(), &e))?;
    if !out.status.success() {
        return Err(Error::failed(
            "running",
            format!("{} -t {table}", family.save_cmd()),
            format!("failed: {}", String::from_utf8_lossy(&out.stderr).trim()),
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Applies an nftables script as one transaction.
pub fn nft_apply(script: &str) -> Result<(), Error> {
    run_with_input("nft", &["-f", "-"], script).map(|_| ())
}

/// `nft` with arguments, returning its stdout (e.g. `-j list table inet cni_plugins_masquerade`).
pub fn nft_query(args: &[&str]) -> Result<String, Error> {
    run_with_input("nft", args, "")
}

/// `nft -j list table <family> <name>`: the table as JSON, or None when it does not exist.
pub fn nft_list_table(family: &str, name: &str) -> Result<Option<String>, Error> {
    let out = Command::new("nft")
        .args(["-j", "list", "table", family, name])
        .output()
        .map_err(|e| Error::io("running", "nft", &e))?;
    if out.status.success() {
        return Ok(Some(String::from_utf8_lossy(&out.stdout).into_owned()));
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("No such file or directory") {
        return Ok(None);
    }
    Err(Error::failed(
        "running",
        format!("nft -j list table {family} {name}"),
        format!("failed: {}", stderr.trim()),
    ))
}

/// Where plugin runs that read rules and then write rules based on them take turns.
const RULES_LOCK: &str = "/run/cni-firewall.lock";

/// Runs `f` holding an exclusive lock shared by every plugin run on the host, so that a
/// read-then-write of shared chains (add a jump only when it is missing) is not interleaved
/// with another's. When the lock cannot be had, `f` runs anyway: duplicates beat a failed ADD.
pub fn with_rules_lock<T, E>(f: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
    use nix::fcntl::{Flock, FlockArg};
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(RULES_LOCK)
        .map_err(|e| format!("opening {RULES_LOCK}: {e}"))
        .and_then(|file| {
            Flock::lock(file, FlockArg::LockExclusive)
                .map_err(|(_, e)| format!("locking {RULES_LOCK}: {e}"))
        });
    if let Err(e) = &lock {
        eprintln!("{e}; going on without it");
    }
    let out = f();
    drop(lock);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tools_are_executables_on_path() {
        assert!(has_tool("sh"));
        assert_eq!(find_tool("sh"), find_tool("sh"));
        assert!(!has_tool("no-such-program-here"));
        // A file that is there but not executable is no tool.
        let dir = std::env::temp_dir();
        let plain = dir.join(format!("cni-kernel-not-a-tool-{}", std::process::id()));
        std::fs::write(&plain, "#!/bin/sh\n").unwrap();
        assert!(!is_executable(&plain));
        std::fs::remove_file(&plain).unwrap();
    }

    #[test]
    fn iptables_is_the_default_unless_only_nft_is_installed() {
        assert!(iptables_is_default_with(true, || true));
        assert!(iptables_is_default_with(true, || false));
        assert!(!iptables_is_default_with(false, || true));
        assert!(iptables_is_default_with(false, || false));
    }
}
