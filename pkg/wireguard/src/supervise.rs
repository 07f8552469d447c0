//! The userspace tunnel as a process of its own: started when no process answers on the
//! device's socket, left running when its starter ends, so pods keep talking across a
//! restart of flanneld.

use std::fmt;
use std::fs::OpenOptions;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::uapi::{Server, UapiClient};

/// Why a tunnel process is not running.
#[derive(Debug)]
pub enum SuperviseError {
    /// Its log file would not open.
    Log(PathBuf, io::Error),
    /// Its program would not start.
    Spawn(PathBuf, io::Error),
    /// Waiting on the started process failed.
    Wait(io::Error),
    /// It ended before it answered on its socket; its log, if it has one.
    EndedAtStart {
        name: String,
        status: ExitStatus,
        log: Option<PathBuf>,
    },
    /// It did not answer on its socket within the ceiling (and was killed).
    NoAnswer {
        name: String,
        socket: PathBuf,
        ceiling: Duration,
    },
}

impl fmt::Display for SuperviseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SuperviseError::Log(p, e) => write!(f, "opening the tunnel's log {}: {e}", p.display()),
            SuperviseError::Spawn(p, e) => write!(f, "starting {}: {e}", p.display()),
            SuperviseError::Wait(e) => write!(f, "waiting on the tunnel process: {e}"),
            SuperviseError::EndedAtStart { name, status, log } => {
                write!(f, "the tunnel process for {name} ended at start, {status}")?;
                if let Some(log) = log {
                    write!(f, " (its log: {})", log.display())?;
                }
                Ok(())
            }
            SuperviseError::NoAnswer {
                name,
                socket,
                ceiling,
            } => write!(
                f,
                "the tunnel process for {name} did not answer on {} within {ceiling:?}",
                socket.display()
            ),
        }
    }
}

impl std::error::Error for SuperviseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SuperviseError::Log(_, e) | SuperviseError::Spawn(_, e) | SuperviseError::Wait(e) => {
                Some(e)
            }
            _ => None,
        }
    }
}

/// How a tunnel process is started: the program and the arguments before the device's name.
#[derive(Debug, Clone)]
pub struct Launcher<'a> {
    pub program: &'a Path,
    pub args: &'a [&'a str],
    /// Where its stderr goes (appended); None discards it.
    pub log: Option<&'a Path>,
}

/// The client of device `name`'s tunnel in `dir`, and whether it had to be started now. A
/// started tunnel is in its own session (a signal to the starter's process group does not
/// reach it) and is reaped by a thread while the starter lives, by init after.
pub fn ensure_running(
    name: &str,
    dir: &Path,
    launcher: &Launcher,
    ceiling: Duration,
) -> Result<(UapiClient, bool), SuperviseError> {
    let client = UapiClient::in_dir(dir, name);
    if let Server::Elsewhere(pid) = client.server() {
        tracing::warn!(
            "the tunnel serving {} ({}) runs in another network namespace, not this one's \
             device {name}: starting this namespace's own",
            client.path().display(),
            pid.map_or(
                "a process this PID namespace does not show".to_string(),
                |p| { format!("pid {p}") }
            )
        );
    }
    let here = || matches!(client.server(), Server::Here(_)) && client.is_alive();
    let started = ensure_process(name, client.path(), &here, launcher, ceiling)?;
    Ok((client, started))
}

/// Whether device `name`'s tunnel process had to be started now: one is started, as
/// [`ensure_running`] starts it, unless `alive` says one answers on its socket `socket`; it
/// must answer within `ceiling`. For any tunnel with a socket of its own (the udp backend's).
pub fn ensure_process(
    name: &str,
    socket: &Path,
    alive: &dyn Fn() -> bool,
    launcher: &Launcher,
    ceiling: Duration,
) -> Result<bool, SuperviseError> {
    if alive() {
        return Ok(false);
    }
    let stderr = match launcher.log {
        Some(path) => Stdio::from(
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| SuperviseError::Log(path.to_path_buf(), e))?,
        ),
        None => Stdio::null(),
    };
    let mut cmd = Command::new(launcher.program);
    cmd.args(launcher.args)
        .arg(name)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr);
    // SAFETY: setsid is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| nix::unistd::setsid().map(|_| ()).map_err(io::Error::from));
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| SuperviseError::Spawn(launcher.program.to_path_buf(), e))?;
    let start = Instant::now();
    loop {
        if alive() {
            std::thread::spawn(move || child.wait());
            return Ok(true);
        }
        if let Some(status) = child.try_wait().map_err(SuperviseError::Wait)? {
            return Err(SuperviseError::EndedAtStart {
                name: name.to_string(),
                status,
                log: launcher.log.map(Path::to_path_buf),
            });
        }
        if start.elapsed() > ceiling {
            let _ = child.kill();
            let _ = child.wait();
            return Err(SuperviseError::NoAnswer {
                name: name.to_string(),
                socket: socket.to_path_buf(),
                ceiling,
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
