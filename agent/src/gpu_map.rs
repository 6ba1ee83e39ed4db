//! The node's GPU map: which GPUs the node has (index and UUID) and, for each, its CPUs,
//! NUMA node, nearest HCA and network interface, as the built-in plugins find them from the
//! node's facts. `heddle-agent exec` and `heddle-agent slurm task-prolog` compute a rank's
//! values from it.
//!
//! Running the plugins costs their compilation (about 2 s of CPU), too much for every Slurm
//! task, so the agent keeps the map in `gpu-map.json` beside the node env file: written
//! whenever the node's facts change (atomically, mode 0644, like the env file), read by the
//! task prolog instead of computing it. The file names the facts root it was computed
//! from; a reader of another tree (a fixture) uses it only for the same root, while a
//! reader of the live node (`/`) takes it from whichever root the agent reads the node
//! through (`/host` for an agent in a container); a missing, unreadable, oversized or malformed
//! file is never used (the prolog computes the map itself and says why).

use std::path::{Path, PathBuf};

use heddle_plugin_host::{HostConfig, Limits, PluginHost};
use heddle_types::facts::NodeFacts;
use heddle_types::plugins::GpuAffinity;
use serde::{Deserialize, Serialize};

use crate::detect::{self, DetectOutput};

/// The file's name, beside the node env file.
pub const FILE_NAME: &str = "gpu-map.json";

/// What the file's `schema` must say.
pub const SCHEMA: u32 = 1;

/// Largest file read: far beyond a node's (eight GPUs take about 2 kB), and a bound on what
/// a hostile file costs the task prolog.
pub const MAX_FILE_LEN: usize = 256 * 1024;

/// Most GPUs or affinity entries a map may hold.
const MAX_ENTRIES: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuMap {
    pub schema: u32,
    /// The facts root the map was computed from (`/` on a node).
    pub root: PathBuf,
    /// The hash of the facts it was computed from (what heartbeats report).
    pub facts_sha256: String,
    /// The node's GPUs: NVML index and UUID.
    pub gpus: Vec<(u32, Option<String>)>,
    /// Each GPU's CPUs, NUMA node, HCA and network interface, from every plugin that
    /// answered, in plugin order.
    pub affinity: Vec<GpuAffinity>,
    /// Plugins that failed: their part of the map is missing.
    pub failed_plugins: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum GpuMapError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is larger than {MAX_FILE_LEN} bytes")]
    TooLarge { path: PathBuf },
    #[error("{path} is not a GPU map: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error("{path} was computed for facts root {found}, not {wanted}")]
    OtherRoot {
        path: PathBuf,
        found: PathBuf,
        wanted: PathBuf,
    },
    #[error("cannot start the plugin host: {0}")]
    PluginHost(String),
}

/// Runs the built-in plugins on `facts`, their compiled code kept in `cache_dir` (a private
/// directory) when given.
pub fn detect_facts(
    facts: &NodeFacts,
    cache_dir: Option<&Path>,
) -> Result<DetectOutput, GpuMapError> {
    let facts_json = serde_json::to_string(facts).expect("facts always serialize");
    let host = PluginHost::new(HostConfig {
        cache_dir: cache_dir.map(Path::to_path_buf),
        ..HostConfig::default()
    })
    .map_err(|e| GpuMapError::PluginHost(e.to_string()))?;
    Ok(detect::detect(
        &host,
        &detect::builtin(),
        &facts_json,
        &Limits::default(),
    ))
}

impl GpuMap {
    /// The map of `detected`, the plugins' output on `facts`.
    pub fn from_detected(detected: &DetectOutput, facts: &NodeFacts, root: &Path) -> GpuMap {
        GpuMap {
            schema: SCHEMA,
            root: root.to_path_buf(),
            facts_sha256: crate::facts::facts_sha256(facts),
            gpus: facts
                .gpus
                .iter()
                .map(|g| (g.index, g.uuid.clone()))
                .collect(),
            affinity: detected
                .plugins
                .iter()
                .flat_map(|p| p.affinity.iter().cloned())
                .collect(),
            failed_plugins: detected
                .plugins
                .iter()
                .filter(|p| p.error.is_some())
                .map(|p| p.name.clone())
                .collect(),
        }
    }

    /// Collects the facts at `root` and runs the plugins on them: seconds of CPU.
    pub fn compute(root: &Path) -> Result<GpuMap, GpuMapError> {
        let facts = crate::facts::collect(&crate::facts::CollectOptions::for_root(root));
        let detected = detect_facts(&facts, None)?;
        Ok(GpuMap::from_detected(&detected, &facts, root))
    }

    /// The first affinity entry for `gpu`.
    pub fn affinity(&self, gpu: u32) -> Option<&GpuAffinity> {
        self.affinity.iter().find(|a| a.gpu == gpu)
    }

    /// Reads the map at `path` for a reader of the facts at `root`: computed for that root,
    /// or for any when `root` is `/` (the live node, which an agent in a container reads
    /// through another mount). Only a regular file (opened without
    /// blocking, so a FIFO cannot hold a task up), at most [`MAX_FILE_LEN`] bytes, whose
    /// every field checks out.
    pub fn read(path: &Path, root: &Path) -> Result<GpuMap, GpuMapError> {
        let bytes =
            crate::files::read_bounded(path, MAX_FILE_LEN).map_err(|source| GpuMapError::Read {
                path: path.to_path_buf(),
                source,
            })?;
        if bytes.len() > MAX_FILE_LEN {
            return Err(GpuMapError::TooLarge {
                path: path.to_path_buf(),
            });
        }
        let invalid = |reason: String| GpuMapError::Invalid {
            path: path.to_path_buf(),
            reason,
        };
        let map: GpuMap = serde_json::from_slice(&bytes).map_err(|e| invalid(e.to_string()))?;
        if map.schema != SCHEMA {
            return Err(invalid(format!(
                "schema {} (this agent reads {SCHEMA})",
                map.schema
            )));
        }
        if map.gpus.len() > MAX_ENTRIES || map.affinity.len() > MAX_ENTRIES {
            return Err(invalid(format!("more than {MAX_ENTRIES} GPUs")));
        }
        if map.root != root && root != Path::new("/") {
            return Err(GpuMapError::OtherRoot {
                path: path.to_path_buf(),
                found: map.root,
                wanted: root.to_path_buf(),
            });
        }
        Ok(map)
    }

    /// Writes the map as `dir/gpu-map.json`: atomically, mode 0644 (every job's user reads
    /// it).
    pub fn write(&self, dir: &Path) -> Result<(), crate::files::FileError> {
        let json = serde_json::to_vec_pretty(self).expect("a GPU map always serializes");
        crate::files::write_atomic(dir, FILE_NAME, &json, 0o644)
    }
}

/// `gpu-map.json` beside `env_file`.
pub fn beside(env_file: &Path) -> PathBuf {
    env_file.with_file_name(FILE_NAME)
}

/// The node env file's directory, where the agent writes the map; `None` for a path with
/// no directory.
pub fn dir_of(env_file: &Path) -> Option<&Path> {
    env_file.parent().filter(|d| !d.as_os_str().is_empty())
}

#[cfg(test)]
mod tests;
