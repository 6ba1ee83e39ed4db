//! `heddle investigate fabric` and the fabric side of `investigate show`: start a fabric
//! investigation on the server, follow it round by round, and print what it blames in the
//! fabric's terms (docs/fabric.md).

use std::process::ExitCode;

use heddle_types::fabric::investigation::{
    FabricInvestigation, FabricInvestigationCreate, FabricPart, FabricTestState,
};
use heddle_types::investigations::InvestigationState;

use crate::client::Client;
use crate::exit::Exit;
use crate::table;

/// What `heddle investigate fabric` takes.
#[derive(clap::Args)]
pub struct Start {
    /// The suspect nodes, in Slurm's hostlist syntax: `gpu-[0001-0512]`.
    #[arg(long)]
    pub suspects: String,
    /// The most nodes one round may take (default: no limit).
    #[arg(long)]
    pub max_nodes: Option<u32>,
    /// Rounds at most (default 20).
    #[arg(long)]
    pub max_rounds: Option<u32>,
    /// Test nodes that run a job too (by default they are left out).
    #[arg(long)]
    pub include_busy: bool,
    /// Only the suspects, never other idle nodes, as known-good partners.
    #[arg(long)]
    pub suspects_only: bool,
    /// Observed jobs to start from: a JSON array of {nodes, rail, busbw_gbs | error}.
    #[arg(long)]
    pub evidence: Option<std::path::PathBuf>,
    /// One test's wall-clock limit in seconds (default 300).
    #[arg(long)]
    pub timeout_s: Option<u32>,
    #[arg(long)]
    pub label: Option<String>,
    /// Follow it until it ends.
    #[arg(long)]
    pub watch: bool,
}

pub async fn start(client: &Client, s: Start, json: bool) -> anyhow::Result<ExitCode> {
    let evidence = match &s.evidence {
        Some(path) => crate::simulate::read_evidence(path)?,
        None => Vec::new(),
    };
    let body = FabricInvestigationCreate {
        suspects: vec![s.suspects],
        max_nodes: s.max_nodes,
        max_rounds: s.max_rounds,
        include_busy: s.include_busy,
        suspects_only: s.suspects_only,
        evidence,
        timeout_s: s.timeout_s,
        label: s.label,
    };
    let inv: FabricInvestigation = client.post("/api/v1/fabric/investigations", &body).await?;
    crate::progress::note(
        json,
        &format!(
            "started fabric investigation {} ({} suspects, {} nodes it may test; round 1: {} tests)",
            inv.id,
            inv.suspects.len(),
            inv.nodes_available,
            inv.tests.len()
        ),
    );
    if s.watch {
        return follow(client, inv.id, json).await;
    }
    if json {
        crate::output::print_json(&inv)?
    } else {
        println!("{}", inv.id)
    }
    Ok(ExitCode::SUCCESS)
}

/// Shows one fabric investigation, or follows it until it ends.
pub async fn show(
    client: &Client,
    inv: FabricInvestigation,
    watch: bool,
    json: bool,
) -> anyhow::Result<ExitCode> {
    if watch {
        return follow(client, inv.id, json).await;
    }
    if json {
        crate::output::print_json(&inv)?
    } else {
        print(&inv)
    }
    Ok(ExitCode::SUCCESS)
}

/// Polls until it ends, the round and its tests as the progress; exit code 1 when it
/// blames something, 0 when it found nothing and is sure, 7 when inconclusive or failed.
async fn follow(client: &Client, id: uuid::Uuid, json: bool) -> anyhow::Result<ExitCode> {
    let inv: FabricInvestigation = crate::progress::poll(
        client,
        &format!("/api/v1/fabric/investigations/{id}"),
        json,
        progress_line,
        |i: &FabricInvestigation| i.state != InvestigationState::Running,
    )
    .await?;
    if json {
        crate::output::print_json(&inv)?
    } else {
        print(&inv)
    }
    Ok(outcome(&inv).into())
}

fn progress_line(inv: &FabricInvestigation) -> (f64, String) {
    let this: Vec<_> = inv.tests.iter().filter(|t| t.round == inv.round).collect();
    let ended = this
        .iter()
        .filter(|t| t.state != FabricTestState::Running)
        .count();
    let failed = this
        .iter()
        .filter(|t| t.state == FabricTestState::Failed)
        .count();
    let fraction = if this.is_empty() {
        1.0
    } else {
        ended as f64 / this.len() as f64
    };
    let line = format!(
        "{}: round {} of at most {}: {ended}/{} tests ended, {failed} failed",
        inv.state.as_str(),
        inv.round,
        inv.max_rounds,
        this.len()
    );
    (fraction, line)
}

pub fn outcome(inv: &FabricInvestigation) -> Exit {
    match (inv.state, inv.conclusive) {
        (InvestigationState::Done, _) if !inv.blamed.is_empty() => Exit::Failed,
        (InvestigationState::Done, Some(true)) => Exit::Success,
        _ => Exit::Undecided,
    }
}

pub fn print(inv: &FabricInvestigation) {
    println!(
        "fabric investigation {}  {}  round {} of at most {}  {} suspects  {} nodes it may test  created by {} {}",
        inv.id,
        inv.state.as_str(),
        inv.round,
        inv.max_rounds,
        inv.suspects.len(),
        inv.nodes_available,
        inv.created_by,
        table::ago(Some(inv.created_at)),
    );
    if let Some(e) = &inv.error {
        println!("failed: {e}");
    }
    let ran = inv.tests.len();
    let failed = inv
        .tests
        .iter()
        .filter(|t| t.state == FabricTestState::Failed)
        .count();
    println!(
        "{ran} tests, {failed} of them failed; {:.0} node-seconds",
        inv.node_seconds
    );
    if inv.state == InvestigationState::Done {
        if inv.blamed.is_empty() {
            println!("blamed: nothing");
        }
        for p in &inv.blamed {
            print_part("blamed", p);
        }
        if inv.conclusive == Some(false) {
            println!("inconclusive; it might be:");
        }
        for p in &inv.candidates {
            print_part("candidate", p);
        }
    }
    for n in &inv.notes {
        println!("note: {n}");
    }
}

fn print_part(what: &str, p: &FabricPart) {
    println!(
        "{what}: {} {} ({:.0}% sure): {}",
        serde_json::to_value(p.component)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default(),
        p.id,
        p.confidence * 100.0,
        p.place
    );
    println!("  its traffic: {} node(s): {}", p.node_count, p.nodes);
    for e in &p.evidence {
        println!("  {e}");
    }
}

/// Recent fabric investigations.
pub async fn list(client: &Client, limit: u32, json: bool) -> anyhow::Result<ExitCode> {
    let list: Vec<FabricInvestigation> = client
        .get(&format!("/api/v1/fabric/investigations?limit={limit}"))
        .await?;
    if json {
        crate::output::print_json(&list)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut t = table::new(&["ID", "STATE", "ROUND", "SUSPECTS", "BLAMED", "CREATED"]);
    for i in &list {
        let blamed: Vec<&str> = i.blamed.iter().map(|b| b.id.as_str()).collect();
        t.add_row(vec![
            i.id.to_string(),
            i.state.as_str().to_string(),
            i.round.to_string(),
            i.suspects.len().to_string(),
            blamed.join(", "),
            table::ago(Some(i.created_at)),
        ]);
    }
    println!("{t}");
    Ok(ExitCode::SUCCESS)
}
