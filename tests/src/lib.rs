//! Helpers shared by the end-to-end tests and the load generator: starting the real
//! server binary as a child process and reading its resource use from /proc; the
//! Docker fleet of the fleet test lives in [`fleet`], the Slurm cluster of the Slurm test
//! in [`slurm`].

pub mod compare;
pub mod fabric_oracle;
pub mod fleet;
pub mod fleet_ops;
pub mod probe;
pub mod slurm;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The `heddle-server` binary built next to the running executable (same profile), or in
/// `HEDDLE_E2E_BIN_DIR` when set (binaries built elsewhere, or kept apart from a target
/// directory that other checkouts build into).
pub fn sibling_binary(name: &str) -> PathBuf {
    if let Some(dir) = std::env::var_os("HEDDLE_E2E_BIN_DIR") {
        return PathBuf::from(dir).join(name);
    }
    let exe = std::env::current_exe().expect("current exe");
    let mut dir = exe.parent().expect("exe dir").to_path_buf();
    // Test executables live in target/<profile>/deps.
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir.join(name)
}

/// A `heddle-server` process; killed on drop.
pub struct ServerProcess {
    pub child: Child,
    pub url: String,
}

impl ServerProcess {
    /// Starts the server with its defaults but the database, address, admin token and
    /// heartbeat interval, plus `env` (more `HEDDLE_*` settings).
    pub async fn start(
        database_url: &str,
        port: u16,
        admin_token: &str,
        heartbeat_s: u32,
        env: &[(&str, String)],
    ) -> anyhow::Result<ServerProcess> {
        let bin = sibling_binary("heddle-server");
        anyhow::ensure!(
            bin.exists(),
            "{} is missing: build heddle-server with the same profile first",
            bin.display()
        );
        let child = Command::new(&bin)
            .env("HEDDLE_DATABASE_URL", database_url)
            .env("HEDDLE_LISTEN", format!("127.0.0.1:{port}"))
            .env("HEDDLE_ADMIN_TOKEN", admin_token)
            .env("HEDDLE_HEARTBEAT_INTERVAL_S", heartbeat_s.to_string())
            .env("HEDDLE_DB_MAX_CONNECTIONS", "40")
            .env("HEDDLE_LOG", "warn")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()?;
        let url = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        for _ in 0..200 {
            if let Ok(r) = http.get(format!("{url}/readyz")).send().await
                && r.status().is_success()
            {
                return Ok(ServerProcess { child, url });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        anyhow::bail!("heddle-server did not become ready at {url}")
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Resident set size in KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// User + system CPU time in clock ticks.
pub fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which may contain spaces, closed by ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// Free TCP port on loopback.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
