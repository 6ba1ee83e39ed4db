//! `heddle-agent slurm task-prolog`: the node's environment for each Slurm task.
//!
//! slurmstepd runs the `TaskProlog` program in the task's environment, as the job's user,
//! before the task (and before a user's own `--task-prolog`), and reads its output line by
//! line: `export NAME=value` sets a variable for the task, verbatim (everything after the
//! first `=` up to the newline; no quoting, no escapes); other lines are ignored. Its
//! stderr reaches the same pipe, so nothing written there may start with `export `,
//! `unset ` or `print `. A prolog that exits non-zero kills the task, so this command
//! always exits 0: a problem is a message, never a failed job.
//!
//! What a task gets: the node's values from the env file the agent keeps (no server is
//! asked), and the values of its local rank as `exec --local-rank` computes them, from the
//! GPU map the agent keeps beside the env file (`gpu_map`; the GPU's nearest HCA narrows
//! `UCX_NET_DEVICES`; `HEDDLE_LOCAL_RANK_*` name the GPU, HCA, network
//! interface, CPU list and NUMA node, for a launcher that pins). A variable already in the
//! task's environment is left as it is, and a value Slurm cannot carry, or that
//! `env_policy` refuses, is not printed.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use heddle_types::env_policy;
use heddle_types::nccl_conf;
use heddle_types::slurm as slurm_notes;

use crate::exec;
use crate::gpu_map::{self, GpuMap};

#[derive(Debug, clap::Args)]
pub struct SlurmArgs {
    #[command(subcommand)]
    pub command: SlurmCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum SlurmCommand {
    /// Print `export NAME=value` lines for the task this runs in (slurm.conf `TaskProlog`),
    /// and the pre-flight's notes for the job as `print` lines.
    TaskProlog(TaskPrologArgs),
    /// Mark what the NCCL profiler plugin recorded of the job (`SLURM_JOB_ID`) on this node
    /// as final, so a cancelled job is not left running at the server (slurm.conf `Epilog`,
    /// as root). Always exits 0.
    Epilog(epilog::EpilogArgs),
}

#[derive(Debug, clap::Args)]
pub struct TaskPrologArgs {
    /// The node env file the agent keeps (NCCL conf format); it must be readable by the
    /// job's user.
    #[arg(
        long,
        env = "HEDDLE_NCCL_ENV_FILE",
        default_value = "/var/lib/heddle-agent/nccl.env"
    )]
    pub nccl_env_file: PathBuf,
    /// Filesystem root the rank's GPU, HCA and CPUs are read from (a fixture tree in tests).
    #[arg(long, env = "HEDDLE_FACTS_ROOT", default_value = "/")]
    pub root: PathBuf,
    /// The GPU map the agent keeps (default: `gpu-map.json` beside the env file); where it
    /// is missing or was computed for another root, the prolog computes the map itself.
    #[arg(long, env = "HEDDLE_GPU_MAP_FILE")]
    pub gpu_map_file: Option<PathBuf>,
    /// Print the node's values only, without the rank's own.
    #[arg(long)]
    pub node_only: bool,
    /// Where `heddle slurm prolog` leaves the job's notes; the task with local rank 0
    /// prints them into the job's output.
    #[arg(long, env = "HEDDLE_SLURM_DIR", default_value = slurm_notes::DEFAULT_DIR)]
    pub notes_dir: PathBuf,
}

pub fn command(args: SlurmArgs) -> anyhow::Result<()> {
    match args.command {
        SlurmCommand::Epilog(a) => {
            epilog::command(&a);
            Ok(())
        }
        SlurmCommand::TaskProlog(a) => {
            // A panic would exit non-zero, and Slurm would kill the task for it.
            let out = std::panic::catch_unwind(|| task_prolog(&a, std::env::vars().collect()))
                .unwrap_or_else(|_| Prolog {
                    messages: vec!["internal error; the task gets no values from Heddle".into()],
                    ..Prolog::default()
                });
            let mut err = std::io::stderr().lock();
            for m in &out.messages {
                let _ = writeln!(err, "heddle-agent task-prolog: {m}");
            }
            let mut stdout = std::io::stdout().lock();
            let _ = stdout.write_all(out.stdout.as_bytes());
            let _ = stdout.write_all(out.exported.as_bytes());
            Ok(())
        }
    }
}

/// What the prolog prints: stdout for Slurm (`stdout`, then `exported`), messages for
/// stderr.
#[derive(Debug, Default, PartialEq)]
pub struct Prolog {
    pub stdout: String,
    /// The line that names what was exported ([`EXPORTED_VAR`]), or unsets it.
    pub exported: String,
    pub messages: Vec<String>,
}

