//! The firewall driver: a [`Backend`], chosen once, that reads what a caller's [`Rules`] ask
//! to see, hands the listings to the caller's pure planner of that backend, and applies the
//! batch it returns as one transaction per tool (one `iptables-restore` per family, one `nft`
//! for both), the tools side by side. Callers write rule text only; which tool reads, writes,
//! waits or retries is decided here.

use super::{
    iptables_is_default, run_side_by_side, xtables, Family, Iptables, Nftables, Primed, RuleTool,
    UnusedIptables,
};
use crate::error::Error;
use std::fmt;

/// Which tools write a caller's rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `iptables-save` / `iptables-restore --noflush`, one document per family.
    Iptables,
    /// `nft -j list` / `nft -f`, one transaction for both families.
    Nftables,
}

/// One operation's rules in both backends' terms, pure: what each tool reads first and the
/// batch it writes given what it read. The driver runs the half of its backend only.
pub trait Rules: Sync {
    type Error: From<Error> + Send;

    /// The families the iptables half touches: one document each, by that family's tool.
    fn families(&self) -> Vec<Family>;

    /// The tables whose `iptables-save -t <table>` text [`Rules::iptables`] is given, in order.
    fn iptables_reads(&self) -> &[&'static str] {
        &[]
    }

    /// How a family's document begins, whatever is read: fed to a tool started early
    /// ([`Writers::start`]) so that it parses that much before the rest is known.
    fn iptables_head(&self, _family: Family) -> String {
        String::new()
    }

    /// One family's `iptables-restore --noflush` document (None: nothing to write).
    fn iptables(&self, family: Family, saved: &[String]) -> Result<Option<String>, Self::Error>;

    /// The `nft -j list` arguments whose output [`Rules::nft`] is given, in order.
    fn nft_reads(&self) -> Vec<&'static [&'static str]> {
        Vec::new()
    }

    /// The one `nft -f` transaction, given those listings (None where the table or chain is
    /// absent); None: nothing to write.
    fn nft(&self, listed: &[Option<String>]) -> Result<Option<String>, Self::Error>;
}

/// Times a removal is tried again when another writer changed the rules between its read and
/// its write.
const ATTEMPTS: usize = 3;

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Iptables => "iptables",
            Backend::Nftables => "nftables",
        }
    }

    pub fn other(self) -> Backend {
        match self {
            Backend::Iptables => Backend::Nftables,
            Backend::Nftables => Backend::Iptables,
        }
    }

    /// The configured backend, else the node's default as the Go plugins decide it: iptables,
    /// unless only nft is installed.
    pub fn choose(configured: Option<Backend>) -> Backend {
        Backend::choose_with(configured, iptables_is_default)
    }

    /// [`Backend::choose`] with the default's answer given (asked only when needed).
    pub fn choose_with(
        configured: Option<Backend>,
        iptables_is_default: impl FnOnce() -> bool,
    ) -> Backend {
        match configured {
            Some(b) => b,
            None if iptables_is_default() => Backend::Iptables,
            None => Backend::Nftables,
        }
    }

    /// Whether its writing tool is on PATH.
    pub fn installed(self) -> bool {
        match self {
            Backend::Iptables => super::has_iptables(),
            Backend::Nftables => super::has_nft(),
        }
    }

    /// The tools an operation in `families` writes through, one batch each.
    pub fn tools(self, families: &[Family]) -> Vec<&'static dyn RuleTool> {
        self.slots(families).into_iter().map(Slot::tool).collect()
    }

    fn slots(self, families: &[Family]) -> Vec<Slot> {
        match self {
            Backend::Iptables => {
                let mut fs = families.to_vec();
                fs.dedup();
                fs.into_iter().map(Slot::Iptables).collect()
            }
            Backend::Nftables => vec![Slot::Nftables],
        }
    }

    /// Reads and plans, writing nothing: the batches [`Backend::write`] would apply (a dry run,
    /// or text to merge with another's before [`Writers::write`]). A planner that fails on
    /// what it reads (a CHECK) fails this.
    pub fn plan<R: Rules>(self, rules: &R) -> Result<Batches, R::Error> {
        let mut batches = Batches::default();
        for slot in self.slots(&rules.families()) {
            if let Some(batch) = slot.plan(rules).map_err(Failure::into_error)? {
                batches.push(slot.tool(), &batch);
            }
        }
        Ok(batches)
    }

    /// Reads, plans and applies each tool's batch, the tools side by side. Whether anything
    /// was written.
    pub fn write<R: Rules>(self, rules: &R) -> Result<bool, R::Error> {
        let done = self.each_tool(rules, |slot, outcome| {
            if let Some(batch) = slot.plan(rules).map_err(Failure::into_error)? {
                slot.tool().apply(&batch)?;
                outcome.wrote();
            }
            Ok(())
        })?;
        Ok(done.changed)
    }

    /// Removes what `rules` plan from what is there, each tool reading again and retrying when
    /// another writer changed the rules under it. An iptables family whose rules cannot be read
    /// (its iptables unusable) holds none to remove: reported in [`Removed::unreadable`] (see
    /// [`Removed::readable`]).
    pub fn remove<R: Rules>(self, rules: &R) -> Result<Removed, R::Error> {
        self.each_tool(rules, |slot, outcome| slot.remove(rules, outcome))
    }

    /// Runs `job` for each tool of `rules`, side by side; what they did.
    fn each_tool<R: Rules>(
        self,
        rules: &R,
        job: impl Fn(Slot, &Outcome) -> Result<(), R::Error> + Sync,
    ) -> Result<Removed, R::Error> {
        each_slot(self.slots(&rules.families()), job)
    }
}

