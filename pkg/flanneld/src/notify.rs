//! systemd's readiness protocol: `READY=1` as a datagram to `$NOTIFY_SOCKET`.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// systemd's socket could not be told.
#[derive(Debug, thiserror::Error)]
#[error("NOTIFY_SOCKET {path}: {source}")]
pub struct NotifyError {
    pub path: String,
    #[source]
    pub source: std::io::Error,
}

/// Sends `state` when systemd asked for it; says what went wrong otherwise.
pub fn notify(state: &str) -> Result<bool, NotifyError> {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(false);
    };
    let path = path.to_string_lossy().into_owned();
    let send = || {
        let addr = match path.strip_prefix('@') {
            Some(name) => SocketAddr::from_abstract_name(name.as_bytes()),
            None => SocketAddr::from_pathname(&path),
        }?;
        UnixDatagram::unbound()?.send_to_addr(state.as_bytes(), &addr)
    };
    send().map_err(|source| NotifyError {
        path: path.clone(),
        source,
    })?;
    Ok(true)
}
