//! GPU ↔ NIC ↔ CPU affinity from the `nvidia-smi topo -m` style topology matrix.
//!
//! On a DGX-class machine each pair of GPUs shares a PCIe switch with one HCA; traffic from a
//! GPU through any other HCA crosses the CPU interconnect and loses an order of magnitude of
//! bandwidth. Per GPU this plugin reports the HCA behind the same switch (PIX, else PXB), that
//! HCA's network interface, and the GPU's NUMA node and CPU list, which is what a launcher
//! needs to pin one process per GPU.

use heddle_plugin_sdk::facts::entries;
use heddle_plugin_sdk::{Detection, Facts, GpuAffinity, Info, Json, Plugin, PluginError};

pub struct DgxAffinity;

impl Plugin for DgxAffinity {
    fn info() -> Info {
        Info::new(
            "dgx-affinity",
            env!("CARGO_PKG_VERSION"),
            "Per-GPU closest HCA, netdev, NUMA node and CPUs from the PCIe topology; NIC orderings for NCCL/UCX",
        )
        .reads(&[
            "/host/dmi/product_name",
            "/topology/devices",
            "/topology/matrix",
            "/topology/gpu_affinity",
            "/gpus/*/index",
            "/gpus/*/cpu_affinity",
            "/gpus/*/numa_node",
            "/rdma/devices/*/name",
            "/rdma/devices/*/netdevs",
            "/rdma/devices/*/ports/*/port",
            "/rdma/devices/*/ports/*/state",
        ])
    }

    fn detect(facts: &Facts) -> Result<Detection, PluginError> {
        let mut d = Detection::default();
        let topo = Topology::read(facts)?;
        if topo.gpus.is_empty() || topo.nics.is_empty() {
            return Ok(d);
        }
        if let Some(product) = facts
            .str_at("/host/dmi/product_name")
            .filter(|p| p.contains("DGX"))
        {
            d.add_trait("platform.dgx", product.trim());
        }

        let mut far = Vec::new();
        let mut near_nics: Vec<&str> = Vec::new();
        for &(gpu_index, row) in &topo.gpus {
            let best = topo
                .nics
                .iter()
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
                    aff.netdev = topo.netdev_of(nic);
                    aff.nic = Some(nic.to_string());
                    if !near_nics.contains(&nic) {
                        near_nics.push(nic);
                    }
                }
                Some((_, label, nic)) => {
                    far.push(format!("GPU{gpu_index} (closest {nic}: {label})"))
                }
                None => far.push(format!("GPU{gpu_index}")),
            }
            d.affinity.push(aff);
        }

        d.add_trait("topology.gpus", &topo.gpus.len().to_string());
        d.add_trait("topology.nics_near_gpus", &near_nics.len().to_string());
        if !far.is_empty() {
            d.warn(format!(
                "no RDMA NIC shares a PCIe switch (PIX/PXB) with {}; GPUDirect RDMA for these GPUs \
                 crosses the host bridge or CPU interconnect",
                far.join(", ")
            ));
        }
        if near_nics.is_empty() {
            return Ok(d);
        }
        let gpus_per_nic = topo.gpus.len().div_ceil(near_nics.len());
        d.add_trait("topology.gpus_per_nic", &gpus_per_nic.to_string());

        d.recommend(
            "NCCL_IB_HCA",
            &near_nics.join(","),
            "the HCAs that sit behind a GPU's PCIe switch, in GPU order; HCAs near no GPU (storage, \
             management) are left out so NCCL does not route GPU traffic through them",
        );
        let ucx: Vec<String> = near_nics
            .iter()
            .map(|nic| format!("{nic}:{}", topo.active_port(nic)))
            .collect();
        d.recommend(
            "UCX_NET_DEVICES",
            &ucx.join(","),
            "the GPU-local HCAs in GPU order; for one process per GPU narrow it to that GPU's own \
             device from the affinity table (e.g. GPU0 -> its `nic`:port)",
        );
        Ok(d)
    }
}

heddle_plugin_sdk::export_plugin!(DgxAffinity);

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
    /// `/rdma/devices`, a list or a map by name.
    devices: Option<Json<'a>>,
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
            devices: facts.get("/rdma/devices"),
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

    /// The RDMA device called `name`, whether the agent listed devices as an array or a map.
    fn rdma_device(&self, name: &str) -> Option<Json<'a>> {
        let devices = self.devices?;
        match devices.as_array() {
            Some(mut devs) => devs.find(|d| d.get("name").and_then(Json::as_str) == Some(name)),
            None => devices.get(name),
        }
    }

    fn netdev_of(&self, nic: &str) -> Option<String> {
        self.rdma_device(nic)?
            .get("netdevs")?
            .get(0)?
            .as_str()
            .map(str::to_string)
    }

    /// UCX names devices `mlx5_0:1`; use the first ACTIVE port, else port 1.
    fn active_port(&self, nic: &str) -> u64 {
        self.rdma_device(nic)
            .and_then(|dev| dev.get("ports"))
            .map(entries)
            .unwrap_or_default()
            .into_iter()
            .find(|(_, p)| p.get("state").and_then(Json::as_str) == Some("ACTIVE"))
            .and_then(|(_, p)| p.get("port").and_then(Json::as_u64))
            .unwrap_or(1)
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
            Some("mlx5_0,mlx5_1,mlx5_2,mlx5_3")
        );
        assert_eq!(
            d.env_value("UCX_NET_DEVICES"),
            Some("mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1")
        );
        assert_eq!(d.trait_value("topology.gpus_per_nic"), Some("2"));
        assert_eq!(d.trait_value("platform.dgx"), Some("DGX-1 with V100-32"));
        assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    }

    #[test]
    fn azure_node_gets_cpus_but_no_nic_and_one_warning() {
        let d = detect(include_str!("../../../fixtures/azure-nd40rs-v2.json"));
        assert_eq!(d.affinity.len(), 8);
        assert!(
            d.affinity
                .iter()
                .all(|a| a.nic.is_none() && a.cpus == "0-19" && a.numa == Some(0))
        );
        assert_eq!(d.warnings.len(), 1);
        assert!(d.warnings[0].contains("GPU0 (closest mlx5_0: NODE)"));
        assert!(d.env.is_empty());
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
    fn malformed_matrix_is_an_error_and_no_topology_does_not_apply() {
        let mut f: Value =
            serde_json::from_str(include_str!("../../../fixtures/dgx1.json")).unwrap();
        f["topology"]["matrix"][3] = json!(["X"]);
        let err = heddle_plugin_sdk::run::<DgxAffinity>(&f.to_string()).unwrap_err();
        assert_eq!(err.code, "bad-facts");
        f["topology"] =
            json!({"devices": [], "matrix": [], "gpu_affinity": [], "nvlink_source": ""});
        assert!(detect(&f.to_string()).is_empty());
    }
}
