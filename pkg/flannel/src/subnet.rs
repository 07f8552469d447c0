//! Reading subnet.env for the plugin: waiting for it at ADD, and the errors an operator sees.

use cni_protocol::error::{DECODING_FAILURE, PLUGIN_NOT_AVAILABLE, TRY_AGAIN_LATER};
use cni_protocol::CniError;
use std::path::Path;
use std::time::{Duration, Instant};
use subnetenv::SubnetEnv;

/// How often a missing file is looked for again: one failed open per interval.
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);

const CHECK_DAEMON: &str =
    "check the fabric daemon (flanneld) on this node: it writes this file once it holds a lease";

/// Reads subnet.env now. A missing file is code 11, an unreadable one 5, an invalid or
/// incomplete one 6; every message names the file.
pub fn read_subnet_env(path: &Path) -> Result<SubnetEnv, CniError> {
    SubnetEnv::read(path).map_err(|e| subnet_env_error(path, e, None))
}

/// Reads subnet.env, waiting up to `wait` for the daemon to write it if it does not exist yet.
pub fn wait_for_subnet_env(path: &Path, wait: Duration) -> Result<SubnetEnv, CniError> {
    let deadline = Instant::now() + wait;
    loop {
        match SubnetEnv::read(path) {
            Err(e) if e.is_not_found() => {
                let now = Instant::now();
                if now >= deadline {
                    return Err(subnet_env_error(path, e, Some(wait)));
                }
                std::thread::sleep(POLL_INTERVAL.min(deadline - now));
            }
            other => return other.map_err(|e| subnet_env_error(path, e, Some(wait))),
        }
    }
}

/// For STATUS: the plugin cannot serve ADD while subnet.env is missing or invalid (code 50).
pub fn subnet_env_status(path: &Path) -> Result<SubnetEnv, CniError> {
    read_subnet_env(path)
        .map_err(|e| CniError::new(PLUGIN_NOT_AVAILABLE, e.msg).with_details(e.details))
}

fn subnet_env_error(path: &Path, e: subnetenv::Error, waited: Option<Duration>) -> CniError {
    let file = path.display();
    match e {
        e if e.is_not_found() => {
            let waited = match waited {
                Some(w) if !w.is_zero() => format!(" after waiting {}s", w.as_secs_f64()),
                _ => String::new(),
            };
            CniError::new(
                TRY_AGAIN_LATER,
                format!("subnet file {file} does not exist{waited}: the fabric daemon (flanneld) on this node has not written it yet"),
            )
            .with_details(CHECK_DAEMON)
        }
        subnetenv::Error::Io { source, .. } => {
            CniError::io(format!("reading subnet file {file}: {source}"))
        }
        subnetenv::Error::Missing(keys) => CniError::new(
            DECODING_FAILURE,
            format!("subnet file {file} is missing {}", keys.join(", ")),
        )
        .with_details(CHECK_DAEMON),
        invalid @ subnetenv::Error::Invalid { .. } => {
            CniError::new(DECODING_FAILURE, format!("subnet file {file}: {invalid}"))
                .with_details(CHECK_DAEMON)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    const GOOD: &str =
        "FLANNEL_NETWORK=10.1.0.0/16\nFLANNEL_SUBNET=10.1.2.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n";

    #[test]
    fn a_missing_file_is_code_11_naming_it_and_the_daemon() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("run/flannel/subnet.env");
        let e = wait_for_subnet_env(&path, Duration::from_millis(120)).unwrap_err();
        assert_eq!(e.code, 11);
        assert!(e.msg.contains(&path.display().to_string()), "{e}");
        assert!(e.msg.contains("has not written it"), "{e}");
        assert!(e.msg.contains("after waiting 0.12s"), "{e}");
        assert!(e.details.contains("flanneld"), "{e}");
        let e = read_subnet_env(&path).unwrap_err();
        assert_eq!(e.code, 11);
        assert!(!e.msg.contains("waiting"), "{e}");
    }

    #[test]
    fn a_file_written_during_the_wait_is_read() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("subnet.env");
        let writer = {
            let path = path.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                SubnetEnv::parse(GOOD).unwrap().write(&path).unwrap();
            })
        };
        let env = wait_for_subnet_env(&path, Duration::from_secs(10)).unwrap();
        writer.join().unwrap();
        assert_eq!(env.mtu, 1450);
    }

    #[test]
    fn an_incomplete_file_fails_at_once_listing_every_missing_key() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("subnet.env");
        fs::write(&path, "FLANNEL_NETWORK=10.1.0.0/16\n").unwrap();
        let started = Instant::now();
        let e = wait_for_subnet_env(&path, Duration::from_secs(60)).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(30));
        assert_eq!(e.code, 6);
        assert!(
            e.msg.contains(
                "is missing FLANNEL_SUBNET, FLANNEL_IPV6_SUBNET, FLANNEL_MTU, FLANNEL_IPMASQ"
            ),
            "{e}"
        );
        assert!(e.details.contains("fabric daemon"), "{e}");
    }

    #[test]
    fn an_invalid_value_is_code_6_naming_the_file_key_and_value() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("subnet.env");
        fs::write(&path, GOOD.replace("1450", "big")).unwrap();
        let e = read_subnet_env(&path).unwrap_err();
        assert_eq!(e.code, 6);
        assert!(
            e.msg.contains("subnet.env") && e.msg.contains("FLANNEL_MTU=big"),
            "{e}"
        );
    }

    #[test]
    fn status_is_code_50_while_missing_or_invalid() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("subnet.env");
        let e = subnet_env_status(&path).unwrap_err();
        assert_eq!(e.code, 50);
        assert!(e.msg.contains("has not written it"), "{e}");
        fs::write(&path, "FLANNEL_MTU=1\n").unwrap();
        assert_eq!(subnet_env_status(&path).unwrap_err().code, 50);
        fs::write(&path, GOOD).unwrap();
        assert!(subnet_env_status(&path).is_ok());
    }
}
