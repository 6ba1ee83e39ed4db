//! RoCE HCA and GID selection for every node with an active RoCE port: bare metal, plain
//! Docker, Kubernetes or RunAI pods alike. The orchestrator only adds its own notes.
//!
//! Automates the runbook procedure for NCCL over RoCE: take the RDMA devices whose Ethernet
//! port is ACTIVE, and per device the GID that is both `RoCE v2` and IPv4-mapped
//! (`0000:…:ffff:a.b.c.d`); its index is `NCCL_IB_GID_INDEX`. A node has IPv4 and IPv6 GIDs
//! of both RoCE versions, so picking the wrong one is the usual cause of NCCL hangs or a
//! silent fallback to TCP.
//!
//! The GID table is per network namespace: a GID whose netdev is not in the namespace the
//! facts were collected in (a job pod's Multus interface seen from the host, or the host's
//! bond seen from a pod) is not the job's GID. Per device the GID must sit on an interface
//! the facts can see, and carry that interface's address when addresses are known.

use heddle_first_party_fabric::{self as fabric, Gid, Iface, LinkLayer, Port};
use heddle_plugin_sdk::{Detection, Facts, Info, Json, Plugin, PluginError};

/// Socket-transport tuning used on these clusters: 4 threads x 8 sockets = 32 connections per
/// peer, which NCCL caps at 64.
pub const SOCKET_NTHREADS: &str = "4";
pub const NSOCKS_PERTHREAD: &str = "8";

/// The NCCL release that picks a GID per device (`NCCL_IB_ADDR_FAMILY`,
/// `NCCL_IB_ROCE_VERSION_NUM`) instead of one global index.
const NCCL_PER_DEVICE_GID: (u64, u64) = (2, 21);

/// Where the per-pod way is documented, for warnings.
const PER_POD: &str = "run `heddle-agent detect --format env > /heddle/env` in an init container \
     of the job pod (shared emptyDir) and `source /heddle/env` in the job (docs/plugins.md, \
     RoCE in pods)";

pub struct RunaiRoce;

impl Plugin for RunaiRoce {
    fn info() -> Info {
        let mut reads = vec!["/host/container", "/software/nccl"];
        reads.extend_from_slice(fabric::READS);
        reads.extend_from_slice(fabric::GID_READS);
        Info::new(
            "runai-roce",
            env!("CARGO_PKG_VERSION"),
            "RoCE on any node (bare metal, Docker, Kubernetes, RunAI): HCA and RoCE v2 IPv4 GID \
             selection for NCCL and UCX, with the pod network namespace taken into account",
        )
        .reads(&reads)
    }

    fn detect(facts: &Facts) -> Result<Detection, PluginError> {
        let mut d = Detection::default();
        let ports = fabric::ports(facts);
        let (ifaces, _live) = fabric::interfaces(facts);
        let roce: Vec<&Port> = ports
            .iter()
            .filter(|p| {
                p.link_layer == LinkLayer::Ethernet && !fabric::is_transparent_vf(p, &ifaces)
            })
            .collect();
        if roce.is_empty() {
            return Ok(d);
        }
        let orchestrator = orchestrator(facts);
        if let Some(o) = orchestrator {
            d.add_trait("orchestrator", o);
        }
        if fabric::prefers_infiniband(&ports) {
            // InfiniBand carries NCCL on this node (dgx-affinity's selection).
            return Ok(d);
        }
        d.add_trait("rdma.fabric", "roce");
        for p in roce.iter().filter(|p| !p.is_usable()) {
            d.warn(p.dropped_warning());
        }
        let usable: Vec<&Port> = roce.iter().copied().filter(|p| p.is_usable()).collect();
        if usable.is_empty() {
            d.warn("no RoCE port is ACTIVE and LinkUp; NCCL will fall back to TCP sockets");
            return Ok(d);
        }

        let mut chosen: Vec<(&Port, &Gid)> = Vec::new();
        let mut unseen: Vec<String> = Vec::new();
        for port in &usable {
            match choose_gid(port, &ifaces) {
                Choice::Gid(g) => chosen.push((port, g)),
                Choice::OnlyV1 => {
                    d.warn(format!(
                    "{} port {} has only RoCE v1 GIDs; RoCE v2 (routable, what NCCL needs across \
                     subnets) is not configured on its interface: check `cma_roce_mode` and the \
                     interface's IP address",
                    port.device, port.port
                ));
                }
                Choice::NoIpv4 => {
                    d.warn(format!(
                    "{} port {} has RoCE v2 GIDs but none IPv4-mapped; assign an IPv4 address to \
                     its interface",
                    port.device, port.port
                ));
                }
                Choice::NotHere(ndevs) => unseen.push(format!(
                    "{} port {} (its IPv4 RoCE v2 GIDs are on {})",
                    port.device,
                    port.port,
                    ndevs.join(", ")
                )),
            }
        }
        if !unseen.is_empty() {
            d.warn(format!(
                "cannot see the network namespace that owns the RoCE addresses of {}: the GID \
                 index there cannot be computed from here and these devices are left out. To get \
                 the job's own values, {PER_POD}",
                unseen.join("; ")
            ));
        }
        let Some(&(first_port, first_gid)) = chosen.first() else {
            return Ok(d);
        };

        let ports_chosen: Vec<&Port> = chosen.iter().map(|(p, _)| *p).collect();
        d.recommend(
            "NCCL_IB_HCA",
            &fabric::nccl_hca_list(&ports_chosen),
            "the RDMA devices whose RoCE port is ACTIVE and LinkUp with an IPv4 RoCE v2 GID on an \
             interface of this network namespace; `=` for exact names (mlx5_1 would also take \
             mlx5_10 to mlx5_19), which also keeps NCCL off down ports and devices without a \
             routable GID",
        );
        let chosen = recommend_gid(facts, &chosen, first_port, first_gid, &mut d);
        let ports_chosen: Vec<&Port> = chosen.iter().map(|(p, _)| *p).collect();
        let mut ndevs: Vec<&str> = Vec::new();
        for (_, g) in &chosen {
            if let Some(n) = g.ndev.as_deref().filter(|n| !ndevs.contains(n)) {
                ndevs.push(n);
            }
        }
        if !ndevs.is_empty() {
            d.recommend(
                "NCCL_SOCKET_IFNAME",
                &format!("={}", ndevs.join(",")),
                "the interface(s) holding the RoCE addresses (in a pod, the Multus secondary \
                 network), so bootstrap traffic takes the RDMA network rather than the default \
                 route's interface",
            );
        }
        fabric::recommend_ucx(&mut d, &ports_chosen, fabric::gpu_count(facts), "RoCE");

        if orchestrator.is_some() {
            d.recommend(
                "NCCL_SOCKET_NTHREADS",
                SOCKET_NTHREADS,
                "more socket threads per connection for the pod network; 4 x 8 sockets stays \
                 under NCCL's limit of 64",
            );
            d.recommend(
                "NCCL_NSOCKS_PERTHREAD",
                NSOCKS_PERTHREAD,
                "several sockets per thread saturate a high-bandwidth pod network better than \
                 NCCL's default; 4 x 8 stays under NCCL's limit of 64",
            );
            if !in_job_pod(facts) {
                d.warn(format!(
                    "these RoCE values were computed in the agent's own pod; a job pod with its \
                     own Multus interface has its own GID table and may need another index. To \
                     get the job's values, {PER_POD}"
                ));
            }
        }
        Ok(d)
    }
}

