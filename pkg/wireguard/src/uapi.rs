//! WireGuard's cross-platform UAPI: `get=1` / `set=1` text over a unix socket in
//! /var/run/wireguard, which `wg` speaks to userspace devices (wireguard-go, ours). The same
//! types describe a device for the kernel path (`genl`).

use std::fmt::Write as _;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnetwork::IpNetwork;

use crate::key::Key;

/// Where userspace devices put their sockets, as `wg` and wireguard-go expect.
pub const SOCKET_DIR: &str = "/var/run/wireguard";

/// A `set=1` operation: what to change on a device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceConfig {
    pub private_key: Option<Key>,
    pub listen_port: Option<u16>,
    pub fwmark: Option<u32>,
    pub replace_peers: bool,
    pub peers: Vec<PeerConfig>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerConfig {
    pub public_key: Key,
    pub remove: bool,
    pub update_only: bool,
    /// `Some(zero key)` clears it.
    pub preshared_key: Option<Key>,
    pub endpoint: Option<SocketAddr>,
    /// Seconds; `Some(0)` turns it off.
    pub persistent_keepalive: Option<u16>,
    pub replace_allowed_ips: bool,
    pub allowed_ips: Vec<IpNetwork>,
}

impl PeerConfig {
    pub fn new(public_key: Key) -> PeerConfig {
        PeerConfig {
            public_key,
            remove: false,
            update_only: false,
            preshared_key: None,
            endpoint: None,
            persistent_keepalive: None,
            replace_allowed_ips: false,
            allowed_ips: Vec::new(),
        }
    }
}

/// What a device holds: the answer to `get=1`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceState {
    pub private_key: Option<Key>,
    pub listen_port: u16,
    pub fwmark: u32,
    pub peers: Vec<PeerState>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerState {
    pub public_key: Key,
    pub preshared_key: Option<Key>,
    pub endpoint: Option<SocketAddr>,
    pub persistent_keepalive: u16,
    pub allowed_ips: Vec<IpNetwork>,
    /// Since the Unix epoch; None when no handshake completed.
    pub last_handshake: Option<Duration>,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
}

impl PeerState {
    pub fn new(public_key: Key) -> PeerState {
        PeerState {
            public_key,
            preshared_key: None,
            endpoint: None,
            persistent_keepalive: 0,
            allowed_ips: Vec::new(),
            last_handshake: None,
            rx_bytes: 0,
            tx_bytes: 0,
        }
    }
}

/// A UAPI request that cannot be carried out; `errno` is what the answer carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UapiError {
    pub errno: i32,
    pub message: String,
}

impl UapiError {
    pub fn invalid(message: impl Into<String>) -> UapiError {
        UapiError {
            errno: libc::EINVAL,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for UapiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (errno {})", self.message, self.errno)
    }
}

impl std::error::Error for UapiError {}

fn flag(key: &str, value: &str) -> Result<bool, UapiError> {
    match value {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(UapiError::invalid(format!(
            "{key}={value}: not true or false"
        ))),
    }
}

fn number<T: std::str::FromStr>(key: &str, value: &str) -> Result<T, UapiError> {
    value
        .parse()
        .map_err(|_| UapiError::invalid(format!("{key}={value}: not a number in range")))
}

fn hex_key(key: &str, value: &str) -> Result<Key, UapiError> {
    Key::from_hex(value).map_err(|e| UapiError::invalid(format!("{key}: {e}")))
}

fn endpoint(value: &str) -> Result<SocketAddr, UapiError> {
    value
        .parse()
        .map_err(|_| UapiError::invalid(format!("endpoint={value}: not an address and port")))
}

fn allowed_ip(value: &str) -> Result<IpNetwork, UapiError> {
    value
        .parse()
        .map_err(|_| UapiError::invalid(format!("allowed_ip={value}: not an address/prefix")))
}

/// Parses the body of a `set=1` request: the lines after `set=1`, up to the blank line.
pub fn parse_set<'a>(lines: impl IntoIterator<Item = &'a str>) -> Result<DeviceConfig, UapiError> {
    let mut config = DeviceConfig::default();
    for line in lines {
        let (key, value) = line
            .split_once('=')
            .ok_or_else(|| UapiError::invalid(format!("{line:?}: not key=value")))?;
        let peer = config.peers.last_mut();
        match (key, peer) {
            ("public_key", _) => config.peers.push(PeerConfig::new(hex_key(key, value)?)),
            ("private_key", None) => config.private_key = Some(hex_key(key, value)?),
            ("listen_port", None) => config.listen_port = Some(number(key, value)?),
            ("fwmark", None) => config.fwmark = Some(number(key, value)?),
            ("replace_peers", None) => config.replace_peers = flag(key, value)?,
            ("remove", Some(p)) => p.remove = flag(key, value)?,
            ("update_only", Some(p)) => p.update_only = flag(key, value)?,
            ("preshared_key", Some(p)) => p.preshared_key = Some(hex_key(key, value)?),
            ("endpoint", Some(p)) => p.endpoint = Some(endpoint(value)?),
            ("persistent_keepalive_interval", Some(p)) => {
                p.persistent_keepalive = Some(number(key, value)?)
            }
            ("replace_allowed_ips", Some(p)) => p.replace_allowed_ips = flag(key, value)?,
            ("allowed_ip", Some(p)) => p.allowed_ips.push(allowed_ip(value)?),
            ("protocol_version", Some(_)) if value == "1" => {}
            ("protocol_version", Some(_)) => {
                return Err(UapiError::invalid(format!(
                    "protocol_version={value}: only 1 is known"
                )))
            }
            _ => {
                return Err(UapiError::invalid(format!(
                    "{key}: not a key here (device keys come before the first public_key)"
                )))
            }
        }
    }
    Ok(config)
}

