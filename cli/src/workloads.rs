//! `heddle workloads`: people's jobs that the NCCL profiler plugin observed on the nodes,
//! and their verdicts (`heddle jobs`, their first name, is a hidden alias).

use std::process::ExitCode;

use clap::Subcommand;
use heddle_types::observed::{
    RankRow, Workload, WorkloadSummary, band_label as human_band, join_nodes, progress_rank,
};

use crate::client::{Client, query};
use crate::exit::Exit;
use crate::output::print_json;
use crate::table;

#[derive(Subcommand)]
pub enum WorkloadsCmd {
    /// Observed workloads, most recently seen first.
    Ls {
        /// Only workloads on this node (id or hostname).
        #[arg(long)]
        node: Option<String>,
        /// Only this Slurm job (`SLURM_JOB_ID`): one row per job step, its nodes' ranks
        /// joined (`--json`: the joined steps, with each node's row id).
        #[arg(long)]
        slurm_job: Option<String>,
        /// Workloads to list (most recent first); `--all` for every page.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Every workload the server keeps, a page at a time.
        #[arg(long, conflicts_with = "limit")]
        all: bool,
    },
    /// One workload: its communicators, bandwidth per size, transport and verdict. Exit code
    /// 0 pass, 1 fail, 2 warn, 7 unknown.
    Show { id: uuid::Uuid },
    /// Follow one workload live: its verdict, reasons and per-rank table again every
    /// `--interval` seconds (the screen redrawn on a terminal), until the workload has
    /// finished or `--until-flagged` says otherwise. Exit code as `show`, from the last
    /// answer.
    Watch {
        id: uuid::Uuid,
        /// Seconds between reads (1 to 3600).
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=3600))]
        interval: u64,
        /// Stop at the first answer whose verdict is no longer `pass` or `unknown` (a hung
        /// or straggling workload, say) instead of waiting for it to finish.
        #[arg(long)]
        until_flagged: bool,
    },
}

fn who(j: &WorkloadSummary) -> String {
    let mut s = j.workload_key.clone();
    if let Some(c) = &j.comm {
        s.push_str(&format!(" ({c})"));
    }
    s
}

pub async fn run(client: &Client, cmd: WorkloadsCmd, json: bool) -> anyhow::Result<ExitCode> {
    match cmd {
        WorkloadsCmd::Ls {
            node,
            slurm_job,
            limit,
            all,
        } => {
            let filters = [("node", &node), ("slurm_job", &slurm_job)];
            // A Slurm job is joined from all of its rows, however many pages they take.
            let all = all || slurm_job.is_some();
            let path = if all {
                format!("/api/v1/workloads{}", query(&filters))
            } else {
                let limit = Some(limit.to_string());
                let q = query(&[filters[0], filters[1], ("limit", &limit)]);
                format!("/api/v1/workloads{q}")
            };
            let mut rows: Vec<WorkloadSummary> = if all {
                client.get_all(&path).await?
            } else {
                client.get(&path).await?
            };
            // Hung workloads first, then straggling ones, each still most recently seen first.
            rows.sort_by_key(|j| std::cmp::Reverse(progress_rank(&j.reasons)));
            if slurm_job.is_some() {
                print_joined(&rows, json)?;
                return Ok(ExitCode::SUCCESS);
            }
            if json {
                print_json(&rows)?;
            } else {
                let mut t = table::new(&[
                    "", "ID", "NODE", "WORKLOAD", "UID", "PROCS", "COMMS", "DONE", "VERDICT",
                    "SEEN", "REASON",
                ]);
                for j in &rows {
                    t.add_row(vec![
                        match progress_rank(&j.reasons) {
                            2 => "HUNG",
                            1 => "SLOW",
                            _ => "",
                        }
                        .into(),
                        j.id.to_string(),
                        j.hostname.clone(),
                        who(j),
                        j.uid.to_string(),
                        j.processes.to_string(),
                        j.communicators.to_string(),
                        if j.finished { "yes" } else { "no" }.into(),
                        j.verdict.to_string(),
                        table::ago(Some(j.last_seen_at)),
                        j.reasons
                            .first()
                            .map(|r| r.code.clone().unwrap_or_else(|| r.basis.clone()))
                            .unwrap_or_default(),
                    ]);
                }
                println!("{t}");
            }
            Ok(ExitCode::SUCCESS)
        }
        WorkloadsCmd::Show { id } => {
            let workload: Workload = client.get(&format!("/api/v1/workloads/{id}")).await?;
            if json {
                print_json(&workload)?;
            } else {
                print_workload(&workload);
            }
            Ok(Exit::of_verdict(workload.summary.verdict).into())
        }
        WorkloadsCmd::Watch {
            id,
            interval,
            until_flagged,
        } => watch(client, id, interval, until_flagged, json).await,
    }
}