/// Names the variables the task prolog exported, each as `NAME:TAG` with a hash of the
/// value. A job step's tasks inherit the batch script's environment, and the batch script
/// got the task prolog's values of the first node's local rank 0: a variable that still
/// holds what Heddle gave it there is Heddle's, not the job's, and is computed again for
/// each task (or unset where this task gets no value). One the job changed since keeps the
/// job's value.
pub const EXPORTED_VAR: &str = "HEDDLE_SLURM_EXPORTED";

/// FNV-1a of the value: enough to tell a value Heddle set from one the job set since.
fn value_tag(v: &str) -> String {
    let h = v.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    format!("{h:08x}")
}

/// The variables of `task_env` that still hold what a Heddle task prolog exported.
fn inherited(task_env: &BTreeMap<String, String>) -> std::collections::BTreeSet<String> {
    let Some(list) = task_env.get(EXPORTED_VAR) else {
        return Default::default();
    };
    list.split(',')
        .filter_map(|e| {
            let (name, tag) = e.split_once(':')?;
            let now = task_env.get(name)?;
            (value_tag(now) == tag).then(|| name.to_string())
        })
        .collect()
}

fn task_prolog(args: &TaskPrologArgs, task_env: BTreeMap<String, String>) -> Prolog {
    let mut messages = Vec::new();
    let node_env = read_env_file(&args.nccl_env_file, &mut messages);
    let rank = if args.node_only {
        None
    } else {
        rank_input(args, &mut messages)
    };
    let mut out = prolog(&node_env, rank, &task_env);
    messages.append(&mut out.messages);
    out.messages = messages;
    // Once per node and step: the task of local rank 0.
    if task_env
        .get("SLURM_LOCALID")
        .is_none_or(|l| l.trim() == "0")
    {
        out.stdout
            .push_str(&notes(&args.notes_dir, &task_env, &mut out.messages));
    }
    out
}

/// The pre-flight's notes for the task's job as `print` lines; a line that is not one
/// printable line is dropped, whoever wrote it.
fn notes(dir: &Path, task_env: &BTreeMap<String, String>, messages: &mut Vec<String>) -> String {
    let Some(job) = task_env
        .get("SLURM_JOB_ID")
        .and_then(|j| slurm_notes::job_id(j))
    else {
        return String::new();
    };
    let path = dir.join(slurm_notes::notes_file(job));
    let bytes = match crate::files::read_bounded(&path, slurm_notes::MAX_NOTES_FILE_LEN) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return String::new(),
        Err(e) => {
            messages.push(format!("cannot read {} ({e})", path.display()));
            return String::new();
        }
    };
    String::from_utf8_lossy(&bytes)
        .lines()
        .filter(|l| slurm_notes::printable(l))
        .map(|l| format!("print {l}\n"))
        .collect()
}

/// The node's values; a missing or refused file gives none, with a message.
pub fn read_env_file(path: &std::path::Path, messages: &mut Vec<String>) -> Vec<nccl_conf::Entry> {
    let bytes = match crate::files::read_bounded(path, nccl_conf::MAX_CONF_FILE_LEN) {
        Ok(b) => b,
        Err(e) => {
            messages.push(format!(
                "cannot read {} ({e}); the task gets no node values",
                path.display()
            ));
            return Vec::new();
        }
    };
    match nccl_conf::parse(&bytes) {
        Ok(entries) => entries,
        Err(e) => {
            messages.push(format!(
                "{} is refused whole ({e}); the task gets no node values",
                path.display()
            ));
            Vec::new()
        }
    }
}

/// The node's GPU map: the one the agent keeps beside the env file, or, where that cannot
/// be used, computed here (the plugins' compilation: seconds).
fn rank_input(args: &TaskPrologArgs, messages: &mut Vec<String>) -> Option<GpuMap> {
    let path = args
        .gpu_map_file
        .clone()
        .unwrap_or_else(|| gpu_map::beside(&args.nccl_env_file));
    match GpuMap::read(&path, &args.root) {
        Ok(map) => return Some(map),
        Err(e) => messages.push(format!("{e}; computing the GPU map here (seconds)")),
    }
    match GpuMap::compute(&args.root) {
        Ok(map) => {
            for p in &map.failed_plugins {
                messages.push(format!("plugin {p} failed; its per-GPU map is missing"));
            }
            Some(map)
        }
        Err(e) => {
            messages.push(format!("{e}; no per-rank values"));
            None
        }
    }
}

