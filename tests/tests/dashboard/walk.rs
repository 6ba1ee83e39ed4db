//! The steps of the end-to-end walk through the dashboard, in the order a person takes
//! them: sign in, the fleet, a node, launching a run, a plugin, the agents page, and a
//! viewer's limits.

use super::*;

/// Sign in: a wrong token is refused with the server's words, the admin token works.
pub(super) async fn sign_in(w: &Walk<'_>) {
    let Walk {
        server,
        admin,
        c,
        shots,
        ..
    } = w;
    c.goto(&server.url).await.unwrap();
    submit_token(c, "hdl_not-a-real-token").await;
    wait_text(c, ".signin .error", "refused").await;
    shots.take(c, "01-sign-in-refused").await;
    submit_token(c, admin).await;
    wait_text(c, "#who", "(admin)").await;
}

/// Fleet, and time to first render from a fresh navigation with the stored token.
pub(super) async fn fleet_page(w: &Walk<'_>) {
    let Walk {
        server, c, shots, ..
    } = w;
    let (mark_ms, seen_ms) = first_fleet_render(c, &server.url).await;
    println!(
        "dashboard: first fleet render {mark_ms:.0} ms after navigation start (browser mark), {seen_ms:.0} ms as seen by WebDriver"
    );
    assert!(mark_ms < 5000.0, "first render took {mark_ms} ms");
    let count = wait_text(c, "#fleet-count", "4 of 4 nodes").await;
    assert!(count.contains("4 of 4"));
    // Problems first: the node without facts leads.
    let first = c
        .find(Locator::Css("#fleet-table tbody tr"))
        .await
        .unwrap()
        .attr("data-host")
        .await
        .unwrap();
    assert_eq!(first.as_deref(), Some("gpu-new-7"));
    wait_text(c, "#fleet-table", "8 × Tesla V100").await;
    shots.take(c, "02-fleet").await;
    type_into(c, "#fleet-search", "mlx5_bond").await;
    wait_text(c, "#fleet-count", "1 of 4 nodes").await;
    wait_text(c, "#fleet-table tbody", "my-first-distributed-app-worker-0").await;
    shots.take(c, "03-fleet-search").await;
    type_into(c, "#fleet-search", "dgx15").await;
    wait_text(c, "#fleet-count", "1 of 4 nodes").await;
}

