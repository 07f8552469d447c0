//! Firewall rules, written in one batch per operation: one `iptables-restore --noflush`
//! or one `nft -f` transaction, so that an ADD or DEL pays the nf_tables commit once.

use cni_protocol::CniError;
use std::io::Write;
use std::process::{Command, Stdio};

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

fn run_with_input(program: &str, args: &[&str], input: &str) -> Result<String, CniError> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| CniError::io(format!("running {program}: {e}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(input.as_bytes())
            .map_err(|e| CniError::io(format!("writing to {program}: {e}")))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| CniError::io(format!("waiting for {program}: {e}")))?;
    if !out.status.success() {
        return Err(CniError::io(format!(
            "{program} {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
        .with_details(input.to_string()));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Applies an `iptables-restore` document without flushing what is not in it.
/// `-w` waits for the xtables lock that other writers hold.
pub fn iptables_restore(family: Family, document: &str) -> Result<(), CniError> {
    run_with_input(family.restore_cmd(), &["--noflush", "-w", "5"], document).map(|_| ())
}

/// The current rules of one table, in `iptables-save` format.
pub fn iptables_save(family: Family, table: &str) -> Result<String, CniError> {
    let out = Command::new(family.save_cmd())
        .args(["-t", table])
        .output()
        .map_err(|e| CniError::io(format!("running {}: {e}", family.save_cmd())))?;
    if !out.status.success() {
        return Err(CniError::io(format!(
            "{} -t {table} failed: {}",
            family.save_cmd(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Applies an nftables script as one transaction.
pub fn nft_apply(script: &str) -> Result<(), CniError> {
    run_with_input("nft", &["-f", "-"], script).map(|_| ())
}

/// `nft` with arguments, returning its stdout (e.g. `-j list table inet cni_plugins_masquerade`).
pub fn nft_query(args: &[&str]) -> Result<String, CniError> {
    run_with_input("nft", args, "")
}

/// `nft -j list table <family> <name>`: the table as JSON, or None when it does not exist.
pub fn nft_list_table(family: &str, name: &str) -> Result<Option<String>, CniError> {
    let out = Command::new("nft")
        .args(["-j", "list", "table", family, name])
        .output()
        .map_err(|e| CniError::io(format!("running nft: {e}")))?;
    if out.status.success() {
        return Ok(Some(String::from_utf8_lossy(&out.stdout).into_owned()));
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("No such file or directory") {
        return Ok(None);
    }
    Err(CniError::io(format!(
        "nft -j list table {family} {name} failed: {}",
        stderr.trim()
    )))
}

/// Where plugin runs that read rules and then write rules based on them take turns.
const RULES_LOCK: &str = "/run/cni-firewall.lock";

/// Runs `f` holding an exclusive lock shared by every plugin run on the host, so that a
/// read-then-write of shared chains (add a jump only when it is missing) is not interleaved
/// with another's. When the lock cannot be had, `f` runs anyway: duplicates beat a failed ADD.
pub fn with_rules_lock<T>(f: impl FnOnce() -> Result<T, CniError>) -> Result<T, CniError> {
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
