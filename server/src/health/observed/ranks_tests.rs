use heddle_types::observe::InFlight;
use heddle_types::observe::progress::CLOCK_REALTIME;

use super::*;

const S: u64 = 1_000_000_000;
const NOW: u64 = 1_000 * S;

/// A rank that started `started` collectives (the last at `last_s` before now), the ones
/// before `done` complete, arriving `late_ms` after the others at each of its last 20.
fn rank(rank: u32, started: u64, done: u64, last_s: u64, late_ms: u64) -> RankSample {
    let last = NOW - last_s * S;
    RankSample {
        node: format!("node-{rank}"),
        rank,
        progress: Progress {
            clock: CLOCK_REALTIME.into(),
            now_ns: NOW,
            coll_started: started,
            coll_done: done,
            p2p_started: 0,
            p2p_done: 0,
            last_start_ns: last,
            in_flight: (done < started).then(|| InFlight {
                seq: done + 1,
                p2p: false,
                nccl_seq: Some(done),
                func: "AllReduce".into(),
                bytes: 32 << 20,
                started_ns: last,
            }),
            completion: Completion::Proxy,
            proxy_in_flight: u64::from(done < started) * 2,
            proxy_last_stop_ns: last,
            // The last 20 collectives, 100 ms apart, the newest at its last start.
            arrivals: (started.saturating_sub(19)..=started)
                .filter(|s| *s > 0)
                .map(|s| [s, last - (started - s) * 100_000_000 + late_ms * 1_000_000])
                .collect(),
        },
        finalized: false,
        silent_s: 2.0,
    }
}

fn codes(r: &[Reason]) -> Vec<&str> {
    r.iter().filter_map(|r| r.code.as_deref()).collect()
}

#[test]
fn a_rank_that_never_entered_is_the_culprit() {
    // Rank 1 stopped after #40; ranks 0 and 2 entered #41 20 s ago.
    let ranks = [
        rank(0, 41, 40, 20, 0),
        rank(1, 40, 40, 21, 0),
        rank(2, 41, 40, 20, 0),
    ];
    let (r, views) = judge("c1", 3, &ranks, NOW, &Limits::default());
    assert_eq!(codes(&r), ["job-hung"], "{r:?}");
    let m = &r[0].message;
    assert!(
        m.contains("ranks 0, 2 have waited 20 s in AllReduce #41 (32 MiB"),
        "{m}"
    );
    assert!(
        m.contains("rank 1 on node-1 never entered it (last started #40, last completed #40)"),
        "{m}"
    );
    assert_eq!(
        views.iter().map(|v| v.culprit).collect::<Vec<_>>(),
        [false, true, false]
    );
    // 10 s in: not yet.
    let ranks = [rank(0, 41, 40, 10, 0), rank(1, 40, 40, 11, 0)];
    let (r, _) = judge("c1", 2, &ranks, NOW, &Limits::default());
    assert!(!codes(&r).contains(&"job-hung"), "{r:?}");
    // The rank behind is still catching up: no hang.
    let ranks = [rank(0, 41, 40, 20, 0), rank(1, 40, 39, 0, 0)];
    let (r, _) = judge("c1", 2, &ranks, NOW, &Limits::default());
    assert!(!codes(&r).contains(&"job-hung"), "{r:?}");
}

#[test]
fn a_rank_stopped_before_its_first_report_of_progress_is_named_as_silent() {
    // Seen on a GPU: rank 1 was SIGSTOPped between two of its plugin's writes, so its last
    // report (20 s old) still says #0, while rank 0 completed #64 with it and waits in #65.
    let mut stopped = rank(1, 0, 0, 0, 0);
    stopped.progress.last_start_ns = 0;
    stopped.progress.arrivals.clear();
    stopped.silent_s = 20.0;
    let ranks = [rank(0, 69, 64, 18, 0), stopped];
    let (r, views) = judge("c1", 2, &ranks, NOW, &Limits::default());
    assert_eq!(codes(&r), ["job-hung"], "{r:?}");
    let m = &r[0].message;
    assert!(m.contains("ranks 0 have waited"), "{m}");
    assert!(m.contains("in AllReduce #65 (32 MiB"), "{m}");
    assert!(
        m.contains("rank 1 on node-1 stopped reporting: its last report, 20 s ago, had started #0"),
        "{m}"
    );
    assert!(m.contains("completed #64 with it since"), "{m}");
    assert_eq!(
        views.iter().map(|v| v.culprit).collect::<Vec<_>>(),
        [false, true]
    );
}

