//! The partitioning migration on a database that already holds fourteen months of rows.

use super::*;

#[tokio::test]
async fn the_migration_partitions_a_database_that_has_rows() {
    let admin = std::env::var("HEDDLE_TEST_DATABASE_URL").expect("HEDDLE_TEST_DATABASE_URL");
    let name = format!("heddle_test_{}", Uuid::new_v4().simple());
    let mut conn = sqlx::PgConnection::connect(&admin).await.unwrap();
    conn.execute(format!("CREATE DATABASE {name}").as_str())
        .await
        .unwrap();
    let mut url = reqwest::Url::parse(&admin).unwrap();
    url.set_path(&format!("/{name}"));
    let db = sqlx::PgPool::connect(url.as_str()).await.unwrap();

    // The schema as it was before: every migration older than the partitioning one.
    let all = sqlx::migrate!("../migrations");
    let history = all
        .iter()
        .find(|m| m.description.contains("history partitions"))
        .expect("the partitioning migration")
        .version;
    let older = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../migrations")).unwrap() {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap().to_str().unwrap().to_string();
        let version: i64 = file.split('_').next().unwrap().parse().unwrap();
        if version < history {
            std::fs::copy(&path, older.path().join(file)).unwrap();
        }
    }
    sqlx::migrate::Migrator::new(older.path())
        .await
        .unwrap()
        .run(&db)
        .await
        .unwrap();

    // Fourteen months of one result a month on two nodes; the newest of each node failed.
    // Odd months' figures predate the `band` field.
    db.execute(
        "INSERT INTO nodes (id, hostname) VALUES ('00000000-0000-0000-0000-00000000000a', 'm1'), ('00000000-0000-0000-0000-00000000000b', 'm2');
         INSERT INTO runs (id, spec, created_by) VALUES ('00000000-0000-0000-0000-0000000000f1', '{}', 'test');
         INSERT INTO jobs (id, run_id, node_id, rank, world_size, state, max_attempts)
         SELECT md5('job' || n || m)::uuid, '00000000-0000-0000-0000-0000000000f1', n, (m * 2 + (n = '00000000-0000-0000-0000-00000000000b')::int),
                1, 'succeeded', 1
         FROM unnest(ARRAY['00000000-0000-0000-0000-00000000000a', '00000000-0000-0000-0000-00000000000b']::uuid[]) n, generate_series(0, 13) m;
         INSERT INTO results (id, job_id, upload_key, outcome, started_at, finished_at, received_at)
         SELECT md5('result' || n || m)::uuid, md5('job' || n || m)::uuid, 'key' || n || m,
                CASE WHEN m = 0 THEN 'failed' ELSE 'succeeded' END, now(), now(), now() - make_interval(days => 30 * m)
         FROM unnest(ARRAY['00000000-0000-0000-0000-00000000000a', '00000000-0000-0000-0000-00000000000b']::uuid[]) n, generate_series(0, 13) m;
         INSERT INTO result_rows (result_id, seq, size_bytes, busbw_gbs)
         SELECT r.id, s, (1::bigint << 30) << s, 100 + s FROM results r, generate_series(0, 3) s;
         INSERT INTO verdicts (result_id, run_id, node_id, test, verdict, figures, judged_at)
         SELECT md5('result' || n || m)::uuid, '00000000-0000-0000-0000-0000000000f1', n, 'nccl.all_reduce',
                CASE WHEN m = 0 THEN 'fail' ELSE 'pass' END,
                jsonb_build_array(jsonb_build_object('test', 'nccl.all_reduce', 'metric', 'busbw_gbs', 'size_bytes', 8589934592::bigint,
                                                     'value', 300 + m) || CASE WHEN m % 2 = 0 THEN '{\"band\": 33}'::jsonb ELSE '{}' END),
                now() - make_interval(days => 30 * m)
         FROM unnest(ARRAY['00000000-0000-0000-0000-00000000000a', '00000000-0000-0000-0000-00000000000b']::uuid[]) n, generate_series(0, 13) m;",
    )
    .await
    .unwrap();

    all.run(&db).await.unwrap();

    assert_eq!(count(&db, "SELECT count(*) FROM results").await, 28);
    assert_eq!(count(&db, "SELECT count(*) FROM result_rows").await, 112);
    assert_eq!(count(&db, "SELECT count(*) FROM verdicts").await, 28);
    // Each row in its result's month, which has a partition of its own.
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM result_rows rr JOIN results r ON r.id = rr.result_id AND r.received_at = rr.received_at
             WHERE rr.tableoid = (SELECT oid FROM pg_class WHERE relname = 'result_rows_p' || to_char(r.received_at AT TIME ZONE 'UTC', 'YYYYMM'))"
        )
        .await,
        112
    );
    let today = Utc::now().date_naive();
    for table in TABLES {
        let months = partitions::months(&db, table).await.unwrap();
        let oldest = first_of_month(today - chrono::Duration::days(30 * 13), 0);
        assert_eq!(months.first(), Some(&oldest), "{table}: {months:?}");
        assert_eq!(
            months.last(),
            Some(&first_of_month(today, 3)),
            "{table}: {months:?}"
        );
    }
    // A point per figure of a succeeded result, in band 33 whether its figure said so or not.
    assert_eq!(count(&db, "SELECT count(*) FROM series_points").await, 26);
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM series_points WHERE band = 33 AND pair = '' AND world_size = 1"
        )
        .await,
        26
    );
    // One rollup per point's day, equal to it.
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM series_daily d JOIN series_points p ON p.node_id = d.node_id AND p.test = d.test
               AND d.day = (p.t AT TIME ZONE 'UTC')::date
             WHERE d.n = 1 AND d.sum = p.value AND d.min = p.value AND d.max = p.value AND d.median = p.value"
        )
        .await,
        26
    );
    // The latest verdict of each node is its newest (the failed one).
    let latest: Vec<(String, String)> = sqlx::query_as(
        "SELECT n.hostname, l.verdict FROM latest_verdicts l JOIN nodes n ON n.id = l.node_id ORDER BY 1",
    )
    .fetch_all(&db)
    .await
    .unwrap();
    assert_eq!(
        latest,
        [("m1".into(), "fail".into()), ("m2".into(), "fail".into())]
    );

    // A decommissioned node's results go with everything that hangs on them.
    db.execute("DELETE FROM nodes WHERE hostname = 'm1'")
        .await
        .unwrap();
    for (table, left) in [
        ("results", 14),
        ("result_rows", 56),
        ("verdicts", 14),
        ("series_points", 13),
        ("series_daily", 13),
        ("latest_verdicts", 1),
    ] {
        assert_eq!(
            count(&db, &format!("SELECT count(*) FROM {table}")).await,
            left,
            "{table}"
        );
    }
    db.close().await;
    conn.execute(format!("DROP DATABASE {name} WITH (FORCE)").as_str())
        .await
        .unwrap();
}
