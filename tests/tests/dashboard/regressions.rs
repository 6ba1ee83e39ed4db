//! The regressions page with a real regression: two nodes upload a daily NCCL result for
//! twenty simulated days (each day's writes moved a day into the past before the next), and
//! half-way one node's driver goes from 580.95 to 580.159 and its bandwidth drops 8 %. The
//! list shows it, its series view draws every day, the change point and the driver update
//! as a marker just before it, and the node's page links to it.

use heddle_testkit::results::noise;

use super::*;

const DAYS: usize = 20;
const CHANGE_DAY: usize = 10;

fn facts(host: &str, driver: &str) -> Value {
    json!({"host": {"hostname": host, "kernel": "6.8.0-45"},
           "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3"}],
           "software": {"nvidia_driver": driver, "nccl": "2.28.9"}})
}

/// Twenty days of results from `reg-1` (the driver update and the drop) and `reg-2`.
async fn seed(server: &TestServer, api: &Api) {
    let hosts = ["reg-1", "reg-2"];
    let mut creds = Vec::new();
    for h in hosts {
        creds.push(enroll(api, server, h, Some(facts(h, "580.95"))).await);
    }
    let gib8 = 8i64 << 30;
    for day in 0..DAYS {
        // Everything the server remembers of the simulated days, one day further back: each
        // result's arrival and its copies in its rows, verdict and series points (what the
        // detector reads), the facts history and the change points.
        for sql in [
            "UPDATE results SET received_at = received_at - interval '1 day'",
            "UPDATE result_rows SET received_at = received_at - interval '1 day'",
            "UPDATE verdicts SET received_at = received_at - interval '1 day'",
            "UPDATE latest_verdicts SET received_at = received_at - interval '1 day'",
            "UPDATE series_points SET t = t - interval '1 day'",
            "UPDATE node_facts_history SET collected_at = collected_at - interval '1 day'",
            "UPDATE change_points SET t = t - interval '1 day'",
        ] {
            sqlx::query(sql).execute(&server.state.db).await.unwrap();
        }
        if day == CHANGE_DAY {
            let update = facts("reg-1", "580.159");
            api.ok(
                reqwest::Method::PUT,
                "/api/v1/agent/facts",
                Some(&creds[0]),
                Some(update),
            )
            .await;
        }
        for (n, (host, cred)) in hosts.iter().zip(&creds).enumerate() {
            let mut busbw = 360.0 * noise(day, n);
            if n == 0 && day >= CHANGE_DAY {
                busbw *= 0.92;
            }
            server
                .start_run(json!({"kind": "nccl", "params": {"op": "all_reduce"}, "nodes": [host]}))
                .await;
            let lease = api
                .ok(
                    reqwest::Method::POST,
                    "/api/v1/agent/jobs/claim",
                    Some(cred),
                    None,
                )
                .await;
            let job = lease["job_id"].as_str().unwrap();
            let row = |in_place| {
                json!({"size_bytes": gib8, "op": "all_reduce", "busbw_gbs": busbw,
                "algbw_gbs": busbw, "time_us": 24795.0, "wrong": 0, "in_place": in_place})
            };
            let result = json!({"upload_key": format!("{host}-{day}"), "outcome": "succeeded",
                "summary": {"nranks": 1}, "rows": [row(false), row(true)],
                "started_at": "2026-01-01T00:00:00Z", "finished_at": "2026-01-01T00:00:01Z"});
            api.ok(
                reqwest::Method::POST,
                &format!("/api/v1/agent/jobs/{job}/result"),
                Some(cred),
                Some(result),
            )
            .await;
        }
    }
}

/// An attribute of the first element matching `css`, as a number.
async fn attr_f64(c: &Client, css: &str, name: &str) -> f64 {
    let el = c.find(Locator::Css(css)).await.unwrap();
    let v = el.attr(name).await.unwrap().unwrap_or_default();
    v.parse()
        .unwrap_or_else(|_| panic!("{css} {name}={v:?} is not a number"))
}

