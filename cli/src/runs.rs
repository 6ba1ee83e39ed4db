//! A run as people read it (its jobs, its results in nccl-tests' columns) and following
//! one until it ends, with its progress on stderr and its outcome in the exit code.

use std::process::ExitCode;
use std::time::Duration;

use heddle_types::jobs::{JobResult, JobState, Outcome, Run};
use heddle_types::kinds::RunParams;

use crate::client::Client;
use crate::exit::Exit;
use crate::output::print_json;
use crate::progress::Progress;
use crate::table;

/// Follows a run until every job has ended and prints its results; exit code 0 when it
/// succeeded (or was skipped) and no result was judged worse, 1 when a test failed or a
/// result was judged FAIL, 2 for WARN, 7 when it was cancelled. A server that cannot be
/// reached is an error (exit code 3), never a failed test.
pub async fn watch(client: &Client, id: uuid::Uuid, json: bool) -> anyhow::Result<ExitCode> {
    let (run, results) = follow(client, id, json).await?;
    if json {
        print_json(&RunReport {
            run: &run,
            results: &results,
        })?;
    } else {
        for r in &results {
            print_result(r);
        }
    }
    Ok(outcome(&run, &results).into())
}

/// `--json` of `heddle runs show` and `heddle runs watch`.
#[derive(serde::Serialize)]
pub struct RunReport<'a> {
    pub run: &'a Run,
    pub results: &'a [JobResult],
}

/// What a finished run says to a script.
pub fn outcome(run: &Run, results: &[JobResult]) -> Exit {
    match run.state.as_str() {
        "failed" => Exit::Failed,
        "succeeded" | "skipped" => Exit::of_results(
            results
                .iter()
                .filter_map(|r| r.verdict.as_ref())
                .map(|v| v.verdict),
        ),
        _ => Exit::Undecided,
    }
}

