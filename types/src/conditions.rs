//! Node conditions: what operators used to check by eye (`nvidia-smi -q`, `ibstatus`,
//! `/proc/net/bonding`, `dmesg`, `/etc/nccl.conf`) as facts. The agent collects them, the
//! rules that judge them are [`crate::node_checks`].
//!
//! Every field is additive: an agent that does not collect a part leaves it empty, and
//! facts from agents that know nothing of conditions still parse (`NodeFacts::conditions`
//! is `None` for them).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Conditions of one node. Lists are sorted so equal machines give equal JSON.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ConditionFacts {
    /// Per GPU, by index: PCIe link from sysfs, the rest from NVML (or its fixture file).
    #[serde(default)]
    pub gpus: Vec<GpuCondition>,
    /// Where the NVML-only fields came from (`NVML`, a fixture file) or why they are empty.
    #[serde(default)]
    pub nvml_source: Option<String>,
    /// Error counters of every RDMA port, from `ports/*/counters/`.
    #[serde(default)]
    pub ib_counters: Vec<IbPortCounters>,
    /// Bonds from `/sys/class/net/*/bonding/`.
    #[serde(default)]
    pub bonds: Vec<Bond>,
    /// NCCL configuration files that exist, in the order NCCL reads them.
    #[serde(default)]
    pub nccl_conf: Vec<NcclConfFile>,
    /// NVIDIA Xid events in the kernel log, oldest first (at most the last 64).
    #[serde(default)]
    pub xid_events: Vec<XidEvent>,
    /// Where Xid events were read (`/dev/kmsg`), or why they could not be.
    #[serde(default)]
    pub xid_source: Option<String>,
    /// rdma-core release of the `libibverbs.so.1.*` installed under the root (the
    /// container's user space when the agent runs in one), from its file name.
    #[serde(default)]
    pub rdma_core_installed: Option<String>,
}

/// One GPU's condition. `None` means not known (no NVML, or the GPU does not say).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct GpuCondition {
    pub index: u32,
    pub bdf: String,
    /// From the GPU's PCI device in sysfs.
    #[serde(default)]
    pub pcie: Option<PcieLink>,
    /// Enforced power limit, watts.
    #[serde(default)]
    pub power_limit_w: Option<f64>,
    /// The board's default power limit, watts.
    #[serde(default)]
    pub default_power_limit_w: Option<f64>,
    /// Active clock-throttle ("clocks event") reasons that mean trouble, NVML's names in
    /// snake case (`hw_slowdown`, `hw_thermal_slowdown`, `hw_power_brake_slowdown`,
    /// `sw_thermal_slowdown`, `sync_boost`); idle, application clocks and the power cap are
    /// left out (they follow the work).
    #[serde(default)]
    pub throttle_reasons: Vec<String>,
    #[serde(default)]
    pub persistence_mode: Option<bool>,
    #[serde(default)]
    pub ecc: Option<EccCounters>,
    /// Compute processes on the GPU, by pid.
    #[serde(default)]
    pub processes: Vec<GpuProcess>,
}

/// PCIe link of a device: what it runs at against what it can do (`nvidia-smi -q`'s
/// "GPU Link Info"), from `current_link_speed`/`max_link_speed` and the widths.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct PcieLink {
    pub current_gen: Option<u32>,
    pub max_gen: Option<u32>,
    pub current_width: Option<u32>,
    pub max_width: Option<u32>,
    /// The sysfs text, e.g. `8.0 GT/s PCIe`.
    pub current_speed: Option<String>,
    pub max_speed: Option<String>,
}

/// DRAM ECC error counts and page retirement / row remapping state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct EccCounters {
    /// ECC mode enabled.
    pub enabled: Option<bool>,
    pub volatile_corrected: Option<u64>,
    pub volatile_uncorrected: Option<u64>,
    pub aggregate_corrected: Option<u64>,
    pub aggregate_uncorrected: Option<u64>,
    /// Pages retired for double-bit errors (pre-Ampere).
    pub retired_pages: Option<u64>,
    /// Pages waiting to be retired at the next driver reload (pre-Ampere).
    pub retired_pending: Option<bool>,
    /// A row remap waits for a GPU reset (Ampere and later).
    pub remap_pending: Option<bool>,
    /// A row remap failed: the GPU should be replaced.
    pub remap_failed: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct GpuProcess {
    pub pid: u32,
    pub name: Option<String>,
    pub used_memory_bytes: Option<u64>,
}

/// The error counters that mean a bad cable, transceiver or port. Cumulative since the
/// counters were last cleared; the checks compare them with the previous report.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct IbPortCounters {
    pub device: String,
    pub port: u32,
    pub symbol_error: Option<u64>,
    pub link_downed: Option<u64>,
    pub port_rcv_errors: Option<u64>,
    pub link_error_recovery: Option<u64>,
}

impl IbPortCounters {
    /// `(name, value)` of every counter, in a fixed order.
    pub fn values(&self) -> [(&'static str, Option<u64>); 4] {
        [
            ("symbol_error", self.symbol_error),
            ("link_downed", self.link_downed),
            ("port_rcv_errors", self.port_rcv_errors),
            ("link_error_recovery", self.link_error_recovery),
        ]
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Bond {
    pub name: String,
    /// `bonding/mode`, e.g. `802.3ad 4`.
    pub mode: Option<String>,
    pub active_slave: Option<String>,
    /// From `bonding/slaves`, each with its own `bonding_slave/mii_status`.
    #[serde(default)]
    pub members: Vec<BondMember>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct BondMember {
    pub name: String,
    /// `up` or `down`.
    pub mii_status: Option<String>,
}

/// An NCCL configuration file: NCCL applies every `NAME=value` in it to each process that
/// does not set `NAME` itself, without saying so.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct NcclConfFile {
    /// As NCCL would open it: `/etc/nccl.conf`, `~/.nccl.conf` expanded, or `NCCL_CONF_FILE`.
    pub path: String,
    #[serde(default)]
    pub variables: BTreeMap<String, String>,
}

/// One `NVRM: Xid` line of the kernel log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct XidEvent {
    /// The kernel log's sequence number: what "since the last report" is measured by.
    pub seq: u64,
    /// As the kernel prints it: `0000:07:00` (no function).
    pub pci: String,
    pub xid: u32,
    /// The rest of the line, verbatim.
    pub text: String,
}
