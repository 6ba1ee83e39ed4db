//! The subcommands. Each fetches through `Client` and prints a table or JSON.

use std::process::ExitCode;

use clap::Subcommand;
use heddle_types::auth::*;
use heddle_types::health::{PreflightCheck, PreflightRequest};
use heddle_types::jobs::{JobResult, Run, RunCreate};
use heddle_types::nodes::{NodeDetail, NodeSummary};

use crate::args::{NodeList, key_value};
use crate::client::{Client, encode, query};
use crate::exit::UsageError;
use crate::output::print_json;
use crate::runs::{print_result, print_run, watch};
use crate::{Cli, config, table};

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EnvFormat {
    Export,
    NcclConf,
}

#[derive(Subcommand)]
pub enum Command {
    /// Check a server URL and token, and save them for later commands.
    Login,
    /// Show the name and role of the current token.
    Whoami,
    /// Inventory.
    #[command(subcommand)]
    Nodes(NodesCmd),
    /// Print the `export NAME=VALUE` lines recommended for a node (to `source` in a job).
    Env {
        node: String,
        /// Instead, per variable: its value, the plugin or profile it came from, the reason,
        /// and what it overrode.
        #[arg(long, conflicts_with = "format")]
        explain: bool,
        /// `export`: lines for a shell. `nccl-conf`: the node's job environment as the agent
        /// writes it to the node env file that Heddle's NCCL environment plugin reads
        /// (docs/jobs.md), without the profiler line only the agent's configuration adds.
        #[arg(long, value_enum, default_value_t = EnvFormat::Export)]
        format: EnvFormat,
    },
    /// Tests and sweeps.
    #[command(subcommand)]
    Runs(RunsCmd),
    /// WebAssembly plugins on the server.
    #[command(subcommand)]
    Plugins(crate::plugins::PluginsCmd),
    /// Work on a plugin locally, without a server.
    #[command(subcommand)]
    Plugin(crate::plugins::PluginCmd),
    /// API tokens.
    #[command(subcommand)]
    Tokens(crate::tokens::TokensCmd),
    /// Agents, enrollment tokens and enrollments waiting for approval.
    #[command(subcommand)]
    Agents(crate::agents::AgentsCmd),
    /// Which node (or link) is bad? Pairwise runs, the node matrix and the culprit.
    #[command(subcommand)]
    Investigate(crate::investigate::InvestigateCmd),
    /// The site's fabric: import it from Slurm's topology.conf, ibnetdiscover or a Heddle
    /// fabric file, and show its switches and nodes.
    #[command(subcommand)]
    Fabric(crate::fabric::FabricCmd),
    /// Workloads (people's jobs) the NCCL profiler plugin observed on the nodes:
    /// bandwidth, transport, ranks, verdict.
    #[command(subcommand)]
    Workloads(crate::workloads::WorkloadsCmd),
    /// `heddle workloads` by its first name, deprecated: the same, with a warning.
    #[command(subcommand, hide = true)]
    Jobs(crate::workloads::WorkloadsCmd),
    /// Are these nodes fit for a job? Exit code 0 pass, 1 fail, 2 warn, 7 could not
    /// decide (3 to 6: it could not ask; see `heddle --help`).
    Preflight {
        /// Node ids or hostnames, in Slurm's hostlist syntax: `gpu-node-[01-16,20],login1`.
        /// Default: the nodes of the Slurm job this runs in (`SLURM_JOB_NODELIST`, else
        /// `SLURM_NODELIST`), as in a batch script or a `PrologSlurmctld`.
        #[arg(long, value_parser = crate::args::hostlist)]
        nodes: Vec<NodeList>,
        /// Verdicts older than this are stale: 3600, 90s, 30m, 1h, 2d (server default 1h).
        #[arg(long, value_parser = crate::args::seconds)]
        max_age: Option<u32>,
        /// nccl, memcpy, rdma or p2p (default nccl).
        #[arg(long, value_parser = |s: &str| s.parse::<PreflightCheck>())]
        check: Option<PreflightCheck>,
        /// How long to wait for checks on stale nodes (server default 120s; 0: history only).
        #[arg(long, value_parser = crate::args::seconds)]
        wait: Option<u32>,
    },
    /// Latest verdicts: the fleet, or every test of one node.
    Health { node: Option<String> },
    /// What results are expected to reach.
    #[command(subcommand)]
    Expectations(crate::health::ExpectationsCmd),
    /// Figures that moved to a new level and stayed ("it was faster last month"), and the
    /// offline detector.
    #[command(subcommand)]
    Regressions(crate::regressions::RegressionsCmd),
    /// Slurm hooks: `slurm prolog`, pre-flight as a Slurm `Prolog` (docs/jobs.md).
    #[command(subcommand)]
    Slurm(crate::slurm::SlurmCmd),
    /// Print a shell completion script: `source <(heddle completions bash)`, or save it
    /// where the shell loads completions from (`heddle completions zsh > ~/.zfunc/_heddle`).
    Completions { shell: clap_complete::Shell },
}

