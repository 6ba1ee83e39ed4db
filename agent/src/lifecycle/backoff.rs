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