/// Polls the run until every job has ended, showing its progress; its results then.
pub async fn follow(
    client: &Client,
    id: uuid::Uuid,
    json: bool,
) -> anyhow::Result<(Run, Vec<JobResult>)> {
    let mut progress = Progress::bar(json);
    let run = loop {
        let run: Run = match client.get(&format!("/api/v1/runs/{id}")).await {
            Ok(run) => run,
            Err(err) => {
                progress.finish();
                return Err(err.into());
            }
        };
        let (fraction, line) = progress_line(&run);
        progress.update(Some(fraction), &line);
        if run.jobs.iter().all(|j| j.state.is_terminal()) {
            progress.finish();
            break run;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let path = format!("/api/v1/runs/{id}/results");
    let mut results: Vec<JobResult> = client.get(&path).await?;
    // A result is judged right after it is stored; a watcher can be a moment quicker.
    if results
        .iter()
        .any(|r| r.verdict.is_none() && r.outcome == Outcome::Succeeded)
    {
        tokio::time::sleep(Duration::from_secs(1)).await;
        results = client.get(&path).await?;
    }
    Ok((run, results))
}

/// The fraction of the run done and one line on it: jobs done, failed, the cells of a
/// sweep, and the latest word from a job still running.
fn progress_line(run: &Run) -> (f64, String) {
    let total = run.jobs.len();
    let done = run.jobs.iter().filter(|j| j.state.is_terminal()).count();
    let failed = run
        .jobs
        .iter()
        .filter(|j| j.state == JobState::Failed)
        .count();
    let fraction = if total == 0 {
        1.0
    } else {
        run.jobs
            .iter()
            .map(|j| match (&j.progress, j.state.is_terminal()) {
                (_, true) => 1.0,
                (Some(p), false) => p.fraction.unwrap_or(0.0).clamp(0.0, 1.0),
                (None, false) => 0.0,
            })
            .sum::<f64>()
            / total as f64
    };
    let mut line = format!("{}: {done}/{total} jobs done", run.state);
    if failed > 0 {
        line.push_str(&format!(", {failed} failed"));
    }
    let running = run
        .jobs
        .iter()
        .find(|j| !j.state.is_terminal() && j.progress.is_some());
    if let (Some(cells), Some(j)) = (sweep_cells(run), running) {
        let f = j.progress.as_ref().and_then(|p| p.fraction).unwrap_or(0.0);
        line.push_str(&format!(
            " · {}: cell {}/{cells}",
            j.hostname,
            (f * cells as f64).round() as u64
        ));
    }
    if let Some(p) = running.and_then(|j| j.progress.as_ref().map(|p| (j, p))) {
        line.push_str(&format!(" · {}: {}", p.0.hostname, p.1.message));
    }
    (fraction, line)
}

/// Cells of a sweep's grid: the product of the lengths of its value lists.
fn sweep_cells(run: &Run) -> Option<u64> {
    let Ok(RunParams::Sweep(sweep)) = run.spec.params.typed() else {
        return None;
    };
    Some(
        sweep
            .grid
            .values()
            .fold(1u64, |acc, v| acc.saturating_mul(v.len() as u64)),
    )
}

pub fn print_run(run: &Run) {
    println!(
        "run {}  {}  {}  created by {} {}",
        run.id,
        run.spec.kind,
        run.state,
        run.created_by,
        table::ago(Some(run.created_at))
    );
    let mut t = table::new(&["RANK", "NODE", "STATE", "ATTEMPT", "PROGRESS", "ERROR"]);
    for j in &run.jobs {
        let progress = j
            .progress
            .as_ref()
            .map_or_else(String::new, |p| match p.fraction {
                Some(f) => format!("{:.0}% {}", f * 100.0, p.message),
                None => p.message.clone(),
            });
        t.add_row(vec![
            j.rank.to_string(),
            j.hostname.clone(),
            j.state.to_string(),
            format!("{}/{}", j.attempts, j.max_attempts),
            progress,
            table::opt(&j.error),
        ]);
    }
    println!("{t}");
    print!("{}", agreed_lines(run));
    for j in run.jobs.iter().filter(|j| !j.applied_env.is_empty()) {
        println!("environment of rank {} ({}):", j.rank, j.hostname);
        for e in &j.applied_env {
            println!("  {}={}  ({})", e.name, e.value, e.source);
        }
    }
}

/// The values every rank of a multi-node run shares for the variables that must agree
/// (`heddle_types::must_agree`); a run stored before the rule may show a difference.
pub fn agreed_lines(run: &Run) -> String {
    use heddle_types::must_agree;
    if run.jobs.len() < 2 {
        return String::new();
    }
    let nodes = run
        .jobs
        .iter()
        .map(|j| (j.hostname.as_str(), j.applied_env.as_slice()));
    let splits = must_agree::splits(nodes);
    let mut names: Vec<&str> = run
        .jobs
        .iter()
        .flat_map(|j| j.applied_env.iter().map(|e| e.name.as_str()))
        .filter(|n| must_agree::must_agree(n) && !splits.iter().any(|s| s.name == *n))
        .collect();
    names.sort_unstable();
    names.dedup();
    let mut out = String::new();
    if !names.is_empty() {
        out.push_str("agreed by every rank:\n");
    }
    for name in names {
        let mut sources: Vec<&str> = run
            .jobs
            .iter()
            .filter_map(|j| j.applied_env.iter().find(|e| e.name == name))
            .map(|e| e.source.as_str())
            .collect();
        sources.sort_unstable();
        sources.dedup();
        let value = run.jobs[0]
            .applied_env
            .iter()
            .find(|e| e.name == name)
            .map_or("", |e| e.value.as_str());
        out.push_str(&format!("  {name}={value}  ({})\n", sources.join(", ")));
    }
    if !splits.is_empty() {
        out.push_str(&format!("warning: {}\n", must_agree::EnvSplits(splits)));
    }
    out
}

/// nccl-tests' columns, so the numbers read the way people are used to.
pub fn print_result(r: &JobResult) {
    println!(
        "\n{} — {:?}{}",
        r.hostname,
        r.outcome,
        r.reason
            .as_ref()
            .map_or_else(String::new, |s| format!(": {s}"))
    );
    if let Some(kind) = r.summary.get("kind").and_then(|k| k.as_str())
        && let Some(path) = heddle_types::kinds::path_line(kind, &r.summary)
    {
        println!("path: {path}");
    }
    crate::health::print_verdict(r.verdict.as_ref());
    if r.summary.get("kind").and_then(|k| k.as_str()) == Some(heddle_types::kinds::rdma_ab::KIND) {
        println!("{}", crate::rdma_ab::render(r));
        return;
    }
    if r.rows.is_empty() {
        return;
    }
    let mut t = table::new(&[
        "size (B)",
        "count",
        "type",
        "op",
        "time (us)",
        "algbw (GB/s)",
        "busbw (GB/s)",
        "#wrong",
        "labels",
    ]);
    for row in &r.rows {
        let labels: Vec<String> = row.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        t.add_row(vec![
            row.size_bytes.to_string(),
            table::opt(&row.count),
            table::opt(&row.dtype),
            table::opt(&row.op),
            table::float(row.time_us, 2),
            table::float(row.algbw_gbs, 2),
            table::float(row.busbw_gbs, 2),
            table::opt(&row.wrong),
            labels.join(" "),
        ]);
    }
    table::right(&mut t, &[0, 1, 4, 5, 6, 7]);
    println!("{t}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use heddle_types::jobs::{Job, JobSpec, Progress as JobProgress};

    fn run(kind: &str, params: serde_json::Value, jobs: &[(JobState, Option<f64>)]) -> Run {
        let now = chrono::Utc::now();
        Run {
            id: uuid::Uuid::nil(),
            label: None,
            spec: JobSpec::new(kind, params),
            state: heddle_types::jobs::RunState::Running,
            created_by: "t".into(),
            created_at: now,
            finished_at: None,
            jobs: jobs
                .iter()
                .enumerate()
                .map(|(i, (state, f))| Job {
                    id: uuid::Uuid::nil(),
                    run_id: uuid::Uuid::nil(),
                    node_id: uuid::Uuid::nil(),
                    hostname: format!("n{i}"),
                    rank: i as i32,
                    world_size: jobs.len() as i32,
                    state: *state,
                    attempts: 1,
                    max_attempts: 3,
                    lease_expires_at: None,
                    cancel_requested: false,
                    error: None,
                    progress: f.map(|f| JobProgress {
                        fraction: Some(f),
                        message: format!("at {f}"),
                    }),
                    created_at: now,
                    started_at: None,
                    finished_at: None,
                    applied_env: vec![],
                })
                .collect(),
        }
    }

    #[test]
    fn progress_counts_jobs_and_their_fractions() {
        let r = run(
            "nccl",
            serde_json::json!({}),
            &[
                (JobState::Succeeded, None),
                (JobState::Failed, None),
                (JobState::Running, Some(0.5)),
                (JobState::Queued, None),
            ],
        );
        let (f, line) = progress_line(&r);
        assert!((f - 2.5 / 4.0).abs() < 1e-9, "{f}");
        assert_eq!(line, "running: 2/4 jobs done, 1 failed · n2: at 0.5");
    }

    #[test]
    fn a_multi_node_run_shows_the_values_its_ranks_agree_on() {
        let var = |name: &str, value: &str, source: &str| heddle_types::jobs::EnvVar {
            name: name.into(),
            value: value.into(),
            source: source.into(),
        };
        let mut r = run(
            "nccl",
            serde_json::json!({}),
            &[(JobState::Queued, None), (JobState::Queued, None)],
        );
        r.jobs[0].applied_env = vec![
            var("NCCL_ALGO", "Ring", "run"),
            var("NCCL_IB_HCA", "mlx5_0", "plugin:p@1"),
        ];
        r.jobs[1].applied_env = vec![
            var("NCCL_ALGO", "Ring", "run"),
            var("NCCL_IB_HCA", "mlx5_4", "plugin:p@1"),
        ];
        assert_eq!(
            agreed_lines(&r),
            "agreed by every rank:\n  NCCL_ALGO=Ring  (run)\n"
        );
        r.jobs[1].applied_env[0] = var("NCCL_ALGO", "Tree", "tuning:n1");
        let text = agreed_lines(&r);
        assert!(
            text.starts_with("warning: the ranks of this run would not agree on NCCL_ALGO"),
            "{text}"
        );
        r.jobs.pop();
        assert_eq!(agreed_lines(&r), "");
    }

    #[test]
    fn a_sweep_shows_its_cells() {
        let grid = serde_json::json!({"grid": {"NCCL_PROTO": ["LL", "Simple"],
            "NCCL_ALGO": ["Ring", "Tree", "NVLS", "CollNet"]}});
        let r = run("sweep", grid, &[(JobState::Running, Some(0.375))]);
        assert_eq!(sweep_cells(&r), Some(8));
        let (_, line) = progress_line(&r);
        assert!(line.contains("cell 3/8"), "{line}");
    }
}
