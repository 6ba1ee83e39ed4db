//! RoCE inside a RunAI / Kubernetes pod.
//!
//! Automates the by-hand procedure of running NCCL over RoCE from a RunAI pod: take the HCA
//! whose port is ACTIVE with link layer Ethernet, and among its GIDs the one that is both
//! `RoCE v2` and IPv4-mapped (`0000:…:ffff:a.b.c.d`); its index is `NCCL_IB_GID_INDEX`. A pod
//! has both IPv4 and IPv6 GIDs and both RoCE versions, so picking the wrong one is the usual
//! cause of NCCL hangs or silently falling back to TCP.

use heddle_plugin_sdk::facts::{as_u64, entries};
use heddle_plugin_sdk::{Detection, Facts, Info, Json, Plugin, PluginError};

/// Socket-transport tuning used on these clusters: 4 threads x 8 sockets = 32 connections per
/// peer, which NCCL caps at 64.
pub const SOCKET_NTHREADS: &str = "4";
pub const NSOCKS_PERTHREAD: &str = "8";

const IPV4_MAPPED_PREFIX: &str = "0000:0000:0000:0000:0000:ffff:";

pub struct RunaiRoce;

impl Plugin for RunaiRoce {
    fn info() -> Info {
        Info::new(
            "runai-roce",
            env!("CARGO_PKG_VERSION"),
            "RunAI/Kubernetes pods on RoCE: HCA and RoCE v2 IPv4 GID index selection for NCCL",
        )
        .reads(&[
            "/host/container",
            "/rdma/devices/*/name",
            "/rdma/devices/*/netdevs",
            "/rdma/devices/*/ports/*/port",
            "/rdma/devices/*/ports/*/state",
            "/rdma/devices/*/ports/*/link_layer",
            "/rdma/devices/*/ports/*/gids",
        ])
    }

    fn detect(facts: &Facts) -> Result<Detection, PluginError> {
        let mut d = Detection::default();
        let Some(orchestrator) = orchestrator(facts) else {
            return Ok(d);
        };
        let roce = roce_ports(facts);
        if roce.is_empty() {
            return Ok(d);
        }
        d.add_trait("orchestrator", orchestrator);
        d.add_trait("rdma.fabric", "roce");

        let active: Vec<&RocePort> = roce.iter().filter(|p| p.active).collect();
        if active.is_empty() {
            d.warn(format!(
                "RoCE device(s) {} have no ACTIVE port; NCCL will fall back to TCP sockets",
                names(roce.iter())
            ));
            return Ok(d);
        }

        let chosen: Vec<(&RocePort, &GidEntry)> = active
            .iter()
            .filter_map(|p| p.v2_ipv4_gid().map(|g| (*p, g)))
            .collect();
        for port in &active {
            if port.gids.iter().all(|g| !g.is_v2()) {
                d.warn(format!(
                    "{} port {} has only RoCE v1 GIDs; RoCE v2 (routable, what NCCL needs across \
                     subnets) is not configured on this pod's interface",
                    port.device, port.port
                ));
            } else if port.v2_ipv4_gid().is_none() {
                d.warn(format!(
                    "{} port {} has RoCE v2 GIDs but none IPv4-mapped; is an IPv4 address assigned \
                     to its interface?",
                    port.device, port.port
                ));
            }
        }
        let Some((first_port, first_gid)) = chosen.first() else {
            return Ok(d);
        };

        d.recommend(
            "NCCL_IB_HCA",
            &names(chosen.iter().map(|(p, _)| *p)),
            "the RDMA device(s) whose RoCE port is ACTIVE with an IPv4 RoCE v2 GID; naming them \
             keeps NCCL off devices that are down or lack a routable GID",
        );
        d.recommend(
            "NCCL_IB_GID_INDEX",
            &first_gid.index.to_string(),
            &format!(
                "GID {} of {} port {} is RoCE v2 and IPv4-mapped ({}); NCCL's default index picks \
                 a link-local or RoCE v1 GID that does not route between pods",
                first_gid.index,
                first_port.device,
                first_port.port,
                first_gid.ipv4.as_deref().unwrap_or(&first_gid.gid)
            ),
        );
        for (port, gid) in &chosen[1..] {
            if gid.index != first_gid.index {
                d.warn(format!(
                    "{} uses RoCE v2 IPv4 GID index {} but {} uses {}; NCCL_IB_GID_INDEX is global, \
                     so only {} will use the right GID",
                    port.device, gid.index, first_port.device, first_gid.index, first_port.device
                ));
            }
        }
        let ifname = first_gid.ndev.clone().or_else(|| first_port.netdev.clone());
        if let Some(ifname) = ifname {
            d.recommend(
                "NCCL_SOCKET_IFNAME",
                &ifname,
                "the interface that holds the RoCE address (the Multus secondary network), so \
                 bootstrap traffic takes the RDMA network rather than the pod's default eth0",
            );
        }
        d.recommend(
            "NCCL_SOCKET_NTHREADS",
            SOCKET_NTHREADS,
            "more socket threads per connection for the pod network; 4 x 8 sockets stays under \
             NCCL's limit of 64",
        );
        d.recommend(
            "NCCL_NSOCKS_PERTHREAD",
            NSOCKS_PERTHREAD,
            "several sockets per thread saturate a high-bandwidth pod network better than NCCL's \
             default; 4 x 8 stays under NCCL's limit of 64",
        );
        Ok(d)
    }
}

