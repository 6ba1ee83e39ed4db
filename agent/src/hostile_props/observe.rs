//! NCCL Inspector's logs, written by any job's user into a directory the agent reads
//! (`observe::inspector::parse_log`; the files' own checks are `observe::ingest`'s).

use heddle_types::observe::{MAX_BANDS_PER_COMM, MAX_COMMS, MAX_SPOOL_FILE_LEN};
use proptest::prelude::*;

use super::{amplified, any_bytes, bounded, config, lines_of, mutated, seeds, timed};
use crate::lifecycle::observe::inspector::parse_log;

const WORDS: &[&str] = &[
    r#"{"header":{"id":""#,
    r#"0x7f8c496ae9f661"#,
    r#"","rank":2,"n_ranks":8,"nnodes":2},"metadata":{"dump_timestamp_us":"#,
    r#","pid":"#,
    r#"},"coll_perf":{"coll":""#,
    r#"AllReduce"#,
    r#"","coll_msg_size_bytes":"#,
    r#","coll_exec_time_us":"#,
    r#"}}"#,
    r#"\ud800"#,
    r#"\u0000"#,
    r#"1e400"#,
    r#"-1"#,
];

fn check(bytes: &[u8]) -> Result<(), TestCaseError> {
    // The reader hands the parser at most this much of a log's tail.
    let bytes = &bytes[bytes.len().saturating_sub(MAX_SPOOL_FILE_LEN)..];
    if let Ok(file) = timed(bytes, || parse_log(bytes, 1000))? {
        prop_assert!(file.check().is_ok());
        prop_assert!(file.comms.len() <= MAX_COMMS);
        prop_assert!(file.comms.iter().all(|c| c.ops.len() <= MAX_BANDS_PER_COMM));
        bounded(bytes, &file, 4)?;
        // What is uploaded reads back as the same observation.
        let json = serde_json::to_vec(&file).unwrap();
        prop_assert_eq!(
            heddle_types::observe::SpoolFile::parse(&json).unwrap(),
            file
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn inspector_arbitrary_bytes(bytes in any_bytes()) {
        check(&bytes)?;
    }

    #[test]
    fn inspector_lines_of_records(bytes in lines_of(WORDS)) {
        check(&bytes)?;
    }

    #[test]
    fn inspector_mutated_logs(bytes in mutated(seeds(&[], "inspector"))) {
        check(&bytes)?;
    }

    #[test]
    fn inspector_amplified_logs(bytes in amplified(seeds(&[], "inspector"))) {
        check(&bytes)?;
    }
}
