//! NCCL's INFO log, as a test's stderr or a job's log file: `runner::nccl::debug` (the
//! summary of a run) and `runner::nccl::evidence` (transport evidence, also
//! `heddle-agent check nccl-log` on any file a person points it at).

use proptest::prelude::*;

use super::{amplified, any_bytes, bounded, config, lines_of, mutated, seeds, text, timed};
use crate::runner::nccl::{debug, evidence};

const LOGS: &[&str] = &[
    "nccl_debug_info_1proc_2gpu_h200.log",
    "nccl_debug_info_2proc_rank0_h200.log",
    "nccl_info_1rank_socket_fallback_h100.log",
    "nccl_info_gdr_disabled_nccl1537.log",
    "nccl_info_ib_disabled_nccl1053.log",
    "nccl_info_ib_gdrdma_nccl707.log",
    "nccl_info_roce_nccltests185.log",
    "nccl_info_socket_forced_nccl676.log",
    "nccl_info_socket_nodevice_nccl952.log",
    "nccl_tests_all_reduce_1rank_h100.txt",
];

/// The markers the parsers look for.
const WORDS: &[&str] = &[
    "h:1:2 [0] NCCL INFO ",
    "h:1:2 [0] misc.cc:12 NCCL WARN ",
    "NCCL version ",
    "Using network ",
    "Channel ",
    "00/0 : 0[0] -> 1[1]",
    " via ",
    "NET/IB/0/GDRDMA",
    "P2P/CUMEM/read",
    "NET/Socket/0",
    "NET/IB : Using ",
    "[0]mlx5_0:1/IB",
    "mlx5_2:1/RoCE,",
    " OOB ",
    "Bootstrap : Using ",
    " set by environment to ",
    "NCCL_IB_GID_INDEX",
    "NCCL_IB_DISABLE",
    "GID index ",
    "GPU Direct RDMA Disabled",
    "GPU Direct RDMA Enabled",
    "No device found",
    " coll channels",
    "[",
    "]",
    "{",
    "}",
];

fn check(bytes: &[u8]) -> Result<(), TestCaseError> {
    let log = text(bytes);
    let summary = timed(bytes, || debug::parse(&log))?;
    bounded(bytes, &summary, 16)?;
    prop_assert!(summary.warnings.len() <= 20);
    prop_assert!(summary.channels <= summary.connections.values().sum::<u64>() as usize);
    let ev = timed(bytes, || evidence::parse(&log))?;
    bounded(bytes, &ev, 16)?;
    prop_assert!(ev.warnings.len() <= 50 && ev.ib_unavailable.len() <= 20);
    prop_assert!(ev.channel_lines == ev.transports.values().sum::<u64>());
    Ok(())
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn arbitrary_bytes(bytes in any_bytes()) {
        check(&bytes)?;
    }

    #[test]
    fn lines_of_nccl_words(bytes in lines_of(WORDS)) {
        check(&bytes)?;
    }

    #[test]
    fn mutated_captures(bytes in mutated(seeds(LOGS, "nccl_log"))) {
        check(&bytes)?;
    }

    #[test]
    fn amplified_captures(bytes in amplified(seeds(LOGS, "nccl_log"))) {
        check(&bytes)?;
    }
}

/// Every capture still reads as before any mutation: the seeds are what they claim.
#[test]
fn seeds_parse() {
    for log in seeds(LOGS, "nccl_log").iter().take(LOGS.len() - 1) {
        let log = text(log);
        assert!(debug::parse(&log).version.is_some() || !evidence::parse(&log).is_silent());
    }
}