#[derive(Subcommand)]
pub enum NodesCmd {
    /// List nodes, problems first.
    Ls {
        #[arg(long)]
        hostname: Option<String>,
        #[arg(long)]
        gpu_model: Option<String>,
        #[arg(long)]
        hca: Option<String>,
        #[arg(long)]
        port_state: Option<String>,
        #[arg(long)]
        link_layer: Option<String>,
        #[arg(long)]
        site: Option<String>,
        /// key=value
        #[arg(long = "trait")]
        trait_: Option<String>,
        /// The agent's liveness: online, stale or offline (`--health` is its first name).
        #[arg(long, alias = "health")]
        liveness: Option<String>,
        /// Free text over hostname, GPU model, site, HCAs and `key=value` traits.
        #[arg(long)]
        search: Option<String>,
        /// Only nodes with a problem: agent not online, no facts yet, or a port not ACTIVE.
        #[arg(long)]
        problems: bool,
    },
    /// One node: summary, HCAs and recommendations (`--json` for the full facts).
    Show { node: String },
}

#[derive(Subcommand)]
pub enum RunsCmd {
    /// Start a run on one or more nodes.
    Start {
        /// Test kind: nccl, rdma, rdma_ab, ucx, p2p, sweep, memcpy...
        #[arg(long)]
        kind: String,
        /// Node ids or hostnames in Slurm's hostlist syntax (`gpu-node-[01-16,20]`);
        /// ranks follow this order.
        #[arg(long, required = true, value_parser = crate::args::hostlist)]
        nodes: Vec<NodeList>,
        /// Test parameter as key=value (the value is parsed as JSON when it parses).
        #[arg(long = "param", value_parser = key_value)]
        params: Vec<(String, String)>,
        /// Environment for the test process as NAME=VALUE.
        #[arg(long = "env", value_parser = key_value)]
        env: Vec<(String, String)>,
        /// Wall-clock limit of the test on each node: 600, 90s, 10m, 1h.
        #[arg(long, alias = "timeout-s", value_parser = crate::args::seconds)]
        timeout: Option<u32>,
        /// Stop the test as `hung` after this much silence (no row, no progress) beyond
        /// its slowest step (`90s`, `2m`); the agent's `--stall-limit` when unset.
        #[arg(long, value_parser = crate::args::seconds)]
        stall: Option<u32>,
        #[arg(long)]
        label: Option<String>,
        /// Run with `--env` only, without each node's recommended environment (plugin
        /// recommendations and tuning profiles, applied by default).
        #[arg(long)]
        no_recommended_env: bool,
        /// Follow the run until it ends.
        #[arg(long)]
        watch: bool,
    },
    /// Recent runs.
    Ls {
        #[arg(long)]
        node: Option<String>,
        #[arg(long)]
        kind: Option<String>,
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
    /// A run, its jobs and its results.
    Show {
        id: uuid::Uuid,
    },
    /// Follow a run until it ends: exit code 0 when it succeeded, 1 when a test failed or
    /// was judged FAIL, 2 for WARN, 7 when cancelled, 3 when the server cannot be reached.
    Watch {
        id: uuid::Uuid,
    },
    Cancel {
        id: uuid::Uuid,
    },
    /// A sweep's cells × size bands and winners; `--keep NAME` stores a winner as a tuning profile.
    Sweep(crate::sweeps::SweepArgs),
}

pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    if let Command::Completions { shell } = cli.command {
        completions(shell, &mut std::io::stdout())?;
        return Ok(ExitCode::SUCCESS);
    }
    if let Command::Regressions(cmd) = &cli.command
        && crate::regressions::is_offline(cmd)
        && let Command::Regressions(cmd) = cli.command
    {
        return crate::regressions::offline(cmd, cli.json);
    }
    if matches!(cli.command, Command::Slurm(_))
        && let Command::Slurm(cmd) = cli.command
    {
        // A Slurm hook answers with its own exit codes whatever the configuration says:
        // a failed prolog drains the node.
        let saved = config::load();
        let server = cli
            .server
            .clone()
            .or(saved.server.clone())
            .unwrap_or_else(|| "http://127.0.0.1:8080".into());
        let token = cli.token.clone().or(saved.token.clone());
        let client = saved
            .tls(&cli.tls, &server)
            .and_then(|tls| Client::new(&server, token, &tls).map_err(anyhow::Error::from));
        return Ok(crate::slurm::run(cmd, client).await);
    }
    let cli = match cli.command {
        Command::Investigate(cmd) => match crate::investigate::offline(cmd, cli.json) {
            Ok(done) => return done,
            Err(cmd) => Cli {
                command: Command::Investigate(cmd),
                ..cli
            },
        },
        _ => cli,
    };
    let saved = config::load();
    let server = cli
        .server
        .clone()
        .or(saved.server.clone())
        .unwrap_or_else(|| "http://127.0.0.1:8080".into());
    let token = cli.token.clone().or(saved.token.clone());
    let tls = saved.tls(&cli.tls, &server)?;
    let client = Client::new(&server, token.clone(), &tls)?;
    let json = cli.json;
    match cli.command {
        Command::Login => {
            let token = token
                .ok_or_else(|| UsageError("give --token (or HEDDLE_TOKEN) to log in".into()))?;
            let me: WhoAmI = client.get("/api/v1/whoami").await?;
            let mut login = config::Saved {
                server: Some(server.clone()),
                token: Some(token),
                ..Default::default()
            };
            login.remember_tls(&tls)?;
            let path = config::save(&login)?;
            println!(
                "logged in to {server} as {} ({}); saved in {}",
                me.name,
                me.role,
                path.display()
            );
        }
        Command::Whoami => {
            let me: WhoAmI = client.get("/api/v1/whoami").await?;
            if json {
                print_json(&me)?
            } else {
                println!("{} ({}) at {server}", me.name, me.role)
            }
        }
        Command::Nodes(NodesCmd::Ls {
            hostname,
            gpu_model,
            hca,
            port_state,
            link_layer,
            site,
            trait_,
            liveness,
            search,
            problems,
        }) => {
            let problems = problems.then(|| "true".to_string());
            let q = query(&[
                ("hostname", &hostname),
                ("gpu_model", &gpu_model),
                ("hca", &hca),
                ("port_state", &port_state),
                ("link_layer", &link_layer),
                ("site", &site),
                ("trait", &trait_),
                // The filter's first name, which servers of every version take.
                ("liveness", &liveness),
                ("q", &search),
                ("problems", &problems),
            ]);
            let mut nodes: Vec<NodeSummary> = client.get_all(&format!("/api/v1/nodes{q}")).await?;
            if json {
                return print_json(&nodes).map(|_| ExitCode::SUCCESS);
            }
            // Offline first, then stale (`Liveness` orders them so).
            nodes.sort_by_key(|n| {
                (
                    n.liveness,
                    n.port_states.iter().any(|s| s != "ACTIVE") as u8 ^ 1,
                    n.hostname.clone(),
                )
            });
            let mut t = table::new(&[
                "HOSTNAME", "LIVENESS", "GPUS", "HCAS", "PORTS", "LINK", "SITE", "TRAITS", "SEEN",
            ]);
            for n in &nodes {
                let traits: Vec<String> =
                    n.traits.iter().map(|(k, v)| format!("{k}={v}")).collect();
                t.add_row(vec![
                    n.hostname.clone(),
                    n.liveness.to_string(),
                    format!(
                        "{} × {}",
                        n.gpu_count,
                        n.gpu_model.as_deref().unwrap_or("?")
                    ),
                    n.hcas.join(","),
                    n.port_states.join(","),
                    n.link_layers.join(","),
                    table::opt(&n.site),
                    traits.join(" "),
                    table::ago(n.last_seen_at),
                ]);
            }
            println!("{t}\n{} node(s)", nodes.len());
        }
        Command::Nodes(NodesCmd::Show { node }) => {
            let n: NodeDetail = client
                .get(&format!("/api/v1/nodes/{}", encode(&node)))
                .await?;
            if json {
                return print_json(&n).map(|_| ExitCode::SUCCESS);
            }
            let s = &n.summary;
            println!(
                "{} ({})  {}  last seen {}",
                s.hostname,
                s.id,
                s.liveness,
                table::ago(s.last_seen_at)
            );
            println!(
                "GPUs: {} × {}",
                s.gpu_count,
                s.gpu_model.as_deref().unwrap_or("?")
            );
            println!(
                "HCAs: {}  ports: {}  link: {}",
                s.hcas.join(", "),
                s.port_states.join(", "),
                s.link_layers.join(", ")
            );
            if !s.traits.is_empty() {
                println!(
                    "traits: {}",
                    s.traits
                        .iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect::<Vec<_>>()
                        .join(" ")
                );
            }
            let gpudirect = n
                .facts
                .as_ref()
                .and_then(|f| f.get("gpudirect"))
                .and_then(|g| {
                    serde_json::from_value::<heddle_types::facts::GpuDirectFacts>(g.clone()).ok()
                });
            if let Some(g) = gpudirect {
                let mut t = table::new(&["GPUDIRECT CHECK", "STATE", "REASON"]);
                for c in g.checks {
                    t.add_row(vec![c.name, c.state, c.reason]);
                }
                println!("{t}");
            }
            if !n.checks.is_empty() {
                println!("{}", crate::explain::checks_table(&n.checks));
            }
            let mut t = table::new(&["NAME", "VALUE", "SOURCE", "REASON"]);
            for r in &n.recommendations {
                t.add_row(vec![
                    r.name.clone(),
                    r.value.clone(),
                    r.source.clone(),
                    r.reason.clone(),
                ]);
            }
            println!("{t}");
            print!("{}", crate::explain::plugin_findings(&client, &node).await?);
        }
        Command::Env {
            node,
            explain: true,
            ..
        } => crate::explain::env_explain(&client, &node, json).await?,
        Command::Env {
            node,
            format: EnvFormat::NcclConf,
            ..
        } => {
            let env: heddle_types::agent::NodeJobEnv = client
                .get(&format!("/api/v1/nodes/{}/job-env", encode(&node)))
                .await?;
            if json {
                print_json(&env)?;
            } else {
                print!(
                    "{}",
                    heddle_types::nccl_conf::render_node_env(&env.node, &env.entries, None)?
                );
                eprint!("{}", crate::explain::render_left_out(&env));
            }
        }
        Command::Env { node, .. } => {
            print!(
                "{}",
                client
                    .get_text(&format!("/api/v1/nodes/{}/env", encode(&node)))
                    .await?
            );
        }
        Command::Runs(cmd) => return runs(&client, cmd, json).await,
        Command::Plugins(cmd) => crate::plugins::run(&client, cmd, json).await?,
        Command::Plugin(crate::plugins::PluginCmd::Test {
            wasm,
            facts,
            fuel,
            timeout,
        }) => return crate::plugins::test(&wasm, &facts, fuel, timeout, json),
        Command::Tokens(cmd) => crate::tokens::run(&client, cmd, json).await?,
        Command::Agents(cmd) => crate::agents::run(&client, cmd, json, &server).await?,
        Command::Investigate(cmd) => return crate::investigate::run(&client, cmd, json).await,
        Command::Workloads(cmd) => return crate::workloads::run(&client, cmd, json).await,
        Command::Jobs(cmd) => {
            eprintln!("heddle jobs is deprecated: use heddle workloads (the same subcommands)");
            return crate::workloads::run(&client, cmd, json).await;
        }
        Command::Fabric(cmd) => crate::fabric::run(&client, cmd, json).await?,
        Command::Preflight {
            nodes,
            max_age,
            check,
            wait,
        } => {
            let nodes = if nodes.is_empty() {
                crate::slurm::job_nodes()?
            } else {
                nodes
            };
            let request = PreflightRequest {
                nodes: crate::args::nodes(nodes)?,
                max_age_s: max_age,
                check,
                wait_s: wait,
            };
            return Ok(crate::health::preflight(&client, &request, json).await);
        }
        Command::Health { node } => return crate::health::health(&client, node, json).await,
        Command::Expectations(cmd) => crate::health::expectations(&client, cmd, json).await?,
        Command::Regressions(cmd) => return crate::regressions::run(&client, cmd, json).await,
        Command::Completions { .. } | Command::Slurm(_) => unreachable!("answered above"),
    }
    Ok(ExitCode::SUCCESS)
}

