//! Node checks through the API: evaluated on the stored facts with the previous report from
//! the facts history (counter deltas) and the site's peers (IPoIB subnets), listed in the
//! node detail and fed into node health as reasons with stable codes. Also prints
//! `heddle env --explain` for two seed shapes on a fresh server.

mod common;

use axum::http::{Method, StatusCode};
use heddle_server::plugins_bundled;
use heddle_server::testing::TestServer;
use serde_json::{Value, json};

use common::{Api, enroll, fixture_facts};

fn check<'a>(detail: &'a Value, name: &str, subject: &str) -> &'a Value {
    detail["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name && c["subject"] == subject)
        .unwrap_or_else(|| panic!("no {name} for {subject}: {}", detail["checks"]))
}

#[tokio::test]
async fn checks_use_the_previous_report_and_feed_node_health() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let admin = server.admin_token.clone();
    let node = enroll(&api, &server, "ib-node-12").await;
    let mut facts = fixture_facts("bare-metal-ib12");
    node.put_facts(&api, facts.clone()).await;

    let (s, detail) = api.get("/api/v1/nodes/ib-node-12", &admin).await;
    assert_eq!(s, StatusCode::OK, "{detail}");
    let link = check(&detail, "gpu-pcie-link", "GPU3 0000:40:00.0");
    assert_eq!(link["state"], "warn");
    let port = check(&detail, "ib-port-errors", "mlx5_3:1");
    assert!(
        port["reason"]
            .as_str()
            .unwrap()
            .contains("since the counters were last cleared"),
        "{port}"
    );
    assert_eq!(check(&detail, "bond-members", "bond0")["state"], "warn");
    assert_eq!(
        check(&detail, "nccl-conf", "/etc/nccl.conf")["state"],
        "warn"
    );

    // The next report: four more symbol errors on mlx5_3 only.
    let counters = facts["conditions"]["ib_counters"].as_array_mut().unwrap();
    let c = counters
        .iter_mut()
        .find(|c| c["device"] == "mlx5_3")
        .unwrap();
    c["symbol_error"] = json!(41);
    node.put_facts(&api, facts.clone()).await;
    let (_, detail) = api.get("/api/v1/nodes/ib-node-12", &admin).await;
    let port = check(&detail, "ib-port-errors", "mlx5_3:1");
    assert_eq!(port["state"], "warn");
    assert!(
        port["reason"]
            .as_str()
            .unwrap()
            .starts_with("symbol_error +4 since the last report"),
        "{port}"
    );
    assert_eq!(
        check(&detail, "ib-port-errors", "mlx5_0:1")["state"],
        "pass"
    );

    // No test has run, yet the node warns, with the checks as coded reasons.
    let (s, health) = api.get("/api/v1/nodes/ib-node-12/health", &admin).await;
    assert_eq!(s, StatusCode::OK, "{health}");
    assert_eq!(health["verdict"], "warn", "{health}");
    let codes: Vec<&str> = health["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            assert_eq!(r["basis"], "node-check");
            r["code"].as_str().unwrap()
        })
        .collect();
    for code in [
        "gpu-pcie-link",
        "ib-port-errors",
        "bond-members",
        "nccl-conf",
        "gpu-ecc",
    ] {
        assert!(codes.contains(&code), "{code} missing from {codes:?}");
    }
}

fn with_ib0(mut facts: Value, address: &str) -> Value {
    let ifaces = facts["network"]["interfaces"].as_array_mut().unwrap();
    let ib0 = ifaces.iter_mut().find(|i| i["name"] == "ib0").unwrap();
    ib0["addresses"] = json!([address]);
    facts
}

#[tokio::test]
async fn ipoib_subnets_are_compared_across_a_site() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let admin = server.admin_token.clone();
    let (s, v) = api
        .post("/api/v1/sites", &admin, json!({"name": "hall-a"}))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    for (host, addr) in [
        ("ib-a", "10.10.0.1/16"),
        ("ib-b", "10.10.3.2/16"),
        ("ib-c", "10.20.0.3/24"),
    ] {
        let node = enroll(&api, &server, host).await;
        let mut facts = with_ib0(fixture_facts("bare-metal-ib12"), addr);
        facts["host"]["hostname"] = json!(host);
        node.put_facts(&api, facts.clone()).await;
        let (s, v) = api
            .call(
                Method::PATCH,
                &format!("/api/v1/nodes/{host}"),
                Some(&admin),
                Some(json!({"site": "hall-a"})),
            )
            .await;
        assert_eq!(s, StatusCode::NO_CONTENT, "{v}");
    }
    let (_, odd) = api.get("/api/v1/nodes/ib-c", &admin).await;
    let c = check(&odd, "ipoib-subnet", "ib0");
    assert_eq!(c["state"], "warn");
    assert!(
        c["reason"]
            .as_str()
            .unwrap()
            .contains("ib0 is on 10.20.0.0/24 but 2 of the site's 3 nodes use 10.10.0.0/16"),
        "{c}"
    );
    let (_, fine) = api.get("/api/v1/nodes/ib-a", &admin).await;
    assert_eq!(check(&fine, "ipoib-subnet", "ib0")["state"], "warn");
    // Detached from the site, nothing is compared.
    api.call(
        Method::PATCH,
        "/api/v1/nodes/ib-c",
        Some(&admin),
        Some(json!({"site": null})),
    )
    .await;
    let (_, alone) = api.get("/api/v1/nodes/ib-c", &admin).await;
    assert!(
        !alone["checks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["name"] == "ipoib-subnet")
    );
    let (_, pair) = api.get("/api/v1/nodes/ib-a", &admin).await;
    assert_eq!(check(&pair, "ipoib-subnet", "ib0")["state"], "pass");
}

/// `heddle env NODE --explain` as the CLI prints it, from the API's answer.
fn explain(vars: &Value) -> String {
    let mut out = String::new();
    for v in vars.as_array().unwrap() {
        out.push_str(&format!(
            "{}={}\n",
            v["name"].as_str().unwrap(),
            v["value"].as_str().unwrap()
        ));
        out.push_str(&format!(
            "    from      {}\n",
            v["source"].as_str().unwrap()
        ));
        out.push_str(&format!(
            "    because   {}\n",
            v["reason"].as_str().unwrap()
        ));
        for o in v["overridden"].as_array().into_iter().flatten() {
            out.push_str(&format!(
                "    overrode  {} from {}\n",
                o["value"].as_str().unwrap(),
                o["source"].as_str().unwrap()
            ));
        }
    }
    out
}

#[tokio::test]
async fn a_fresh_server_explains_the_seed_shapes() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let admin = server.admin_token.clone();
    plugins_bundled::register(&server.state.db, &server.state.plugins)
        .await
        .unwrap();
    for (host, fixture, must) in [
        ("ndv4-node-3", "azure-ndv4", "UCX_NET_DEVICES"),
        ("llm-train-worker-3", "runai-roce-pod-2hca", "NCCL_IB_HCA"),
    ] {
        let node = enroll(&api, &server, host).await;
        node.put_facts(&api, fixture_facts(fixture)).await;
        let mut vars = Value::Null;
        for _ in 0..100 {
            let (_, v) = api
                .get(&format!("/api/v1/nodes/{host}/env/explain"), &admin)
                .await;
            if v.as_array()
                .is_some_and(|a| a.iter().any(|x| x["name"] == must))
            {
                vars = v;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        assert!(!vars.is_null(), "no {must} for {host}");
        println!(
            "$ heddle env {host} --explain   # {fixture}\n{}",
            explain(&vars)
        );
    }
}
