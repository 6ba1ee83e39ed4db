//! GPU ↔ NIC ↔ CPU affinity from the `nvidia-smi topo -m` style topology matrix.
//!
//! On a DGX-class machine each pair of GPUs shares a PCIe switch with one HCA; traffic from a
//! GPU through any other HCA crosses the CPU interconnect and loses an order of magnitude of
//! bandwidth. Per GPU this plugin reports the HCA behind the same switch (PIX, else PXB), that
//! HCA's network interface, and the GPU's NUMA node and CPU list, which is what a launcher
//! needs to pin one process per GPU.

use heddle_first_party_fabric::{self as fabric, LinkLayer, Port};
use heddle_plugin_sdk::{Detection, Facts, GpuAffinity, Info, Json, Plugin, PluginError};

pub struct DgxAffinity;

impl Plugin for DgxAffinity {
    fn info() -> Info {
        let mut reads = vec![
            "/host/dmi/product_name",
            "/topology/devices",
            "/topology/matrix",
            "/topology/gpu_affinity",
            "/gpus/*/cpu_affinity",
            "/gpus/*/numa_node",
        ];
        reads.extend_from_slice(fabric::READS);
        Info::new(
            "dgx-affinity",
            env!("CARGO_PKG_VERSION"),
            "Per-GPU closest HCA, netdev, NUMA node and CPUs from the PCIe topology; InfiniBand \
             HCA, port, bootstrap interface and UCX selection for NCCL/UCX",
        )
        .reads(&reads)
    }

    fn detect(facts: &Facts) -> Result<Detection, PluginError> {
        let mut d = Detection::default();
        let topo = Topology::read(facts)?;
        let ports = fabric::ports(facts);
        let (ifaces, live) = fabric::interfaces(facts);
        let infiniband = fabric::prefers_infiniband(&ports);
        // The ports NCCL and a launcher may use: the preferred fabric's usable ones.
        let usable: Vec<&Port> = ports
            .iter()
            .filter(|p| p.is_usable())
            .filter(|p| {
                if infiniband {
                    p.link_layer == LinkLayer::InfiniBand
                } else {
                    p.link_layer == LinkLayer::Ethernet && !fabric::is_transparent_vf(p, &ifaces)
                }
            })
            .collect();
        if let Some(product) = facts
            .str_at("/host/dmi/product_name")
            .filter(|p| p.contains("DGX"))
        {
            d.add_trait("platform.dgx", product.trim());
        }

        let near_nics = affinity(&topo, &usable, &ifaces, &mut d);
        if !infiniband {
            return Ok(d);
        }
        for p in ports
            .iter()
            .filter(|p| p.link_layer == LinkLayer::InfiniBand && !p.is_usable())
        {
            d.warn(p.dropped_warning());
        }
        let (selected, why): (Vec<&Port>, &str) = if near_nics.is_empty() {
            (
                usable.clone(),
                "the InfiniBand ports that are ACTIVE and LinkUp (no HCA shares a PCIe switch \
                 with a GPU, so all of them)",
            )
        } else {
            (
                near_nics
                    .iter()
                    .flat_map(|nic| usable.iter().filter(move |p| p.device == *nic))
                    .copied()
                    .collect(),
                "the InfiniBand HCAs behind a GPU's PCIe switch whose port is ACTIVE and LinkUp, \
                 in GPU order; HCAs near no GPU (storage, management) and dead ports are left \
                 out",
            )
        };
        d.recommend(
            "NCCL_IB_HCA",
            &fabric::nccl_hca_list(&selected),
            &format!(
                "{why}. The leading `=` makes NCCL match names exactly; without it mlx5_1 \
                 would also take mlx5_10 to mlx5_19"
            ),
        );
        fabric::recommend_ucx(&mut d, &selected, fabric::gpu_count(facts), "InfiniBand");
        let (ifname, skipped) = fabric::ipoib_ifname(&selected, &ifaces, live);
        match ifname {
            Some(ifname) => {
                d.recommend(
                    "NCCL_SOCKET_IFNAME",
                    &ifname,
                    "the IPoIB interface of a selected HCA, so NCCL's bootstrap and socket \
                     fallback run over the InfiniBand fabric rather than the management network; \
                     `=` for an exact match (ib1 would also take ib10)",
                );
            }
            None if !skipped.is_empty() => {
                d.warn(format!(
                    "no IPoIB interface to carry NCCL's bootstrap ({}); NCCL will pick another \
                     interface. Give it an address and bring it up (`ip addr add … dev ib0`, `ip link \
                     set ib0 up`; on Azure, OS.EnableRDMA=y in /etc/waagent.conf) so the \
                     bootstrap runs over the fabric",
                    skipped.join(", ")
                ));
            }
            None => {}
        }
        Ok(d)
    }
}

