//! `heddle-agent detect`: run the detector plugins on this node's facts, offline.
//!
//! The first-party plugins are compiled into the agent (heddle-plugin-host's `bundled`
//! feature); `--plugin` adds components from files, which is also how a plugin author tests a
//! plugin against a fixture tree. Every plugin runs in the host's sandbox with the same limits.
//!
//! Merge rule for environment recommendations: the one the server applies too,
//! `heddle_types::recommend` (specific first-party plugins beat generic ones, and any other
//! plugin beats the built-ins, by name). Each value that lost to a different one is listed
//! under `conflicts` and logged.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use heddle_plugin_host::{FactsJson, HostConfig, Limits, PluginHost, Report};
use heddle_types::plugins::{EnvRecommendation, GpuAffinity};
use heddle_types::recommend::{Candidate, Rank, resolve};
use serde::Serialize;

#[derive(Debug, clap::Args)]
pub struct DetectArgs {
    /// Filesystem root to collect facts from (a fixture tree in tests).
    #[arg(long, default_value = "/", env = "HEDDLE_FACTS_ROOT")]
    pub root: PathBuf,
    /// Use this facts JSON (as printed by `heddle-agent facts`) instead of collecting.
    #[arg(long, conflicts_with = "root")]
    pub facts: Option<PathBuf>,
    /// A plugin component (.wasm) to run after the built-in ones; repeatable.
    #[arg(long = "plugin", value_name = "FILE.wasm")]
    pub plugins: Vec<PathBuf>,
    /// Skip the built-in first-party plugins.
    #[arg(long)]
    pub no_builtin: bool,
    /// `json`: every plugin's full result plus the merged env; `env`: merged `export` lines.
    #[arg(long, value_enum, default_value_t = Format::Json)]
    pub format: Format,
    /// Fuel budget per plugin call.
    #[arg(long, env = "HEDDLE_PLUGIN_FUEL", default_value_t = Limits::default().fuel)]
    pub fuel: u64,
    /// Wall-clock limit per plugin call, in milliseconds.
    #[arg(long, env = "HEDDLE_PLUGIN_TIMEOUT_MS", default_value_t = 2000)]
    pub timeout_ms: u64,
    /// Memory cap per plugin, in MiB.
    #[arg(long, env = "HEDDLE_PLUGIN_MEMORY_MIB", default_value_t = 64)]
    pub memory_mib: usize,
    /// Largest plugin component accepted, in bytes (a Python plugin is about 18 MB).
    #[arg(long, env = "HEDDLE_MAX_PLUGIN_BYTES", default_value_t = Limits::default().max_component_bytes)]
    pub max_plugin_bytes: usize,
    /// Longest a plugin component may take to compile, in milliseconds.
    #[arg(
        long,
        env = "HEDDLE_PLUGIN_COMPILE_TIMEOUT_MS",
        default_value_t = 60_000
    )]
    pub compile_timeout_ms: u64,
    /// Private directory (created 0700) for compiled plugins, so a large component is
    /// compiled once per version rather than on every run; default
    /// `$XDG_CACHE_HOME/heddle/plugins` or `~/.cache/heddle/plugins`.
    #[arg(long, env = "HEDDLE_PLUGIN_CACHE_DIR", value_name = "DIR")]
    pub plugin_cache_dir: Option<PathBuf>,
    /// Compile every plugin in this process, with no cache on disk.
    #[arg(long)]
    pub no_plugin_cache: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Json,
    Env,
}

/// One plugin's entry in the JSON output.
#[derive(Debug, Serialize)]
pub struct PluginOutput {
    pub name: String,
    pub version: Option<String>,
    pub traits: BTreeMap<String, String>,
    pub env: Vec<EnvRecommendation>,
    pub affinity: Vec<GpuAffinity>,
    pub warnings: Vec<String>,
    /// Set when the plugin failed; the other fields are then empty.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<PluginFailure>,
}

#[derive(Debug, Serialize)]
pub struct PluginFailure {
    pub code: String,
    pub message: String,
}

#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct Conflict {
    pub name: String,
    pub value: String,
    pub plugin: String,
    pub replaced_value: String,
    pub replaced_plugin: String,
}

#[derive(Debug, Serialize)]
pub struct DetectOutput {
    pub plugins: Vec<PluginOutput>,
    /// Merged recommendations (see the module docs for the rule).
    pub env: BTreeMap<String, String>,
    pub conflicts: Vec<Conflict>,
}

impl DetectOutput {
    pub fn failures(&self) -> usize {
        self.plugins.iter().filter(|p| p.error.is_some()).count()
    }
}

/// A plugin to run: a label for errors and its bytes.
pub struct Source {
    pub label: String,
    pub bytes: Vec<u8>,
}

/// The built-in plugins, in run order.
pub fn builtin() -> Vec<Source> {
    heddle_plugin_host::bundled::FIRST_PARTY
        .iter()
        .map(|(name, bytes)| Source {
            label: (*name).to_string(),
            bytes: bytes.to_vec(),
        })
        .collect()
}

