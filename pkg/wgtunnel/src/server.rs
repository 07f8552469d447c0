//! The UAPI socket of a userspace device: `get=1` and `set=1` from `wg` and flanneld.

use std::fs;
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use crate::Device;
use wireguard::uapi::{parse_set, socket_path, Server, UapiClient, UapiError};

/// Binds `<dir>/<name>.sock`, refusing when a live device already answers there.
pub fn listen(dir: &Path, name: &str) -> io::Result<(UnixListener, PathBuf)> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)?;
    let path = socket_path(dir, name);
    match UapiClient::in_dir(dir, name).server() {
        Server::None => {}
        Server::Here(pid) => {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!(
                    "{}: another process (pid {pid}) serves device {name}",
                    path.display()
                ),
            ))
        }
        // The directory is every namespace's: this namespace's device gets the socket.
        Server::Elsewhere(pid) => eprintln!(
            "{name}: {} was served from another network namespace ({}); taking it over",
            path.display(),
            pid.map_or("a pid not shown here".to_string(), |p| format!("pid {p}"))
        ),
    }
    match fs::remove_file(&path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let listener = UnixListener::bind(&path)?;
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600))?;
    Ok((listener, path))
}

/// Serves the socket until the device stops.
pub fn serve(listener: UnixListener, dev: Arc<Device>) {
    thread::Builder::new()
        .name("uapi".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                // One client at a time: operations apply in the order they came.
                if let Err(e) = handle(conn, &dev) {
                    if e.kind() != io::ErrorKind::BrokenPipe {
                        eprintln!("{}: UAPI client: {e}", dev.name());
                    }
                }
            }
        })
        .expect("spawning the UAPI thread");
}

fn handle(conn: UnixStream, dev: &Arc<Device>) -> io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut writer = conn.try_clone()?;
    let mut reader = BufReader::new(conn);
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        match line.trim_end_matches('\n') {
            "get=1" => {
                let body = read_body(&mut reader)?;
                let answer = if body.is_empty() {
                    format!("{}errno=0\n\n", dev.state().to_uapi())
                } else {
                    errno_line(&UapiError::invalid("get=1 takes no arguments"))
                };
                writer.write_all(answer.as_bytes())?;
            }
            "set=1" => {
                let body = read_body(&mut reader)?;
                let result = parse_set(body.iter().map(String::as_str))
                    .and_then(|config| dev.apply(&config));
                let answer = match result {
                    Ok(()) => "errno=0\n\n".to_string(),
                    Err(e) => {
                        eprintln!("{}: refused a set: {e}", dev.name());
                        errno_line(&e)
                    }
                };
                writer.write_all(answer.as_bytes())?;
            }
            other => {
                let e = UapiError::invalid(format!("{other:?}: not get=1 or set=1"));
                writer.write_all(errno_line(&e).as_bytes())?;
                return Ok(());
            }
        }
    }
}

/// wireguard-go answers a failure with the negated errno, and `wg` reads it so.
fn errno_line(e: &UapiError) -> String {
    format!("errno={}\n\n", -e.errno.abs())
}

fn read_body(reader: &mut impl BufRead) -> io::Result<Vec<String>> {
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the request ended before its blank line",
            ));
        }
        let line = line.trim_end_matches('\n');
        if line.is_empty() {
            return Ok(lines);
        }
        lines.push(line.to_string());
    }
}
