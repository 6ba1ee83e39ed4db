//! `memcpy`: host-memory copy bandwidth over a sweep of sizes. It needs no special
//! hardware, so it exercises the whole job path (claim, child, rows, upload) on any node,
//! and its figures are a sanity baseline for the host side of a GPU transfer.
//!
//! Params: `min_bytes` (default 1 KiB), `max_bytes` (default 64 MiB, at most 1 GiB),
//! `factor` (default 2, > 1) and `iters` (default 20) copies timed per size.

use std::time::Instant;

use heddle_types::jobs::ResultRow;

use super::protocol::{ChildEvent, ChildInput};
use heddle_types::kinds::memcpy::MemcpyParams;
use heddle_types::params::KindParams;

use super::{RunError, Sink};

#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub factor: f64,
    pub iters: u64,
}

impl Params {
    /// Decodes a job's params through the wire type the server checked them with (which
    /// holds the limits).
    pub fn parse(params: &serde_json::Value) -> Result<Params, RunError> {
        let t = MemcpyParams::decode(params).map_err(|e| RunError::Params(e.to_string()))?;
        Ok(Params {
            min_bytes: t.min_bytes,
            max_bytes: t.max_bytes,
            factor: t.factor,
            iters: t.iters,
        })
    }

    /// min, min·f, min·f², ... up to max (inclusive); each step grows by at least a byte.
    pub fn sizes(&self) -> Vec<u64> {
        let mut out = Vec::new();
        let mut size = self.min_bytes;
        while size <= self.max_bytes {
            out.push(size);
            let next = (size as f64 * self.factor).round() as u64;
            size = next.max(size + 1);
        }
        out
    }
}

pub fn run(input: &ChildInput, out: &mut Sink<'_>) -> Result<(), RunError> {
    let params = Params::parse(&input.params)?;
    let sizes = params.sizes();
    let max = params.max_bytes as usize;
    // Fill both buffers so every page is faulted in before anything is timed.
    let src: Vec<u8> = (0..max)
        .map(|i| (i.wrapping_mul(31) ^ 0x5a) as u8)
        .collect();
    let mut dst = vec![0u8; max];
    let mut peak: f64 = 0.0;
    for (i, &size) in sizes.iter().enumerate() {
        let n = size as usize;
        let row = measure(&src[..n], &mut dst[..n], params.iters);
        let gbs = row.algbw_gbs.unwrap_or(0.0);
        peak = peak.max(gbs);
        out.row(row)?;
        out.progress(
            Some((i + 1) as f64 / sizes.len() as f64),
            format!("memcpy {size} B: {gbs:.2} GB/s"),
        )?;
    }
    let mut summary = serde_json::Map::new();
    summary.insert("kind".into(), "memcpy".into());
    summary.insert("iters".into(), params.iters.into());
    summary.insert("sizes".into(), sizes.len().into());
    summary.insert("peak_algbw_gbs".into(), peak.into());
    out.emit(&ChildEvent::Summary { summary })?;
    Ok(())
}

/// Times `iters` copies of `src` into `dst` after one warm-up copy, then checks the bytes.
fn measure(src: &[u8], dst: &mut [u8], iters: u64) -> ResultRow {
    dst.fill(0);
    dst.copy_from_slice(std::hint::black_box(src));
    let start = Instant::now();
    for _ in 0..iters {
        std::hint::black_box(&mut *dst).copy_from_slice(std::hint::black_box(src));
    }
    let elapsed = start.elapsed();
    let wrong = src.iter().zip(dst.iter()).filter(|(a, b)| a != b).count();
    let time_us = elapsed.as_secs_f64() * 1e6 / iters as f64;
    // bytes per microsecond is MB/s; GB/s is a thousandth of that.
    let algbw_gbs = if time_us > 0.0 {
        src.len() as f64 / time_us / 1e3
    } else {
        0.0
    };
    ResultRow {
        size_bytes: src.len() as i64,
        count: Some(src.len() as i64),
        dtype: Some("uint8".into()),
        op: Some("memcpy".into()),
        root: None,
        in_place: Some(false),
        time_us: Some(time_us),
        algbw_gbs: Some(algbw_gbs),
        busbw_gbs: None,
        wrong: Some(wrong as i64),
        labels: Default::default(),
        extra: serde_json::json!({}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::protocol::Emitter;
    use uuid::Uuid;

    #[test]
    fn defaults_and_sweep() {
        let p = Params::parse(&serde_json::json!({})).unwrap();
        assert_eq!(p.sizes().first(), Some(&1024));
        assert_eq!(p.sizes().last(), Some(&(64 << 20)));
        assert_eq!(p.sizes().len(), 17);
        let odd =
            Params::parse(&serde_json::json!({"min_bytes": 1, "max_bytes": 4, "factor": 1.1}))
                .unwrap();
        assert_eq!(odd.sizes(), vec![1, 2, 3, 4]);
    }

    #[test]
    fn bad_params_are_rejected() {
        for bad in [
            serde_json::json!({"min_bytes": 0}),
            serde_json::json!({"min_bytes": 10, "max_bytes": 5}),
            serde_json::json!({"factor": 1}),
            serde_json::json!({"iters": 0}),
            serde_json::json!({"max_bytes": 4u64 << 30}),
            serde_json::json!({"iters": "many"}),
        ] {
            assert!(
                matches!(Params::parse(&bad), Err(RunError::Params(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn measures_real_copies() {
        let input = ChildInput {
            kind: "memcpy".into(),
            params: serde_json::json!({"min_bytes": 4096, "max_bytes": 1 << 20, "factor": 4, "iters": 5}),
            job_id: Uuid::nil(),
            run_id: Uuid::nil(),
            rank: 0,
            world_size: 1,
            rendezvous: None,
        };
        let mut buf = Vec::new();
        let mut sink: Sink<'_> = Emitter::new(&mut buf);
        run(&input, &mut sink).unwrap();
        let events: Vec<ChildEvent> = String::from_utf8(buf)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let rows: Vec<&ResultRow> = events
            .iter()
            .filter_map(|e| match e {
                ChildEvent::Row { row } => Some(row),
                _ => None,
            })
            .collect();
        assert_eq!(
            rows.iter().map(|r| r.size_bytes).collect::<Vec<_>>(),
            vec![4096, 16384, 65536, 262144, 1048576]
        );
        for r in &rows {
            assert_eq!(r.wrong, Some(0));
            let t = r.time_us.unwrap();
            let bw = r.algbw_gbs.unwrap();
            assert!(t > 0.0 && bw > 0.0, "{r:?}");
            // algbw is bytes / time, in GB/s.
            assert!((bw - r.size_bytes as f64 / t / 1e3).abs() < 1e-9);
        }
        assert!(matches!(events.last(), Some(ChildEvent::Summary { .. })));
    }
}
