//! The GPU×GPU and GPU×NIC matrix of `nvidia-smi topo -m`, computed from PCI sysfs and
//! NVML's NVLink table.

use std::collections::{BTreeMap, BTreeSet};

use heddle_types::facts::{GpuAffinity, GpuFacts, NumaNode, PciDevice, RdmaDevice, Topology};

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
    // Links whose far end NVML hid and whose peers were not inferred count as switch links
    // to every GPU; inferred links count only for the GPUs they reach.
    let switch_links: Vec<u32> = gpus
        .iter()
        .map(|g| {
            g.nvlinks
                .iter()
                .filter(|l| {
                    !l.peer_inferred && is_switch(l.remote_bdf.as_deref(), l.remote_kind.as_deref())
                })
                .count() as u32
        })
        .collect();
    let inferred = |a: &GpuFacts, b: &GpuFacts| {
        a.nvlinks
            .iter()
            .filter(|l| l.peer_inferred && l.peers.contains(&b.bdf))
            .count() as u32
    };
    let mut out = BTreeMap::new();
    for (i, a) in gpus.iter().enumerate() {
        for (j, b) in gpus.iter().enumerate() {
            if i == j {
                continue;
            }
            let direct = a
                .nvlinks
                .iter()
                .filter(|l| l.remote_bdf.as_deref() == Some(b.bdf.as_str()))
                .count() as u32;
            let through_hidden = inferred(a, b).min(inferred(b, a));
            let n = if direct > 0 {
                direct
            } else if through_hidden > 0 {
                through_hidden
            } else {
                switch_links[i].min(switch_links[j])
            };
            if n > 0 {
                out.insert((i, j), n);
            }
        }
    }
    out
}

/// The NUMA node whose CPUs include all of `cpus`, which is how `topo -m` fills its NUMA
/// Affinity column when the GPU's own `numa_node` is -1 (common in VMs).
fn numa_of_cpus(cpus: &str, nodes: &[NumaNode]) -> Option<u32> {
    let want = expand_cpulist(cpus)?;
    nodes
        .iter()
        .find(|n| {
            expand_cpulist(&n.cpulist).is_some_and(|have| !want.is_empty() && want.is_subset(&have))
        })
        .map(|n| n.id)
}

fn expand_cpulist(list: &str) -> Option<BTreeSet<u32>> {
    let mut out = BTreeSet::new();
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b): (u32, u32) = match part.split_once('-') {
            Some((a, b)) => (a.trim().parse().ok()?, b.trim().parse().ok()?),
            None => {
                let v: u32 = part.trim().parse().ok()?;
                (v, v)
            }
        };
        if b < a || b - a > 65_536 {
            return None;
        }
        out.extend(a..=b);
    }
    Some(out)
}

