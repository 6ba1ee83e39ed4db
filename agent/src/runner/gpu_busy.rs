//! Is another process on the GPUs a test would use? The agent sees every GPU of its node
//! (the NVIDIA runtime with `NVIDIA_VISIBLE_DEVICES=all`, as dcgm-exporter does) without
//! being allocated any, so a workload may hold them. Before a GPU test the child asks NVML
//! for the compute and graphics processes on each GPU it may use and defers the test —
//! outcome `skipped`, with the processes as the reason — rather than measure a GPU that
//! is shared, which would both slow the workload and give figures that mean nothing.
//!
//! The check runs before this process touches CUDA, so no process it finds is this test.
//! NVML reports host PIDs; in a container without the host's PID namespace they are
//! numbers to quote, not processes the agent can see. Without NVML (no driver) there is
//! nothing to check, and the test reports the missing driver itself.

/// The GPUs a test may use and the processes NVML reports on each.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuUse {
    pub index: u32,
    pub uuid: String,
    pub pids: Vec<u32>,
}

/// The reason to defer, or `None` when every GPU the test may use is free.
/// `visible` is the job's `CUDA_VISIBLE_DEVICES` (indices or UUIDs), when it sets one.
pub fn busy_reason(gpus: &[GpuUse], visible: Option<&str>) -> Option<String> {
    // As CUDA reads it: unset is every GPU, empty is none.
    let wanted = |g: &GpuUse| match visible.map(str::trim) {
        None => true,
        Some(list) => list.split(',').map(str::trim).any(|v| {
            v.parse::<u32>().ok() == Some(g.index)
                || (!v.is_empty() && g.uuid.starts_with(v) && v.starts_with("GPU-"))
        }),
    };
    let busy: Vec<String> = gpus
        .iter()
        .filter(|g| wanted(g) && !g.pids.is_empty())
        .map(|g| {
            let pids: Vec<String> = g.pids.iter().map(u32::to_string).collect();
            format!("GPU {} ({}): pid {}", g.index, g.uuid, pids.join(", "))
        })
        .collect();
    (!busy.is_empty()).then(|| {
        format!(
            "deferred: other processes use the GPU, so a test would disturb them and measure nothing reliable; {}",
            busy.join("; ")
        )
    })
}

/// Asks NVML; `None` when NVML cannot be loaded or initialised.
pub fn query() -> Option<Vec<GpuUse>> {
    let nvml = nvml_wrapper::Nvml::init().ok()?;
    let count = nvml.device_count().ok()?;
    let mut out = Vec::new();
    for index in 0..count {
        let Ok(dev) = nvml.device_by_index(index) else {
            continue;
        };
        let mut pids: Vec<u32> = Vec::new();
        for list in [
            dev.running_compute_processes(),
            dev.running_graphics_processes(),
        ]
        .into_iter()
        .flatten()
        {
            pids.extend(list.into_iter().map(|p| p.pid));
        }
        pids.sort_unstable();
        pids.dedup();
        out.push(GpuUse {
            index,
            uuid: dev.uuid().unwrap_or_default(),
            pids,
        });
    }
    Some(out)
}

/// The check the child runs before a GPU test; the job's environment is the child's.
pub fn check() -> Option<String> {
    let gpus = query()?;
    busy_reason(&gpus, std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32, pids: &[u32]) -> GpuUse {
        GpuUse {
            index,
            uuid: format!("GPU-0000000{index}-aaaa-bbbb-cccc-dddddddddddd"),
            pids: pids.to_vec(),
        }
    }

    #[test]
    fn free_gpus_let_the_test_run() {
        assert_eq!(busy_reason(&[gpu(0, &[]), gpu(1, &[])], None), None);
        assert_eq!(busy_reason(&[], None), None);
    }

    #[test]
    fn a_process_on_any_usable_gpu_defers_with_its_pid() {
        let why = busy_reason(&[gpu(0, &[]), gpu(1, &[4242, 77])], None).unwrap();
        assert!(why.starts_with("deferred: "), "{why}");
        assert!(
            why.contains("GPU 1 (GPU-00000001-aaaa-bbbb-cccc-dddddddddddd): pid 4242, 77"),
            "{why}"
        );
        assert!(!why.contains("GPU 0"), "{why}");
    }

    #[test]
    fn only_the_gpus_the_job_makes_visible_count() {
        let gpus = [gpu(0, &[]), gpu(1, &[4242]), gpu(2, &[])];
        assert_eq!(busy_reason(&gpus, Some("0,2")), None);
        assert!(busy_reason(&gpus, Some("2, 1")).is_some());
        assert!(busy_reason(&gpus, Some("GPU-00000001")).is_some());
        assert_eq!(busy_reason(&gpus, Some("GPU-00000000")), None);
        assert_eq!(busy_reason(&gpus, Some("")), None, "empty is no GPU");
    }
}
