//! Azure ND-series detector.
//!
//! Azure VMs all report DMI `Microsoft Corporation` / `Virtual Machine` and the Azure chassis
//! asset tag; the SKU itself is not exposed inside the guest, so it is guessed from the GPU
//! model and count. The trap this plugin exists for: RDMA-capable ND SKUs show two verbs
//! devices, the InfiniBand `mlx5_*` HCA and an `rdmaP…` device that is the Ethernet
//! accelerated-networking VF. NCCL must use only the former.

use heddle_first_party_fabric as fabric;
use heddle_plugin_sdk::facts::entries;
use heddle_plugin_sdk::{Detection, Facts, Info, Json, Plugin, PluginError};

/// The chassis asset tag every Azure VM reports.
pub const AZURE_ASSET_TAG: &str = "7783-7084-3265-9085-8269-3286-77";

pub struct AzureNd;

impl Plugin for AzureNd {
    fn info() -> Info {
        Info::new(
            "azure-nd",
            env!("CARGO_PKG_VERSION"),
            "Azure ND-series VMs: SKU guess, InfiniBand HCA selection for NCCL, waagent RDMA check",
        )
        .reads(
            &[
                "/host/dmi/sys_vendor",
                "/host/dmi/product_name",
                "/host/dmi/chassis_asset_tag",
                "/host/azure_enable_rdma",
                "/gpus/*/name",
                "/rdma/devices/*/name",
                "/rdma/devices/*/netdevs",
                "/rdma/devices/*/ports/*/link_layer",
                "/rdma/devices/*/ports/*/state",
            ]
            .into_iter()
            .chain(fabric::READS.iter().copied())
            .collect::<Vec<_>>(),
        )
    }

    fn detect(facts: &Facts) -> Result<Detection, PluginError> {
        let mut d = Detection::default();
        if !is_azure(facts) {
            return Ok(d);
        }
        d.add_trait("cloud", "azure");

        let gpus = gpu_names(facts);
        if let Some(model) = gpus.first() {
            d.add_trait("azure.gpu", &format!("{}x {model}", gpus.len()));
        }

        let devices = rdma_devices(facts);
        let ib_devices: Vec<&RdmaDev> = devices
            .iter()
            .filter(|dev| dev.link_layer.eq_ignore_ascii_case("infiniband"))
            .collect();

        if let Some(sku) = guess_sku(&gpus, !ib_devices.is_empty()) {
            d.add_trait("azure.sku", sku);
            if let Some(gbits) = ib_rate_gbits(sku).filter(|_| !ib_devices.is_empty()) {
                // perftest reports per HCA; 90 % of line rate is what a healthy port sustains.
                for test in ["rdma.ib_write_bw", "rdma.ib_read_bw", "rdma.ib_send_bw"] {
                    d.expect(
                        test,
                        "algbw_gbs",
                        1 << 16,
                        gbits / 8.0 * 0.9,
                        &format!("azure-nd: {sku} has {gbits} Gb/s InfiniBand per HCA (Azure ND-series documentation); 90 % of line rate"),
                    );
                }
            }
        }

        for dev in devices
            .iter()
            .filter(|dev| dev.link_layer.eq_ignore_ascii_case("ethernet"))
        {
            d.warn(format!(
                "{} is the Ethernet accelerated-networking device (link layer Ethernet{}); do not use it \
                 for NCCL: NCCL_IB_HCA must name only the InfiniBand HCA(s)",
                dev.name,
                dev.netdev.as_deref().map(|n| format!(", netdev {n}")).unwrap_or_default()
            ));
        }

        let ports = fabric::ports(facts);
        let usable_ib: Vec<&fabric::Port> = ports
            .iter()
            .filter(|p| p.link_layer == fabric::LinkLayer::InfiniBand && p.is_usable())
            .collect();
        if !usable_ib.is_empty() {
            // NCCL_IB_HCA and UCX come from the InfiniBand selection every IB node gets
            // (dgx-affinity), which never takes an Ethernet-link-layer device.
            d.add_trait("rdma.fabric", "infiniband");
        } else if !ib_devices.is_empty() {
            d.warn(format!(
                "InfiniBand device(s) {} have no ACTIVE, LinkUp port; NCCL will fall back to TCP. \
                 Check `ibstat` and that the VM was deployed in an InfiniBand-enabled scale set or \
                 availability set",
                ib_devices
                    .iter()
                    .map(|dev| dev.name.as_str())
                    .collect::<Vec<_>>()
                    .join(",")
            ));
        }

        recommend_socket_ifname(facts, &usable_ib, &mut d);

        // Every SKU in the guess table is an RDMA SKU.
        let rdma_sku = d.trait_value("azure.sku").is_some() || !ib_devices.is_empty();
        if rdma_sku && facts.get("/host/azure_enable_rdma").and_then(Json::as_bool) != Some(true) {
            d.warn(
                "OS.EnableRDMA is not set to y in /etc/waagent.conf: the InfiniBand interface will not \
                 get an IPoIB address; set OS.EnableRDMA=y and reboot",
            );
        }
        Ok(d)
    }
}

