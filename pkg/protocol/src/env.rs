//! The environment a runtime sets for a plugin, read and validated as the spec and the Go skel do.

use crate::error::{CniError, INVALID_ENVIRONMENT, UNKNOWN_CONTAINER};
use std::fmt;
use std::path::PathBuf;

/// Container IDs and network names: `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`, upper case allowed.
/// Checked by hand: a regex engine costs every plugin process start-up time for one pattern.
fn matches_id_pattern(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphanumeric())
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Version,
    Status,
    Gc,
}

impl Command {
    pub fn parse(s: &str) -> Result<Command, CniError> {
        Ok(match s {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "VERSION" => Command::Version,
            "STATUS" => Command::Status,
            "GC" => Command::Gc,
            other => {
                return Err(CniError::new(
                    INVALID_ENVIRONMENT,
                    format!("unknown CNI_COMMAND {other:?}: expected ADD, DEL, CHECK, VERSION, STATUS or GC"),
                ))
            }
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Version => "VERSION",
            Command::Status => "STATUS",
            Command::Gc => "GC",
        }
    }

    /// Which variables must be set for this command (CNI_COMMAND aside).
    fn required(self) -> &'static [&'static str] {
        match self {
            Command::Add | Command::Check => {
                &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"]
            }
            Command::Del => &["CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"],
            Command::Version | Command::Status | Command::Gc => &[],
        }
    }

