//! `flannel-udp <interface> [--socket-dir DIR]`: the TUN device of flanneld's `udp` backend
//! and the proxy that carries its packets in UDP, configured through
//! `<DIR>/<interface>.sock` (`udptunnel::control`). A process of its own, started by flanneld
//! and left running when flanneld stops, so that pods keep talking across its restart; it
//! ends on SIGTERM or when its interface is deleted.

use std::io::{BufReader, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::thread;
use udptunnel::control::{self, Request, SOCKET_DIR};
use udptunnel::proxy::Tunnel;

const USAGE: &str = "usage: flannel-udp <interface> [--socket-dir DIR]";

fn usage(why: &str) -> ExitCode {
    eprintln!("flannel-udp: {why}\n{USAGE}");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut name = None;
    let mut dir = PathBuf::from(SOCKET_DIR);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--socket-dir" => match args.next() {
                Some(d) => dir = PathBuf::from(d),
                None => return usage("--socket-dir needs a directory"),
            },
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            _ if arg.starts_with('-') => return usage(&format!("unknown flag {arg}")),
            _ if name.is_none() => name = Some(arg),
            _ => return usage(&format!("unexpected argument {arg}")),
        }
    }
    let Some(name) = name else {
        return usage("the interface name is missing");
    };
    let (listener, path) = match control::listen(&dir, &name) {
        Ok(l) => l,
        Err(e) => {
            eprintln!(
                "flannel-udp {name}: control socket in {}: {e}",
                dir.display()
            );
            return ExitCode::from(1);
        }
    };
    let tunnel = match Tunnel::open(&name) {
        Ok(t) => t,
        Err(e) => {
            let _ = std::fs::remove_file(&path);
            eprintln!("flannel-udp {name}: opening the TUN device: {e}");
            return ExitCode::from(1);
        }
    };
    let served = tunnel.clone();
    let server = thread::Builder::new()
        .name("udp-control".into())
        .spawn(move || serve(listener, &served));
    if let Err(e) = server {
        eprintln!("flannel-udp {name}: starting the control thread: {e}");
        return ExitCode::from(1);
    }
    eprintln!("flannel-udp {name}: serving on {}", path.display());
    let why = tunnel.outbound();
    let _ = std::fs::remove_file(&path);
    eprintln!("flannel-udp {name}: the device is gone ({why}); ending");
    ExitCode::SUCCESS
}

/// Answers one request per connection, one connection at a time.
fn serve(listener: std::os::unix::net::UnixListener, tunnel: &Arc<Tunnel>) {
    for conn in listener.incoming() {
        let Ok(mut conn) = conn else { continue };
        let _ = conn.set_read_timeout(Some(std::time::Duration::from_secs(5)));
        let answer = match control::read_request(&mut BufReader::new(&conn)) {
            Ok(Request::Get) => tunnel.state().format(),
            Ok(Request::Set(change)) => match tunnel.apply(&change) {
                Ok(()) => "ok\n\n".to_string(),
                Err(e) => format!("error {e}\n\n"),
            },
            Err(e) => format!("error {e}\n\n"),
        };
        let _ = conn.write_all(answer.as_bytes());
    }
}
