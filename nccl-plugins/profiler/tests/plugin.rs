//! The built plugin, loaded as NCCL loads it (dlopen + `ncclProfiler_v5`), driven through
//! its C ABI as NCCL does, its spool file read back with `SpoolFile::parse`: what it counts.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::*;
use heddle_nccl_profiler::abi::{self, ProfilerV4, event};
use heddle_nccl_profiler::host::{self, Comm, Net, Op, Prepared};

#[test]
fn aggregates_collectives_point_to_point_and_networks() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().to_str().unwrap().to_string();
    in_child(
        "aggregates_collectives_point_to_point_and_networks",
        &[
            ("HEDDLE_PROFILER_SPOOL", &spool),
            ("SLURM_JOB_ID", "4711\u{1b}[2J"),
            ("SLURM_STEP_ID", "0"),
            ("HEDDLE_POD_NAME", "trainer-0"),
            ("POD_NAMESPACE", "ml"),
            ("NCCL_NET_PLUGIN", "aws-ofi"),
        ],
        || {
            let host = load();
            assert_eq!(host.name(), "heddle");
            let (ib, rc) = host.init(0x11, Some("dp\u{7}group"), 2, 4, 1);
            assert_eq!(rc, 0);
            assert_eq!(
                host.mask(),
                0xce,
                "coll, p2p, proxy op, kernel channel, net plugin"
            );
            let (sock, _) = host.init(0x22, None, 2, 2, 0);
            let (local, _) = host.init(0x33, None, 1, 8, 7);
            let (other, _) = host.init(0x44, None, 3, 3, 2);
            let ar = op("AllReduce", 262_144, "ncclFloat32", "RING", 50_000);
            for _ in 0..5 {
                ok(host.op(ib, &ar, Some(&Net::Ib)));
            }
            for _ in 0..2 {
                ok(host.op(
                    ib,
                    &op("AllGather", 3000, "ncclBfloat16", "RING", 700),
                    Some(&Net::Ib),
                ));
            }
            ok(host.op(
                ib,
                &op("ReduceScatter", 1, "ncclFloat64", "TREE", 10),
                Some(&Net::Ib),
            ));
            // ncclUint8, which NCCL 2.28 names "Unknown".
            ok(host.op(
                ib,
                &op("Broadcast", 1000, "Unknown", "TREE", 10),
                Some(&Net::Ib),
            ));
            for _ in 0..3 {
                ok(host.op(ib, &op("Send", 2048, "ncclInt8", "", 100), Some(&Net::Ib)));
                ok(host.op(ib, &op("Recv", 2048, "ncclInt8", "", 100), Some(&Net::Ib)));
            }
            ok(host.op(
                sock,
                &op("AllReduce", 1 << 20, "ncclFloat16", "RING", 9000),
                Some(&Net::Socket),
            ));
            ok(host.op(
                local,
                &op("AllReduce", 8, "ncclInt64", "NVLS", 0),
                Some(&Net::Ib),
            ));
            ok(host.op(
                other,
                &op("AllReduce", 16, "ncclUint32", "PAT", 5),
                Some(&Net::Other(3)),
            ));
            for c in [ib, sock, local, other] {
                assert_eq!(host.finalize(c), 0);
            }
            let f = spool_file(&spool_env());
            assert!(f.is_final);
            assert_eq!(f.job.pid, std::process::id());
            // SAFETY: getuid cannot fail.
            assert_eq!(f.job.uid, unsafe { libc::getuid() });
            assert!(f.job.start_ticks > 0);
            assert_eq!(f.job.slurm_job_id.as_deref(), Some("4711[2J"));
            assert_eq!(f.job.slurm_step_id.as_deref(), Some("0"));
            assert_eq!(f.job.k8s_pod.as_deref(), Some("trainer-0"));
            assert_eq!(f.job.k8s_namespace.as_deref(), Some("ml"));
            assert_eq!((f.dropped_events, f.dropped_comms), (0, 0));

            let c = comm(&f, "0000000000000011");
            assert_eq!(c.name.as_deref(), Some("dpgroup"));
            assert_eq!((c.rank, c.nranks, c.nnodes), (1, 4, 2));
            assert!(c.finalized_at.is_some());
            let r = rows(c);
            assert_eq!(r[&("AllReduce".into(), 20)], (5, 5 << 20, 5, 5 * 50_000));
            assert_eq!(r[&("AllGather".into(), 12)], (2, 12_000, 2, 1400));
            assert_eq!(r[&("ReduceScatter".into(), 3)], (1, 8, 1, 10));
            assert_eq!(r[&("Broadcast".into(), 9)], (1, 1000, 1, 10));
            assert_eq!(r[&("Send".into(), 11)], (3, 6144, 3, 300));
            assert_eq!(r[&("Recv".into(), 11)], (3, 6144, 3, 300));
            assert_eq!(r.len(), 6);
            let allreduce = c.ops.iter().find(|b| b.func == "AllReduce").unwrap();
            assert_eq!(allreduce.algos, [("Ring".to_string(), 5)].into());
            assert_eq!(allreduce.protos, [("Simple".to_string(), 5)].into());
            assert_eq!(allreduce.max_channels, 4);
            let send = c.ops.iter().find(|b| b.func == "Send").unwrap();
            assert!(send.algos.is_empty() && send.protos.is_empty());
            // IB: every byte a channel sends as RDMA writes of at most 512 KiB, plus one
            // receive (no length) per channel.
            let sent: u64 = (5 << 20) + 12_000 + 8 + 1000 + 6 * 2048;
            assert_eq!(c.net.len(), 1);
            assert_eq!((c.net[0].net.as_str(), c.net[0].bytes), ("IB", sent));
            assert_eq!(c.proxy_ops, 15 * 4, "one proxy operation per channel");

            let c = comm(&f, "0000000000000022");
            assert_eq!(rows(c)[&("AllReduce".into(), 21)], (1, 2 << 20, 1, 9000));
            assert_eq!(c.net.len(), 1);
            assert_eq!(
                (c.net[0].net.as_str(), c.net[0].ops, c.net[0].bytes),
                ("Socket", 8, 2 << 20)
            );

            let c = comm(&f, "0000000000000033");
            assert_eq!(
                rows(c)[&("AllReduce".into(), 6)],
                (1, 64, 0, 0),
                "no GPU time of 0 ns"
            );
            assert!(
                c.net.is_empty() && c.proxy_ops == 0,
                "intra-node: no network"
            );
            assert_eq!(c.ops[0].algos, [("NVLS".to_string(), 1)].into());

            let c = comm(&f, "0000000000000044");
            assert_eq!(c.net[0].net, "aws-ofi");
            assert_eq!(c.ops[0].algos, [("PAT".to_string(), 1)].into());
        },
    );
}

