use std::time::{Duration, Instant};

/// Polls `check` every 100 ms until it gives a value; panics naming `what` when `patience`
/// has passed without one.
pub async fn eventually<T>(
    what: &str,
    patience: Duration,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(start.elapsed() < patience, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
