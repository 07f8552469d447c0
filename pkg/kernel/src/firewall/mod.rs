//! Firewall rules: the tools behind one trait, [`RuleTool`] (`iptables-restore` of a family,
//! `nft`), and the driver over them ([`Backend`], [`Rules`]) through which every caller
//! writes. Each operation writes one batch per tool (one `iptables-restore --noflush` document
//! or one `nft -f` transaction), so that an ADD or DEL pays the nf_tables commit once; removal
//! reads the current rules first so that it deletes exactly what is there, whoever wrote it.

mod driver;
pub mod xtables;

pub use driver::{
    plan_in_unused_iptables, remove_everywhere, remove_in_unused_iptables, Backend, Batches,
    Detected, Installed, Removed, Rules, Writers,
};
pub use xtables::IptablesMode;

use crate::error::Error;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn of(net: &ipnetwork::IpNetwork) -> Family {
        if net.is_ipv4() {
            Family::V4
        } else {
            Family::V6
        }
    }

    /// The restore program of this process's iptables mode ([`xtables::choose`]).
    fn restore_cmd(self) -> &'static str {
        xtables::chosen_program(self, true)
    }
    fn save_cmd(self) -> &'static str {
        xtables::chosen_program(self, false)
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

/// Whether iptables (iptables-restore, of the mode chosen) is installed.
pub fn has_iptables() -> bool {
    has_tool(Family::V4.restore_cmd())
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

/// A rule tool, the one way the suite writes firewall rules: read what is there, decide the
/// text (pure code elsewhere), write it as one batch, so that an operation pays the tool's
/// start and the kernel's commit once.
pub trait RuleTool: Sync {
    /// The tool's program, for messages.
    fn program(&self) -> &'static str;
    /// The current rules of `scope` (iptables: `[table]`; nftables: the arguments of
    /// `nft -j list`), or None when that table or chain does not exist.
    fn list(&self, scope: &[&str]) -> Result<Option<String>, Error>;
    /// Applies one batch as one transaction.
    fn apply(&self, batch: &str) -> Result<(), Error>;
    /// The tool started before its batch is known, so that its start-up overlaps other work.
    fn prime(&self) -> Result<Primed, Error>;

    /// Applies the batch through `primed` (this tool, already started) when there is one.
    fn apply_with(&self, primed: Option<Primed>, batch: &str) -> Result<(), Error> {
        match primed {
            Some(p) => p.apply(batch),
            None => self.apply(batch),
        }
    }
}

/// `iptables-restore --noflush` (or ip6tables-) of one family, of this process's iptables mode
/// ([`xtables::choose`]; PATH's plain programs until one is chosen); `-w` waits for the
/// xtables lock that other writers hold.
pub struct Iptables(pub Family);

/// `nft -f`: both families in one transaction.
pub struct Nftables;

const RESTORE_ARGS: &[&str] = &["--noflush", "-w", "5"];

/// iptables of one family in the mode this process did not choose
/// ([`xtables::chosen_mode`]): where rules an earlier choice wrote are removed from.
pub struct UnusedIptables(pub Family);

/// A table's rules as `save -t <table>` prints them.
fn save_list(save: &str, scope: &[&str]) -> Result<Option<String>, Error> {
    let table = scope.first().copied().unwrap_or("filter");
    let out = Command::new(save)
        .args(["-t", table])
        .output()
        .map_err(|e| Error::io("running", save, &e))?;
    if !out.status.success() {
        return Err(Error::failed(
            "running",
            format!("{save} -t {table}"),
            format!("failed: {}", String::from_utf8_lossy(&out.stderr).trim()),
        ));
    }
    Ok(Some(String::from_utf8_lossy(&out.stdout).into_owned()))
}

impl RuleTool for Iptables {
    fn program(&self) -> &'static str {
        self.0.restore_cmd()
    }

    fn list(&self, scope: &[&str]) -> Result<Option<String>, Error> {
        save_list(self.0.save_cmd(), scope)
    }

    fn apply(&self, batch: &str) -> Result<(), Error> {
        run_with_input(self.0.restore_cmd(), RESTORE_ARGS, batch).map(|_| ())
    }

    fn prime(&self) -> Result<Primed, Error> {
        Primed::start(self.0.restore_cmd(), RESTORE_ARGS)
    }
}

