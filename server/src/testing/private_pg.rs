//! A Postgres cluster of one test's own, for tests that stop and start the database (an
//! outage must never touch the shared cluster of `HEDDLE_TEST_DATABASE_URL`, on which other
//! tests run). Made with Debian's `initdb` in a fresh private temporary directory, on a free
//! port, listening on 127.0.0.1 only; removed when dropped.

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct PrivatePostgres {
    bindir: PathBuf,
    data: PathBuf,
    port: u16,
    _dir: tempfile::TempDir,
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// Postgres refuses to run as root; under root the cluster belongs to `postgres`.
fn as_owner(program: &Path) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("running a PostgreSQL program");
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl PrivatePostgres {
    /// Creates the cluster and starts it. Panics (naming what to install) when the
    /// PostgreSQL binaries are missing.
    pub fn start() -> PrivatePostgres {
        let bindir = std::fs::read_dir("/usr/lib/postgresql")
            .expect("PostgreSQL binaries under /usr/lib/postgresql (apt-get install postgresql)")
            .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
            .filter(|p| p.join("pg_ctl").exists())
            .max()
            .expect("a PostgreSQL version with pg_ctl");
        let dir = tempfile::Builder::new()
            .prefix("heddle-private-pg-")
            .tempdir()
            .expect("a temporary directory");
        if is_root() {
            run(Command::new("chown").arg("postgres:").arg(dir.path()));
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let data = dir.path().join("data");
        let pg = PrivatePostgres {
            bindir,
            data,
            port,
            _dir: dir,
        };
        run(pg.command("initdb").arg("-D").arg(&pg.data).args([
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
        ]));
        let conf = pg.data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf).expect("postgresql.conf");
        text.push_str(&format!(
            "listen_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = ''\nfsync = off\n"
        ));
        std::fs::write(&conf, text).expect("writing postgresql.conf");
        pg.resume();
        pg
    }

    fn command(&self, program: &str) -> Command {
        as_owner(&self.bindir.join(program))
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Starts the stopped cluster again on the same port and data; returns once it
    /// accepts connections.
    pub fn resume(&self) {
        run(self
            .command("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .arg("-l")
            .arg(self.data.join("server.log"))
            .args(["-w", "-t", "60", "start"]));
    }

    /// A fast shutdown, as an operator's restart does: open sessions get 57P01
    /// admin_shutdown, new connections are refused until [`resume`](Self::resume).
    pub fn stop(&self) {
        run(self
            .command("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "fast", "-w", "stop"]));
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let _ = self
            .command("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "stop"])
            .output();
    }
}
