//! Our preamble and `-J` document against nccl-tests 2.19.6's own output, captured on an
//! H100 with `all_reduce_perf -b 8 -e 1M -f 4 -g 1 -J FILE` (in the captures the `-J`
//! path is shortened and the JSON's `env` is cut to its NCCL_*/CUDA_* entries, as ours).

use std::collections::BTreeSet;

use serde_json::Value;

use super::*;
use crate::runner::nccl::spec::{Collective, Sweep};

fn capture(name: &str) -> String {
    std::fs::read_to_string(format!(
        "{}/tests/captures/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

/// The parameters of the captured run.
fn captured_params() -> Params {
    Params {
        coll: Collective::AllReduce,
        sweep: Sweep {
            min_bytes: 8,
            max_bytes: 1 << 20,
            factor: 4,
            step_bytes: None,
        },
        warmup: 1,
        iters: 20,
        // nccl-tests was run without -G: every size launched one by one.
        graph: Some(0),
        ..Params::default()
    }
}

fn h100() -> RankLine {
    RankLine {
        rank: 0,
        pid: 1239,
        host: "vm".into(),
        dev: DeviceInfo {
            device: 0,
            name: "NVIDIA H100 80GB HBM3".into(),
            bus_id: "0000:00:06".into(),
        },
    }
}

#[test]
fn preamble_lines_are_nccl_tests_lines() {
    let theirs = capture("nccl_tests_all_reduce_1rank_h100.txt");
    let ours = preamble(&captured_params(), 22803, &[h100()]);
    for prefix in [
        "# Collective test starting:",
        "# nThread ",
        "# Using devices",
        "#  Rank ",
    ] {
        let find = |text: &str| {
            text.lines()
                .find(|l| l.starts_with(prefix))
                .map(str::to_owned)
        };
        assert_eq!(find(&ours), find(&theirs), "{prefix}");
    }
    assert!(ours.ends_with("#  Rank  0 Group  0 Pid   1239 on         vm device  0 [0000:00:06] NVIDIA H100 80GB HBM3\n#"));
    let budget = Params {
        budget: Some(std::time::Duration::from_secs(10)),
        ..captured_params()
    };
    assert!(preamble(&budget, 22803, &[]).contains("# Budget: 10.000 s"));
}

/// Every key path of a JSON value, lists seen through their first element.
fn keys(v: &Value, at: &str, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                let p = format!("{at}/{k}");
                out.insert(p.clone());
                keys(v, &p, out);
            }
        }
        Value::Array(a) => {
            if let Some(first) = a.first() {
                keys(first, &format!("{at}/0"), out);
            }
        }
        _ => {}
    }
}

fn row(size: i64, in_place: bool, time_us: f64) -> ResultRow {
    ResultRow {
        size_bytes: size,
        count: Some(size / 4),
        dtype: Some("float".into()),
        op: Some("all_reduce".into()),
        root: Some(-1),
        in_place: Some(in_place),
        time_us: Some(time_us),
        algbw_gbs: Some(size as f64 / time_us / 1e3),
        busbw_gbs: Some(0.0),
        wrong: Some(0),
        labels: Default::default(),
        extra: serde_json::json!({"redop": "sum", "nranks": 1}),
    }
}

