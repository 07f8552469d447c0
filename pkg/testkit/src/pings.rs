//! Pings across an event (a daemon's restart, a route replaced): iputils' ping with `-D`, its
//! replies read as they come with their timestamps, so that a test shows its window covered
//! the event (a reply before it began, one after it ended) and that no echo in between went
//! unanswered, rather than counting on a fixed number of pings to last long enough.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Seconds since the epoch, as `ping -D` stamps its replies.
pub fn epoch_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

type Replies = Arc<Mutex<Vec<(f64, u64)>>>;

/// One ping process and the replies it has printed: (timestamp, icmp_seq).
pub struct Pinger {
    what: String,
    child: Child,
    replies: Replies,
    reader: Option<JoinHandle<String>>,
}

impl Pinger {
    /// Starts `ping` as `cmd` says (a namespace's `ping` with its interval and destination),
    /// with `-D` added; `what` names it in failures.
    pub fn start(what: &str, mut cmd: Command) -> Pinger {
        let mut child = cmd
            .arg("-D")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting ping ({what}): {e}"));
        let stdout = child.stdout.take().expect("ping's output");
        let replies: Replies = Arc::default();
        let reader = {
            let replies = replies.clone();
            std::thread::spawn(move || {
                let mut text = String::new();
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    if let Some(r) = reply(&line) {
                        replies.lock().unwrap_or_else(|e| e.into_inner()).push(r);
                    }
                    text.push_str(&line);
                    text.push('\n');
                }
                text
            })
        };
        Pinger {
            what: what.to_string(),
            child,
            replies,
            reader: Some(reader),
        }
    }

    fn replied_after(&self, t: f64) -> bool {
        self.replies
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|(at, _)| *at > t)
    }

    /// Stops it (SIGINT, as a user would) and reads what it printed.
    fn finish(mut self) -> (Vec<(f64, u64)>, String) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGINT,
        );
        let _ = self.child.wait();
        let text = self
            .reader
            .take()
            .and_then(|r| r.join().ok())
            .unwrap_or_default();
        let replies = self
            .replies
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        (replies, text)
    }
}

impl Drop for Pinger {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A reply line of `ping -D`: `[1700000000.123456] 64 bytes from ...: icmp_seq=7 ...`.
fn reply(line: &str) -> Option<(f64, u64)> {
    if !line.contains(" bytes from ") || line.contains("DUP!") {
        return None;
    }
    let at = line.strip_prefix('[')?.split(']').next()?.parse().ok()?;
    let seq = line
        .split("icmp_seq=")
        .nth(1)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some((at, seq))
}

/// Runs `event` while every pinger pings: after each has had a reply, and until each has had
/// one stamped after the event ended (waiting at most `timeout` for either). Returns, for each
/// pinger whose replies do not cover the event or leave an echo between their first and last
/// unanswered, what it printed; empty when none.
pub fn across(pingers: Vec<Pinger>, timeout: Duration, event: impl FnOnce()) -> Vec<String> {
    let wait = |what: &str, ok: &dyn Fn() -> bool| {
        let start = std::time::Instant::now();
        while !ok() {
            if start.elapsed() > timeout {
                return Err(format!("no {what} within {timeout:?}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    };
    let mut failed = Vec::new();
    for p in &pingers {
        if let Err(e) = wait("first reply", &|| p.replied_after(0.0)) {
            failed.push(format!("{}: {e}", p.what));
        }
    }
    let began = epoch_now();
    event();
    let ended = epoch_now();
    for p in &pingers {
        if let Err(e) = wait("reply after the event", &|| p.replied_after(ended)) {
            failed.push(format!("{}: {e}", p.what));
        }
    }
    for p in pingers {
        let what = p.what.clone();
        let (replies, text) = p.finish();
        let (Some(first), Some(last)) = (replies.first(), replies.last()) else {
            failed.push(format!("{what}: no reply at all:\n{text}"));
            continue;
        };
        if first.0 >= began || last.0 <= ended {
            failed.push(format!(
                "{what}: the replies ({:.3} to {:.3}) do not cover the event ({began:.3} to \
                 {ended:.3}):\n{text}",
                first.0, last.0
            ));
            continue;
        }
        let answered: std::collections::BTreeSet<u64> = replies.iter().map(|r| r.1).collect();
        let missing: Vec<u64> = (first.1..=last.1)
            .filter(|n| !answered.contains(n))
            .collect();
        if !missing.is_empty() {
            failed.push(format!(
                "{what}: echoes {missing:?} of {}..={} went unanswered across the event \
                 ({began:.3} to {ended:.3}):\n{text}",
                first.1, last.1
            ));
        }
    }
    failed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_lines_are_read_with_their_stamp_and_sequence() {
        assert_eq!(
            reply("[1795775516.624050] 64 bytes from 10.0.0.2: icmp_seq=12 ttl=64 time=0.031 ms"),
            Some((1795775516.62405, 12))
        );
        assert_eq!(
            reply("PING 10.0.0.2 (10.0.0.2) 56(84) bytes of data."),
            None
        );
        assert_eq!(
            reply("[1.5] 64 bytes from 10.0.0.2: icmp_seq=3 ttl=64 time=1 ms (DUP!)"),
            None
        );
    }
}
