//! Rule batches of one operation (masquerade, spoof-check): each tool runs once per operation,
//! the tools side by side, and removal reads the current rules first so that it deletes
//! exactly what is there, whoever wrote it.

use crate::error::Error;
use crate::firewall::{self, Family};
use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;

/// One tool run: an `iptables-restore --noflush` document or an `nft -f` transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Batch {
    Iptables(Family, String),
    Nft(String),
}

impl Batch {
    /// Runs the tool on the batch.
    pub fn apply(&self) -> Result<(), Error> {
        match self {
            Batch::Iptables(family, doc) => firewall::iptables_restore(*family, doc),
            Batch::Nft(script) => firewall::nft_apply(script),
        }
    }

    /// Runs the batch through `primed` (the same tool, already started) when there is one.
    pub fn apply_with(&self, primed: Option<Primed>) -> Result<(), Error> {
        match (primed, self) {
            (Some(p), Batch::Iptables(_, input) | Batch::Nft(input)) => p.apply(input),
            (None, _) => self.apply(),
        }
    }
}

/// A rule tool started before its input is known, so that its start-up (loading its
/// libraries) overlaps other work.
pub struct Primed {
    program: &'static str,
    child: Option<Child>,
}

impl Primed {
    /// Starts `iptables-restore --noflush` (or ip6tables-restore) for `family`.
    pub fn iptables(family: Family) -> Result<Primed, Error> {
        let program = match family {
            Family::V4 => "iptables-restore",
            Family::V6 => "ip6tables-restore",
        };
        Self::start(program, &["--noflush", "-w", "5"])
    }

    /// Starts `nft -f -`: one transaction.
    pub fn nft() -> Result<Primed, Error> {
        Self::start("nft", &["-f", "-"])
    }

    fn start(program: &'static str, args: &[&str]) -> Result<Primed, Error> {
        // Found once here, so that the child does not try every PATH entry in turn.
        let path = firewall::find_tool(program)
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

/// Runs every batch, each in its own thread; all run even when one fails, the first error wins.
pub fn apply_all(batches: &[Batch]) -> Result<(), Error> {
    run_side_by_side(batches.iter().map(|b| move || b.apply()).collect())
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

/// Times a removal is retried when another writer changed the rules between read and write.
const ATTEMPTS: usize = 3;

/// Removes rules of `table` in each of `families`, side by side, chosen from its current
/// content: `plan` reads the `iptables-save -t <table>` text of a family and returns the
/// document that deletes them (None: nothing). A family whose rules cannot be read (its
/// iptables unusable) holds none to remove: warned on stderr, an error only when every family
/// is unreadable.
pub fn iptables_remove(
    families: &[Family],
    table: &str,
    plan: impl Fn(Family, &str) -> Option<String> + Sync,
) -> Result<(), Error> {
    let unreadable = Mutex::new(Vec::new());
    let (plan, unreadable_ref) = (&plan, &unreadable);
    let jobs = families
        .iter()
        .map(|&family| {
            move || match remove_in(family, table, |saved| plan(family, saved)) {
                Err(Removal::Unreadable(e)) => {
                    unreadable_ref
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(e);
                    Ok(())
                }
                Err(Removal::Failed(e)) => Err(e),
                Ok(()) => Ok(()),
            }
        })
        .collect();
    run_side_by_side(jobs)?;
    let mut unreadable = unreadable.into_inner().unwrap_or_else(|e| e.into_inner());
    if !unreadable.is_empty() && unreadable.len() == families.len() {
        return Err(unreadable
            .swap_remove(0)
            .context("no iptables family is usable to remove the rules"));
    }
    for e in unreadable {
        eprintln!("warning: taking no rules to remove there: {e}");
    }
    Ok(())
}

enum Removal {
    /// `iptables-save` failed before anything was written.
    Unreadable(Error),
    Failed(Error),
}

fn remove_in(
    family: Family,
    table: &str,
    plan: impl Fn(&str) -> Option<String>,
) -> Result<(), Removal> {
    let mut last = Ok(());
    for _ in 0..ATTEMPTS {
        let saved = match firewall::iptables_save(family, table) {
            Ok(saved) => saved,
            // After a failed write, that failure is the one to report.
            Err(e) => return Err(last.err().map_or(Removal::Unreadable(e), Removal::Failed)),
        };
        let Some(doc) = plan(&saved) else {
            return Ok(());
        };
        last = firewall::iptables_restore(family, &doc);
        if last.is_ok() {
            return Ok(());
        }
    }
    last.map_err(Removal::Failed)
}

/// Removes nftables rules chosen from listings: each of `lists` is the arguments of one
/// `nft -j list ...` (an absent table or chain reads as an empty string); `plan` returns the
/// transaction that deletes them (None: nothing), or why it cannot read the listings.
pub fn nft_remove<E: From<Error>>(
    lists: &[&[&str]],
    plan: impl Fn(&[String]) -> Result<Option<String>, E>,
) -> Result<(), E> {
    let mut last = Ok(());
    for _ in 0..ATTEMPTS {
        let listings = lists
            .iter()
            .map(|args| nft_list(args))
            .collect::<Result<Vec<_>, _>>()?;
        let Some(script) = plan(&listings)? else {
            return Ok(());
        };
        last = firewall::nft_apply(&script);
        if last.is_ok() {
            return Ok(());
        }
    }
    last.map_err(E::from)
}

/// `nft -j <args>`; a table or chain that does not exist lists as nothing.
fn nft_list(args: &[&str]) -> Result<String, Error> {
    let mut full = vec!["-j"];
    full.extend_from_slice(args);
    match firewall::nft_query(&full) {
        Ok(out) => Ok(out),
        Err(e) if e.cause().contains("No such file or directory") => Ok(String::new()),
        Err(e) => Err(e),
    }
}