/// Node page: facts, heatmap, recommendations, export block, the jobs' environment with
/// what the rank-agreement rule left out of it (a node profile's NCCL_ALGO on a node
/// without a site), history.
pub(super) async fn node_page(w: &Walk<'_>) {
    let Walk {
        api,
        admin,
        c,
        shots,
        ..
    } = w;
    let algo = api
        .ok(
            reqwest::Method::POST,
            "/api/v1/tuning-profiles",
            Some(admin),
            Some(json!({"name": "dgx15-algo", "node": "dgx15", "env": {"NCCL_ALGO": "Ring"}})),
        )
        .await;
    click(c, "#fleet-table tbody a").await;
    wait_text(c, "#node-title", "dgx15").await;
    let heat = wait_text(c, "#topology", "NV2").await;
    assert!(
        heat.contains("mlx5_0") && heat.contains("SYS") && heat.contains("0-19,40-59"),
        "{heat}"
    );
    let nv = c
        .find(Locator::Css("#topology td.t-nv2"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(nv, "NV2");
    wait_text(c, "#recommendations", "plugin:").await;
    wait_text(c, "#env-block", "export ").await;
    wait_text(c, "#job-env", "reach every NCCL job").await;
    wait_text(c, "#job-env-left-out", "NCCL_ALGO=Ring is left out").await;
    api.ok(
        reqwest::Method::DELETE,
        &format!("/api/v1/tuning-profiles/{}", algo["id"].as_str().unwrap()),
        Some(admin),
        None,
    )
    .await;
    wait_text(c, "#hcas", "mlx5_0").await;
    wait_text(c, "#history", "8").await;
    shots.take(c, "04-node").await;
    c.execute(
        "document.getElementById('topology').scrollIntoView()",
        vec![],
    )
    .await
    .unwrap();
    shots.take(c, "05-node-heatmap").await;
}

/// Launch a run from the form: the kind from the catalogue, its parameters as fields
/// with defaults and units; a refused parameter is shown beside it.
pub(super) async fn launch_a_run_and_watch_it(w: &Walk<'_>) {
    let Walk {
        server, c, shots, ..
    } = w;
    c.goto(&format!("{}/runs", server.url)).await.unwrap();
    wait_text(c, "#runs-table", "baseline").await;
    click(c, "#run-kind option[value=memcpy]").await;
    wait_text(c, "#launch", "Host memory copy bandwidth").await;
    assert!(
        c.find(Locator::Css("#param-op")).await.is_err(),
        "memcpy has no op"
    );
    click(c, "#run-kind option[value=nccl]").await;
    wait_text(c, "#run-kind-about", "NCCL collective").await;
    let iters = c.find(Locator::Css("#param-iters")).await.unwrap();
    assert_eq!(iters.prop("value").await.unwrap().as_deref(), Some("20"));
    click(c, "input[name=node][value=dgx15]").await;
    type_into(c, "#param-iters", "0").await;
    click(c, "#run-start").await;
    wait_text(c, "#param-iters-error", "params.iters").await;
    shots.take(c, "06a-runs-launch-refused").await;
    type_into(c, "#param-iters", "5").await;
    type_into(c, "#run-env", "NCCL_IB_HCA=mlx5_0\nNCCL_DEBUG=INFO").await;
    type_into(c, "#run-label", "from-the-dashboard").await;
    shots.take(c, "06-runs-launch").await;
    click(c, "#run-start").await;
    wait_text(c, "#jobs", "dgx15").await;
    wait_text(c, "#jobs", "size").await;
    // Only the changed parameter is stored; the rest are the kind's defaults.
    let params = wait_text(c, "#run-params", "5 iterations").await;
    assert!(!params.contains("min_bytes"), "{params}");
    wait_text(c, "#run-env-line", "NCCL_IB_HCA=mlx5_0").await;
    shots.take(c, "07-run-live").await;
    wait_text(c, "#run-state", "succeeded").await;
    wait_text(c, "#nccl-table", "1 GiB").await;
    // The result's summary, a line a field.
    wait_text(c, "#result-summary", "transport").await;
    wait_text(c, "#result-summary", "2.21.5").await;
    c.wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::Css("#busbw-chart polyline"))
        .await
        .unwrap();
    click(c, "input.overlay").await;
    wait_text(c, "figure.chart", "baseline").await;
    let lines = c
        .find_all(Locator::Css("#busbw-chart polyline"))
        .await
        .unwrap()
        .len();
    assert_eq!(lines, 2, "this run and the overlaid baseline");
    c.execute(
        "document.getElementById('busbw-chart').scrollIntoView()",
        vec![],
    )
    .await
    .unwrap();
    shots.take(c, "08-run-results").await;
}

/// Upload runai-roce through the file input, then dry-run it.
pub(super) async fn upload_and_dry_run_a_plugin(w: &Walk<'_>, runai: &Path) {
    let Walk {
        server, c, shots, ..
    } = w;
    c.goto(&format!("{}/plugins", server.url)).await.unwrap();
    wait_text(c, "main", "dgx-affinity").await;
    let input = c
        .wait()
        .for_element(Locator::Css("#plugin-file"))
        .await
        .unwrap();
    input.send_keys(runai.to_str().unwrap()).await.unwrap();
    wait_text(c, "#dropzone", "runai-roce.wasm").await;
    type_into(c, "#plugin-version", "0.1.0").await;
    click(c, "#plugin-upload").await;
    wait_text(c, "#upload .ok", "Uploaded runai-roce 0.1.0").await;
    click(c, "article.plugin[data-plugin=runai-roce] .dry-run-btn").await;
    let summary = wait_text(c, "#dry-run-summary", "runai-roce 0.1.0 on 3 nodes").await;
    assert!(!summary.contains(" 0 would change"), "{summary}");
    wait_text(c, "#dry-run", "+ env NCCL_").await;
    wait_text(c, "#dry-run", "fuel").await;
    c.execute(
        "document.getElementById('dry-run').scrollIntoView()",
        vec![],
    )
    .await
    .unwrap();
    shots.take(c, "09-plugins-dry-run").await;
}

/// Agents: an enrollment token with the lines that start an agent.
pub(super) async fn agents_page(w: &Walk<'_>) {
    let Walk {
        server, c, shots, ..
    } = w;
    c.goto(&format!("{}/agents", server.url)).await.unwrap();
    wait_text(c, "#agents-table", "dgx15").await;
    click(c, "#enroll-create").await;
    let docker = wait_text(c, "#docker-line", "docker run").await;
    assert!(
        docker.contains(&format!("--server {}", server.url))
            && docker.contains("--enroll-token hde"),
        "{docker}"
    );
    wait_text(c, "#agent-line", "heddle-agent run --server").await;
    click(c, "tr[data-host=gpu-new-7] .revoke-agent").await;
    wait_text(c, "main .ok[role=status]", "Revoked the agent on gpu-new-7").await;
    wait_text(c, "tr[data-host=gpu-new-7]", "revoked").await;
    shots.take(c, "10-agents").await;
}

/// A viewer sees no actions, and the server's refusal when it goes where it may not.
pub(super) async fn a_viewer_sees_no_actions(w: &Walk<'_>) {
    let Walk {
        server, c, shots, ..
    } = w;
    let viewer = server.token(heddle_types::auth::Role::Viewer).await;
    click(c, "header button.link").await;
    submit_token(c, &viewer).await;
    wait_text(c, "#who", "(viewer)").await;
    c.goto(&format!("{}/runs", server.url)).await.unwrap();
    wait_text(c, "main", "Your role cannot start runs").await;
    assert!(
        c.find(Locator::Css("#run-start")).await.is_err(),
        "a viewer gets no launch form"
    );
    assert!(
        c.find(Locator::Css("a[href='/agents']")).await.is_err(),
        "a viewer gets no agents link"
    );
    c.goto(&format!("{}/agents", server.url)).await.unwrap();
    wait_text(c, "main .error", "Refused").await;
    wait_text(c, "#agents-table", "dgx15").await;
    assert!(
        c.find(Locator::Css("#enroll-create")).await.is_err(),
        "a viewer cannot create enrollment tokens"
    );
    assert!(
        c.find(Locator::Css(".revoke-agent")).await.is_err(),
        "a viewer cannot revoke agents"
    );
    shots.take(c, "11-viewer-refused").await;
}
