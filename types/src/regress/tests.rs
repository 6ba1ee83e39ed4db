use proptest::prelude::*;

use super::detect::{Config, MAX_POINTS, detect};
use super::synth::{self, Spec};
use super::{detect_all, input};

/// A deterministic wobble of about ±1 % around `level` (no generator needed).
fn noisy(level: f64, n: usize, seed: u64) -> Vec<f64> {
    (0..n)
        .map(|i| {
            let h = (i as u64 + seed).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
            level * (1.0 + 0.02 * ((h % 1000) as f64 / 1000.0 - 0.5))
        })
        .collect()
}

#[test]
fn a_seven_percent_drop_is_found_where_it_happened() {
    let mut v = noisy(300.0, 60, 1);
    for x in &mut v[35..] {
        *x *= 0.93;
    }
    let found = detect(&v, &Config::default());
    assert_eq!(found.len(), 1, "{found:?}");
    let c = found[0];
    assert_eq!(c.index, 35);
    assert!((c.relative_change + 0.07).abs() < 0.01, "{c:?}");
    assert!(c.low < c.high && c.high < 0.0, "{c:?}");
    assert_eq!((c.points_before, c.points_after), (35, 25));
}

#[test]
fn a_flat_series_with_single_outliers_raises_nothing() {
    let mut v = noisy(120.0, 90, 7);
    for i in [10, 40, 41, 70] {
        v[i] *= 0.6;
    }
    v[55] *= 1.5;
    assert_eq!(detect(&v, &Config::default()), vec![]);
}

#[test]
fn a_change_below_the_minimum_effect_is_not_reported() {
    let mut v = noisy(100.0, 80, 3);
    for x in &mut v[40..] {
        *x *= 0.975;
    }
    assert_eq!(detect(&v, &Config::default()), vec![]);
    let found = detect(
        &v,
        &Config {
            min_effect: 0.01,
            ..Config::default()
        },
    );
    assert_eq!(found.len(), 1, "{found:?}");
}

#[test]
fn too_few_points_on_a_side_is_not_a_change() {
    let mut v = noisy(100.0, 40, 5);
    for x in &mut v[37..] {
        *x *= 0.8;
    }
    assert_eq!(detect(&v, &Config::default()), vec![]);
    for x in &mut v[35..37] {
        *x *= 0.8;
    }
    assert_eq!(detect(&v, &Config::default()).len(), 1);
}

#[test]
fn two_steps_and_a_recovery_are_three_changes() {
    let mut v = noisy(50.0, 90, 9);
    for (i, x) in v.iter_mut().enumerate() {
        if (20..50).contains(&i) {
            *x *= 0.9;
        } else if (50..70).contains(&i) {
            *x *= 0.8;
        }
    }
    let at: Vec<usize> = detect(&v, &Config::default())
        .iter()
        .map(|c| c.index)
        .collect();
    assert_eq!(at, [20, 50, 70]);
}

#[test]
fn latency_series_and_noiseless_steps_work_too() {
    let mut v = vec![7.0; 30];
    v.extend([8.0; 30]);
    let found = detect(&v, &Config::default());
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].index, 30);
    assert!(super::is_worse("time_us", found[0].relative_change));
    assert!(!super::is_worse("busbw_gbs", found[0].relative_change));
}

#[test]
fn non_finite_points_are_skipped_and_indices_are_the_inputs() {
    let mut v = noisy(100.0, 50, 11);
    for x in &mut v[25..] {
        *x *= 0.9;
    }
    v.insert(3, f64::NAN);
    v.insert(10, f64::INFINITY);
    let found = detect(&v, &Config::default());
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].index, 27);
}

#[test]
fn only_the_newest_points_are_looked_at() {
    let mut v = noisy(100.0, MAX_POINTS + 200, 13);
    for x in &mut v[100..] {
        *x *= 0.8;
    }
    // The change lies before the window: nothing to see in it.
    assert_eq!(detect(&v, &Config::default()), vec![]);
}

#[test]
fn offline_detection_names_series_and_the_first_point_after() {
    let mut text = String::new();
    let v = noisy(10.0, 30, 17);
    for (i, x) in v.iter().enumerate() {
        let x = if i >= 12 { x * 1.1 } else { *x };
        text.push_str(&format!(
            "{{\"series\":\"n1/nccl.all_reduce/busbw_gbs/30\",\"t\":\"2026-10-{:02}T00:00:00Z\",\"value\":{x}}}\n",
            i + 1
        ));
    }
    let found = detect_all(&input::parse(&text).unwrap(), &Config::default());
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].t.to_rfc3339(), "2026-10-13T00:00:00+00:00");
    assert!((found[0].relative_change - 0.1).abs() < 0.02);
}

