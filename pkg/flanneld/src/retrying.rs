//! A failure that is retried is logged when its cause changes, not at every retry.

use std::time::{Duration, Instant};

/// A failure retried until it passes: says when to log it, which is when its cause changes
/// (a retry with the same cause is not logged again), and when it has passed.
#[derive(Debug, Default)]
pub struct Retrying {
    cause: Option<String>,
    since: Option<Instant>,
    tries: u64,
}

impl Retrying {
    /// Notes a failure; true when `cause` is not the one logged last, so it is to be logged.
    pub fn failed(&mut self, cause: &str) -> bool {
        self.tries += 1;
        self.since.get_or_insert_with(Instant::now);
        if self.cause.as_deref() == Some(cause) {
            return false;
        }
        self.cause = Some(cause.to_string());
        true
    }

    /// Notes a success; after failures, how long they lasted and how many there were.
    pub fn passed(&mut self) -> Option<(Duration, u64)> {
        let since = self.since.take()?;
        self.cause = None;
        Some((since.elapsed(), std::mem::take(&mut self.tries)))
    }

    /// Whether the last attempt failed.
    pub fn failing(&self) -> bool {
        self.since.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retried_failure_is_logged_when_its_cause_changes() {
        let mut r = Retrying::default();
        assert!(r.failed("refused"));
        assert!(!r.failed("refused"));
        assert!(r.failed("bad certificate"));
        assert!(r.failed("refused"));
        assert!(r.failing());
        assert_eq!(r.passed().map(|(_, n)| n), Some(4));
        assert!(!r.failing());
        assert_eq!(r.passed(), None);
        assert!(r.failed("refused"));
    }
}
