//! `heddle-agent exec --local-rank N -- CMD …`: runs CMD as the process of one local rank,
//! pinned to its GPU's CPUs and NUMA node, with the node's recommended environment plus that
//! rank's own device settings. The per-GPU map is what `dgx-affinity` reports (the closest
//! usable HCA behind the GPU's PCIe switch, the GPU's CPU list and NUMA node), so a launcher
//! (torchrun, `srun`, `mpirun`) needs only a rank number (docs/agent.md shows each).
//!
//! What is set for the rank, on top of the node's merged recommendations:
//! - CPU affinity (`sched_setaffinity`) to the GPU's CPUs, and a preferred memory policy on
//!   its NUMA node (`--membind` for a strict one); both survive `exec`.
//! - `CUDA_DEVICE_ORDER=PCI_BUS_ID`, so CUDA numbers GPUs as NVML and this map do.
//! - `UCX_NET_DEVICES` narrowed to the rank's HCA port: UCX uses what it is given.
//! - `HEDDLE_LOCAL_RANK_GPU`, `HEDDLE_LOCAL_RANK_HCA`, `HEDDLE_LOCAL_RANK_NETDEV` for scripts.
//!
//! `NCCL_IB_HCA` stays the node-wide list: NCCL already gives each rank its GPU-local HCA
//! from the topology, and ranks of one node must agree on the set.
//!
//! Variables already in the caller's environment win over recommendations: an explicit
//! choice is never overridden.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;

use anyhow::{Context, bail};

use crate::facts::cpulist::parse_cpulist;
use crate::gpu_map::{self, GpuMap};

#[derive(Debug, clap::Args)]
pub struct ExecArgs {
    /// The rank's index on this node; default: LOCAL_RANK, SLURM_LOCALID or
    /// OMPI_COMM_WORLD_LOCAL_RANK from the environment.
    #[arg(long)]
    pub local_rank: Option<usize>,
    /// Filesystem root to collect facts from (a fixture tree in tests).
    #[arg(long, default_value = "/", env = "HEDDLE_FACTS_ROOT")]
    pub root: PathBuf,
    /// Bind memory to the NUMA node strictly (allocation fails there rather than spilling).
    #[arg(long)]
    pub membind: bool,
    /// Print the rank's GPU, CPUs, NUMA node and environment instead of running CMD.
    #[arg(long)]
    pub print: bool,
    /// The command and its arguments.
    #[arg(last = true)]
    pub command: Vec<OsString>,
}

/// What one rank gets.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RankPlan {
    pub local_rank: usize,
    pub gpu: u32,
    /// Kernel list syntax; empty when unknown (then the affinity is left alone).
    pub cpus: String,
    pub numa: Option<i32>,
    pub hca: Option<String>,
    pub netdev: Option<String>,
    /// Variables to set (those the caller already set are left out).
    pub env: BTreeMap<String, String>,
}

pub fn command(args: ExecArgs) -> anyhow::Result<()> {
    let caller_env: BTreeMap<String, String> = std::env::vars().collect();
    let local_rank = match args.local_rank {
        Some(r) => r,
        None => rank_from_env(&caller_env).context(
            "no --local-rank, and none of LOCAL_RANK, SLURM_LOCALID, OMPI_COMM_WORLD_LOCAL_RANK is set",
        )?,
    };
    if !args.root.is_dir() {
        bail!("--root {} is not a directory", args.root.display());
    }
    if args.command.is_empty() && !args.print {
        bail!("no command: heddle-agent exec --local-rank N -- CMD [ARGS...]");
    }
    let facts = crate::facts::collect(&crate::facts::CollectOptions::for_root(&args.root));
    let detected = gpu_map::detect_facts(&facts, None)?;
    for p in detected.plugins.iter().filter(|p| p.error.is_some()) {
        tracing::warn!(plugin = %p.name, "plugin failed; its recommendations are missing");
    }
    let map = GpuMap::from_detected(&detected, &facts, &args.root);
    let plan = plan(local_rank, &detected.env, &map, &caller_env)?;
    if args.print {
        println!("{}", serde_json::to_string_pretty(&plan)?);
        return Ok(());
    }
    apply_affinity(&plan, args.membind)?;
    let (program, rest) = args.command.split_first().expect("checked above");
    use std::os::unix::process::CommandExt;
    let err = std::process::Command::new(program)
        .args(rest)
        .envs(&plan.env)
        .exec();
    Err(anyhow::anyhow!(err).context(format!("running {}", program.to_string_lossy())))
}

