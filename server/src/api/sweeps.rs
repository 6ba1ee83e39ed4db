//! A `sweep` run read as cells × size bands, and keeping a band's winner as a tuning
//! profile (which then feeds the node's env export).
//!
//! A cell is the set of `NCCL_*` labels on a row (the agent labels every row with its
//! cell). A cell's figure for a band is the mean `busbw_gbs` of its rows whose size falls
//! in the band (small < 64 KiB ≤ medium < 64 MiB ≤ large), out-of-place and in-place rows
//! alike, as nccl-tests' "Avg bus bandwidth" averages a table. A cell with any wrong
//! element cannot win a band.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::StatusCode;
use heddle_types::auth::Role;
use heddle_types::jobs::ResultRow;
use heddle_types::kinds::RunParams;
use heddle_types::kinds::nccl::NcclParams;
use heddle_types::nodes::TuningProfile;
use heddle_types::sweeps::*;
use uuid::Uuid;

use crate::api::nodes::insert_profile;
use crate::db;
use crate::http::auth::Caller;
use crate::http::error::{ApiError, ApiResult, Json, Path};
use crate::jobs::read;
use crate::nodes::NewProfile;
use crate::state::AppState;

/// The cells of a sweep's rows, in the order they first appear, and each band's winner.
pub fn tabulate(rows: &[ResultRow]) -> (Vec<SweepCell>, Vec<SweepWinner>) {
    struct Acc {
        env: BTreeMap<String, String>,
        sums: [(f64, u32); 3],
        peak: Option<f64>,
        wrong: i64,
        rows: usize,
    }
    let mut cells: Vec<Acc> = Vec::new();
    for r in rows {
        let env: BTreeMap<String, String> = r
            .labels
            .iter()
            .filter(|(k, _)| k.starts_with("NCCL_"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let i = match cells.iter().position(|c| c.env == env) {
            Some(i) => i,
            None => {
                cells.push(Acc {
                    env,
                    sums: [(0.0, 0); 3],
                    peak: None,
                    wrong: 0,
                    rows: 0,
                });
                cells.len() - 1
            }
        };
        let c = &mut cells[i];
        c.rows += 1;
        c.wrong += r.wrong.unwrap_or(0).max(0);
        if let Some(bw) = r.busbw_gbs.filter(|b| b.is_finite()) {
            let slot = &mut c.sums[Band::of(r.size_bytes) as usize];
            slot.0 += bw;
            slot.1 += 1;
            c.peak = Some(c.peak.map_or(bw, |p: f64| p.max(bw)));
        }
    }
    let cells: Vec<SweepCell> = cells
        .into_iter()
        .map(|a| {
            let mut busbw = BandBusbw::default();
            for band in Band::ALL {
                let (sum, n) = a.sums[band as usize];
                busbw.set(band, (n > 0).then(|| sum / f64::from(n)));
            }
            SweepCell {
                env: a.env,
                busbw_gbs: busbw,
                peak_busbw_gbs: a.peak,
                wrong: a.wrong,
                rows: a.rows,
            }
        })
        .collect();
    let mut winners = Vec::new();
    for band in Band::ALL {
        let mut ranked: Vec<(&SweepCell, f64)> = cells
            .iter()
            .filter(|c| c.wrong == 0)
            .filter_map(|c| c.busbw_gbs.get(band).map(|b| (c, b)))
            .collect();
        // Stable: among equal figures the earlier cell wins.
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
        if let Some(&(best, bw)) = ranked.first() {
            winners.push(SweepWinner {
                band,
                env: best.env.clone(),
                busbw_gbs: bw,
                runner_up_busbw_gbs: ranked.get(1).map(|r| r.1),
            });
        }
    }
    (cells, winners)
}

struct Loaded {
    table: SweepTable,
    site_id: Option<Uuid>,
}

async fn load(db: &sqlx::PgPool, id: Uuid) -> ApiResult<Loaded> {
    let spec = read::run_spec(db, id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no run {id}")))?;
    if spec.kind != "sweep" {
        return Err(ApiError::Unprocessable(format!(
            "run {id} is a {} run, not a sweep",
            spec.kind
        )));
    }
    // A sweep runs on one node (the agent refuses more), so its first rank is the sweep.
    let job = read::first_job(db, id)
        .await?
        .ok_or_else(|| ApiError::Conflict(format!("run {id} has no job")))?;
    let Some(result_id) = job.result_id else {
        return Err(ApiError::Conflict(format!(
            "sweep {id} has no result yet (its job is {})",
            job.state
        )));
    };
    let rows = read::sweep_rows(db, result_id).await?;
    if rows.is_empty() {
        return Err(ApiError::Conflict(format!(
            "sweep {id} ended {} without measurements{}",
            job.outcome.as_deref().unwrap_or("?"),
            job.reason.map(|r| format!(": {r}")).unwrap_or_default()
        )));
    }
    let (cells, winners) = tabulate(&rows);
    // A stored sweep whose params today's limits refuse still names its collective.
    let collective = match spec.params.typed() {
        Ok(RunParams::Sweep(sweep)) => sweep.nccl.op.clone(),
        _ => spec
            .params
            .get("op")
            .and_then(|v| v.as_str())
            .map_or_else(|| NcclParams::default().op, str::to_string),
    };
    Ok(Loaded {
        table: SweepTable {
            run_id: id,
            node_id: job.node_id,
            hostname: job.hostname,
            collective: Some(collective),
            cells,
            winners,
        },
        site_id: job.site_id,
    })
}

/// A sweep's cells × size bands (mean busbw) and the winning cell of each band.
#[utoipa::path(get, path = "/api/v1/runs/{id}/sweep", tag = "runs", security(("bearer" = [])), params(("id" = Uuid, Path)),
    responses((status = 200, body = SweepTable), (status = 404, body = heddle_types::ErrorBody),
        (status = 409, body = heddle_types::ErrorBody, description = "the sweep has no result with rows yet"),
        (status = 422, body = heddle_types::ErrorBody, description = "the run is not a sweep")))]
pub async fn sweep_table(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<Uuid>,
) -> ApiResult<Json<SweepTable>> {
    caller.require(Role::Viewer)?;
    Ok(Json(load(&state.db, id).await?.table))
}

/// Keep the winning cell of a band as a tuning profile of the sweep's node or its site.
#[utoipa::path(post, path = "/api/v1/runs/{id}/sweep/keep", tag = "runs", security(("bearer" = [])), params(("id" = Uuid, Path)),
    request_body = SweepKeep,
    responses((status = 201, body = TuningProfile), (status = 404, body = heddle_types::ErrorBody),
        (status = 409, body = heddle_types::ErrorBody, description = "no result yet, or the profile name is taken"),
        (status = 422, body = heddle_types::ErrorBody, description = "not a sweep, no winner in that band, or no site")))]
