//! `heddle investigate`: pairwise runs that find the bad node or link.

use std::process::ExitCode;

use clap::Subcommand;
use heddle_types::investigations::{
    Analysis, Conclusion, Investigation, InvestigationCreate, InvestigationKind,
    InvestigationState, InvestigationSummary, Matrix,
};
use reqwest::StatusCode;

use crate::args::NodeList;
use crate::client::{Client, ClientError};
use crate::exit::Exit;
use crate::table;

#[derive(Subcommand)]
pub enum InvestigateCmd {
    /// Run a two-node test on every pair of the nodes and name the bad node or link.
    Start {
        /// Node ids or hostnames (2 to 64) in Slurm's hostlist syntax: `gpu-node-[01-08]`.
        #[arg(long, required = true, value_parser = crate::args::hostlist)]
        nodes: Vec<NodeList>,
        /// nccl (busbw at the largest size) or rdma (perftest bandwidth).
        #[arg(long, default_value = "nccl", value_parser = |s: &str| s.parse::<InvestigationKind>())]
        kind: InvestigationKind,
        /// Test parameter as key=value (the value is parsed as JSON when it parses), e.g.
        /// op=all_gather, max_bytes=1073741824, test=ib_write_bw.
        #[arg(long = "param", value_parser = crate::args::key_value)]
        params: Vec<(String, String)>,
        /// Pairs at a time, no node in two of them; 0 queues every pair at once.
        #[arg(long = "batch", default_value_t = 0)]
        batch: u32,
        /// Name a node or link below this fraction of the median it is compared with.
        #[arg(long)]
        threshold: Option<f64>,
        #[arg(long)]
        label: Option<String>,
        /// Follow it until it ends.
        #[arg(long)]
        watch: bool,
    },
    /// Find the broken NIC or cable, node, leaf, uplink or spine behind suspect nodes,
    /// round by round, along the site's fabric (`heddle fabric import` first). Exit code 1
    /// when something is blamed, 0 when nothing is, 7 when inconclusive.
    Fabric(crate::fabric_investigate::Start),
    /// An investigation (pairwise or fabric): progress, the matrix and the culprit, or the
    /// blamed components in the fabric's terms.
    Show {
        id: uuid::Uuid,
        /// Follow it until it ends; exit code 0 when no culprit was found, 1 when one was,
        /// 7 when inconclusive or failed.
        #[arg(long)]
        watch: bool,
    },
    /// Run the fabric planner offline against an oracle process that answers its tests
    /// (one JSON object a line on its stdin and stdout; docs/fabric.md), e.g.
    /// `heddle-fabric-oracle serve --topology fabric.json --fault nic:n0042/mlx5_3`.
    Simulate {
        /// The fabric, a Heddle fabric file (`heddle-fabric-oracle topology` writes one).
        #[arg(long)]
        topology: std::path::PathBuf,
        /// The suspect nodes, in Slurm's hostlist syntax.
        #[arg(long)]
        suspects: String,
        /// The oracle's command line, run with `sh -c`.
        #[arg(long)]
        oracle: String,
        /// Observed jobs to start from: a JSON array of {nodes, rail, busbw_gbs | error}.
        #[arg(long)]
        evidence: Option<std::path::PathBuf>,
        /// The most nodes one round may take (0: no limit).
        #[arg(long, default_value_t = 0)]
        max_nodes: usize,
        #[arg(long, default_value_t = 20)]
        max_rounds: u32,
        /// Only the suspects, never other nodes, as known-good partners.
        #[arg(long)]
        suspects_only: bool,
        /// Seed of the planner's shuffles (the same seed plans the same tests).
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Recent investigations.
    Ls {
        /// running, done or failed
        #[arg(long)]
        state: Option<String>,
        #[arg(long, default_value_t = 20)]
        limit: u32,
        /// Fabric investigations instead of pairwise ones.
        #[arg(long)]
        fabric: bool,
    },
}

/// `simulate` needs no server: run it before a client is made.
pub fn offline(
    cmd: InvestigateCmd,
    json: bool,
) -> Result<anyhow::Result<ExitCode>, InvestigateCmd> {
    let InvestigateCmd::Simulate {
        topology,
        suspects,
        oracle,
        evidence,
        max_nodes,
        max_rounds,
        suspects_only,
        seed,
    } = cmd
    else {
        return Err(cmd);
    };
    let config = heddle_types::fabric::plan::Config {
        max_nodes,
        max_rounds,
        use_others: !suspects_only,
        seed,
        ..Default::default()
    };
    let args = crate::simulate::Args {
        topology: &topology,
        suspects: &suspects,
        oracle: &oracle,
        evidence: evidence.as_deref(),
        config,
    };
    Ok(crate::simulate::run(args, json))
}

pub async fn run(client: &Client, cmd: InvestigateCmd, json: bool) -> anyhow::Result<ExitCode> {
    match cmd {
        InvestigateCmd::Simulate { .. } => unreachable!("answered offline"),
        InvestigateCmd::Start {
            nodes,
            kind,
            params,
            batch,
            threshold,
            label,
            watch,
        } => {
            let body = InvestigationCreate {
                nodes: crate::args::nodes(nodes)?,
                kind,
                params: crate::args::params(params),
                env: Default::default(),
                timeout_s: None,
                batch_size: batch,
                threshold,
                label,
            };
            let inv: Investigation = client.post("/api/v1/investigations", &body).await?;
            crate::progress::note(
                json,
                &format!(
                    "started investigation {} ({} pairs)",
                    inv.id, inv.progress.pairs_total
                ),
            );
            if watch {
                return follow(client, inv.id, json).await;
            }
            if json {
                crate::output::print_json(&inv)?
            } else {
                println!("{}", inv.id)
            }
        }
        InvestigateCmd::Fabric(start) => {
            return crate::fabric_investigate::start(client, start, json).await;
        }
        InvestigateCmd::Show { id, watch } => {
            let inv: Investigation = match client.get(&format!("/api/v1/investigations/{id}")).await
            {
                Ok(inv) => inv,
                // Not a pairwise one: a fabric investigation, or the server's 404.
                Err(ClientError::Api { status, .. }) if status == StatusCode::NOT_FOUND => {
                    let fabric = client
                        .get(&format!("/api/v1/fabric/investigations/{id}"))
                        .await?;
                    return crate::fabric_investigate::show(client, fabric, watch, json).await;
                }
                Err(e) => return Err(e.into()),
            };
            if watch {
                return follow(client, id, json).await;
            }
            if json {
                crate::output::print_json(&inv)?
            } else {
                print(&inv)
            }
        }
        InvestigateCmd::Ls {
            limit,
            fabric: true,
            ..
        } => return crate::fabric_investigate::list(client, limit, json).await,
        InvestigateCmd::Ls { state, limit, .. } => {
            let mut q = format!("?limit={limit}");
            if let Some(s) = state {
                q.push_str(&format!("&state={s}"));
            }
            let list: Vec<InvestigationSummary> =
                client.get(&format!("/api/v1/investigations{q}")).await?;
            if json {
                crate::output::print_json(&list)?;
            } else {
                let mut t = table::new(&[
                    "ID", "KIND", "STATE", "PAIRS", "VERDICT", "CULPRITS", "NODES", "CREATED",
                ]);
                for i in &list {
                    let culprits: Vec<String> =
                        i.culprits.iter().map(|c| c.members.join("–")).collect();
                    t.add_row(vec![
                        i.id.to_string(),
                        i.kind.as_str().to_string(),
                        i.state.as_str().to_string(),
                        format!("{}/{}", i.progress.pairs_done, i.progress.pairs_total),
                        i.verdict.as_str().to_string(),
                        culprits.join(", "),
                        i.nodes.join(","),
                        table::ago(Some(i.created_at)),
                    ]);
                }
                println!("{t}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Polls the investigation until it ends, with its pairs as the progress; exit code 0 no
/// culprit, 1 a culprit, 7 inconclusive or failed (3 and up: it could not be followed).
async fn follow(client: &Client, id: uuid::Uuid, json: bool) -> anyhow::Result<ExitCode> {
    let inv: Investigation = crate::progress::poll(
        client,
        &format!("/api/v1/investigations/{id}"),
        json,
        progress_line,
        |i: &Investigation| i.state != InvestigationState::Running,
    )
    .await?;
    if json {
        crate::output::print_json(&inv)?
    } else {
        print(&inv)
    }
    Ok(outcome(&inv).into())
}

fn progress_line(inv: &Investigation) -> (f64, String) {
    let p = &inv.progress;
    let fraction = if p.pairs_total == 0 {
        1.0
    } else {
        f64::from(p.pairs_done) / f64::from(p.pairs_total)
    };
    let line = format!(
        "{}: {}/{} pairs done ({} failed, {} running)",
        inv.state.as_str(),
        p.pairs_done,
        p.pairs_total,
        p.pairs_failed,
        p.pairs_running
    );
    (fraction, line)
}

fn outcome(inv: &Investigation) -> Exit {
    match (inv.state, inv.analysis.verdict) {
        (InvestigationState::Done, Conclusion::NoCulprit) => Exit::Success,
        (InvestigationState::Done, Conclusion::Culprit) => Exit::Failed,
        _ => Exit::Undecided,
    }
}

fn print(inv: &Investigation) {
    let trigger = inv
        .trigger_run_id
        .map_or_else(String::new, |r| format!("  (started by run {r})"));
    println!(
        "investigation {}  {}  {}  {}/{} pairs  batch {}  created by {} {}{trigger}",
        inv.id,
        inv.kind.as_str(),
        inv.state.as_str(),
        inv.progress.pairs_done,
        inv.progress.pairs_total,
        if inv.batch_size == 0 {
            "all".to_string()
        } else {
            inv.batch_size.to_string()
        },
        inv.created_by,
        table::ago(Some(inv.created_at)),
    );
    print_matrix(&inv.matrix);
    print_analysis(&inv.analysis);
    let failed: Vec<String> = inv
        .pairs
        .iter()
        .filter_map(|p| p.error.as_ref().map(|e| format!("  {}–{}: {e}", p.a, p.b)))
        .collect();
    if !failed.is_empty() {
        println!("failed pairs:\n{}", failed.join("\n"));
    }
}

/// The matrix as a table: one row and one column per node, `·` on the diagonal.
pub fn print_matrix(m: &Matrix) {
    let mut headers: Vec<&str> = vec![""];
    headers.extend(m.labels.iter().map(String::as_str));
    let mut t = table::new(&headers);
    for (i, label) in m.labels.iter().enumerate() {
        let mut row = vec![label.clone()];
        for j in 0..m.labels.len() {
            let v = m.values.get(i).and_then(|r| r.get(j)).copied().flatten();
            row.push(if i == j && v.is_none() {
                "·".into()
            } else {
                table::float(v, 1)
            });
        }
        t.add_row(row);
    }
    table::right(&mut t, &(1..=m.labels.len()).collect::<Vec<_>>());
    println!("{} ({})\n{t}", m.metric, m.unit);
}

pub fn print_analysis(a: &Analysis) {
    println!("verdict: {}", a.verdict.as_str());
    println!("{}", a.summary);
    for c in &a.culprits {
        let figs: Vec<String> = c
            .figures
            .iter()
            .map(|f| format!("{}→{} {:.1}", f.from, f.to, f.value))
            .collect();
        println!(
            "  {:?} {}: {:.1} vs median {:.1} ({:.0}%): {}",
            c.kind,
            c.members.join("–"),
            c.figure,
            c.median,
            c.ratio * 100.0,
            figs.join(", ")
        );
    }
}