#[test]
fn without_network_events_the_network_is_inferred() {
    for (case, nccl_net) in [(0, ""), (1, "IB")] {
        let dir = tempfile::tempdir().unwrap();
        let spool = dir.path().to_str().unwrap().to_string();
        in_child(
            "without_network_events_the_network_is_inferred",
            &[
                ("HEDDLE_PROFILER_SPOOL", &spool),
                ("NCCL_NET", nccl_net),
                ("CASE", &case.to_string()),
            ],
            || {
                let want = if std::env::var("NCCL_NET").unwrap() == "IB" {
                    "IB"
                } else {
                    "Socket"
                };
                let host = load();
                let (c, _) = host.init(0x3, None, 2, 2, 0);
                ok(host.op(
                    c,
                    &op("AllReduce", 1024, "ncclFloat32", "RING", 10),
                    Some(&Net::Silent),
                ));
                host.finalize(c);
                let f = spool_file(&spool_env());
                let net = &f.comms[0].net;
                assert_eq!(net.len(), 1);
                assert_eq!(
                    (
                        net[0].net.as_str(),
                        net[0].ops,
                        net[0].bytes,
                        net[0].inferred
                    ),
                    (want, 4, 0, true)
                );
            },
        );
    }
}

#[test]
fn slots_exhausted_count_drops_and_keep_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().to_str().unwrap().to_string();
    in_child(
        "slots_exhausted_count_drops_and_keep_bytes",
        &[
            ("HEDDLE_PROFILER_SPOOL", &spool),
            ("HEDDLE_PROFILER_SLOTS", "8"),
        ],
        || {
            let host = load();
            let (c, _) = host.init(0x1, None, 1, 2, 0);
            let p = Prepared::new(&Op {
                channels: 0,
                ..op("AllReduce", 256, "ncclFloat32", "RING", 0)
            });
            let handles: Vec<_> = (0..10).map(|_| host.start_task(c, &p)).collect();
            assert!(handles.iter().all(|&(_, rc)| rc == 0));
            let live: Vec<_> = handles.iter().filter(|(h, _)| !h.is_null()).collect();
            assert_eq!(live.len(), 8, "eight slots, ten operations in flight");
            for (h, _) in live {
                assert_eq!(host.stop_handle(*h), 0);
            }
            // Slots are free again: no more drops.
            for _ in 0..20 {
                ok(host.op(c, &op("AllReduce", 256, "ncclFloat32", "RING", 10), None));
            }
            host.finalize(c);
            let f = spool_file(&spool_env());
            assert_eq!(f.dropped_events, 2);
            let b = &f.comms[0].ops[0];
            assert_eq!(
                (b.ops, b.bytes),
                (30, 30 * 1024),
                "dropped operations keep their bytes"
            );
            assert_eq!(b.exec_ops, 20);
        },
    );
}

