//! `extension`: the backend of an operator's commands, run as Go's flanneld's
//! `pkg/backend/extension` runs them (v0.22 and later: no shell). `PreStartupCommand` before
//! the lease, its output (a JSON string) the lease's `BackendData`; `PostStartupCommand` once
//! the lease is held, with NETWORK, SUBNET, IPV6SUBNET, PUBLIC_IP and PUBLIC_IPV6 set;
//! `SubnetAddCommand` for each other node's extension lease (again when it changes) and
//! `SubnetRemoveCommand` when it goes, with SUBNET and PUBLIC_IP set (and IPV6SUBNET and
//! PUBLIC_IPV6, which Go's documentation promises and its code leaves out), the lease's
//! `BackendData` string on stdin. A command line is split at whitespace and each word's `$VAR`
//! and `${VAR}` expanded from those variables and flanneld's environment, as Go's `os.Expand`
//! does; the command gets both in its environment.
//!
//! What the commands did cannot be read back: the plane keeps which leases' add command ran,
//! and runs again what failed at its next pass (Go's runs each once).

use super::api::{Backend, Refusal};
use crate::config::{ConfigError, Fields, NetConfig};
use crate::family::IpFamily;
use crate::iface::External;
use crate::lease::{Lease, SubnetKey};
use crate::planes::{DynPlane, Others, PassError, Plan, Plane};
use crate::report::Finding;
use futures::future::BoxFuture;
use serde_json::value::RawValue;
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};

/// The commands of `Backend`, each None when not given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extension {
    pub pre_startup: Option<String>,
    pub post_startup: Option<String>,
    pub subnet_add: Option<String>,
    pub subnet_remove: Option<String>,
    /// NETWORK for the post-startup command: the IPv4 network, as Go's gives it.
    network: String,
}

fn command(b: &Fields, key: &str) -> Result<Option<String>, ConfigError> {
    Ok(b.text(key)?
        .filter(|s| !s.trim().is_empty())
        .map(str::to_string))
}

impl Extension {
    /// The config's `Backend` keys, checked; each refusal names the key.
    pub fn from_config(cfg: &NetConfig) -> Result<Extension, ConfigError> {
        let b = Fields::backend(cfg);
        Ok(Extension {
            pre_startup: command(&b, "PreStartupCommand")?,
            post_startup: command(&b, "PostStartupCommand")?,
            subnet_add: command(&b, "SubnetAddCommand")?,
            subnet_remove: command(&b, "SubnetRemoveCommand")?,
            network: cfg
                .network(IpFamily::V4)
                .map_or_else(|| "0.0.0.0/0".to_string(), |n| n.to_string()),
        })
    }
}

/// `$NAME`, `${NAME}` and the shell's one-character names expanded in `word` by `lookup`
/// (unknown: empty), as Go's `os.Expand`: a `$` before no name stays, `${}` and an unclosed
/// `${` are dropped.
pub fn expand(word: &str, lookup: &dyn Fn(&str) -> String) -> String {
    let special = |c: u8| b"*#$@!?-0123456789".contains(&c);
    let name_char = |c: u8| c == b'_' || c.is_ascii_alphanumeric();
    let s = word.as_bytes();
    let mut out = String::new();
    let mut i = 0;
    let mut j = 0;
    while j < s.len() {
        if s[j] != b'$' || j + 1 >= s.len() {
            j += 1;
            continue;
        }
        out.push_str(&word[i..j]);
        let rest = &s[j + 1..];
        // The name after the `$` and how many bytes it and its braces take.
        let (name, taken): (Option<&str>, usize) = if rest[0] == b'{' {
            if rest.len() > 2 && special(rest[1]) && rest[2] == b'}' {
                (Some(&word[j + 2..j + 3]), 3)
            } else {
                match rest.iter().position(|&c| c == b'}') {
                    Some(1) => (None, 2),
                    Some(end) => (Some(&word[j + 2..j + 1 + end]), end + 1),
                    None => (None, 1),
                }
            }
        } else if special(rest[0]) {
            (Some(&word[j + 1..j + 2]), 1)
        } else {
            let n = rest.iter().take_while(|&&c| name_char(c)).count();
            if n == 0 {
                out.push('$');
            }
            (Some(&word[j + 1..j + 1 + n]).filter(|n| !n.is_empty()), n)
        };
        if let Some(name) = name {
            out.push_str(&lookup(name));
        }
        j += taken + 1;
        i = j;
    }
    out.push_str(&word[i.min(word.len())..]);
    out
}