heddle_plugin_sdk::export_plugin!(RunaiRoce);

/// One global `NCCL_IB_GID_INDEX` when every device agrees; otherwise NCCL's per-device
/// selection (2.21 on) when it would pick the same GIDs, else the devices that share the
/// first one's index. Returns the devices kept.
fn recommend_gid<'p>(
    facts: &Facts,
    chosen: &[(&'p Port, &'p Gid)],
    first_port: &Port,
    first_gid: &Gid,
    d: &mut Detection,
) -> Vec<(&'p Port, &'p Gid)> {
    let disagree = chosen.iter().any(|(_, g)| g.index != first_gid.index);
    if !disagree {
        d.recommend(
            "NCCL_IB_GID_INDEX",
            &first_gid.index.to_string(),
            &format!(
                "GID {} of {} port {} is RoCE v2 and IPv4-mapped ({}, on {}){}; NCCL's default \
                 index picks a link-local or RoCE v1 GID that does not route between nodes",
                first_gid.index,
                first_port.device,
                first_port.port,
                first_gid.ipv4.as_deref().unwrap_or(&first_gid.gid),
                first_gid.ndev.as_deref().unwrap_or("its interface"),
                if chosen.len() > 1 {
                    ", the same index on every selected device"
                } else {
                    ""
                }
            ),
        );
        return chosen.to_vec();
    }
    let per_device: Vec<String> = chosen
        .iter()
        .map(|(p, g)| format!("{} uses {}", p.device, g.index))
        .collect();
    let nccl = facts.str_at("/software/nccl").and_then(version);
    let old_nccl = nccl.is_some_and(|v| v < NCCL_PER_DEVICE_GID);
    // NCCL's own per-device choice takes the first IPv4 RoCE v2 GID; it is right only when no
    // such GID of another namespace comes before ours.
    let nccl_would_pick_ours = chosen.iter().all(|(p, g)| {
        !p.gids
            .iter()
            .any(|o| o.v2 && o.ipv4.is_some() && o.index < g.index)
    });
    if !old_nccl && nccl_would_pick_ours {
        d.warn(format!(
            "the devices disagree on the RoCE v2 IPv4 GID index ({}), so no single \
             NCCL_IB_GID_INDEX is right for all of them; NCCL 2.21 and later choose per device \
             from NCCL_IB_ADDR_FAMILY and NCCL_IB_ROCE_VERSION_NUM (recommended instead). With an \
             older NCCL set NCCL_IB_HCA to the devices that share one index",
            per_device.join(", ")
        ));
        d.recommend(
            "NCCL_IB_ADDR_FAMILY",
            "AF_INET",
            &format!(
                "the devices' IPv4 RoCE v2 GIDs sit at different indexes ({}); NCCL ≥ 2.21 then \
                 picks each device's IPv4 GID itself, and no GID of another namespace comes first",
                per_device.join(", ")
            ),
        );
        d.recommend(
            "NCCL_IB_ROCE_VERSION_NUM",
            "2",
            "with NCCL_IB_ADDR_FAMILY, selects the routable RoCE v2 GID on every device",
        );
        return chosen.to_vec();
    }
    // Otherwise only the devices that share the first one's index can run with one setting.
    let kept: Vec<&Port> = chosen
        .iter()
        .filter(|(_, g)| g.index == first_gid.index)
        .map(|(p, _)| *p)
        .collect();
    let left_out: Vec<&str> = chosen
        .iter()
        .filter(|(_, g)| g.index != first_gid.index)
        .map(|(p, _)| p.device.as_str())
        .collect();
    d.warn(format!(
        "the devices disagree on the RoCE v2 IPv4 GID index ({}) and {}; NCCL_IB_HCA is narrowed \
         to the devices that use index {} and {} left out. To use every device, give each \
         device's Multus interface the same position in the GID table, or run the job's ranks \
         with NCCL_IB_HCA and NCCL_IB_GID_INDEX set per device",
        per_device.join(", "),
        if old_nccl {
            "this NCCL is older than 2.21, which cannot choose per device"
        } else {
            "NCCL's own per-device choice would take a GID of another network namespace that \
             comes first in the table"
        },
        first_gid.index,
        left_out.join(", ")
    ));
    d.recommend(
        "NCCL_IB_HCA",
        &fabric::nccl_hca_list(&kept),
        &format!(
            "the RoCE devices whose IPv4 RoCE v2 GID is at index {}; the others ({}) have it \
             at another index and cannot share one NCCL_IB_GID_INDEX with them",
            first_gid.index,
            left_out.join(", ")
        ),
    );
    d.recommend(
        "NCCL_IB_GID_INDEX",
        &first_gid.index.to_string(),
        &format!(
            "GID {} of {} port {} is RoCE v2 and IPv4-mapped ({}, on {}), and so is the same index \
             of every device in NCCL_IB_HCA",
            first_gid.index,
            first_port.device,
            first_port.port,
            first_gid.ipv4.as_deref().unwrap_or(&first_gid.gid),
            first_gid.ndev.as_deref().unwrap_or("its interface"),
        ),
    );
    chosen
        .iter()
        .filter(|(_, g)| g.index == first_gid.index)
        .copied()
        .collect()
}

