//! Node facts: what the agent reports about its hardware and software.
//!
//! The server stores these as JSON and filters on a few stable paths, which must not move:
//! `/host/hostname`, `/gpus/*/name`, `/rdma/devices/*/name`,
//! `/rdma/devices/*/ports/*/state` and `/rdma/devices/*/ports/*/link_layer`.
//!
//! Every struct tolerates unknown fields (no `deny_unknown_fields`) so a newer agent can
//! talk to an older server. Lists are sorted by the agent so the same machine always gives
//! the same JSON apart from `collected_at`; the agent hashes that JSON to detect change.
//! Anything the agent could not read is recorded in [`NodeFacts::errors`] instead of
//! failing the whole report.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Bumped when a field changes meaning or moves; adding fields does not bump it.
pub const FACTS_SCHEMA_VERSION: u32 = 1;

/// Everything the agent knows about one node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct NodeFacts {
    /// Always [`FACTS_SCHEMA_VERSION`] for facts written by this crate.
    pub schema_version: u32,
    /// When collection started (RFC 3339). Excluded from the change hash.
    pub collected_at: DateTime<Utc>,
    /// True when the live machine was read (root `/`), so NVML, verbs, environment
    /// variables and IP addresses were consulted; false for a fixture or mounted tree.
    pub live: bool,
    pub host: HostFacts,
    pub cpu: CpuFacts,
    /// GPUs and network/RDMA PCI functions; other PCI devices are left out.
    #[serde(default)]
    pub pci: Vec<PciDevice>,
    /// Whether NVML enriched the GPU list, and why not when it did not.
    pub nvml: Probe,
    /// One entry per NVIDIA GPU found in PCI sysfs, sorted by index.
    #[serde(default)]
    pub gpus: Vec<GpuFacts>,
    pub rdma: RdmaFacts,
    pub network: NetworkFacts,
    pub software: SoftwareFacts,
    pub topology: Topology,
    /// Whether GPUDirect RDMA can work here; `None` from agents that do not collect it.
    #[serde(default)]
    pub gpudirect: Option<GpuDirectFacts>,
    /// What operators used to check by eye (PCIe links, ECC, port counters, bonds, NCCL
    /// config files); judged by `heddle_types::node_checks`. `None` from older agents.
    #[serde(default)]
    pub conditions: Option<crate::conditions::ConditionFacts>,
    /// Per-field read or parse failures, sorted by field.
    #[serde(default)]
    pub errors: Vec<FactError>,
}

/// A failure to read or parse one fact. `field` is a JSON-pointer-like location such as
/// `/rdma/devices/mlx5_0/ports/1/rate`, using names rather than list indices so the
/// location stays meaningful when lists change.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct FactError {
    pub field: String,
    pub message: String,
}

/// The outcome of consulting an optional library or subsystem (NVML, libibverbs, RDMA
/// sysfs). `message` is a sentence for humans, e.g. "no NVML: libnvidia-ml.so.1 not found".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Probe {
    pub state: ProbeState,
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum ProbeState {
    /// Consulted and used.
    Available,
    /// Consulted, not present on this node (library missing, no devices).
    Missing,
    /// Present but it failed.
    Failed,
    /// Deliberately not consulted (e.g. reading a fixture tree rather than `/`).
    NotConsulted,
}

/// Host identity and the context the agent runs in.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct HostFacts {
    pub hostname: String,
    /// Kernel release (`uname -r`).
    pub kernel: Option<String>,
    pub os: OsRelease,
    pub dmi: Dmi,
    pub container: ContainerContext,
    /// `OS.EnableRDMA` from `/etc/waagent.conf` on Azure; `None` when the file or key is
    /// absent or commented out.
    pub azure_enable_rdma: Option<bool>,
}

/// The useful keys of `/etc/os-release`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct OsRelease {
    pub id: Option<String>,
    pub version_id: Option<String>,
    pub pretty_name: Option<String>,
}

/// From `/sys/class/dmi/id`; tells an Azure VM from a DGX from a laptop.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Dmi {
    pub sys_vendor: Option<String>,
    pub product_name: Option<String>,
    pub chassis_asset_tag: Option<String>,
}

/// Container and scheduler context. `launcher_env` keeps only an allow-list of variables
/// (Kubernetes, RunAI, torchrun, NCCL_*, UCX_*) and never names containing secrets.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ContainerContext {
    /// `docker`, `podman`, `kubernetes` or another runtime hint; `None` on bare metal.
    pub runtime: Option<String>,
    pub kubernetes: bool,
    #[serde(default)]
    pub launcher_env: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CpuFacts {
    /// `model name` from `/proc/cpuinfo`.
    pub model: Option<String>,
    /// Online CPUs in kernel list syntax (`0-79`).
    pub online: Option<String>,
    pub online_count: Option<u32>,
    #[serde(default)]
    pub numa_nodes: Vec<NumaNode>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct NumaNode {
    pub id: u32,
    /// Kernel list syntax, as in `node*/cpulist`.
    pub cpulist: String,
    pub cpu_count: u32,
}

/// What a PCI function is to Heddle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum PciKind {
    Gpu,
    /// Class 0x02xx: Ethernet, InfiniBand (0x0207) and other network controllers.
    Network,
}