/// A command line as Go's extension backend makes it: the words of `line`, each expanded from
/// `vars` first and flanneld's environment after.
pub fn words(line: &str, vars: &[(&str, String)]) -> Vec<String> {
    let lookup = |name: &str| {
        vars.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.clone())
            .or_else(|| std::env::var(name).ok())
            .unwrap_or_default()
    };
    line.split_whitespace()
        .map(|w| expand(w, &lookup))
        .collect()
}

/// Runs `line` with `vars` in its environment and `stdin` (and a newline) on its stdin; its
/// stdout and stderr together, trimmed; or why it failed, with that output.
pub fn run(line: &str, vars: &[(&str, String)], stdin: &str) -> Result<String, String> {
    let argv = words(line, vars);
    let Some((program, args)) = argv.split_first() else {
        return Err("an empty command".into());
    };
    // stdout and stderr into one pipe, as Go's CombinedOutput gathers them.
    let (read, write) = nix::unistd::pipe().map_err(|e| format!("a pipe for its output: {e}"))?;
    let write_err = write.try_clone().map_err(|e| format!("its output: {e}"))?;
    let mut child = Command::new(program)
        .args(args)
        .envs(vars.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::piped())
        .stdout(Stdio::from(write))
        .stderr(Stdio::from(write_err))
        .spawn()
        .map_err(|e| format!("starting {program}: {e}"))?;
    if let Some(mut input) = child.stdin.take() {
        // A command that never reads its stdin may have ended already.
        let _ = input.write_all(format!("{stdin}\n").as_bytes());
    }
    let mut output = String::new();
    std::io::Read::read_to_string(&mut std::fs::File::from(read), &mut output)
        .map_err(|e| format!("reading its output: {e}"))?;
    let status = child.wait().map_err(|e| format!("waiting for it: {e}"))?;
    let output = output.trim().to_string();
    if status.success() {
        Ok(output)
    } else {
        Err(format!("{status}; its output: {output}"))
    }
}

