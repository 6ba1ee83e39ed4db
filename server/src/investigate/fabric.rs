//! Fabric investigations (docs/fabric.md): find the broken part of the site's fabric (a
//! NIC or its cable, a node, a leaf, a leaf's uplinks, a spine) behind some suspect nodes.
//! The planner of `heddle_types::fabric::plan` chooses each round's tests along the stored
//! fabric; each test is one multi-node `nccl` all_reduce run on one rail
//! (`NCCL_IB_HCA` set to that rail's NIC), and its bus bandwidth, or its failure, is the
//! evidence the next round is planned from.
//!
//! Nothing lives in memory: on every step the investigations worker locks one running
//! investigation (`SKIP LOCKED`), records the runs that ended, and when the round is
//! complete rebuilds the planner from the stored rounds (`Planner::resume`) to plan the
//! next one or give the answer, named in the fabric's terms.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use heddle_types::fabric::Fabric;
use heddle_types::fabric::index::Index;
use heddle_types::fabric::investigation::{
    DEFAULT_TIMEOUT_S, FabricInvestigationCreate, FabricTestState, MAX_ROUNDS, MAX_SUSPECTS,
    behind, parts,
};
use heddle_types::fabric::plan::{Config, MAX_OBSERVATIONS, Planner};
use heddle_types::fabric::sim::{RoundRequest, RoundResults, TestResult};
use heddle_types::jobs::JobSpec;
use sqlx::types::Json;
use uuid::Uuid;

use super::InvestigateError;
use super::advance::{PAIR_CLAIM_DEADLINE, run_figure};
use super::fabric_store::{self as store, FabricRow, Stored, TestRow};
use crate::fabric::FabricError;
use crate::jobs::{self, JobError, NewRun};

pub use super::fabric_health::node_reasons;
pub use store::{list, load};

/// Attempts of a test's jobs: one retry when an agent is lost mid-test.
const TEST_MAX_ATTEMPTS: u32 = 2;

impl From<FabricError> for InvestigateError {
    fn from(err: FabricError) -> Self {
        match err {
            FabricError::Database(e) => InvestigateError::Database(e),
            FabricError::NoneYet => InvestigateError::Invalid(err.to_string()),
            other => InvestigateError::Corrupt {
                what: "fabric",
                message: other.to_string(),
            },
        }
    }
}

