//! `sweep`: the `nccl` measurement over a grid of NCCL environment knobs (e.g.
//! `NCCL_ALGO` × `NCCL_PROTO`), one row set per cell, labelled with the cell. NCCL reads
//! most knobs once per process, so every cell runs in a fresh `heddle-agent bench nccl
//! --json` process with that cell's environment on top of the job's. A cell that hangs
//! ends itself through bench's stall watch and is recorded as `hung`; the grid goes on.
//!
//! Params: those of `nccl` (one node only), plus `grid`: an object mapping `NCCL_*`
//! names to lists of values; at most 64 cells (`heddle_types::kinds::sweep::SweepParams`).

use heddle_types::jobs::ResultRow;
use heddle_types::kinds::sweep::SweepParams;
use heddle_types::params::KindParams;
use serde_json::{Map, Value, json};

use super::child_env;
use super::nccl::Params as NcclParams;
use super::protocol::{ChildEvent, ChildInput};
use super::{RunError, Sink};

/// `bench nccl` arguments for these params.
pub fn bench_args(p: &NcclParams) -> Vec<String> {
    let mut a = vec![
        "bench".into(),
        "nccl".into(),
        p.coll.name().into(),
        "-b".into(),
        p.sweep.min_bytes.to_string(),
        "-e".into(),
        p.sweep.max_bytes.to_string(),
        "-f".into(),
        p.sweep.factor.to_string(),
        "-g".into(),
        p.gpus.to_string(),
        "-w".into(),
        p.warmup.to_string(),
        "-n".into(),
        p.iters.to_string(),
        "-c".into(),
        u8::from(p.check).to_string(),
        "-d".into(),
        p.dtype.name().into(),
        "-o".into(),
        p.redop.name().into(),
        "-r".into(),
        p.root.to_string(),
        "--json".into(),
    ];
    if let Some(step) = p.sweep.step_bytes {
        a.extend(["-i".into(), step.to_string()]);
    }
    if let Some(g) = p.graph {
        a.extend(["-G".into(), g.to_string()]);
    }
    if let Some(b) = p.budget {
        a.extend(["--budget".into(), b.as_secs_f64().to_string()]);
    }
    a
}

pub fn run(input: &ChildInput, out: &mut Sink<'_>) -> Result<(), RunError> {
    let typed = SweepParams::decode(&input.params).map_err(|e| RunError::Params(e.to_string()))?;
    let params = NcclParams::from_wire(&typed.nccl)?;
    let grid = typed.cells().map_err(|e| RunError::Params(e.to_string()))?;
    if input.world_size > 1 {
        return Err(RunError::Params(
            "sweep runs on one node; use nccl jobs with env for multi-node cells".into(),
        ));
    }
    let exe = std::env::current_exe()?;
    // The job's budget is for the whole grid: each cell gets its part.
    let mut params = params;
    params.budget = params.budget.map(|b| b / grid.len().max(1) as u32);
    let args = bench_args(&params);
    let mut cells_summary = Vec::new();
    for (i, cell) in grid.iter().enumerate() {
        let o = child_env::command(&exe).args(&args).envs(cell).output()?;
        let stdout = String::from_utf8_lossy(&o.stdout);
        let v: Value = serde_json::from_str(stdout.trim()).map_err(|e| RunError::Failed {
            code: 1,
            message: format!(
                "cell {cell:?}: bench printed no JSON ({e}); stderr: {}",
                String::from_utf8_lossy(&o.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
            ),
        })?;
        if let Some(reason) = v.get("skipped").and_then(Value::as_str) {
            return Err(RunError::Skip(reason.to_string()));
        }
        // A cell whose settings hang NCCL ended itself (bench's stall watch, exit 5): the
        // sweep records where and goes on with the next cell.
        if let Some(hung) = v.get("hung") {
            cells_summary.push(json!({
                "labels": cell,
                "exit_code": o.status.code(),
                "hung": hung,
            }));
            out.progress(
                Some((i + 1) as f64 / grid.len() as f64),
                format!(
                    "{cell:?}: hung at {}",
                    hung["stage"].as_str().unwrap_or("?")
                ),
            )?;
            continue;
        }
        let rows: Vec<ResultRow> =
            serde_json::from_value(v["rows"].clone()).map_err(|e| RunError::Failed {
                code: 1,
                message: format!("cell {cell:?}: {e}"),
            })?;
        let mut peak: f64 = 0.0;
        for mut r in rows {
            peak = peak.max(r.busbw_gbs.unwrap_or(0.0));
            r.labels.extend(cell.clone());
            out.row(r)?;
        }
        let s = &v["summary"];
        cells_summary.push(json!({
            "labels": cell,
            "exit_code": o.status.code(),
            "peak_busbw_gbs": peak,
            "avg_busbw_gbs": s["avg_busbw_gbs"],
            "wrong": s["wrong"],
            "nccl_transports": s["nccl_transports"],
        }));
        out.progress(
            Some((i + 1) as f64 / grid.len() as f64),
            format!("{cell:?}: peak busbw {peak:.2} GB/s"),
        )?;
    }
    let mut summary = Map::new();
    summary.insert("kind".into(), "sweep".into());
    summary.insert("collective".into(), params.coll.name().into());
    summary.insert("cells".into(), Value::Array(cells_summary));
    out.emit(&ChildEvent::Summary { summary })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_params_are_nccls_plus_a_grid() {
        let input = |params: Value| ChildInput {
            params,
            ..serde_json::from_value(
                json!({"job_id": uuid::Uuid::nil(), "run_id": uuid::Uuid::nil(), "kind": "sweep",
                "rank": 0, "world_size": 2}),
            )
            .unwrap()
        };
        let mut buf = Vec::new();
        let mut out: Sink<'_> = super::super::protocol::Emitter::new(&mut buf);
        // A bad grid and a second node are refused before anything runs.
        for bad in [
            json!({"grid": {"LD_PRELOAD": ["x"]}}),
            json!({"grid": {"NCCL_ALGO": ["Ring"]}}),
        ] {
            assert!(matches!(
                run(&input(bad), &mut out),
                Err(RunError::Params(_))
            ));
        }
    }

    #[test]
    fn bench_args_carry_every_param() {
        let p = NcclParams::from_json(&json!({"op": "reduce", "root": 1, "dtype": "half", "step_bytes": 1024, "check": false})).unwrap();
        let a = bench_args(&p).join(" ");
        assert!(a.starts_with("bench nccl reduce -b 8 -e 134217728 -f 2 -g 1 -w 5 -n 20 -c 0 -d half -o sum -r 1 --json"), "{a}");
        assert!(a.ends_with("-i 1024"));
    }
}
