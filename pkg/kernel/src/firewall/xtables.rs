//! Which of the kernel's two iptables interfaces the iptables rules go through: legacy
//! (x_tables) or nft (nf_tables, `iptables-nft`). Both read the same text, but a packet is
//! judged by each in turn, so an ACCEPT written into the one the host does not use is no help
//! against a DROP in the other (Docker's legacy FORWARD policy). The mode is chosen as
//! kubernetes-sigs/iptables-wrappers chooses it (kubelet's chains, then which holds more rules,
//! else nft), once per process ([`choose`]); every iptables tool of the process then runs the
//! programs of that mode ([`super::Iptables`]).

use super::{find_tool, Family};
use crate::error::{Error, Kind};
use std::fmt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

/// One of the kernel's two iptables interfaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IptablesMode {
    Legacy,
    Nft,
}

impl IptablesMode {
    pub fn as_str(self) -> &'static str {
        match self {
            IptablesMode::Legacy => "legacy",
            IptablesMode::Nft => "nft",
        }
    }

    pub fn other(self) -> IptablesMode {
        match self {
            IptablesMode::Legacy => IptablesMode::Nft,
            IptablesMode::Nft => IptablesMode::Legacy,
        }
    }

    /// `legacy` or `nft`, as iptables' own program names say them.
    pub fn parse(s: &str) -> Option<IptablesMode> {
        match s {
            "legacy" => Some(IptablesMode::Legacy),
            "nft" => Some(IptablesMode::Nft),
            _ => None,
        }
    }

    /// What `iptables-restore --version` prints after the version for this mode.
    fn version_tag(self) -> &'static str {
        match self {
            IptablesMode::Legacy => "(legacy)",
            IptablesMode::Nft => "(nf_tables)",
        }
    }
}

impl fmt::Display for IptablesMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What each mode's `save` printed, both families' texts joined; None where that mode's
/// programs are not installed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Saves {
    /// `iptables-nft-save -t mangle` (kubelet's chains are in mangle).
    pub nft_mangle: Option<String>,
    /// `iptables-nft-save`, every table.
    pub nft: Option<String>,
    /// `iptables-legacy-save`, every table: never `-t`, which would create the table.
    pub legacy: Option<String>,
}

/// The mode and what decided it, for one log line and `doctor`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModeChoice {
    pub mode: IptablesMode,
    pub reason: String,
}

/// The chains kubelet (1.17 on) keeps in the mangle table of the mode it uses.
const KUBELET_CHAINS: &[&str] = &["KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY"];

/// The kubelet chain a save's text declares, if any.
fn kubelet_chain(saved: &str) -> Option<&'static str> {
    saved.lines().find_map(|l| {
        let name = l.strip_prefix(':')?.split_whitespace().next()?;
        KUBELET_CHAINS.iter().copied().find(|c| *c == name)
    })
}

/// Whether a rule (`-A CHAIN ... -j TARGET`) is in or jumps to a chain starting with one of
/// `ours`.
fn is_ours(rule: &str, ours: &[&str]) -> bool {
    let chain = rule.split_whitespace().nth(1).unwrap_or_default();
    let target = rule
        .split_whitespace()
        .skip_while(|w| *w != "-j")
        .nth(1)
        .unwrap_or_default();
    [chain, target]
        .iter()
        .any(|name| ours.iter().any(|o| name.starts_with(o)))
}

/// How much of the host's a save's text holds: its rules but those naming a chain that starts
/// with one of `ours` (the caller's own, which follow the choice rather than make it), and each
/// built-in chain whose policy is not ACCEPT (Docker's FORWARD DROP is a rule set in use even
/// with no rule in it).
fn weight(saved: &str, ours: &[&str]) -> usize {
    saved
        .lines()
        .filter(|l| {
            (l.starts_with('-') && !is_ours(l, ours))
                || l.strip_prefix(':')
                    .and_then(|l| l.split_whitespace().nth(1))
                    .is_some_and(|policy| policy != "ACCEPT" && policy != "-")
        })
        .count()
}

