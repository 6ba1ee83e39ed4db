//! The server's Postgres connection over TLS (`sslmode=verify-full`, `sslrootcert=`),
//! against a Postgres started here with `ssl = on`, a certificate from a throwaway CA and
//! unencrypted connections refused. The shared test cluster has no TLS and is left alone.
//!
//! Needs the PostgreSQL server binaries (`/usr/lib/postgresql/*/bin`, Debian's `postgresql`
//! package); under root the cluster runs as the `postgres` user. Without them the test
//! prints why it did nothing.

use std::path::{Path, PathBuf};
use std::process::Command;

use heddle_server::Config;
use heddle_tls::test_ca::{ServerFiles, TestCa};

/// A Postgres of this test's own, stopped when dropped.
struct TlsPostgres {
    _dir: tempfile::TempDir,
    data: PathBuf,
    bindir: PathBuf,
    as_root: bool,
    port: u16,
}

fn newest_bindir() -> Option<PathBuf> {
    let mut dirs: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    dirs.sort();
    dirs.pop().map(|(_, bin)| bin)
}

impl TlsPostgres {
    /// Postgres serving `files`' certificate, or why it cannot be started here.
    fn start(files: &ServerFiles) -> Result<TlsPostgres, String> {
        let bindir = newest_bindir().ok_or(
            "no PostgreSQL binaries under /usr/lib/postgresql (apt-get install postgresql)",
        )?;
        let uid = Command::new("id")
            .arg("-u")
            .output()
            .map_err(|e| e.to_string())?;
        let as_root = String::from_utf8_lossy(&uid.stdout).trim() == "0";
        let dir = tempfile::Builder::new()
            .prefix("heddle-pg-tls-")
            .tempdir()
            .map_err(|e| e.to_string())?;
        let data = dir.path().join("data");
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
            l.local_addr().unwrap().port()
        };
        let pg = TlsPostgres {
            _dir: dir,
            data,
            bindir,
            as_root,
            port,
        };
        if as_root {
            pg.chown(pg._dir.path())?;
        }
        pg.run(
            "initdb",
            &[
                "-D",
                path(&pg.data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        )?;
        let cert = pg.data.join("server.crt");
        let key = pg.data.join("server.key");
        std::fs::copy(&files.cert, &cert).map_err(|e| e.to_string())?;
        std::fs::copy(&files.key, &key).map_err(|e| e.to_string())?;
        let conf = format!(
            "listen_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = ''\n\
             ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\nfsync = off\n"
        );
        append(&pg.data.join("postgresql.conf"), &conf)?;
        std::fs::write(
            pg.data.join("pg_hba.conf"),
            "hostssl all all 127.0.0.1/32 trust\nhostnossl all all 127.0.0.1/32 reject\n",
        )
        .map_err(|e| e.to_string())?;
        if as_root {
            pg.chown(&pg.data)?;
        }
        let log = pg.data.join("server.log");
        pg.run(
            "pg_ctl",
            &[
                "-D",
                path(&pg.data),
                "-l",
                path(&log),
                "-w",
                "-t",
                "60",
                "start",
            ],
        )
        .map_err(|e| format!("{e}\n{}", std::fs::read_to_string(&log).unwrap_or_default()))?;
        Ok(pg)
    }

    fn chown(&self, dir: &Path) -> Result<(), String> {
        let status = Command::new("chown")
            .args(["-R", "postgres:", path(dir)])
            .status()
            .map_err(|e| e.to_string())?;
        status
            .success()
            .then_some(())
            .ok_or("chown to postgres failed".into())
    }

    fn run(&self, program: &str, args: &[&str]) -> Result<(), String> {
        let bin = self.bindir.join(program);
        let mut cmd = if self.as_root {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&bin);
            c
        } else {
            Command::new(&bin)
        };
        let out = cmd
            .args(args)
            .output()
            .map_err(|e| format!("{program}: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{program} failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }
}

impl Drop for TlsPostgres {
    fn drop(&mut self) {
        let _ = self.run(
            "pg_ctl",
            &["-D", path(&self.data), "-m", "immediate", "stop"],
        );
    }
}

fn path(p: &Path) -> &str {
    p.to_str().expect("temporary paths are UTF-8")
}

fn append(file: &Path, text: &str) -> Result<(), String> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(file)
        .map_err(|e| e.to_string())?;
    f.write_all(text.as_bytes()).map_err(|e| e.to_string())
}

async fn connect(url: String) -> anyhow::Result<sqlx::PgPool> {
    heddle_server::connect(&Config::for_database(url)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_url_can_require_verified_tls() {
    let ca = TestCa::new();
    let files = ca.write_server_files("localhost");
    let pg = match TlsPostgres::start(&files) {
        Ok(pg) => pg,
        Err(why) => {
            eprintln!("SKIPPED: cannot start a TLS Postgres here: {why}");
            return;
        }
    };
    let at = |host: &str, query: String| {
        format!("postgres://postgres@{host}:{}/postgres?{query}", pg.port)
    };
    let ca_file = files.ca.display().to_string();

    // verify-full with the CA: connects, migrations run, and the session is encrypted.
    let pool = connect(at(
        "localhost",
        format!("sslmode=verify-full&sslrootcert={ca_file}"),
    ))
    .await
    .expect("connecting with sslmode=verify-full");
    let (ssl,): (bool,) =
        sqlx::query_as("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(ssl, "the connection is not encrypted");
    pool.close().await;

    // This Postgres refuses unencrypted sessions, so the above could not have been one.
    let err = format!(
        "{:#}",
        connect(at("localhost", "sslmode=disable".into()))
            .await
            .unwrap_err()
    );
    assert!(err.contains("no encryption"), "{err}");

    // A CA that did not sign the server's certificate: the client refuses.
    let stranger = TestCa::new().write_server_files("localhost");
    let url = at(
        "localhost",
        format!("sslmode=verify-full&sslrootcert={}", stranger.ca.display()),
    );
    let err = format!("{:#}", connect(url).await.unwrap_err());
    assert!(err.contains("UnknownIssuer"), "{err}");

    // A host the certificate does not name: refused.
    let err = format!(
        "{:#}",
        connect(at(
            "127.0.0.1",
            format!("sslmode=verify-full&sslrootcert={ca_file}")
        ))
        .await
        .unwrap_err()
    );
    assert!(err.contains("not valid for name"), "{err}");
}
