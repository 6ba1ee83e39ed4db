//! The GPU checks: PCIe link, power cap, throttling, persistence, ECC, other processes,
//! and Xid events since the last report.

use std::collections::{BTreeMap, BTreeSet};

use super::NodeCheck;
use crate::conditions::{ConditionFacts, GpuCondition};
use crate::facts::NodeFacts;
use crate::health::Verdict;

/// Xids that mean the GPU itself is in trouble (double-bit ECC, fallen off the bus,
/// NVLink, uncontained ECC, GSP or micro-controller failures), after NVIDIA's Xid catalog.
/// Others are usually an application's fault and only warn.
const FAILING_XIDS: [u32; 9] = [48, 61, 62, 74, 79, 92, 95, 119, 120];

/// Throttle reasons that mean the GPU runs slower than it should on a healthy, cooled
/// machine. The agent reports only these (the power cap a loaded GPU reaches is normal).
const BAD_THROTTLE: [&str; 5] = [
    "hw_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "sw_thermal_slowdown",
    "sync_boost",
];

fn gpu_label(g: &GpuCondition) -> String {
    format!("GPU{} {}", g.index, g.bdf)
}

pub(super) fn gpu_checks(cond: &ConditionFacts, out: &mut Vec<NodeCheck>) {
    let nvml_why = cond
        .nvml_source
        .clone()
        .unwrap_or_else(|| "this agent does not report GPU conditions".into());
    let unknown = |name: &str, what: &str, out: &mut Vec<NodeCheck>| {
        out.push(NodeCheck::new(
            name,
            None,
            Verdict::Unknown,
            format!("{what} not known: {nvml_why}"),
        ))
    };
    // PCIe link: sysfs, so known on fixtures too.
    let links: Vec<_> = cond
        .gpus
        .iter()
        .filter_map(|g| g.pcie.as_ref().map(|l| (g, l)))
        .collect();
    if links.is_empty() {
        out.push(NodeCheck::new(
            "gpu-pcie-link",
            None,
            Verdict::Unknown,
            "no GPU reported its PCIe link speed and width".into(),
        ));
    }
    for (g, l) in links {
        let slow_gen = matches!((l.current_gen, l.max_gen), (Some(c), Some(m)) if c < m);
        let narrow = matches!((l.current_width, l.max_width), (Some(c), Some(m)) if c < m);
        let shown = |generation: Option<u32>, w: Option<u32>| {
            format!(
                "Gen{} x{}",
                generation.map_or("?".into(), |v| v.to_string()),
                w.map_or("?".into(), |v| v.to_string())
            )
        };
        let (cur, max) = (
            shown(l.current_gen, l.current_width),
            shown(l.max_gen, l.max_width),
        );
        let (state, reason) = if narrow {
            (
                Verdict::Warn,
                format!(
                    "PCIe link runs at {cur}, below its maximum {max}: fewer lanes trained, so host↔GPU and GPUDirect traffic is capped; reseat the GPU or riser and check the slot (a link that trained down does not recover without a reset)"
                ),
            )
        } else if slow_gen && !g.processes.is_empty() {
            (
                Verdict::Warn,
                format!(
                    "PCIe link runs at {cur} while the GPU is busy, below its maximum {max}: check the slot, riser and the BIOS PCIe generation setting (`nvidia-smi -q -d PCIE` shows the same)"
                ),
            )
        } else if slow_gen {
            (
                Verdict::Pass,
                format!(
                    "PCIe link at {cur}, maximum {max}: an idle GPU lowers its link speed to save power, so the generation is judged only while the GPU is busy"
                ),
            )
        } else {
            (Verdict::Pass, format!("PCIe link at {cur}, its maximum"))
        };
        out.push(NodeCheck::new(
            "gpu-pcie-link",
            Some(gpu_label(g)),
            state,
            reason,
        ));
    }

    let nvml: Vec<&GpuCondition> = cond
        .gpus
        .iter()
        .filter(|g| g.persistence_mode.is_some() || g.power_limit_w.is_some() || g.ecc.is_some())
        .collect();
    if nvml.is_empty() {
        for (name, what) in [
            ("gpu-power-cap", "power limits"),
            ("gpu-throttle", "clock-throttle reasons"),
            ("gpu-persistence", "persistence mode"),
            ("gpu-ecc", "ECC errors"),
            ("gpu-processes", "processes on the GPUs"),
        ] {
            unknown(name, what, out);
        }
        return;
    }
    for g in nvml {
        let who = Some(gpu_label(g));
        if let (Some(limit), Some(default)) = (g.power_limit_w, g.default_power_limit_w) {
            let (state, reason) = if limit + 0.5 < default {
                (
                    Verdict::Warn,
                    format!(
                        "power limit {limit:.0} W is below the default {default:.0} W, so clocks drop under load; restore it with `nvidia-smi -i {} -pl {default:.0}` (or find who capped it)",
                        g.index
                    ),
                )
            } else {
                (
                    Verdict::Pass,
                    format!("power limit {limit:.0} W (default {default:.0} W)"),
                )
            };
            out.push(NodeCheck::new("gpu-power-cap", who.clone(), state, reason));
        }
        let bad: Vec<&str> = g
            .throttle_reasons
            .iter()
            .map(String::as_str)
            .filter(|r| BAD_THROTTLE.contains(r))
            .collect();
        let (state, reason) = if bad.is_empty() {
            let seen = if g.throttle_reasons.is_empty() {
                "none".to_string()
            } else {
                g.throttle_reasons.join(", ")
            };
            (
                Verdict::Pass,
                format!("no slowdown; active reasons: {seen}"),
            )
        } else {
            (
                Verdict::Warn,
                format!(
                    "clocks are held down by {}: check cooling (fans, inlet temperature, airflow) and the power supply; `nvidia-smi -q -d PERFORMANCE` shows the same",
                    bad.join(", ")
                ),
            )
        };
        out.push(NodeCheck::new("gpu-throttle", who.clone(), state, reason));
        if let Some(on) = g.persistence_mode {
            let (state, reason) = if on {
                (Verdict::Pass, "persistence mode on".to_string())
            } else {
                (
                    Verdict::Warn,
                    format!(
                        "persistence mode off: the driver tears the GPU down between jobs, so every start pays seconds of initialisation and settings do not stick; enable nvidia-persistenced (or `nvidia-smi -i {} -pm 1`)",
                        g.index
                    ),
                )
            };
            out.push(NodeCheck::new(
                "gpu-persistence",
                who.clone(),
                state,
                reason,
            ));
        }
        if let Some(ecc) = &g.ecc {
            let n = |v: Option<u64>| v.unwrap_or(0);
            let (state, reason) = if ecc.remap_failed == Some(true) {
                (Verdict::Fail, "a row remap failed: the GPU's memory cannot be repaired any more; drain the node and have the GPU replaced".to_string())
            } else if n(ecc.volatile_uncorrected) > 0 {
                (
                    Verdict::Fail,
                    format!(
                        "{} uncorrectable ECC error(s) since the driver loaded: results on this GPU cannot be trusted; drain it and reset the GPU (`nvidia-smi -r`), replace it if they return",
                        n(ecc.volatile_uncorrected)
                    ),
                )
            } else if ecc.remap_pending == Some(true) || ecc.retired_pending == Some(true) {
                (Verdict::Warn, "a row remap or page retirement is pending: it takes effect only after a GPU reset; drain the node and reset the GPU".to_string())
            } else if n(ecc.aggregate_uncorrected) > 0 || n(ecc.retired_pages) > 0 {
                (
                    Verdict::Warn,
                    format!(
                        "{} uncorrectable ECC error(s) over the GPU's life, {} retired page(s): watch for more; a GPU that keeps collecting them should be replaced",
                        n(ecc.aggregate_uncorrected),
                        n(ecc.retired_pages)
                    ),
                )
            } else if ecc.enabled == Some(false) {
                (Verdict::Warn, "ECC is disabled: memory errors go unnoticed; enable it with `nvidia-smi -i N -e 1` and reboot".to_string())
            } else {
                (
                    Verdict::Pass,
                    format!(
                        "no uncorrectable ECC errors ({} corrected since the driver loaded)",
                        n(ecc.volatile_corrected)
                    ),
                )
            };
            out.push(NodeCheck::new("gpu-ecc", who.clone(), state, reason));
        }
        let (state, reason) = if g.processes.is_empty() {
            (Verdict::Pass, "no compute process".to_string())
        } else {
            let ps: Vec<String> = g
                .processes
                .iter()
                .map(|p| match &p.name {
                    Some(n) => format!("{} (pid {})", n, p.pid),
                    None => format!("pid {}", p.pid),
                })
                .collect();
            (
                Verdict::Warn,
                format!(
                    "in use by {}: tests on this GPU are deferred rather than disturb that job or measure its noise; results taken now would be low",
                    ps.join(", ")
                ),
            )
        };
        out.push(NodeCheck::new("gpu-processes", who, state, reason));
    }
}