/// The launchers' own local-rank variables.
fn rank_from_env(env: &BTreeMap<String, String>) -> Option<usize> {
    [
        "LOCAL_RANK",
        "SLURM_LOCALID",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "MPI_LOCALRANKID",
    ]
    .iter()
    .find_map(|k| env.get(*k)?.trim().parse().ok())
}

/// Which GPU the rank drives (`CUDA_VISIBLE_DEVICES` may renumber them, by index or UUID),
/// and what it gets.
pub fn plan(
    local_rank: usize,
    node_env: &BTreeMap<String, String>,
    map: &GpuMap,
    caller_env: &BTreeMap<String, String>,
) -> anyhow::Result<RankPlan> {
    let gpu_uuids = &map.gpus;
    let gpu = match caller_env
        .get("CUDA_VISIBLE_DEVICES")
        .filter(|v| !v.trim().is_empty())
    {
        Some(list) => {
            let entry = list.split(',').nth(local_rank).with_context(|| {
                format!("local rank {local_rank} has no GPU in CUDA_VISIBLE_DEVICES={list}")
            })?;
            let entry = entry.trim();
            match entry.parse::<u32>() {
                Ok(i) => i,
                Err(_) => gpu_uuids
                    .iter()
                    .find(|(_, u)| u.as_deref().is_some_and(|u| u.starts_with(entry)))
                    .map(|(i, _)| *i)
                    .with_context(|| format!("no GPU with UUID {entry}"))?,
            }
        }
        None => u32::try_from(local_rank)?,
    };
    let affinity = map.affinity(gpu);
    if affinity.is_none() && !gpu_uuids.iter().any(|(i, _)| *i == gpu) {
        bail!("local rank {local_rank} maps to GPU{gpu}, which this node does not have");
    }
    let mut env: BTreeMap<String, String> = node_env.clone();
    env.insert("CUDA_DEVICE_ORDER".into(), "PCI_BUS_ID".into());
    env.insert("HEDDLE_LOCAL_RANK_GPU".into(), gpu.to_string());
    let hca = affinity.and_then(|a| a.nic.clone());
    let netdev = affinity.and_then(|a| a.netdev.clone());
    if let Some(hca) = &hca {
        // The rank's port as the node-wide list names it; a device the list leaves out (its
        // GID differs from the others') keeps the node-wide list.
        let port = node_env.get("UCX_NET_DEVICES").and_then(|l| {
            l.split(',')
                .find(|d| *d == hca.as_str() || d.split(':').next() == Some(hca.as_str()))
                .map(str::to_string)
        });
        match port {
            Some(port) => {
                env.insert("UCX_NET_DEVICES".into(), port);
            }
            None => {
                tracing::warn!(%hca, "the rank's HCA is not among the node's UCX devices; keeping the node-wide list")
            }
        }
        env.insert("HEDDLE_LOCAL_RANK_HCA".into(), hca.clone());
    }
    if let Some(n) = &netdev {
        env.insert("HEDDLE_LOCAL_RANK_NETDEV".into(), n.clone());
    }
    env.retain(|k, _| !caller_env.contains_key(k));
    Ok(RankPlan {
        local_rank,
        gpu,
        cpus: affinity.map(|a| a.cpus.clone()).unwrap_or_default(),
        numa: affinity.and_then(|a| a.numa),
        hca,
        netdev,
        env,
    })
}

fn apply_affinity(plan: &RankPlan, membind: bool) -> anyhow::Result<()> {
    if !plan.cpus.is_empty() {
        let cpus = parse_cpulist(&plan.cpus)?;
        // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET only writes inside it.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        for cpu in cpus.into_iter().filter(|c| *c < libc::CPU_SETSIZE as usize) {
            unsafe { libc::CPU_SET(cpu, &mut set) };
        }
        // SAFETY: pid 0 is this thread; `set` lives for the call.
        let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
        if rc != 0 {
            bail!(
                "pinning to CPUs {}: {}",
                plan.cpus,
                std::io::Error::last_os_error()
            );
        }
    }
    if let Some(node) = plan
        .numa
        .and_then(|n| u32::try_from(n).ok())
        .filter(|n| *n < 64)
    {
        const MPOL_PREFERRED: libc::c_long = 1;
        const MPOL_BIND: libc::c_long = 2;
        let mask: libc::c_ulong = 1 << node;
        let mode = if membind { MPOL_BIND } else { MPOL_PREFERRED };
        // SAFETY: set_mempolicy reads `maxnode` bits from `mask`, which holds 64.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_set_mempolicy,
                mode,
                &mask as *const libc::c_ulong,
                64 as libc::c_ulong,
            )
        };
        if rc != 0 {
            tracing::warn!(numa = node, error = %std::io::Error::last_os_error(),
                "could not set the memory policy; memory follows the CPUs' first touch");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