/// The lines for a task with `task_env`. Pure, for tests.
pub fn prolog(
    node_env: &[nccl_conf::Entry],
    rank: Option<GpuMap>,
    task_env: &BTreeMap<String, String>,
) -> Prolog {
    let mut messages = Vec::new();
    let node: BTreeMap<String, String> = node_env
        .iter()
        .map(|e| (e.name.clone(), e.value.clone()))
        .collect();
    // What an enclosing step's task prolog exported is not the job's own: it is computed
    // again for this task.
    let heddles = inherited(task_env);
    let own: BTreeMap<String, String> = task_env
        .iter()
        .filter(|(k, _)| !heddles.contains(*k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut vars = node.clone();
    if let Some(rank) = rank {
        match rank_plan(rank, &node, &own) {
            Ok(Some(plan)) => {
                vars = plan.env;
                if !plan.cpus.is_empty() {
                    vars.insert("HEDDLE_LOCAL_RANK_CPUS".into(), plan.cpus);
                }
                if let Some(n) = plan.numa {
                    vars.insert("HEDDLE_LOCAL_RANK_NUMA".into(), n.to_string());
                }
            }
            Ok(None) => {}
            Err(e) => messages.push(format!("{e:#}; the task gets the node values only")),
        }
    }
    let mut stdout = String::new();
    let mut exported = Vec::new();
    for (name, value) in &vars {
        if own.contains_key(name) {
            continue;
        }
        match check(name, value) {
            Ok(()) => {
                stdout.push_str("export ");
                stdout.push_str(name);
                stdout.push('=');
                stdout.push_str(value);
                stdout.push('\n');
                exported.push(format!("{name}:{}", value_tag(value)));
            }
            Err(why) => messages.push(format!("{name} is not set: {why}")),
        }
    }
    for name in &heddles {
        if !exported
            .iter()
            .any(|e| e.split(':').next() == Some(name.as_str()))
        {
            stdout.push_str(&format!("unset {name}\n"));
        }
    }
    let exported = if !exported.is_empty() {
        format!("export {EXPORTED_VAR}={}\n", exported.join(","))
    } else if task_env.contains_key(EXPORTED_VAR) {
        format!("unset {EXPORTED_VAR}\n")
    } else {
        String::new()
    };
    Prolog {
        stdout,
        exported,
        messages,
    }
}

/// The rank plan of `exec`, with the node's values from the env file. Slurm names the
/// task's GPUs in `SLURM_STEP_GPUS` (device numbers, the same across the node's tasks,
/// unlike `CUDA_VISIBLE_DEVICES`, which Slurm renumbers from 0 when cgroups constrain
/// devices): one GPU is the rank's GPU; several mean the task drives more than one GPU and
/// keeps the node-wide values. Without it the local rank picks, as `exec` does.
fn rank_plan(
    map: GpuMap,
    node: &BTreeMap<String, String>,
    task_env: &BTreeMap<String, String>,
) -> anyhow::Result<Option<exec::RankPlan>> {
    let step_gpus: Vec<&str> = task_env
        .get("SLURM_STEP_GPUS")
        .map(|l| {
            l.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .collect()
        })
        .unwrap_or_default();
    let plan = match step_gpus.as_slice() {
        [] => {
            let Some(local) = task_env
                .get("SLURM_LOCALID")
                .and_then(|v| v.trim().parse::<usize>().ok())
            else {
                anyhow::bail!("SLURM_LOCALID is not set");
            };
            exec::plan(local, node, &map, task_env)?
        }
        [one] => {
            let mut env = task_env.clone();
            env.insert("CUDA_VISIBLE_DEVICES".into(), (*one).to_string());
            exec::plan(0, node, &map, &env)?
        }
        _ => return Ok(None),
    };
    Ok(Some(plan))
}

/// Whether `NAME=value` may be printed for Slurm. The node's values pass the policy; the
/// agent's own `HEDDLE_LOCAL_RANK_*` are outside its families and need only be one line.
fn check(name: &str, value: &str) -> Result<(), String> {
    if name.starts_with("HEDDLE_LOCAL_RANK_") {
        env_policy::check_identifier(name).map_err(|e| e.to_string())?;
        env_policy::check_value(name, value).map_err(|e| e.to_string())
    } else {
        env_policy::check_var(name, value).map_err(|e| e.to_string())
    }
}

pub mod epilog;
#[cfg(test)]
mod tests;
