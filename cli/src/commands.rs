//! The subcommands. Each fetches through `Client` and prints a table or JSON.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Subcommand;
use heddle_types::auth::*;
use heddle_types::jobs::{JobResult, Run};
use heddle_types::nodes::{NodeDetail, NodeSummary};
use heddle_types::plugins::{Plugin, PluginVersion};

use crate::args::key_value;
use crate::client::{Client, encode, query};
use crate::output::print_json;
use crate::{Cli, config, table};

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
        #[arg(long)]
        explain: bool,
    },
    /// Tests and sweeps.
    #[command(subcommand)]
    Runs(RunsCmd),
    /// WebAssembly plugins on the server.
    #[command(subcommand)]
    Plugins(PluginsCmd),
    /// Work on a plugin locally, without a server.
    #[command(subcommand)]
    Plugin(PluginCmd),
    /// API tokens.
    #[command(subcommand)]
    Tokens(TokensCmd),
    /// Agents, enrollment tokens and enrollments waiting for approval.
    #[command(subcommand)]
    Agents(crate::agents::AgentsCmd),
    /// Which node (or link) is bad? Pairwise runs, the node matrix and the culprit.
    #[command(subcommand)]
    Investigate(crate::investigate::InvestigateCmd),
    /// Are these nodes fit for a job? Exit code 0 pass, 1 warn, 2 fail, 3 could not decide.
    Preflight {
        /// Comma-separated node ids or hostnames.
        #[arg(long, value_delimiter = ',', required = true)]
        nodes: Vec<String>,
        /// Verdicts older than this are stale: 3600, 90s, 30m, 1h, 2d (server default 1h).
        #[arg(long, value_parser = crate::health::duration_s)]
        max_age: Option<u32>,
        /// nccl, memcpy, rdma or p2p (default nccl).
        #[arg(long)]
        check: Option<String>,
        /// How long to wait for checks on stale nodes (server default 120s; 0: history only).
        #[arg(long, value_parser = crate::health::duration_s)]
        wait: Option<u32>,
    },
    /// Latest verdicts: the fleet, or every test of one node.
    Health { node: Option<String> },
    /// What results are expected to reach.
    #[command(subcommand)]
    Expectations(crate::health::ExpectationsCmd),
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
        /// online, stale or offline
        #[arg(long)]
        health: Option<String>,
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
        /// Comma-separated node ids or hostnames; ranks follow this order.
        #[arg(long, value_delimiter = ',', required = true)]
        nodes: Vec<String>,
        /// Test parameter as key=value (the value is parsed as JSON when it parses).
        #[arg(long = "param", value_parser = key_value)]
        params: Vec<(String, String)>,
        /// Environment for the test process as NAME=VALUE.
        #[arg(long = "env", value_parser = key_value)]
        env: Vec<(String, String)>,
        #[arg(long)]
        timeout_s: Option<u32>,
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
    /// Follow a run until it ends; exit code 0 when it succeeded.
    Watch {
        id: uuid::Uuid,
    },
    Cancel {
        id: uuid::Uuid,
    },
    /// A sweep's cells × size bands and winners; `--keep NAME` stores a winner as a tuning profile.
    Sweep(crate::sweeps::SweepArgs),
}

#[derive(Subcommand)]
pub enum PluginsCmd {
    /// Upload a component as a new version.
    Upload {
        file: std::path::PathBuf,
        #[arg(long)]
        name: String,
        #[arg(long)]
        version: String,
        /// Enable this version right away.
        #[arg(long)]
        enable: bool,
    },
    Ls,
    Versions {
        name: String,
    },
    /// Enable a plugin (at a version: that is also how to roll back).
    Enable {
        name: String,
        #[arg(long)]
        version: Option<String>,
    },
    Disable {
        name: String,
    },
}

#[derive(Subcommand)]
pub enum PluginCmd {
    /// Run a component on a facts file (from `heddle-agent facts`) in the same sandbox and
    /// limits as the server, and print what it detected and the resources it used.
    /// Exit code 1 when the plugin fails or is refused.
    Test {
        wasm: std::path::PathBuf,
        #[arg(long)]
        facts: std::path::PathBuf,
        /// Fuel budget of the call.
        #[arg(long, default_value_t = 500_000_000)]
        fuel: u64,
        /// Wall-clock limit in milliseconds.
        #[arg(long, default_value_t = 2000)]
        timeout_ms: u64,
    },
}