/// One PCI function from `/sys/bus/pci/devices`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct PciDevice {
    /// `dddd:bb:dd.f`, lower case, as sysfs names it.
    pub bdf: String,
    pub kind: PciKind,
    /// `0x10de` style.
    pub vendor_id: String,
    pub device_id: String,
    /// Six hex digits, `0x030200` style.
    pub class: String,
    /// Bound kernel driver, if any.
    pub driver: Option<String>,
    /// `None` when the kernel reports -1 (no affinity known).
    pub numa_node: Option<u32>,
    pub local_cpulist: Option<String>,
    /// Resolved sysfs path, e.g. `/sys/devices/pci0000:00/0000:00:02.0/0000:03:00.0/…`.
    /// The chain of bridges in it is what PCI distances are computed from.
    pub sysfs_path: Option<String>,
}

/// Where a GPU's name came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum NameSource {
    Nvml,
    /// The agent's small table of PCI device ids (see docs/facts.md).
    PciIdTable,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct GpuFacts {
    /// NVML index when NVML is available, else the position in PCI bus order (which is
    /// how NVML numbers GPUs too).
    pub index: u32,
    pub bdf: String,
    pub device_id: String,
    /// What NVML says (`NVIDIA H200`), or a name from the PCI id table, or `None`.
    pub name: Option<String>,
    pub name_source: Option<NameSource>,
    pub uuid: Option<String>,
    pub memory_total_bytes: Option<u64>,
    pub numa_node: Option<u32>,
    pub cpu_affinity: Option<String>,
    /// Active NVLinks, one per link, sorted by link number. Empty without NVML.
    #[serde(default)]
    pub nvlinks: Vec<NvLink>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct NvLink {
    pub link: u32,
    /// PCI address of the far end: another GPU, or an NVSwitch.
    pub remote_bdf: Option<String>,
    /// `gpu`, `switch`, `ibmnpu` or `unknown`, as NVML reports the far end.
    pub remote_kind: Option<String>,
    /// The GPUs (bus ids) this link reaches, inferred when NVML hides the far end (VMs
    /// answer `ffffffff:ff:ff.0`): those NVML's P2P status says this GPU reaches over
    /// NVLink, both ways, when the link supports P2P. Empty when the far end is known.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peers: Vec<String>,
    /// True when `peers` was inferred that way rather than read from the link.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub peer_inferred: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RdmaFacts {
    /// Whether `/sys/class/infiniband` had devices ("no RDMA devices" otherwise).
    pub sysfs: Probe,
    /// Whether libibverbs was loaded to cross-check sysfs ("no libibverbs" otherwise).
    pub verbs: Probe,
    #[serde(default)]
    pub devices: Vec<RdmaDevice>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RdmaDevice {
    /// `mlx5_0`, `mlx5_bond_0`, `rdmaP36305p0s2`: what NCCL_IB_HCA matches.
    pub name: String,
    pub fw_ver: Option<String>,
    pub node_guid: Option<String>,
    pub sys_image_guid: Option<String>,
    pub hca_type: Option<String>,
    pub board_id: Option<String>,
    pub node_type: Option<String>,
    /// The PCI function behind the device, when it has one (soft RoCE has none).
    pub pci_bdf: Option<String>,
    /// Network interfaces of that PCI function, sorted.
    #[serde(default)]
    pub netdevs: Vec<String>,
    #[serde(default)]
    pub ports: Vec<RdmaPort>,
    /// True when libibverbs listed the device too.
    pub seen_by_verbs: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RdmaPort {
    pub port: u32,
    /// Normalized: `ACTIVE`, `DOWN`, `INIT`, `ARMED`, `ACTIVE_DEFER`, `NOP`, or `UNKNOWN`.
    pub state: String,
    /// The sysfs text, e.g. `4: ACTIVE`.
    pub state_raw: Option<String>,
    pub phys_state: Option<String>,
    pub rate: Option<String>,
    /// `InfiniBand` or `Ethernet` (RoCE).
    pub link_layer: Option<String>,
    pub lid: Option<String>,
    pub sm_lid: Option<String>,
    /// IB MTU in bytes. Sysfs has no such file, so it comes from verbs only.
    pub active_mtu: Option<u32>,
    /// Non-zero GIDs, sorted by index.
    #[serde(default)]
    pub gids: Vec<Gid>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Gid {
    /// What NCCL_IB_GID_INDEX refers to.
    pub index: u32,
    /// As sysfs prints it: eight colon-separated groups of four hex digits.
    pub gid: String,
    /// `IB/RoCE v1` or `RoCE v2`.
    pub gid_type: Option<String>,
    /// Netdev the GID belongs to (RoCE only).
    pub ndev: Option<String>,
    /// The IPv4 address of an IPv4-mapped GID (`::ffff:a.b.c.d`), which is the GID that
    /// RoCE v2 over IPv4 needs.
    pub ipv4: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct NetworkFacts {
    /// Sorted by name.
    #[serde(default)]
    pub interfaces: Vec<NetInterface>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct NetInterface {
    pub name: String,
    /// ARPHRD number: 1 Ethernet, 32 InfiniBand, 772 loopback.
    pub if_type: Option<u32>,
    /// `ethernet`, `infiniband`, `loopback` or `other`.
    pub kind: String,
    pub mtu: Option<u32>,
    pub operstate: Option<String>,
    pub address: Option<String>,
    /// Mb/s; `None` when the link is down or the driver does not say.
    pub speed_mbps: Option<u32>,
    /// Bond or bridge this interface is enslaved to.
    pub master: Option<String>,
    /// Members, for a bond.
    #[serde(default)]
    pub slaves: Vec<String>,
    pub pci_bdf: Option<String>,
    /// True for interfaces without a device (`/sys/devices/virtual/net`).
    pub virtual_device: bool,
    /// CIDR addresses, sorted; only read on the live machine.
    #[serde(default)]
    pub addresses: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SoftwareFacts {
    /// NVIDIA kernel driver version (NVML, else `/sys/module/nvidia/version`).
    pub nvidia_driver: Option<String>,
    /// CUDA version the driver supports, `12.4` style (NVML only).
    pub cuda_driver: Option<String>,
    /// `2.21.5` style, from `ncclGetVersion` of `libnccl.so.2`.
    pub nccl: Option<String>,
    pub nccl_probe: Option<Probe>,
    /// From `ucx_info -v`.
    pub ucx: Option<String>,
    /// From `ofed_info -s` (MLNX_OFED / DOCA-OFED).
    pub ofed: Option<String>,
    /// rdma-core release of the libibverbs the agent loaded (`libibverbs.so.1.14.44.0`
    /// belongs to rdma-core 44.0); live machine only.
    #[serde(default)]
    pub rdma_core: Option<String>,
    /// Version of the loaded `ib_core`/`mlx5_core` module when it reports one.
    pub mlx5_core: Option<String>,
}

/// A relation between two devices, with the labels of `nvidia-smi topo -m`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Topology {
    /// Row/column labels: `GPU0`…, then RDMA device names.
    #[serde(default)]
    pub devices: Vec<String>,
    /// `matrix[i][j]` is `X`, `NV#`, `PIX`, `PXB`, `PHB`, `NODE`, `SYS` or `?` (unknown).
    #[serde(default)]
    pub matrix: Vec<Vec<String>>,
    /// Per GPU: its CPU and NUMA affinity, as the right-hand columns of `topo -m`.
    #[serde(default)]
    pub gpu_affinity: Vec<GpuAffinity>,
    /// How the GPU↔GPU NVLink part was obtained (NVML, or why it is missing).
    pub nvlink_source: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct GpuAffinity {
    pub gpu: String,
    pub cpu_affinity: Option<String>,
    pub numa_node: Option<u32>,
}

/// What GPUDirect RDMA needs, read from `/proc/modules`, `/dev/infiniband`, the agent's
/// own memlock limit, PCIe bridges' ACS control and the IOMMU groups. Each need is also a
/// named [`GpuDirectCheck`] with a reason, in the order of `checks`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct GpuDirectFacts {
    /// `nvidia_peermem` or `nv_peer_mem` when loaded (lets the HCA read GPU memory).
    pub peer_mem_module: Option<String>,
    /// `gdrdrv` (GDRCopy) is loaded.
    pub gdrdrv: bool,
    /// `/dev/infiniband/uverbs*`, sorted.
    #[serde(default)]
    pub uverbs: Vec<UverbsDevice>,
    /// `RLIMIT_MEMLOCK` of the agent: `unlimited` or bytes; live machine only.
    pub memlock: Option<String>,
    /// PCIe bridges on the path between a GPU and its nearest HCA whose ACS redirects
    /// peer-to-peer traffic up to the root complex.
    #[serde(default)]
    pub acs_bridges: Vec<AcsBridge>,
    /// `off` (no IOMMU groups), `on` (groups present), or the kernel's `iommu=`/
    /// `intel_iommu=`/`amd_iommu=` choice (`pt` is passthrough).
    pub iommu: Option<String>,
    #[serde(default)]
    pub checks: Vec<GpuDirectCheck>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct UverbsDevice {
    pub path: String,
    /// Opened read-write by the agent (live machine only).
    pub openable: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct AcsBridge {
    pub bdf: String,
    /// The GPU and HCA whose path crosses this bridge.
    pub between: String,
    /// The ACS control word, `0x001d` style, when it could be read.
    pub acs_ctrl: Option<String>,
}

/// `ok`, `warn`, `fail` or `unknown`, with the reason and what to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct GpuDirectCheck {
    /// `peer-mem`, `gdrdrv`, `uverbs`, `memlock`, `pcie-acs`, `iommu`.
    pub name: String,
    pub state: String,
    pub reason: String,
}