#[test]
fn a_collective_nobody_completes_is_a_stall_inside_it() {
    let ranks = [rank(0, 41, 40, 20, 0), rank(1, 41, 40, 20, 0)];
    let (r, _) = judge("c1", 2, &ranks, NOW, &Limits::default());
    assert_eq!(codes(&r), ["job-hung"], "{r:?}");
    assert!(
        r[0].message.contains("every rank entered AllReduce #41"),
        "{r:?}"
    );
    assert!(
        r[0].evidence
            .as_deref()
            .unwrap()
            .contains("2 proxy operations in flight")
    );
    // Without a completion signal the same reports could be an idle job: nothing said.
    let mut ranks = ranks;
    for r in &mut ranks {
        r.progress.completion = Completion::None;
    }
    assert!(judge("c1", 2, &ranks, NOW, &Limits::default()).0.is_empty());
}

#[test]
fn idle_finished_and_uneven_jobs_are_not_alarms() {
    // Every rank paused 90 s after completing #41 (evaluation, a checkpoint).
    let idle = [rank(0, 41, 41, 90, 0), rank(1, 41, 41, 90, 0)];
    assert!(judge("c1", 2, &idle, NOW, &Limits::default()).0.is_empty());
    // Ranks that finalized at different times, one with fewer collectives.
    let mut done = [rank(0, 41, 41, 90, 0), rank(1, 41, 41, 30, 0)];
    done[0].finalized = true;
    assert!(judge("c1", 2, &done, NOW, &Limits::default()).0.is_empty());
    done[1].finalized = true;
    assert!(judge("c1", 2, &done, NOW, &Limits::default()).0.is_empty());
    // Lateness that moves between ranks: every rank shares the uneven work.
    let mut a = rank(0, 60, 59, 0, 0);
    let mut b = rank(1, 60, 59, 0, 0);
    for (k, (x, y)) in a
        .progress
        .arrivals
        .iter_mut()
        .zip(b.progress.arrivals.iter_mut())
        .enumerate()
    {
        if k % 2 == 0 {
            x[1] += 200_000_000
        } else {
            y[1] += 200_000_000
        }
    }
    let (r, views) = judge("c1", 2, &[a, b], NOW, &Limits::default());
    assert!(r.is_empty(), "{r:?}");
    assert!(views[0].lateness_ms.is_some());
}

#[test]
fn the_rank_last_most_of_the_time_straggles() {
    let ranks = [
        rank(0, 60, 59, 0, 0),
        rank(1, 60, 59, 0, 150),
        rank(2, 60, 59, 0, 3),
    ];
    let (r, views) = judge("c1", 3, &ranks, NOW, &Limits::default());
    assert_eq!(codes(&r), ["job-straggler"], "{r:?}");
    assert!(
        r[0].message
            .contains("rank 1 on node-1 arrived last at 20 of 20 collectives, 150 ms"),
        "{r:?}"
    );
    assert_eq!(views[1].lateness_ms, Some(150.0));
    assert!(views[1].culprit && !views[2].culprit);
    // 30 ms late: within the threshold.
    let ranks = [rank(0, 60, 59, 0, 0), rank(1, 60, 59, 0, 30)];
    assert!(judge("c1", 2, &ranks, NOW, &Limits::default()).0.is_empty());
}

#[test]
fn a_rank_whose_reports_stop_is_named() {
    // Its node vanished while it was behind: the hang names it and says so.
    let mut gone = rank(1, 40, 40, 40, 0);
    gone.silent_s = 40.0;
    let ranks = [rank(0, 41, 40, 20, 0), gone.clone()];
    let (r, _) = judge("c1", 2, &ranks, NOW, &Limits::default());
    assert_eq!(codes(&r), ["job-hung"], "{r:?}");
    assert!(r[0].message.contains("no report for 40 s"), "{r:?}");
    // Gone while the others still run: named, not hung.
    let mut gone = rank(1, 41, 41, 40, 0);
    gone.silent_s = 40.0;
    let ranks = [rank(0, 41, 41, 0, 0), gone];
    let (r, _) = judge("c1", 2, &ranks, NOW, &Limits::default());
    assert_eq!(codes(&r), ["job-rank-silent"], "{r:?}");
    // A rank never reported at all is named among the culprits.
    let ranks = [rank(0, 41, 40, 20, 0), rank(1, 41, 40, 20, 0)];
    let (r, _) = judge("c1", 3, &ranks, NOW, &Limits::default());
    assert!(r[0].message.contains("rank 2 never reported"), "{r:?}");
}