/// Runs a command off the async workers, as [`run`].
async fn run_blocking(
    line: String,
    vars: Vec<(&'static str, String)>,
    stdin: String,
) -> Result<String, String> {
    tokio::task::spawn_blocking(move || run(&line, &vars, &stdin))
        .await
        .unwrap_or_else(|e| Err(format!("its thread: {e}")))
}

/// The variables a lease gives the subnet commands, as Go's gives them (an absent subnet or
/// address as Go's zero values print).
fn lease_vars(l: &Lease) -> Vec<(&'static str, String)> {
    let or = |v: Option<String>, zero: &str| v.unwrap_or_else(|| zero.to_string());
    vec![
        ("SUBNET", or(l.key.ipv4.map(|n| n.to_string()), "0.0.0.0/0")),
        (
            "PUBLIC_IP",
            or(l.attrs.public_ip.map(|a| a.to_string()), "0.0.0.0"),
        ),
        ("IPV6SUBNET", or(l.key.ipv6.map(|n| n.to_string()), "")),
        (
            "PUBLIC_IPV6",
            or(l.attrs.public_ipv6.map(|a| a.to_string()), ""),
        ),
    ]
}

/// A lease's `BackendData` as the string the commands get on stdin: Go's is a JSON string; an
/// absent one is empty; anything else is refused.
fn data_string(l: &Lease) -> Result<String, String> {
    match l.attrs.backend_data.as_deref().map(RawValue::get) {
        None => Ok(String::new()),
        Some(text) => match serde_json::from_str::<Value>(text) {
            Ok(Value::String(s)) => Ok(s),
            _ => Err(format!("its BackendData {text} is not a JSON string")),
        },
    }
}

impl Backend for Extension {
    fn name(&self) -> &'static str {
        "extension"
    }

    /// flanneld programs nothing of it: its commands do, from its plane.
    fn programs(&self) -> bool {
        false
    }

    fn announce<'a>(
        &'a self,
        _ext: &'a External,
    ) -> BoxFuture<'a, Result<Option<Box<RawValue>>, Refusal>> {
        Box::pin(async move {
            let Some(line) = self.pre_startup.clone() else {
                info!("extension: no PreStartupCommand");
                return Ok(None);
            };
            let output = run_blocking(line.clone(), Vec::new(), String::new())
                .await
                .map_err(|e| format!("extension: PreStartupCommand {line:?} failed: {e}"))?;
            info!("extension: ran PreStartupCommand {line:?}; its output: {output}");
            let json = serde_json::to_string(&output)?;
            Ok(Some(RawValue::from_string(json)?))
        })
    }

    fn leased<'a>(
        &'a self,
        own: &'a Lease,
        _ext: &'a External,
    ) -> BoxFuture<'a, Result<(), Refusal>> {
        Box::pin(async move {
            let Some(line) = self.post_startup.clone() else {
                info!("extension: no PostStartupCommand");
                return Ok(());
            };
            let mut vars = lease_vars(own);
            vars.insert(0, ("NETWORK", self.network.clone()));
            let output = run_blocking(line.clone(), vars, String::new())
                .await
                .map_err(|e| format!("extension: PostStartupCommand {line:?} failed: {e}"))?;
            info!("extension: ran PostStartupCommand {line:?}; its output: {output}");
            Ok(())
        })
    }

    fn plane(&self, own: SubnetKey, runs: bool) -> Option<Box<dyn DynPlane>> {
        Some(Box::new(ExtensionPlane {
            ext: Arc::new(self.clone()),
            own,
            runs,
            ran: BTreeMap::new(),
            failing: BTreeMap::new(),
        }))
    }
}

/// How often the plane looks again when nothing changed: what failed is run again then.
const RESYNC: Duration = Duration::from_secs(10);

/// The other nodes' extension leases, and the commands they call for.
pub struct ExtensionPlane {
    ext: Arc<Extension>,
    own: SubnetKey,
    /// False for `doctor`, which runs no command.
    runs: bool,
    /// The leases whose add command ran, as they were then.
    ran: BTreeMap<SubnetKey, Arc<Lease>>,
    /// The last failure of each lease's add command, so that one repeated is said once.
    failing: BTreeMap<SubnetKey, String>,
}

/// The leases to run the add command for (new or changed) and those gone, for the remove
/// command; and every lease the plane keeps, for `doctor`.
pub struct ExtensionPlan {
    add: Vec<Arc<Lease>>,
    remove: Vec<Arc<Lease>>,
    kept: Vec<(SubnetKey, &'static str)>,
    runs: bool,
}

impl Plan for ExtensionPlan {
    fn is_empty(&self) -> bool {
        !self.runs || (self.add.is_empty() && self.remove.is_empty())
    }

    fn findings(&self) -> Vec<Finding> {
        let mut out: Vec<Finding> = self
            .kept
            .iter()
            .map(|(key, what)| Finding::new("extension", "ok", format!("lease {key}: {what}")))
            .collect();
        if out.is_empty() {
            out.push(Finding::new(
                "extension",
                "ok",
                "no other node's extension lease: no command to run",
            ));
        }
        out
    }
}

impl ExtensionPlane {
    /// Runs `line` for `lease`; whether it succeeded. A failure is said once while it repeats
    /// the same.
    async fn subnet_command(&mut self, which: &str, line: &str, lease: &Lease) -> bool {
        let result = match data_string(lease) {
            Ok(data) => run_blocking(line.to_string(), lease_vars(lease), data).await,
            Err(why) => Err(why),
        };
        match result {
            Ok(output) => {
                info!(
                    "extension: ran {which} for lease {} ({line:?}); its output: {output}",
                    lease.key
                );
                self.failing.remove(&lease.key);
                true
            }
            Err(e) => {
                if self.failing.get(&lease.key) != Some(&e) {
                    warn!(
                        "extension: {which} for lease {} ({line:?}) failed: {e}; trying again every {RESYNC:?}",
                        lease.key
                    );
                    self.failing.insert(lease.key, e);
                }
                false
            }
        }
    }
}

impl Plane for ExtensionPlane {
    type Plan = ExtensionPlan;
    const KIND: &'static str = "extension";

