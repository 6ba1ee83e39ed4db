//! Exponential backoff with jitter, so a fleet of agents that lost the server at the same
//! moment does not come back at the same moment.

use std::time::Duration;

use rand::Rng;

#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    failures: u32,
}

impl Backoff {
    pub fn new(base: Duration, cap: Duration) -> Backoff {
        Backoff {
            base,
            cap: cap.max(base),
            failures: 0,
        }
    }

    /// The delay before the next attempt: `base·2ⁿ` after n failures, capped, and then
    /// drawn uniformly from its upper half ("equal jitter": never near zero, never above
    /// the cap).
    pub fn next_delay_with(&mut self, rng: &mut impl Rng) -> Duration {
        let exp = self
            .base
            .saturating_mul(2u32.saturating_pow(self.failures.min(31)))
            .min(self.cap);
        self.failures = self.failures.saturating_add(1);
        let half = exp / 2;
        let jitter_ns = rng.random_range(0..=(exp - half).as_nanos() as u64);
        half + Duration::from_nanos(jitter_ns)
    }

    pub fn next_delay(&mut self) -> Duration {
        self.next_delay_with(&mut rand::rng())
    }

    /// The next delay, never shorter than what the server asked for (`Retry-After`): when
    /// its hint is the longer, the hint plus up to half of it again, so agents told the
    /// same value at the same moment do not all return at the same moment.
    pub fn next_delay_after_with(
        &mut self,
        retry_after: Option<Duration>,
        rng: &mut impl Rng,
    ) -> Duration {
        let own = self.next_delay_with(rng);
        match retry_after {
            Some(hint) if hint > own => {
                let jitter_ns = rng.random_range(0..=(hint / 2).as_nanos() as u64);
                hint + Duration::from_nanos(jitter_ns)
            }
            _ => own,
        }
    }

    pub fn next_delay_after(&mut self, retry_after: Option<Duration>) -> Duration {
        self.next_delay_after_with(retry_after, &mut rand::rng())
    }

    /// Failures since the last success.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn grows_exponentially_within_jitter_bounds_and_caps() {
        let mut rng = StdRng::seed_from_u64(7);
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(30));
        for n in 0..20u32 {
            let d = b.next_delay_with(&mut rng);
            let exp =
                (Duration::from_millis(100) * 2u32.pow(n.min(20))).min(Duration::from_secs(30));
            assert!(
                d >= exp / 2 && d <= exp,
                "attempt {n}: {d:?} not in [{:?}, {exp:?}]",
                exp / 2
            );
        }
        assert_eq!(b.failures(), 20);
        // Far past the cap it stays bounded (no overflow).
        for _ in 0..100 {
            assert!(b.next_delay_with(&mut rng) <= Duration::from_secs(30));
        }
    }

    #[test]
    fn jitter_spreads_agents_apart() {
        let delays: Vec<Duration> = (0..50u64)
            .map(|seed| {
                let mut rng = StdRng::seed_from_u64(seed);
                let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
                for _ in 0..4 {
                    b.next_delay_with(&mut rng);
                }
                b.next_delay_with(&mut rng)
            })
            .collect();
        let min = delays.iter().min().unwrap();
        let max = delays.iter().max().unwrap();
        assert!(*max - *min > Duration::from_secs(3), "{min:?}..{max:?}");
    }

    #[test]
    fn retry_after_is_a_floor_with_jitter_above_it() {
        let mut rng = StdRng::seed_from_u64(3);
        let hint = Some(Duration::from_secs(4));
        let mut seen = Vec::new();
        for seed in 0..50u64 {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(30));
            let d = b.next_delay_after_with(hint, &mut rng);
            assert!(
                d >= Duration::from_secs(4) && d <= Duration::from_secs(6),
                "{d:?}"
            );
            assert_eq!(b.failures(), 1, "the hint still counts as a failure");
            seen.push(d);
        }
        let spread = *seen.iter().max().unwrap() - *seen.iter().min().unwrap();
        assert!(spread > Duration::from_millis(500), "{spread:?}");
        // A hint shorter than the backoff changes nothing; no hint is plain backoff.
        let mut b = Backoff::new(Duration::from_secs(8), Duration::from_secs(30));
        let d = b.next_delay_after_with(Some(Duration::from_secs(1)), &mut rng);
        assert!(
            d >= Duration::from_secs(4) && d <= Duration::from_secs(8),
            "{d:?}"
        );
        let d = b.next_delay_after_with(None, &mut rng);
        assert!(
            d >= Duration::from_secs(8) && d <= Duration::from_secs(16),
            "{d:?}"
        );
    }

    #[test]
    fn reset_starts_over() {
        let mut rng = StdRng::seed_from_u64(1);
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(30));
        for _ in 0..10 {
            b.next_delay_with(&mut rng);
        }
        b.reset();
        assert!(b.next_delay_with(&mut rng) <= Duration::from_millis(100));
    }
}