pub(super) fn xid_check(
    facts: &NodeFacts,
    cond: &ConditionFacts,
    prev: Option<&ConditionFacts>,
    out: &mut Vec<NodeCheck>,
) {
    let Some(source) = &cond.xid_source else {
        out.push(NodeCheck::new(
            "gpu-xid",
            None,
            Verdict::Unknown,
            if facts.conditions.is_some() {
                "Xid events not known: no kernel log was read (the agent needs CAP_SYSLOG for /dev/kmsg; see the facts' errors)".into()
            } else {
                "Xid events not known: this agent does not report them".into()
            },
        ));
        return;
    };
    let last_seen = prev.and_then(|p| p.xid_events.iter().map(|e| e.seq).max());
    let newest = cond.xid_events.iter().map(|e| e.seq).max();
    // A kernel log that starts again below the last sequence number seen is a new boot.
    let rebooted = matches!((last_seen, newest), (Some(l), Some(n)) if n < l);
    let since = match (last_seen, rebooted) {
        (Some(l), false) => Some(l),
        _ => None,
    };
    let fresh: Vec<_> = cond
        .xid_events
        .iter()
        .filter(|e| since.is_none_or(|l| e.seq > l))
        .collect();
    let window = if prev.is_some() && !rebooted {
        "since the last report"
    } else {
        "in the kernel log"
    };
    if fresh.is_empty() {
        out.push(NodeCheck::new(
            "gpu-xid",
            None,
            Verdict::Pass,
            format!("no Xid events {window} ({source})"),
        ));
        return;
    }
    let mut by_gpu: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for e in &fresh {
        let gpu = facts
            .gpus
            .iter()
            .find(|g| g.bdf.starts_with(&e.pci.to_ascii_lowercase()))
            .map_or_else(|| e.pci.clone(), |g| format!("GPU{} {}", g.index, g.bdf));
        by_gpu.entry(gpu).or_default().push(e.xid);
    }
    for (gpu, xids) in by_gpu {
        let failing: BTreeSet<u32> = xids
            .iter()
            .copied()
            .filter(|x| FAILING_XIDS.contains(x))
            .collect();
        let all: Vec<String> = xids.iter().map(|x| x.to_string()).collect();
        let (state, reason) = if failing.is_empty() {
            (
                Verdict::Warn,
                format!(
                    "Xid {} {window}: usually an application fault (bad memory access, a killed job); if it repeats without a code change, run `nvidia-bug-report.sh`",
                    all.join(", ")
                ),
            )
        } else {
            let f: Vec<String> = failing.iter().map(|x| x.to_string()).collect();
            (
                Verdict::Fail,
                format!(
                    "Xid {} {window}; {} mean(s) a GPU, memory or NVLink fault: drain the node, reset the GPU and open a hardware case if it returns",
                    all.join(", "),
                    f.join(", ")
                ),
            )
        };
        out.push(NodeCheck::new("gpu-xid", Some(gpu), state, reason));
    }
}
