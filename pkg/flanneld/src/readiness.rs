//! When flanneld tells systemd it has started (`READY=1` on `$NOTIFY_SOCKET`), and the status
//! line it keeps there. Ready once `subnet.env` is written, or once the start has gone `GRACE`
//! without it: the registry it waits for (the API server, etcd) may be a static pod that kubelet
//! starts, and a unit that kubelet is ordered after must not hold kubelet back waiting for it.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// How long the start may wait for its registry before systemd is told it has started.
pub const GRACE: Duration = Duration::from_secs(10);

/// What systemd has been told so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Told {
    Nothing,
    /// Ready, still waiting for the registry.
    Waiting,
    /// Ready, `subnet.env` written.
    Written,
}

/// The rule: what to tell systemd now (the new state and the message), given what it has been
/// told, whether `subnet.env` is written and how long ago the start began; None: nothing new.
pub fn next(
    told: Told,
    written: bool,
    since_start: Duration,
    grace: Duration,
    registry: &str,
    subnet_file: &Path,
) -> Option<(Told, String)> {
    let written_status = format!("STATUS={} written", subnet_file.display());
    match (told, written) {
        (Told::Written, _) => None,
        (Told::Nothing, true) => Some((Told::Written, format!("READY=1\n{written_status}"))),
        (Told::Waiting, true) => Some((Told::Written, written_status)),
        (Told::Nothing, false) if since_start >= grace => Some((
            Told::Waiting,
            format!(
                "READY=1\nSTATUS=waiting for {registry}: {} not written yet",
                subnet_file.display()
            ),
        )),
        (Told::Nothing | Told::Waiting, false) => None,
    }
}

/// Keeps systemd told by `next` until `subnet.env` is written (`written`), from the start at
/// `start`; does nothing when systemd did not ask (no `$NOTIFY_SOCKET`).
pub async fn tell_systemd(
    written: Arc<AtomicBool>,
    start: Instant,
    registry: String,
    subnet_file: std::path::PathBuf,
) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    let mut told = Told::Nothing;
    while told != Told::Written {
        let now = next(
            told,
            written.load(Ordering::SeqCst),
            start.elapsed(),
            GRACE,
            &registry,
            &subnet_file,
        );
        if let Some((state, message)) = now {
            match crate::notify::notify(&message) {
                Ok(_) if state == Told::Waiting => info!(
                    "told systemd the daemon is ready after {} s without a lease; waiting for {registry}",
                    GRACE.as_secs()
                ),
                Ok(_) if told == Told::Nothing => info!("told systemd the daemon is ready"),
                Ok(_) => {}
                Err(e) => warn!("{e}"),
            }
            told = state;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: Duration = GRACE;

    fn at(told: Told, written: bool, secs: u64) -> Option<(Told, String)> {
        next(
            told,
            written,
            Duration::from_secs(secs),
            G,
            "etcd at http://10.0.0.1:2379",
            Path::new("/run/flannel/subnet.env"),
        )
    }

    #[test]
    fn ready_as_soon_as_subnet_env_is_written() {
        let (told, msg) = at(Told::Nothing, true, 0).unwrap();
        assert_eq!(told, Told::Written);
        assert_eq!(msg, "READY=1\nSTATUS=/run/flannel/subnet.env written");
        assert_eq!(at(Told::Written, true, 99), None);
    }

    #[test]
    fn without_a_lease_ready_comes_at_the_grace_and_never_waits_for_the_registry() {
        for s in 0..G.as_secs() {
            assert_eq!(at(Told::Nothing, false, s), None, "{s} s");
        }
        let (told, msg) = at(Told::Nothing, false, G.as_secs()).unwrap();
        assert_eq!(told, Told::Waiting);
        assert_eq!(
            msg,
            "READY=1\nSTATUS=waiting for etcd at http://10.0.0.1:2379: \
             /run/flannel/subnet.env not written yet"
        );
        // Once ready, only the status follows; nothing is said twice.
        assert_eq!(at(Told::Waiting, false, 3600), None);
        let (told, msg) = at(Told::Waiting, true, 3600).unwrap();
        assert_eq!(told, Told::Written);
        assert_eq!(msg, "STATUS=/run/flannel/subnet.env written");
    }
}