/// Runs `job` for each of `slots`, side by side; what they did.
fn each_slot<E: From<Error> + Send>(
    slots: Vec<Slot>,
    job: impl Fn(Slot, &Outcome) -> Result<(), E> + Sync,
) -> Result<Removed, E> {
    let outcome = Outcome::default();
    let (job, outcome_ref) = (&job, &outcome);
    let jobs = slots
        .iter()
        .map(|&slot| move || job(slot, outcome_ref))
        .collect();
    run_side_by_side(jobs)?;
    let mut done = outcome.into_removed();
    done.families = slots
        .iter()
        .filter(|s| matches!(s, Slot::Iptables(_) | Slot::UnusedIptables(_)))
        .count();
    Ok(done)
}

/// Removes what `rules` plan from the iptables mode this process did not choose, where an
/// earlier run wrote them before the host's rules moved or another mode was asked for. Nothing
/// when no mode was chosen or that mode's programs are not installed.
pub fn remove_in_unused_iptables<R: Rules>(rules: &R) -> Result<Removed, R::Error> {
    each_slot(unused_slots(rules), |slot, outcome| {
        slot.remove(rules, outcome)
    })
}

/// Reads and plans, writing nothing, what [`remove_in_unused_iptables`] would remove: the
/// batches to apply later ([`Batches::apply`]). A family whose rules cannot be read fails it.
pub fn plan_in_unused_iptables<R: Rules>(rules: &R) -> Result<Batches, R::Error> {
    let mut batches = Batches::default();
    for slot in unused_slots(rules) {
        if let Some(batch) = slot.plan(rules).map_err(Failure::into_error)? {
            batches.push(slot.tool(), &batch);
        }
    }
    Ok(batches)
}

/// The families of `rules` whose iptables mode not chosen is installed.
fn unused_slots<R: Rules>(rules: &R) -> Vec<Slot> {
    let mut families = rules.families();
    families.dedup();
    families
        .into_iter()
        .filter(|&f| xtables::unused_program(f, true).is_some_and(super::has_tool))
        .map(Slot::UnusedIptables)
        .collect()
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Removes what `rules` plan from every backend whose tool is installed, side by side: for a
/// DEL or GC that cannot know which backend wrote the rules. Fails when no iptables family
/// could be read ([`Removed::readable`]).
pub fn remove_everywhere<R: Rules>(rules: &R) -> Result<Removed, R::Error> {
    let backends: Vec<Backend> = [Backend::Iptables, Backend::Nftables]
        .into_iter()
        .filter(|b| b.installed())
        .collect();
    let results = std::sync::Mutex::new(Vec::new());
    let jobs = backends
        .iter()
        .map(|&b| {
            let results = &results;
            move || {
                let r = b.remove(rules)?.readable()?;
                results.lock().unwrap_or_else(|e| e.into_inner()).push(r);
                Ok::<(), R::Error>(())
            }
        })
        .collect();
    run_side_by_side(jobs)?;
    let mut all = Removed::default();
    for r in results.into_inner().unwrap_or_else(|e| e.into_inner()) {
        all.changed |= r.changed;
        all.families += r.families;
        all.unreadable.extend(r.unreadable);
    }
    Ok(all)
}

/// What a removal did.
#[derive(Debug, Default)]
pub struct Removed {
    /// Whether anything was written.
    pub changed: bool,
    /// The iptables families tried.
    pub families: usize,
    /// Those whose rules could not be read, taken to hold none: why.
    pub unreadable: Vec<Error>,
}

impl Removed {
    /// Fails when no iptables family tried could be read: nothing says the rules are gone.
    pub fn readable(mut self) -> Result<Removed, Error> {
        if self.families > 0 && self.unreadable.len() == self.families {
            return Err(self
                .unreadable
                .swap_remove(0)
                .context("no iptables family is usable to remove the rules"));
        }
        Ok(self)
    }

    /// Says on stderr, a plugin's log, which families were taken to hold nothing.
    pub fn warn_on_stderr(self) {
        for e in self.unreadable {
            eprintln!("warning: taking no rules to remove there: {e}");
        }
    }
}

/// A daemon's backend, chosen from its config and the tools this host has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detected {
    pub backend: Backend,
    /// Why it is not the one the config implies, for one log line; None when it is.
    pub note: Option<String>,
}

