//! The two tables of an `rdma_ab` result side by side, and the ratio per size band.

use heddle_types::jobs::JobResult;
use heddle_types::kinds::rdma_ab::AbComparison;
use heddle_types::sweeps::Band;

use crate::table;

fn ratio(r: Option<f64>) -> String {
    r.map_or_else(|| "-".into(), |x| format!("{x:.2}×"))
}

/// The lines printed for a result's legs (also what tests read).
pub fn render(r: &JobResult) -> String {
    let c = AbComparison::from_rows(&r.rows);
    if c.points.is_empty() {
        return "no size was measured by both legs".into();
    }
    let mut t = table::new(&[
        "size (B)",
        "band",
        "RDMA busbw (GB/s)",
        "socket busbw (GB/s)",
        "RDMA / socket",
    ]);
    for p in &c.points {
        t.add_row(vec![
            p.size_bytes.to_string(),
            Band::of(p.size_bytes).as_str().to_string(),
            format!("{:.2}", p.rdma_busbw_gbs),
            format!("{:.2}", p.socket_busbw_gbs),
            ratio(p.ratio),
        ]);
    }
    table::right(&mut t, &[0, 2, 3, 4]);
    let mut b = table::new(&[
        "band",
        "sizes",
        "RDMA busbw (GB/s)",
        "socket busbw (GB/s)",
        "RDMA / socket",
    ]);
    for band in &c.bands {
        b.add_row(vec![
            band.band.as_str().to_string(),
            band.sizes.to_string(),
            format!("{:.2}", band.rdma_busbw_gbs),
            format!("{:.2}", band.socket_busbw_gbs),
            ratio(band.ratio),
        ]);
    }
    table::right(&mut b, &[1, 2, 3, 4]);
    format!(
        "RDMA leg (the node's environment) against the socket leg (NCCL_IB_DISABLE=1):\n{t}\n\
         per band (small < {} KiB, large ≥ {} MiB; the verdict reads the large band):\n{b}",
        Band::MEDIUM_FROM >> 10,
        Band::LARGE_FROM >> 20
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use heddle_types::jobs::{Outcome, ResultRow};

    #[test]
    fn both_legs_and_the_band_ratios_are_printed() {
        let row = |leg: &str, size: i64, bw: f64| ResultRow {
            size_bytes: size,
            busbw_gbs: Some(bw),
            labels: [("leg".to_string(), leg.to_string())].into(),
            ..Default::default()
        };
        let now = chrono::Utc::now();
        let r = JobResult {
            id: uuid::Uuid::nil(),
            job_id: uuid::Uuid::nil(),
            node_id: uuid::Uuid::nil(),
            hostname: "n1".into(),
            outcome: Outcome::Succeeded,
            reason: None,
            exit_code: Some(0),
            stderr_tail: None,
            summary: serde_json::json!({"kind": "rdma_ab"}),
            rows: vec![
                row("rdma", 1 << 20, 25.4),
                row("socket", 1 << 20, 6.8),
                row("rdma", 128 << 20, 122.3),
                row("socket", 128 << 20, 29.1),
            ],
            started_at: now,
            finished_at: now,
            received_at: now,
            verdict: None,
        };
        let text = render(&r);
        assert!(text.contains("122.30") && text.contains("29.10"), "{text}");
        assert!(text.contains("4.20×"), "{text}");
        assert!(text.contains("medium") && text.contains("large"), "{text}");
        let none = JobResult {
            rows: Vec::new(),
            ..r
        };
        assert_eq!(render(&none), "no size was measured by both legs");
    }
}