/// `2.21.5` → (2, 21).
fn version(text: &str) -> Option<(u64, u64)> {
    let mut parts = text.trim().split('.');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

enum Choice<'a> {
    Gid(&'a Gid),
    OnlyV1,
    NoIpv4,
    /// IPv4 RoCE v2 GIDs exist, on netdevs outside this network namespace.
    NotHere(Vec<String>),
}

/// The lowest-index RoCE v2, IPv4-mapped GID whose netdev is an interface the facts can see
/// (and, when that interface's addresses are known, that carries the GID's address): what
/// the runbook's `grep ffff … | grep 'RoCE v2'` one-liner selects, in the right namespace.
fn choose_gid<'a>(port: &'a Port, ifaces: &[Iface]) -> Choice<'a> {
    if port.gids.iter().all(|g| !g.v2) {
        return Choice::OnlyV1;
    }
    let mut candidates: Vec<&Gid> = port
        .gids
        .iter()
        .filter(|g| g.v2 && g.ipv4.is_some())
        .collect();
    if candidates.is_empty() {
        return Choice::NoIpv4;
    }
    candidates.sort_by_key(|g| g.index);
    let here = candidates.iter().find(|g| {
        let Some(ndev) = g.ndev.as_deref() else {
            // No netdev recorded: nothing says it is elsewhere.
            return true;
        };
        ifaces.iter().any(|i| {
            i.name == ndev
                && (i.addresses.is_empty()
                    || i.addresses
                        .iter()
                        .any(|a| a.split('/').next() == g.ipv4.as_deref()))
        })
    });
    match here {
        Some(g) => Choice::Gid(g),
        None => {
            let mut ndevs: Vec<String> = Vec::new();
            for g in candidates {
                let n = g.ndev.clone().unwrap_or_default();
                if !ndevs.contains(&n) {
                    ndevs.push(n);
                }
            }
            Choice::NotHere(ndevs)
        }
    }
}

/// `runai` when RunAI's variables are present, `kubernetes` for other pods, `None` outside
/// a pod.
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

/// Whether the facts come from inside a job's pod (a launcher set its variables) rather
/// than from the agent's own pod.
fn in_job_pod(facts: &Facts) -> bool {
    let env = facts.get("/host/container/launcher_env");
    env.is_some_and(|e| {
        e.keys().any(|k| {
            ["WORLD_SIZE", "RANK", "LOCAL_RANK", "JOB_UUID"].contains(&k)
                || k.starts_with("RUNAI_")
                || k.starts_with("TORCHELASTIC_")
        })
    })
}

#[cfg(test)]
mod tests;
