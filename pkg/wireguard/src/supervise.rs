//! The userspace tunnel as a process of its own: started when no process answers on the
//! device's socket, left running when its starter ends, so pods keep talking across a
//! restart of flanneld.

use std::fs::OpenOptions;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::uapi::{Server, UapiClient};

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
) -> io::Result<(UapiClient, bool)> {
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
) -> io::Result<bool> {
    if alive() {
        return Ok(false);
    }
    let stderr = match launcher.log {
        Some(path) => Stdio::from(OpenOptions::new().create(true).append(true).open(path)?),
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
    let mut child = cmd.spawn().map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("starting {}: {e}", launcher.program.display()),
        )
    })?;
    let start = Instant::now();
    loop {
        if alive() {
            std::thread::spawn(move || child.wait());
            return Ok(true);
        }
        if let Some(status) = child.try_wait()? {
            let log = launcher
                .log
                .map(|p| format!(" (its log: {})", p.display()))
                .unwrap_or_default();
            return Err(io::Error::other(format!(
                "the tunnel process for {name} ended at start, {status}{log}"
            )));
        }
        if start.elapsed() > ceiling {
            let _ = child.kill();
            let _ = child.wait();
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the tunnel process for {name} did not answer on {} within {ceiling:?}",
                    socket.display()
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