pub fn command(args: DetectArgs) -> anyhow::Result<()> {
    let facts_json = match &args.facts {
        Some(path) => {
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?
        }
        None => {
            if !args.root.is_dir() {
                anyhow::bail!("--root {} is not a directory", args.root.display());
            }
            let facts = crate::facts::collect(&crate::facts::CollectOptions::for_root(&args.root));
            serde_json::to_string(&facts)?
        }
    };
    let mut sources = if args.no_builtin {
        Vec::new()
    } else {
        builtin()
    };
    for path in &args.plugins {
        let bytes =
            std::fs::read(path).with_context(|| format!("reading plugin {}", path.display()))?;
        sources.push(Source {
            label: path.display().to_string(),
            bytes,
        });
    }
    let limits = Limits {
        fuel: args.fuel,
        timeout: Duration::from_millis(args.timeout_ms),
        max_memory_bytes: args.memory_mib << 20,
        max_component_bytes: args.max_plugin_bytes,
        max_compile_time: Duration::from_millis(args.compile_timeout_ms.max(1)),
        ..Limits::default()
    };
    let cache_dir = if args.no_plugin_cache {
        None
    } else {
        args.plugin_cache_dir.clone().or_else(default_cache_dir)
    };
    let host = PluginHost::new(HostConfig {
        cache_dir,
        ..HostConfig::default()
    })?;
    let output = detect(&host, &sources, &facts_json, &limits);

    let text = match args.format {
        Format::Json => serde_json::to_string_pretty(&output)? + "\n",
        Format::Env => render_env(&output.env)?,
    };
    use std::io::Write;
    std::io::stdout().lock().write_all(text.as_bytes())?;
    match output.failures() {
        0 => Ok(()),
        n => anyhow::bail!("{n} plugin(s) failed; see their `error` in --format json"),
    }
}

/// `$XDG_CACHE_HOME/heddle/plugins`, else `$HOME/.cache/heddle/plugins`.
fn default_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("heddle").join("plugins"))
}

/// Runs every source on the facts and merges the results. A failing plugin is reported in
/// its entry and does not stop the others.
pub fn detect(
    host: &PluginHost,
    sources: &[Source],
    facts_json: &str,
    limits: &Limits,
) -> DetectOutput {
    // Checked once for every plugin (and cut per plugin to what it declared it reads).
    let facts = FactsJson::parse(facts_json);
    let plugins: Vec<PluginOutput> = sources
        .iter()
        .map(|source| {
            let facts = facts.as_ref().map_err(Clone::clone)?;
            host.load(&source.bytes, limits)
                .and_then(|plugin| host.call(&plugin, facts, limits))
        })
        .zip(sources)
        .map(|(outcome, source)| match outcome {
            Ok(report) => {
                tracing::debug!(plugin = %report.plugin.name, fuel = report.usage.fuel_consumed,
                    micros = report.usage.elapsed.as_micros() as u64, "plugin ran");
                entry(report)
            }
            Err(err) => {
                tracing::warn!(plugin = %source.label, code = err.code(), "plugin failed: {err}");
                PluginOutput {
                    name: source.label.clone(),
                    version: None,
                    traits: BTreeMap::new(),
                    env: Vec::new(),
                    affinity: Vec::new(),
                    warnings: Vec::new(),
                    error: Some(PluginFailure {
                        code: err.code().to_string(),
                        message: err.to_string(),
                    }),
                }
            }
        })
        .collect();
    let (env, conflicts) = merge(&plugins);
    for c in &conflicts {
        tracing::info!(name = %c.name, "{} overrides {}={} from {}", c.plugin, c.name, c.replaced_value, c.replaced_plugin);
    }
    DetectOutput {
        plugins,
        env,
        conflicts,
    }
}

fn entry(report: Report) -> PluginOutput {
    let d = report.detection;
    PluginOutput {
        name: report.plugin.name.clone(),
        version: Some(report.plugin.version.clone()),
        traits: d.trait_map(),
        env: d.env,
        affinity: d.affinity,
        warnings: d.warnings,
        error: None,
    }
}

/// Applies `heddle_types::recommend`'s rule; see the module docs.
pub fn merge(plugins: &[PluginOutput]) -> (BTreeMap<String, String>, Vec<Conflict>) {
    let candidates = plugins.iter().flat_map(|p| {
        p.env.iter().map(|e| Candidate {
            name: e.name.clone(),
            value: e.value.clone(),
            reason: e.reason.clone(),
            source: p.name.clone(),
            rank: Rank::plugin(&p.name),
        })
    });
    let mut env = BTreeMap::new();
    let mut conflicts = Vec::new();
    for var in resolve(candidates) {
        for lost in var.overridden.iter().filter(|o| o.value != var.value) {
            conflicts.push(Conflict {
                name: var.name.clone(),
                value: var.value.clone(),
                plugin: var.source.clone(),
                replaced_value: lost.value.clone(),
                replaced_plugin: lost.source.clone(),
            });
        }
        env.insert(var.name, var.value);
    }
    (env, conflicts)
}