/// Checks a request, stores the investigation and starts its first round, in one
/// transaction with its audit entry. `online_s`: how recently a node must have been seen
/// to be tested.
pub async fn create(
    db: &sqlx::PgPool,
    actor: &str,
    req: &FabricInvestigationCreate,
    online_s: f64,
) -> Result<Uuid, InvestigateError> {
    let invalid = |m: String| InvestigateError::Invalid(m);
    if let Some(label) = &req.label {
        heddle_types::names::check_label("the investigation's label", label).map_err(invalid)?;
    }
    let max_rounds = req.max_rounds.unwrap_or(Config::default().max_rounds);
    if !(1..=MAX_ROUNDS).contains(&max_rounds) {
        return Err(invalid(format!(
            "max_rounds must be between 1 and {MAX_ROUNDS}"
        )));
    }
    let timeout_s = req.timeout_s.unwrap_or(DEFAULT_TIMEOUT_S);
    if !(1..=86_400).contains(&timeout_s) {
        return Err(invalid("timeout_s must be between 1 and 86400".into()));
    }
    let max_nodes = req.max_nodes.unwrap_or(0);
    if max_nodes == 1 || max_nodes > 1_000_000 {
        return Err(invalid(
            "max_nodes must be 0 (no limit) or between 2 and 1000000".into(),
        ));
    }
    if req.evidence.len() > MAX_OBSERVATIONS {
        return Err(invalid(format!(
            "evidence lists {} jobs, more than {MAX_OBSERVATIONS}",
            req.evidence.len()
        )));
    }
    let suspects = expand(&req.suspects).map_err(invalid)?;
    let fabric = crate::fabric::current(db).await?.fabric;

    let mut tx = db.begin().await?;
    let names: Vec<String> = fabric.nodes.iter().map(|n| n.name.clone()).collect();
    let available: BTreeSet<String> = store::available(&mut tx, &names, online_s, req.include_busy)
        .await?
        .into_iter()
        .map(|(_, h)| h)
        .collect();
    let mut notes = Vec::new();
    let in_fabric: BTreeSet<&str> = names.iter().map(String::as_str).collect();
    let mut testable = Vec::new();
    for s in &suspects {
        if available.contains(s) {
            testable.push(s.clone());
        } else if in_fabric.contains(s.as_str()) {
            notes.push(format!(
                "{s}: left out: not enrolled, not seen in the last {online_s:.0} s{}",
                if req.include_busy {
                    ""
                } else {
                    ", or busy (include_busy takes busy nodes)"
                }
            ));
        } else {
            notes.push(format!("{s}: left out: not a node of the fabric"));
        }
    }
    if testable.is_empty() {
        return Err(invalid(format!(
            "none of the {} suspects can be tested: {}",
            suspects.len(),
            notes.iter().take(5).cloned().collect::<Vec<_>>().join("; ")
        )));
    }
    let fabric = restrict(&fabric, &available);
    one_name_a_rail(&fabric).map_err(invalid)?;
    let row = FabricRow {
        id: Uuid::new_v4(),
        created_at: chrono::Utc::now(),
        created_by: actor.to_string(),
        label: req.label.clone(),
        state: "running".into(),
        error: None,
        finished_at: None,
        suspects: testable,
        nodes: available.into_iter().collect(),
        max_nodes: max_nodes as i32,
        max_rounds: max_rounds as i32,
        suspects_only: req.suspects_only,
        include_busy: req.include_busy,
        timeout_s: timeout_s as i32,
        seed: rand_seed(),
        evidence: Json(req.evidence.clone()),
        round: 0,
        answer: None,
        notes,
    };
    // The first round, or why there is none; the evidence is checked here.
    let step = plan(fabric.clone(), row.clone(), Vec::new()).await?;
    let step = match step {
        Step::Failed(why) => return Err(invalid(why)),
        other => other,
    };
    store::insert(&mut tx, &row).await?;
    crate::db::audit(
        &mut *tx,
        actor,
        "investigation.create",
        &format!("fabric-investigation:{}", row.id),
        serde_json::json!({"suspects": row.suspects.len(), "nodes": row.nodes.len(),
            "max_nodes": max_nodes, "max_rounds": max_rounds}),
    )
    .await?;
    apply(&mut tx, &row, &fabric, step).await?;
    tx.commit().await?;
    tracing::info!(investigation = %row.id, suspects = row.suspects.len(), nodes = row.nodes.len(), "fabric investigation started");
    Ok(row.id)
}

/// Advances every running fabric investigation no other replica holds right now. Returns
/// how many test runs were started.
pub async fn advance_all(db: &sqlx::PgPool) -> Result<usize, InvestigateError> {
    let mut started = 0;
    for id in store::running_ids(db).await? {
        let mut tx = db.begin().await?;
        started += advance_locked(&mut tx, id).await?;
        tx.commit().await?;
    }
    Ok(started)
}

async fn advance_locked(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    id: Uuid,
) -> Result<usize, InvestigateError> {
    let Some(row) = store::lock_running(tx, id).await? else {
        return Ok(0);
    };
    let runs = store::running_runs(tx, id).await?;
    if !runs.is_empty() {
        let deadline = PAIR_CLAIM_DEADLINE.as_secs() as i64;
        let gave_up = jobs::store::give_up_unclaimed_runs(tx, &runs, deadline).await?;
        if !gave_up.is_empty() {
            tracing::warn!(investigation = %id, runs = gave_up.len(), "fabric tests unclaimed past the deadline; their runs are cancelled");
        }
    }
    collect(tx, id).await?;
    if store::any_running(tx, id).await? {
        return Ok(0);
    }
    let tests = store::tests(tx, id).await?;
    let fabric = match crate::fabric::current(&mut **tx).await {
        Ok(s) => s.fabric,
        Err(FabricError::NoneYet) => {
            store::fail(tx, id, "the site's fabric was removed").await?;
            return Ok(0);
        }
        Err(e) => return Err(e.into()),
    };
    let keep: BTreeSet<String> = row.nodes.iter().cloned().collect();
    let fabric = restrict(&fabric, &keep);
    let step = plan(fabric.clone(), row.clone(), tests).await?;
    apply(tx, &row, &fabric, step).await
}

