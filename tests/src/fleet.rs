//! A Heddle fleet in Docker containers for the fleet test: Postgres, server replicas and
//! agents on a private network, from the images `docker/build-images.sh` builds. Every name
//! carries a per-run prefix, and dropping the [`Fleet`] removes its containers, their
//! volumes and the network, also when the test panics.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

pub const TAG_ENV: &str = "HEDDLE_IMAGE_TAG";
pub const IMAGES: [&str; 3] = ["heddle-postgres", "heddle-server", "heddle-agent"];

fn tag() -> String {
    std::env::var(TAG_ENV).unwrap_or_else(|_| "dev".into())
}

pub fn image(name: &str) -> String {
    format!("{name}:{}", tag())
}

/// Runs `docker ARGS`, returning its output whatever the status.
pub fn docker_output(args: &[&str]) -> anyhow::Result<Output> {
    Command::new("docker")
        .args(args)
        .output()
        .context("running docker (is it installed?)")
}

/// Runs `docker ARGS` and returns its trimmed stdout; fails with stderr on a non-zero status.
pub fn docker(args: &[&str]) -> anyhow::Result<String> {
    let out = docker_output(args)?;
    if !out.status.success() {
        bail!(
            "docker {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Fails, naming the command that fixes it, when Docker or an image is missing.
pub fn preflight() -> anyhow::Result<()> {
    let info = docker_output(&["info", "--format", "{{.ServerVersion}}"]);
    match info {
        Ok(o) if o.status.success() => {}
        _ => {
            bail!("the Docker engine does not answer (`docker info`); the fleet test needs Docker")
        }
    }
    for name in IMAGES {
        if docker_output(&["image", "inspect", &image(name)])?
            .status
            .success()
        {
            continue;
        }
        bail!(
            "image {} is missing; build the images first: \
             cargo build --release -p heddle-server -p heddle-agent && docker/build-images.sh",
            image(name)
        );
    }
    Ok(())
}

pub struct Fleet {
    pub prefix: String,
    pub network: String,
    containers: Vec<String>,
    /// Networks made by [`Fleet::add_network`], removed with the fleet.
    networks: Vec<String>,
}

impl Fleet {
    pub fn new() -> anyhow::Result<Fleet> {
        let prefix = format!(
            "heddle-fleet-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        let network = format!("{prefix}-net");
        docker(&["network", "create", "--label", "heddle-fleet=1", &network])?;
        Ok(Fleet {
            prefix,
            network,
            containers: Vec::new(),
            networks: Vec::new(),
        })
    }

    /// The container's full name for a short name (`srv-a` → `heddle-fleet-1a2b3c4d-srv-a`).
    pub fn name(&self, short: &str) -> String {
        format!("{}-{short}", self.prefix)
    }

    /// Starts a detached container on the fleet network, reachable there as `short`.
    pub fn run(
        &mut self,
        short: &str,
        image_name: &str,
        env: &[(&str, String)],
        extra: &[&str],
    ) -> anyhow::Result<()> {
        self.run_also_on(short, image_name, env, extra, &[])
    }

    /// [`Fleet::run`], attached to the networks `also` too (as `short`) before it starts.
    pub fn run_also_on(
        &mut self,
        short: &str,
        image_name: &str,
        env: &[(&str, String)],
        extra: &[&str],
        also: &[&str],
    ) -> anyhow::Result<()> {
        let name = self.name(short);
        let create = if also.is_empty() {
            ["run", "-d"]
        } else {
            ["create", "-q"]
        };
        let mut args: Vec<String> = vec![
            create[0].into(),
            create[1].into(),
            "--name".into(),
            name.clone(),
            "--hostname".into(),
            short.into(),
            "--network".into(),
            self.network.clone(),
            "--network-alias".into(),
            short.into(),
            "--label".into(),
            "heddle-fleet=1".into(),
        ];
        for (k, v) in env {
            args.push("-e".into());
            args.push(format!("{k}={v}"));
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        args.push(image(image_name));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        self.containers.push(name.clone());
        docker(&refs)?;
        if !also.is_empty() {
            for network in also {
                self.connect(network, short)?;
            }
            docker(&["start", &name])?;
        }
        Ok(())
    }

    /// Makes another network (`<prefix>-<short>`), removed with the fleet; returns its name.
    pub fn add_network(&mut self, short: &str) -> anyhow::Result<String> {
        let name = self.name(short);
        docker(&["network", "create", "--label", "heddle-fleet=1", &name])?;
        self.networks.push(name.clone());
        Ok(name)
    }

    /// Starts a detached container like [`Fleet::run`], but on `network` only (one of
    /// [`Fleet::add_network`]'s), reachable there as `short`.
    pub fn run_on(
        &mut self,
        network: &str,
        short: &str,
        image_name: &str,
        env: &[(&str, String)],
    ) -> anyhow::Result<()> {
        let name = self.name(short);
        let mut args: Vec<String> = [
            "run",
            "-d",
            "--name",
            &name,
            "--hostname",
            short,
            "--network",
            network,
            "--network-alias",
            short,
            "--label",
            "heddle-fleet=1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        for (k, v) in env {
            args.push("-e".into());
            args.push(format!("{k}={v}"));
        }
        args.push(image(image_name));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        self.containers.push(name);
        docker(&refs)?;
        Ok(())
    }

    /// Attaches a running container to `network` as `short`.
    pub fn connect(&self, network: &str, short: &str) -> anyhow::Result<()> {
        docker(&[
            "network",
            "connect",
            "--alias",
            short,
            network,
            &self.name(short),
        ])?;
        Ok(())
    }

    pub fn disconnect(&self, network: &str, short: &str) -> anyhow::Result<()> {
        docker(&["network", "disconnect", network, &self.name(short)])?;
        Ok(())
    }

    /// The container's whole log (stdout and stderr).
    pub fn full_log(&self, short: &str) -> String {
        match docker_output(&["logs", &self.name(short)]) {
            Ok(o) => format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => e.to_string(),
        }
    }

    /// The container's address on the fleet network (the host reaches it directly).
    pub fn ip(&self, short: &str) -> anyhow::Result<String> {
        let format = format!(
            "{{{{(index .NetworkSettings.Networks \"{}\").IPAddress}}}}",
            self.network
        );
        let ip = docker(&["inspect", "-f", &format, &self.name(short)])?;
        anyhow::ensure!(
            !ip.is_empty() && ip != "<no value>",
            "{short} has no address on {}",
            self.network
        );
        Ok(ip)
    }

    pub fn exec(&self, short: &str, cmd: &[&str]) -> anyhow::Result<String> {
        let name = self.name(short);
        let mut args = vec!["exec", name.as_str()];
        args.extend_from_slice(cmd);
        docker(&args)
    }

    /// `psql -tA` in the Postgres container; rows as lines, columns separated by `|`.
    pub fn sql(&self, pg_short: &str, query: &str) -> anyhow::Result<String> {
        self.exec(
            pg_short,
            &[
                "psql",
                "-U",
                "postgres",
                "-d",
                "heddle",
                "-v",
                "ON_ERROR_STOP=1",
                "-tAc",
                query,
            ],
        )
    }

    pub fn logs(&self, short: &str) -> String {
        match docker_output(&["logs", "--tail", "60", &self.name(short)]) {
            Ok(o) => format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => e.to_string(),
        }
    }

    /// The last lines of every container's log, for a failure message.
    pub fn all_logs(&self) -> String {
        let mut s = String::new();
        for c in &self.containers {
            let short = c.strip_prefix(&format!("{}-", self.prefix)).unwrap_or(c);
            s.push_str(&format!("\n----- {short} -----\n{}", self.logs(short)));
        }
        s
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        if std::env::var_os("HEDDLE_FLEET_KEEP").is_some() {
            eprintln!("fleet: keeping {} (HEDDLE_FLEET_KEEP is set)", self.prefix);
            return;
        }
        for c in &self.containers {
            let _ = docker_output(&["rm", "-f", "-v", c]);
        }
        let _ = docker_output(&["network", "rm", &self.network]);
        for n in &self.networks {
            let _ = docker_output(&["network", "rm", n]);
        }
    }
}

/// Polls `f` until it returns `Some`, or fails after `timeout` with `what`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Option<T>>>,
{
    let start = Instant::now();
    let mut last_err = None;
    loop {
        match f().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last_err = Some(e),
        }
        if start.elapsed() > timeout {
            bail!(
                "timed out after {:?} waiting for {what}; last error: {last_err:?}",
                timeout
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
