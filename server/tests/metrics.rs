//! `/metrics` as Prometheus and dcgm-exporter users read it: base units, dcgm-exporter's
//! label names, live jobs only, OpenMetrics on request, and a body `promtool check
//! metrics` accepts.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use common::*;
use heddle_server::testing::TestServer;
use reqwest::{Method, StatusCode};
use serde_json::json;

async fn scrape(api: &Api, accept: Option<&str>) -> (String, String) {
    let mut req = api.http.get(format!("{}/metrics", api.base));
    if let Some(a) = accept {
        req = req.header("accept", a);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let ct = resp.headers()["content-type"].to_str().unwrap().to_string();
    (ct, resp.text().await.unwrap())
}

/// Runs `promtool check metrics` on the body; panics with its findings.
fn promtool_accepts(body: &str) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot run promtool ({e}); install it: apt-get install prometheus (or scripts/setup.sh --test)")
        });
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let findings = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && findings.trim().is_empty(),
        "promtool check metrics: {findings}\n{body}"
    );
}

/// Starts a one-node run of `spec` on dgx15, claims its job as `agent` and uploads `body`.
async fn run_and_upload(
    api: &Api,
    server: &TestServer,
    agent: &FakeAgent,
    mut spec: serde_json::Value,
    body: serde_json::Value,
) {
    spec["nodes"] = json!(["dgx15"]);
    server.start_run(spec).await;
    let lease = agent.claim(api).await;
    let job = lease["job_id"].as_str().unwrap();
    let (s, up) = api
        .post(
            &format!("/api/v1/agent/jobs/{job}/result"),
            &agent.credential,
            body,
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{up}");
}

#[tokio::test]
async fn metrics_use_base_units_dcgm_labels_and_pass_promtool() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let agent = dgx15_with_facts_and_a_heartbeat(&api, &server).await;
    two_results_and_a_queued_run(&api, &server, &agent).await;
    an_enabled_plugin(&api, &server).await;
    two_observed_jobs(&api, &agent).await;
    the_text_format_has_every_series_in_base_units(&api).await;
    openmetrics_when_prometheus_asks_for_it(&api).await;
}

