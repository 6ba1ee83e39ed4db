//! The fabric model as simulated agents' tests: a run of a fabric investigation (its
//! nodes and rail read from the API once) answered with the bus bandwidth, or the hang,
//! that the fabric model (`heddle_types::fabric::model`) gives for its path with the faults
//! given, and the result each rank uploads for it. Used by `heddle-loadgen --fabric` and
//! the dashboard's fabric test.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use heddle_types::fabric::index::Index;
use heddle_types::fabric::model::{Fault, Model};
use heddle_types::fabric::sim::{ALL_REDUCE, RoundRequest, TestResult, TestSpec};
use serde_json::{Value, json};
use tokio::sync::OnceCell;
use uuid::Uuid;

/// The test each run stands for, answered once (the first rank to ask reads the run).
type Answers = Mutex<HashMap<Uuid, Arc<OnceCell<TestResult>>>>;

pub struct Oracle {
    model: Mutex<Model<'static>>,
    answers: Answers,
    http: reqwest::Client,
    base: String,
    admin: String,
}

impl Oracle {
    /// The model of `ix` (kept for the life of the process) with `faults`, reading runs
    /// from the server at `base` with the token `admin`.
    pub fn new(
        ix: &'static Index,
        faults: &[Fault],
        seed: u64,
        base: &str,
        admin: &str,
    ) -> Result<Oracle, String> {
        Ok(Oracle {
            model: Mutex::new(Model::new(ix, faults, seed)?),
            answers: Mutex::default(),
            http: reqwest::Client::new(),
            base: base.to_string(),
            admin: admin.to_string(),
        })
    }

    /// The test run `run` stands for, answered once for all its ranks; an error when the
    /// run cannot be read, as the reason of a failed test.
    pub async fn answer(&self, run: Uuid) -> TestResult {
        let cell = self.answers.lock().unwrap().entry(run).or_default().clone();
        let r = cell
            .get_or_try_init(|| async {
                let run: Value = self
                    .http
                    .get(format!("{}/api/v1/runs/{run}", self.base))
                    .bearer_auth(&self.admin)
                    .send()
                    .await?
                    .error_for_status()?
                    .json()
                    .await?;
                let mut jobs: Vec<(i64, String)> = run["jobs"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|j| {
                        (
                            j["rank"].as_i64().unwrap_or(0),
                            j["hostname"].as_str().unwrap_or("").to_string(),
                        )
                    })
                    .collect();
                jobs.sort();
                // `NCCL_IB_HCA==mlx5_R` selects rail R; without it, every rail.
                let rail = run["spec"]["env"]["NCCL_IB_HCA"]
                    .as_str()
                    .and_then(|v| v.trim_start_matches("=mlx5_").parse::<u32>().ok());
                let bytes = run["spec"]["params"]["max_bytes"]
                    .as_u64()
                    .unwrap_or(1 << 30);
                let req = RoundRequest {
                    round: 0,
                    tests: vec![TestSpec {
                        id: "t".into(),
                        kind: ALL_REDUCE.into(),
                        nodes: jobs.into_iter().map(|j| j.1).collect(),
                        rail,
                        bytes,
                    }],
                };
                let mut res = self.model.lock().unwrap().answer(&req);
                anyhow::Ok(res.results.remove(0))
            })
            .await;
        match r {
            Ok(r) => r.clone(),
            Err(e) => TestResult {
                id: "t".into(),
                busbw_gbs: None,
                error: Some(format!("the simulated agent could not read run {run}: {e}")),
                seconds: None,
            },
        }
    }
}

/// The result a rank uploads for `answer` under `lease` (a claim's answer): the figure as
/// one nccl-tests row, or a failure with the model's reason; it started the answer's
/// seconds ago.
pub fn result_body(lease: &Value, answer: &TestResult) -> Value {
    let seconds = answer.seconds.unwrap_or(30.0);
    let finished = chrono::Utc::now();
    let started = finished - chrono::Duration::milliseconds((seconds * 1e3) as i64);
    match answer.busbw_gbs {
        Some(busbw) => {
            let bytes = 1i64 << 30;
            let time_us = seconds * 1e6 / 25.0;
            json!({"upload_key": Uuid::new_v4().to_string(), "outcome": "succeeded",
                "claim_id": lease["claim_id"],
                "rows": [{"size_bytes": bytes, "op": "all_reduce", "dtype": "float", "in_place": false,
                          "time_us": time_us, "algbw_gbs": busbw / 2.0, "busbw_gbs": busbw, "wrong": 0}],
                "started_at": started, "finished_at": finished})
        }
        None => json!({"upload_key": Uuid::new_v4().to_string(), "outcome": "failed",
            "claim_id": lease["claim_id"],
            "reason": format!("NCCL all_reduce: {} (simulated fabric)", answer.error.as_deref().unwrap_or("failed")),
            "started_at": started, "finished_at": finished}),
    }
}