/// Which writing tools are on PATH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Installed {
    /// `iptables-save` and `iptables-restore`.
    pub iptables: bool,
    pub nft: bool,
}

impl Installed {
    pub fn here() -> Installed {
        Installed {
            iptables: super::has_tool("iptables-save") && super::has_tool("iptables-restore"),
            nft: super::has_nft(),
        }
    }
}

impl Backend {
    /// A daemon's backend: nftables when its config asks for it (`nftables`), else iptables,
    /// or nftables when only nft is installed (said in the note). Fails saying what is missing
    /// when the tool the rules need is not there.
    pub fn detect(nftables: bool) -> Result<Detected, Error> {
        Backend::detect_with(nftables, Installed::here())
    }

    /// [`Backend::detect`] with the tools given.
    pub fn detect_with(nftables: bool, have: Installed) -> Result<Detected, Error> {
        let path = std::env::var("PATH").unwrap_or_default();
        let missing = |what: &str, why: &str| {
            Error::failed(
                "choosing the firewall backend",
                "",
                format!("{what} (PATH={path}); {why}"),
            )
            .with_kind(crate::Kind::Invalid)
        };
        match (nftables, have.iptables, have.nft) {
            (true, _, true) => Ok(Detected {
                backend: Backend::Nftables,
                note: None,
            }),
            (true, _, false) => Err(missing(
                "EnableNFTables is set in the network config but nft is not installed",
                "install nftables, or unset EnableNFTables to use iptables",
            )),
            (false, true, _) => Ok(Detected {
                backend: Backend::Iptables,
                note: None,
            }),
            (false, false, true) => Ok(Detected {
                backend: Backend::Nftables,
                note: Some(format!(
                    "iptables-save and iptables-restore are not installed (PATH={path}): using nftables, as EnableNFTables would"
                )),
            }),
            (false, false, false) => Err(missing(
                "neither iptables (iptables-save, iptables-restore) nor nft is installed",
                "install iptables or nftables",
            )),
        }
    }
}

/// Collected from the tools' threads.
#[derive(Default)]
struct Outcome(std::sync::Mutex<Removed>);

impl Outcome {
    fn wrote(&self) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).changed = true;
    }

    fn unreadable(&self, e: Error) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .unreadable
            .push(e);
    }

    fn into_removed(self) -> Removed {
        self.0.into_inner().unwrap_or_else(|e| e.into_inner())
    }
}

/// One tool of an operation, and which half of the caller's rules it plans with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Iptables(Family),
    /// The iptables mode this process did not choose: only removed from.
    UnusedIptables(Family),
    Nftables,
}

/// Why a tool's plan failed: its rules could not be read, or the planner said no.
enum Failure<E> {
    Unreadable(Error),
    Planner(E),
}

impl<E: From<Error>> Failure<E> {
    fn into_error(self) -> E {
        match self {
            Failure::Unreadable(e) => e.into(),
            Failure::Planner(e) => e,
        }
    }
}

