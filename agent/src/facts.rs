//! Node fact collection from sysfs, NVML and verbs.
//!
//! Everything is read relative to a filesystem root so the same code reads the live
//! machine (`/`) or a fixture tree; NVML, libibverbs, libnccl, environment variables and
//! IP addresses are consulted only for `/`. Collection never fails as a whole: whatever
//! cannot be read becomes an entry in `errors`, and missing libraries become [`Probe`]
//! statements ("no NVML", "no libibverbs", "no RDMA devices").
//!
//! [`Probe`]: heddle_types::facts::Probe

mod conditions;
pub mod cpulist;
mod gpu;
mod gpudirect;
mod host;
#[cfg(test)]
mod hostile_props;
mod net;
mod nvlink;
mod nvml_conditions;
mod pci;
mod rdma;
mod software;
mod sysfs;
mod topo;
mod verbs;

use std::path::PathBuf;

use heddle_types::facts::{FACTS_SCHEMA_VERSION, NodeFacts, Probe, ProbeState, RdmaFacts};

pub use topo::render as render_topology;

#[derive(Debug, clap::Args)]
pub struct FactsArgs {
    /// Filesystem root to read (a fixture tree in tests); NVML and verbs only when `/`.
    #[arg(long, default_value = "/", env = "HEDDLE_FACTS_ROOT")]
    pub root: PathBuf,
    /// Indent the JSON for humans.
    #[arg(long)]
    pub pretty: bool,
    /// Print the `nvidia-smi topo -m` style matrix instead of JSON.
    #[arg(long, conflicts_with = "pretty")]
    pub topo: bool,
    /// Print only what NVML answers about the NVLinks (remote PCI addresses and types, P2P
    /// capabilities, P2P status over NVLink between GPUs), in the form of a fixture tree's
    /// `var/lib/heddle/nvml-nvlinks.json`.
    #[arg(long, conflicts_with_all = ["topo", "pretty"])]
    pub nvml_nvlinks: bool,
}

/// What to read and which shared libraries to try.
#[derive(Debug, Clone)]
pub struct CollectOptions {
    pub root: PathBuf,
    /// NVML soname override; `None` lets nvml-wrapper load `libnvidia-ml.so.1`.
    pub nvml_library: Option<String>,
    pub verbs_library: String,
    pub nccl_library: String,
    /// The host's /etc when the agent runs in a container (`HEDDLE_HOST_ETC`, e.g.
    /// `/host/etc`): os-release and waagent.conf are read there.
    pub host_etc: Option<PathBuf>,
}

/// Path of the `libnccl.so.2` to use instead of the loader's search: read here and by the
/// NCCL runner (`runner::nccl::loader`).
pub const NCCL_LIBRARY_ENV: &str = "HEDDLE_NCCL_LIBRARY";

/// Read by every command that collects facts, like `HEDDLE_NCCL_LIBRARY`.
pub const HOST_ETC_ENV: &str = "HEDDLE_HOST_ETC";

impl Default for CollectOptions {
    fn default() -> Self {
        CollectOptions {
            root: PathBuf::from("/"),
            nvml_library: None,
            verbs_library: verbs::DEFAULT_LIBRARY.into(),
            // The same library the NCCL runner would load.
            nccl_library: std::env::var(NCCL_LIBRARY_ENV)
                .ok()
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| software::DEFAULT_NCCL_LIBRARY.into()),
            host_etc: std::env::var_os(HOST_ETC_ENV)
                .filter(|p| !p.is_empty())
                .map(PathBuf::from),
        }
    }
}

impl CollectOptions {
    pub fn for_root(root: impl Into<PathBuf>) -> Self {
        CollectOptions {
            root: root.into(),
            ..Default::default()
        }
    }
}

pub fn command(args: FactsArgs) -> anyhow::Result<()> {
    if !args.root.is_dir() {
        anyhow::bail!("--root {} is not a directory", args.root.display());
    }
    if args.nvml_nvlinks {
        let mut root = sysfs::Root::new(&args.root);
        if !root.is_live() {
            anyhow::bail!("--nvml-nvlinks asks NVML, which is consulted only for --root /");
        }
        let (probe, view) = gpu::query_nvml(&mut root, None);
        let Some(view) = view else {
            anyhow::bail!("{}", probe.message);
        };
        println!("{}", serde_json::to_string_pretty(&view.nvlinks)?);
        return Ok(());
    }
    let started = std::time::Instant::now();
    let facts = collect(&CollectOptions::for_root(&args.root));
    tracing::debug!(
        elapsed_ms = started.elapsed().as_millis() as u64,
        errors = facts.errors.len(),
        "facts collected"
    );
    let out = if args.topo {
        render_topology(&facts.topology)
    } else if args.pretty {
        serde_json::to_string_pretty(&facts)? + "\n"
    } else {
        serde_json::to_string(&facts)? + "\n"
    };
    use std::io::Write;
    std::io::stdout().lock().write_all(out.as_bytes())?;
    Ok(())
}

