//! systemd's readiness protocol: `READY=1` as a datagram to `$NOTIFY_SOCKET`.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// Sends `state` when systemd asked for it; says what went wrong otherwise.
pub fn notify(state: &str) -> Result<bool, String> {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(false);
    };
    let path = path.to_string_lossy().into_owned();
    let addr = match path.strip_prefix('@') {
        Some(name) => SocketAddr::from_abstract_name(name.as_bytes()),
        None => SocketAddr::from_pathname(&path),
    }
    .map_err(|e| format!("NOTIFY_SOCKET {path}: {e}"))?;
    let sock = UnixDatagram::unbound().map_err(|e| format!("NOTIFY_SOCKET {path}: {e}"))?;
    sock.send_to_addr(state.as_bytes(), &addr)
        .map_err(|e| format!("NOTIFY_SOCKET {path}: {e}"))?;
    Ok(true)
}