/// A per-pair series says its pair wherever it is shown; every other change reads and
/// serializes as before pairs existed.
#[test]
fn a_pair_is_named_in_the_summary_and_absent_otherwise() {
    let mut r = super::Regression {
        id: uuid::Uuid::nil(),
        node_id: uuid::Uuid::nil(),
        hostname: "g1".into(),
        test: "p2p.d2d".into(),
        metric: "algbw_gbs".into(),
        size_band: 28,
        world_size: 1,
        pair: None,
        t: "2026-11-14T16:21:00Z".parse().unwrap(),
        before: 370.0,
        after: 333.0,
        relative_change: -0.1,
        ci_low: -0.11,
        ci_high: -0.09,
        points_before: 14,
        points_after: 14,
        worse: true,
        open: true,
        facts_changes: vec![],
        fleet: super::FleetView::default(),
        summary: String::new(),
        detected_at: "2026-11-14T16:21:00Z".parse().unwrap(),
    };
    assert_eq!(
        super::summary(&r),
        "g1 regressed on p2p.d2d algbw_gbs (band 2^28, 1 node): 370.00 → 333.00 (-10.0 %, 95 % CI \
         -11.0 % to -9.0 %) from 2026-11-14 16:21 UTC; no facts changed on the node around it"
    );
    assert!(serde_json::to_value(&r).unwrap().get("pair").is_none());
    r.pair = Some("0-1".into());
    assert_eq!(
        super::summary(&r),
        "g1 regressed on p2p.d2d algbw_gbs (pair 0-1, band 2^28, 1 node): 370.00 → 333.00 \
         (-10.0 %, 95 % CI -11.0 % to -9.0 %) from 2026-11-14 16:21 UTC; no facts changed on \
         the node around it"
    );
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["pair"], "0-1");
    assert_eq!(
        serde_json::from_value::<super::Regression>(json).unwrap(),
        r
    );
}

/// The quality figures of docs/health.md on a smaller sample: steps of 5 % and more are
/// found, outliers stay silent, false alarms are rare.
#[test]
fn quality_on_generated_series() {
    let spec = Spec {
        series: 200,
        ..Spec::default()
    };
    let (lines, truth) = synth::generate(&spec);
    let mut series = input::Series::new();
    for l in lines {
        series.entry(l.series).or_default().push((l.t, l.value));
    }
    let found = detect_all(&series, &Config::default());
    let score = synth::score(&truth, &found, spec.series);
    assert!(score.recall_5_to_15 >= 0.9, "{score:?}");
    assert!(score.false_alarms_per_100_series <= 3.0, "{score:?}");
    assert!(
        score.outliers_silent as f64 >= 0.95 * score.outliers as f64,
        "{score:?}"
    );
}

fn value() -> impl Strategy<Value = f64> {
    prop_oneof![
        8 => -1e3..1e3f64,
        1 => Just(f64::NAN),
        1 => Just(f64::INFINITY),
        1 => Just(f64::NEG_INFINITY),
        1 => Just(f64::MAX),
        1 => Just(f64::MIN_POSITIVE),
        1 => Just(0.0),
    ]
}

proptest! {
    #[test]
    fn never_panics_and_reports_only_what_it_was_asked(
        values in proptest::collection::vec(value(), 0..120),
        min_points in 0usize..12,
        min_effect in 0.0..0.5f64,
        penalty in prop_oneof![Just(f64::NAN), Just(-1.0), 0.0..20.0f64],
    ) {
        let cfg = Config { min_effect, min_points, penalty };
        let found = detect(&values, &cfg);
        let mut last = 0;
        for c in found {
            prop_assert!(c.index > last || last == 0);
            prop_assert!(c.index < values.len());
            prop_assert!(values[c.index].is_finite());
            prop_assert!(c.relative_change.abs() >= min_effect);
            prop_assert!(c.points_before >= min_points.max(1) && c.points_after >= min_points.max(1));
            prop_assert!(c.relative_change.is_finite() && c.low <= c.high);
            last = c.index;
        }
    }

    #[test]
    fn offline_input_never_panics(text in "[ -~\\n]{0,400}") {
        let _ = input::parse(&text);
    }

    #[test]
    fn a_real_step_is_found_whatever_the_scale(scale in 1e-6..1e9f64, at in 10usize..50) {
        let mut v = noisy(scale, 60, at as u64);
        for x in &mut v[at..] {
            *x *= 0.85;
        }
        let found = detect(&v, &Config::default());
        prop_assert_eq!(found.len(), 1);
        prop_assert!(found[0].index.abs_diff(at) <= 1);
    }
}
