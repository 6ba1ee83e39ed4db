//! `rdma_ab`: the `nccl` measurement twice with the same collective and sizes, once with
//! the job's environment (the RDMA leg) and once forced onto TCP sockets (the socket leg,
//! `NCCL_IB_DISABLE=1` and `NCCL_NET=Socket`), and the ratio of the two per size band.
//! NCCL reads its environment once per process, so each leg is a fresh `child` process of
//! kind `nccl` with the leg's variables on top of the job's; its rows come back labelled
//! `leg=rdma` / `leg=socket`, its summary (with NCCL's transport evidence) under
//! `legs.<leg>`. On one node both legs also turn off peer access and shared memory so the
//! ranks' traffic crosses the network (`heddle_types::kinds::rdma_ab::Leg::env`).
//!
//! Params: those of `nccl`; the run needs at least two ranks (two nodes, or `gpus` ≥ 2).

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::Stdio;

use heddle_types::jobs::ResultRow;
use heddle_types::kinds::rdma_ab::{AbComparison, KIND, LEG_LABEL, Leg};
use serde_json::{Map, Value, json};

use super::child_env;
use super::nccl::{Params as NcclParams, loader};
use super::protocol::{ChildEvent, ChildInput};
use super::{RunError, Sink};

/// The input of one leg's process: the job's, as an `nccl` test whose rendezvous names
/// are the leg's own (each leg publishes a fresh NCCL id).
pub fn leg_input(input: &ChildInput, leg: Leg) -> ChildInput {
    let mut child = input.clone();
    child.kind = "nccl".into();
    if let Some(rv) = child.rendezvous.as_mut() {
        rv.scope = Some(format!("{KIND}.{leg}"));
    }
    child
}

/// What one leg's process reported.
#[derive(Debug, Default)]
pub struct LegRun {
    pub rows: Vec<ResultRow>,
    pub summary: Map<String, Value>,
}

/// Runs one leg as `exe child`, forwarding its rows (labelled) and progress (as the
/// `index`-th half of the job).
pub fn run_leg(
    exe: &Path,
    input: &ChildInput,
    leg: Leg,
    index: usize,
    out: &mut Sink<'_>,
) -> Result<LegRun, RunError> {
    let mut cmd = child_env::command(exe);
    cmd.arg("child")
        .envs(leg.env(input.world_size))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = cmd.spawn()?;
    {
        let raw = serde_json::to_vec(&leg_input(input, leg)).expect("child input serializes");
        let mut stdin = child.stdin.take().expect("stdin is piped");
        // A leg that ends before reading its input says why through its exit status.
        if let Err(e) = stdin.write_all(&raw)
            && e.kind() != std::io::ErrorKind::BrokenPipe
        {
            return Err(e.into());
        }
    }
    let stdout = child.stdout.take().expect("stdout is piped");
    let mut run = LegRun::default();
    let mut skipped = None;
    let legs = Leg::ALL.len() as f64;
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        let Ok(event) = serde_json::from_str::<ChildEvent>(&line) else {
            eprintln!("{leg} leg: {line}");
            continue;
        };
        match event {
            ChildEvent::Row { mut row } => {
                row.labels.insert(LEG_LABEL.into(), leg.as_str().into());
                out.row(row.clone())?;
                run.rows.push(row);
            }
            ChildEvent::Progress(p) => out.progress(
                p.fraction.map(|f| (index as f64 + f) / legs),
                format!("{leg} leg: {}", p.message),
            )?,
            ChildEvent::Summary { summary } => run.summary.extend(summary),
            ChildEvent::Skipped { reason } => skipped = Some(reason),
            plan @ ChildEvent::Plan { .. } => out.emit(&plan)?,
        }
    }
    let status = child.wait()?;
    if let Some(reason) = skipped {
        return Err(RunError::Skip(format!("{leg} leg: {reason}")));
    }
    if !status.success() {
        return Err(RunError::Failed {
            code: 1,
            message: format!("the {leg} leg failed ({status}); its output is above"),
        });
    }
    Ok(run)
}

