//! How the kinds take a headline figure from their rows.

use std::collections::BTreeMap;

use crate::health::Figure;
use crate::rows::ResultRow;

/// Lower is better for latencies, higher for bandwidths.
pub fn lower_is_better(metric: &str) -> bool {
    metric.ends_with("_us")
}

/// A row's finite value of `metric`.
pub(super) fn pick(metric: &str, r: &ResultRow) -> Option<f64> {
    match metric {
        "busbw_gbs" => r.busbw_gbs,
        "algbw_gbs" => r.algbw_gbs,
        _ => r.time_us,
    }
    .filter(|v| v.is_finite())
}

/// The size a headline figure is taken at: the largest measured, the smallest for latencies.
pub(super) fn headline_size(metric: &str, sizes: impl Iterator<Item = i64>) -> Option<i64> {
    if lower_is_better(metric) {
        sizes.min()
    } else {
        sizes.max()
    }
}

/// The figure of `metric` at the largest size that has it (the mean of the rows there, e.g.
/// nccl-tests' out-of-place and in-place rows), or at the smallest for latencies.
pub(super) fn headline<'a>(
    test: String,
    metric: &str,
    rows: impl Iterator<Item = &'a ResultRow>,
    min_of_rows: bool,
) -> Option<Figure> {
    let with: Vec<(i64, f64)> = rows
        .filter_map(|r| Some((r.size_bytes, pick(metric, r)?)))
        .collect();
    let size = headline_size(metric, with.iter().map(|w| w.0))?;
    let at: Vec<f64> = with.iter().filter(|w| w.0 == size).map(|w| w.1).collect();
    let value = if min_of_rows {
        // The worst of several links measured at the same size (p2p pairs).
        if lower_is_better(metric) {
            at.iter().copied().fold(f64::MIN, f64::max)
        } else {
            at.iter().copied().fold(f64::MAX, f64::min)
        }
    } else {
        at.iter().sum::<f64>() / at.len() as f64
    };
    Some(Figure {
        test,
        metric: metric.to_string(),
        size_bytes: size,
        value,
        pair: None,
    })
}

/// Rows of a result with several tests, by test (`sub` names a row's test), with the
/// metric each is judged on; test names are `<kind>.<sub>`.
pub(super) fn by_test<'a>(
    kind: &str,
    rows: &'a [ResultRow],
    sub: impl Fn(&ResultRow) -> Option<String>,
    metric: impl Fn(&str) -> &'static str,
) -> Vec<(String, &'static str, Vec<&'a ResultRow>)> {
    let mut groups: BTreeMap<String, Vec<&ResultRow>> = BTreeMap::new();
    for r in rows {
        if let Some(s) = sub(r).filter(|s| !s.is_empty()) {
            groups.entry(s).or_default().push(r);
        }
    }
    groups
        .into_iter()
        .map(|(s, group)| (format!("{kind}.{s}"), metric(&s), group))
        .collect()
}