impl Slot {
    fn tool(self) -> &'static dyn RuleTool {
        match self {
            Slot::Iptables(Family::V4) => &Iptables(Family::V4),
            Slot::Iptables(Family::V6) => &Iptables(Family::V6),
            Slot::UnusedIptables(Family::V4) => &UnusedIptables(Family::V4),
            Slot::UnusedIptables(Family::V6) => &UnusedIptables(Family::V6),
            Slot::Nftables => &Nftables,
        }
    }

    /// Reads what the rules ask for and plans this tool's batch.
    fn plan<R: Rules>(self, rules: &R) -> Result<Option<String>, Failure<R::Error>> {
        match self {
            Slot::Iptables(family) | Slot::UnusedIptables(family) => {
                let saved = rules
                    .iptables_reads()
                    .iter()
                    .map(|t| Ok(self.tool().list(&[t])?.unwrap_or_default()))
                    .collect::<Result<Vec<_>, Error>>()
                    .map_err(Failure::Unreadable)?;
                rules.iptables(family, &saved).map_err(Failure::Planner)
            }
            Slot::Nftables => {
                let listed = rules
                    .nft_reads()
                    .iter()
                    .map(|args| Nftables.list(args))
                    .collect::<Result<Vec<_>, Error>>()
                    .map_err(Failure::Unreadable)?;
                rules.nft(&listed).map_err(Failure::Planner)
            }
        }
    }

    fn remove<R: Rules>(self, rules: &R, outcome: &Outcome) -> Result<(), R::Error> {
        let mut last: Result<(), Error> = Ok(());
        for _ in 0..ATTEMPTS {
            let batch = match self.plan(rules) {
                Ok(batch) => batch,
                // A family never read holds nothing we wrote; after a failed write, that failure
                // is the one to report.
                Err(Failure::Unreadable(e)) => {
                    return match (last, self) {
                        (Err(write), _) => Err(write.into()),
                        (Ok(()), Slot::Iptables(_) | Slot::UnusedIptables(_)) => {
                            outcome.unreadable(e);
                            Ok(())
                        }
                        (Ok(()), Slot::Nftables) => Err(e.into()),
                    };
                }
                Err(Failure::Planner(e)) => return Err(e),
            };
            let Some(batch) = batch else {
                return Ok(());
            };
            last = self.tool().apply(&batch);
            if last.is_ok() {
                outcome.wrote();
                return Ok(());
            }
        }
        last.map_err(R::Error::from)
    }
}

