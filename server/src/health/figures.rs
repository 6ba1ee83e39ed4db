//! What a result is judged on: its test name(s) and headline figures, which each kind's
//! module in `heddle_types::kinds` takes from the run's params and the result's rows, and
//! how the server stores them. Pure, so every rule is unit-tested here.

use heddle_types::health::Figure;
use heddle_types::jobs::ResultRow;
use heddle_types::kinds::Params;
pub use heddle_types::kinds::lower_is_better;

/// What one result says, reduced to what verdicts compare.
#[derive(Debug, Clone, PartialEq)]
pub struct Extracted {
    /// The verdict's `test`: the one test of the figures, or the kind when there are several.
    pub test: String,
    pub figures: Vec<Figure>,
    /// Elements that failed validation, over all rows.
    pub wrong: i64,
}

/// One figure per GPU pair of a result (`p2p`'s copies), followed by regressions and never
/// judged; none for other kinds.
pub fn pairs(kind: &str, rows: &[ResultRow]) -> Vec<Figure> {
    heddle_types::kinds::pairs(kind, rows)
}

/// A figure as `verdicts.figures` stores it: the wire fields and its size band (what
/// baselines, fleet medians and regressions compare on), and `pair` only when it has one,
/// so figures without one are stored exactly as before pairs existed.
pub fn stored(f: &Figure) -> serde_json::Value {
    let mut v = serde_json::json!({"test": f.test, "metric": f.metric, "size_bytes": f.size_bytes,
        "value": f.value, "band": size_band(f.size_bytes)});
    if let Some(pair) = &f.pair {
        v["pair"] = pair.as_str().into();
    }
    v
}

/// Test names are `<kind>.<test>` (`nccl.<op>`, `rdma.<perftest>`, `ucx.<test>` and
/// `p2p.<d2d|h2d|d2h>` per test in the rows, the bare kind otherwise), as the kind's module
/// says.
pub fn extract(kind: &str, params: &Params, rows: &[ResultRow]) -> Extracted {
    let wrong = rows.iter().filter_map(|r| r.wrong).filter(|w| *w > 0).sum();
    let judged = heddle_types::kinds::judged(kind, params, rows);
    Extracted {
        test: judged.test,
        figures: judged.figures,
        wrong,
    }
}

