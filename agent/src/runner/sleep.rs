//! `sleep`: does nothing for `seconds` (required, at most a day) while reporting progress
//! about once a second. It is how cancellation, lease renewal, timeouts and a kill in the
//! middle of a run are exercised without hardware.

use std::time::{Duration, Instant};

use super::protocol::{ChildEvent, ChildInput};
use heddle_types::kinds::sleep::SleepParams;
use heddle_types::params::KindParams;

use super::{RunError, Sink};

pub fn run(input: &ChildInput, out: &mut Sink<'_>) -> Result<(), RunError> {
    let params = SleepParams::decode(&input.params).map_err(|e| RunError::Params(e.to_string()))?;
    let seconds = params.seconds;
    let silent_after = params.silent_after_s.map(Duration::from_secs_f64);
    let total = Duration::from_secs_f64(seconds);
    let tick = Duration::from_secs(1).min(total.max(Duration::from_millis(10)));
    let start = Instant::now();
    out.progress(Some(0.0), format!("sleeping {seconds} s"))?;
    loop {
        let elapsed = start.elapsed();
        if elapsed >= total {
            break;
        }
        std::thread::sleep(tick.min(total - elapsed));
        if silent_after.is_some_and(|s| start.elapsed() >= s) {
            continue;
        }
        let done = start.elapsed().min(total);
        let fraction = if total.is_zero() {
            1.0
        } else {
            done.as_secs_f64() / total.as_secs_f64()
        };
        out.progress(
            Some(fraction),
            format!("slept {:.1} of {seconds} s", done.as_secs_f64()),
        )?;
    }
    let mut summary = serde_json::Map::new();
    summary.insert("kind".into(), "sleep".into());
    summary.insert("slept_s".into(), start.elapsed().as_secs_f64().into());
    out.emit(&ChildEvent::Summary { summary })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::protocol::Emitter;
    use uuid::Uuid;

    fn input(params: serde_json::Value) -> ChildInput {
        ChildInput {
            kind: "sleep".into(),
            params,
            job_id: Uuid::nil(),
            run_id: Uuid::nil(),
            rank: 0,
            world_size: 1,
            rendezvous: None,
        }
    }

    #[test]
    fn sleeps_and_reports_progress_up_to_one() {
        let mut buf = Vec::new();
        let mut sink: Sink<'_> = Emitter::new(&mut buf);
        let start = Instant::now();
        run(&input(serde_json::json!({"seconds": 0.3})), &mut sink).unwrap();
        assert!(start.elapsed() >= Duration::from_millis(300));
        let fractions: Vec<f64> = String::from_utf8(buf)
            .unwrap()
            .lines()
            .filter_map(|l| match serde_json::from_str(l).unwrap() {
                ChildEvent::Progress(p) => p.fraction,
                _ => None,
            })
            .collect();
        assert_eq!(fractions.first(), Some(&0.0));
        assert_eq!(fractions.last(), Some(&1.0));
        assert!(fractions.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn seconds_is_required_and_bounded() {
        let mut buf = Vec::new();
        let mut sink: Sink<'_> = Emitter::new(&mut buf);
        assert!(run(&input(serde_json::json!({})), &mut sink).is_err());
        assert!(run(&input(serde_json::json!({"seconds": -1})), &mut sink).is_err());
    }
}
