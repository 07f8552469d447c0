//! How requests are spaced while they fail, as client-go spaces them: an answer that says when
//! to come back (`Retry-After`, from a 429 or a 503) is taken at its word and grows nothing;
//! other failures back off exponentially, with jitter; a success ends the waiting. The clock
//! and the jitter are the caller's, so that the pace is tested without waiting.

use std::time::{Duration, Instant};

/// After a failure the next request waits from this, doubling at each failure in a row...
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// ...up to this (client-go's reflector backs off to 30 s too)...
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// ...or to this when the server did not answer at all (nothing listening, no route): asking
/// again costs it nothing, and the node sees it back within seconds.
const MAX_UNANSWERED_BACKOFF: Duration = Duration::from_secs(3);
/// Failures further apart than this start the backoff from the beginning again.
const BACKOFF_RESET: Duration = Duration::from_secs(120);
/// The longest `Retry-After` taken as it is; a longer one is waited this long.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);

/// How a request failed, for the wait before the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// No answer: the connection failed or broke.
    Unanswered,
    /// An answer that refused without saying when to come back (a 5xx, a 401, a watch ended
    /// at once).
    Refused,
    /// A 429 or 503 with `Retry-After`.
    ComeBackIn(Duration),
}

#[derive(Debug, Default)]
pub(crate) struct Pace {
    /// No request before this.
    not_before: Option<Instant>,
    /// The backoff the next failure without `Retry-After` doubles.
    backoff: Duration,
    /// The last failure that grew the backoff.
    last_failure: Option<Instant>,
}

impl Pace {
    /// A failure at `now`; `jitter` (0 to 1) places the wait between half the backoff and
    /// all of it, so that nodes that failed together do not come back together.
    pub(crate) fn failed(&mut self, now: Instant, failure: Failure, jitter: f64) {
        let wait = match failure {
            Failure::ComeBackIn(d) => d.min(MAX_RETRY_AFTER),
            Failure::Unanswered | Failure::Refused => {
                if self
                    .last_failure
                    .is_none_or(|t| now.saturating_duration_since(t) > BACKOFF_RESET)
                {
                    self.backoff = Duration::ZERO;
                }
                self.backoff = if self.backoff.is_zero() {
                    FIRST_BACKOFF
                } else {
                    (self.backoff * 2).min(MAX_BACKOFF)
                };
                self.last_failure = Some(now);
                let cap = match failure {
                    Failure::Unanswered => MAX_UNANSWERED_BACKOFF,
                    _ => MAX_BACKOFF,
                };
                let half = self.backoff.min(cap) / 2;
                half + half.mul_f64(jitter.clamp(0.0, 1.0))
            }
        };
        self.not_before = Some(now + wait);
    }

    /// A success: the next request goes at once. The backoff is kept until failures stop
    /// for `BACKOFF_RESET`, so that a server that answers and then fails at once (a watch it
    /// ends with no event) is not asked ever faster.
    pub(crate) fn passed(&mut self) {
        self.not_before = None;
    }

    /// How long a request made at `now` waits.
    pub(crate) fn wait(&self, now: Instant) -> Duration {
        self.not_before
            .map_or(Duration::ZERO, |t| t.saturating_duration_since(now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    /// The waits after `n` failures of `kind`, each at the moment the wait before it ended.
    fn waits(
        pace: &mut Pace,
        now: &mut Instant,
        kind: Failure,
        jitter: f64,
        n: usize,
    ) -> Vec<Duration> {
        (0..n)
            .map(|_| {
                pace.failed(*now, kind, jitter);
                let w = pace.wait(*now);
                *now += w;
                w
            })
            .collect()
    }

    #[test]
    fn failures_back_off_doubling_to_a_cap_with_jitter() {
        let t0 = Instant::now();
        let mut now = t0;
        let mut p = Pace::default();
        let full = waits(&mut p, &mut now, Failure::Refused, 1.0, 9);
        let ms = |w: &[Duration]| w.iter().map(|d| d.as_millis()).collect::<Vec<_>>();
        assert_eq!(
            ms(&full),
            [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]
        );
        // Without jitter's upper half: half of each.
        let mut p = Pace::default();
        let half = waits(&mut p, &mut now, Failure::Refused, 0.0, 3);
        assert_eq!(ms(&half), [250, 500, 1000]);
        // A server that does not answer is asked again within 3 s, however long it lasts.
        let mut p = Pace::default();
        let gone = waits(&mut p, &mut now, Failure::Unanswered, 1.0, 12);
        assert_eq!(gone[..4], [S / 2, S, 2 * S, 3 * S]);
        assert!(gone.iter().all(|w| *w <= 3 * S), "{gone:?}");
    }

    #[test]
    fn retry_after_is_waited_as_said_capped_and_grows_nothing() {
        let mut now = Instant::now();
        let mut p = Pace::default();
        waits(&mut p, &mut now, Failure::Refused, 1.0, 5);
        // Throttled: each 429 waits its Retry-After, not the 8 s backoff reached before.
        let throttled = waits(&mut p, &mut now, Failure::ComeBackIn(S), 1.0, 20);
        assert!(throttled.iter().all(|w| *w == S), "{throttled:?}");
        let capped = waits(&mut p, &mut now, Failure::ComeBackIn(3600 * S), 1.0, 1);
        assert_eq!(capped, [30 * S]);
        // The backoff goes on from where the failures without Retry-After left it.
        assert_eq!(waits(&mut p, &mut now, Failure::Refused, 1.0, 1), [16 * S]);
    }

    #[test]
    fn a_success_ends_the_wait_and_a_quiet_spell_the_backoff() {
        let mut now = Instant::now();
        let mut p = Pace::default();
        waits(&mut p, &mut now, Failure::Refused, 1.0, 4);
        p.failed(now, Failure::Refused, 1.0);
        assert_eq!(p.wait(now), 8 * S);
        p.passed();
        assert_eq!(p.wait(now), Duration::ZERO);
        // Failing again soon after goes on doubling...
        now += 10 * S;
        p.failed(now, Failure::Refused, 1.0);
        assert_eq!(p.wait(now), 16 * S);
        p.passed();
        // ...after two quiet minutes it starts over.
        now += 121 * S;
        p.failed(now, Failure::Refused, 1.0);
        assert_eq!(p.wait(now), S / 2);
        // A wait that has passed is no wait.
        assert_eq!(p.wait(now + S), Duration::ZERO);
    }
}
