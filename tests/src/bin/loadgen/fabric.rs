//! `heddle-loadgen --fabric`: a real server runs a real fabric investigation over the
//! simulated agents. The generated fat tree (`heddle_types::fabric::generate`) is imported
//! as the site's fabric, every agent heartbeats and claims, and the tests it claims are
//! answered from the fabric model with the faults given (`heddle_e2e::fabric_oracle`). Reports the
//! investigation's wall time, rounds and tests, what it blamed and whether that was the
//! fault, and what it cost the server.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use heddle_e2e::fabric_oracle::{Oracle, result_body};
use heddle_e2e::probe::CpuWindow;
use heddle_e2e::rss_kib;
use heddle_types::fabric::Fabric;
use heddle_types::fabric::generate::{FatTree, fat_tree, node_name};
use heddle_types::fabric::index::Index;
use heddle_types::fabric::investigation::{FabricInvestigation, behind};
use heddle_types::fabric::model::{Fault, tally};
use heddle_types::investigations::InvestigationState;
use serde_json::json;
use uuid::Uuid;

use super::{ADMIN, Agent, Samples, answer_of, loadavg, summary};

/// What the fabric mode is asked for.
#[derive(clap::Args)]
pub struct FabricArgs {
    /// Fabric mode: the agents are the nodes of a generated rail-optimized fat tree, which
    /// is imported as the site's fabric; a fabric investigation runs over them and they
    /// answer its tests from the fabric model with the --fault(s) given.
    #[arg(long)]
    pub fabric: bool,
    /// A fault of the fabric model, `KIND:ID[:slow=F|:hang][:p=P]` (docs/fabric.md), e.g.
    /// `nic:n00042/mlx5_3`; repeat for several.
    #[arg(long = "fault", requires = "fabric")]
    pub faults: Vec<String>,
    #[arg(long, default_value_t = 8, requires = "fabric")]
    pub rails: u32,
    #[arg(long, default_value_t = 32, requires = "fabric")]
    pub nodes_per_leaf: usize,
    /// Suspects: this many consecutive nodes, from the block holding the first fault.
    #[arg(long, default_value_t = 512, requires = "fabric")]
    pub suspects: usize,
    #[arg(long, requires = "fabric")]
    pub max_rounds: Option<u32>,
    /// Give up on the investigation after this many seconds.
    #[arg(
        long = "investigation-timeout-s",
        default_value_t = 1800,
        requires = "fabric"
    )]
    pub timeout_s: u64,
    /// Seed of the fabric model's noise and intermittent faults.
    #[arg(long, default_value_t = 7, requires = "fabric")]
    pub seed: u64,
}

/// What the set-up leaves the fabric mode: the server, its measurement and the report's
/// first fields.
pub struct Setup<'a> {
    pub base: &'a str,
    pub server_pid: u32,
    pub cpu: CpuWindow,
    pub clients: &'a [reqwest::Client],
    pub hb: Duration,
    pub report: serde_json::Value,
}