pub fn build(
    gpus: &[GpuFacts],
    rdma: &[RdmaDevice],
    pci: &[PciDevice],
    numa_nodes: &[NumaNode],
    nvlink_source: String,
) -> Topology {
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
    let gpu_affinity = gpus
        .iter()
        .map(|g| GpuAffinity {
            gpu: format!("GPU{}", g.index),
            cpu_affinity: g.cpu_affinity.clone(),
            numa_node: g.numa_node.or_else(|| {
                g.cpu_affinity
                    .as_deref()
                    .and_then(|c| numa_of_cpus(c, numa_nodes))
            }),
        })
        .collect();
    Topology {
        devices,
        matrix,
        gpu_affinity,
        nvlink_source,
    }
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
            out.push_str(
                &a.numa_node
                    .map(|n| n.to_string())
                    .unwrap_or_else(|| "N/A".into()),
            );
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
            nvlinks: links
                .iter()
                .map(|(l, r, k)| NvLink {
                    link: *l,
                    remote_bdf: Some(r.to_string()),
                    remote_kind: Some(k.to_string()),
                    ..Default::default()
                })
                .collect(),
        }
    }

    #[test]
    fn direct_links_are_counted_per_peer() {
        // DGX-1 GPU0: NV1 to GPU1, NV2 to GPU3 (two bonded links).
        let gpus = vec![
            gpu(
                0,
                "0000:06:00.0",
                &[
                    (0, "0000:07:00.0", "gpu"),
                    (1, "0000:0b:00.0", "gpu"),
                    (2, "0000:0b:00.0", "gpu"),
                ],
            ),
            gpu(1, "0000:07:00.0", &[(0, "0000:06:00.0", "gpu")]),
            gpu(
                3,
                "0000:0b:00.0",
                &[(0, "0000:06:00.0", "gpu"), (1, "0000:06:00.0", "gpu")],
            ),
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
        let gpus = vec![
            gpu(0, "0000:18:00.0", &sw),
            gpu(1, "0000:2a:00.0", &sw[..12]),
        ];
        let t = build(&gpus, &[], &[], &[], "NVML".into());
        assert_eq!(t.matrix, vec![vec!["X", "NV12"], vec!["NV12", "X"]]);
    }

    #[test]
    fn hidden_nvswitches_still_give_nv18() {
        // What NVML reports on a 2×H200 VM: 18 active links, remote unknown.
        let hidden = |g: &mut GpuFacts| {
            g.nvlinks = (0..18)
                .map(|l| NvLink {
                    link: l,
                    remote_bdf: None,
                    remote_kind: Some("unknown".into()),
                    ..Default::default()
                })
                .collect();
            g.numa_node = None;
            g.cpu_affinity = Some("0-31".into());
        };
        let (mut a, mut b) = (gpu(0, "0000:00:06.0", &[]), gpu(1, "0000:00:07.0", &[]));
        hidden(&mut a);
        hidden(&mut b);
        let nodes = [NumaNode {
            id: 0,
            cpulist: "0-31".into(),
            cpu_count: 32,
        }];
        let t = build(&[a, b], &[], &[], &nodes, "NVML".into());
        assert_eq!(t.matrix, vec![vec!["X", "NV18"], vec!["NV18", "X"]]);
        assert_eq!(
            t.gpu_affinity[0].numa_node,
            Some(0),
            "NUMA affinity derived from the CPU list"
        );
    }

    #[test]
    fn inferred_peers_count_only_where_p2p_reaches() {
        let inferred = |peers: &[&str]| -> Vec<NvLink> {
            (0..18)
                .map(|l| NvLink {
                    link: l,
                    remote_kind: Some("unknown".into()),
                    peers: peers.iter().map(|p| p.to_string()).collect(),
                    peer_inferred: !peers.is_empty(),
                    ..Default::default()
                })
                .collect()
        };
        let (mut a, mut b, mut c) = (
            gpu(0, "0000:00:06.0", &[]),
            gpu(1, "0000:00:07.0", &[]),
            gpu(2, "0000:00:08.0", &[]),
        );
        a.nvlinks = inferred(&["0000:00:07.0"]);
        b.nvlinks = inferred(&["0000:00:06.0"]);
        // GPU2's far ends are hidden and nothing was inferred for it: its links count as
        // switch links, which GPUs whose links were inferred do not share.
        c.nvlinks = inferred(&[]);
        let nv = nvlink_counts(&[a, b, c]);
        assert_eq!(nv.get(&(0, 1)), Some(&18));
        assert_eq!(nv.get(&(1, 0)), Some(&18));
        assert_eq!(nv.get(&(0, 2)), None, "{nv:?}");
    }

    #[test]
    fn cpu_lists_map_to_their_numa_node() {
        let nodes = [
            NumaNode {
                id: 0,
                cpulist: "0-19,40-59".into(),
                cpu_count: 40,
            },
            NumaNode {
                id: 1,
                cpulist: "20-39,60-79".into(),
                cpu_count: 40,
            },
        ];
        assert_eq!(numa_of_cpus("20-39,60-79", &nodes), Some(1));
        assert_eq!(numa_of_cpus("0-79", &nodes), None);
        assert_eq!(numa_of_cpus("junk", &nodes), None);
    }
}