#[test]
fn json_document_has_every_key_of_nccl_tests_and_the_same_values() {
    let theirs: Value =
        serde_json::from_str(&capture("nccl_tests_all_reduce_1rank_h100.json")).unwrap();
    let p = captured_params();
    let rows = vec![row(8, false, 4.96425), row(8, true, 0.509)];
    let summary = Map::new();
    let args: Vec<String> = ["heddle-agent", "bench", "nccl", "all_reduce"]
        .map(String::from)
        .to_vec();
    let ranks = [h100()];
    let run = JsonRun {
        args: &args,
        env: vec!["NCCL_NVLS_ENABLE=0".into()],
        nccl_version: 22803,
        start_time: "2026-11-25 00:16:23".into(),
        end_time: "2026-11-25 00:16:24".into(),
        params: &p,
        ranks: &ranks,
        rows: &rows,
        summary: &summary,
    };
    let ours = run.document();
    let (mut a, mut b) = (BTreeSet::new(), BTreeSet::new());
    keys(&theirs, "", &mut a);
    keys(&ours, "", &mut b);
    let missing: Vec<_> = a.difference(&b).collect();
    assert!(
        missing.is_empty(),
        "keys nccl-tests writes and we do not: {missing:?}"
    );
    let extra: Vec<_> = b.difference(&a).collect();
    assert_eq!(extra, vec!["/heddle"], "keys beyond nccl-tests'");
    // Same values where the run is the same.
    assert_eq!(ours["config"], theirs["config"]);
    for k in [
        "version",
        "nccl_version",
        "out_of_bounds",
        "start_time",
        "end_time",
    ] {
        assert_eq!(ours[k], theirs[k], "{k}");
    }
    let (o, t) = (&ours["results"][0], &theirs["results"][0]);
    for k in [
        "size",
        "count",
        "type",
        "redop",
        "root",
        "actual_iterations",
    ] {
        assert_eq!(o[k], t[k], "results/0/{k}");
    }
    assert_eq!(o["out_of_place"]["time"], t["out_of_place"]["time"]);
    assert_eq!(o["in_place"]["nwrong"], t["in_place"]["nwrong"]);
}

#[test]
fn spread_notes_follow_the_columns() {
    let mut oop = row(8, false, 5.0);
    let ip = row(8, true, 0.5);
    assert_eq!(spread_note(&oop, Some(&ip)), "");
    oop.extra["spread"] = serde_json::json!({"rsd_pct": 0.4321, "samples": 12});
    assert_eq!(spread_note(&oop, Some(&ip)), "  # spread ±0.43% n=12 | -");
}

#[test]
fn json_files_are_never_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.json");
    assert_eq!(write_new(&path, "1").unwrap(), path);
    let second = write_new(&path, "2").unwrap();
    assert_eq!(second, dir.path().join("out.json.0"));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "1");
    assert_eq!(std::fs::read_to_string(&second).unwrap(), "2");
    assert_eq!(
        write_new(&path, "3").unwrap(),
        dir.path().join("out.json.1")
    );
}

/// `nccl-library=` of nccl-tests' first line.
fn nccl_library(capture: &str) -> i32 {
    capture
        .lines()
        .next()
        .and_then(|l| l.split("nccl-library=").nth(1))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("nccl-library= on the first line")
}

/// The capture's `#  Rank  0 Group  0 Pid   4242 on   host device  0 [0000:00:06] NAME`
/// lines, as the ranks our preamble describes.
fn rank_lines(capture: &str) -> Vec<RankLine> {
    capture
        .lines()
        .filter(|l| l.starts_with("#  Rank "))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (bus, name) = l
                .split_once('[')
                .and_then(|(_, r)| r.split_once("] "))
                .unwrap();
            RankLine {
                rank: f[2].parse().unwrap(),
                pid: f[6].parse().unwrap(),
                host: f[8].into(),
                dev: DeviceInfo {
                    device: f[10].parse().unwrap(),
                    name: name.trim_end().into(),
                    bus_id: bus.into(),
                },
            }
        })
        .collect()
}

/// Where each whitespace-separated field of a line ends.
fn field_ends(line: &str) -> Vec<usize> {
    let b = line.as_bytes();
    (0..b.len())
        .filter(|&i| b[i] != b' ' && (i + 1 == b.len() || b[i + 1] == b' '))
        .collect()
}