impl DeviceConfig {
    /// The `set=1` request, blank line included.
    pub fn to_uapi(&self) -> String {
        let mut s = String::from("set=1\n");
        if let Some(k) = &self.private_key {
            let _ = writeln!(s, "private_key={}", k.to_hex());
        }
        if let Some(p) = self.listen_port {
            let _ = writeln!(s, "listen_port={p}");
        }
        if let Some(m) = self.fwmark {
            let _ = writeln!(s, "fwmark={m}");
        }
        if self.replace_peers {
            s.push_str("replace_peers=true\n");
        }
        for p in &self.peers {
            let _ = writeln!(s, "public_key={}", p.public_key.to_hex());
            if p.remove {
                s.push_str("remove=true\n");
                continue;
            }
            if p.update_only {
                s.push_str("update_only=true\n");
            }
            if let Some(k) = &p.preshared_key {
                let _ = writeln!(s, "preshared_key={}", k.to_hex());
            }
            if let Some(e) = p.endpoint {
                let _ = writeln!(s, "endpoint={e}");
            }
            if let Some(k) = p.persistent_keepalive {
                let _ = writeln!(s, "persistent_keepalive_interval={k}");
            }
            if p.replace_allowed_ips {
                s.push_str("replace_allowed_ips=true\n");
            }
            for ip in &p.allowed_ips {
                let _ = writeln!(s, "allowed_ip={ip}");
            }
        }
        s.push('\n');
        s
    }
}

impl DeviceState {
    /// The body of the answer to `get=1`, without the closing `errno=` line.
    pub fn to_uapi(&self) -> String {
        let mut s = String::new();
        if let Some(k) = &self.private_key {
            let _ = writeln!(s, "private_key={}", k.to_hex());
        }
        if self.listen_port != 0 {
            let _ = writeln!(s, "listen_port={}", self.listen_port);
        }
        if self.fwmark != 0 {
            let _ = writeln!(s, "fwmark={}", self.fwmark);
        }
        for p in &self.peers {
            let _ = writeln!(s, "public_key={}", p.public_key.to_hex());
            if let Some(k) = &p.preshared_key {
                let _ = writeln!(s, "preshared_key={}", k.to_hex());
            }
            s.push_str("protocol_version=1\n");
            if let Some(e) = p.endpoint {
                let _ = writeln!(s, "endpoint={e}");
            }
            let hs = p.last_handshake.unwrap_or_default();
            let _ = writeln!(s, "last_handshake_time_sec={}", hs.as_secs());
            let _ = writeln!(s, "last_handshake_time_nsec={}", hs.subsec_nanos());
            let _ = writeln!(s, "tx_bytes={}", p.tx_bytes);
            let _ = writeln!(s, "rx_bytes={}", p.rx_bytes);
            let _ = writeln!(
                s,
                "persistent_keepalive_interval={}",
                p.persistent_keepalive
            );
            for ip in &p.allowed_ips {
                let _ = writeln!(s, "allowed_ip={ip}");
            }
        }
        s
    }
}

