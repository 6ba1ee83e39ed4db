//! The node env file (`/var/lib/heddle-agent/nccl.env`): the node's job environment, which
//! Heddle's NCCL environment plugin hands to every NCCL job on the node (docs/jobs.md). The
//! agent keeps it equal to what the server computes: a heartbeat names the job environment's
//! version (`job_env_sha256`), and when it differs from the version in the file the agent
//! fetches `GET /api/v1/agent/env` and rewrites the file whole (so values no longer
//! recommended go), atomically, mode 0644, owned by the agent's user (root on a node, which
//! the plugin requires). `--nccl-profiler-plugin` adds `NCCL_PROFILER_PLUGIN`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use heddle_types::agent::NodeJobEnv;
use heddle_types::nccl_conf;

use super::{Agent, Backoff};
use crate::client::ClientError;
use crate::gpu_map::GpuMap;

/// Where the file goes and what the agent adds to it from its own configuration.
#[derive(Debug, Clone)]
pub struct NodeEnvConfig {
    pub path: PathBuf,
    /// Absolute path of `libnccl-profiler-heddle.so`, checked at start
    /// (`nccl_conf::check_profiler_path`).
    pub profiler: Option<String>,
    /// Where compiled plugins are kept for the GPU map (`gpu_map`).
    pub plugin_cache: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum NodeEnvError {
    #[error("the node env file path {0} has no file name or directory")]
    BadPath(PathBuf),
    #[error("the job environment cannot be written as an NCCL conf file: {0}")]
    Render(#[from] nccl_conf::ConfError),
    #[error(
        "the server's job environment names version {claimed} but its entries hash to {actual}"
    )]
    Mismatch { claimed: String, actual: String },
    #[error("writing {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("writing {0}")]
    Write(#[from] crate::files::FileError),
    #[error(transparent)]
    GpuMap(#[from] crate::gpu_map::GpuMapError),
}

/// The job environment version of the file at `cfg.path`, or `None` when it is missing,
/// unreadable, not what this agent writes, or carries another profiler than configured (any
/// of which makes the agent write it again).
pub fn file_version(cfg: &NodeEnvConfig) -> Option<String> {
    let bytes = std::fs::read(&cfg.path).ok()?;
    let entries = nccl_conf::parse(&bytes).ok()?;
    let profiler = entries
        .iter()
        .find(|e| e.name == "NCCL_PROFILER_PLUGIN")
        .map(|e| e.value.as_str());
    if profiler != cfg.profiler.as_deref() {
        return None;
    }
    nccl_conf::job_env_sha256(&nccl_conf::job_env_part(&entries)).ok()
}

/// Writes `env` as the node env file: rendered by `nccl_conf::render_node_env` (what `heddle
/// env NODE --format nccl-conf` prints), to a temporary file in the same directory, fsynced,
/// mode 0644, renamed over the old one. The file's directory is made searchable by every
/// user (the agent's state directory is 0700 otherwise), since jobs of every user read it.
pub fn write_node_env(cfg: &NodeEnvConfig, env: &NodeJobEnv) -> Result<(), NodeEnvError> {
    let actual = nccl_conf::job_env_sha256(&env.entries)?;
    if actual != env.job_env_sha256 {
        return Err(NodeEnvError::Mismatch {
            claimed: env.job_env_sha256.clone(),
            actual,
        });
    }
    let text = nccl_conf::render_node_env(&env.node, &env.entries, cfg.profiler.as_deref())?;
    let (Some(dir), Some(name)) = (
        crate::gpu_map::dir_of(&cfg.path),
        cfg.path.file_name().and_then(|n| n.to_str()),
    ) else {
        return Err(NodeEnvError::BadPath(cfg.path.clone()));
    };
    make_searchable(dir)?;
    crate::files::write_atomic(dir, name, text.as_bytes(), 0o644)?;
    Ok(())
}

/// Computes the node's GPU map from `facts` (read at `root`) and writes it beside the node
/// env file, in the same directory made searchable the same way. Blocking: the plugins run
/// (compiled once into `cfg.plugin_cache`, then loaded from there).
pub fn write_gpu_map(
    cfg: &NodeEnvConfig,
    facts: &heddle_types::facts::NodeFacts,
    root: &Path,
) -> Result<GpuMap, NodeEnvError> {
    let dir =
        crate::gpu_map::dir_of(&cfg.path).ok_or_else(|| NodeEnvError::BadPath(cfg.path.clone()))?;
    let detected = crate::gpu_map::detect_facts(facts, Some(&cfg.plugin_cache))?;
    let map = GpuMap::from_detected(&detected, facts, root);
    make_searchable(dir)?;
    map.write(dir)?;
    Ok(map)
}

/// Creates `dir` (0755) if missing, and adds search permission for group and others to it
/// if it lacks it; nothing else about it changes (in the agent's state directory the
/// credential is 0600 and the spool directory 0700 on their own).
fn make_searchable(dir: &Path) -> Result<(), NodeEnvError> {
    let io = |source| NodeEnvError::Io {
        path: dir.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let mode = std::fs::metadata(dir).map_err(io)?.permissions().mode();
    if mode & 0o011 != 0o011 {
        std::fs::set_permissions(
            dir,
            std::fs::Permissions::from_mode((mode | 0o011) & 0o7777),
        )
        .map_err(io)?;
        tracing::info!(dir = %dir.display(), "made the node env file's directory searchable by job users");
    }
    Ok(())
}

/// Rewrites the file whenever a heartbeat names a job environment version other than the
/// file's. Failures are retried with backoff; jobs keep the file as it was meanwhile.
pub(super) async fn node_env_loop(
    agent: Arc<Agent>,
) -> Result<std::convert::Infallible, super::LifecycleError> {
    let cfg = agent.cfg.node_env.clone();
    let mut wanted = agent.job_env_wanted.subscribe();
    let mut applied = file_version(&cfg);
    let mut backoff = Backoff::new(Duration::from_secs(1), agent.cfg.backoff_cap);
    loop {
        let target = wanted.borrow_and_update().clone();
        let Some(target) = target.filter(|t| Some(t) != applied.as_ref()) else {
            if wanted.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
            continue;
        };
        let outcome = match agent.client.job_env().await {
            Ok(env) => write_node_env(&cfg, &env)
                .map(|()| {
                    // The managed blocks of /etc/nccl.conf and ucx.conf follow the same
                    // entries; each file succeeds or fails on its own and says so.
                    crate::host_conf::sync_host_confs(&agent.cfg.host_conf, &env.entries).log();
                    for l in &env.left_out {
                        tracing::warn!(name = %l.name, code = %l.code, message = %l.message, "not in the node env file");
                    }
                    env.job_env_sha256
                })
                .map_err(|e| e.to_string()),
            Err(ClientError::Unauthorized { message }) => return Err(agent.revoked(message)),
            Err(e) => Err(e.to_string()),
        };
        match outcome {
            Ok(version) => {
                tracing::info!(path = %cfg.path.display(), job_env_sha256 = %version, "node env file written");
                if version != target {
                    // Changed again between the heartbeat and the fetch: the next
                    // heartbeat names the new version.
                    tracing::debug!(heartbeat = %target, fetched = %version, "job environment moved on meanwhile");
                }
                applied = Some(version);
                backoff.reset();
            }
            Err(error) => {
                let delay = backoff.next_delay_after(None);
                tracing::warn!(path = %cfg.path.display(), %error, retry_in = ?delay, "cannot update the node env file");
                tokio::time::sleep(delay).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use heddle_types::nccl_conf::Entry;

    fn env(entries: &[(&str, &str)]) -> NodeJobEnv {
        let entries: Vec<Entry> = entries
            .iter()
            .map(|(n, v)| Entry {
                name: n.to_string(),
                value: v.to_string(),
            })
            .collect();
        NodeJobEnv {
            node: "gpu-1".into(),
            job_env_sha256: nccl_conf::job_env_sha256(&entries).unwrap(),
            entries,
            left_out: Vec::new(),
        }
    }

    #[test]
    fn the_file_is_rewritten_whole_and_knows_its_version() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let cfg = NodeEnvConfig {
            path: dir.path().join("nccl.env"),
            profiler: Some("/opt/heddle/libnccl-profiler-heddle.so".into()),
            plugin_cache: dir.path().join("plugin-cache"),
        };
        assert_eq!(file_version(&cfg), None);
        let first = env(&[("NCCL_IB_HCA", "mlx5_0"), ("NCCL_ALGO", "Ring")]);
        write_node_env(&cfg, &first).unwrap();
        assert_eq!(file_version(&cfg), Some(first.job_env_sha256.clone()));
        let meta = std::fs::metadata(&cfg.path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o644);
        let dir_mode = std::fs::metadata(dir.path()).unwrap().permissions().mode();
        assert_eq!(dir_mode & 0o777, 0o711);
        let text = std::fs::read_to_string(&cfg.path).unwrap();
        assert!(
            text.contains("# Heddle environment for node gpu-1\n"),
            "{text}"
        );
        assert!(
            text.contains("# written by heddle-agent; do not edit\n"),
            "{text}"
        );
        assert!(
            text.ends_with("NCCL_PROFILER_PLUGIN=/opt/heddle/libnccl-profiler-heddle.so\n"),
            "{text}"
        );

        let second = env(&[("NCCL_IB_HCA", "mlx5_1")]);
        write_node_env(&cfg, &second).unwrap();
        let text = std::fs::read_to_string(&cfg.path).unwrap();
        assert!(
            !text.contains("NCCL_ALGO"),
            "a value no longer recommended goes: {text}"
        );
        assert_eq!(file_version(&cfg), Some(second.job_env_sha256.clone()));
        // No temporary file is left beside it.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);

        // Another profiler configured than the file names: written again.
        let other = NodeEnvConfig {
            profiler: None,
            ..cfg.clone()
        };
        assert_eq!(file_version(&other), None);
    }

    #[test]
    fn a_wrong_answer_is_refused_and_the_old_file_kept() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = NodeEnvConfig {
            path: dir.path().join("nccl.env"),
            profiler: None,
            plugin_cache: dir.path().join("plugin-cache"),
        };
        let good = env(&[("NCCL_IB_HCA", "mlx5_0")]);
        write_node_env(&cfg, &good).unwrap();
        let before = std::fs::read(&cfg.path).unwrap();
        let mut lying = env(&[("NCCL_ALGO", "Tree")]);
        lying.job_env_sha256 = good.job_env_sha256.clone();
        assert!(matches!(
            write_node_env(&cfg, &lying),
            Err(NodeEnvError::Mismatch { .. })
        ));
        let hostile = env(&[("LD_PRELOAD", "/tmp/x.so")]);
        assert!(matches!(
            write_node_env(&cfg, &hostile),
            Err(NodeEnvError::Render(_))
        ));
        let mut bad_node = env(&[("NCCL_ALGO", "Tree")]);
        bad_node.node = "gpu-1\nNCCL_NET_PLUGIN=/tmp/x.so".into();
        assert!(write_node_env(&cfg, &bad_node).is_err());
        assert_eq!(std::fs::read(&cfg.path).unwrap(), before);
    }
}