heddle_plugin_sdk::export_plugin!(RunaiRoce);

/// `runai` when RunAI's variables are present, `kubernetes` for other pods, `None` outside a
/// pod (bare-metal RoCE is not this plugin's business).
fn orchestrator(facts: &Facts) -> Option<&'static str> {
    let env = facts.get("/host/container/launcher_env");
    let has = |prefix: &str| env.is_some_and(|e| e.keys().any(|k| k.starts_with(prefix)));
    if has("RUNAI_") {
        Some("runai")
    } else if facts
        .get("/host/container/kubernetes")
        .and_then(Json::as_bool)
        == Some(true)
        || has("KUBERNETES_SERVICE_HOST")
    {
        Some("kubernetes")
    } else {
        None
    }
}

struct GidEntry {
    index: u64,
    gid: String,
    gid_type: String,
    ndev: Option<String>,
    ipv4: Option<String>,
}

impl GidEntry {
    fn is_v2(&self) -> bool {
        self.gid_type.trim().eq_ignore_ascii_case("RoCE v2")
    }

    fn is_ipv4_mapped(&self) -> bool {
        self.ipv4.is_some()
            || self
                .gid
                .to_ascii_lowercase()
                .starts_with(IPV4_MAPPED_PREFIX)
    }
}

struct RocePort {
    device: String,
    port: String,
    active: bool,
    netdev: Option<String>,
    gids: Vec<GidEntry>,
}

impl RocePort {
    /// The lowest-index GID that is RoCE v2 and IPv4-mapped: what the seed's
    /// `grep ffff … | grep 'RoCE v2'` one-liner selects.
    fn v2_ipv4_gid(&self) -> Option<&GidEntry> {
        self.gids
            .iter()
            .filter(|g| g.is_v2() && g.is_ipv4_mapped())
            .min_by_key(|g| g.index)
    }
}

fn names<'a>(ports: impl Iterator<Item = &'a RocePort>) -> String {
    let mut out: Vec<&str> = Vec::new();
    for p in ports {
        if !out.contains(&p.device.as_str()) {
            out.push(&p.device);
        }
    }
    out.join(",")
}

fn str_field(v: Json<'_>, key: &str) -> Option<String> {
    v.get(key).and_then(Json::as_str).map(str::to_string)
}