#[test]
fn many_threads_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().to_str().unwrap().to_string();
    in_child(
        "many_threads_at_once",
        &[
            ("HEDDLE_PROFILER_SPOOL", &spool),
            ("HEDDLE_PROFILER_INTERVAL_S", "0.05"),
        ],
        || {
            let host = load();
            let (shared, _) = host.init(0xaa, None, 2, 16, 0);
            let own: Vec<Comm> = (0..8)
                .map(|t| host.init(0x100 + t, None, 1, 8, 0).0)
                .collect();
            let big = op("AllReduce", 1 << 18, "ncclFloat32", "RING", 1000);
            let small = op("AllGather", 100, "ncclInt8", "RING", 10);
            std::thread::scope(|s| {
                for &mine in &own {
                    let (host, big, small) = (&host, &big, &small);
                    s.spawn(move || {
                        for i in 0..500 {
                            ok(host.op(
                                shared,
                                if i % 2 == 0 { big } else { small },
                                Some(&Net::Ib),
                            ));
                            ok(host.op(mine, small, None));
                        }
                    });
                }
            });
            for c in own.iter().chain([&shared]) {
                host.finalize(*c);
            }
            let f = spool_file(&spool_env());
            assert!(f.is_final);
            assert!(f.seq >= 1);
            assert_eq!(f.dropped_events, 0);
            let r = rows(comm(&f, "00000000000000aa"));
            assert_eq!(
                r[&("AllReduce".into(), 20)],
                (2000, 2000 << 20, 2000, 2000 * 1000)
            );
            assert_eq!(r[&("AllGather".into(), 6)], (2000, 200_000, 2000, 20_000));
            for t in 0..8 {
                let r = rows(comm(&f, &format!("{:016x}", 0x100 + t)));
                assert_eq!(r[&("AllGather".into(), 6)], (500, 50_000, 500, 5000));
            }
        },
    );
}

