//! Test support: throwaway databases cloned from a migrated template, and servers bound to
//! `127.0.0.1:0`. Used by this crate's tests and, with the `test-support` feature, by the
//! agent's and the end-to-end tests.
//!
//! Needs `HEDDLE_TEST_DATABASE_URL`, a Postgres URL whose user may create databases
//! (`scripts/pg-ensure.sh` prints one).

pub mod private_pg;
pub mod spool;

use std::net::SocketAddr;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use sqlx::Connection;
use uuid::Uuid;

use crate::config::Config;
use crate::state::AppState;

fn admin_url() -> String {
    std::env::var("HEDDLE_TEST_DATABASE_URL").expect(
        "HEDDLE_TEST_DATABASE_URL must name a Postgres server for tests; run scripts/test.sh or export the URL printed by scripts/pg-ensure.sh",
    )
}

fn with_database(url: &str, db: &str) -> String {
    let mut parsed = url::Url::parse(url).expect("HEDDLE_TEST_DATABASE_URL is a URL");
    parsed.set_path(&format!("/{db}"));
    parsed.to_string()
}

/// Template name derived from the migrations, so a changed schema gets a new template.
fn template_name() -> String {
    let mut h = Sha256::new();
    for m in sqlx::migrate!("../migrations").iter() {
        h.update(m.version.to_le_bytes());
        h.update(&*m.checksum);
    }
    format!("heddle_tmpl_{}", &hex::encode(h.finalize())[..16])
}

/// A database of its own for one test, dropped when the value is dropped.
pub struct TestDb {
    pub url: String,
    name: String,
}

impl TestDb {
    pub async fn create() -> TestDb {
        let admin = admin_url();
        let template = template_name();
        let mut conn = sqlx::PgConnection::connect(&admin)
            .await
            .expect("connecting to HEDDLE_TEST_DATABASE_URL");
        // Run time: these statements manage databases from the maintenance database, most of
        // them DDL naming a database made at run time (every test that calls `TestDb::create`).
        // Test binaries run in parallel: one of them builds the template, the others wait.
        sqlx::query("SELECT pg_advisory_lock(727274)")
            .execute(&mut conn)
            .await
            .unwrap();
        let exists: Option<(String,)> =
            sqlx::query_as("SELECT datname::text FROM pg_database WHERE datname = $1")
                .bind(&template)
                .fetch_optional(&mut conn)
                .await
                .unwrap();
        if exists.is_none() {
            let building = format!("{template}_building");
            sqlx::query(&format!("DROP DATABASE IF EXISTS {building}"))
                .execute(&mut conn)
                .await
                .unwrap();
            sqlx::query(&format!("CREATE DATABASE {building}"))
                .execute(&mut conn)
                .await
                .unwrap();
            {
                let pool = sqlx::PgPool::connect(&with_database(&admin, &building))
                    .await
                    .unwrap();
                sqlx::migrate!("../migrations")
                    .run(&pool)
                    .await
                    .expect("migrating the template database");
                pool.close().await;
            }
            sqlx::query(&format!("ALTER DATABASE {building} RENAME TO {template}"))
                .execute(&mut conn)
                .await
                .unwrap();
        }
        // A template built on an earlier day may lack this month's partitions (and the past
        // months rows can be moved back into), as a long-running server's database would
        // without its maintenance loop.
        {
            let mut template_conn = sqlx::PgConnection::connect(&with_database(&admin, &template))
                .await
                .unwrap();
            crate::history::partitions::ensure_in(
                &mut template_conn,
                crate::history::Keep::DEFAULT,
            )
            .await
            .expect("creating the template's monthly partitions");
            template_conn.close().await.ok();
        }
        sqlx::query("SELECT pg_advisory_unlock(727274)")
            .execute(&mut conn)
            .await
            .unwrap();
        let name = format!("heddle_test_{}", Uuid::new_v4().simple());
        sqlx::query(&format!("CREATE DATABASE {name} TEMPLATE {template}"))
            .execute(&mut conn)
            .await
            .unwrap();
        conn.close().await.ok();
        TestDb {
            url: with_database(&admin, &name),
            name,
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Drop runs outside any runtime guarantee; use a short-lived thread and runtime.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                if let Ok(mut conn) = sqlx::PgConnection::connect(&admin_url()).await {
                    let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .execute(&mut conn)
                        .await;
                }
            });
        })
        .join();
    }
}

/// A running server on a random port.
pub struct TestServer {
    /// `http://127.0.0.1:PORT`, or `https://localhost:PORT` for `start_https`.
    pub url: String,
    pub addr: SocketAddr,
    pub admin_token: String,
    pub state: AppState,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    /// Keeps the database alive as long as the first server using it.
    pub db: Option<Arc<TestDb>>,
    /// Talks to this server (trusting its test CA when it serves HTTPS).
    client: reqwest::Client,
}