pub async fn keep_winner(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<Uuid>,
    Json(req): Json<SweepKeep>,
) -> ApiResult<(StatusCode, Json<TuningProfile>)> {
    caller.require(Role::Operator)?;
    db::check_name("profile name", &req.name)?;
    let loaded = load(&state.db, id).await?;
    let band = req.band;
    let winner = loaded
        .table
        .winners
        .iter()
        .find(|w| w.band == band)
        .ok_or_else(|| {
            ApiError::Unprocessable(format!(
                "sweep {id} has no valid cell that measured the {} band",
                band.as_str()
            ))
        })?;
    if winner.env.is_empty() {
        return Err(ApiError::Unprocessable(format!(
            "the {} winner of sweep {id} has no NCCL_* values to keep",
            band.as_str()
        )));
    }
    db::check_env(&winner.env, "the sweep's winner")?;
    let (node_id, site_id) = match req.scope {
        ProfileScope::Node => (Some(loaded.table.node_id), None),
        ProfileScope::Site => match loaded.site_id {
            Some(s) => (None, Some(s)),
            None => {
                return Err(ApiError::Unprocessable(format!(
                    "node {} belongs to no site",
                    loaded.table.hostname
                )));
            }
        },
    };
    let mut tx = state.db.begin().await?;
    let profile = NewProfile {
        name: &req.name,
        node_id,
        site_id,
        env: &winner.env,
        source_run_id: Some(id),
    };
    let detail = serde_json::json!({"env": winner.env, "from_sweep": id, "band": band, "busbw_gbs": winner.busbw_gbs, "scope": req.scope});
    let (row, changed) = insert_profile(&mut tx, &caller, profile, detail).await?;
    tx.commit().await?;
    state.job_env_seen.forget(&changed);
    tracing::info!(run = %id, profile = %req.name, band = band.as_str(), "kept a sweep winner as a tuning profile");
    Ok((StatusCode::CREATED, Json(row)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(size: i64, busbw: f64, wrong: i64, cell: &[(&str, &str)]) -> ResultRow {
        ResultRow {
            size_bytes: size,
            busbw_gbs: Some(busbw),
            wrong: Some(wrong),
            labels: cell
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn cells_bands_and_winners() {
        let ring = [("NCCL_ALGO", "Ring"), ("NCCL_PROTO", "Simple")];
        let tree = [("NCCL_ALGO", "Tree"), ("NCCL_PROTO", "LL")];
        let bad = [("NCCL_ALGO", "Ring"), ("NCCL_PROTO", "LL128")];
        let rows = vec![
            r(8, 0.01, 0, &ring),
            r(1 << 20, 70.0, 0, &ring),
            r(1 << 20, 74.0, 0, &ring),
            r(256 << 20, 300.0, 0, &ring),
            r(8, 0.02, 0, &tree),
            r(1 << 20, 60.0, 0, &tree),
            r(256 << 20, 250.0, 0, &tree),
            r(8, 5.0, 0, &bad),
            r(256 << 20, 900.0, 12, &bad),
        ];
        let (cells, winners) = tabulate(&rows);
        assert_eq!(cells.len(), 3);
        assert_eq!(cells[0].env["NCCL_ALGO"], "Ring");
        assert_eq!(cells[0].busbw_gbs.medium, Some(72.0));
        assert_eq!(cells[0].busbw_gbs.large, Some(300.0));
        assert_eq!(cells[0].peak_busbw_gbs, Some(300.0));
        assert_eq!((cells[2].wrong, cells[2].rows), (12, 2));
        // The LL128 cell's figures are the best but it counted wrong elements.
        let w: Vec<(Band, &str, f64)> = winners
            .iter()
            .map(|w| (w.band, w.env["NCCL_ALGO"].as_str(), w.busbw_gbs))
            .collect();
        assert_eq!(
            w,
            vec![
                (Band::Small, "Tree", 0.02),
                (Band::Medium, "Ring", 72.0),
                (Band::Large, "Ring", 300.0)
            ]
        );
        assert_eq!(winners[2].runner_up_busbw_gbs, Some(250.0));
        assert_eq!(
            winners[1].env,
            BTreeMap::from([
                ("NCCL_ALGO".into(), "Ring".into()),
                ("NCCL_PROTO".into(), "Simple".into())
            ])
        );
    }

    #[test]
    fn non_nccl_labels_do_not_split_cells_and_empty_bands_have_no_winner() {
        let rows = vec![
            r(8, 1.0, 0, &[("NCCL_ALGO", "Ring"), ("host", "a")]),
            r(16, 2.0, 0, &[("NCCL_ALGO", "Ring"), ("host", "b")]),
        ];
        let (cells, winners) = tabulate(&rows);
        assert_eq!(cells.len(), 1);
        assert_eq!(
            cells[0].busbw_gbs,
            BandBusbw {
                small: Some(1.5),
                medium: None,
                large: None
            }
        );
        assert_eq!(winners.len(), 1);
        assert_eq!(winners[0].band, Band::Small);
    }
}