/// Parses the answer to `get=1` up to (not including) its `errno=` line.
pub fn parse_get<'a>(lines: impl IntoIterator<Item = &'a str>) -> Result<DeviceState, UapiError> {
    let mut state = DeviceState::default();
    let mut handshake_secs = 0u64;
    let mut handshake_nanos = 0u32;
    let close_peer = |state: &mut DeviceState, secs: &mut u64, nanos: &mut u32| {
        if let Some(p) = state.peers.last_mut() {
            if *secs != 0 || *nanos != 0 {
                p.last_handshake = Some(Duration::new(*secs, *nanos));
            }
        }
        *secs = 0;
        *nanos = 0;
    };
    for line in lines {
        let (key, value) = line
            .split_once('=')
            .ok_or_else(|| UapiError::invalid(format!("{line:?}: not key=value")))?;
        if key == "public_key" {
            close_peer(&mut state, &mut handshake_secs, &mut handshake_nanos);
            state.peers.push(PeerState::new(hex_key(key, value)?));
            continue;
        }
        match (key, state.peers.last_mut()) {
            ("private_key", None) => state.private_key = Some(hex_key(key, value)?),
            ("listen_port", None) => state.listen_port = number(key, value)?,
            ("fwmark", None) => state.fwmark = number(key, value)?,
            ("preshared_key", Some(p)) => {
                let k = hex_key(key, value)?;
                p.preshared_key = (!k.is_zero()).then_some(k);
            }
            ("endpoint", Some(p)) => p.endpoint = Some(endpoint(value)?),
            ("last_handshake_time_sec", Some(_)) => handshake_secs = number(key, value)?,
            ("last_handshake_time_nsec", Some(_)) => handshake_nanos = number(key, value)?,
            ("tx_bytes", Some(p)) => p.tx_bytes = number(key, value)?,
            ("rx_bytes", Some(p)) => p.rx_bytes = number(key, value)?,
            ("persistent_keepalive_interval", Some(p)) => {
                p.persistent_keepalive = number(key, value)?
            }
            ("allowed_ip", Some(p)) => p.allowed_ips.push(allowed_ip(value)?),
            // Known keys this model does not keep, and keys of later protocol versions.
            _ => {}
        }
    }
    close_peer(&mut state, &mut handshake_secs, &mut handshake_nanos);
    Ok(state)
}

/// The socket of userspace device `name` in `dir`.
pub fn socket_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.sock"))
}

/// Who serves a device's UAPI socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    /// Nobody: no socket, or nothing listening on it.
    None,
    /// A process in the caller's network namespace (its pid).
    Here(u32),
    /// A process in another network namespace, or one this PID namespace does not show.
    Elsewhere(Option<u32>),
}

/// The pid of the process that listens on the other end of `stream`.
fn peer_pid(stream: &UnixStream) -> Option<u32> {
    // SAFETY: ucred is plain data; all-zero is valid.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED writes a ucred of the length given.
    let r = unsafe {
        libc::getsockopt(
            std::os::fd::AsRawFd::as_raw_fd(stream),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (r == 0 && cred.pid > 0).then_some(cred.pid as u32)
}

/// Whether process `pid` runs in the calling thread's network namespace.
fn in_this_netns(pid: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    let ns = |path: &str| std::fs::metadata(path).map(|m| (m.dev(), m.ino())).ok();
    let theirs = ns(&format!("/proc/{pid}/ns/net"));
    theirs.is_some() && theirs == ns("/proc/thread-self/ns/net")
}

/// A client of one userspace device's UAPI socket.
#[derive(Debug, Clone)]
pub struct UapiClient {
    path: PathBuf,
}

/// What went wrong talking to a device's socket.
#[derive(Debug)]
pub enum ClientError {
    Io(PathBuf, io::Error),
    Device(PathBuf, UapiError),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::Io(p, e) => write!(f, "WireGuard UAPI socket {}: {e}", p.display()),
            ClientError::Device(p, e) => write!(f, "WireGuard UAPI socket {}: {e}", p.display()),
        }
    }
}

impl std::error::Error for ClientError {}

impl UapiClient {
    /// The client of device `name` in /var/run/wireguard.
    pub fn new(name: &str) -> UapiClient {
        UapiClient::in_dir(Path::new(SOCKET_DIR), name)
    }

    pub fn in_dir(dir: &Path, name: &str) -> UapiClient {
        UapiClient {
            path: socket_path(dir, name),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether a device answers on the socket.
    pub fn is_alive(&self) -> bool {
        self.get().is_ok()
    }

    /// Who serves the socket, seen from the calling thread's network namespace. The socket
    /// directory is one for every namespace: a device of the same name in another namespace
    /// (a test node deleted, a container not cleaned up) answers here too.
    pub fn server(&self) -> Server {
        let Ok(stream) = UnixStream::connect(&self.path) else {
            return Server::None;
        };
        match peer_pid(&stream) {
            Some(pid) if in_this_netns(pid) => Server::Here(pid),
            pid => Server::Elsewhere(pid),
        }
    }

    fn exchange(&self, request: &str) -> Result<Vec<String>, ClientError> {
        let io_err = |e| ClientError::Io(self.path.clone(), e);
        let mut stream = UnixStream::connect(&self.path).map_err(io_err)?;
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(io_err)?;
        stream.write_all(request.as_bytes()).map_err(io_err)?;
        let mut lines = Vec::new();
        let mut reader = BufReader::new(stream);
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).map_err(io_err)? == 0 {
                return Err(io_err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the device closed the socket before answering",
                )));
            }
            let line = line.trim_end_matches('\n');
            if let Some(errno) = line.strip_prefix("errno=") {
                let errno: i32 = errno.parse().unwrap_or(libc::EPROTO);
                if errno != 0 {
                    return Err(ClientError::Device(
                        self.path.clone(),
                        UapiError {
                            errno: errno.abs(),
                            message: format!(
                                "the device refused the request: {}",
                                io::Error::from_raw_os_error(errno.abs())
                            ),
                        },
                    ));
                }
                return Ok(lines);
            }
            if line.is_empty() {
                return Ok(lines);
            }
            lines.push(line.to_string());
        }
    }

    pub fn get(&self) -> Result<DeviceState, ClientError> {
        let lines = self.exchange("get=1\n\n")?;
        parse_get(lines.iter().map(String::as_str))
            .map_err(|e| ClientError::Device(self.path.clone(), e))
    }

    pub fn set(&self, config: &DeviceConfig) -> Result<(), ClientError> {
        self.exchange(&config.to_uapi()).map(|_| ())
    }
}