impl UnusedIptables {
    fn programs(&self) -> Result<(&'static str, &'static str), Error> {
        match (
            xtables::unused_program(self.0, false),
            xtables::unused_program(self.0, true),
        ) {
            (Some(save), Some(restore)) => Ok((save, restore)),
            _ => Err(Error::failed(
                "finding",
                "the unused iptables mode",
                "no mode was chosen",
            )),
        }
    }
}

impl RuleTool for UnusedIptables {
    fn program(&self) -> &'static str {
        self.programs()
            .map(|(_, r)| r)
            .unwrap_or("iptables-restore")
    }

    fn list(&self, scope: &[&str]) -> Result<Option<String>, Error> {
        save_list(self.programs()?.0, scope)
    }

    fn apply(&self, batch: &str) -> Result<(), Error> {
        run_with_input(self.programs()?.1, RESTORE_ARGS, batch).map(|_| ())
    }

    fn prime(&self) -> Result<Primed, Error> {
        Primed::start(self.programs()?.1, RESTORE_ARGS)
    }
}

impl RuleTool for Nftables {
    fn program(&self) -> &'static str {
        "nft"
    }

    fn list(&self, scope: &[&str]) -> Result<Option<String>, Error> {
        let mut args = vec!["-j", "list"];
        args.extend_from_slice(scope);
        let out = Command::new("nft")
            .args(&args)
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
            format!("nft {}", args.join(" ")),
            format!("failed: {}", stderr.trim()),
        ))
    }

    fn apply(&self, batch: &str) -> Result<(), Error> {
        run_with_input("nft", &["-f", "-"], batch).map(|_| ())
    }

    fn prime(&self) -> Result<Primed, Error> {
        Primed::start("nft", &["-f", "-"])
    }
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

/// A rule tool started before its input is known, so that its start-up (loading its
/// libraries) overlaps other work.
pub struct Primed {
    program: &'static str,
    child: Option<Child>,
}

impl Primed {
    fn start(program: &'static str, args: &[&str]) -> Result<Primed, Error> {
        // Found once here, so that the child does not try every PATH entry in turn.
        let path = find_tool(program)
            .ok_or_else(|| Error::failed("finding", program, "it is not on PATH"))?;
        let child = Command::new(path)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| Error::io("running", program, &e))?;
        Ok(Primed {
            program,
            child: Some(child),
        })
    }

    /// The tool's process id, while it runs: the committer the kernel names in its
    /// announcements of the commit ([`crate::nft_commits`]).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Gives the tool the start of its input, which it reads (loading what that needs) while
    /// the rest is not known yet.
    pub fn feed(&mut self, part: &str) -> Result<(), Error> {
        let program = self.program;
        match self.child.as_mut().and_then(|c| c.stdin.as_mut()) {
            Some(stdin) => stdin
                .write_all(part.as_bytes())
                .map_err(|e| Error::io("writing to", program, &e)),
            None => Err(Error::failed("writing to", program, "it is not running")),
        }
    }

    /// Hands the tool the rest of its input and waits for it to apply the whole.
    pub fn apply(mut self, input: &str) -> Result<(), Error> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let program = self.program;
        // A tool that failed on the start of its input has gone: its own message says why.
        let written = child
            .stdin
            .take()
            .map(|mut stdin| stdin.write_all(input.as_bytes()))
            .unwrap_or(Ok(()));
        let out = child
            .wait_with_output()
            .map_err(|e| Error::io("waiting for", program, &e))?;
        if !out.status.success() {
            return Err(Error::failed(
                "running",
                program,
                format!(
                    "failed ({}): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            )
            .with_input(input));
        }
        written.map_err(|e| Error::io("writing to", program, &e))
    }
}

/// Dropped unused, the tool reads the end of its input: with nothing fed it exits idle; with a
/// fed start but no COMMIT, iptables-restore exits without committing anything.
impl Drop for Primed {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            drop(child.stdin.take());
            let _ = child.wait();
        }
    }
}

/// Runs the jobs side by side and returns the first error.
pub fn run_side_by_side<F, E>(jobs: Vec<F>) -> Result<(), E>
where
    F: FnOnce() -> Result<(), E> + Send,
    E: From<Error> + Send,
{
    if jobs.len() <= 1 {
        return jobs.into_iter().try_for_each(|j| j());
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = jobs.into_iter().map(|j| s.spawn(j)).collect();
        let mut first = Ok(());
        for h in handles {
            let r = h.join().unwrap_or_else(|_| {
                Err(Error::failed("running", "a rule batch", "its thread panicked").into())
            });
            if first.is_ok() {
                first = r;
            }
        }
        first
    })
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
