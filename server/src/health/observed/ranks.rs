//! One communicator's ranks side by side, across nodes: is the job hung, and who is it
//! waiting for? Is one rank always the last to arrive? Pure: the caller reads the ranks'
//! latest progress (their times already on the server's clock) and stores what this says.
//!
//! - `job-hung` (fail): nobody started anything for `hung_s` while some ranks are in a
//!   collective that others never entered (the culprits, with their last started and
//!   completed collective), or that every rank entered and none completed by a completion
//!   signal (a stall inside the collective); ranks whose reports stopped coming are named.
//! - `job-straggler` (warn): over the collectives every rank reported starting, one rank
//!   arrived last in at least `straggler_share` of them, by at least `straggler_ms`
//!   (median).
//! - `job-rank-silent` (warn): a rank's reports stopped while its peers' still come.
//!
//! Not an alarm: every rank idle at the same collective (evaluation, checkpoints, data
//! loading), ranks that finalized, a slow rank that still makes progress, and lateness that
//! moves between ranks (uneven work every rank shares).

use std::collections::BTreeMap;

use heddle_types::health::{Reason, Severity};
use heddle_types::observe::{Completion, Progress};
use heddle_types::observed::{band_label, band_of};

/// The thresholds; docs/health.md.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Seconds with no operation started on any rank before a job whose ranks wait is hung.
    pub hung_s: f64,
    /// Seconds without a report before a rank counts as gone.
    pub silent_s: f64,
    pub straggler_ms: f64,
    pub straggler_share: f64,
    /// Collectives every rank reported before lateness is judged.
    pub straggler_min: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            hung_s: 15.0,
            silent_s: 30.0,
            straggler_ms: 50.0,
            straggler_share: 0.75,
            straggler_min: 8,
        }
    }
}

/// One rank's latest report.
#[derive(Debug, Clone)]
pub struct RankSample {
    pub node: String,
    pub rank: u32,
    /// Times on the server's clock.
    pub progress: Progress,
    pub finalized: bool,
    /// Seconds since the server last stored a report of this rank.
    pub silent_s: f64,
}

/// What the per-rank table shows, beside the reasons.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RankView {
    pub lateness_ms: Option<f64>,
    pub culprit: bool,
}

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

fn reason(severity: Severity, code: &str, message: String, evidence: Option<String>) -> Reason {
    Reason {
        severity,
        message,
        metric: None,
        observed: None,
        expected: None,
        basis: "progress".into(),
        code: Some(code.into()),
        evidence,
    }
}

fn who(r: &RankSample) -> String {
    format!("rank {} on {}", r.rank, r.node)
}

