//! The GPU×GPU and GPU×NIC matrix of `nvidia-smi topo -m`, computed from PCI sysfs and
//! NVML's NVLink table.

use std::collections::BTreeMap;

use heddle_types::facts::{GpuAffinity, GpuFacts, PciDevice, RdmaDevice, Topology};

use super::pci::{PciLocation, distance};

/// Number of NVLinks between every ordered pair of GPUs (by position in `gpus`).
///
/// Direct links count one each. On NVSwitch systems every link ends at a switch, and
/// `topo -m` reports the smaller of the two GPUs' switch-link counts (NV18 on HGX H100).
pub fn nvlink_counts(gpus: &[GpuFacts]) -> BTreeMap<(usize, usize), u32> {
    let is_switch = |remote: Option<&str>, kind: Option<&str>| match kind {
        Some("switch") => true,
        Some("gpu") => false,
        _ => !gpus.iter().any(|g| Some(g.bdf.as_str()) == remote),
    };
    let switch_links: Vec<u32> = gpus.iter().map(|g| g.nvlinks.iter().filter(|l| is_switch(l.remote_bdf.as_deref(), l.remote_kind.as_deref())).count() as u32).collect();
    let mut out = BTreeMap::new();
    for (i, a) in gpus.iter().enumerate() {
        for (j, b) in gpus.iter().enumerate() {
            if i == j {
                continue;
            }
            let direct = a.nvlinks.iter().filter(|l| l.remote_bdf.as_deref() == Some(b.bdf.as_str())).count() as u32;
            let n = if direct > 0 { direct } else { switch_links[i].min(switch_links[j]) };
            if n > 0 {
                out.insert((i, j), n);
            }
        }
    }
    out
}

pub fn build(gpus: &[GpuFacts], rdma: &[RdmaDevice], pci: &[PciDevice], nvlink_source: String) -> Topology {
    let location = |bdf: Option<&str>| -> Option<PciLocation> {
        let dev = pci.iter().find(|d| Some(d.bdf.as_str()) == bdf)?;
        PciLocation::from_path(dev.sysfs_path.as_deref()?, dev.numa_node)
    };
    let mut devices = Vec::new();
    let mut locations = Vec::new();
    for g in gpus {
        devices.push(format!("GPU{}", g.index));
        locations.push(location(Some(&g.bdf)));
    }
    for r in rdma {
        devices.push(r.name.clone());
        locations.push(location(r.pci_bdf.as_deref()));
    }
    let nv = nvlink_counts(gpus);
    let n = devices.len();
    let mut matrix = vec![vec![String::new(); n]; n];
    for i in 0..n {
        for j in 0..n {
            matrix[i][j] = if i == j {
                "X".to_string()
            } else if let Some(count) = nv.get(&(i, j)) {
                format!("NV{count}")
            } else {
                match (&locations[i], &locations[j]) {
                    (Some(a), Some(b)) => distance(a, b).to_string(),
                    _ => "?".to_string(),
                }
            };
        }
    }
    let gpu_affinity = gpus.iter().map(|g| GpuAffinity { gpu: format!("GPU{}", g.index), cpu_affinity: g.cpu_affinity.clone(), numa_node: g.numa_node }).collect();
    Topology { devices, matrix, gpu_affinity, nvlink_source }
}

/// Renders the matrix like `nvidia-smi topo -m` (tab-separated, with CPU and NUMA
/// affinity columns), for humans and for comparing with captured output.
pub fn render(t: &Topology) -> String {
    let mut out = String::from("\t");
    out.push_str(&t.devices.join("\t"));
    out.push_str("\tCPU Affinity\tNUMA Affinity\n");
    for (i, row) in t.matrix.iter().enumerate() {
        out.push_str(&t.devices[i]);
        for cell in row {
            out.push('\t');
            out.push_str(cell);
        }
        if let Some(a) = t.gpu_affinity.iter().find(|a| a.gpu == t.devices[i]) {
            out.push('\t');
            out.push_str(a.cpu_affinity.as_deref().unwrap_or("N/A"));
            out.push('\t');
            out.push_str(&a.numa_node.map(|n| n.to_string()).unwrap_or_else(|| "N/A".into()));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use heddle_types::facts::NvLink;

    fn gpu(index: u32, bdf: &str, links: &[(u32, &str, &str)]) -> GpuFacts {
        GpuFacts {
            index,
            bdf: bdf.into(),
            device_id: "0x1db1".into(),
            name: None,
            name_source: None,
            uuid: None,
            memory_total_bytes: None,
            numa_node: Some(0),
            cpu_affinity: None,
            nvlinks: links.iter().map(|(l, r, k)| NvLink { link: *l, remote_bdf: Some(r.to_string()), remote_kind: Some(k.to_string()) }).collect(),
        }
    }

    #[test]
    fn direct_links_are_counted_per_peer() {
        // DGX-1 GPU0: NV1 to GPU1, NV2 to GPU3 (two bonded links).
        let gpus = vec![
            gpu(0, "0000:06:00.0", &[(0, "0000:07:00.0", "gpu"), (1, "0000:0b:00.0", "gpu"), (2, "0000:0b:00.0", "gpu")]),
            gpu(1, "0000:07:00.0", &[(0, "0000:06:00.0", "gpu")]),
            gpu(3, "0000:0b:00.0", &[(0, "0000:06:00.0", "gpu"), (1, "0000:06:00.0", "gpu")]),
        ];
        let nv = nvlink_counts(&gpus);
        assert_eq!(nv.get(&(0, 1)), Some(&1));
        assert_eq!(nv.get(&(0, 2)), Some(&2));
        assert_eq!(nv.get(&(2, 0)), Some(&2));
        assert_eq!(nv.get(&(1, 2)), None);
    }

    #[test]
    fn nvswitch_links_give_the_smaller_count() {
        let sw: Vec<(u32, &str, &str)> = (0..18).map(|l| (l, "0000:05:00.0", "switch")).collect();
        let gpus = vec![gpu(0, "0000:18:00.0", &sw), gpu(1, "0000:2a:00.0", &sw[..12])];
        let t = build(&gpus, &[], &[], "NVML".into());
        assert_eq!(t.matrix, vec![vec!["X", "NV12"], vec!["NV12", "X"]]);
    }
}