/// What the planner says to do next.
enum Step {
    Round(RoundRequest),
    /// The answer, and the nodes whose traffic crosses what it blames.
    Done(Stored, Vec<String>),
    Failed(String),
}

/// Rebuilds the planner from the stored rounds, off the async threads, and asks it for
/// the next round or its answer.
async fn plan(
    fabric: Fabric,
    row: FabricRow,
    tests: Vec<TestRow>,
) -> Result<Step, InvestigateError> {
    let step = tokio::task::spawn_blocking(move || replay(&fabric, &row, &tests))
        .await
        .map_err(|e| InvestigateError::Corrupt {
            what: "fabric planner",
            message: e.to_string(),
        })?;
    Ok(step)
}

fn replay(fabric: &Fabric, row: &FabricRow, tests: &[TestRow]) -> Step {
    let ix = Index::new(fabric);
    let cfg = Config {
        max_nodes: row.max_nodes as usize,
        max_rounds: row.max_rounds as u32,
        use_others: !row.suspects_only,
        seed: row.seed as u64,
        ..Config::default()
    };
    let mut planner = match Planner::new(&ix, &row.suspects, cfg) {
        Ok(p) => p,
        Err(e) => return Step::Failed(e),
    };
    if !row.evidence.0.is_empty()
        && let Err(e) = planner.observe(&row.evidence.0)
    {
        return Step::Failed(format!("the evidence: {e}"));
    }
    let mut rounds: BTreeMap<i32, Vec<&TestRow>> = BTreeMap::new();
    for t in tests {
        rounds.entry(t.round).or_default().push(t);
    }
    for (round, list) in rounds {
        // Tests that could not start are no evidence: the planner never hears of them.
        let ran: Vec<&TestRow> = list
            .into_iter()
            .filter(|t| t.state != FabricTestState::Skipped.as_str())
            .collect();
        let request = RoundRequest {
            round: round as u32,
            tests: ran
                .iter()
                .map(|t| heddle_types::fabric::sim::TestSpec {
                    id: t.test_id.clone(),
                    kind: heddle_types::fabric::sim::ALL_REDUCE.into(),
                    nodes: t.nodes.clone(),
                    rail: t.rail.map(|r| r as u32),
                    bytes: t.bytes as u64,
                })
                .collect(),
        };
        let results = RoundResults {
            round: round as u32,
            results: ran
                .iter()
                .map(|t| TestResult {
                    id: t.test_id.clone(),
                    busbw_gbs: t.busbw_gbs,
                    error: match (t.busbw_gbs, &t.error) {
                        (Some(_), _) => None,
                        (None, Some(e)) => Some(e.clone()),
                        (None, None) => Some("no figure".into()),
                    },
                    seconds: t.seconds,
                })
                .collect(),
        };
        if let Err(e) = planner
            .resume(&request)
            .and_then(|()| planner.record(&results))
        {
            return Step::Failed(format!(
                "round {round} no longer fits the site's fabric (imported again since?): {e}"
            ));
        }
    }
    // Skipped tests were never resumed; their ids are not to be given again.
    let last = tests
        .iter()
        .filter_map(|t| t.test_id.strip_prefix('t')?.parse::<u64>().ok())
        .max()
        .unwrap_or(0);
    planner.ids_past(last);
    match planner.next_round() {
        Some(req) => Step::Round(req),
        None => {
            let mut answer = planner.answer();
            let mut notes = row.notes.clone();
            notes.append(&mut answer.notes);
            answer.notes = notes;
            let (blamed, candidates) = parts(fabric, &answer);
            let behind: BTreeSet<String> = answer
                .blamed
                .iter()
                .flat_map(|b| behind(fabric, b.component, &b.id))
                .collect();
            let stored = Stored {
                answer,
                blamed,
                candidates,
            };
            Step::Done(stored, behind.into_iter().collect())
        }
    }
}