/// Figures are comparable when their sizes fall in the same power-of-two band.
pub fn size_band(size_bytes: i64) -> i32 {
    if size_bytes <= 0 {
        0
    } else {
        63 - size_bytes.leading_zeros() as i32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// [`super::extract`] with the run's params as JSON.
    fn extract(kind: &str, params: &serde_json::Value, rows: &[ResultRow]) -> Extracted {
        super::extract(kind, &Params::new(kind, params.clone()), rows)
    }

    fn row(size: i64, busbw: Option<f64>, algbw: Option<f64>, time: Option<f64>) -> ResultRow {
        ResultRow {
            size_bytes: size,
            time_us: time,
            algbw_gbs: algbw,
            busbw_gbs: busbw,
            wrong: Some(0),
            extra: json!({}),
            ..Default::default()
        }
    }

    #[test]
    fn nccl_headline_is_the_mean_of_modes_at_the_largest_size() {
        let rows = vec![
            row(8, Some(0.0), Some(0.0), Some(7.0)),
            row(1 << 33, Some(346.0), None, None),
            row(1 << 33, Some(344.0), None, None),
            row(1 << 32, Some(340.0), None, None),
        ];
        let e = extract("nccl", &json!({"op": "all_gather"}), &rows);
        assert_eq!(e.test, "nccl.all_gather");
        assert_eq!(
            e.figures,
            vec![Figure {
                test: "nccl.all_gather".into(),
                metric: "busbw_gbs".into(),
                size_bytes: 1 << 33,
                value: 345.0,
                pair: None,
            }]
        );
        assert_eq!(extract("nccl", &json!({}), &rows).test, "nccl.all_reduce");
    }

    #[test]
    fn wrong_elements_are_counted_and_nan_ignored() {
        let mut rows = vec![
            row(1024, Some(f64::NAN), None, None),
            row(2048, Some(3.0), None, None),
        ];
        rows[0].wrong = Some(5);
        rows[1].wrong = Some(2);
        let e = extract("nccl", &json!({}), &rows);
        assert_eq!(e.wrong, 7);
        assert_eq!(e.figures[0].size_bytes, 2048);
    }

    #[test]
    fn rdma_latency_is_taken_at_the_smallest_size() {
        let rows = vec![
            row(2, None, None, Some(1.9)),
            row(65536, None, None, Some(4.0)),
        ];
        let e = extract("rdma", &json!({"test": "ib_write_lat"}), &rows);
        assert_eq!(
            (
                e.test.as_str(),
                e.figures[0].metric.as_str(),
                e.figures[0].value
            ),
            ("rdma.ib_write_lat", "time_us", 1.9)
        );
        let bw = extract("rdma", &json!({}), &[row(65536, None, Some(45.0), None)]);
        assert_eq!(
            (bw.test.as_str(), bw.figures[0].metric.as_str()),
            ("rdma.ib_write_bw", "algbw_gbs")
        );
    }

    #[test]
    fn ucx_and_p2p_give_one_figure_per_test() {
        let mut lat = row(8, None, Some(0.01), Some(0.8));
        lat.op = Some("tag_lat".into());
        let mut bw = row(65536, None, Some(0.25), Some(261.0));
        bw.op = Some("tag_bw".into());
        let e = extract("ucx", &json!({}), &[lat, bw.clone()]);
        assert_eq!(e.test, "ucx");
        let names: Vec<(&str, &str)> = e
            .figures
            .iter()
            .map(|f| (f.test.as_str(), f.metric.as_str()))
            .collect();
        assert_eq!(
            names,
            vec![("ucx.tag_bw", "algbw_gbs"), ("ucx.tag_lat", "time_us")]
        );
        assert_eq!(
            extract("ucx", &json!({}), &[bw]).test,
            "ucx.tag_bw",
            "one test names the verdict"
        );

        let p2p = |kind: &str, bw: f64| {
            let mut r = row(1 << 28, None, Some(bw), None);
            r.labels = [("kind".to_string(), kind.to_string())].into();
            r
        };
        let e = extract(
            "p2p",
            &json!({}),
            &[p2p("d2d", 300.0), p2p("d2d", 120.0), p2p("h2d", 50.0)],
        );
        assert_eq!(e.test, "p2p");
        assert_eq!(
            e.figures[0],
            Figure {
                test: "p2p.d2d".into(),
                metric: "algbw_gbs".into(),
                size_bytes: 1 << 28,
                value: 120.0,
                pair: None,
            },
            "the worst pair"
        );
        assert_eq!(e.figures[1].test, "p2p.h2d");
    }

    fn copy(kind: &str, src: &str, dst: &str, size: i64, bw: f64) -> ResultRow {
        let mut r = row(size, None, Some(bw), None);
        r.labels = [("kind", kind), ("src", src), ("dst", dst)]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into();
        r
    }

    #[test]
    fn p2p_has_one_unjudged_figure_per_copy_at_the_headline_size() {
        let mut bidir = [
            copy("d2d", "0", "1", 1 << 28, 700.0),
            copy("d2d", "1", "0", 1 << 28, 700.0),
        ];
        for r in &mut bidir {
            r.labels.insert("mode".into(), "bidir".into());
        }
        let rows = [
            copy("d2d", "0", "0", 1 << 28, 1300.0),
            copy("d2d", "0", "1", 1 << 28, 370.0),
            copy("d2d", "1", "0", 1 << 28, 330.0),
            copy("d2d", "1", "1", 1 << 28, 1290.0),
            // A smaller size is another band: not the headline's.
            copy("d2d", "0", "1", 1 << 20, 90.0),
            copy("d2d", "1", "0", 1 << 28, f64::NAN),
            bidir[0].clone(),
            bidir[1].clone(),
            copy("h2d", "host", "0", 1 << 28, 52.0),
            copy("h2d", "host", "1", 1 << 28, 51.0),
            copy("d2h", "0", "host", 1 << 28, 53.0),
            // No destination: no pair to name.
            copy("d2h", "1", "", 1 << 28, 49.0),
        ];
        let pairs = pairs("p2p", &rows);
        let got: Vec<(&str, &str, i64, f64)> = pairs
            .iter()
            .map(|f| {
                assert_eq!(f.metric, "algbw_gbs");
                (
                    f.test.as_str(),
                    f.pair.as_deref().unwrap(),
                    f.size_bytes,
                    f.value,
                )
            })
            .collect();
        let big = 1 << 28;
        assert_eq!(
            got,
            vec![
                ("p2p.d2d", "0-0", big, 1300.0),
                ("p2p.d2d", "0-1", big, 370.0),
                ("p2p.d2d", "0-1 bidir", big, 700.0),
                ("p2p.d2d", "1-0", big, 330.0),
                ("p2p.d2d", "1-1", big, 1290.0),
                ("p2p.d2h", "0-host", big, 53.0),
                ("p2p.h2d", "host-0", big, 52.0),
                ("p2p.h2d", "host-1", big, 51.0),
            ]
        );
        // The judged figures are what they were: the worst copy of each kind, no pair.
        let e = extract("p2p", &json!({}), &rows);
        let judged: Vec<(&str, f64, Option<&str>)> = e
            .figures
            .iter()
            .map(|f| (f.test.as_str(), f.value, f.pair.as_deref()))
            .collect();
        assert_eq!(
            judged,
            vec![
                ("p2p.d2d", 330.0, None),
                ("p2p.d2h", 49.0, None),
                ("p2p.h2d", 51.0, None)
            ]
        );
        assert_eq!(e.test, "p2p");
        // Other kinds have none, even with the same labels.
        assert!(pairs_of_other_kinds_are_empty(&rows));
    }

    fn pairs_of_other_kinds_are_empty(rows: &[ResultRow]) -> bool {
        ["nccl", "ucx", "memcpy", "rdma"]
            .iter()
            .all(|k| pairs(k, rows).is_empty())
    }

    #[test]
    fn stored_figures_keep_their_json_and_add_a_pair_only_when_there_is_one() {
        let mut f = Figure {
            test: "p2p.d2d".into(),
            metric: "algbw_gbs".into(),
            size_bytes: 256 << 20,
            value: 330.5,
            pair: None,
        };
        // `verdicts.figures` as written before pairs existed.
        assert_eq!(
            stored(&f).to_string(),
            r#"{"band":28,"metric":"algbw_gbs","size_bytes":268435456,"test":"p2p.d2d","value":330.5}"#
        );
        f.pair = Some("0-1".into());
        assert_eq!(
            stored(&f).to_string(),
            r#"{"band":28,"metric":"algbw_gbs","pair":"0-1","size_bytes":268435456,"test":"p2p.d2d","value":330.5}"#
        );
        // Read back as the wire type (the band is the server's own).
        assert_eq!(serde_json::from_value::<Figure>(stored(&f)).unwrap(), f);
    }

    #[test]
    fn other_kinds_have_no_figures() {
        let e = extract("sleep", &json!({}), &[]);
        assert_eq!((e.test.as_str(), e.figures.len()), ("sleep", 0));
        assert_eq!(
            extract("sweep", &json!({}), &[row(8, Some(1.0), None, None)])
                .figures
                .len(),
            0
        );
        assert_eq!(
            extract("memcpy", &json!({}), &[row(1 << 20, None, Some(9.5), None)]).test,
            "memcpy"
        );
    }

    #[test]
    fn rdma_ab_is_judged_on_the_large_band_ratio() {
        let leg = |leg: &str, size: i64, bw: f64| ResultRow {
            labels: [("leg".to_string(), leg.to_string())].into(),
            ..row(size, Some(bw), None, None)
        };
        let rows = [
            leg("rdma", 1 << 20, 25.4),
            leg("socket", 1 << 20, 6.8),
            leg("rdma", 128 << 20, 122.3),
            leg("socket", 128 << 20, 29.1),
        ];
        let e = extract("rdma_ab", &json!({"op": "all_reduce"}), &rows);
        assert_eq!(e.test, "rdma_ab.all_reduce");
        assert_eq!(e.figures.len(), 1);
        let f = &e.figures[0];
        assert_eq!(
            (f.metric.as_str(), f.size_bytes),
            ("rdma_speedup", 128 << 20)
        );
        assert!((f.value - 122.3 / 29.1).abs() < 1e-9);
        assert!(!lower_is_better(&f.metric));
        // Without a large size there is no figure: nothing to judge, said by the verdict.
        let e = extract("rdma_ab", &json!({}), &rows[..2]);
        assert!(e.figures.is_empty());
    }

    #[test]
    fn size_bands_are_powers_of_two() {
        assert_eq!(size_band(1), 0);
        assert_eq!(size_band(1 << 30), 30);
        assert_eq!(size_band((1 << 31) - 1), 30);
        assert_eq!(size_band(0), 0);
    }
}