heddle_plugin_sdk::export_plugin!(DgxAffinity);

/// Per GPU: the closest usable port's device if it shares a PCIe switch with the GPU, the
/// GPU's CPUs and NUMA node. Returns the GPU-local devices in GPU order.
fn affinity<'t>(
    topo: &Topology<'t>,
    usable: &[&Port],
    ifaces: &[fabric::Iface],
    d: &mut Detection,
) -> Vec<&'t str> {
    let mut near_nics: Vec<&str> = Vec::new();
    if topo.gpus.is_empty() || topo.nics.is_empty() {
        return near_nics;
    }
    let mut far = Vec::new();
    for &(gpu_index, row) in &topo.gpus {
        let best = topo
            .nics
            .iter()
            .filter(|(_, nic)| usable.iter().any(|p| p.device == *nic))
            .filter_map(|&(col, nic)| {
                let label = topo.cell(row, col)?;
                Some((rank(label)?, label, nic))
            })
            .min_by_key(|(r, _, _)| *r);
        let (cpus, numa) = topo.gpu_cpus(gpu_index);
        let mut aff = GpuAffinity {
            gpu: gpu_index,
            cpus,
            numa,
            nic: None,
            netdev: None,
        };
        match best {
            Some((r, _, nic)) if r <= NEAR => {
                // The device's interface in this network namespace (in a pod, its Multus
                // interface rather than the host's bond), else its first one.
                aff.netdev = usable.iter().find(|p| p.device == nic).and_then(|p| {
                    p.netdevs
                        .iter()
                        .find(|n| ifaces.iter().any(|i| &i.name == *n))
                        .or(p.netdevs.first())
                        .cloned()
                });
                aff.nic = usable.iter().find(|p| p.device == nic).map(|p| {
                    if p.ports_on_device > 1 {
                        p.ucx_name()
                    } else {
                        nic.to_string()
                    }
                });
                if !near_nics.contains(&nic) {
                    near_nics.push(nic);
                }
            }
            Some((_, label, nic)) => far.push(format!("GPU{gpu_index} (closest {nic}: {label})")),
            None => far.push(format!("GPU{gpu_index}")),
        }
        d.affinity.push(aff);
    }
    d.add_trait("topology.gpus", &topo.gpus.len().to_string());
    d.add_trait("topology.nics_near_gpus", &near_nics.len().to_string());
    if !far.is_empty() {
        d.warn(format!(
            "no usable RDMA port shares a PCIe switch (PIX/PXB) with {}; GPUDirect RDMA for \
             these GPUs crosses the host bridge or CPU interconnect",
            far.join(", ")
        ));
    }
    if !near_nics.is_empty() {
        let gpus_per_nic = topo.gpus.len().div_ceil(near_nics.len());
        d.add_trait("topology.gpus_per_nic", &gpus_per_nic.to_string());
    }
    near_nics
}

/// Rank of PXB: at most this is "behind the same PCIe switch".
const NEAR: u8 = 2;

