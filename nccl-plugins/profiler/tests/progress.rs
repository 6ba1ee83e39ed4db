//! Progress through the built plugin, driven as NCCL would: operations known complete by
//! their proxy operations, a collective left in flight written at once (not at the next
//! interval), and a communicator within a node, which has no completion signal.

mod common;

use std::time::{Duration, Instant};

use common::*;
use heddle_nccl_profiler::host::{Net, Prepared};
use heddle_types::observe::Completion;

#[test]
fn proxy_operations_complete_and_a_stuck_collective_is_written_at_once() {
    let dir = tempfile::tempdir().unwrap();
    in_child(
        "proxy_operations_complete_and_a_stuck_collective_is_written_at_once",
        &[
            ("HEDDLE_PROFILER_SPOOL", dir.path().to_str().unwrap()),
            // No periodic write in the test's time: only the prompt one can bring it.
            ("HEDDLE_PROFILER_INTERVAL_S", "3600"),
            ("HEDDLE_PROFILER_STALL_S", "0.3"),
            ("HEDDLE_PROFILER_KERNEL", "0"),
        ],
        || {
            let host = load();
            let (c, rc) = host.init(0xabc1, None, 2, 4, 1);
            assert_eq!(rc, 0);
            let ar = Prepared::new(&op("AllReduce", 1 << 18, "ncclFloat32", "RING", 1000));
            let send = Prepared::new(&op("Send", 1024, "ncclFloat32", "RING", 1000));
            let mut rcs = Vec::new();
            for _ in 0..5 {
                host.run(c, &ar, Some(&Net::Socket), &mut rcs);
            }
            host.run(c, &send, Some(&Net::Socket), &mut rcs);
            ok(rcs.clone());
            // The first write (at init) has no operations yet.
            let first = spool_file(&spool_env());
            let p = comm(&first, "000000000000abc1").progress.clone().unwrap();
            assert_eq!(p.coll_started, 0, "{p:?}");

            host.run_stuck(c, &ar, Some(&Net::Socket), &mut rcs);
            ok(rcs);
            let t0 = Instant::now();
            let p = loop {
                let f = spool_file(&spool_env());
                let p = comm(&f, "000000000000abc1").progress.clone().unwrap();
                if p.coll_started == 6 {
                    break p;
                }
                assert!(
                    t0.elapsed() < Duration::from_secs(5),
                    "no prompt write: {p:?}"
                );
                std::thread::sleep(Duration::from_millis(50));
            };
            assert_eq!(p.completion, Completion::Proxy);
            assert_eq!(
                (p.coll_started, p.coll_done, p.p2p_started, p.p2p_done),
                (6, 5, 1, 1)
            );
            let f = p.in_flight.as_ref().unwrap();
            assert_eq!(
                (f.seq, f.p2p, f.func.as_str(), f.nccl_seq),
                (6, false, "AllReduce", Some(5))
            );
            assert_eq!(f.bytes, 1 << 20);
            assert_eq!(
                p.proxy_in_flight, 4,
                "one proxy operation per channel, none stopped"
            );
            assert_eq!(
                p.arrivals.iter().map(|a| a[0]).collect::<Vec<_>>(),
                [1, 2, 3, 4, 5, 6]
            );
            // On the wall clock, within a few seconds of now.
            let now = chrono::Utc::now().timestamp_nanos_opt().unwrap() as u64;
            assert!(now.abs_diff(f.started_ns) < 5_000_000_000, "{f:?}");
            assert!(p.arrivals.windows(2).all(|w| w[0][1] <= w[1][1]));
            host.finalize(c);
        },
    );
}

#[test]
fn a_communicator_within_a_node_has_no_completion_signal() {
    let dir = tempfile::tempdir().unwrap();
    in_child(
        "a_communicator_within_a_node_has_no_completion_signal",
        &[
            ("HEDDLE_PROFILER_SPOOL", dir.path().to_str().unwrap()),
            ("HEDDLE_PROFILER_KERNEL", "0"),
        ],
        || {
            let host = load();
            let (c, _) = host.init(0xabc2, None, 1, 2, 0);
            for _ in 0..3 {
                ok(host.op(c, &op("AllGather", 1024, "ncclFloat32", "RING", 1000), None));
            }
            host.finalize(c);
            let f = spool_file(&spool_env());
            let p = comm(&f, "000000000000abc2").progress.clone().unwrap();
            assert_eq!(p.completion, Completion::None);
            assert_eq!((p.coll_started, p.coll_done), (3, 0));
            // Without a signal, what it may be in is the last one started.
            assert_eq!(p.in_flight.unwrap().seq, 3);
        },
    );
}

#[test]
fn kernel_channels_always_on_complete_every_operation() {
    let dir = tempfile::tempdir().unwrap();
    in_child(
        "kernel_channels_always_on_complete_every_operation",
        &[("HEDDLE_PROFILER_SPOOL", dir.path().to_str().unwrap())],
        || {
            let host = load();
            let (c, _) = host.init(0xabc3, None, 1, 2, 0);
            for _ in 0..3 {
                ok(host.op(c, &op("AllGather", 1024, "ncclFloat32", "RING", 1000), None));
            }
            host.finalize(c);
            let f = spool_file(&spool_env());
            let p = comm(&f, "000000000000abc3").progress.clone().unwrap();
            assert_eq!(p.completion, Completion::Kernel);
            assert_eq!((p.coll_started, p.coll_done, p.in_flight), (3, 3, None));
        },
    );
}