/// `workloads watch`: the workload again every `interval` seconds until it has finished
/// (or, with `until_flagged`, until its verdict is WARN or FAIL). On a terminal each answer replaces
/// the last; otherwise (and with `--json`, one object a line) they follow each other, so a
/// log keeps the whole story.
async fn watch(
    client: &Client,
    id: uuid::Uuid,
    interval: u64,
    until_flagged: bool,
    json: bool,
) -> anyhow::Result<ExitCode> {
    use std::io::IsTerminal;
    let redraw = !json && std::io::stdout().is_terminal();
    loop {
        let workload: Workload = client.get(&format!("/api/v1/workloads/{id}")).await?;
        if json {
            println!("{}", serde_json::to_string(&workload)?);
        } else {
            if redraw {
                // Clear the screen and go home.
                print!("\x1b[2J\x1b[H");
            }
            println!(
                "{} (every {interval} s; Ctrl-C to stop)\n",
                chrono::Utc::now().format("%H:%M:%S UTC")
            );
            print_workload(&workload);
            println!();
        }
        let verdict = workload.summary.verdict;
        let flagged = matches!(
            verdict,
            heddle_types::health::Verdict::Warn | heddle_types::health::Verdict::Fail
        );
        if workload.summary.finished || (until_flagged && flagged) {
            return Ok(Exit::of_verdict(verdict).into());
        }
        tokio::time::sleep(std::time::Duration::from_secs(interval)).await;
    }
}

/// One row per Slurm job step: its nodes and their processes together.
fn print_joined(rows: &[WorkloadSummary], json: bool) -> anyhow::Result<()> {
    let joined = join_nodes(rows);
    if json {
        return print_json(&joined);
    }
    let mut t = table::new(&["WORKLOAD", "NODES", "PROCS", "DONE", "VERDICT", "IDS"]);
    for j in &joined {
        t.add_row(vec![
            j.workload_key.clone(),
            j.nodes.join(","),
            j.processes.to_string(),
            if j.finished { "yes" } else { "no" }.into(),
            j.verdict.to_string(),
            j.ids
                .iter()
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(","),
        ]);
    }
    println!("{t}");
    Ok(())
}

/// The per-rank table of `workloads show`: every rank of the workload's communicators on
/// every node.
fn print_ranks(ranks: &[RankRow]) {
    if ranks.is_empty() {
        return;
    }
    let mut t = table::new(&[
        "COMM",
        "RANK",
        "NODE",
        "STARTED",
        "DONE",
        "IN FLIGHT",
        "SINCE",
        "LATE ms",
        "SEEN",
        "",
    ]);
    for r in ranks {
        t.add_row(vec![
            r.comm_hash.chars().take(8).collect(),
            r.rank.to_string(),
            r.hostname.clone(),
            format!("#{}", r.coll_started),
            format!("#{}", r.coll_done),
            r.in_flight
                .as_ref()
                .map(|f| {
                    format!(
                        "{} #{}{} {}",
                        f.func,
                        f.seq,
                        if f.p2p { " (p2p)" } else { "" },
                        human_band(heddle_types::observed::band_of(f.bytes))
                    )
                })
                .unwrap_or_else(|| "-".into()),
            format!("{:.0} s", r.quiet_s),
            r.lateness_ms
                .map(|l| format!("{l:.0}"))
                .unwrap_or_else(|| "-".into()),
            if r.finalized {
                "finalized".into()
            } else {
                format!("{:.0} s ago", r.silent_s)
            },
            if r.culprit { "<- culprit" } else { "" }.into(),
        ]);
    }
    table::right(&mut t, &[1, 3, 4, 6, 7]);
    println!("\nranks:\n{t}");
}

fn print_workload(workload: &Workload) {
    let s = &workload.summary;
    println!(
        "{} on {}: {} (uid {}, {} via {}, env {})",
        who(s),
        s.hostname,
        s.verdict.as_str().to_uppercase(),
        s.uid,
        if s.finished { "finished" } else { "running" },
        s.source.as_str(),
        s.env_applied.as_deref().unwrap_or("not applied")
    );
    for r in &s.reasons {
        let code = r.code.as_deref().unwrap_or(&r.basis);
        println!(
            "{} {code}: {}",
            format!("{:?}", r.severity).to_uppercase(),
            r.message
        );
    }
    for c in &workload.comms {
        println!(
            "\ncommunicator {}: {} ranks on {} nodes ({} here), transport {}",
            c.comm_hash,
            c.nranks,
            c.nnodes,
            c.local_ranks,
            c.transport.as_deref().unwrap_or("-")
        );
        let mut t = table::new(&[
            "FUNCTION",
            "SIZE",
            "OPS",
            "GPU-TIMED",
            "ALGBW GB/s",
            "BUSBW GB/s",
            "NOTE",
        ]);
        for b in &c.bands {
            t.add_row(vec![
                b.func.clone(),
                human_band(b.size_band),
                b.ops.to_string(),
                b.gpu_timed_ops.to_string(),
                table::float(b.algbw_gbs, 2),
                table::float(b.busbw_gbs, 2),
                b.note.clone().unwrap_or_default(),
            ]);
        }
        table::right(&mut t, &[2, 3, 4, 5]);
        println!("{t}");
    }
    print_ranks(&workload.ranks);
}

#[cfg(test)]
mod tests {
    #[test]
    fn bands_read_as_sizes() {
        assert_eq!(super::human_band(0), "1 B");
        assert_eq!(super::human_band(26), "64 MiB");
        assert_eq!(super::human_band(31), "2 GiB");
    }
}