pub const TEST_ADMIN_TOKEN: &str = "hdl_test-admin-token-0123456789abcdefghijklmnopqrstu";

impl TestServer {
    /// A server on a fresh database.
    pub async fn start() -> TestServer {
        Self::start_with(|_| {}).await
    }

    /// A server on a fresh database with a tweaked configuration (e.g. a short heartbeat).
    pub async fn start_with(tweak: impl FnOnce(&mut Config)) -> TestServer {
        let db = Arc::new(TestDb::create().await);
        let mut server = Self::start_on(&db.url, tweak).await;
        server.db = Some(db);
        server
    }

    /// A server on a fresh database serving HTTPS with `files` (from
    /// `heddle_tls::test_ca`), at `https://localhost:PORT`. `client()` trusts their CA.
    pub async fn start_https(
        files: &heddle_tls::test_ca::ServerFiles,
        tweak: impl FnOnce(&mut Config),
    ) -> TestServer {
        let mut server = Self::start_with(|config| {
            config.tls_cert = Some(files.cert.clone());
            config.tls_key = Some(files.key.clone());
            tweak(config);
        })
        .await;
        server.url = format!("https://localhost:{}", server.addr.port());
        let tls = heddle_tls::ClientTls {
            ca_file: Some(files.ca.clone()),
            pins: vec![],
        };
        server.client = reqwest::Client::builder()
            .use_preconfigured_tls(tls.rustls_config().expect("trusting the test CA"))
            .build()
            .expect("building the test client");
        server
    }

    /// Another replica on an existing database.
    pub async fn start_on(database_url: &str, tweak: impl FnOnce(&mut Config)) -> TestServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        Self::start_on_listener(database_url, listener, tweak).await
    }

    /// A replica on a given listener (to restart a server on the same address).
    pub async fn start_on_listener(
        database_url: &str,
        listener: tokio::net::TcpListener,
        tweak: impl FnOnce(&mut Config),
    ) -> TestServer {
        let mut config = Config::for_database(database_url);
        config.db_max_connections = 10;
        config.admin_token = Some(TEST_ADMIN_TOKEN.to_string());
        tweak(&mut config);
        let addr = listener.local_addr().unwrap();
        let state = AppState::new(config)
            .await
            .expect("starting the test server");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(crate::app::serve(listener, state.clone(), async move {
            let _ = rx.await;
        }));
        TestServer {
            url: format!("http://{addr}"),
            addr,
            admin_token: TEST_ADMIN_TOKEN.to_string(),
            state,
            shutdown: Some(tx),
            task: Some(task),
            db: None,
            client: reqwest::Client::new(),
        }
    }

    /// An HTTP client for this server (with its CA for HTTPS).
    pub fn client(&self) -> reqwest::Client {
        self.client.clone()
    }

    pub fn database_url(&self) -> String {
        self.state.config.database_url.clone()
    }

    /// Graceful stop: in-flight requests finish, then the server is gone.
    pub async fn stop(mut self) {
        self.stop_in_place().await;
    }

    async fn stop_in_place(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(10), task).await;
        }
        self.state.db.close().await;
    }

    /// Creates an enrollment token through the API.
    pub async fn enrollment_token(&self) -> String {
        let resp = self
            .client
            .post(format!("{}/api/v1/enrollment-tokens", self.url))
            .bearer_auth(&self.admin_token)
            .json(&serde_json::json!({}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 201, "creating an enrollment token");
        resp.json::<heddle_types::auth::EnrollmentTokenCreated>()
            .await
            .unwrap()
            .token
    }

    /// Creates an API token with the given role through the API.
    pub async fn token(&self, role: heddle_types::auth::Role) -> String {
        let resp = self.client
            .post(format!("{}/api/v1/tokens", self.url))
            .bearer_auth(&self.admin_token)
            .json(&serde_json::json!({"name": format!("{role}-{}", Uuid::new_v4().simple()), "role": role}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 201, "creating a token");
        resp.json::<heddle_types::auth::TokenCreated>()
            .await
            .unwrap()
            .token
    }

    /// Starts a run through the API and returns it.
    pub async fn start_run(&self, body: serde_json::Value) -> heddle_types::jobs::Run {
        let resp = self
            .client
            .post(format!("{}/api/v1/runs", self.url))
            .bearer_auth(&self.admin_token)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = resp.status();
        let text = resp.text().await.unwrap();
        assert_eq!(status, 201, "starting a run: {text}");
        serde_json::from_str(&text).unwrap()
    }

    pub async fn get_run(&self, id: Uuid) -> heddle_types::jobs::Run {
        self.client
            .get(format!("{}/api/v1/runs/{id}", self.url))
            .bearer_auth(&self.admin_token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}