/// The mode the host's rules are in, as iptables-wrappers decides it: kubelet's chains in
/// nft's mangle table, then in legacy; else the mode holding more rules (a policy other than
/// ACCEPT counting as one, rules in the caller's own chains, named by their prefixes `ours`,
/// not counting); else nft. With one mode installed, that one. None: neither mode's programs
/// are installed by name.
pub fn decide(s: &Saves, ours: &[&str]) -> Option<ModeChoice> {
    let choice = |mode, reason: String| Some(ModeChoice { mode, reason });
    let (nft, legacy) = match (&s.nft, &s.legacy) {
        (None, None) => return None,
        (Some(_), None) => {
            return choice(IptablesMode::Nft, "only iptables-nft is installed".into())
        }
        (None, Some(_)) => {
            return choice(
                IptablesMode::Legacy,
                "only iptables-legacy is installed".into(),
            )
        }
        (Some(nft), Some(legacy)) => (nft, legacy),
    };
    if let Some(c) = s.nft_mangle.as_deref().and_then(kubelet_chain) {
        return choice(
            IptablesMode::Nft,
            format!("kubelet's {c} chain is in iptables-nft's mangle table"),
        );
    }
    if let Some(c) = kubelet_chain(legacy) {
        return choice(
            IptablesMode::Legacy,
            format!("kubelet's {c} chain is in iptables-legacy's mangle table"),
        );
    }
    let (in_legacy, in_nft) = (weight(legacy, ours), weight(nft, ours));
    if in_legacy > in_nft {
        return choice(
            IptablesMode::Legacy,
            format!(
                "iptables-legacy holds more of the host's rules ({in_legacy} rules and policies other than ACCEPT, against {in_nft} in iptables-nft)"
            ),
        );
    }
    let reason = match in_nft {
        0 => "neither iptables-legacy nor iptables-nft holds rules: nft, iptables-wrappers' default".to_string(),
        n => format!(
            "iptables-nft holds as many of the host's rules or more ({n} rules and policies other than ACCEPT, against {in_legacy} in iptables-legacy)"
        ),
    };
    choice(IptablesMode::Nft, reason)
}

/// A tool of one kind (save or restore) of one family in one mode, by its name.
fn program(mode: Option<IptablesMode>, family: Family, restore: bool) -> &'static str {
    use IptablesMode::*;
    match (mode, family, restore) {
        (None, Family::V4, false) => "iptables-save",
        (None, Family::V4, true) => "iptables-restore",
        (None, Family::V6, false) => "ip6tables-save",
        (None, Family::V6, true) => "ip6tables-restore",
        (Some(Legacy), Family::V4, false) => "iptables-legacy-save",
        (Some(Legacy), Family::V4, true) => "iptables-legacy-restore",
        (Some(Legacy), Family::V6, false) => "ip6tables-legacy-save",
        (Some(Legacy), Family::V6, true) => "ip6tables-legacy-restore",
        (Some(Nft), Family::V4, false) => "iptables-nft-save",
        (Some(Nft), Family::V4, true) => "iptables-nft-restore",
        (Some(Nft), Family::V6, false) => "ip6tables-nft-save",
        (Some(Nft), Family::V6, true) => "ip6tables-nft-restore",
    }
}

/// The programs this process's iptables tools run: 0 those named plain on PATH, else those of
/// a mode (1 legacy, 2 nft) where PATH's plain ones are of the other mode.
static PROGRAMS: AtomicU8 = AtomicU8::new(0);

fn programs_mode() -> Option<IptablesMode> {
    match PROGRAMS.load(Relaxed) {
        1 => Some(IptablesMode::Legacy),
        2 => Some(IptablesMode::Nft),
        _ => None,
    }
}

/// The save (`restore` false) or restore program this process's iptables tools run.
pub(super) fn chosen_program(family: Family, restore: bool) -> &'static str {
    program(programs_mode(), family, restore)
}

/// The save or restore program of the mode this process did not choose, when it chose one.
pub(super) fn unused_program(family: Family, restore: bool) -> Option<&'static str> {
    let chosen = chosen_mode()?;
    Some(program(Some(chosen.other()), family, restore))
}

/// The mode this process chose, if it chose one.
static CHOSEN: AtomicU8 = AtomicU8::new(0);

pub fn chosen_mode() -> Option<IptablesMode> {
    match CHOSEN.load(Relaxed) {
        1 => Some(IptablesMode::Legacy),
        2 => Some(IptablesMode::Nft),
        _ => None,
    }
}

fn code(mode: IptablesMode) -> u8 {
    match mode {
        IptablesMode::Legacy => 1,
        IptablesMode::Nft => 2,
    }
}