/// Runs the investigation over `agents` and prints the report; returns whether exactly
/// the faults were blamed.
pub async fn measure(
    a: &FabricArgs,
    setup: Setup<'_>,
    agents: Vec<Agent>,
    json_line: bool,
) -> anyhow::Result<bool> {
    // The server's peak RSS over the investigation, sampled twice a second.
    let peak = Arc::new(AtomicU64::new(0));
    let watch = {
        let (pid, peak) = (setup.server_pid, peak.clone());
        tokio::spawn(async move {
            loop {
                peak.fetch_max(rss_kib(pid).unwrap_or(0), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    let found = run(a, setup.base, agents, setup.clients, setup.hb).await;
    let cpu = setup.cpu.end();
    watch.abort();
    let mut report = setup.report;
    for (k, v) in found?.as_object().into_iter().flatten() {
        report[k] = v.clone();
    }
    report["cpu_percent"] = cpu;
    report["server_rss_peak_mib"] = json!(peak.load(Ordering::Relaxed) as f64 / 1024.0);
    report["loadavg_1m"] = json!(loadavg());
    if json_line {
        println!("{report}");
    } else {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(report["faults_found"].as_bool() == Some(true))
}

/// The generated fabric of `agents` nodes; agent `i` is node `node_name(i, agents)`.
pub fn fabric_of(agents: usize, a: &FabricArgs) -> Fabric {
    fat_tree(&FatTree {
        nodes: agents,
        rails: a.rails,
        nodes_per_leaf: a.nodes_per_leaf,
        spines_per_rail: 1,
    })
}

/// One agent: a heartbeat every interval, then claims until nothing is left, answering
/// each test from the model.
async fn agent_loop(
    agent: Agent,
    client: reqwest::Client,
    oracle: Arc<Oracle>,
    hb: Duration,
    phase: Duration,
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Samples>>,
) {
    let mut next = tokio::time::Instant::now() + phase;
    let hb_body =
        json!({"agent_version": "loadgen", "facts_sha256": agent.facts_sha256, "running_jobs": []})
            .to_string();
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep_until(next).await;
        next += hb;
        let t = Instant::now();
        let r = client
            .post(format!("{}/api/v1/agent/heartbeat", agent.base))
            .bearer_auth(&agent.credential)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(hb_body.clone())
            .send()
            .await;
        let ok = r.as_ref().is_ok_and(|r| r.status().is_success());
        {
            let mut s = samples.lock().unwrap();
            s.add_timed("heartbeat", t, t, ok);
            if !ok {
                s.failed("heartbeat", &answer_of(&r));
            }
        }
        loop {
            let t = Instant::now();
            let r = client
                .post(format!("{}/api/v1/agent/jobs/claim", agent.base))
                .bearer_auth(&agent.credential)
                .send()
                .await;
            let what = answer_of(&r);
            let lease: Option<serde_json::Value> = match r {
                Ok(r) if r.status() == 200 => r.json().await.ok(),
                Ok(r) if r.status() == 204 => {
                    samples
                        .lock()
                        .unwrap()
                        .add_timed("claim (none)", t, t, true);
                    break;
                }
                _ => None,
            };
            let Some(lease) = lease else {
                let mut s = samples.lock().unwrap();
                s.add_timed("claim", t, t, false);
                s.failed("claim", &what);
                break;
            };
            samples.lock().unwrap().add_timed("claim", t, t, true);
            let run: Uuid = lease["run_id"]
                .as_str()
                .and_then(|s| s.parse().ok())
                .unwrap_or_default();
            let answer = oracle.answer(run).await;
            let body = result_body(&lease, &answer);
            let t = Instant::now();
            let r = client
                .post(format!(
                    "{}/api/v1/agent/jobs/{}/result",
                    agent.base,
                    lease["job_id"].as_str().unwrap_or("")
                ))
                .bearer_auth(&agent.credential)
                .json(&body)
                .send()
                .await;
            let ok = r.as_ref().is_ok_and(|r| r.status().is_success());
            let mut s = samples.lock().unwrap();
            s.add_timed("result", t, t, ok);
            if !ok {
                s.failed("result", &answer_of(&r));
            }
        }
    }
}

/// The suspects: `count` consecutive nodes from the block of that size holding the first
/// node the first fault's traffic crosses.
fn suspects(fabric: &Fabric, faults: &[Fault], agents: usize, count: usize) -> String {
    let count = count.clamp(2, agents);
    let first = faults
        .first()
        .and_then(|f| behind(fabric, f.kind, &f.id).into_iter().next())
        .and_then(|n| fabric.nodes.iter().position(|m| m.name == n))
        .unwrap_or(0);
    let start = (first / count * count).min(agents - count);
    let names: Vec<String> = (start..start + count)
        .map(|i| node_name(i, agents))
        .collect();
    heddle_types::hostlist::compress(&names)
}

/// Runs the investigation; returns the report's fabric part.
pub async fn run(
    a: &FabricArgs,
    base: &str,
    agents: Vec<Agent>,
    clients: &[reqwest::Client],
    hb: Duration,
) -> anyhow::Result<serde_json::Value> {
    let n = agents.len();
    let fabric = fabric_of(n, a);
    let faults: Vec<Fault> = a
        .faults
        .iter()
        .map(|f| f.parse().map_err(|e| anyhow::anyhow!("--fault {f}: {e}")))
        .collect::<anyhow::Result<_>>()?;
    let http = &clients[0];
    let t = Instant::now();
    http.put(format!("{base}/api/v1/fabric"))
        .bearer_auth(ADMIN)
        .json(&json!({"source": "heddle", "text": serde_json::to_string(&fabric)?}))
        .send()
        .await?
        .error_for_status()?;
    let import_s = t.elapsed().as_secs_f64();
    let ix: &'static Index = Box::leak(Box::new(Index::new(&fabric)));
    let oracle = Oracle::new(ix, &faults, a.seed, base, ADMIN).map_err(anyhow::Error::msg)?;
    let oracle = Arc::new(oracle);
    let stop = Arc::new(AtomicBool::new(false));
    let samples = Arc::new(Mutex::new(Samples::default()));
    let mut tasks = Vec::new();
    for (i, agent) in agents.into_iter().enumerate() {
        let phase = hb.mul_f64((i as f64 * 0.618_033_988_75).fract());
        tasks.push(tokio::spawn(agent_loop(
            agent,
            clients[i % clients.len()].clone(),
            oracle.clone(),
            hb,
            phase,
            stop.clone(),
            samples.clone(),
        )));
    }
    let suspects = suspects(&fabric, &faults, n, a.suspects);
    let start = Instant::now();
    let resp = http
        .post(format!("{base}/api/v1/fabric/investigations"))
        .bearer_auth(ADMIN)
        .json(&json!({"suspects": [suspects], "max_rounds": a.max_rounds, "label": "heddle-loadgen --fabric"}))
        .send()
        .await?;
    let status = resp.status();
    if !status.is_success() {
        anyhow::bail!(
            "starting the investigation: {status} {}",
            resp.text().await.unwrap_or_default()
        );
    }
    let created: FabricInvestigation = resp.json().await?;
    let mut rounds_at = Vec::new();
    let mut last_round = 0;
    let inv = loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let inv: FabricInvestigation = http
            .get(format!(
                "{base}/api/v1/fabric/investigations/{}",
                created.id
            ))
            .bearer_auth(ADMIN)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        if inv.round != last_round {
            last_round = inv.round;
            rounds_at.push(
                json!({"round": inv.round, "at_s": start.elapsed().as_secs_f64(),
                "tests": inv.tests.iter().filter(|t| t.round == inv.round).count()}),
            );
        }
        if inv.state != InvestigationState::Running {
            break inv;
        }
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(a.timeout_s),
            "the investigation still runs after {} s (round {})",
            a.timeout_s,
            inv.round
        );
    };
    let wall_s = start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.abort();
    }
    let blamed: Vec<heddle_types::fabric::sim::Blame> = inv
        .blamed
        .iter()
        .map(|p| heddle_types::fabric::sim::Blame {
            component: p.component,
            id: p.id.clone(),
            confidence: p.confidence,
            evidence: Vec::new(),
        })
        .collect();
    let (right, _, _) = tally(ix, &blamed, &faults);
    // What the health of a node behind the first blamed part says.
    let mut health_reason = serde_json::Value::Null;
    if let Some(p) = inv.blamed.first() {
        let node =
            heddle_types::hostlist::expand_at_most(&p.nodes, heddle_types::fabric::MAX_NODES)
                .ok()
                .and_then(|l| l.0.last().cloned());
        if let Some(node) = node {
            let h: serde_json::Value = http
                .get(format!("{base}/api/v1/nodes/{node}/health"))
                .bearer_auth(ADMIN)
                .send()
                .await?
                .error_for_status()?
                .json()
                .await?;
            health_reason = h["reasons"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|r| r["code"] == "fabric-blamed")
                .map(|r| json!({"node": node, "verdict": h["verdict"], "severity": r["severity"], "message": r["message"]}))
                .unwrap_or_else(|| json!({"node": node, "verdict": h["verdict"], "message": null}));
        }
    }
    let samples = samples.lock().unwrap();
    let latency: serde_json::Map<String, serde_json::Value> = samples
        .0
        .iter()
        .map(|(k, v)| (k.to_string(), summary(v)))
        .collect();
    Ok(json!({
        "state": inv.state.as_str(),
        "error": inv.error,
        "faults": a.faults,
        "suspects": suspects,
        "nodes_available": inv.nodes_available,
        "fabric_import_s": import_s,
        "wall_s": wall_s,
        "rounds": inv.round,
        "tests": inv.tests.len(),
        "node_seconds": inv.node_seconds,
        "blamed": inv.blamed.iter().map(|p| json!({"component": p.component, "id": p.id, "confidence": p.confidence, "place": p.place})).collect::<Vec<_>>(),
        "right": right,
        "faults_found": right == faults.len() && blamed.len() == faults.len(),
        "rounds_at": rounds_at,
        "health_reason": health_reason,
        "notes": inv.notes,
        "latency": latency,
        "failures": samples.3,
    }))
}