/// What an operation writes: at most one batch per tool, in the order first given.
#[derive(Default)]
pub struct Batches(Vec<(&'static dyn RuleTool, String)>);

impl Batches {
    /// Adds `text` to `tool`'s batch.
    pub fn push(&mut self, tool: &'static dyn RuleTool, text: &str) {
        if text.is_empty() {
            return;
        }
        match self
            .0
            .iter_mut()
            .find(|(t, _)| t.program() == tool.program())
        {
            Some((_, batch)) => batch.push_str(text),
            None => self.0.push((tool, text.to_string())),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Each tool's program and its batch.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &str)> {
        self.0.iter().map(|(t, b)| (t.program(), b.as_str()))
    }

    /// Applies each batch as one transaction, the tools side by side.
    pub fn apply(self) -> Result<(), Error> {
        Writers::default().write(self)
    }
}

impl fmt::Debug for Batches {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// Tools started before their batches are known, so that their start-up overlaps the work
/// that decides the text (bridge ADD's IPAM); each may have been fed how its batch begins.
/// Unused, they exit having committed nothing.
#[derive(Default)]
pub struct Writers(Vec<(&'static str, String, Primed)>);

impl Writers {
    /// Starts the tools `backend` writes `families` through, each fed the head `rules` give.
    pub fn start<R: Rules>(backend: Backend, families: &[Family], rules: &R) -> Writers {
        let mut w = Writers::default();
        for slot in backend.slots(families) {
            let head = match slot {
                Slot::Iptables(f) => rules.iptables_head(f),
                Slot::UnusedIptables(_) | Slot::Nftables => String::new(),
            };
            w.prime(slot.tool(), &head);
        }
        w
    }

    /// Starts `tool` (unless started already) and feeds it `head`. A tool that cannot be
    /// started is run the ordinary way when its batch comes.
    pub fn prime(&mut self, tool: &'static dyn RuleTool, head: &str) {
        if self.0.iter().any(|(p, _, _)| *p == tool.program()) {
            return;
        }
        let Ok(mut primed) = tool.prime() else {
            return;
        };
        if !head.is_empty() && primed.feed(head).is_err() {
            return;
        }
        self.0.push((tool.program(), head.to_string(), primed));
    }

    /// Applies each batch as one transaction, the tools side by side, through the tool started
    /// for it when the batch begins with what that tool was fed.
    pub fn write(mut self, batches: Batches) -> Result<(), Error> {
        let mut jobs: Vec<Box<dyn FnOnce() -> Result<(), Error> + Send>> = Vec::new();
        for (tool, batch) in batches.0 {
            let started = self
                .0
                .iter()
                .position(|(p, head, _)| *p == tool.program() && batch.starts_with(head.as_str()));
            match started.map(|i| self.0.swap_remove(i)) {
                Some((_, head, primed)) => {
                    jobs.push(Box::new(move || primed.apply(&batch[head.len()..])))
                }
                None => jobs.push(Box::new(move || tool.apply(&batch))),
            }
        }
        // What was started and is not needed ends here, having committed nothing.
        drop(self);
        run_side_by_side(jobs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Text;

    impl Rules for Text {
        type Error = Error;
        fn families(&self) -> Vec<Family> {
            vec![Family::V4, Family::V6]
        }
        fn iptables(&self, family: Family, _: &[String]) -> Result<Option<String>, Error> {
            Ok((family == Family::V4).then(|| "*nat\nCOMMIT\n".to_string()))
        }
        fn nft(&self, _: &[Option<String>]) -> Result<Option<String>, Error> {
            Ok(Some("add table inet t\n".to_string()))
        }
    }

    #[test]
    fn the_default_is_iptables_unless_only_nft_is_installed() {
        use Backend::*;
        assert_eq!(Backend::choose_with(None, || true), Iptables);
        assert_eq!(Backend::choose_with(None, || false), Nftables);
        let asked = || panic!("not asked when configured");
        assert_eq!(Backend::choose_with(Some(Nftables), asked), Nftables);
        assert_eq!(Backend::choose_with(Some(Iptables), asked), Iptables);
        assert_eq!(Iptables.other(), Nftables);
    }

    #[test]
    fn a_daemon_uses_nftables_when_asked_or_when_iptables_is_missing() {
        let have = |iptables, nft| Installed { iptables, nft };
        let d = Backend::detect_with(false, have(true, true)).unwrap();
        assert_eq!((d.backend, d.note), (Backend::Iptables, None));
        let d = Backend::detect_with(true, have(true, true)).unwrap();
        assert_eq!((d.backend, d.note), (Backend::Nftables, None));
        let d = Backend::detect_with(false, have(false, true)).unwrap();
        assert_eq!(d.backend, Backend::Nftables);
        assert!(d.note.unwrap().contains("using nftables"));
        let e = Backend::detect_with(true, have(true, false)).unwrap_err();
        assert!(e.to_string().contains("EnableNFTables is set"), "{e}");
        assert!(e.to_string().contains("nft is not installed"), "{e}");
        let e = Backend::detect_with(false, have(false, false)).unwrap_err();
        assert!(e.to_string().contains("neither iptables"), "{e}");
    }

    #[test]
    fn iptables_writes_one_batch_per_family_nftables_one_for_all() {
        let names = |b: Backend, fs: &[Family]| -> Vec<&str> {
            b.tools(fs).iter().map(|t| t.program()).collect()
        };
        assert_eq!(
            names(Backend::Iptables, &[Family::V4, Family::V6]),
            ["iptables-restore", "ip6tables-restore"]
        );
        assert_eq!(names(Backend::Iptables, &[]), Vec::<&str>::new());
        assert_eq!(names(Backend::Nftables, &[Family::V4, Family::V6]), ["nft"]);
    }

    #[test]
    fn a_plan_without_reads_is_the_planners_text_per_tool() {
        let plan = Backend::Iptables.plan(&Text).unwrap();
        assert_eq!(
            plan.iter().collect::<Vec<_>>(),
            [("iptables-restore", "*nat\nCOMMIT\n")]
        );
        let plan = Backend::Nftables.plan(&Text).unwrap();
        assert_eq!(
            plan.iter().collect::<Vec<_>>(),
            [("nft", "add table inet t\n")]
        );
    }

    #[test]
    fn batches_of_one_tool_join_in_order() {
        let mut b = Batches::default();
        b.push(&Nftables, "a\n");
        b.push(&Iptables(Family::V4), "x\n");
        b.push(&Nftables, "b\n");
        b.push(&Nftables, "");
        assert_eq!(
            b.iter().collect::<Vec<_>>(),
            [("nft", "a\nb\n"), ("iptables-restore", "x\n")]
        );
    }
}
