//! How flanneld configures and reads the tunnel: one request per connection on the unix socket
//! `<dir>/<interface>.sock`, in lines of text, each request ended by an empty line.
//!
//! ```text
//! get                          ->  listen 192.168.0.1:8285
//!                                  route 10.5.2.0/24 192.168.0.2:8285   (one per route)
//!                                  count sent 1234                      (and the others)
//!                                  (empty line)
//! set                          ->  ok | error <why>
//! listen 192.168.0.1:8285
//! route 10.5.2.0/24 192.168.0.2:8285
//! unroute 10.5.3.0/24
//! (empty line)
//! ```
//!
//! A `set` is applied whole or not at all.

use ipnetwork::Ipv4Network;
use std::io::{self, BufRead, BufReader, Write};
use std::net::SocketAddrV4;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where a tunnel's socket is unless flanneld and the tunnel are told another directory.
pub const SOCKET_DIR: &str = "/run/flannel";

/// What a tunnel holds, as `get` answers it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    /// The address its UDP socket is bound to; None before a `set` gave one.
    pub listen: Option<SocketAddrV4>,
    pub routes: Vec<(Ipv4Network, SocketAddrV4)>,
    /// Its counters by name: `sent`, `received` (packets), `unrouted` (dropped, no route).
    pub counts: Vec<(String, u64)>,
}

impl State {
    pub fn count(&self, name: &str) -> u64 {
        self.counts
            .iter()
            .find(|(n, _)| n == name)
            .map_or(0, |(_, v)| *v)
    }
}

/// A `set`: what to change.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Change {
    pub listen: Option<SocketAddrV4>,
    pub put: Vec<(Ipv4Network, SocketAddrV4)>,
    pub remove: Vec<Ipv4Network>,
}

/// The socket of `interface`'s tunnel in `dir`.
pub fn socket_path(dir: &Path, interface: &str) -> PathBuf {
    dir.join(format!("{interface}.sock"))
}

fn bad(line: &str, why: &str) -> String {
    format!("{line:?}: {why}")
}

fn word<'a>(
    words: &mut impl Iterator<Item = &'a str>,
    line: &str,
    what: &str,
) -> Result<&'a str, String> {
    words
        .next()
        .ok_or_else(|| bad(line, &format!("{what} missing")))
}

fn endpoint(s: &str, line: &str) -> Result<SocketAddrV4, String> {
    s.parse()
        .map_err(|_| bad(line, &format!("{s} is not an IPv4 address and port")))
}

fn subnet(s: &str, line: &str) -> Result<Ipv4Network, String> {
    s.parse::<Ipv4Network>()
        .map_err(|_| bad(line, &format!("{s} is not an IPv4 subnet")))
}

impl State {
    pub fn format(&self) -> String {
        let mut out = String::new();
        if let Some(l) = self.listen {
            out.push_str(&format!("listen {l}\n"));
        }
        for (net, to) in &self.routes {
            out.push_str(&format!("route {net} {to}\n"));
        }
        for (name, v) in &self.counts {
            out.push_str(&format!("count {name} {v}\n"));
        }
        out.push('\n');
        out
    }

    pub fn parse(text: &str) -> Result<State, String> {
        let mut s = State::default();
        for line in text.lines().take_while(|l| !l.is_empty()) {
            let mut w = line.split_whitespace();
            match w.next() {
                Some("listen") => {
                    s.listen = Some(endpoint(word(&mut w, line, "the address")?, line)?)
                }
                Some("route") => {
                    let net = subnet(word(&mut w, line, "the subnet")?, line)?;
                    let to = endpoint(word(&mut w, line, "the endpoint")?, line)?;
                    s.routes.push((net, to));
                }
                Some("count") => {
                    let name = word(&mut w, line, "the name")?.to_string();
                    let v = word(&mut w, line, "the value")?
                        .parse()
                        .map_err(|_| bad(line, "the value is not a number"))?;
                    s.counts.push((name, v));
                }
                _ => return Err(bad(line, "not a line of the tunnel's state")),
            }
        }
        Ok(s)
    }
}

impl Change {
    pub fn is_empty(&self) -> bool {
        self.listen.is_none() && self.put.is_empty() && self.remove.is_empty()
    }

    /// The `set` request.
    pub fn format(&self) -> String {
        let mut out = String::from("set\n");
        if let Some(l) = self.listen {
            out.push_str(&format!("listen {l}\n"));
        }
        for net in &self.remove {
            out.push_str(&format!("unroute {net}\n"));
        }
        for (net, to) in &self.put {
            out.push_str(&format!("route {net} {to}\n"));
        }
        out.push('\n');
        out
    }

    /// A `set` request's lines (after `set`).
    pub fn parse<'a>(lines: impl IntoIterator<Item = &'a str>) -> Result<Change, String> {
        let mut c = Change::default();
        for line in lines {
            let mut w = line.split_whitespace();
            match w.next() {
                Some("listen") => {
                    c.listen = Some(endpoint(word(&mut w, line, "the address")?, line)?)
                }
                Some("route") => {
                    let net = subnet(word(&mut w, line, "the subnet")?, line)?;
                    let to = endpoint(word(&mut w, line, "the endpoint")?, line)?;
                    c.put.push((net, to));
                }
                Some("unroute") => c
                    .remove
                    .push(subnet(word(&mut w, line, "the subnet")?, line)?),
                _ => return Err(bad(line, "not a set line (listen, route, unroute)")),
            }
            if w.next().is_some() {
                return Err(bad(line, "more words than it takes"));
            }
        }
        Ok(c)
    }
}

