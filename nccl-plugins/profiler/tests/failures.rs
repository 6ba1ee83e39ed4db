//! The built plugin when things go wrong around it: a spool directory it cannot use, more
//! communicators than it keeps, handles and contexts that are stale, foreign or junk.
//! Every call must still return success and the job go on.

mod common;

use std::ffi::c_void;

use common::*;
use heddle_nccl_profiler::abi::{self, event};
use heddle_nccl_profiler::host::{self, Comm, Net, Op, Prepared};

#[test]
fn a_spool_directory_that_is_missing_or_unwritable_turns_the_plugin_off() {
    for (n, spool) in [(0, "/nonexistent/heddle/spool"), (1, "/proc/self")] {
        in_child(
            "a_spool_directory_that_is_missing_or_unwritable_turns_the_plugin_off",
            &[("HEDDLE_PROFILER_SPOOL", spool), ("CASE", &n.to_string())],
            || {
                let mut host = load();
                let (c, rc) = host.init(0x5, None, 2, 2, 0);
                assert_eq!(rc, 0, "init succeeds: the job goes on");
                assert_eq!(host.mask(), 0, "and asks NCCL for no events");
                // NCCL may still call with what it has: every call succeeds.
                host.ignore_mask = true;
                for _ in 0..3 {
                    ok(host.op(
                        c,
                        &op("AllReduce", 1024, "ncclFloat32", "RING", 10),
                        Some(&Net::Ib),
                    ));
                }
                let (c2, rc) = host.init(0x6, None, 1, 2, 1);
                assert_eq!(rc, 0);
                assert_eq!(host.finalize(c), 0);
                assert_eq!(host.finalize(c2), 0);
                let log = host::LOG.lock().unwrap();
                let off: Vec<_> = log
                    .iter()
                    .filter(|l| l.contains("off for this process"))
                    .collect();
                assert_eq!(off.len(), 1, "one INFO line: {log:?}");
                assert!(off[0].starts_with("PROFILER/Plugin: heddle"), "{off:?}");
            },
        );
    }
}

#[test]
fn communicators_beyond_the_limit_are_counted_not_kept() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().to_str().unwrap().to_string();
    in_child(
        "communicators_beyond_the_limit_are_counted_not_kept",
        &[("HEDDLE_PROFILER_SPOOL", &spool)],
        || {
            let host = load();
            let max = heddle_types::observe::MAX_COMMS as u64;
            let comms: Vec<Comm> = (0..max + 2)
                .map(|i| host.init(i, None, 1, 2, 0).0)
                .collect();
            assert!(comms[..max as usize].iter().all(|c| !c.ctx.is_null()));
            assert!(comms[max as usize..].iter().all(|c| c.ctx.is_null()));
            for c in &comms {
                ok(host.op(*c, &op("AllReduce", 4, "ncclFloat32", "RING", 1), None));
            }
            for c in &comms {
                assert_eq!(host.finalize(*c), 0);
            }
            let f = spool_file(&spool_env());
            assert!(f.is_final, "every communicator, kept or not, was finalized");
            assert_eq!((f.comms.len() as u64, f.dropped_comms), (max, 2));
            assert!(f.comms.iter().all(|c| c.ops[0].ops == 1));
        },
    );
}

#[test]
fn stale_foreign_and_null_handles_are_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().to_str().unwrap().to_string();
    in_child(
        "stale_foreign_and_null_handles_are_ignored",
        &[("HEDDLE_PROFILER_SPOOL", &spool)],
        || {
            let host = load();
            let t = host.table();
            let (c, _) = host.init(0x8, None, 1, 2, 0);
            let p = Prepared::new(&Op {
                channels: 0,
                ..op("AllReduce", 4, "ncclFloat32", "RING", 0)
            });
            let (h, _) = host.start_task(c, &p);
            assert_eq!(host.stop_handle(h), 0);
            let mut local = 0u64;
            for junk in [
                h,
                std::ptr::null_mut(),
                0x1234 as *mut c_void,
                &mut local as *mut u64 as *mut c_void,
            ] {
                assert_eq!(host.stop_handle(junk), 0);
                let mut args = abi::StateArgs { p_timer: 5 };
                // SAFETY: the plugin must accept any handle word.
                assert_eq!(
                    unsafe { (t.record_event_state)(junk, abi::STATE_KERNEL_CH_STOP, &mut args) },
                    0
                );
                // A kernel channel whose parent is junk gets no handle.
                // SAFETY: a zeroed descriptor is valid.
                let mut d: abi::EventDescrV5 = unsafe { std::mem::zeroed() };
                d.type_ = event::KERNEL_CH;
                d.parent_obj = junk;
                let mut out = 0x99 as *mut c_void;
                assert_eq!(unsafe { (t.start_event)(c.ctx, &mut out, &mut d) }, 0);
                assert!(out.is_null());
            }
            // Another process's context for the same communicator (PXN hands those to a
            // peer's proxy thread): its pid differs, so it is not taken for this one.
            let foreign = (c.ctx as usize ^ (1 << 16)) as *mut c_void;
            let mut n: abi::EventDescrV5 = unsafe { std::mem::zeroed() };
            n.type_ = event::PROXY_OP;
            let mut out = std::ptr::null_mut();
            assert_eq!(unsafe { (t.start_event)(foreign, &mut out, &mut n) }, 0);
            // Junk contexts and descriptors.
            let mut out = std::ptr::null_mut();
            let mut d = abi::EventDescrV5 {
                type_: event::COLL,
                ..unsafe { std::mem::zeroed() }
            };
            assert_eq!(
                unsafe { (t.start_event)(0x77 as *mut c_void, &mut out, &mut d) },
                0
            );
            assert!(out.is_null());
            assert_eq!(
                unsafe { (t.start_event)(c.ctx, &mut out, std::ptr::null_mut()) },
                0
            );
            assert_eq!(unsafe { (t.finalize)(0x77 as *mut c_void) }, 0);
            host.finalize(c);
            assert_eq!(host.finalize(c), 0, "a second finalize is harmless");
            let f = spool_file(&spool_env());
            assert!(f.is_final);
            assert_eq!(f.comms[0].ops[0].ops, 1);
            assert_eq!(
                f.comms[0].proxy_ops, 0,
                "the foreign context's proxy operation"
            );
        },
    );
}
