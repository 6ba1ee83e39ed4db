//! Fleet medians remembered for a short while. The fleet median of a figure reads the
//! latest comparable figure of every other node of the model: O(fleet) per figure, and a
//! run over thousands of nodes uploads thousands of results within seconds, each asking
//! for nearly the same median. Over [`MIN_SAMPLES`] nodes one node more or less (the one
//! asking is left out of its own median) moves the median by less than the noise of one
//! figure, so such a median is reused for [`TTL`]; a smaller fleet's is always read anew.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::Median;

/// Fleets of at least this many comparable nodes have their median reused.
pub const MIN_SAMPLES: i64 = 100;
/// For this long.
pub const TTL: Duration = Duration::from_secs(30);

/// What makes fleet figures comparable, with the database they were read from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Key {
    pub database: String,
    pub world_size: i32,
    pub test: String,
    pub metric: String,
    pub band: i32,
    pub gpu_model: Option<String>,
}

type Memo = HashMap<Key, (Median, Instant)>;

fn memo() -> std::sync::MutexGuard<'static, Memo> {
    static MEMO: OnceLock<Mutex<Memo>> = OnceLock::new();
    MEMO.get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

pub fn get(key: &Key) -> Option<Median> {
    let memo = memo();
    let (median, at) = memo.get(key)?;
    (at.elapsed() < TTL).then_some(*median)
}

pub fn put(key: Key, median: Option<Median>) {
    let Some(median) = median.filter(|m| m.samples >= MIN_SAMPLES) else {
        return;
    };
    let mut memo = memo();
    if memo.len() > 10_000 {
        memo.retain(|_, (_, at)| at.elapsed() < TTL);
    }
    memo.insert(key, (median, Instant::now()));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(band: i32) -> Key {
        Key {
            database: "memo-test".into(),
            world_size: 1,
            test: "nccl".into(),
            metric: "busbw".into(),
            band,
            gpu_model: None,
        }
    }

    #[test]
    fn only_large_fleets_are_remembered() {
        let small = Median {
            value: 1.0,
            samples: MIN_SAMPLES - 1,
        };
        put(key(1), Some(small));
        assert_eq!(get(&key(1)), None);
        let large = Median {
            value: 2.0,
            samples: MIN_SAMPLES,
        };
        put(key(2), Some(large));
        assert_eq!(get(&key(2)), Some(large));
        assert_eq!(get(&key(3)), None);
    }
}