/// Carries out a step: starts the round's runs, or stores the answer or the failure.
/// Returns the runs started.
async fn apply(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    row: &FabricRow,
    fabric: &Fabric,
    step: Step,
) -> Result<usize, InvestigateError> {
    match step {
        Step::Failed(why) => {
            store::fail(tx, row.id, &why).await?;
            Ok(0)
        }
        Step::Done(stored, behind) => {
            let blamed: Vec<&str> = stored.blamed.iter().map(|b| b.id.as_str()).collect();
            tracing::info!(investigation = %row.id, rounds = stored.answer.rounds, tests = stored.answer.tests, ?blamed, "fabric investigation done");
            store::finish(tx, row.id, &stored, &behind).await?;
            Ok(0)
        }
        Step::Round(req) => start_round(tx, row, fabric, &req).await,
    }
}

/// Starts one run per test of the round.
async fn start_round(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    row: &FabricRow,
    fabric: &Fabric,
    req: &RoundRequest,
) -> Result<usize, InvestigateError> {
    let names: Vec<String> = req
        .tests
        .iter()
        .flat_map(|t| t.nodes.iter().cloned())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let ids: HashMap<String, Uuid> = store::node_ids(tx, &names)
        .await?
        .into_iter()
        .map(|(id, h)| (h, id))
        .collect();
    let nic_of_rail = rail_names(fabric);
    // Nodes that took on a job since the investigation started are left alone.
    let busy: BTreeSet<String> = if row.include_busy {
        BTreeSet::new()
    } else {
        store::busy(tx, &names).await?.into_iter().collect()
    };
    let mut started = 0;
    for t in &req.tests {
        let mut test = TestRow {
            test_id: t.id.clone(),
            round: req.round as i32,
            nodes: t.nodes.clone(),
            rail: t.rail.map(|r| r as i32),
            bytes: t.bytes as i64,
            run_id: None,
            state: FabricTestState::Running.as_str().into(),
            busbw_gbs: None,
            error: None,
            seconds: None,
        };
        let step = match t.nodes.iter().find(|n| busy.contains(*n)) {
            Some(n) => Err(format!(
                "{n} is running a job (include_busy takes busy nodes)"
            )),
            None => start_test(tx, row, req.round, t, &ids, &nic_of_rail).await?,
        };
        match step {
            Ok(run) => {
                test.run_id = Some(run);
                started += 1;
            }
            Err(why) => {
                test.state = FabricTestState::Skipped.as_str().into();
                test.error = Some(format!("not run: {why}"));
            }
        }
        store::insert_test(tx, row.id, &test).await?;
    }
    store::set_round(tx, row.id, req.round as i32).await?;
    tracing::info!(investigation = %row.id, round = req.round, tests = req.tests.len(), runs = started, "fabric investigation: round started");
    Ok(started)
}

/// One test's run, or why it cannot start (no evidence either way).
async fn start_test(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    row: &FabricRow,
    round: u32,
    t: &heddle_types::fabric::sim::TestSpec,
    ids: &HashMap<String, Uuid>,
    nic_of_rail: &BTreeMap<u32, String>,
) -> Result<Result<Uuid, String>, InvestigateError> {
    let mut nodes = Vec::with_capacity(t.nodes.len());
    for n in &t.nodes {
        match ids.get(n) {
            Some(id) => nodes.push(*id),
            None => return Ok(Err(format!("node {n} is no longer enrolled"))),
        }
    }
    let mut env = BTreeMap::new();
    if let Some(rail) = t.rail {
        let Some(nic) = nic_of_rail.get(&rail) else {
            return Ok(Err(format!("the fabric names no NIC on rail {rail}")));
        };
        // `=`: this NIC exactly, not every NIC whose name starts with it.
        env.insert("NCCL_IB_HCA".to_string(), format!("={nic}"));
    }
    let mut spec = JobSpec {
        env,
        timeout_s: Some(row.timeout_s as u32),
        ..JobSpec::new(
            "nccl",
            serde_json::json!({"op": "all_reduce", "min_bytes": t.bytes, "max_bytes": t.bytes,
                "warmup": 5, "iters": 20}),
        )
    };
    jobs::validate_spec(&mut spec)?;
    let rail = t
        .rail
        .map_or("every rail".to_string(), |r| format!("rail {r}"));
    let label = format!(
        "fabric investigation {}: round {round} {} ({rail})",
        row.id, t.id
    );
    let started = jobs::insert_run(
        tx,
        &NewRun {
            spec: &spec,
            nodes: &nodes,
            max_attempts: TEST_MAX_ATTEMPTS,
            label: Some(&label),
            actor: &row.created_by,
            recommended_env: true,
            audit: serde_json::json!({"nodes": t.nodes, "fabric_investigation": row.id, "test": t.id}),
        },
    )
    .await;
    match started {
        Ok(run) => Ok(Ok(run)),
        // The nodes' environments came to disagree since the investigation started.
        Err(JobError::EnvSplit(splits)) => Ok(Err(splits.to_string())),
        Err(e) => Err(e.into()),
    }
}

