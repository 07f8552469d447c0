//! Delegation: finding another plugin on CNI_PATH, running it, reading its answer.

use crate::env::{Command, Env};
use crate::error::{CniError, INTERNAL, INVALID_ENVIRONMENT, INVALID_NETWORK_CONFIG};
use crate::result::CniResult;
use crate::version::Version;
use serde_json::Value;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command as Process, Stdio};

/// Finds the executable named `plugin_type` in the first directory of `path` that has it.
pub fn find_plugin(plugin_type: &str, path: &[PathBuf]) -> Result<PathBuf, CniError> {
    if plugin_type.is_empty()
        || plugin_type.contains('/')
        || plugin_type == "."
        || plugin_type == ".."
    {
        return Err(CniError::new(
            INVALID_NETWORK_CONFIG,
            format!("invalid plugin type {plugin_type:?}: must be a plain file name"),
        ));
    }
    path.iter()
        .map(|dir| dir.join(plugin_type))
        .find(|p| is_executable(p))
        .ok_or_else(|| {
            let dirs: Vec<String> = path.iter().map(|p| p.display().to_string()).collect();
            CniError::new(
                INVALID_ENVIRONMENT,
                format!(
                    "failed to find plugin {plugin_type:?} in path [{}]",
                    dirs.join(" ")
                ),
            )
            .with_details("install the plugin into a directory listed in CNI_PATH")
        })
}

/// Whether `p` is a regular file (after symlinks) with an execute bit set: what a lookup on
/// CNI_PATH or PATH accepts.
pub fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Makes the delegate get SIGKILL when the thread that starts it ends. A runtime that kills
/// a plugin mid-ADD (a timeout, a pod deleted) runs DEL at once; a delegate left running on
/// would finish its ADD after that DEL and leak what it made. Plugins run their delegates
/// from the main thread, so the thread ends only with the plugin.
fn die_with_this_thread(process: &mut Process) {
    use std::os::unix::process::CommandExt;
    let parent = nix::unistd::getpid();
    // SAFETY: prctl and getppid are async-signal-safe and allocate nothing.
    unsafe {
        process.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(std::io::Error::from)?;
            // The parent may have died before the request took effect.
            if nix::unistd::getppid() != parent {
                return Err(std::io::Error::other("the calling plugin is gone"));
            }
            Ok(())
        });
    }
}

/// Runs `plugin_type` with `command`, the caller's environment and `config` on stdin.
/// Returns its stdout on success and its own error object, untouched, on failure.
pub fn exec(
    env: &Env,
    command: Command,
    plugin_type: &str,
    config: &Value,
) -> Result<Vec<u8>, CniError> {
    let exe = find_plugin(plugin_type, &env.path)?;
    let stdin = serde_json::to_vec(config)
        .map_err(|e| CniError::internal(format!("encoding delegate config: {e}")))?;
    let mut process = Process::new(&exe);
    die_with_this_thread(&mut process);
    let mut child = process
        .env("CNI_COMMAND", command.as_str())
        .env("CNI_CONTAINERID", &env.container_id)
        .env("CNI_NETNS", &env.netns)
        .env("CNI_IFNAME", &env.ifname)
        .env("CNI_PATH", &env.path_raw)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| CniError::io(format!("executing plugin {}: {e}", exe.display())))?;
    if let Some(mut pipe) = child.stdin.take() {
        // A plugin may exit without reading stdin; its answer is what counts.
        let _ = pipe.write_all(&stdin);
    }
    let out = child
        .wait_with_output()
        .map_err(|e| CniError::io(format!("waiting for plugin {}: {e}", exe.display())))?;
    if out.status.success() {
        return Ok(out.stdout);
    }
    let parsed: Option<CniError> = serde_json::from_slice::<Value>(&out.stdout)
        .ok()
        .and_then(|v| CniError::from_json(&v));
    Err(parsed.unwrap_or_else(|| {
        CniError::new(
            INTERNAL,
            format!(
                "plugin {plugin_type:?} {command} failed ({}) with output {:?}",
                out.status,
                String::from_utf8_lossy(&out.stdout).trim()
            ),
        )
    }))
}

/// Delegated ADD. When it fails, the delegate's DEL runs before the error is returned.
pub fn delegate_add(
    env: &Env,
    plugin_type: &str,
    config: &Value,
    version: Version,
) -> Result<CniResult, CniError> {
    let attempt = exec(env, Command::Add, plugin_type, config).and_then(|out| {
        let v: Value = serde_json::from_slice(&out).map_err(|e| {
            CniError::decode(format!(
                "plugin {plugin_type:?} ADD printed a result that is not JSON ({e}): {:?}",
                String::from_utf8_lossy(&out)
            ))
        })?;
        CniResult::parse(&v, version)
            .map_err(|e| e.context(format!("reading the result of plugin {plugin_type:?}")))
    });
    if attempt.is_err() {
        if let Err(e) = exec(env, Command::Del, plugin_type, config) {
            eprintln!("cleanup after failed ADD: plugin {plugin_type:?} DEL failed: {e}");
        }
    }
    attempt
}

/// Delegated DEL, CHECK, STATUS or GC: success needs no output.
pub fn delegate(
    env: &Env,
    command: Command,
    plugin_type: &str,
    config: &Value,
) -> Result<(), CniError> {
    exec(env, command, plugin_type, config).map(|_| ())
}