#[derive(Subcommand)]
pub enum TokensCmd {
    /// Create a token; the secret is printed once.
    Create {
        #[arg(long)]
        name: String,
        #[arg(long)]
        role: Role,
        #[arg(long)]
        expires_in_days: Option<u32>,
    },
    Ls,
    Revoke {
        id: uuid::Uuid,
    },
}

#[derive(Subcommand)]
pub enum AgentsCmd {
    Ls,
    /// Create an enrollment token and print how to start an agent with it.
    EnrollToken {
        #[arg(long)]
        max_uses: Option<u32>,
        #[arg(long)]
        expires_in_hours: Option<u32>,
    },
    Revoke {
        id: uuid::Uuid,
    },
}

pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
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
            let token = token.context("give --token (or HEDDLE_TOKEN) to log in")?;
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
            health,
        }) => {
            let q = query(&[
                ("hostname", &hostname),
                ("gpu_model", &gpu_model),
                ("hca", &hca),
                ("port_state", &port_state),
                ("link_layer", &link_layer),
                ("site", &site),
                ("trait", &trait_),
                ("health", &health),
            ]);
            let mut nodes: Vec<NodeSummary> = client.get(&format!("/api/v1/nodes{q}")).await?;
            if json {
                return print_json(&nodes).map(|_| ExitCode::SUCCESS);
            }
            let rank = |h: &str| match h {
                "offline" => 0,
                "stale" => 1,
                _ => 2,
            };
            nodes.sort_by_key(|n| {
                (
                    rank(&n.health),
                    n.port_states.iter().any(|s| s != "ACTIVE") as u8 ^ 1,
                    n.hostname.clone(),
                )
            });
            let mut t = table::new(&[
                "HOSTNAME", "HEALTH", "GPUS", "HCAS", "PORTS", "LINK", "SITE", "TRAITS", "SEEN",
            ]);
            for n in &nodes {
                let traits: Vec<String> =
                    n.traits.iter().map(|(k, v)| format!("{k}={v}")).collect();
                t.add_row(vec![
                    n.hostname.clone(),
                    n.health.clone(),
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
                s.health,
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
        } => crate::explain::env_explain(&client, &node, json).await?,
        Command::Env { node, .. } => {
            print!(
                "{}",
                client
                    .get_text(&format!("/api/v1/nodes/{}/env", encode(&node)))
                    .await?
            );
        }
        Command::Runs(cmd) => return runs(&client, cmd, json).await,
        Command::Plugins(cmd) => plugins(&client, cmd, json).await?,
        Command::Plugin(PluginCmd::Test {
            wasm,
            facts,
            fuel,
            timeout_ms,
        }) => return plugin_test(&wasm, &facts, fuel, timeout_ms, json),
        Command::Tokens(cmd) => tokens(&client, cmd, json).await?,
        Command::Agents(cmd) => crate::agents::run(&client, cmd, json, &server).await?,
        Command::Investigate(cmd) => return crate::investigate::run(&client, cmd, json).await,
        Command::Preflight {
            nodes,
            max_age,
            check,
            wait,
        } => {
            return Ok(crate::health::preflight(&client, nodes, max_age, check, wait, json).await);
        }
        Command::Health { node } => return crate::health::health(&client, node, json).await,
        Command::Expectations(cmd) => crate::health::expectations(&client, cmd, json).await?,
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
            timeout_s,
            label,
            no_recommended_env,
            watch: follow,
        } => {
            let params: serde_json::Map<String, serde_json::Value> = params
                .into_iter()
                .map(|(k, v)| {
                    let value = serde_json::from_str(&v).unwrap_or(serde_json::Value::String(v));
                    (k, value)
                })
                .collect();
            let env: BTreeMap<String, String> = env.into_iter().collect();
            let body = serde_json::json!({"kind": kind, "nodes": nodes, "params": params, "env": env, "timeout_s": timeout_s, "label": label, "recommended_env": !no_recommended_env});
            let run: Run = client.post("/api/v1/runs", body).await?;
            if json && !follow {
                print_json(&run)?;
            } else {
                eprintln!("started run {} ({} job(s))", run.id, run.jobs.len());
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
                        r.state.clone(),
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
            let results: Vec<JobResult> = client.get(&format!("/api/v1/runs/{id}/results")).await?;
            if json {
                print_json(&serde_json::json!({"run": run, "results": results}))?;
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
                .post(
                    &format!("/api/v1/runs/{id}/cancel"),
                    serde_json::json!(null),
                )
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

fn print_run(run: &Run) {
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
    for j in run.jobs.iter().filter(|j| !j.applied_env.is_empty()) {
        println!("environment of rank {} ({}):", j.rank, j.hostname);
        for e in &j.applied_env {
            println!("  {}={}  ({})", e.name, e.value, e.source);
        }
    }
}

/// nccl-tests' columns, so the numbers read the way people are used to.
fn print_result(r: &JobResult) {
    println!(
        "\n{} — {:?}{}",
        r.hostname,
        r.outcome,
        r.reason
            .as_ref()
            .map_or_else(String::new, |s| format!(": {s}"))
    );
    if let Some(kind) = r.summary.get("kind").and_then(|k| k.as_str())
        && let Some(path) = heddle_types::transport::path_line(kind, &r.summary)
    {
        println!("path: {path}");
    }
    crate::health::print_verdict(r.verdict.as_ref());
    if r.summary.get("kind").and_then(|k| k.as_str()) == Some(heddle_types::rdma_ab::KIND) {
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

async fn watch(client: &Client, id: uuid::Uuid, json: bool) -> anyhow::Result<ExitCode> {
    let mut last = String::new();
    loop {
        let run: Run = client.get(&format!("/api/v1/runs/{id}")).await?;
        let line: Vec<String> = run
            .jobs
            .iter()
            .map(|j| {
                let p = j
                    .progress
                    .as_ref()
                    .map_or_else(String::new, |p| format!(" ({})", p.message));
                format!("{}={}{p}", j.hostname, j.state)
            })
            .collect();
        let line = format!("{}: {}", run.state, line.join(" "));
        if line != last {
            eprintln!("{line}");
            last = line;
        }
        if run.jobs.iter().all(|j| j.state.is_terminal()) {
            let results: Vec<JobResult> = client.get(&format!("/api/v1/runs/{id}/results")).await?;
            if json {
                print_json(&serde_json::json!({"run": run, "results": results}))?;
            } else {
                for r in &results {
                    print_result(r);
                }
            }
            return Ok(match run.state.as_str() {
                "succeeded" | "skipped" => ExitCode::SUCCESS,
                "failed" => ExitCode::from(1),
                _ => ExitCode::from(2),
            });
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn plugins(client: &Client, cmd: PluginsCmd, json: bool) -> anyhow::Result<()> {
    match cmd {
        PluginsCmd::Upload {
            file,
            name,
            version,
            enable,
        } => {
            let bytes =
                std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
            let v: PluginVersion = client
                .post_wasm(
                    &format!(
                        "/api/v1/plugins/{}/versions/{}",
                        encode(&name),
                        encode(&version)
                    ),
                    bytes,
                )
                .await?;
            if json {
                print_json(&v)?
            } else {
                println!(
                    "uploaded {} {} ({} bytes, sha256 {})",
                    v.plugin, v.version, v.size_bytes, v.sha256
                )
            }
            if enable {
                let p: Plugin = client
                    .post(
                        &format!("/api/v1/plugins/{}/enable", encode(&name)),
                        serde_json::json!({"version": version}),
                    )
                    .await?;
                if !json {
                    println!("enabled {} at {}", p.name, table::opt(&p.active_version));
                }
            }
        }
        PluginsCmd::Ls => {
            let list: Vec<Plugin> = client.get("/api/v1/plugins").await?;
            if json {
                return print_json(&list);
            }
            let mut t = table::new(&["NAME", "ENABLED", "ACTIVE VERSION", "CREATED"]);
            for p in &list {
                t.add_row(vec![
                    p.name.clone(),
                    p.enabled.to_string(),
                    table::opt(&p.active_version),
                    table::ago(Some(p.created_at)),
                ]);
            }
            println!("{t}");
        }
        PluginsCmd::Versions { name } => {
            let list: Vec<PluginVersion> = client
                .get(&format!("/api/v1/plugins/{}/versions", encode(&name)))
                .await?;
            if json {
                return print_json(&list);
            }
            let mut t = table::new(&["VERSION", "SHA256", "BYTES", "BY", "CREATED"]);
            for v in &list {
                t.add_row(vec![
                    v.version.clone(),
                    v.sha256[..16].to_string(),
                    v.size_bytes.to_string(),
                    v.uploaded_by.clone(),
                    table::ago(Some(v.created_at)),
                ]);
            }
            println!("{t}");
        }
        PluginsCmd::Enable { name, version } => {
            let p: Plugin = client
                .post(
                    &format!("/api/v1/plugins/{}/enable", encode(&name)),
                    serde_json::json!({"version": version}),
                )
                .await?;
            if json {
                print_json(&p)?
            } else {
                println!("enabled {} at {}", p.name, table::opt(&p.active_version))
            }
        }
        PluginsCmd::Disable { name } => {
            let p: Plugin = client
                .post(
                    &format!("/api/v1/plugins/{}/disable", encode(&name)),
                    serde_json::json!(null),
                )
                .await?;
            if json {
                print_json(&p)?
            } else {
                println!("disabled {}", p.name)
            }
        }
    }
    Ok(())
}

async fn tokens(client: &Client, cmd: TokensCmd, json: bool) -> anyhow::Result<()> {
    match cmd {
        TokensCmd::Create {
            name,
            role,
            expires_in_days,
        } => {
            let t: TokenCreated = client.post("/api/v1/tokens", serde_json::json!({"name": name, "role": role, "expires_in_days": expires_in_days})).await?;
            if json {
                print_json(&t)?;
            } else {
                eprintln!(
                    "created {} token {:?}; it is shown once:",
                    t.info.role, t.info.name
                );
                println!("{}", t.token);
            }
        }
        TokensCmd::Ls => {
            let list: Vec<TokenInfo> = client.get("/api/v1/tokens").await?;
            if json {
                return print_json(&list);
            }
            let mut t = table::new(&["ID", "NAME", "ROLE", "LAST USED", "EXPIRES", "REVOKED"]);
            for k in &list {
                t.add_row(vec![
                    k.id.to_string(),
                    k.name.clone(),
                    k.role.to_string(),
                    table::ago(k.last_used_at),
                    table::opt(&k.expires_at),
                    table::opt(&k.revoked_at),
                ]);
            }
            println!("{t}");
        }
        TokensCmd::Revoke { id } => {
            client.delete(&format!("/api/v1/tokens/{id}")).await?;
            println!("revoked token {id}");
        }
    }
    Ok(())
}

fn plugin_test(
    wasm: &std::path::Path,
    facts: &std::path::Path,
    fuel: u64,
    timeout_ms: u64,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let bytes = std::fs::read(wasm).with_context(|| format!("reading {}", wasm.display()))?;
    let facts =
        std::fs::read_to_string(facts).with_context(|| format!("reading {}", facts.display()))?;
    let limits = heddle_plugin_host::Limits {
        fuel,
        timeout: Duration::from_millis(timeout_ms),
        ..Default::default()
    };
    match heddle_plugin_host::run_on_facts_json(&bytes, &facts, &limits) {
        Ok(report) => {
            if json {
                print_json(&report)?;
                return Ok(ExitCode::SUCCESS);
            }
            let d = &report.detection;
            println!(
                "{} {} — {}",
                report.plugin.name, report.plugin.version, report.plugin.description
            );
            for (k, v) in &d.traits {
                println!("trait    {k}={v}");
            }
            for e in &d.env {
                println!("env      {}={}    # {}", e.name, e.value, e.reason);
            }
            for a in &d.affinity {
                println!(
                    "affinity gpu {} cpus {} numa {} nic {} netdev {}",
                    a.gpu,
                    a.cpus,
                    table::opt(&a.numa),
                    table::opt(&a.nic),
                    table::opt(&a.netdev)
                );
            }
            for w in &d.warnings {
                println!("warning  {w}");
            }
            for l in &report.logs {
                eprintln!("log {:?}: {}", l.level, l.message);
            }
            let u = &report.usage;
            eprintln!(
                "used {} fuel, {} µs, {} KiB peak memory",
                u.fuel_consumed,
                u.elapsed.as_micros(),
                u.peak_memory_bytes / 1024
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(err) => {
            eprintln!("heddle: plugin failed [{}]: {err}", err.code());
            if let Some(u) = err.usage() {
                eprintln!(
                    "used {} fuel, {} µs, {} KiB peak memory before it was stopped",
                    u.fuel_consumed,
                    u.elapsed.as_micros(),
                    u.peak_memory_bytes / 1024
                );
            }
            Ok(ExitCode::FAILURE)
        }
    }
}