    fn resync(&self) -> Duration {
        RESYNC
    }

    fn follows_leases(&self) -> bool {
        true
    }

    async fn plan(&mut self, others: &Others) -> Result<ExtensionPlan, PassError> {
        let mut plan = ExtensionPlan {
            add: Vec::new(),
            remove: Vec::new(),
            kept: Vec::new(),
            runs: self.runs,
        };
        let Some(leases) = others.leases() else {
            return Ok(plan);
        };
        let wanted: Vec<&Arc<Lease>> = leases
            .values()
            .filter(|l| l.key != self.own && l.attrs.backend_type == "extension")
            .collect();
        for l in &wanted {
            let same = self.ran.get(&l.key).is_some_and(|r| r.attrs == l.attrs);
            if same {
                plan.kept.push((l.key, "its SubnetAddCommand ran"));
            } else {
                plan.add.push((*l).clone());
                plan.kept
                    .push((l.key, "its SubnetAddCommand is run for it"));
            }
        }
        plan.remove = self
            .ran
            .iter()
            .filter(|(k, _)| !wanted.iter().any(|l| l.key == **k))
            .map(|(_, l)| l.clone())
            .collect();
        Ok(plan)
    }

    async fn apply(&mut self, plan: ExtensionPlan, _others: &Others) {
        if plan.is_empty() {
            return;
        }
        let ext = self.ext.clone();
        for lease in &plan.remove {
            info!("extension: lease {} is gone", lease.key);
            if let Some(line) = &ext.subnet_remove {
                self.subnet_command("SubnetRemoveCommand", line, lease)
                    .await;
            }
            self.ran.remove(&lease.key);
            self.failing.remove(&lease.key);
        }
        for lease in plan.add {
            info!(
                "extension: lease {} via {}",
                lease.key,
                lease
                    .attrs
                    .public_ip
                    .map_or_else(|| "no IPv4 address".to_string(), |a| a.to_string())
            );
            let done = match &ext.subnet_add {
                Some(line) => self.subnet_command("SubnetAddCommand", line, &lease).await,
                None => true,
            };
            if done {
                self.ran.insert(lease.key, lease);
            }
        }
        crate::metrics::set(
            &crate::metrics::METRICS.backend_peers,
            self.ran.len() as u64,
        );
    }