/// What a request asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Get,
    Set(Change),
}

/// Reads one request (up to its empty line) from `r`.
pub fn read_request(r: &mut impl BufRead) -> Result<Request, String> {
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        match r.read_line(&mut line) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => return Err(format!("reading the request: {e}")),
        }
        let line = line.trim_end().to_string();
        if line.is_empty() {
            break;
        }
        lines.push(line);
    }
    match lines.split_first() {
        Some((first, rest)) if first == "get" && rest.is_empty() => Ok(Request::Get),
        Some((first, rest)) if first == "set" => {
            Change::parse(rest.iter().map(String::as_str)).map(Request::Set)
        }
        Some((first, _)) => Err(format!("{first:?} is not a request (get or set)")),
        None => Err("an empty request".into()),
    }
}

/// The control socket of `interface`'s tunnel in `dir`, made anew (a stale one from a tunnel
/// that died is removed, a live one refused).
pub fn listen(dir: &Path, interface: &str) -> io::Result<(UnixListener, PathBuf)> {
    std::fs::create_dir_all(dir)?;
    let path = socket_path(dir, interface);
    if Client::at(&path).is_alive() {
        return Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!("a tunnel already answers on {}", path.display()),
        ));
    }
    let _ = std::fs::remove_file(&path);
    Ok((UnixListener::bind(&path)?, path))
}

/// flanneld's side of a tunnel's socket.
#[derive(Debug, Clone)]
pub struct Client {
    path: PathBuf,
}

const TIMEOUT: Duration = Duration::from_secs(5);

impl Client {
    pub fn at(path: &Path) -> Client {
        Client {
            path: path.to_path_buf(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn ask(&self, request: &str) -> io::Result<String> {
        let mut s = UnixStream::connect(&self.path)?;
        s.set_read_timeout(Some(TIMEOUT))?;
        s.set_write_timeout(Some(TIMEOUT))?;
        s.write_all(request.as_bytes())?;
        let mut answer = String::new();
        let mut r = BufReader::new(s);
        loop {
            let mut line = String::new();
            if r.read_line(&mut line)? == 0 || line == "\n" {
                break;
            }
            answer.push_str(&line);
        }
        Ok(answer)
    }

    /// What the tunnel holds.
    pub fn get(&self) -> io::Result<State> {
        let answer = self.ask("get\n\n")?;
        State::parse(&answer).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    /// Applies `change`, whole or not at all.
    pub fn set(&self, change: &Change) -> io::Result<()> {
        let answer = self.ask(&change.format())?;
        match answer.trim_end() {
            "ok" => Ok(()),
            other => Err(io::Error::other(
                other.strip_prefix("error ").unwrap_or(other).to_string(),
            )),
        }
    }

    /// Whether a tunnel answers on the socket.
    pub fn is_alive(&self) -> bool {
        self.get().is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_reads_back_as_written() {
        let s = State {
            listen: "192.168.0.1:8285".parse().ok(),
            routes: vec![(
                "10.5.2.0/24".parse().unwrap(),
                "192.168.0.2:8285".parse().unwrap(),
            )],
            counts: vec![("sent".into(), 7)],
        };
        assert_eq!(State::parse(&s.format()).unwrap(), s);
        assert_eq!(s.count("sent"), 7);
        assert_eq!(s.count("received"), 0);
        assert_eq!(State::parse("\n").unwrap(), State::default());
        let e = State::parse("route 10.5.2.0/24\n").unwrap_err();
        assert!(e.contains("the endpoint missing"), "{e}");
    }

    #[test]
    fn a_set_request_reads_back_and_refuses_what_it_cannot_apply() {
        let c = Change {
            listen: "192.168.0.1:8285".parse().ok(),
            put: vec![(
                "10.5.2.0/24".parse().unwrap(),
                "192.168.0.2:8285".parse().unwrap(),
            )],
            remove: vec!["10.5.3.0/24".parse().unwrap()],
        };
        let text = c.format();
        assert!(
            text.starts_with("set\n") && text.ends_with("\n\n"),
            "{text:?}"
        );
        let mut r = std::io::Cursor::new(text);
        assert_eq!(read_request(&mut r).unwrap(), Request::Set(c));
        let mut get = std::io::Cursor::new("get\n\n");
        assert_eq!(read_request(&mut get).unwrap(), Request::Get);
        for (text, why) in [
            (
                "set\nroute 10.5.2.0/24 fd00::1:8285\n\n",
                "not an IPv4 address and port",
            ),
            (
                "set\nroute 10.5.2.0/33 192.168.0.2:8285\n\n",
                "not an IPv4 subnet",
            ),
            (
                "set\nroute 10.5.2.0/24 192.168.0.2:8285 x\n\n",
                "more words",
            ),
            ("set\ndelete all\n\n", "not a set line"),
            ("put\n\n", "not a request"),
            ("\n", "an empty request"),
        ] {
            let e = read_request(&mut std::io::Cursor::new(text)).unwrap_err();
            assert!(e.contains(why), "{text:?}: {e}");
        }
    }
}