/// Records the figure (or the failure) of every running test whose run has ended.
async fn collect(tx: &mut sqlx::PgConnection, id: Uuid) -> Result<(), sqlx::Error> {
    let ended = store::ended(tx, id).await?;
    if ended.is_empty() {
        return Ok(());
    }
    let ok_runs: Vec<Uuid> = ended
        .iter()
        .filter(|e| e.jobs > 0 && e.ok == e.jobs)
        .filter_map(|e| e.run_id)
        .collect();
    let rows = store::busbw_rows(tx, &ok_runs).await?;
    for e in ended {
        let (busbw, error) =
            match run_figure(e.jobs, e.ok, e.why.as_deref(), e.run_id, &rows, "busbw_gbs") {
                Ok((_, v)) => (Some(v), None),
                Err(why) => (None, Some(why)),
            };
        store::finish_test(tx, id, &e.test_id, busbw, error.as_deref(), e.seconds).await?;
    }
    Ok(())
}

/// The suspects as given, each a hostname or a Slurm hostlist, expanded and deduplicated
/// in their order.
fn expand(given: &[String]) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    for g in given {
        let list = heddle_types::hostlist::expand_at_most(g, MAX_SUSPECTS)
            .map_err(|e| format!("suspects: {g:?}: {e}"))?;
        for n in list.0 {
            if seen.insert(n.clone()) {
                out.push(n);
            }
            if out.len() > MAX_SUSPECTS {
                return Err(format!("suspects: more than {MAX_SUSPECTS} nodes"));
            }
        }
    }
    if out.is_empty() {
        return Err("suspects must name at least one node".into());
    }
    Ok(out)
}

/// The fabric with only the nodes in `keep`: the planner partners suspects with nodes it
/// may test, never with others.
fn restrict(fabric: &Fabric, keep: &BTreeSet<String>) -> Fabric {
    Fabric {
        nodes: fabric
            .nodes
            .iter()
            .filter(|n| keep.contains(&n.name))
            .cloned()
            .collect(),
        switches: fabric.switches.clone(),
        links: fabric.links.clone(),
        notes: Vec::new(),
    }
}

/// Each rail's NIC name (what `NCCL_IB_HCA` selects the rail by).
fn rail_names(fabric: &Fabric) -> BTreeMap<u32, String> {
    let mut out = BTreeMap::new();
    for n in &fabric.nodes {
        for k in &n.nics {
            if let Some(r) = k.rail {
                out.entry(r).or_insert_with(|| k.name.clone());
            }
        }
    }
    out
}

/// A rail test selects its NIC by name on every node at once, so each rail's NIC must have
/// one name across the nodes it may test.
fn one_name_a_rail(fabric: &Fabric) -> Result<(), String> {
    let mut first: BTreeMap<u32, (&str, &str)> = BTreeMap::new();
    for n in &fabric.nodes {
        for k in &n.nics {
            let Some(r) = k.rail else { continue };
            let (name, node) = *first.entry(r).or_insert((&k.name, &n.name));
            if name != k.name {
                return Err(format!(
                    "rail {r}'s NIC is {name} on {node} but {} on {}: a test selects its rail \
                     by one NCCL_IB_HCA for every node, so the fabric must name each rail's \
                     NIC alike",
                    k.name, n.name
                ));
            }
        }
    }
    Ok(())
}

/// The planner's seed: its partner shuffles differ between investigations.
fn rand_seed() -> i64 {
    let b = Uuid::new_v4().into_bytes();
    i64::from_le_bytes(b[..8].try_into().expect("8 bytes")) & i64::MAX
}