    fn failed(&mut self, e: PassError, _others: &Others) {
        warn!("extension: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config;
    use crate::lease::LeaseAttrs;

    fn env(name: &str) -> String {
        match name {
            "SUBNET" => "10.5.2.0/24".into(),
            "PUBLIC_IP" => "192.168.0.2".into(),
            "1" => "one".into(),
            _ => String::new(),
        }
    }

    #[test]
    fn words_are_expanded_as_go_s_os_expand_does() {
        let x = |w: &str| expand(w, &env);
        assert_eq!(x("$SUBNET"), "10.5.2.0/24");
        assert_eq!(x("${SUBNET}"), "10.5.2.0/24");
        assert_eq!(x("via=$PUBLIC_IP:8285"), "via=192.168.0.2:8285");
        assert_eq!(x("\"$SUBNET\""), "\"10.5.2.0/24\"");
        assert_eq!(x("$SUBNET_IP"), "", "the longest name, unknown: empty");
        assert_eq!(x("${SUBNET}_IP"), "10.5.2.0/24_IP");
        assert_eq!(x("$1$2"), "one");
        assert_eq!(x("${1}"), "one");
        assert_eq!(x("cost$"), "cost$", "a $ at the end stays");
        assert_eq!(x("a$/b"), "a$/b", "a $ before no name stays");
        assert_eq!(x("a${}b"), "ab", "an empty brace pair is dropped");
        assert_eq!(x("a${SUBNET"), "aSUBNET", "an unclosed brace is dropped");
        assert_eq!(x("plain"), "plain");
    }

    #[test]
    fn a_command_line_is_words_not_a_shell() {
        let vars = [("SUBNET", "10.5.2.0/24".to_string())];
        assert_eq!(
            words("ip route add  $SUBNET via ${GATEWAY_UNSET}x", &vars),
            ["ip", "route", "add", "10.5.2.0/24", "via", "x"]
        );
        // No shell: a pipe or a quote is a word like any other.
        assert_eq!(
            words("echo 'a b' | cat", &[]),
            ["echo", "'a", "b'", "|", "cat"]
        );
    }

    #[test]
    fn a_command_gets_the_variables_its_stdin_and_gives_its_output() {
        let vars = [("SUBNET", "10.5.2.0/24".to_string())];
        assert_eq!(run("echo $SUBNET", &vars, "").unwrap(), "10.5.2.0/24");
        assert_eq!(run("cat", &[], "aa:bb").unwrap(), "aa:bb");
        assert_eq!(run("printenv SUBNET", &vars, "").unwrap(), "10.5.2.0/24");
        // `sh -c exit 3` is `sh -c exit` with $0 set: words, not a shell line.
        assert_eq!(run("sh -c exit 3", &[], "").unwrap(), "");
        let e = run("false", &[], "").unwrap_err();
        assert!(e.contains("exit status: 1"), "{e}");
        let e = run("no-such-program-here x", &[], "").unwrap_err();
        assert!(e.contains("starting no-such-program-here"), "{e}");
        // stderr comes with stdout.
        let e = run("ls /no-such-dir-here", &[], "").unwrap_err();
        assert!(e.contains("No such file"), "{e}");
    }

    fn lease(key: &str, data: Option<&str>) -> Lease {
        Lease {
            key: SubnetKey::parse(key).unwrap(),
            attrs: LeaseAttrs {
                public_ip: "192.168.0.2".parse().ok(),
                public_ipv6: None,
                backend_type: "extension".into(),
                backend_data: data.and_then(|d| RawValue::from_string(d.into()).ok()),
                backend_v6_data: None,
            },
        }
    }

    #[test]
    fn a_lease_gives_its_variables_and_its_data_string() {
        let l = lease("10.5.2.0-24", Some(r#""aa:bb""#));
        let vars = lease_vars(&l);
        assert_eq!(vars[0], ("SUBNET", "10.5.2.0/24".to_string()));
        assert_eq!(vars[1], ("PUBLIC_IP", "192.168.0.2".to_string()));
        assert_eq!(data_string(&l).unwrap(), "aa:bb");
        assert_eq!(data_string(&lease("10.5.2.0-24", None)).unwrap(), "");
        let e = data_string(&lease("10.5.2.0-24", Some(r#"{"VNI":1}"#))).unwrap_err();
        assert!(e.contains("not a JSON string"), "{e}");
    }

    #[test]
    fn its_keys_are_command_lines() {
        let c = config::parse(
            r#"{"Network":"10.5.0.0/16","Backend":{"Type":"extension","SubnetAddCommand":"ip route add $SUBNET via $PUBLIC_IP","PreStartupCommand":""}}"#,
        )
        .unwrap();
        let e = Extension::from_config(&c).unwrap();
        assert_eq!(
            e.subnet_add.as_deref(),
            Some("ip route add $SUBNET via $PUBLIC_IP")
        );
        assert_eq!((e.pre_startup, e.network.as_str()), (None, "10.5.0.0/16"));
        let c = config::parse(
            r#"{"Network":"10.5.0.0/16","Backend":{"Type":"extension","SubnetAddCommand":7}}"#,
        )
        .unwrap();
        assert_eq!(
            Extension::from_config(&c).unwrap_err().key,
            "Backend.SubnetAddCommand"
        );
    }
}