/// Judges one communicator of `nranks` from its ranks' reports at `now_ns` (server
/// clock). Returns the reasons and, per rank in `ranks`' order, what the table shows.
pub fn judge(
    comm: &str,
    nranks: u32,
    ranks: &[RankSample],
    now_ns: u64,
    limits: &Limits,
) -> (Vec<Reason>, Vec<RankView>) {
    let mut views = vec![RankView::default(); ranks.len()];
    let mut reasons = Vec::new();
    let live: Vec<usize> = (0..ranks.len()).filter(|&i| !ranks[i].finalized).collect();
    if live.is_empty() {
        return (reasons, views);
    }
    let hung_ns = (limits.hung_s * 1e9) as u64;
    let quiet = |r: &RankSample| now_ns.saturating_sub(r.progress.last_start_ns) >= hung_ns;
    let silent = |r: &RankSample| r.silent_s >= limits.silent_s;
    let max_started = ranks
        .iter()
        .map(|r| r.progress.coll_started)
        .max()
        .unwrap_or(0);
    // Ranks in the newest collective, with it not known complete.
    let waiting: Vec<usize> = live
        .iter()
        .copied()
        .filter(|&i| {
            let p = &ranks[i].progress;
            p.coll_started == max_started
                && max_started > 0
                && p.coll_done < max_started
                && p.in_flight.as_ref().is_some_and(|f| !f.p2p)
                && quiet(&ranks[i])
                && !silent(&ranks[i])
        })
        .collect();
    let behind: Vec<usize> = (0..ranks.len())
        .filter(|&i| ranks[i].progress.coll_started < max_started)
        .collect();
    let gone: Vec<usize> = live
        .iter()
        .copied()
        .filter(|&i| silent(&ranks[i]))
        .collect();
    let reported: std::collections::BTreeSet<u32> = ranks.iter().map(|r| r.rank).collect();
    let missing: Vec<u32> = (0..nranks)
        .filter(|r| !reported.contains(r))
        .take(16)
        .collect();
    let everyone_quiet = live.iter().all(|&i| quiet(&ranks[i]) || silent(&ranks[i]));

    if !waiting.is_empty() && everyone_quiet {
        // Collectives the waiting ranks completed had every rank in them: a rank whose last
        // report is older than those stopped reporting (a stopped process writes nothing)
        // and is behind only on paper. The collective waited in is the first after both.
        let done_by_all = waiting
            .iter()
            .map(|&i| ranks[i].progress.coll_done)
            .min()
            .unwrap_or(0);
        // The collective the culprits never entered: the first after the furthest behind.
        let first = behind
            .iter()
            .map(|&i| ranks[i].progress.coll_started + 1)
            .min()
            .unwrap_or(max_started)
            .max(done_by_all + 1);
        let w = &ranks[waiting[0]];
        let entered_at = w
            .progress
            .arrivals
            .iter()
            .find(|a| a[0] == first)
            .map(|a| a[1])
            .or_else(|| {
                w.progress
                    .in_flight
                    .as_ref()
                    .filter(|f| f.seq <= first)
                    .map(|f| f.started_ns)
            })
            .unwrap_or(w.progress.last_start_ns);
        let what = match w.progress.in_flight.as_ref().filter(|f| f.seq == first) {
            Some(f) => format!(
                "{} #{first} ({}{})",
                f.func,
                band_label(band_of(f.bytes)),
                f.nccl_seq
                    .map(|s| format!(", NCCL seqNumber {s}"))
                    .unwrap_or_default()
            ),
            None => format!("collective #{first}"),
        };
        let waited = secs(now_ns.saturating_sub(entered_at));
        let waiting_ranks: Vec<String> =
            waiting.iter().map(|&i| ranks[i].rank.to_string()).collect();
        let mut culprits: Vec<String> = Vec::new();
        for &i in &behind {
            let r = &ranks[i];
            views[i].culprit = true;
            if r.progress.coll_started < done_by_all && !r.finalized {
                culprits.push(format!(
                    "{} stopped reporting: its last report, {:.0} s ago, had started #{}, and \
                     its peers have completed #{done_by_all} with it since",
                    who(r),
                    r.silent_s,
                    r.progress.coll_started
                ));
                continue;
            }
            culprits.push(format!(
                "{} never entered it (last started #{}, last completed #{}{}{})",
                who(r),
                r.progress.coll_started,
                r.progress.coll_done,
                if r.finalized { ", finalized" } else { "" },
                if silent(r) {
                    format!(", no report for {:.0} s", r.silent_s)
                } else {
                    String::new()
                }
            ));
        }
        for &i in gone.iter().filter(|i| !behind.contains(i)) {
            views[i].culprit = true;
            culprits.push(format!(
                "{}: no report for {:.0} s (its node or agent is gone)",
                who(&ranks[i]),
                ranks[i].silent_s
            ));
        }
        for r in &missing {
            culprits.push(format!("rank {r} never reported"));
        }
        let signalled = waiting
            .iter()
            .any(|&i| ranks[i].progress.completion != Completion::None);
        if !culprits.is_empty() {
            reasons.push(reason(
                Severity::Fail,
                "job-hung",
                format!(
                    "communicator {comm}: ranks {} have waited {waited:.0} s in {what}; {}",
                    waiting_ranks.join(", "),
                    culprits.join("; ")
                ),
                None,
            ));
        } else if signalled {
            // Every rank entered it and a completion signal says none finished.
            let evidence: Vec<String> = waiting
                .iter()
                .map(|&i| {
                    let p = &ranks[i].progress;
                    format!(
                        "rank {}: {} proxy operations in flight, completion by {:?}",
                        ranks[i].rank, p.proxy_in_flight, p.completion
                    )
                })
                .collect();
            reasons.push(reason(
                Severity::Fail,
                "job-hung",
                format!(
                    "communicator {comm}: every rank entered {what} and none completed it in \
                     {waited:.0} s: a stall inside the collective (its network or a setting \
                     the ranks disagree on)"
                ),
                Some(evidence.join("; ")),
            ));
        }
    } else if !gone.is_empty() && gone.len() < live.len() {
        for &i in &gone {
            views[i].culprit = true;
            reasons.push(reason(
                Severity::Warn,
                "job-rank-silent",
                format!(
                    "communicator {comm}: {} sent no report for {:.0} s while its peers' \
                     still come (its node or agent is gone, or the process is stopped)",
                    who(&ranks[i]),
                    ranks[i].silent_s
                ),
                None,
            ));
        }
    }
    // A hung communicator's lateness says nothing more, and a silent rank's reports are old.
    let reporting: Vec<usize> = live.iter().copied().filter(|i| !gone.contains(i)).collect();
    if reasons
        .iter()
        .all(|r| r.code.as_deref() != Some("job-hung"))
        && let Some(r) = straggler(comm, ranks, &reporting, limits, &mut views)
    {
        reasons.push(r);
    }
    (reasons, views)
}

