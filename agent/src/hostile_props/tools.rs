//! The output of the tools a test runs: `ucx_info -d`/`-v`, `ucx_perftest` and its info
//! log (`runner::ucx_parse`), and perftest's `ib_*` tables and header (`runner::rdma`).
//! A broken or replaced tool on a node writes whatever it likes.

use proptest::prelude::*;

use super::{amplified, any_bytes, bounded, config, lines_of, mutated, seeds, text, timed};
use crate::runner::{rdma, ucx_parse};

const UCX: &[&str] = &[
    "ucx_info_d_loopback.txt",
    "ucx_info_d_seed000_cuda.txt",
    "ucx_info_d_seed000_rc.txt",
    "ucx_info_v.txt",
    "ucx_perftest_server_info_tcp.txt",
    "ucx_perftest_server_tag_lat.txt",
    "ucx_perftest_tag_bw.txt",
    "ucx_perftest_tag_lat.txt",
    "ucx_perftest_tag_lat_info_shm.txt",
    "ucx_perftest_tag_lat_info_tcp.txt",
    "ucx_perftest_ucp_put_bw.txt",
];

const UCX_WORDS: &[&str] = &[
    "# Memory domain: ",
    "#     Component: ",
    "#      Transport: ",
    "#         Device: ",
    "#           Type: ",
    "#  System device: ",
    "#      Bandwidth: ",
    "#        Latency: ",
    "# Library version: ",
    "# Version ",
    "|   latency (usec)  |",
    "| overhead (usec) |",
    "Final:",
    "ep_cfg[0]: ",
    "tag(",
    "rma(",
    ")",
    "tcp/lo",
    "rc_mlx5/mlx5_0:1",
    ",",
    ";",
];

const PERFTEST_WORDS: &[&str] = &[
    " #bytes",
    "#bytes ",
    "     ",
    "  ",
    "#iterations",
    "BW peak[MB/sec]",
    "BW average[Gb/sec]",
    "t_avg[usec]",
    "\t\t",
    "Device         : ",
    "Link type       : ",
    "Transport type : ",
    "Mtu             : ",
    "[B]",
    "GID index       : ",
    "mlx5_0",
    "IB",
    "---------",
];

fn check_ucx(bytes: &[u8]) -> Result<(), TestCaseError> {
    let t = text(bytes);
    let devices = timed(bytes, || ucx_parse::parse_info_devices(&t))?;
    // A device line of 10 bytes carries its domain, component and transport (64 bytes
    // each at most) and the JSON field names: linear, with a larger constant.
    bounded(bytes, &devices, 48)?;
    let version = timed(bytes, || ucx_parse::parse_version(&t))?;
    prop_assert!(version.is_none_or(|v| v.len() <= t.len()));
    if let Ok(perf) = timed(bytes, || ucx_parse::parse_perftest(&t))? {
        bounded(bytes, &perf, 16)?;
        prop_assert!(!perf.lines.is_empty() && perf.final_line().is_some());
    }
    let (lanes, line) = timed(bytes, || ucx_parse::parse_ep_cfg(&t))?;
    bounded(bytes, &(lanes, line), 16)?;
    Ok(())
}

fn check_perftest(bytes: &[u8]) -> Result<(), TestCaseError> {
    let t = text(bytes);
    match timed(bytes, || rdma::parse_perftest(&t))? {
        Ok(rows) => {
            bounded(bytes, &rows, 32)?;
            for r in &rows {
                // What a result row becomes is stored and shown: no panic on any number.
                bounded(bytes, &rdma::row("ib_write_bw", r), 64)?;
            }
        }
        Err(e) => prop_assert!(e.len() <= 300, "{} bytes of error", e.len()),
    }
    let header = timed(bytes, || rdma::parse_header(&t, 1))?;
    bounded(bytes, &header, 16)?;
    Ok(())
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn ucx_arbitrary_bytes(bytes in any_bytes()) {
        check_ucx(&bytes)?;
    }

    #[test]
    fn ucx_lines_of_ucx_words(bytes in lines_of(UCX_WORDS)) {
        check_ucx(&bytes)?;
    }

    #[test]
    fn ucx_mutated_captures(bytes in mutated(seeds(UCX, "ucx"))) {
        check_ucx(&bytes)?;
    }

    #[test]
    fn ucx_amplified_captures(bytes in amplified(seeds(UCX, "ucx"))) {
        check_ucx(&bytes)?;
    }

    #[test]
    fn perftest_arbitrary_bytes(bytes in any_bytes()) {
        check_perftest(&bytes)?;
    }

    #[test]
    fn perftest_lines_of_perftest_words(bytes in lines_of(PERFTEST_WORDS)) {
        check_perftest(&bytes)?;
    }

    #[test]
    fn perftest_mutated_tables(bytes in mutated(seeds(&[], "perftest"))) {
        check_perftest(&bytes)?;
    }

    #[test]
    fn perftest_amplified_tables(bytes in amplified(seeds(&[], "perftest"))) {
        check_perftest(&bytes)?;
    }
}

/// The regressions of the corpus, each once: a long name copied into every later line.
#[test]
fn long_names_are_not_copied_per_line() {
    for seed in seeds(&[], "perftest").iter().chain(&seeds(&[], "ucx")) {
        check_perftest(seed).unwrap();
        check_ucx(seed).unwrap();
    }
    let path = super::agent_dir().join("tests/corpus/perftest/regress_long_column_many_rows.txt");
    let rows = rdma::parse_perftest(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(rows.len(), 1000);
    assert!(rows[0].columns[0].0.len() <= 48);
}