/// `export NAME=VALUE` lines, as the server's env export writes them
/// (`heddle_types::env_policy`): every value quoted, nothing the policy refuses.
pub fn render_env(
    env: &BTreeMap<String, String>,
) -> Result<String, heddle_types::env_policy::EnvError> {
    env.iter()
        .map(|(k, v)| heddle_types::env_policy::export_line(k, v))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plugin(name: &str, env: &[(&str, &str)]) -> PluginOutput {
        PluginOutput {
            name: name.into(),
            version: Some("0.1.0".into()),
            traits: BTreeMap::new(),
            env: env
                .iter()
                .map(|(n, v)| EnvRecommendation {
                    name: (*n).into(),
                    value: (*v).into(),
                    reason: "r".into(),
                })
                .collect(),
            affinity: Vec::new(),
            warnings: Vec::new(),
            error: None,
        }
    }

    #[test]
    fn specific_plugins_win_and_conflicts_are_listed() {
        let mut plugins = [
            plugin(
                "dgx-affinity",
                &[
                    ("NCCL_IB_HCA", "mlx5_0,mlx5_1"),
                    ("UCX_NET_DEVICES", "mlx5_0:1"),
                ],
            ),
            plugin(
                "runai-roce",
                &[
                    ("NCCL_IB_HCA", "mlx5_bond_0"),
                    ("UCX_NET_DEVICES", "mlx5_0:1"),
                ],
            ),
        ];
        let (env, conflicts) = merge(&plugins);
        assert_eq!(env["NCCL_IB_HCA"], "mlx5_bond_0");
        assert_eq!(env["UCX_NET_DEVICES"], "mlx5_0:1");
        assert_eq!(
            conflicts,
            vec![Conflict {
                name: "NCCL_IB_HCA".into(),
                value: "mlx5_bond_0".into(),
                plugin: "runai-roce".into(),
                replaced_value: "mlx5_0,mlx5_1".into(),
                replaced_plugin: "dgx-affinity".into(),
            }]
        );
        // Input order does not matter: the rule ranks plugins by name.
        plugins.reverse();
        assert_eq!(merge(&plugins), (env, conflicts));
    }

    #[test]
    fn env_lines_are_shell_safe() {
        let env: BTreeMap<String, String> = [
            ("NCCL_IB_HCA".to_string(), "mlx5_0:1".to_string()),
            ("NCCL_ALGO".to_string(), String::new()),
        ]
        .into();
        assert_eq!(
            render_env(&env).unwrap(),
            "export NCCL_ALGO=''\nexport NCCL_IB_HCA=mlx5_0:1\n"
        );
        let hostile: BTreeMap<String, String> =
            [("LD_PRELOAD".to_string(), "/tmp/x.so".to_string())].into();
        assert!(render_env(&hostile).is_err());
    }

    fn fixture(name: &str) -> String {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../plugins/fixtures")
            .join(name);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// The built-ins on the seed fixtures, through the same path as the command.
    #[test]
    fn builtins_on_seed_fixtures() {
        let host = PluginHost::new(HostConfig::default()).unwrap();
        let limits = Limits::default();
        let sources = builtin();

        let azure = detect(&host, &sources, &fixture("azure-nd40rs-v2.json"), &limits);
        assert_eq!(azure.failures(), 0);
        assert_eq!(
            azure
                .plugins
                .iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>(),
            ["dgx-affinity", "azure-nd", "runai-roce"]
        );
        assert_eq!(azure.env["NCCL_IB_HCA"], "=mlx5_0");
        assert_eq!(azure.env["NCCL_SOCKET_IFNAME"], "=eth0");
        assert_eq!(azure.plugins[1].traits["azure.sku"], "ND40rs_v2");
        assert!(azure.plugins[2].traits.is_empty());

        let roce = detect(&host, &sources, &fixture("runai-roce.json"), &limits);
        assert_eq!(roce.env["NCCL_IB_GID_INDEX"], "9");
        assert_eq!(roce.env["NCCL_NSOCKS_PERTHREAD"], "8");

        let dgx = detect(&host, &sources, &fixture("dgx1.json"), &limits);
        assert_eq!(
            dgx.env["UCX_NET_DEVICES"],
            "mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"
        );
        let json = serde_json::to_value(&dgx).unwrap();
        assert_eq!(json["plugins"][0]["affinity"][4]["netdev"], "ib2");
        assert_eq!(json["plugins"][0]["affinity"][4]["cpus"], "20-39,60-79");
    }

    #[test]
    fn a_broken_plugin_is_reported_and_the_rest_still_run() {
        let host = PluginHost::new(HostConfig::default()).unwrap();
        let mut sources = builtin();
        sources.insert(
            0,
            Source {
                label: "broken.wasm".into(),
                bytes: b"not wasm".to_vec(),
            },
        );
        let out = detect(&host, &sources, &fixture("dgx1.json"), &Limits::default());
        assert_eq!(out.failures(), 1);
        assert_eq!(
            out.plugins[0].error.as_ref().unwrap().code,
            "not-a-component"
        );
        assert_eq!(out.plugins[1].affinity.len(), 8);
    }
}