/// Arrival lateness over the collectives every live rank reported: per collective, each
/// rank's start after the earliest rank's.
fn straggler(
    comm: &str,
    ranks: &[RankSample],
    live: &[usize],
    limits: &Limits,
    views: &mut [RankView],
) -> Option<Reason> {
    if live.len() < 2 {
        return None;
    }
    let mut starts: BTreeMap<u64, Vec<(usize, u64)>> = BTreeMap::new();
    for &i in live {
        for a in &ranks[i].progress.arrivals {
            starts.entry(a[0]).or_default().push((i, a[1]));
        }
    }
    let common: Vec<&Vec<(usize, u64)>> =
        starts.values().filter(|v| v.len() == live.len()).collect();
    if common.len() < limits.straggler_min {
        return None;
    }
    let mut late: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
    let mut last: BTreeMap<usize, usize> = BTreeMap::new();
    for v in &common {
        let first = v.iter().map(|x| x.1).min().unwrap_or(0);
        let (slowest, _) = *v.iter().max_by_key(|x| x.1)?;
        *last.entry(slowest).or_default() += 1;
        for &(i, t) in v.iter() {
            late.entry(i).or_default().push((t - first) as f64 / 1e6);
        }
    }
    let median = |xs: &mut Vec<f64>| {
        xs.sort_by(f64::total_cmp);
        xs[xs.len() / 2]
    };
    for (i, xs) in late.iter_mut() {
        views[*i].lateness_ms = Some(median(xs));
    }
    let (&culprit, &times) = last.iter().max_by_key(|(_, n)| **n)?;
    let share = times as f64 / common.len() as f64;
    let by = views[culprit].lateness_ms.unwrap_or(0.0);
    if share < limits.straggler_share || by < limits.straggler_ms {
        return None;
    }
    views[culprit].culprit = true;
    let r = &ranks[culprit];
    Some(Reason {
        severity: Severity::Warn,
        message: format!(
            "communicator {comm}: {} arrived last at {times} of {} collectives, {by:.0} ms \
             (median) after the first rank: its peers wait for it",
            who(r),
            common.len()
        ),
        metric: Some("arrival_lateness_ms".into()),
        observed: Some(by),
        expected: Some(limits.straggler_ms),
        basis: "progress".into(),
        code: Some("job-straggler".into()),
        evidence: None,
    })
}

#[cfg(test)]
#[path = "ranks_tests.rs"]
mod tests;