#[test]
fn periodic_writes_and_a_last_one_at_exit_without_finalize() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().to_str().unwrap().to_string();
    in_child(
        "periodic_writes_and_a_last_one_at_exit_without_finalize",
        &[
            ("HEDDLE_PROFILER_SPOOL", &spool),
            ("HEDDLE_PROFILER_INTERVAL_S", "0.1"),
        ],
        || {
            let host = load();
            let (c, _) = host.init(0x7, None, 1, 2, 0);
            ok(host.op(c, &op("AllReduce", 1024, "ncclFloat32", "RING", 10), None));
            std::thread::sleep(std::time::Duration::from_millis(450));
            let f = spool_file(&spool_env());
            assert!(f.seq >= 2, "rewritten every 0.1 s: seq {}", f.seq);
            assert!(!f.is_final);
            assert_eq!(f.comms[0].ops[0].ops, 1);
            ok(host.op(c, &op("AllReduce", 1024, "ncclFloat32", "RING", 10), None));
            // The child exits here without finalizing; its exit handler writes once more.
        },
    );
    if std::env::var_os(CHILD).is_none() {
        let f = spool_file(dir.path());
        assert!(!f.is_final);
        assert_eq!(f.comms[0].ops[0].ops, 2);
        assert!(f.comms[0].finalized_at.is_none());
    }
}

#[test]
fn the_v4_table_records_the_same_operations() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().to_str().unwrap().to_string();
    in_child(
        "the_v4_table_records_the_same_operations",
        &[("HEDDLE_PROFILER_SPOOL", &spool)],
        || {
            // SAFETY: as in `load`.
            let lib = unsafe { libloading::Library::new(lib_path()) }.unwrap();
            // SAFETY: as in `load`, the v4 table's address.
            let t: &ProfilerV4 =
                unsafe { &**lib.get::<*const ProfilerV4>(b"ncclProfiler_v4\0").unwrap() };
            let mask: &'static mut i32 = Box::leak(Box::new(0));
            let mut ctx = std::ptr::null_mut();
            // SAFETY: v4's init argument order: mask, name, hash.
            let rc = unsafe {
                (t.init)(
                    &mut ctx,
                    mask,
                    std::ptr::null(),
                    0x99,
                    1,
                    2,
                    1,
                    Some(host::logger()),
                )
            };
            assert_eq!(rc, 0);
            assert_eq!(*mask & event::COLL as i32, event::COLL as i32);
            // SAFETY: a zeroed v4 descriptor filled as NCCL 2.27 does.
            let mut d: abi::EventDescrV4 = unsafe { std::mem::zeroed() };
            d.type_ = event::COLL as u8;
            d.u.coll.func = c"AllGather".as_ptr();
            d.u.coll.count = 1 << 20;
            d.u.coll.datatype = c"ncclFloat32".as_ptr();
            d.u.coll.algo = c"RING".as_ptr();
            d.u.coll.proto = c"LL128".as_ptr();
            let mut h = std::ptr::null_mut();
            assert_eq!(unsafe { (t.start_event)(ctx, &mut h, &mut d) }, 0);
            assert!(!h.is_null());
            assert_eq!(unsafe { (t.stop_event)(h) }, 0);
            assert_eq!(unsafe { (t.finalize)(ctx) }, 0);
            std::mem::forget(lib);
            let f = spool_file(&spool_env());
            let b = &f.comms[0].ops[0];
            assert_eq!(
                (b.func.as_str(), b.size_band, b.ops, b.bytes),
                ("AllGather", 22, 1, 4 << 20)
            );
            assert_eq!(b.protos, [("LL128".to_string(), 1)].into());
            assert_eq!(f.comms[0].rank, 1);
        },
    );
}

