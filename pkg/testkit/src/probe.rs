//! Servers and probes for connectivity matrices, as Kubernetes' NetworkPolicy e2e suite runs
//! them: in a namespace, a server on each TCP and UDP port asked for (both families, one
//! socket each), answering every connection and datagram; and probes from inside other
//! namespaces, side by side, each asking whether its connection got the server's answer
//! within a short timeout.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Proto {
    Tcp,
    Udp,
}

impl Proto {
    pub fn as_str(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        }
    }
}

impl std::fmt::Display for Proto {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How often the servers look for connections and datagrams.
const POLL: Duration = Duration::from_millis(5);

/// The answer every server gives, so that a probe tells it from anything else.
const ANSWER: &[u8] = b"netpol-probe-answer\n";

fn enter(netns: &Path) -> Result<(), String> {
    let f = File::open(netns).map_err(|e| format!("opening {}: {e}", netns.display()))?;
    nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET)
        .map_err(|e| format!("entering {}: {e}", netns.display()))
}

enum Socket {
    Tcp(TcpListener),
    Udp(UdpSocket),
}

impl Socket {
    fn bind(proto: Proto, port: u16) -> Result<Socket, String> {
        // [::] takes both families (bindv6only is off); 0.0.0.0 where IPv6 is off.
        let any6 = SocketAddr::from((Ipv6Addr::UNSPECIFIED, port));
        let any4 = SocketAddr::from(([0, 0, 0, 0], port));
        let s = match proto {
            Proto::Tcp => TcpListener::bind(any6)
                .or_else(|_| TcpListener::bind(any4))
                .and_then(|l| l.set_nonblocking(true).map(|_| Socket::Tcp(l))),
            Proto::Udp => UdpSocket::bind(any6)
                .or_else(|_| UdpSocket::bind(any4))
                .and_then(|u| u.set_nonblocking(true).map(|_| Socket::Udp(u))),
        };
        s.map_err(|e| format!("listening on {proto} {port}: {e}"))
    }

    /// Answers what is waiting.
    fn serve(&self) {
        match self {
            Socket::Tcp(l) => {
                while let Ok((mut c, _)) = l.accept() {
                    let _ = c.set_nonblocking(false);
                    let _ = c.set_write_timeout(Some(Duration::from_secs(1)));
                    let _ = c.write_all(ANSWER);
                }
            }
            Socket::Udp(u) => {
                let mut buf = [0u8; 512];
                while let Ok((_, from)) = u.recv_from(&mut buf) {
                    let _ = u.send_to(ANSWER, from);
                }
            }
        }
    }
}

/// Servers in one namespace, stopped on drop.
pub struct Servers {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Servers {
    /// Listens inside the network namespace at `netns` on each of `ports`; returns once every
    /// socket is bound.
    pub fn start(netns: &Path, ports: &[(Proto, u16)]) -> Servers {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let (netns, ports, stop2) = (netns.to_path_buf(), ports.to_vec(), stop.clone());
        let thread = std::thread::spawn(move || {
            let bound = enter(&netns).and_then(|_| {
                ports
                    .iter()
                    .map(|(p, n)| Socket::bind(*p, *n))
                    .collect::<Result<Vec<_>, _>>()
            });
            let sockets = match bound {
                Ok(s) => {
                    let _ = tx.send(Ok(()));
                    s
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            // Non-blocking sockets looked at every few milliseconds: one thread per namespace.
            while !stop2.load(Ordering::Relaxed) {
                for s in &sockets {
                    s.serve();
                }
                std::thread::sleep(POLL);
            }
        });
        rx.recv()
            .unwrap_or_else(|_| Err("the server thread died".into()))
            .unwrap_or_else(|e| panic!("starting servers: {e}"));
        Servers {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One probe: from inside the namespace at `from`, `proto` to `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    pub from: PathBuf,
    pub proto: Proto,
    pub to: SocketAddr,
}

fn answered(proto: Proto, to: SocketAddr, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    let left = || {
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    };
    let mut buf = [0u8; 64];
    match proto {
        Proto::Tcp => {
            let Ok(mut c) = TcpStream::connect_timeout(&to, timeout) else {
                return false;
            };
            let _ = c.set_read_timeout(Some(left()));
            let mut got = Vec::new();
            while got.len() < ANSWER.len() {
                match c.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            got == ANSWER
        }
        Proto::Udp => {
            let local: SocketAddr = if to.is_ipv4() {
                ([0, 0, 0, 0], 0).into()
            } else {
                (Ipv6Addr::UNSPECIFIED, 0).into()
            };
            let Ok(u) = UdpSocket::bind(local) else {
                return false;
            };
            if u.connect(to).and_then(|_| u.send(b"probe")).is_err() {
                return false;
            }
            let _ = u.set_read_timeout(Some(left()));
            matches!(u.recv(&mut buf), Ok(n) if buf[..n] == *ANSWER)
        }
    }
}

/// Runs the probes side by side, each with `timeout`; whether each got its answer.
pub fn probe_all(probes: &[Probe], timeout: Duration) -> Vec<bool> {
    std::thread::scope(|s| {
        let handles: Vec<_> = probes
            .iter()
            .map(|p| {
                s.spawn(move || {
                    enter(&p.from).unwrap_or_else(|e| panic!("probe: {e}"));
                    answered(p.proto, p.to, timeout)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    })
}
