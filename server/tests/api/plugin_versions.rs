//! Plugin uploads: versions stored once and checked, enabled, rolled back, disabled,
//! downloaded and audited.

use super::*;

#[tokio::test]
async fn plugins_upload_versions_enable_rollback_and_audit() {
    let server = TestServer::start_with(|c| c.max_plugin_bytes = 1 << 20).await;
    let api = Api::new(&server);
    let admin = server.admin_token.clone();
    versions_are_stored_once_and_checked(&server, &api, &admin).await;
    enabled_rolled_back_disabled_and_downloaded(&api, &admin).await;
    every_change_is_audited(&api, &admin).await;
    a_previous_contracts_component_is_accepted(&api, &admin).await;
}

/// The `n`th of five different components.
fn component(n: u8) -> Vec<u8> {
    dist(
        [
            "azure-nd",
            "runai-roce",
            "dgx-affinity",
            "template",
            "misbehave",
        ][n as usize - 1],
    )
}

/// Versions of azure-nd: a second upload of the same bytes is the same version, other
/// bytes under a version taken conflict, and what is not a plugin, too large or a
/// viewer's is refused.
async fn versions_are_stored_once_and_checked(server: &TestServer, api: &Api, admin: &str) {
    let path = "/api/v1/plugins/azure-nd/versions";
    let (s, v1) = api
        .raw(
            Method::POST,
            &format!("{path}/0.1.0"),
            Some(admin),
            "application/wasm",
            component(1),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v1}");
    assert_eq!(v1["size_bytes"], component(1).len());
    assert_eq!(v1["contract"], "heddle:plugin@0.2.0");
    assert_eq!(v1["sha256"].as_str().unwrap().len(), 64);
    let (s, again) = api
        .raw(
            Method::POST,
            &format!("{path}/0.1.0"),
            Some(admin),
            "application/wasm",
            component(1),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(again["id"], v1["id"]);
    let (s, b) = api
        .raw(
            Method::POST,
            &format!("{path}/0.1.0"),
            Some(admin),
            "application/wasm",
            component(2),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{b}");
    assert_eq!(
        api.raw(
            Method::POST,
            &format!("{path}/0.2.0"),
            Some(admin),
            "application/wasm",
            component(2)
        )
        .await
        .0,
        StatusCode::CREATED
    );
    let (s, b) = api
        .raw(
            Method::POST,
            &format!("{path}/0.3.0"),
            Some(admin),
            "application/wasm",
            b"\0asm\x01\0\0\0".to_vec(),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
    let (s, _) = api
        .raw(
            Method::POST,
            &format!("{path}/0.3.0"),
            Some(admin),
            "application/wasm",
            vec![0; 2 << 20],
        )
        .await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);
    let (s, _) = api
        .raw(
            Method::POST,
            "/api/v1/plugins/Bad%20Name/versions/1",
            Some(admin),
            "application/wasm",
            component(3),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    let viewer = server.token(Role::Viewer).await;
    assert_eq!(
        api.raw(
            Method::POST,
            &format!("{path}/0.4.0"),
            Some(&viewer),
            "application/wasm",
            component(4)
        )
        .await
        .0,
        StatusCode::FORBIDDEN
    );
}

async fn enabled_rolled_back_disabled_and_downloaded(api: &Api, admin: &str) {
    let path = "/api/v1/plugins/azure-nd/versions";
    let (_, versions) = api.get(path, admin).await;
    let versions: Vec<&str> = versions
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["version"].as_str().unwrap())
        .collect();
    assert_eq!(versions, ["0.2.0", "0.1.0"]);
    let (s, p) = api
        .post("/api/v1/plugins/azure-nd/enable", admin, json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{p}");
    assert_eq!(
        (p["enabled"].as_bool(), p["active_version"].as_str()),
        (Some(true), Some("0.2.0"))
    );
    let (_, p) = api
        .post(
            "/api/v1/plugins/azure-nd/enable",
            admin,
            json!({"version": "0.1.0"}),
        )
        .await;
    assert_eq!(p["active_version"], "0.1.0", "rollback");
    assert_eq!(
        api.post(
            "/api/v1/plugins/azure-nd/enable",
            admin,
            json!({"version": "9"})
        )
        .await
        .0,
        StatusCode::NOT_FOUND
    );
    let (_, p) = api
        .call(
            Method::POST,
            "/api/v1/plugins/azure-nd/disable",
            Some(admin),
            None,
        )
        .await;
    assert_eq!(p["enabled"], false);
    let resp = api
        .http
        .get(format!("{}{path}/0.2.0/wasm", api.base))
        .bearer_auth(admin)
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.bytes().await.unwrap().as_ref(),
        component(2).as_slice()
    );
}

async fn every_change_is_audited(api: &Api, admin: &str) {
    let (_, audit) = api.get("/api/v1/audit?action=plugin.", admin).await;
    let actions: Vec<&str> = audit
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        [
            "plugin.disable",
            "plugin.enable",
            "plugin.enable",
            "plugin.upload",
            "plugin.upload"
        ]
    );
    assert!(audit[0]["actor"].as_str().unwrap().starts_with("token:"));
}

/// A component built against the previous contract is accepted and says so.
async fn a_previous_contracts_component_is_accepted(api: &Api, admin: &str) {
    let (s, old) = api
        .raw(
            Method::POST,
            "/api/v1/plugins/contract-v01/versions/0.1.0",
            Some(admin),
            "application/wasm",
            dist("contract-v01"),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{old}");
    assert_eq!(old["contract"], "heddle:plugin@0.1.0");
}
