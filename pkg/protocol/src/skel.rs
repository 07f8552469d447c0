//! The plugin entry point: reads the environment and stdin, checks them, calls a verb, prints the answer.

use crate::env::{validate_container_id, validate_network_name, Command, Env};
use crate::error::{CniError, DECODING_FAILURE, INCOMPATIBLE_VERSION, IO_FAILURE};
use crate::gokeys;
use crate::request::Request;
use crate::result::CniResult;
use crate::version::{Version, LATEST, SUPPORTED_VERSIONS};
use serde_json::{json, Value};
use std::io::{Read, Write};

/// The verbs of one plugin. STATUS and GC default to success with nothing to do.
pub trait Plugin {
    /// One line for humans, printed on stderr when CNI_COMMAND is missing.
    fn about(&self) -> &'static str;
    fn add(&self, req: &Request) -> Result<CniResult, CniError>;
    fn del(&self, req: &Request) -> Result<(), CniError>;
    fn check(&self, req: &Request) -> Result<(), CniError>;
    fn status(&self, _req: &Request) -> Result<(), CniError> {
        Ok(())
    }
    fn gc(&self, _req: &Request) -> Result<(), CniError> {
        Ok(())
    }
}

/// What the process prints on stdout and exits with.
#[derive(Debug)]
pub struct Outcome {
    pub stdout: String,
    pub exit_code: i32,
}

/// Runs the plugin as a process: the whole of a plugin's `main`.
pub fn run(plugin: &dyn Plugin) -> ! {
    std::panic::set_hook(Box::new(|info| {
        let e = CniError::internal(format!("plugin panicked: {info}"));
        println!("{}", e.to_json(LATEST.as_str()));
        let _ = std::io::stdout().flush();
        std::process::exit(1);
    }));
    let get = |k: &str| std::env::var(k).ok();
    let outcome = dispatch(plugin, &get, &mut std::io::stdin());
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(outcome.stdout.as_bytes());
    let _ = out.flush();
    std::process::exit(outcome.exit_code)
}

/// The dispatcher, with its inputs passed in so that it can be tested in-process.
pub fn dispatch(
    plugin: &dyn Plugin,
    get: &dyn Fn(&str) -> Option<String>,
    stdin: &mut dyn Read,
) -> Outcome {
    let command = match Env::command(get) {
        Ok(c) => c,
        Err(e) => {
            eprintln!(
                "{}\nCNI protocol versions supported: {}",
                plugin.about(),
                SUPPORTED_VERSIONS.join(", ")
            );
            return failure(&e, LATEST);
        }
    };
    if command == Command::Version {
        return success(&version_answer());
    }
    let mut raw = Vec::new();
    if let Err(e) = stdin.read_to_end(&mut raw) {
        return failure(
            &CniError::new(
                IO_FAILURE,
                format!("reading the network config from stdin: {e}"),
            ),
            LATEST,
        );
    }
    // Errors are printed in the config's version when it names a known one.
    let reply_version = serde_json::from_slice::<Value>(&raw)
        .ok()
        .and_then(|v| {
            v.as_object()
                .and_then(|o| gokeys::get(o, "cniVersion"))
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .and_then(|s| Version::parse(&s).ok())
        .unwrap_or(LATEST);
    let req = match build_request(get, raw) {
        Ok(r) => r,
        Err(e) => return failure(&e, reply_version),
    };
    let version = req.version;
    if req.env.command == Command::Del {
        if let Err(e) = validate_container_id(&req.env.container_id) {
            // Every ADD refuses this ID, so nothing was made for it; an error would only
            // make a runtime that retries DEL until it succeeds retry forever.
            eprintln!("DEL: nothing to do: {}", e.msg);
            return Outcome {
                stdout: String::new(),
                exit_code: 0,
            };
        }
    }
    match call(plugin, &req) {
        Ok(Some(result)) => match result.to_json(version) {
            Ok(v) => success(&v),
            Err(e) => {
                // Nothing the runtime can use was made: undo it.
                if let Err(del) = plugin.del(&req) {
                    eprintln!("cleanup after unprintable result failed: {del}");
                }
                failure(&e, version)
            }
        },
        Ok(None) => Outcome {
            stdout: String::new(),
            exit_code: 0,
        },
        Err(e) => failure(&e, version),
    }
}

fn call(plugin: &dyn Plugin, req: &Request) -> Result<Option<CniResult>, CniError> {
    match req.env.command {
        Command::Add => plugin.add(req).map(Some),
        Command::Del => plugin.del(req).map(|_| None),
        Command::Check => plugin.check(req).map(|_| None),
        Command::Status => plugin.status(req).map(|_| None),
        Command::Gc => plugin.gc(req).map(|_| None),
        Command::Version => Ok(None),
    }
}

/// Validates everything the spec requires before a verb runs.
pub fn build_request(
    get: &dyn Fn(&str) -> Option<String>,
    raw: Vec<u8>,
) -> Result<Request, CniError> {
    let env = Env::from_getter(get)?;
    if raw.iter().all(u8::is_ascii_whitespace) {
        return Err(CniError::new(
            DECODING_FAILURE,
            format!(
                "the network config on stdin is empty (CNI_COMMAND {})",
                env.command
            ),
        ));
    }
    let config: Value = serde_json::from_slice(&raw).map_err(|e| {
        CniError::new(
            DECODING_FAILURE,
            format!("decoding the network config on stdin: {e}"),
        )
    })?;
    if !config.is_object() {
        return Err(CniError::new(
            DECODING_FAILURE,
            format!("the network config on stdin must be a JSON object, got {config}"),
        ));
    }
    let top = |field: &str| config.as_object().and_then(|o| gokeys::get(o, field));
    let version = match top("cniVersion") {
        None | Some(Value::Null) => Version::V0_1_0,
        Some(Value::String(s)) if s.is_empty() => Version::V0_1_0,
        Some(Value::String(s)) => Version::parse(s)?,
        Some(other) => {
            return Err(CniError::new(
                DECODING_FAILURE,
                format!("field \"cniVersion\": expected a string, got {other}"),
            ))
        }
    };
    let name = match top("name") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => {
            return Err(CniError::new(
                DECODING_FAILURE,
                format!("field \"name\": expected a string, got {other}"),
            ))
        }
    };
    validate_network_name(&name)?;
    let gate = match env.command {
        Command::Check if !version.allows_check() => Some("0.4.0"),
        Command::Status | Command::Gc if !version.allows_status_and_gc() => Some("1.1.0"),
        _ => None,
    };
    if let Some(min) = gate {
        return Err(CniError::new(
            INCOMPATIBLE_VERSION,
            format!(
                "config version {version} does not allow {}: it needs cniVersion {min} or later",
                env.command
            ),
        ));
    }
    Ok(Request {
        env,
        stdin: raw,
        config,
        version,
        name,
    })
}

pub fn version_answer() -> Value {
    json!({"cniVersion": LATEST.as_str(), "supportedVersions": SUPPORTED_VERSIONS})
}

fn success(v: &Value) -> Outcome {
    Outcome {
        stdout: format!("{v}\n"),
        exit_code: 0,
    }
}

fn failure(e: &CniError, version: Version) -> Outcome {
    eprintln!("error: {e}");
    Outcome {
        stdout: format!("{}\n", e.to_json(version.as_str())),
        exit_code: 1,
    }
}