pub async fn regressions_page(c: &Client, server: &TestServer, api: &Api, shots: &Shots) {
    seed(server, api).await;
    let open = api
        .ok(
            reqwest::Method::GET,
            "/api/v1/regressions",
            Some(&server.admin_token),
            None,
        )
        .await;
    assert_eq!(open.as_array().unwrap().len(), 1, "{open:#}");
    assert_eq!(open[0]["hostname"], "reg-1", "{open:#}");

    // The list, newest first, with what changed and the fleet in words.
    click(c, "header a[href='/regressions']").await;
    let table = wait_text(c, "#regressions-table", "reg-1").await;
    assert!(
        table.contains("nccl.all_reduce busbw_gbs · 8 GiB · 1 node")
            && table.contains("driver 580.95 → 580.159")
            && table.contains("none of the 1 other comparable nodes moved"),
        "{table}"
    );
    wait_text(c, "#regressions-table", "open").await;
    shots.take(c, "15-regressions").await;
    // Filters: another node has none; every change of reg-1 is still the one.
    type_into(c, "#filter-node", "reg-2").await;
    click(c, "#filter-apply").await;
    wait_text(c, "#regressions-empty", "No open regressions match").await;
    type_into(c, "#filter-node", "reg-1").await;
    click(c, "#filter-apply").await;
    click(c, "#filter-all").await;
    wait_text(c, "#regressions-table", "reg-1").await;
    let url = c.current_url().await.unwrap();
    assert!(
        url.as_str().ends_with("/regressions?node=reg-1&all=true"),
        "{url}"
    );

    // The series: every day's dot, the open change at the first day after the update, and
    // the update as a marker just before it, naming the driver.
    click(c, "#regressions-table a.series-link").await;
    wait_text(c, "#series-title", "nccl.all_reduce busbw_gbs").await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while c
        .find_all(Locator::Css("#series-chart circle.point"))
        .await
        .unwrap()
        .len()
        != DAYS
    {
        assert!(
            Instant::now() < deadline,
            "the chart never drew {DAYS} dots"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let change = c
        .find_all(Locator::Css("#series-chart g.change-point.open"))
        .await
        .unwrap();
    assert_eq!(change.len(), 1);
    let t = change[0].attr("data-t").await.unwrap().unwrap();
    assert_eq!(
        chrono::DateTime::parse_from_rfc3339(&t).unwrap(),
        chrono::DateTime::parse_from_rfc3339(open[0]["t"].as_str().unwrap()).unwrap()
    );
    let marker = c
        .find(Locator::Css("#series-chart g.facts-marker"))
        .await
        .unwrap();
    assert_eq!(
        marker.attr("data-changes").await.unwrap().as_deref(),
        Some("driver 580.95 → 580.159")
    );
    let cp_x = attr_f64(c, "#series-chart g.change-point .cp-line", "x1").await;
    let marker_x = attr_f64(c, "#series-chart g.facts-marker .marker-line", "x1").await;
    let dot = |i: usize| format!("#series-chart circle.point:nth-of-type({})", i + 1);
    let (before_x, first_after_x) = (
        attr_f64(c, &dot(CHANGE_DAY - 1), "cx").await,
        attr_f64(c, &dot(CHANGE_DAY), "cx").await,
    );
    assert!(
        (cp_x - first_after_x).abs() < 0.01,
        "{cp_x} {first_after_x}"
    );
    assert!(
        before_x < marker_x && marker_x <= cp_x,
        "the update between the last day before and the first after: {before_x} {marker_x} {cp_x}"
    );
    // The levels either side: after below before (higher is better for busbw).
    let before_y = attr_f64(c, "#series-chart .level.before", "y1").await;
    let after_y = attr_f64(c, "#series-chart .level.after", "y1").await;
    assert!(after_y > before_y, "{before_y} {after_y}");
    wait_text(c, "#facts-markers", "driver 580.95 → 580.159").await;
    let fleet = wait_text(c, "#change-points .fleet-view", "none of the 1 other").await;
    assert!(
        fleet.contains("0 of them had driver 580.95 → 580.159 too"),
        "{fleet}"
    );
    wait_text(c, "#change-points .node-changes", "driver 580.95 → 580.159").await;
    shots.take(c, "16-regression-series").await;

    // The node's page lists the open regression and links to the same series.
    c.goto(&format!("{}/nodes/reg-1", server.url))
        .await
        .unwrap();
    wait_text(c, "#node-title", "reg-1").await;
    wait_text(c, "#regressions-table", "driver 580.95 → 580.159").await;
    click(c, "#regressions-table a.series-link").await;
    wait_text(c, "#series-title", "nccl.all_reduce busbw_gbs").await;
    wait_text(c, "#facts-markers", "driver 580.95 → 580.159").await;
}