/// Lower is closer. `NV#` is GPU↔GPU only and never appears between a GPU and a NIC.
fn rank(label: &str) -> Option<u8> {
    Some(match label.trim() {
        "PIX" => 1,
        "PXB" => 2,
        "PHB" => 3,
        "NODE" => 4,
        "SYS" => 5,
        _ => return None,
    })
}

/// The topology matrix, borrowed from the facts.
struct Topology<'a> {
    matrix: Vec<Vec<Json<'a>>>,
    /// (GPU index, row)
    gpus: Vec<(u32, usize)>,
    /// (column, device name)
    nics: Vec<(usize, &'a str)>,
    /// `/topology/gpu_affinity` and `/gpus`, each GPU's CPU and NUMA columns.
    affinity: Vec<Json<'a>>,
    gpu_facts: Vec<Json<'a>>,
}

impl<'a> Topology<'a> {
    fn read(facts: &'a Facts) -> Result<Self, PluginError> {
        let labels: Vec<&str> = facts
            .get("/topology/devices")
            .and_then(Json::as_array)
            .map(|a| a.filter_map(Json::as_str).collect())
            .unwrap_or_default();
        let matrix: Vec<Vec<Json>> = facts
            .get("/topology/matrix")
            .and_then(Json::as_array)
            .map(|rows| {
                rows.map(|r| r.as_array().map(Iterator::collect).unwrap_or_default())
                    .collect()
            })
            .unwrap_or_default();
        if !matrix.is_empty()
            && (matrix.len() != labels.len() || matrix.iter().any(|r| r.len() != labels.len()))
        {
            return Err(PluginError::bad_facts(format!(
                "topology matrix is not {n}x{n} for {n} devices",
                n = labels.len()
            )));
        }
        let mut gpus = Vec::new();
        let mut nics = Vec::new();
        for (i, label) in labels.into_iter().enumerate() {
            match label
                .strip_prefix("GPU")
                .and_then(|n| n.parse::<u32>().ok())
            {
                Some(n) => gpus.push((n, i)),
                None => nics.push((i, label)),
            }
        }
        if matrix.is_empty() {
            gpus.clear();
        }
        let items = |pointer: &str| {
            facts
                .get(pointer)
                .and_then(Json::as_array)
                .map(Iterator::collect)
                .unwrap_or_default()
        };
        Ok(Self {
            matrix,
            gpus,
            nics,
            affinity: items("/topology/gpu_affinity"),
            gpu_facts: items("/gpus"),
        })
    }