heddle_plugin_sdk::export_plugin!(AzureNd);

fn is_azure(facts: &Facts) -> bool {
    let vendor = facts.str_at("/host/dmi/sys_vendor").unwrap_or_default();
    let product = facts.str_at("/host/dmi/product_name").unwrap_or_default();
    let tag = facts
        .str_at("/host/dmi/chassis_asset_tag")
        .unwrap_or_default();
    tag.trim() == AZURE_ASSET_TAG
        || (vendor.trim() == "Microsoft Corporation" && product.trim() == "Virtual Machine")
}

fn gpu_names(facts: &Facts) -> Vec<String> {
    facts
        .entries("/gpus")
        .into_iter()
        .map(|(_, g)| {
            g.get("name")
                .and_then(Json::as_str)
                .unwrap_or("unknown NVIDIA GPU")
                .to_string()
        })
        .collect()
}

/// Azure does not expose the SKU to the guest; this table maps what is visible to the ND SKUs
/// that have it. `None` rather than a wrong guess for anything else.
fn guess_sku(gpus: &[String], has_ib: bool) -> Option<&'static str> {
    let model = gpus.first()?.to_ascii_uppercase();
    let count = gpus.len();
    let sku = match (count, has_ib) {
        (8, true) if model.contains("V100") => "ND40rs_v2",
        (8, _) if model.contains("A100") && model.contains("80") => "ND96amsr_A100_v4",
        (8, _) if model.contains("A100") => "ND96asr_v4",
        (8, _) if model.contains("H100") => "ND96isr_H100_v5",
        (8, _) if model.contains("H200") => "ND96isr_H200_v5",
        (8, _) if model.contains("MI300X") => "ND96isr_MI300X_v5",
        (4, true) if model.contains("P40") => "ND24rs",
        _ => return None,
    };
    Some(sku)
}

/// InfiniBand line rate per HCA of each RDMA SKU, from Azure's ND-series documentation.
fn ib_rate_gbits(sku: &str) -> Option<f64> {
    Some(match sku {
        "ND40rs_v2" | "ND24rs" => 100.0,
        "ND96asr_v4" | "ND96amsr_A100_v4" => 200.0,
        "ND96isr_H100_v5" | "ND96isr_H200_v5" | "ND96isr_MI300X_v5" => 400.0,
        _ => return None,
    })
}

struct RdmaDev {
    name: String,
    link_layer: String,
    netdev: Option<String>,
}

fn rdma_devices(facts: &Facts) -> Vec<RdmaDev> {
    facts
        .entries("/rdma/devices")
        .into_iter()
        .map(|(name, dev)| {
            let ports = dev.get("ports").map(entries).unwrap_or_default();
            let link_layer = ports
                .iter()
                .find_map(|(_, p)| p.get("link_layer").and_then(Json::as_str))
                .unwrap_or_default()
                .to_string();
            let netdev = dev
                .get("netdevs")
                .and_then(|n| n.get(0))
                .and_then(Json::as_str)
                .map(str::to_string);
            RdmaDev {
                name,
                link_layer,
                netdev,
            }
        })
        .collect()
}