async fn dgx15_with_facts_and_a_heartbeat(api: &Api, server: &TestServer) -> FakeAgent {
    let agent = enroll(api, server, "dgx15").await;
    let mut facts = fixture_facts("dgx1");
    facts["gpus"][0]["uuid"] = json!("GPU-3f2e6b1c-0000-1111-2222-333344445555");
    facts["rdma"]["devices"][1]["ports"][0]["state"] = json!("DOWN");
    let (s, body) = api
        .call(
            Method::PUT,
            "/api/v1/agent/facts",
            Some(&agent.credential),
            Some(facts),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    let (s, body) = api
        .post(
            "/api/v1/agent/heartbeat",
            &agent.credential,
            json!({"running_jobs": []}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    agent
}

/// A finished NCCL run over sockets, an RDMA latency run, a queued memcpy.
async fn two_results_and_a_queued_run(api: &Api, server: &TestServer, agent: &FakeAgent) {
    let mut nccl = result_body("dgx15-nccl", "succeeded");
    nccl["summary"] = json!({"nccl_network": "Socket"});
    run_and_upload(
        api,
        server,
        agent,
        json!({"kind": "nccl", "params": {}}),
        nccl,
    )
    .await;
    let mut lat = result_body("dgx15-lat", "succeeded");
    lat["rows"] = json!([{"size_bytes": 2, "op": "ib_write_lat", "time_us": 1.5, "wrong": 0}]);
    let spec = json!({"kind": "rdma", "params": {"test": "ib_write_lat"}});
    run_and_upload(api, server, agent, spec, lat).await;
    server
        .start_run(json!({"kind": "memcpy", "params": {}, "nodes": ["dgx15"]}))
        .await;
}

/// An enabled plugin that fails nowhere yet.
async fn an_enabled_plugin(api: &Api, server: &TestServer) {
    let (s, body) = api
        .raw(
            Method::POST,
            "/api/v1/plugins/runai-roce/versions/0.1.0",
            Some(&server.admin_token),
            "application/wasm",
            dist("runai-roce"),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{body}");
    let (s, body) = api
        .post(
            "/api/v1/plugins/runai-roce/enable",
            &server.admin_token,
            json!({}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
}

/// A job observed by the profiler plugin whose two-node communicator went over sockets,
/// and a hung one.
async fn two_observed_jobs(api: &Api, agent: &FakeAgent) {
    // A job observed by the profiler plugin whose two-node communicator went over sockets.
    let observed = json!({"observations": [{"source": "profiler", "file": {
        "format": 1, "seq": 1, "final": false, "written_at": "2026-11-27T12:00:00Z",
        "plugin_version": "0.1.0",
        "job": {"pid": 7, "uid": 1000, "start_ticks": 1, "slurm_job_id": "42"},
        "comms": [{"comm_hash": "ab", "nranks": 16, "nnodes": 2, "rank": 0, "ops": [],
                   "net": [{"net": "Socket", "ops": 1, "bytes": 1048576}]}]}}]});
    let (s, body) = api
        .post("/api/v1/agent/observations", &agent.credential, observed)
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");

    // Rank 0 of a two-rank job has waited 30 s in its 41st all-reduce; rank 1 never
    // reported: hung.
    let now = chrono::Utc::now().timestamp_nanos_opt().unwrap() as u64;
    let waited = now - 30_000_000_000;
    let hung = json!({"observations": [{"source": "profiler", "file": {
        "format": 1, "seq": 1, "final": false, "written_at": chrono::Utc::now(),
        "plugin_version": "0.2.0",
        "job": {"pid": 8, "uid": 1000, "start_ticks": 1, "slurm_job_id": "43"},
        "comms": [{"comm_hash": "cd", "nranks": 2, "nnodes": 2, "rank": 0, "ops": [],
                   "progress": {"clock": "realtime", "now_ns": now, "coll_started": 41,
                       "coll_done": 40, "p2p_started": 0, "p2p_done": 0, "last_start_ns": waited,
                       "in_flight": {"seq": 41, "func": "AllReduce", "bytes": 1024, "started_ns": waited},
                       "completion": "proxy"}}]}}]});
    let (s, body) = api
        .post("/api/v1/agent/observations", &agent.credential, hung)
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
}

/// Every family the seeded state makes, workers' too, in base units with DCGM's labels;
/// promtool accepts it, and the alert rules and dashboard use only what is exported.
async fn the_text_format_has_every_series_in_base_units(api: &Api) {
    let (ct, text) = scrape(api, None).await;
    assert_eq!(ct, "text/plain; version=0.0.4; charset=utf-8");
    for want in [
        "# TYPE heddle_http_requests_total counter",
        r#"heddle_jobs{state="queued"} 1"#,
        r#"heddle_jobs{state="running"} 0"#,
        r#"heddle_health_verdict{Hostname="dgx15",test="nccl.all_reduce"} "#,
        r#"heddle_result_nccl_socket{Hostname="dgx15",test="nccl.all_reduce"} 1"#,
        r#"heddle_agent_last_heartbeat_timestamp_seconds{Hostname="dgx15"} "#,
        r#"heddle_plugin_errors{plugin="runai-roce"} 0"#,
        r#"heddle_observed_jobs{Hostname="dgx15",verdict="fail"} 1"#,
        r#"heddle_observed_job_socket_fallback{Hostname="dgx15"} 1"#,
        r#"heddle_observed_job_progress{job="slurm:43 (uid 1000)",state="hung",Hostname="dgx15"} 1"#,
        r#"heddle_node_gpu_info{Hostname="dgx15",gpu="0",UUID="GPU-3f2e6b1c-0000-1111-2222-333344445555",model_name="Tesla V100-SXM2-32GB"} 1"#,
        r#"heddle_node_rdma_port_active{Hostname="dgx15",device="mlx5_0",port="1",link_layer="InfiniBand"} 1"#,
        r#"heddle_node_rdma_port_active{Hostname="dgx15",device="mlx5_1",port="1",link_layer="InfiniBand"} 0"#,
    ] {
        assert!(text.contains(want), "missing {want}:\n{text}");
    }
    // Each background worker of the replica has its series from its start (docs/metrics.md).
    for worker in [
        "lease_reaper",
        "heartbeat_flusher",
        "plugin_reconciler",
        "investigations",
        "revocation_feed",
        "token_returns",
        "history",
    ] {
        for family in [
            "heddle_worker_runs_total",
            "heddle_worker_errors_total",
            "heddle_worker_last_run_duration_seconds",
        ] {
            let series = format!(r#"{family}{{worker="{worker}"}} "#);
            assert!(text.contains(&series), "missing {series}:\n{text}");
        }
    }
    // Finished jobs are history, not a gauge that grows forever.
    assert!(
        !text.contains(r#"heddle_jobs{state="succeeded"}"#),
        "{text}"
    );
    assert_eq!(
        text.matches("heddle_node_gpu_info{").count(),
        8,
        "one series per GPU: {text}"
    );
    let value = |series: &str| -> f64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
            .unwrap_or_else(|| panic!("no {series} in:\n{text}"));
        line[series.len()..].trim().parse().unwrap()
    };
    // 52.4 GB/s at the largest size and 1.5 µs, in base units.
    let busbw = value(
        r#"heddle_result_bandwidth_bytes_per_second{Hostname="dgx15",test="nccl.all_reduce",figure="busbw"}"#,
    );
    assert!((busbw - 52.4e9).abs() < 1.0, "{busbw}");
    let lat = value(r#"heddle_result_latency_seconds{Hostname="dgx15",test="rdma.ib_write_lat"}"#);
    assert!((lat - 1.5e-6).abs() < 1e-12, "{lat}");
    let beat = value(r#"heddle_agent_last_heartbeat_timestamp_seconds{Hostname="dgx15"}"#);
    let now = chrono::Utc::now().timestamp() as f64;
    assert!((now - beat).abs() < 60.0, "heartbeat at {beat}, now {now}");
    promtool_accepts(&text);
    rules_and_dashboard_use_exported_metrics(&text);
}

/// What Prometheus asks for first.
async fn openmetrics_when_prometheus_asks_for_it(api: &Api) {
    let (ct, om) = scrape(
        api,
        Some("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"),
    )
    .await;
    assert_eq!(
        ct,
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    assert!(om.ends_with("# EOF\n"), "{om}");
    assert!(om.contains("# TYPE heddle_http_requests counter"), "{om}");
    assert!(
        om.contains("# UNIT heddle_result_bandwidth_bytes_per_second bytes_per_second"),
        "{om}"
    );
}

/// Every `heddle_*` metric the alert rules and the Grafana dashboard query is one this
/// server declares (a renamed metric would otherwise leave a panel blank and an alert mute).
fn rules_and_dashboard_use_exported_metrics(text: &str) {
    let declared: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/kustomize/components/monitoring");
    for file in ["prometheusrule.yaml", "grafana-dashboard.json"] {
        let body = std::fs::read_to_string(dir.join(file)).unwrap();
        let mut used: Vec<&str> = body
            .match_indices("heddle_")
            .map(|(i, _)| {
                let rest = &body[i..];
                let end = rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(rest.len());
                &rest[..end]
            })
            .collect();
        used.sort_unstable();
        used.dedup();
        assert!(used.len() >= 5, "{file} names few metrics: {used:?}");
        for name in used {
            let family = ["_bucket", "_count", "_sum"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name);
            assert!(
                declared.contains(&name) || declared.contains(&family),
                "{file} queries {name}, which /metrics does not export; exported: {declared:?}"
            );
        }
    }
}