/// Collects the facts of the node under `opts.root`. Never panics on bad input; see the
/// module docs for what is consulted when.
pub fn collect(opts: &CollectOptions) -> NodeFacts {
    let collected_at = chrono::Utc::now();
    let mut root = sysfs::Root::new(&opts.root).with_etc(opts.host_etc.clone());
    let live = root.is_live();

    let env = host::environment(&mut root);
    let host = host::collect(&mut root, &env);
    let cpu = host::cpu(&mut root);
    let pci = pci::collect(&mut root);
    let mut gpus = gpu::from_pci(&pci);

    let (nvml, view) = if live {
        gpu::query_nvml(&mut root, opts.nvml_library.as_deref())
    } else {
        (not_consulted("NVML"), None)
    };
    if let Some(view) = &view {
        gpu::merge(&mut gpus, view);
    }
    let nvlinks_from_fixture = !live && fixture_nvlinks(&mut root, &mut gpus);

    let (rdma_probe, mut rdma_devices) = rdma::collect(&mut root);
    let verbs_probe = if live {
        verbs::cross_check(&opts.verbs_library, &mut rdma_devices)
    } else {
        not_consulted("libibverbs")
    };

    let network = net::collect(&mut root);
    let mut conditions = conditions::collect(
        &mut root,
        &conditions::Inputs {
            gpus: &gpus,
            rdma: &rdma_devices,
            interfaces: &network.interfaces,
            env: &env,
        },
    );
    let from_nvml = view
        .as_ref()
        .map(|v| v.devices.iter().map(|d| d.condition.clone()).collect());
    nvml_conditions::merge(&mut root, &mut conditions, from_nvml);
    let mut software = software::collect(&mut root, &opts.nccl_library);
    if live {
        software.rdma_core = verbs::rdma_core_version(&opts.verbs_library);
    }
    if let Some(view) = view {
        software.nvidia_driver = view.driver_version.or(software.nvidia_driver);
        software.cuda_driver = view.cuda_version;
    }

    let nvlink_source = match nvml.state {
        ProbeState::Available => "NVML".to_string(),
        _ if nvlinks_from_fixture => {
            format!("NVML's answers in the fixture file {}", nvlink::FIXTURE)
        }
        _ => "no NVML: GPU-to-GPU entries show the PCIe path only, NVLinks are unknown".to_string(),
    };
    let topology = topo::build(&gpus, &rdma_devices, &pci, &cpu.numa_nodes, nvlink_source);
    let gpudirect = gpudirect::collect(&mut root, &gpus, &rdma_devices, &pci, &topology);

    let mut errors = root.take_errors();
    errors.sort();
    errors.dedup();
    NodeFacts {
        schema_version: FACTS_SCHEMA_VERSION,
        collected_at,
        live,
        host,
        cpu,
        pci,
        nvml,
        gpus,
        rdma: RdmaFacts {
            sysfs: rdma_probe,
            verbs: verbs_probe,
            devices: rdma_devices,
        },
        network,
        software,
        topology,
        gpudirect: Some(gpudirect),
        conditions: Some(conditions),
        errors,
    }
}

/// A fixture tree's NVML answers about NVLinks ([`nvlink::FIXTURE`]) applied to its GPUs
/// by bus id; whether the tree had them.
fn fixture_nvlinks(root: &mut sysfs::Root, gpus: &mut [heddle_types::facts::GpuFacts]) -> bool {
    match nvlink::read_fixture(&root.own_path(nvlink::FIXTURE)) {
        None => false,
        Some(Err(e)) => {
            root.error("/gpus/nvlinks", e);
            false
        }
        Some(Ok(answers)) => {
            for gpu in gpus.iter_mut() {
                if let Some(g) = answers
                    .gpus
                    .iter()
                    .find(|g| pci::normalize_bdf(&g.bdf).as_deref() == Some(gpu.bdf.as_str()))
                {
                    gpu.nvlinks = nvlink::links_of(&answers, g);
                }
            }
            true
        }
    }
}

fn not_consulted(what: &str) -> Probe {
    Probe {
        state: ProbeState::NotConsulted,
        message: format!(
            "{what} not consulted: the root is not `/`, so only files under it were read"
        ),
    }
}

/// The hash the agent sends with its facts: [`heddle_types::facts_sha256`] of their JSON.
/// The collectors sort every list, so equal machines serialize to equal bytes.
pub fn facts_sha256(facts: &NodeFacts) -> String {
    heddle_types::facts_sha256(&serde_json::to_value(facts).expect("facts always serialize"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_ignores_collected_at_but_not_content() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("etc")).unwrap();
        std::fs::write(dir.path().join("etc/hostname"), "a\n").unwrap();
        let opts = CollectOptions::for_root(dir.path());
        let mut a = collect(&opts);
        let mut b = a.clone();
        b.collected_at += chrono::Duration::seconds(30);
        assert_eq!(facts_sha256(&a), facts_sha256(&b));
        a.host.hostname = "b".into();
        assert_ne!(facts_sha256(&a), facts_sha256(&b));
    }

    #[test]
    fn host_etc_is_read_instead_of_the_containers() {
        let dir = tempfile::tempdir().unwrap();
        let (root, host_etc) = (dir.path().join("root"), dir.path().join("host-etc"));
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::fs::create_dir_all(&host_etc).unwrap();
        std::fs::write(
            root.join("etc/os-release"),
            "ID=debian\nVERSION_ID=\"12\"\n",
        )
        .unwrap();
        std::fs::write(
            host_etc.join("os-release"),
            "ID=ubuntu\nVERSION_ID=\"22.04\"\n",
        )
        .unwrap();
        std::fs::write(host_etc.join("waagent.conf"), "OS.EnableRDMA=y\n").unwrap();
        let mut opts = CollectOptions::for_root(&root);
        assert_eq!(collect(&opts).host.os.id.as_deref(), Some("debian"));
        opts.host_etc = Some(host_etc);
        let facts = collect(&opts);
        assert_eq!(facts.host.os.id.as_deref(), Some("ubuntu"));
        assert_eq!(facts.host.os.version_id.as_deref(), Some("22.04"));
        assert_eq!(facts.host.azure_enable_rdma, Some(true));
    }
}