fn roce_ports(facts: &Facts) -> Vec<RocePort> {
    let mut out = Vec::new();
    for (device, dev) in facts.entries("/rdma/devices") {
        let netdev = dev
            .get("netdevs")
            .and_then(|n| n.get(0))
            .and_then(Json::as_str);
        for (key, port) in dev.get("ports").map(entries).unwrap_or_default() {
            if !str_field(port, "link_layer").is_some_and(|l| l.eq_ignore_ascii_case("ethernet")) {
                continue;
            }
            let gids = port
                .get("gids")
                .map(entries)
                .unwrap_or_default()
                .into_iter()
                .filter_map(|(_, g)| {
                    Some(GidEntry {
                        index: g.get("index").and_then(as_u64)?,
                        gid: str_field(g, "gid")?,
                        gid_type: str_field(g, "gid_type").unwrap_or_default(),
                        ndev: str_field(g, "ndev"),
                        ipv4: str_field(g, "ipv4"),
                    })
                })
                .collect();
            out.push(RocePort {
                device: device.clone(),
                port: port
                    .get("port")
                    .and_then(as_u64)
                    .map(|p| p.to_string())
                    .unwrap_or(key),
                active: str_field(port, "state").as_deref() == Some("ACTIVE"),
                netdev: netdev.map(str::to_string),
                gids,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use heddle_plugin_sdk::serde_json::Value;
    use heddle_plugin_sdk::serde_json::{self, json};

    const SEED_003: &str = include_str!("../../../fixtures/runai-roce.json");

    fn seed() -> Value {
        serde_json::from_str(SEED_003).unwrap()
    }

    fn detect(v: &Value) -> Detection {
        heddle_plugin_sdk::run::<RunaiRoce>(&v.to_string()).unwrap()
    }

    fn gids(f: &mut Value) -> &mut Vec<Value> {
        f["rdma"]["devices"][0]["ports"][0]["gids"]
            .as_array_mut()
            .unwrap()
    }

    #[test]
    fn picks_the_roce_v2_ipv4_gid_like_the_seed() {
        let d = detect(&seed());
        assert_eq!(d.trait_value("orchestrator"), Some("runai"));
        assert_eq!(d.trait_value("rdma.fabric"), Some("roce"));
        assert_eq!(d.env_value("NCCL_IB_HCA"), Some("mlx5_bond_0"));
        // The seed: "For the pods I was running this was always port 9."
        assert_eq!(d.env_value("NCCL_IB_GID_INDEX"), Some("9"));
        assert_eq!(d.env_value("NCCL_SOCKET_IFNAME"), Some("net1"));
        assert_eq!(d.env_value("NCCL_SOCKET_NTHREADS"), Some("4"));
        assert_eq!(d.env_value("NCCL_NSOCKS_PERTHREAD"), Some("8"));
        assert!(d.env.iter().all(|e| !e.reason.is_empty()));
        assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    }

    #[test]
    fn gid_index_follows_the_data_not_a_constant() {
        let mut f = seed();
        gids(&mut f).retain(|g| g["index"] != 9);
        gids(&mut f).push(
            json!({"index": 5, "gid": "0000:0000:0000:0000:0000:ffff:0a14:1e07",
            "gid_type": "RoCE v2", "ndev": "net1", "ipv4": null}),
        );
        assert_eq!(detect(&f).env_value("NCCL_IB_GID_INDEX"), Some("5"));
    }

    #[test]
    fn warns_when_only_roce_v1_exists() {
        let mut f = seed();
        gids(&mut f).retain(|g| g["gid_type"] != "RoCE v2");
        let d = detect(&f);
        assert_eq!(d.env_value("NCCL_IB_GID_INDEX"), None);
        assert!(
            d.warnings.iter().any(|w| w.contains("only RoCE v1")),
            "{:?}",
            d.warnings
        );
    }

    #[test]
    fn inactive_port_is_not_recommended() {
        let mut f = seed();
        f["rdma"]["devices"][0]["ports"][0]["state"] = json!("DOWN");
        let d = detect(&f);
        assert!(d.env.is_empty());
        assert!(d.warnings.iter().any(|w| w.contains("no ACTIVE port")));
    }

    #[test]
    fn only_active_hcas_are_listed() {
        let mut f = seed();
        let mut second = f["rdma"]["devices"][0].clone();
        second["name"] = json!("mlx5_bond_1");
        second["ports"][0]["state"] = json!("DOWN");
        f["rdma"]["devices"].as_array_mut().unwrap().push(second);
        assert_eq!(detect(&f).env_value("NCCL_IB_HCA"), Some("mlx5_bond_0"));
    }

    #[test]
    fn outside_a_pod_or_without_roce_it_does_not_apply() {
        let mut f = seed();
        f["host"]["container"] = json!({"runtime": null, "kubernetes": false, "launcher_env": {}});
        assert!(detect(&f).is_empty());
        let mut f = seed();
        f["rdma"]["devices"][0]["ports"][0]["link_layer"] = json!("InfiniBand");
        assert!(detect(&f).is_empty());
    }
}
