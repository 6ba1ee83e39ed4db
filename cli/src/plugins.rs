//! `heddle plugins` (plugins on the server) and `heddle plugin test` (a component run
//! locally, in the server's sandbox and limits).

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Subcommand;
use heddle_types::plugins::{Plugin, PluginEnable, PluginVersion};

use crate::client::{Client, encode};
use crate::exit::Exit;
use crate::output::print_json;
use crate::table;

#[derive(Subcommand)]
pub enum PluginsCmd {
    /// Upload a component as a new version.
    Upload {
        file: std::path::PathBuf,
        #[arg(long)]
        name: String,
        #[arg(long)]
        version: String,
        /// Enable this version right away.
        #[arg(long)]
        enable: bool,
    },
    Ls,
    Versions {
        name: String,
    },
    /// Enable a plugin (at a version: that is also how to roll back).
    Enable {
        name: String,
        #[arg(long)]
        version: Option<String>,
    },
    Disable {
        name: String,
    },
}

#[derive(Subcommand)]
pub enum PluginCmd {
    /// Run a component on a facts file (from `heddle-agent facts`) in the same sandbox and
    /// limits as the server, and print what it detected and the resources it used.
    /// Exit code 1 when the plugin fails or is refused.
    Test {
        wasm: std::path::PathBuf,
        #[arg(long)]
        facts: std::path::PathBuf,
        /// Fuel budget of the call.
        #[arg(long, default_value_t = 500_000_000)]
        fuel: u64,
        /// Wall-clock limit of the call: 2s, 500ms.
        #[arg(long, default_value = "2s", value_parser = heddle_types::duration::parse)]
        timeout: Duration,
    },
}

pub async fn run(client: &Client, cmd: PluginsCmd, json: bool) -> anyhow::Result<()> {
    match cmd {
        PluginsCmd::Upload {
            file,
            name,
            version,
            enable,
        } => {
            let bytes =
                std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
            let v: PluginVersion = client
                .post_wasm(
                    &format!(
                        "/api/v1/plugins/{}/versions/{}",
                        encode(&name),
                        encode(&version)
                    ),
                    bytes,
                )
                .await?;
            if json {
                print_json(&v)?
            } else {
                println!(
                    "uploaded {} {} ({} bytes, sha256 {})",
                    v.plugin, v.version, v.size_bytes, v.sha256
                )
            }
            if enable {
                let p: Plugin = client
                    .post(
                        &format!("/api/v1/plugins/{}/enable", encode(&name)),
                        &PluginEnable {
                            version: Some(version),
                        },
                    )
                    .await?;
                if !json {
                    println!("enabled {} at {}", p.name, table::opt(&p.active_version));
                }
            }
        }
        PluginsCmd::Ls => {
            let list: Vec<Plugin> = client.get("/api/v1/plugins").await?;
            if json {
                return print_json(&list);
            }
            let mut t = table::new(&["NAME", "ENABLED", "ACTIVE VERSION", "CREATED"]);
            for p in &list {
                t.add_row(vec![
                    p.name.clone(),
                    p.enabled.to_string(),
                    table::opt(&p.active_version),
                    table::ago(Some(p.created_at)),
                ]);
            }
            println!("{t}");
        }
        PluginsCmd::Versions { name } => {
            let list: Vec<PluginVersion> = client
                .get(&format!("/api/v1/plugins/{}/versions", encode(&name)))
                .await?;
            if json {
                return print_json(&list);
            }
            let mut t = table::new(&["VERSION", "SHA256", "BYTES", "BY", "CREATED"]);
            for v in &list {
                t.add_row(vec![
                    v.version.clone(),
                    v.sha256[..16].to_string(),
                    v.size_bytes.to_string(),
                    v.uploaded_by.clone(),
                    table::ago(Some(v.created_at)),
                ]);
            }
            println!("{t}");
        }
        PluginsCmd::Enable { name, version } => {
            let p: Plugin = client
                .post(
                    &format!("/api/v1/plugins/{}/enable", encode(&name)),
                    &PluginEnable { version },
                )
                .await?;
            if json {
                print_json(&p)?
            } else {
                println!("enabled {} at {}", p.name, table::opt(&p.active_version))
            }
        }
        PluginsCmd::Disable { name } => {
            let p: Plugin = client
                .post_empty(&format!("/api/v1/plugins/{}/disable", encode(&name)))
                .await?;
            if json {
                print_json(&p)?
            } else {
                println!("disabled {}", p.name)
            }
        }
    }
    Ok(())
}

/// Runs `wasm` on a facts file and prints what it detected and the resources it used.
pub fn test(
    wasm: &std::path::Path,
    facts: &std::path::Path,
    fuel: u64,
    timeout: Duration,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let bytes = std::fs::read(wasm).with_context(|| format!("reading {}", wasm.display()))?;
    let facts =
        std::fs::read_to_string(facts).with_context(|| format!("reading {}", facts.display()))?;
    let limits = heddle_plugin_host::Limits {
        fuel,
        timeout,
        ..Default::default()
    };
    match heddle_plugin_host::run_on_facts_json(&bytes, &facts, &limits) {
        Ok(report) => {
            if json {
                print_json(&report)?;
                return Ok(ExitCode::SUCCESS);
            }
            let d = &report.detection;
            println!(
                "{} {} — {}",
                report.plugin.name, report.plugin.version, report.plugin.description
            );
            for (k, v) in &d.traits {
                println!("trait    {k}={v}");
            }
            for e in &d.env {
                println!("env      {}={}    # {}", e.name, e.value, e.reason);
            }
            for a in &d.affinity {
                println!(
                    "affinity gpu {} cpus {} numa {} nic {} netdev {}",
                    a.gpu,
                    a.cpus,
                    table::opt(&a.numa),
                    table::opt(&a.nic),
                    table::opt(&a.netdev)
                );
            }
            for w in &d.warnings {
                println!("warning  {w}");
            }
            for l in &report.logs {
                eprintln!("log {:?}: {}", l.level, l.message);
            }
            let u = &report.usage;
            eprintln!(
                "used {} fuel, {} µs, {} KiB peak memory",
                u.fuel_consumed,
                u.elapsed.as_micros(),
                u.peak_memory_bytes / 1024
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(err) => {
            eprintln!("heddle: plugin failed [{}]: {err}", err.code());
            if let Some(u) = err.usage() {
                eprintln!(
                    "used {} fuel, {} µs, {} KiB peak memory before it was stopped",
                    u.fuel_consumed,
                    u.elapsed.as_micros(),
                    u.peak_memory_bytes / 1024
                );
            }
            Ok(Exit::Failed.into())
        }
    }
}