/// The result's summary from both legs.
pub fn summary(params: &NcclParams, legs: &[(Leg, LegRun)], world_size: i32) -> Map<String, Value> {
    let rows: Vec<ResultRow> = legs.iter().flat_map(|(_, l)| l.rows.clone()).collect();
    let mut s = Map::new();
    s.insert("kind".into(), KIND.into());
    s.insert("collective".into(), params.coll.name().into());
    if let Some((_, first)) = legs.first() {
        for key in ["nranks", "nccl_version", "dtype", "redop"] {
            if let Some(v) = first.summary.get(key) {
                s.insert(key.into(), v.clone());
            }
        }
    }
    let mut by_leg = Map::new();
    let mut env = Map::new();
    for (leg, run) in legs {
        by_leg.insert(leg.as_str().into(), Value::Object(run.summary.clone()));
        let vars: Map<String, Value> = leg
            .env(world_size)
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.into()))
            .collect();
        env.insert(leg.as_str().into(), Value::Object(vars));
    }
    s.insert("legs".into(), Value::Object(by_leg));
    s.insert("leg_env".into(), Value::Object(env));
    s.insert("comparison".into(), json!(AbComparison::from_rows(&rows)));
    s
}

/// The job kind.
pub fn run(input: &ChildInput, out: &mut Sink<'_>) -> Result<(), RunError> {
    let params = NcclParams::from_json(&input.params)?;
    let world = input.world_size.max(1);
    if world as usize * params.gpus < 2 {
        return Err(RunError::Params(
            "rdma_ab compares network transports, so it needs two ranks or more: run it on \
             two nodes, or with gpus of 2 or more on one"
                .into(),
        ));
    }
    // Say at once what is missing, rather than once per leg.
    if let loader::Probe::Unavailable(why) = loader::probe() {
        return Err(RunError::Skip(format!("NCCL unavailable: {why}")));
    }
    let exe = std::env::current_exe()?;
    let mut legs = Vec::new();
    for (i, leg) in Leg::ALL.into_iter().enumerate() {
        legs.push((leg, run_leg(&exe, input, leg, i, out)?));
    }
    let summary = summary(&params, &legs, world);
    if let Some(c) = summary
        .get("comparison")
        .and_then(|c| serde_json::from_value::<AbComparison>(c.clone()).ok())
        && let Some((size, x)) = c.speedup()
    {
        out.progress(
            Some(1.0),
            format!("RDMA {x:.2}× the socket busbw at {} MiB", size >> 20),
        )?;
    }
    out.emit(&ChildEvent::Summary { summary })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::protocol::RendezvousAccess;

    fn input(world_size: i32, params: Value) -> ChildInput {
        ChildInput {
            kind: KIND.into(),
            params,
            job_id: uuid::Uuid::nil(),
            run_id: uuid::Uuid::nil(),
            rank: 0,
            world_size,
            rendezvous: Some(RendezvousAccess {
                servers: vec!["http://s:1".into()],
                credential: "hda_x".into(),
                ca_file: None,
                pins: Vec::new(),
                scope: None,
            }),
        }
    }

    #[test]
    fn each_leg_is_an_nccl_test_with_its_own_rendezvous_names() {
        let i = input(2, json!({"op": "all_reduce"}));
        let rdma = leg_input(&i, Leg::Rdma);
        let socket = leg_input(&i, Leg::Socket);
        assert_eq!((rdma.kind.as_str(), socket.kind.as_str()), ("nccl", "nccl"));
        assert_eq!(rdma.params, i.params);
        let scope = |c: &ChildInput| c.rendezvous.as_ref().unwrap().scope.clone();
        assert_eq!(scope(&rdma).as_deref(), Some("rdma_ab.rdma"));
        assert_eq!(scope(&socket).as_deref(), Some("rdma_ab.socket"));
    }

    #[test]
    fn one_rank_is_refused_before_anything_runs() {
        let mut buf = Vec::new();
        let mut sink: Sink<'_> = super::super::protocol::Emitter::new(&mut buf);
        let err = run(&input(1, json!({})), &mut sink).unwrap_err();
        assert!(
            matches!(&err, RunError::Params(m) if m.contains("two ranks")),
            "{err}"
        );
    }

    /// A stand-in for `heddle-agent child`: reads its input, then reports a row and a
    /// summary that show the leg's environment, as the `nccl` kind would report figures.
    fn fake_child(dir: &Path, script_body: &str) -> std::path::PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join("fake-agent");
        std::fs::write(
            &path,
            format!("#!/bin/sh\ncat > \"$(dirname \"$0\")/input-$NCCL_NET\"\n{script_body}\n"),
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    const REPORTS_ENV: &str = r#"echo '{"event":"progress","fraction":0.5,"message":"half"}'
echo "not an event"
echo "{\"event\":\"row\",\"row\":{\"size_bytes\":134217728,\"busbw_gbs\":2.0,\"labels\":{\"ib_disable\":\"${NCCL_IB_DISABLE:-unset}\",\"p2p\":\"${NCCL_P2P_DISABLE:-unset}\"}}}"
echo "{\"event\":\"summary\",\"summary\":{\"net\":\"${NCCL_NET:-unset}\"}}""#;

    #[test]
    fn a_leg_runs_with_its_variables_and_its_rows_are_labelled() {
        let tmp = tempfile::tempdir().unwrap();
        let exe = fake_child(tmp.path(), REPORTS_ENV);
        let i = input(2, json!({"op": "all_reduce"}));
        let mut buf = Vec::new();
        let mut sink: Sink<'_> = super::super::protocol::Emitter::new(&mut buf);
        let socket = run_leg(&exe, &i, Leg::Socket, 1, &mut sink).unwrap();
        let rdma = run_leg(&exe, &i, Leg::Rdma, 0, &mut sink).unwrap();
        assert_eq!(socket.rows[0].labels["ib_disable"], "1");
        assert_eq!(socket.rows[0].labels[LEG_LABEL], "socket");
        assert_eq!(socket.summary["net"], "Socket");
        assert_eq!(rdma.rows[0].labels["ib_disable"], "unset");
        assert_eq!(
            rdma.rows[0].labels["p2p"], "unset",
            "two nodes keep peer access"
        );
        assert_eq!(rdma.summary["net"], "unset");
        // What each leg's process was given: an nccl test with the leg's rendezvous scope.
        let given: ChildInput =
            serde_json::from_slice(&std::fs::read(tmp.path().join("input-Socket")).unwrap())
                .unwrap();
        assert_eq!(given.kind, "nccl");
        assert_eq!(
            given.rendezvous.unwrap().scope.as_deref(),
            Some("rdma_ab.socket")
        );
        // One node: both legs turn peer access off so the traffic crosses the network.
        let one = run_leg(&exe, &input(1, json!({"gpus": 2})), Leg::Rdma, 0, &mut sink).unwrap();
        assert_eq!(one.rows[0].labels["p2p"], "1");
        let events: Vec<ChildEvent> = String::from_utf8(buf)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert!(events.iter().any(|e| matches!(e,
            ChildEvent::Progress(p) if p.fraction == Some(0.75) && p.message == "socket leg: half")));
    }

    #[test]
    fn a_skipped_or_failed_leg_ends_the_job() {
        let tmp = tempfile::tempdir().unwrap();
        let i = input(2, json!({}));
        let mut buf = Vec::new();
        let mut sink: Sink<'_> = super::super::protocol::Emitter::new(&mut buf);
        let skip = fake_child(
            tmp.path(),
            r#"echo '{"event":"skipped","reason":"NCCL unavailable: no CUDA driver"}'"#,
        );
        match run_leg(&skip, &i, Leg::Rdma, 0, &mut sink) {
            Err(RunError::Skip(r)) => assert_eq!(r, "rdma leg: NCCL unavailable: no CUDA driver"),
            other => panic!("{other:?}"),
        }
        let fail = fake_child(tmp.path(), "echo boom >&2; exit 3");
        match run_leg(&fail, &i, Leg::Socket, 1, &mut sink) {
            Err(RunError::Failed { message, .. }) => {
                assert!(message.starts_with("the socket leg failed"), "{message}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_summary_holds_both_legs_and_the_ratios() {
        let p = NcclParams::default();
        let leg = |leg: Leg, bw: f64, net: &str| {
            let row = ResultRow {
                size_bytes: 128 << 20,
                busbw_gbs: Some(bw),
                labels: [(LEG_LABEL.to_string(), leg.as_str().to_string())].into(),
                ..Default::default()
            };
            let mut summary = Map::new();
            summary.insert("nranks".into(), 16.into());
            summary.insert("nccl_evidence".into(), json!({"network": net}));
            (
                leg,
                LegRun {
                    rows: vec![row],
                    summary,
                },
            )
        };
        let s = summary(
            &p,
            &[
                leg(Leg::Rdma, 122.3, "IB"),
                leg(Leg::Socket, 29.1, "Socket"),
            ],
            2,
        );
        assert_eq!(s["kind"], "rdma_ab");
        assert_eq!(s["nranks"], 16);
        assert_eq!(s["legs"]["socket"]["nccl_evidence"]["network"], "Socket");
        assert_eq!(s["leg_env"]["socket"]["NCCL_IB_DISABLE"], "1");
        assert_eq!(s["leg_env"]["rdma"], json!({}));
        let c: AbComparison = serde_json::from_value(s["comparison"].clone()).unwrap();
        let (size, x) = c.speedup().unwrap();
        assert_eq!(size, 128 << 20);
        assert!((x - 122.3 / 29.1).abs() < 1e-9);
    }
}