    /// Whether the container ID and interface name are part of this command.
    pub fn names_attachment(self) -> bool {
        matches!(self, Command::Add | Command::Del | Command::Check)
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The validated CNI_* variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Env {
    pub command: Command,
    pub container_id: String,
    /// Empty when the runtime did not set it (allowed for DEL, STATUS, GC).
    pub netns: String,
    pub ifname: String,
    /// CNI_ARGS as ordered key/value pairs.
    pub args: Vec<(String, String)>,
    /// The raw CNI_PATH, passed on to delegates untouched.
    pub path_raw: String,
    pub path: Vec<PathBuf>,
}

impl Env {
    /// Reads the command alone: VERSION needs nothing else.
    pub fn command(get: &dyn Fn(&str) -> Option<String>) -> Result<Command, CniError> {
        match get("CNI_COMMAND").filter(|s| !s.is_empty()) {
            Some(c) => Command::parse(&c),
            None => Err(CniError::env(
                "required environment variable CNI_COMMAND is missing",
            )),
        }
    }

    /// Reads and validates every variable for the command.
    pub fn from_getter(get: &dyn Fn(&str) -> Option<String>) -> Result<Env, CniError> {
        let command = Self::command(get)?;
        let value = |name: &str| get(name).unwrap_or_default();
        let missing: Vec<&str> = command
            .required()
            .iter()
            .copied()
            .filter(|name| value(name).is_empty())
            .collect();
        if !missing.is_empty() {
            return Err(CniError::env(format!(
                "required environment variables [{}] missing for CNI_COMMAND {command}",
                missing.join(",")
            )));
        }
        let env = Env {
            command,
            container_id: value("CNI_CONTAINERID"),
            netns: value("CNI_NETNS"),
            ifname: value("CNI_IFNAME"),
            args: parse_args(&value("CNI_ARGS"))?,
            path_raw: value("CNI_PATH"),
            path: std::env::split_paths(&value("CNI_PATH"))
                .filter(|p| !p.as_os_str().is_empty())
                .collect(),
        };
        if command.names_attachment() {
            // DEL takes any ID: the dispatcher answers one that no ADD accepts itself.
            if command != Command::Del {
                validate_container_id(&env.container_id)?;
            }
            validate_ifname(&env.ifname)?;
        }
        Ok(env)
    }

    /// Reads the process environment.
    pub fn from_process() -> Result<Env, CniError> {
        Self::from_getter(&|k| std::env::var(k).ok())
    }

    /// The value of a CNI_ARGS key, last one wins as in the Go parser.
    pub fn arg(&self, key: &str) -> Option<&str> {
        self.args
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Parses `K=V;K=V`; a pair without `=` is an error naming it.
pub fn parse_args(raw: &str) -> Result<Vec<(String, String)>, CniError> {
    raw.split(';')
        .filter(|pair| !pair.is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => Err(CniError::env(format!(
                "invalid CNI_ARGS pair {pair:?}: expected KEY=VALUE"
            ))),
        })
        .collect()
}

/// The spec's pattern and nothing more: as in Go, no length limit. A plugin that makes a
/// file named by the ID (flannel) refuses what cannot be a file name itself.
pub fn validate_container_id(id: &str) -> Result<(), CniError> {
    if id.is_empty() {
        return Err(CniError::new(UNKNOWN_CONTAINER, "missing CNI_CONTAINERID"));
    }
    if !matches_id_pattern(id) {
        return Err(CniError::env(format!(
            "invalid CNI_CONTAINERID {id:?}: must match ^[a-zA-Z0-9][a-zA-Z0-9_.\\-]*$"
        )));
    }
    Ok(())
}

pub fn validate_ifname(name: &str) -> Result<(), CniError> {
    match ifname::problem(name) {
        Some(p) => Err(CniError::env(format!("invalid CNI_IFNAME {name:?}: {p}"))),
        None => Ok(()),
    }
}

/// Network names follow the container ID pattern.
pub fn validate_network_name(name: &str) -> Result<(), CniError> {
    if name.is_empty() {
        return Err(CniError::invalid_config(
            "missing network name (field \"name\")",
        ));
    }
    if !matches_id_pattern(name) {
        return Err(CniError::invalid_config(format!(
            "invalid network name {name:?} (field \"name\"): must match ^[a-zA-Z0-9][a-zA-Z0-9_.\\-]*$"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> Result<Env, CniError> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Env::from_getter(&move |k| map.get(k).cloned())
    }

    const FULL: [(&str, &str); 6] = [
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "Abc-1.2_3"),
        ("CNI_NETNS", "/var/run/netns/x"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_ARGS", "IgnoreUnknown=1;IP=10.0.0.5"),
        ("CNI_PATH", "/opt/cni/bin:/usr/lib/cni"),
    ];

    #[test]
    fn reads_a_full_environment() {
        let env = env_of(&FULL).unwrap();
        assert_eq!(env.command, Command::Add);
        assert_eq!(env.container_id, "Abc-1.2_3");
        assert_eq!(env.arg("IP"), Some("10.0.0.5"));
        assert_eq!(
            env.path,
            vec![PathBuf::from("/opt/cni/bin"), PathBuf::from("/usr/lib/cni")]
        );
    }

    #[test]
    fn each_required_variable_missing_is_code_4_naming_it() {
        for (cmd, required) in [
            (
                "ADD",
                &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"][..],
            ),
            (
                "CHECK",
                &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"][..],
            ),
            ("DEL", &["CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"][..]),
        ] {
            for name in required {
                let pairs: Vec<(&str, &str)> = FULL
                    .iter()
                    .copied()
                    .map(|(k, v)| if k == "CNI_COMMAND" { (k, cmd) } else { (k, v) })
                    .filter(|(k, _)| k != name)
                    .collect();
                let e = env_of(&pairs).unwrap_err();
                assert_eq!(e.code, 4, "{cmd} without {name}");
                assert!(e.msg.contains(name), "{}", e.msg);
            }
        }
        let e = env_of(&[]).unwrap_err();
        assert_eq!(e.code, 4);
        assert!(e.msg.contains("CNI_COMMAND"));
    }

    #[test]
    fn del_allows_an_empty_netns() {
        let pairs: Vec<_> = FULL
            .iter()
            .copied()
            .map(|(k, v)| match k {
                "CNI_COMMAND" => (k, "DEL"),
                "CNI_NETNS" => (k, ""),
                _ => (k, v),
            })
            .collect();
        assert_eq!(env_of(&pairs).unwrap().netns, "");
    }

    #[test]
    fn bad_container_ids_and_ifnames_are_refused_naming_the_value() {
        let with_id = |cmd: &'static str, id: &'static str| -> Vec<(&'static str, &'static str)> {
            FULL.iter()
                .copied()
                .map(|(k, v)| match k {
                    "CNI_CONTAINERID" => (k, id),
                    "CNI_COMMAND" => (k, cmd),
                    _ => (k, v),
                })
                .collect()
        };
        for id in ["../x", "a/b", "-a"] {
            for cmd in ["ADD", "CHECK"] {
                let e = env_of(&with_id(cmd, id)).unwrap_err();
                assert_eq!(e.code, 4, "{cmd} {id}");
                assert!(e.msg.contains("CNI_CONTAINERID"), "{}", e.msg);
            }
            // DEL reads it; the dispatcher answers it without running the verb.
            assert_eq!(env_of(&with_id("DEL", id)).unwrap().container_id, id);
        }
        // No length limit, as in Go: only a plugin naming a file by the ID has one.
        let long: &'static str = "a".repeat(1000).leak();
        for cmd in ["ADD", "CHECK", "DEL"] {
            assert_eq!(env_of(&with_id(cmd, long)).unwrap().container_id, long);
        }
        for ifname in ["abcdefghijklmnop", "a/b", "a b", "..", ".", "a:b"] {
            let e = validate_ifname(ifname).unwrap_err();
            assert_eq!(e.code, 4);
            assert!(e.msg.contains(&format!("{ifname:?}")), "{}", e.msg);
        }
        assert!(validate_ifname("abcdefghijklmno").is_ok());
    }

    #[test]
    fn id_pattern() {
        for ok in ["a", "A9", "abc-DEF_1.2", "0"] {
            assert!(matches_id_pattern(ok), "{ok}");
        }
        for bad in ["", "-a", "_a", ".a", "a/b", "a b", "a:b", "é", "a\n"] {
            assert!(!matches_id_pattern(bad), "{bad:?}");
        }
    }

    #[test]
    fn cni_args_pairs() {
        assert_eq!(parse_args("").unwrap(), vec![]);
        assert_eq!(
            parse_args("A=1;B=x=y;").unwrap(),
            vec![("A".into(), "1".into()), ("B".into(), "x=y".into())]
        );
        let e = parse_args("A=1;junk").unwrap_err();
        assert_eq!(e.code, 4);
        assert!(e.msg.contains("junk"));
    }

    #[test]
    fn unknown_command_is_code_4() {
        let e = Command::parse("FOO").unwrap_err();
        assert_eq!(e.code, 4);
        assert!(e.msg.contains("FOO"));
    }
}