/// Our preamble, column header, row set and closing lines against nccl-tests' for the same
/// flags on two GPUs (`all_gather_perf` and `sendrecv_perf -g 2 -b 8 -e 128M -f 2 -w 5
/// -n 20 -G 0`, nccl-tests 2.19.6 on 2x H200; see tests/captures/README.md). Every line
/// must match but the first (ours names itself), the time of sizes that move nothing
/// (nccl-tests times a launch NCCL returns from at once; we launch nothing) and the last
/// digit of bandwidths computed from a time printed to 0.01 µs.
#[test]
fn two_gpu_tables_match_nccl_tests_line_for_line() {
    use crate::runner::nccl::spec::{Counts, Dtype};
    use crate::runner::nccl::{empty_row, row, table, timing};
    for (coll, file) in [
        (Collective::AllGather, "nccl_tests_all_gather_2gpu_h200.txt"),
        (Collective::SendRecv, "nccl_tests_sendrecv_2gpu_h200.txt"),
    ] {
        let theirs = capture(file);
        let p = Params {
            coll,
            dtype: Dtype::Float,
            sweep: Sweep {
                min_bytes: 8,
                max_bytes: 128 << 20,
                factor: 2,
                step_bytes: None,
            },
            warmup: 5,
            iters: 20,
            gpus: 2,
            graph: Some(0),
            every_size: true,
            ..Params::default()
        };
        let ours = preamble(&p, nccl_library(&theirs), &rank_lines(&theirs));
        let their_lines: Vec<&str> = theirs.lines().collect();
        let header_at = their_lines
            .iter()
            .position(|l| l.contains("out-of-place"))
            .unwrap();
        // Preamble: every line after the first, up to the column header.
        let our_pre: Vec<&str> = ours.lines().skip(1).collect();
        assert_eq!(our_pre, their_lines[1..header_at], "{file}: preamble");
        let header: Vec<&str> = table::header().lines().collect();
        assert_eq!(
            header,
            their_lines[header_at..header_at + 3],
            "{file}: header"
        );
        // Rows: ours from our plan with their times; the same set of sizes and counts.
        let data: Vec<&str> = their_lines[header_at + 3..]
            .iter()
            .take_while(|l| !l.starts_with('#'))
            .copied()
            .collect();
        let steps = p.steps(2);
        assert_eq!(steps.len(), data.len(), "{file}: one row per size");
        assert!(p.has_in_place());
        let mut rows = Vec::new();
        for ((c, measured), line) in steps.iter().zip(&data) {
            let f: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(f.len(), 13, "{file}: {line}");
            let t = |col: usize, in_place: bool| timing::Timing {
                time_us: f[col].parse().unwrap(),
                wrong: (!in_place || coll.checked_in_place()).then_some(0),
                graph: false,
                spread: None,
            };
            let mk = |c: &Counts, in_place: bool, col: usize| {
                if *measured {
                    row(&p, c, 2, in_place, t(col, in_place))
                } else {
                    empty_row(&p, c, 2, in_place)
                }
            };
            let (oop, ip) = (mk(c, false, 5), mk(c, true, 9));
            let mine = table::line(&oop, Some(&ip));
            let m: Vec<&str> = mine.split_whitespace().collect();
            // Same columns at the same places: every field ends where theirs does.
            assert_eq!(
                field_ends(&mine),
                field_ends(line),
                "{file}:\n{mine}\n{line}"
            );
            assert_eq!(m[..5], f[..5], "{file}: size, count, type, redop, root");
            if *measured {
                // algbw and busbw come from the time, which both print rounded to 0.01 µs:
                // the last digit may differ.
                for col in [6, 7, 10, 11] {
                    let (a, b): (f64, f64) = (m[col].parse().unwrap(), f[col].parse().unwrap());
                    assert!(
                        (a - b).abs() <= 0.011f64.max(b * 2e-3),
                        "{file}: column {col}: {mine} / {line}"
                    );
                }
                for col in [5, 8, 9, 12] {
                    assert_eq!(m[col], f[col], "{file}: column {col}");
                }
            }
            rows.push(oop);
            rows.push(ip);
        }
        // Closing lines: the same lines in the same order (the average differs only by the
        // rows that move nothing).
        let summary = Map::new();
        let foot = footer(&p, &rows, &summary);
        let ours: Vec<&str> = foot
            .lines()
            .filter(|l| !l.starts_with("# Time:"))
            .map(|l| l.split(':').next().unwrap())
            .collect();
        let theirs: Vec<&str> = their_lines[header_at + 3 + data.len()..]
            .iter()
            .filter(|l| !l.is_empty())
            .map(|l| l.split(':').next().unwrap())
            .collect();
        assert_eq!(ours, theirs, "{file}: closing lines");
    }
}