/// NCCL's bootstrap and socket fallback use IPoIB when it is up (the InfiniBand selection
/// recommends it), else the primary synthetic interface `eth0` (never the
/// accelerated-networking VF, which is enslaved to it).
fn recommend_socket_ifname(facts: &Facts, usable_ib: &[&fabric::Port], d: &mut Detection) {
    let (ifaces, live) = fabric::interfaces(facts);
    // The InfiniBand selection warns about an IPoIB interface that is down.
    if fabric::ipoib_ifname(usable_ib, &ifaces, live).0.is_some() {
        return;
    }
    if ifaces.iter().any(|i| i.name == "eth0") {
        d.recommend(
            "NCCL_SOCKET_IFNAME",
            "=eth0",
            "the Azure synthetic interface carries the VM's address; without a usable IPoIB \
             interface it is the only one every node of the set can reach",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use heddle_plugin_sdk::serde_json::Value;
    use heddle_plugin_sdk::serde_json::{self, json};

    const SEED_001: &str = include_str!("../../../fixtures/azure-nd40rs-v2.json");

    fn detect(v: &Value) -> Detection {
        heddle_plugin_sdk::run::<AzureNd>(&v.to_string()).unwrap()
    }

    fn seed() -> Value {
        serde_json::from_str(SEED_001).unwrap()
    }

    #[test]
    fn nd40rs_v2_from_seed() {
        let d = detect(&seed());
        assert_eq!(d.trait_value("cloud"), Some("azure"));
        assert_eq!(d.trait_value("azure.sku"), Some("ND40rs_v2"));
        assert_eq!(d.trait_value("rdma.fabric"), Some("infiniband"));
        // The HCA list is the InfiniBand selection's (dgx-affinity), not a second copy here.
        assert_eq!(d.env_value("NCCL_IB_HCA"), None);
        // The seed's ibP59423s2 is DOWN, so bootstrap goes over eth0.
        assert_eq!(d.env_value("NCCL_SOCKET_IFNAME"), Some("=eth0"));
        assert!(
            d.warnings
                .iter()
                .any(|w| w.contains("rdmaP36305p0s2") && w.contains("do not use it"))
        );
        assert!(
            !d.warnings
                .iter()
                .any(|w| w.contains("OS.EnableRDMA is not set"))
        );
        // The SKU's EDR line rate gives perftest a floor: 90 % of 100 Gb/s.
        let write = d
            .expectations
            .iter()
            .find(|e| e.test == "rdma.ib_write_bw")
            .unwrap();
        assert_eq!(
            (write.metric.as_str(), write.min_size_bytes, write.value),
            ("algbw_gbs", 65536, 11.25)
        );
        assert!(
            write.source.contains("ND40rs_v2") && write.source.contains("100 Gb/s"),
            "{}",
            write.source
        );
        assert_eq!(d.expectations.len(), 3);
    }

    #[test]
    fn ipoib_up_is_preferred_for_sockets() {
        let mut f = seed();
        let ifs = f["network"]["interfaces"].as_array_mut().unwrap();
        let ib = ifs.iter_mut().find(|i| i["name"] == "ibP59423s2").unwrap();
        ib["operstate"] = json!("up");
        let d = detect(&f);
        // dgx-affinity recommends the IPoIB interface; azure-nd adds no eth0 fallback.
        assert_eq!(d.env_value("NCCL_SOCKET_IFNAME"), None);
    }

    #[test]
    fn warns_when_enable_rdma_is_off() {
        for value in [json!(false), Value::Null] {
            let mut f = seed();
            f["host"]["azure_enable_rdma"] = value;
            let d = detect(&f);
            assert!(
                d.warnings
                    .iter()
                    .any(|w| w.contains("OS.EnableRDMA is not set to y")),
                "{d:?}"
            );
        }
    }

    #[test]
    fn other_clouds_do_not_apply() {
        let mut f = seed();
        f["host"]["dmi"] =
            json!({"sys_vendor": "NVIDIA", "product_name": "DGX-1", "chassis_asset_tag": null});
        assert!(detect(&f).is_empty());
    }

    #[test]
    fn asset_tag_alone_identifies_azure_and_unknown_sku_is_not_guessed() {
        let mut f = seed();
        f["host"]["dmi"]["product_name"] = json!("Something Else");
        f["gpus"] = json!([]);
        let d = detect(&f);
        assert_eq!(d.trait_value("cloud"), Some("azure"));
        assert_eq!(d.trait_value("azure.sku"), None);
    }

    #[test]
    fn sku_table() {
        let g = |n: usize, m: &str| vec![m.to_string(); n];
        assert_eq!(
            guess_sku(&g(8, "NVIDIA A100-SXM4-80GB"), true),
            Some("ND96amsr_A100_v4")
        );
        assert_eq!(
            guess_sku(&g(8, "NVIDIA A100-SXM4-40GB"), true),
            Some("ND96asr_v4")
        );
        assert_eq!(
            guess_sku(&g(8, "NVIDIA H100 80GB HBM3"), true),
            Some("ND96isr_H100_v5")
        );
        assert_eq!(guess_sku(&g(8, "Tesla V100-SXM2-32GB"), false), None);
        assert_eq!(guess_sku(&g(1, "Tesla T4"), false), None);
    }
}
