//! The fleet page with 50,000 nodes, in headless Chromium: seeded straight into Postgres
//! with one statement, then opened the way a person does. It prints the time to first
//! render (the page's `heddle:fleet-rendered` mark) and checks what a page of a big fleet
//! must get right: the count says 50,000, problem nodes come first, "Load more" and
//! scrolling to the end append the next page (never the whole fleet in the DOM), and a
//! search finds a node far past what was loaded.
//!
//! Needs `frontend/dist` (scripts/build-frontend.sh), `chromium` and `chromium-driver`, and
//! `HEDDLE_TEST_DATABASE_URL`.

use std::time::{Duration, Instant};

use fantoccini::{Client, Locator};
use heddle_server::testing::TestServer;

#[path = "dashboard/browser.rs"]
mod browser;

use browser::*;

/// Rows of the fleet table, by hostname, in order.
async fn hosts(c: &Client) -> Vec<String> {
    let mut out = Vec::new();
    for tr in c
        .find_all(Locator::Css("#fleet-table tbody tr"))
        .await
        .unwrap()
    {
        out.push(tr.attr("data-host").await.unwrap().unwrap_or_default());
    }
    out
}

/// Polls until the table has `n` rows.
async fn wait_rows(c: &Client, n: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let rows = hosts(c).await;
        if rows.len() == n {
            return rows;
        }
        assert!(
            Instant::now() < deadline,
            "the fleet table has {} rows, not {n}",
            rows.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_of_50000_nodes_in_chromium() {
    let dist = dashboard_dist();
    let server = TestServer::start_with(|c| c.dashboard_dir = Some(dist.clone())).await;
    // node-00001 … node-50000: every 100th agent offline for an hour, every 250th node
    // with a port DOWN, every 997th without facts yet; the rest online and healthy.
    let seeded = Instant::now();
    sqlx::query(
        "INSERT INTO nodes (id, hostname, facts, facts_sha256, facts_updated_at, gpu_model,
                            gpu_count, hcas, port_states, link_layers, last_seen_at, created_at)
         SELECT gen_random_uuid(), format('node-%s', lpad(i::text, 5, '0')),
           CASE WHEN i % 997 = 0 THEN NULL ELSE '{}'::jsonb END,
           CASE WHEN i % 997 = 0 THEN NULL ELSE md5(i::text) END,
           CASE WHEN i % 997 = 0 THEN NULL ELSE now() END,
           CASE WHEN i % 997 = 0 THEN NULL ELSE 'NVIDIA H100 80GB HBM3' END,
           CASE WHEN i % 997 = 0 THEN 0 ELSE 8 END,
           CASE WHEN i % 997 = 0 THEN '{}' ELSE ARRAY['mlx5_0', 'mlx5_1'] END,
           CASE WHEN i % 997 = 0 THEN '{}' WHEN i % 250 = 7 THEN ARRAY['ACTIVE', 'DOWN']
                ELSE ARRAY['ACTIVE', 'ACTIVE'] END,
           CASE WHEN i % 997 = 0 THEN '{}' ELSE ARRAY['InfiniBand', 'InfiniBand'] END,
           CASE WHEN i % 100 = 37 THEN now() - interval '1 hour' ELSE now() END,
           now()
         FROM generate_series(1, 50000) i",
    )
    .execute(&server.state.db)
    .await
    .unwrap();
    sqlx::query("ANALYZE nodes")
        .execute(&server.state.db)
        .await
        .unwrap();
    println!(
        "dashboard_fleet: 50,000 nodes seeded in {} ms",
        seeded.elapsed().as_millis()
    );

    let (_driver, c) = browser().await;
    sign_in_as_admin(&c, &server.url, &server.admin_token).await;

    // First render from a fresh navigation with the stored session.
    let (mark_ms, seen_ms) = first_fleet_render(&c, &server.url).await;
    println!(
        "dashboard_fleet: 50,000 nodes, first fleet render {mark_ms:.0} ms after navigation start (browser mark), {seen_ms:.0} ms as seen by WebDriver"
    );
    assert!(mark_ms < 5000.0, "first render took {mark_ms} ms");

    // The count is of the whole fleet, and of the problems in it.
    let count = wait_text(&c, "#fleet-count", "50,000 of 50,000 nodes").await;
    assert!(count.contains("with problems"), "{count}");
    assert!(count.contains("showing the first 200"), "{count}");
    // Problems first: the first rows are the broken nodes, not node-00001.
    let first = wait_rows(&c, 200).await;
    assert_eq!(first[..3], ["node-00007", "node-00037", "node-00137"]);
    let class = c
        .find(Locator::Css("#fleet-table tbody tr"))
        .await
        .unwrap()
        .attr("class")
        .await
        .unwrap();
    assert_eq!(class.as_deref(), Some("problem"));
    wait_text(&c, "#fleet-table tbody tr", "ports DOWN").await;

    // "Load more" appends the next page after the first, which stays. Clicked from script,
    // so that scrolling to the button does not load a page by itself first.
    c.execute("document.getElementById('fleet-more').click()", vec![])
        .await
        .unwrap();
    let both = wait_rows(&c, 400).await;
    assert_eq!(both[..200], first[..]);
    assert!(
        both[200..].iter().all(|h| !first.contains(h)),
        "the next page repeats rows"
    );
    // Scrolling to the end loads the page after that.
    c.execute("window.scrollTo(0, document.body.scrollHeight)", vec![])
        .await
        .unwrap();
    let three = wait_rows(&c, 600).await;
    assert_eq!(three[..400], both[..]);

    // A node far past what is loaded is one search away.
    assert!(!three.contains(&"node-49999".to_string()));
    type_into(&c, "#fleet-search", "node-49999").await;
    wait_text(&c, "#fleet-count", "1 of 50,000 nodes").await;
    assert_eq!(wait_rows(&c, 1).await, ["node-49999"]);
    assert!(
        c.find(Locator::Css("#fleet-more")).await.is_err(),
        "one match has no next page"
    );
    c.close().await.unwrap();
}