    fn cell(&self, row: usize, col: usize) -> Option<&'a str> {
        self.matrix
            .get(row)?
            .get(col)
            .map(|v| v.as_str().unwrap_or("?"))
    }

    /// CPU list and NUMA node from the topology's affinity columns, else from the GPU's own
    /// facts.
    fn gpu_cpus(&self, index: u32) -> (String, Option<i32>) {
        let label = format!("GPU{index}");
        let topo = self
            .affinity
            .iter()
            .find(|a| a.get("gpu").and_then(Json::as_str) == Some(label.as_str()));
        let gpu = self
            .gpu_facts
            .iter()
            .find(|g| g.get("index").and_then(Json::as_u64) == Some(index.into()));
        let pick = |key_topo: &str, key_gpu: &str| {
            topo.and_then(|a| a.get(key_topo))
                .filter(|v| !v.is_null())
                .or_else(|| gpu.and_then(|g| g.get(key_gpu)))
        };
        let cpus = pick("cpu_affinity", "cpu_affinity")
            .and_then(Json::as_str)
            .unwrap_or_default()
            .to_string();
        let numa = pick("numa_node", "numa_node")
            .and_then(Json::as_i64)
            .and_then(|n| i32::try_from(n).ok());
        (cpus, numa)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use heddle_plugin_sdk::serde_json::Value;
    use heddle_plugin_sdk::serde_json::{self, json};

    fn detect(json: &str) -> Detection {
        heddle_plugin_sdk::run::<DgxAffinity>(json).unwrap()
    }

    #[test]
    fn dgx1_pairs_each_gpu_with_its_switch_hca() {
        let d = detect(include_str!("../../../fixtures/dgx1.json"));
        let nics: Vec<_> = d
            .affinity
            .iter()
            .map(|a| a.nic.as_deref().unwrap())
            .collect();
        // The seed's matrix orders columns mlx5_0, mlx5_2, mlx5_1, mlx5_3.
        assert_eq!(
            nics,
            [
                "mlx5_0", "mlx5_0", "mlx5_1", "mlx5_1", "mlx5_2", "mlx5_2", "mlx5_3", "mlx5_3"
            ]
        );
        // The seed's launcher uses interface "ib" + str(gpu // 2).
        let netdevs: Vec<_> = d
            .affinity
            .iter()
            .map(|a| a.netdev.as_deref().unwrap())
            .collect();
        assert_eq!(
            netdevs,
            ["ib0", "ib0", "ib1", "ib1", "ib2", "ib2", "ib3", "ib3"]
        );
        assert_eq!(d.affinity[0].cpus, "0-19,40-59");
        assert_eq!(d.affinity[0].numa, Some(0));
        assert_eq!(d.affinity[7].cpus, "20-39,60-79");
        assert_eq!(d.affinity[7].numa, Some(1));
        assert_eq!(
            d.env_value("NCCL_IB_HCA"),
            Some("=mlx5_0,mlx5_1,mlx5_2,mlx5_3")
        );
        assert_eq!(
            d.env_value("UCX_NET_DEVICES"),
            Some("mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1")
        );
        // Seeds 000 and 004: rc plus the CUDA transports, and ib0 for the bootstrap.
        assert_eq!(d.env_value("UCX_TLS"), Some("rc,cuda_copy,cuda_ipc"));
        assert_eq!(d.env_value("UCX_MEMTYPE_CACHE"), Some("n"));
        assert_eq!(d.env_value("NCCL_SOCKET_IFNAME"), Some("=ib0"));
        assert_eq!(d.trait_value("topology.gpus_per_nic"), Some("2"));
        assert_eq!(d.trait_value("platform.dgx"), Some("DGX-1 with V100-32"));
        assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    }

    #[test]
    fn azure_node_gets_cpus_no_nic_and_every_usable_ib_hca() {
        let d = detect(include_str!("../../../fixtures/azure-nd40rs-v2.json"));
        assert_eq!(d.affinity.len(), 8);
        assert!(
            d.affinity
                .iter()
                .all(|a| a.nic.is_none() && a.cpus == "0-19" && a.numa == Some(0))
        );
        assert!(d.warnings[0].contains("GPU0 (closest mlx5_0: NODE)"));
        // No HCA is GPU-local, so every usable InfiniBand port; never the Ethernet VF.
        assert_eq!(d.env_value("NCCL_IB_HCA"), Some("=mlx5_0"));
        assert_eq!(d.env_value("UCX_NET_DEVICES"), Some("mlx5_0:1"));
        // The IPoIB interface is down: no bootstrap interface, a warning instead.
        assert_eq!(d.env_value("NCCL_SOCKET_IFNAME"), None);
        assert!(
            d.warnings[1].contains("ibP59423s2 is not up"),
            "{:?}",
            d.warnings
        );
    }

    #[test]
    fn a_dead_port_is_dropped_everywhere_and_reported_with_its_state() {
        let mut f: Value =
            serde_json::from_str(include_str!("../../../fixtures/dgx1.json")).unwrap();
        assert_eq!(f["rdma"]["devices"][1]["name"], "mlx5_1");
        let port = &mut f["rdma"]["devices"][1]["ports"][0];
        port["state"] = json!("DOWN");
        port["phys_state"] = json!("2: Polling");
        let d = detect(&f.to_string());
        assert_eq!(d.env_value("NCCL_IB_HCA"), Some("=mlx5_0,mlx5_2,mlx5_3"));
        assert_eq!(
            d.env_value("UCX_NET_DEVICES"),
            Some("mlx5_0:1,mlx5_2:1,mlx5_3:1")
        );
        // GPU2 and GPU3 lose their switch-local HCA; the launcher map says so.
        assert_eq!(d.affinity[2].nic, None);
        assert!(
            d.warnings
                .iter()
                .any(|w| w.contains("mlx5_1 port 1 is DOWN (physical state 2: Polling)")),
            "{:?}",
            d.warnings
        );
        assert!(d.warnings.iter().any(|w| w.contains("GPU2 (closest")));
        // ACTIVE but not LinkUp counts as dead too.
        let mut f: Value =
            serde_json::from_str(include_str!("../../../fixtures/dgx1.json")).unwrap();
        f["rdma"]["devices"][3]["ports"][0]["phys_state"] = json!("4: PortConfigurationTraining");
        let d = detect(&f.to_string());
        assert_eq!(d.env_value("NCCL_IB_HCA"), Some("=mlx5_0,mlx5_1,mlx5_2"));
    }

    #[test]
    fn two_port_hcas_are_named_with_their_port() {
        let mut f: Value =
            serde_json::from_str(include_str!("../../../fixtures/dgx1.json")).unwrap();
        let mut second = f["rdma"]["devices"][0]["ports"][0].clone();
        second["port"] = json!(2);
        second["state"] = json!("DOWN");
        second["phys_state"] = json!("3: Disabled");
        f["rdma"]["devices"][0]["ports"]
            .as_array_mut()
            .unwrap()
            .push(second);
        let d = detect(&f.to_string());
        assert_eq!(
            d.env_value("NCCL_IB_HCA"),
            Some("=mlx5_0:1,mlx5_1,mlx5_2,mlx5_3")
        );
        assert_eq!(d.affinity[0].nic.as_deref(), Some("mlx5_0:1"));
    }

    #[test]
    fn pxb_counts_as_near_and_pix_beats_it() {
        let mut f: Value =
            serde_json::from_str(include_str!("../../../fixtures/dgx1.json")).unwrap();
        // GPU0: make mlx5_2 (column 9) PXB while mlx5_0 stays PIX; then drop mlx5_0 to SYS.
        f["topology"]["matrix"][0][9] = json!("PXB");
        assert_eq!(
            detect(&f.to_string()).affinity[0].nic.as_deref(),
            Some("mlx5_0")
        );
        f["topology"]["matrix"][0][8] = json!("SYS");
        assert_eq!(
            detect(&f.to_string()).affinity[0].nic.as_deref(),
            Some("mlx5_2")
        );
    }

    #[test]
    fn malformed_matrix_is_an_error_and_no_topology_still_selects_hcas() {
        let mut f: Value =
            serde_json::from_str(include_str!("../../../fixtures/dgx1.json")).unwrap();
        f["topology"]["matrix"][3] = json!(["X"]);
        let err = heddle_plugin_sdk::run::<DgxAffinity>(&f.to_string()).unwrap_err();
        assert_eq!(err.code, "bad-facts");
        f["topology"] =
            json!({"devices": [], "matrix": [], "gpu_affinity": [], "nvlink_source": ""});
        // No per-GPU map, but an InfiniBand node still gets its usable HCAs.
        let d = detect(&f.to_string());
        assert!(d.affinity.is_empty());
        assert_eq!(
            d.env_value("NCCL_IB_HCA"),
            Some("=mlx5_0,mlx5_1,mlx5_2,mlx5_3")
        );
        f["rdma"]["devices"] = json!([]);
        let d = detect(&f.to_string());
        assert!(d.env.is_empty() && d.warnings.is_empty(), "{d:?}");
    }
}