/// A save's output, or None when the program is not installed; a save that fails (a family
/// the kernel lacks) reads as no rules, as iptables-wrappers takes it.
fn save(program: &str, args: &[&str]) -> Option<String> {
    let path = find_tool(program)?;
    let out = Command::new(path)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Both families' saves of `mode` with `args`, joined; None when its IPv4 save is missing.
fn saves_of(mode: IptablesMode, args: &[&str]) -> Option<String> {
    let v4 = save(program(Some(mode), Family::V4, false), args)?;
    let v6 = save(program(Some(mode), Family::V6, false), args).unwrap_or_default();
    Some(v4 + &v6)
}

/// Reads what each mode holds, as [`decide`] needs it.
pub fn read_saves() -> Saves {
    let nft_mangle = saves_of(IptablesMode::Nft, &["-t", "mangle"]);
    // Kubelet's chain in nft decides alone: the other reads are not needed.
    if nft_mangle.as_deref().and_then(kubelet_chain).is_some() {
        return Saves {
            nft: Some(String::new()),
            legacy: Some(String::new()),
            nft_mangle,
        };
    }
    Saves {
        nft: saves_of(IptablesMode::Nft, &[]),
        legacy: saves_of(IptablesMode::Legacy, &[]),
        nft_mangle,
    }
}

/// The mode PATH's plain iptables runs, from `iptables-save --version`; pre-1.8 iptables,
/// which says neither, is legacy.
fn path_mode() -> Option<IptablesMode> {
    let out = save("iptables-save", &["--version"])?;
    Some(if out.contains(IptablesMode::Nft.version_tag()) {
        IptablesMode::Nft
    } else {
        IptablesMode::Legacy
    })
}

/// The mode this process's iptables rules go through and what they run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chosen {
    pub mode: IptablesMode,
    /// Why: detected (what decided it), asked for, or the only one there.
    pub reason: String,
    /// The IPv4 restore program the rules are written with.
    pub program: &'static str,
}

