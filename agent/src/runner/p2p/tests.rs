//! Tests of `p2p`.

use super::*;

#[test]
fn params_defaults_and_rejections() {
    let p = Params::from_json(&json!({})).unwrap();
    assert_eq!(p, Params::default());
    assert_eq!(p.size, 256 << 20);
    let p = Params::from_json(
        &json!({"size": 1024, "iters": 3, "warmup": 0, "bidirectional": true, "gpus": [1, 0]}),
    )
    .unwrap();
    assert_eq!(p.devices(2).unwrap(), vec![1, 0]);
    assert!(p.devices(1).unwrap_err().contains("GPU 1 requested"));
    assert_eq!(Params::default().devices(3).unwrap(), vec![0, 1, 2]);
    for bad in [
        json!({"size": 0}),
        json!({"size": MAX_SIZE + 1}),
        json!({"iters": 0}),
        json!({"size": "big"}),
        json!({"bidirectional": "yes"}),
        json!({"gpus": []}),
        json!({"gpus": [0, 0]}),
        json!({"gpus": [-1]}),
        json!({"gpus": 0}),
    ] {
        assert!(
            matches!(Params::from_json(&bad), Err(RunError::Params(_))),
            "{bad}"
        );
    }
}

#[test]
fn rows_carry_labels_and_gbs() {
    let r = row(
        256 << 20,
        Transfer {
            src: "0",
            dst: "1",
            kind: "d2d",
            path: Path::P2p,
            bidir: false,
        },
        1000.0,
        0,
    );
    assert_eq!(r.labels["src"], "0");
    assert_eq!(r.labels["path"], "p2p");
    assert!(!r.labels.contains_key("mode"));
    // 268,435,456 B in 1 ms is 268.4 GB/s (10⁹ bytes/s).
    assert!((r.algbw_gbs.unwrap() - 268.435456).abs() < 1e-9);
    let b = row(
        256 << 20,
        Transfer {
            src: "1",
            dst: "0",
            kind: "d2d",
            path: Path::P2p,
            bidir: true,
        },
        1000.0,
        0,
    );
    assert_eq!(b.labels["mode"], "bidir");
    assert!((b.algbw_gbs.unwrap() - 2.0 * 268.435456).abs() < 1e-9);
    assert_eq!(b.extra["bytes_moved"], json!(2u64 * (256 << 20)));
}

fn two_gpu_rows() -> Vec<ResultRow> {
    vec![
        row(
            1 << 20,
            Transfer {
                src: "0",
                dst: "0",
                kind: "d2d",
                path: Path::Local,
                bidir: false,
            },
            1.0,
            0,
        ),
        row(
            1 << 20,
            Transfer {
                src: "0",
                dst: "1",
                kind: "d2d",
                path: Path::P2p,
                bidir: false,
            },
            2.0,
            0,
        ),
        row(
            1 << 20,
            Transfer {
                src: "1",
                dst: "0",
                kind: "d2d",
                path: Path::Staged,
                bidir: false,
            },
            4.0,
            0,
        ),
        row(
            1 << 20,
            Transfer {
                src: "1",
                dst: "1",
                kind: "d2d",
                path: Path::Local,
                bidir: false,
            },
            1.0,
            0,
        ),
        row(
            1 << 20,
            Transfer {
                src: "0",
                dst: "1",
                kind: "d2d",
                path: Path::P2p,
                bidir: true,
            },
            2.0,
            0,
        ),
        row(
            1 << 20,
            Transfer {
                src: "1",
                dst: "0",
                kind: "d2d",
                path: Path::Staged,
                bidir: true,
            },
            2.0,
            0,
        ),
        row(
            1 << 20,
            Transfer {
                src: "host",
                dst: "0",
                kind: "h2d",
                path: Path::Pinned,
                bidir: false,
            },
            20.0,
            0,
        ),
        row(
            1 << 20,
            Transfer {
                src: "0",
                dst: "host",
                kind: "d2h",
                path: Path::Pinned,
                bidir: false,
            },
            25.0,
            3,
        ),
    ]
}

#[test]
fn summary_matrices_follow_the_rows() {
    let s = summarize(&two_gpu_rows(), &[0, 1]);
    assert_eq!(s["d2d_gbs"][0][1], json!(gbs(1 << 20, 2.0)));
    assert_eq!(s["d2d_gbs"][1][0], json!(gbs(1 << 20, 4.0)));
    assert_eq!(
        s["d2d_paths"],
        json!([["local", "p2p"], ["staged", "local"]])
    );
    assert_eq!(s["d2d_bidir_gbs"][0][0], Value::Null);
    assert_eq!(s["d2d_bidir_gbs"][1][0], json!(gbs(2 << 20, 2.0)));
    assert_eq!(s["h2d_gbs"], json!([gbs(1 << 20, 20.0), null]));
    assert_eq!(s["d2h_gbs"], json!([gbs(1 << 20, 25.0), null]));
    assert_eq!(s["wrong"], json!(3));
}

#[test]
fn render_prints_a_matrix_and_host_table() {
    let mut s = summarize(&two_gpu_rows(), &[0, 1]);
    s.insert("gpus".into(), json!([{"index": 0}, {"index": 1}]));
    let text = render(&s);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[1], "src\\dst     GPU0     GPU1");
    assert_eq!(lines[2], "   GPU0  1048.58l   524.29p");
    assert_eq!(lines[3], "   GPU1   262.14s  1048.58l");
    assert!(text.contains("Bidirectional"));
    assert!(text.contains("   GPU1        -        -"), "{text}");
}
