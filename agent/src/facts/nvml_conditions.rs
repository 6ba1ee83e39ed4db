//! The NVML half of a GPU's condition (`nvidia-smi -q`'s power readings, clocks event
//! reasons, persistence mode, ECC, retired pages, remapped rows and processes).
//!
//! Live: asked of NVML in the same session that lists the GPUs. A fixture tree has no
//! NVML, so it may carry the same fields in [`FIXTURE`]: a JSON list of
//! `heddle_types::conditions::GpuCondition` matched to the GPUs by `bdf`.

use heddle_types::conditions::{ConditionFacts, EccCounters, GpuCondition, GpuProcess};
use nvml_wrapper::Device;
use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, RetirementCause};
use nvml_wrapper::enums::device::UsedGpuMemory;

use super::sysfs::Root;

/// Where a fixture tree keeps what NVML would say.
pub const FIXTURE: &str = "var/lib/heddle/nvml-conditions.json";

/// Throttle reasons kept, by NVML's bit, in snake case: those that mean trouble. Idle,
/// application clocks and the power cap a loaded GPU reaches come and go with the work,
/// and would change the facts (and their history) on every report.
const REASONS: [(ThrottleReasons, &str); 5] = [
    (ThrottleReasons::HW_SLOWDOWN, "hw_slowdown"),
    (ThrottleReasons::SYNC_BOOST, "sync_boost"),
    (ThrottleReasons::SW_THERMAL_SLOWDOWN, "sw_thermal_slowdown"),
    (ThrottleReasons::HW_THERMAL_SLOWDOWN, "hw_thermal_slowdown"),
    (
        ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN,
        "hw_power_brake_slowdown",
    ),
];

/// Reads one GPU's NVML condition. Fields NVML does not support on this GPU (no ECC on
/// consumer boards, no row remapping before Ampere) stay `None`.
pub fn read(nvml: &nvml_wrapper::Nvml, dev: &Device<'_>, index: u32, bdf: &str) -> GpuCondition {
    let watts = |mw: u32| f64::from(mw) / 1000.0;
    let ecc_mode = dev.is_ecc_enabled().ok();
    let ecc = ecc_mode.map(|mode| {
        let total = |e: MemoryError, c: EccCounter| dev.total_ecc_errors(e, c).ok();
        let (remap_pending, remap_failed) = remapped_rows(nvml, dev).unzip();
        EccCounters {
            enabled: Some(mode.currently_enabled),
            volatile_corrected: total(MemoryError::Corrected, EccCounter::Volatile),
            volatile_uncorrected: total(MemoryError::Uncorrected, EccCounter::Volatile),
            aggregate_corrected: total(MemoryError::Corrected, EccCounter::Aggregate),
            aggregate_uncorrected: total(MemoryError::Uncorrected, EccCounter::Aggregate),
            retired_pages: dev
                .retired_pages(RetirementCause::DoubleBitEccError)
                .ok()
                .map(|p| p.len() as u64),
            retired_pending: dev.are_pages_pending_retired().ok(),
            remap_pending,
            remap_failed,
        }
    });
    let throttle_reasons = dev
        .current_throttle_reasons()
        .map(|r| {
            REASONS
                .iter()
                .filter(|(bit, _)| r.contains(*bit))
                .map(|(_, n)| n.to_string())
                .collect()
        })
        .unwrap_or_default();
    let mut processes: Vec<GpuProcess> = dev
        .running_compute_processes()
        .unwrap_or_default()
        .into_iter()
        .map(|p| GpuProcess {
            pid: p.pid,
            name: nvml
                .sys_process_name(p.pid, 64)
                .ok()
                .filter(|n| !n.is_empty()),
            used_memory_bytes: match p.used_gpu_memory {
                UsedGpuMemory::Used(b) => Some(b),
                UsedGpuMemory::Unavailable => None,
            },
        })
        .collect();
    processes.sort_by_key(|p| p.pid);
    processes.dedup_by_key(|p| p.pid);
    GpuCondition {
        index,
        bdf: bdf.to_string(),
        pcie: None,
        power_limit_w: dev.enforced_power_limit().ok().map(watts),
        default_power_limit_w: dev.power_management_limit_default().ok().map(watts),
        throttle_reasons,
        persistence_mode: dev.is_in_persistent_mode().ok(),
        ecc,
        processes,
    }
}

/// `(pending, failure occurred)` from `nvmlDeviceGetRemappedRows`, which nvml-wrapper does
/// not wrap; `None` before Ampere or when the symbol is missing.
fn remapped_rows(nvml: &nvml_wrapper::Nvml, dev: &Device<'_>) -> Option<(bool, bool)> {
    let f = *nvml.lib().nvmlDeviceGetRemappedRows.as_ref().ok()?;
    let (mut corr, mut unc, mut pending, mut failed) = (0u32, 0u32, 0u32, 0u32);
    // SAFETY: the handle belongs to this live NVML session and every out-pointer is a
    // valid `unsigned int`.
    let rc = unsafe { f(dev.handle(), &mut corr, &mut unc, &mut pending, &mut failed) };
    (rc == 0).then_some((pending != 0, failed != 0))
}

/// Fills the NVML fields of `cond.gpus` from what NVML said (live), or from the fixture
/// file of a tree, and says where they came from.
pub fn merge(root: &mut Root, cond: &mut ConditionFacts, from_nvml: Option<Vec<GpuCondition>>) {
    let (found, source) = match from_nvml {
        Some(list) => (list, "NVML".to_string()),
        None if root.is_live() => {
            cond.nvml_source = Some("no NVML on this node (see `nvml` in the facts)".into());
            return;
        }
        None => match std::fs::read(root.own_path(FIXTURE)) {
            Ok(bytes) => match serde_json::from_slice::<Vec<GpuCondition>>(&bytes) {
                Ok(list) => (list, format!("fixture file {FIXTURE}")),
                Err(e) => {
                    root.error("/conditions/gpus", format!("{FIXTURE}: {e}"));
                    return;
                }
            },
            Err(_) => {
                cond.nvml_source =
                    Some("NVML not consulted: the root is not `/` and has no NVML fixture".into());
                return;
            }
        },
    };
    for n in found {
        let gpu = match cond.gpus.iter_mut().find(|g| g.bdf == n.bdf) {
            Some(g) => g,
            None => {
                cond.gpus.push(GpuCondition {
                    index: n.index,
                    bdf: n.bdf.clone(),
                    ..Default::default()
                });
                cond.gpus.last_mut().expect("just pushed")
            }
        };
        gpu.power_limit_w = n.power_limit_w;
        gpu.default_power_limit_w = n.default_power_limit_w;
        gpu.throttle_reasons = n.throttle_reasons;
        gpu.persistence_mode = n.persistence_mode;
        gpu.ecc = n.ecc;
        gpu.processes = n.processes;
    }
    cond.gpus.sort_by_key(|g| g.index);
    cond.nvml_source = Some(source);
}