/// Chooses the iptables mode of this process's rules: `asked` when given, else detected
/// ([`decide`] over what each mode holds now, the caller's own chains, named by their prefixes
/// `ours`, left out), and makes every iptables tool of the process
/// run that mode's programs: PATH's plain `iptables-restore` when it is of that mode, else
/// `iptables-<mode>-restore`. Fails when the mode asked for or the only one installed cannot
/// be run; with no iptables at all, fails saying so.
pub fn choose(asked: Option<IptablesMode>, ours: &[&str]) -> Result<Chosen, Error> {
    let on_path = path_mode();
    let (mode, reason) = match asked {
        Some(m) => (m, "asked for".to_string()),
        None => match decide(&read_saves(), ours) {
            Some(c) => (c.mode, c.reason),
            None => match on_path {
                Some(m) => (m, format!("the only iptables installed is {m}")),
                None => {
                    return Err(Error::failed(
                        "choosing the iptables mode",
                        "",
                        "no iptables-restore, iptables-legacy-restore or iptables-nft-restore is installed",
                    )
                    .with_kind(Kind::Invalid))
                }
            },
        },
    };
    let named = [Family::V4, Family::V6]
        .into_iter()
        .flat_map(|f| [program(Some(mode), f, false), program(Some(mode), f, true)])
        .all(|p| find_tool(p).is_some());
    let programs = if on_path == Some(mode) {
        0
    } else if named {
        code(mode)
    } else {
        let path = std::env::var("PATH").unwrap_or_default();
        return Err(Error::failed(
            "choosing the iptables mode",
            mode,
            format!(
                "{reason}, but {} is not installed (PATH={path})",
                program(Some(mode), Family::V4, true)
            ),
        )
        .with_kind(Kind::Invalid));
    };
    PROGRAMS.store(programs, Relaxed);
    CHOSEN.store(code(mode), Relaxed);
    Ok(Chosen {
        mode,
        reason,
        program: chosen_program(Family::V4, true),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const EMPTY_FILTER: &str =
        "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n";
    const DOCKER_FILTER: &str = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\n:DOCKER - [0:0]\n:DOCKER-USER - [0:0]\n-A FORWARD -j DOCKER-USER\n-A DOCKER-USER -j RETURN\nCOMMIT\n";
    const HINT: &str = "*mangle\n:PREROUTING ACCEPT [0:0]\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n";
    const CANARY: &str = "*mangle\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT\n";

    fn saves(nft_mangle: &str, nft: &str, legacy: &str) -> Saves {
        Saves {
            nft_mangle: Some(nft_mangle.into()),
            nft: Some(nft.into()),
            legacy: Some(legacy.into()),
        }
    }

    fn decide(s: &Saves) -> Option<ModeChoice> {
        super::decide(s, &["FLANNEL-"])
    }

    fn mode(s: &Saves) -> IptablesMode {
        decide(s).unwrap().mode
    }

    #[test]
    fn kubelets_chains_decide_first_nft_before_legacy() {
        let c = decide(&saves(HINT, HINT, DOCKER_FILTER)).unwrap();
        assert_eq!(c.mode, IptablesMode::Nft);
        assert!(c.reason.contains("KUBE-IPTABLES-HINT"), "{}", c.reason);
        assert!(c.reason.contains("iptables-nft"), "{}", c.reason);
        // In legacy, kubelet's chain wins over nft's greater number of rules.
        let many = "-A X -j ACCEPT\n".repeat(9);
        let c = decide(&saves(EMPTY_FILTER, &many, CANARY)).unwrap();
        assert_eq!(c.mode, IptablesMode::Legacy);
        assert!(c.reason.contains("KUBE-KUBELET-CANARY"), "{}", c.reason);
        // A chain of another name is no kubelet's.
        let other = "*mangle\n:KUBE-IPTABLES-HINTS - [0:0]\nCOMMIT\n";
        assert_eq!(mode(&saves(other, "", other)), IptablesMode::Nft);
    }

    #[test]
    fn without_kubelet_the_mode_holding_more_wins_a_drop_policy_counting() {
        assert_eq!(
            mode(&saves(EMPTY_FILTER, EMPTY_FILTER, DOCKER_FILTER)),
            IptablesMode::Legacy
        );
        // A FORWARD policy DROP alone is a rule set in use.
        let drop_only = "*filter\n:FORWARD DROP [0:0]\nCOMMIT\n";
        let c = decide(&saves("", EMPTY_FILTER, drop_only)).unwrap();
        assert_eq!(c.mode, IptablesMode::Legacy);
        assert!(c.reason.contains("1 rules"), "{}", c.reason);
        // A tie, and nothing at all, are nft's.
        assert_eq!(
            mode(&saves("", DOCKER_FILTER, DOCKER_FILTER)),
            IptablesMode::Nft
        );
        let c = decide(&saves("", "", "")).unwrap();
        assert_eq!(c.mode, IptablesMode::Nft);
        assert!(c.reason.contains("default"), "{}", c.reason);
        // The caller's own rules follow the choice: they never make it.
        let ours = "*filter\n:FLANNEL-FWD - [0:0]\n-A FORWARD -m comment --comment \"x\" -j FLANNEL-FWD\n-A FLANNEL-FWD -s 10.0.0.0/8 -j ACCEPT\n-A FLANNEL-FWD -d 10.0.0.0/8 -j ACCEPT\nCOMMIT\n";
        assert_eq!(mode(&saves("", ours, DOCKER_FILTER)), IptablesMode::Legacy);
    }

    #[test]
    fn with_one_mode_installed_that_one() {
        let only = |nft: bool, legacy: bool| Saves {
            nft_mangle: nft.then(String::new),
            nft: nft.then(String::new),
            legacy: legacy.then(|| CANARY.to_string()),
        };
        assert_eq!(mode(&only(true, false)), IptablesMode::Nft);
        assert_eq!(mode(&only(false, true)), IptablesMode::Legacy);
        assert_eq!(decide(&only(false, false)), None);
    }

    #[test]
    fn each_mode_has_its_programs_by_name() {
        assert_eq!(program(None, Family::V4, true), "iptables-restore");
        assert_eq!(
            program(Some(IptablesMode::Legacy), Family::V6, false),
            "ip6tables-legacy-save"
        );
        assert_eq!(
            program(Some(IptablesMode::Nft), Family::V4, true),
            "iptables-nft-restore"
        );
        assert_eq!(IptablesMode::parse("legacy"), Some(IptablesMode::Legacy));
        assert_eq!(IptablesMode::parse("nf_tables"), None);
        assert_eq!(IptablesMode::Nft.other(), IptablesMode::Legacy);
    }
}