#[test]
fn the_driver_writes_a_spool_file_through_the_built_plugin() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_heddle-profiler-drive"))
        .args([
            "--lib",
            lib_path().to_str().unwrap(),
            "--spool",
            dir.path().to_str().unwrap(),
        ])
        .args([
            "--comm-nranks",
            "2",
            "--nnodes",
            "2",
            "--rank",
            "1",
            "--comm-id",
            "beef",
        ])
        .args([
            "--op",
            "AllReduce:1048576:20",
            "--op",
            "Send:4096:3",
            "--net",
            "Socket",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let f = spool_file(dir.path());
    assert!(f.is_final);
    let c = comm(&f, "000000000000beef");
    assert_eq!((c.rank, c.nranks, c.nnodes), (1, 2, 2));
    let r = rows(c);
    assert_eq!(
        r[&("AllReduce".into(), 20)].0..=r[&("AllReduce".into(), 20)].1,
        20..=20 << 20
    );
    assert_eq!(r[&("Send".into(), 12)].1, 3 * 4096);
    assert_eq!(c.net[0].net, "Socket");
    assert_eq!(c.net[0].bytes, (20 << 20) + 3 * 4096);
}

#[test]
fn records_the_hash_the_environment_plugin_applied() {
    let hash = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
    for applied in [Some(hash), None] {
        let dir = tempfile::tempdir().unwrap();
        let spool = dir.path().join("spool");
        std::fs::create_dir(&spool).unwrap();
        let env_lib = if std::env::var_os(CHILD).is_none() {
            fake_env_plugin(dir.path(), applied)
        } else {
            PathBuf::new()
        };
        in_child(
            "records_the_hash_the_environment_plugin_applied",
            &[
                ("HEDDLE_PROFILER_SPOOL", spool.to_str().unwrap()),
                ("FAKE_ENV_PLUGIN", env_lib.to_str().unwrap()),
                ("WANT", applied.unwrap_or("")),
            ],
            || {
                // NCCL loads its environment plugin before any communicator.
                let env =
                    unsafe { libloading::Library::new(std::env::var("FAKE_ENV_PLUGIN").unwrap()) }
                        .unwrap();
                let host = load();
                let (c, _) = host.init(0x9, None, 1, 2, 0);
                host.finalize(c);
                let f = spool_file(&spool_env());
                let want = std::env::var("WANT").unwrap();
                assert_eq!(f.env_applied.unwrap_or_default(), want);
                drop(env);
            },
        );
    }
}

/// The default: kernel channel events (and NCCL's cost for them) only for the first share
/// of each interval. Operations run while the plugin asks for them have GPU times; those
/// run while it does not have none; the mask goes back and forth on its own.
#[test]
fn kernel_channel_events_are_on_for_their_share_of_each_interval() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().to_str().unwrap().to_string();
    in_child(
        "kernel_channel_events_are_on_for_their_share_of_each_interval",
        &[
            ("HEDDLE_PROFILER_SPOOL", &spool),
            ("HEDDLE_PROFILER_INTERVAL_S", "0.2"),
            ("HEDDLE_PROFILER_KERNEL", "0.5"),
        ],
        || {
            let host = load();
            let (c, _) = host.init(0x5, None, 1, 2, 0);
            let kernel_on = || host.mask() & event::KERNEL_CH != 0;
            assert!(kernel_on(), "on from the start of the first interval");
            // Operations of 1 MiB while on, of 1 KiB while off; one whose mask changed
            // while it ran is not counted as either.
            let (mut on, mut off, mut unsure) = (0u64, 0u64, 0u64);
            let (mut flips, mut was) = (0, true);
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            while (on < 20 || off < 20 || flips < 3) && std::time::Instant::now() < deadline {
                let before = kernel_on();
                if before != was {
                    flips += 1;
                    was = before;
                }
                let count = if before { 262_144 } else { 256 };
                ok(host.op(
                    c,
                    &op("AllReduce", count, "ncclFloat32", "RING", 1000),
                    None,
                ));
                match (before, kernel_on() == before) {
                    (true, true) => on += 1,
                    (false, true) => off += 1,
                    _ => unsure += 1,
                }
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            assert!(flips >= 3, "the mask changed {flips} times in 20 s");
            host.finalize(c);
            let f = spool_file(&spool_env());
            let r = rows(comm(&f, &format!("{:016x}", 0x5)));
            let timed = |band: u32| r.get(&("AllReduce".into(), band)).map_or(0, |x| x.2);
            let big = timed(20);
            assert!(
                (on..=on + unsure).contains(&big),
                "1 MiB operations run with kernel events: {on} (+{unsure} unsure), timed {big}"
            );
            assert!(
                timed(10) <= unsure,
                "1 KiB operations run without kernel events: {off}, timed {}",
                timed(10)
            );
            assert!(on >= 20 && off >= 20, "on {on}, off {off}");
        },
    );
}