/// The family of a peer's endpoint, for choosing its socket.
pub fn is_v6(addr: &SocketAddr) -> bool {
    matches!(addr.ip(), IpAddr::V6(v6) if v6.to_ipv4_mapped().is_none())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> Key {
        Key([b; 32])
    }

    #[test]
    fn set_request_round_trips_through_its_text() {
        let mut peer = PeerConfig::new(key(2));
        peer.preshared_key = Some(key(3));
        peer.endpoint = Some("[2001:db8::1]:51821".parse().unwrap());
        peer.persistent_keepalive = Some(25);
        peer.replace_allowed_ips = true;
        peer.allowed_ips = vec!["10.5.1.0/24".parse().unwrap(), "fd00::/64".parse().unwrap()];
        let mut gone = PeerConfig::new(key(4));
        gone.remove = true;
        let config = DeviceConfig {
            private_key: Some(key(1)),
            listen_port: Some(51820),
            fwmark: None,
            replace_peers: true,
            peers: vec![peer, gone],
        };
        let text = config.to_uapi();
        assert!(text.starts_with("set=1\nprivate_key=0101"), "{text}");
        assert!(text.contains("\nendpoint=[2001:db8::1]:51821\n"), "{text}");
        assert!(text.contains("\nremove=true\n"), "{text}");
        assert!(text.ends_with("\n\n"));
        let body = text.lines().skip(1).take_while(|l| !l.is_empty());
        assert_eq!(parse_set(body).unwrap(), config);
    }

    #[test]
    fn what_wg_set_sends_parses() {
        // As `wg set dev peer <key> endpoint 192.0.2.1:51820 allowed-ips 10.0.0.0/24` sends it.
        let text = format!(
            "public_key={}\nendpoint=192.0.2.1:51820\nreplace_allowed_ips=true\nallowed_ip=10.0.0.0/24\n",
            key(9).to_hex()
        );
        let config = parse_set(text.lines()).unwrap();
        assert_eq!(config.private_key, None);
        assert_eq!(config.peers.len(), 1);
        let p = &config.peers[0];
        assert_eq!(p.endpoint, Some("192.0.2.1:51820".parse().unwrap()));
        assert!(p.replace_allowed_ips);
        assert_eq!(p.allowed_ips, vec!["10.0.0.0/24".parse().unwrap()]);
    }

    #[test]
    fn bad_set_lines_are_refused_with_einval_naming_the_line() {
        for (line, needle) in [
            ("listen_port=99999", "listen_port=99999"),
            ("private_key=abc", "private_key"),
            ("bogus", "not key=value"),
            ("remove=true", "remove"),
            ("replace_peers=yes", "replace_peers=yes"),
        ] {
            let err = parse_set([line]).unwrap_err();
            assert_eq!(err.errno, libc::EINVAL);
            assert!(err.message.contains(needle), "{line}: {err}");
        }
    }

    #[test]
    fn get_answer_round_trips_through_its_text() {
        let mut peer = PeerState::new(key(7));
        peer.endpoint = Some("192.0.2.7:51820".parse().unwrap());
        peer.allowed_ips = vec!["10.5.7.0/24".parse().unwrap()];
        peer.last_handshake = Some(Duration::new(1_700_000_000, 5));
        peer.rx_bytes = 10;
        peer.tx_bytes = 20;
        peer.persistent_keepalive = 5;
        let state = DeviceState {
            private_key: Some(key(1)),
            listen_port: 51820,
            fwmark: 0,
            peers: vec![peer, PeerState::new(key(8))],
        };
        let text = state.to_uapi();
        assert!(text.contains("protocol_version=1\n"));
        assert!(!text.contains("fwmark"));
        assert_eq!(parse_get(text.lines()).unwrap(), state);
    }
}
