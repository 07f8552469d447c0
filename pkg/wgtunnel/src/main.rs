//! `flannel-wireguard <interface>`: a userspace WireGuard device over TUN, configured through
//! /var/run/wireguard/<interface>.sock as wireguard-go is (so `wg` shows and sets it). It runs
//! until SIGTERM/SIGINT or until its interface is deleted; pods keep talking across a
//! restart of the flanneld that started it.

use std::path::PathBuf;
use std::process::ExitCode;
use std::thread;

use wgtunnel::{server, Device};
use wireguard::uapi::SOCKET_DIR;

const USAGE: &str =
    "usage: flannel-wireguard <interface> [--socket-dir DIR] [--queues N] [--workers N]";

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut name = None;
    let mut dir = PathBuf::from(SOCKET_DIR);
    // One TUN queue keeps each peer's packets in counter order on the wire; the crypto is
    // spread over the cores by the workers, one fewer than the cores (the readers work too).
    let mut queues = 1;
    let mut workers = thread::available_parallelism().map_or(0, |n| n.get().min(8) - 1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--socket-dir" => match args.next() {
                Some(d) => dir = PathBuf::from(d),
                None => return usage("--socket-dir needs a directory"),
            },
            "--queues" => match args.next().and_then(|n| n.parse().ok()).filter(|n| *n >= 1) {
                Some(n) => queues = n,
                None => return usage("--queues needs a number of at least 1"),
            },
            "--workers" => match args.next().and_then(|n| n.parse().ok()) {
                Some(n) => workers = n,
                None => return usage("--workers needs a number"),
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

    // Signals go to one thread that stops the device; the others never see them.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: set is a valid sigset_t; blocking before any thread starts covers them all.
    unsafe {
        libc::sigemptyset(&mut set);
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }

    let (listener, sock_path) = match server::listen(&dir, &name) {
        Ok(l) => l,
        Err(e) => {
            eprintln!(
                "flannel-wireguard {name}: UAPI socket in {}: {e}",
                dir.display()
            );
            return ExitCode::from(1);
        }
    };
    let dev = match Device::start(&name, queues, workers) {
        Ok(d) => d,
        Err(e) => {
            let _ = std::fs::remove_file(&sock_path);
            eprintln!("flannel-wireguard {name}: creating the device: {e}");
            return ExitCode::from(1);
        }
    };
    server::serve(listener, dev.clone());
    let d = dev.clone();
    thread::spawn(move || {
        let mut sig: libc::c_int = 0;
        // SAFETY: waits on the set blocked above.
        unsafe { libc::sigwait(&set, &mut sig) };
        d.stop(format!("signal {sig}"));
    });
    eprintln!(
        "flannel-wireguard {name}: serving {} with {queues} queue(s), {workers} crypto worker(s), TUN offloads {:#x}",
        sock_path.display(),
        dev.offloads()
    );
    let reason = dev.wait();
    let _ = std::fs::remove_file(&sock_path);
    eprintln!("flannel-wireguard {name}: stopped: {reason}");
    ExitCode::SUCCESS
}

fn usage(problem: &str) -> ExitCode {
    eprintln!("flannel-wireguard: {problem}\n{USAGE}");
    ExitCode::from(2)
}