async fn runs(client: &Client, cmd: RunsCmd, json: bool) -> anyhow::Result<ExitCode> {
    match cmd {
        RunsCmd::Start {
            kind,
            nodes,
            params,
            env,
            timeout,
            stall,
            label,
            no_recommended_env,
            watch: follow,
        } => {
            let body = RunCreate {
                kind,
                params: crate::args::params(params),
                env: env.into_iter().collect(),
                timeout_s: timeout,
                stall_s: stall,
                nodes: crate::args::nodes(nodes)?,
                max_attempts: None,
                label,
                recommended_env: Some(!no_recommended_env),
            };
            let run: Run = client.post("/api/v1/runs", &body).await?;
            if json && !follow {
                print_json(&run)?;
            } else {
                crate::progress::note(
                    json,
                    &format!("started run {} ({} job(s))", run.id, run.jobs.len()),
                );
                if !follow {
                    println!("{}", run.id);
                }
            }
            if follow {
                return watch(client, run.id, json).await;
            }
        }
        RunsCmd::Ls { node, kind, limit } => {
            let q = query(&[
                ("node", &node),
                ("kind", &kind),
                ("limit", &Some(limit.to_string())),
            ]);
            let runs: Vec<Run> = client.get(&format!("/api/v1/runs{q}")).await?;
            if json {
                print_json(&runs)?;
            } else {
                let mut t = table::new(&["ID", "KIND", "STATE", "NODES", "LABEL", "CREATED"]);
                for r in &runs {
                    let hosts: Vec<&str> = r.jobs.iter().map(|j| j.hostname.as_str()).collect();
                    t.add_row(vec![
                        r.id.to_string(),
                        r.spec.kind.clone(),
                        r.state.to_string(),
                        hosts.join(","),
                        table::opt(&r.label),
                        table::ago(Some(r.created_at)),
                    ]);
                }
                println!("{t}");
            }
        }
        RunsCmd::Show { id } => {
            let run: Run = client.get(&format!("/api/v1/runs/{id}")).await?;
            let results: Vec<JobResult> = client
                .get_all(&format!("/api/v1/runs/{id}/results"))
                .await?;
            if json {
                print_json(&crate::runs::RunReport {
                    run: &run,
                    results: &results,
                })?;
            } else {
                print_run(&run);
                for r in &results {
                    print_result(r);
                }
            }
        }
        RunsCmd::Watch { id } => return watch(client, id, json).await,
        RunsCmd::Sweep(a) => crate::sweeps::command(client, a, json).await?,
        RunsCmd::Cancel { id } => {
            let run: Run = client
                .post_empty(&format!("/api/v1/runs/{id}/cancel"))
                .await?;
            if json {
                print_json(&run)?
            } else {
                print_run(&run)
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The completion script of `shell` for every subcommand and flag. A reader that stops
/// early (`| head`) is not an error.
pub fn completions(
    shell: clap_complete::Shell,
    out: &mut dyn std::io::Write,
) -> anyhow::Result<()> {
    use clap::CommandFactory;
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "heddle", &mut script);
    match out.write_all(&script).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}
