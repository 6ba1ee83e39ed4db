//! The pages for sweeps, p2p matrices and investigations, and the fake agent's rows for
//! the kinds behind them.

use super::*;

/// What the fake agent uploads for a job: labelled cells for a sweep, a 4-GPU
/// device-to-device matrix with one slow pair (GPU 1 ↔ 2) for p2p, nccl rows otherwise.
pub fn rows_for(spec: &Value, peak: f64) -> Value {
    match spec["kind"].as_str() {
        Some("p2p") => {
            let mut rows = Vec::new();
            for s in 0..4u32 {
                for d in 0..4u32 {
                    let (path, bw) = match (s, d) {
                        _ if s == d => ("local", 600.0),
                        (1, 2) | (2, 1) => ("p2p", 35.0),
                        _ => ("p2p", 140.0),
                    };
                    rows.push(json!({"size_bytes": 1u64 << 28, "algbw_gbs": bw,
                        "labels": {"kind": "d2d", "src": s.to_string(), "dst": d.to_string(), "path": path}}));
                }
            }
            Value::Array(rows)
        }
        Some("sweep") => {
            let grid = spec["params"]["grid"]
                .as_object()
                .cloned()
                .unwrap_or_default();
            let (name, values) = grid.into_iter().next().expect("a sweep has a grid");
            let mut rows = Vec::new();
            for (i, v) in values.as_array().unwrap().iter().enumerate() {
                let cell = v.as_str().map_or_else(|| v.to_string(), str::to_string);
                for mut r in nccl_rows(peak * (1.0 - 0.25 * i as f64))
                    .as_array()
                    .unwrap()
                    .clone()
                {
                    r["labels"] = json!({ name.clone(): cell.clone() });
                    rows.push(r);
                }
            }
            Value::Array(rows)
        }
        _ => nccl_rows(peak),
    }
}

async fn wait_run(server: &TestServer, id: uuid::Uuid, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while server.get_run(id).await.state != "succeeded" {
        assert!(Instant::now() < deadline, "the {what} run did not finish");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A sweep, a p2p run and an investigation over three nodes (two more fake agents), each
/// opened from the nav: the sweep's best cell, the GPU matrix with its slow pair named,
/// and the node×node matrix of the finished investigation.
pub async fn sweeps_p2p_investigations(
    c: &Client,
    server: &TestServer,
    api: &Api,
    shots: &Shots,
    others: Vec<String>,
) {
    for (cred, peak) in others.into_iter().zip([150.0, 60.0]) {
        tokio::spawn(agent_loop(server.url.clone(), cred, peak));
    }
    let inv = api
        .ok(
            reqwest::Method::POST,
            "/api/v1/investigations",
            Some(&server.admin_token),
            Some(json!({"kind": "nccl", "label": "slow-node-hunt",
                "nodes": ["dgx15", "nd40rs-v2-0", "my-first-distributed-app-worker-0"]})),
        )
        .await;
    let sweep = server
        .start_run(
            json!({"kind": "sweep", "nodes": ["dgx15"], "label": "algo-sweep",
            "params": {"grid": {"NCCL_ALGO": ["Ring", "Tree"]}}}),
        )
        .await;
    let p2p = server
        .start_run(json!({"kind": "p2p", "nodes": ["dgx15"], "label": "gpu-copies"}))
        .await;
    wait_run(server, sweep.id, "sweep").await;
    wait_run(server, p2p.id, "p2p").await;
    let path = format!("/api/v1/investigations/{}", inv["id"].as_str().unwrap());
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let now = api
            .ok(reqwest::Method::GET, &path, Some(&server.admin_token), None)
            .await;
        if now["state"] != "running" {
            assert_eq!(now["state"], "done", "{now}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the investigation did not finish: {now}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    click(c, "header a[href='/sweeps']").await;
    wait_text(c, "#sweeps-table", "algo-sweep").await;
    click(c, "#sweeps-table a").await;
    wait_text(c, "#sweep-cells", "Tree").await;
    // Ring measured higher in every band: its row is the best one.
    wait_text(c, "#sweep-cells tr.best", "Ring").await;
    wait_text(c, "#sweep-winners", "NCCL_ALGO=Ring").await;
    shots.take(c, "12-sweep").await;

    click(c, "header a[href='/p2p']").await;
    wait_text(c, "#p2p-table", "gpu-copies").await;
    click(c, "#p2p-table a").await;
    wait_text(c, "#gpu-matrix", "140.0").await;
    assert_eq!(
        c.find_all(Locator::Css("#gpu-matrix td.m-bad"))
            .await
            .unwrap()
            .len(),
        2,
        "the slow pair, both directions"
    );
    wait_text(c, "#culprits", "1 ↔ 2").await;
    shots.take(c, "13-p2p-matrix").await;

    click(c, "header a[href='/investigations']").await;
    wait_text(c, "#investigations-table", "slow-node-hunt").await;
    click(c, "#investigations-table a").await;
    wait_text(c, "#investigation-progress", "pairs").await;
    wait_text(c, "#investigation-state", "done").await;
    wait_text(c, "#node-matrix", "nd40rs-v2-0").await;
    wait_text(c, "#analysis", "").await;
    shots.take(c, "14-investigation").await;
}
