//! Which transport carried a test's bytes, and whether that was the fast path.
//!
//! The agent turns NCCL's INFO log, UCX's info log and perftest's header into the evidence
//! types here; [`classify_nccl`] and [`classify_ucx`] hold them against the node's facts
//! and name what is wrong. This module is the one home of those rules: the agent's
//! `check nccl-log` command and the server's verdicts both call it. Pure functions only.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::facts::NodeFacts;

/// How much a finding weighs. Upper case on the wire, as scripts grep for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "UPPERCASE")]
pub enum Level {
    Info,
    Warn,
    Fail,
}

/// One thing the evidence says about the path a test took.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Finding {
    /// Stable: `socket-fallback`, `gdr-not-used`, `ucx-no-rdma`, `below-port-rate`,
    /// `transport-unknown`.
    pub code: String,
    pub level: Level,
    /// The tool's own line the finding rests on, verbatim.
    #[serde(default)]
    pub evidence: Option<String>,
    /// What happened, why, and what to do about it.
    pub reason: String,
}

pub const SOCKET_FALLBACK: &str = "socket-fallback";
pub const GDR_NOT_USED: &str = "gdr-not-used";
pub const UCX_NO_RDMA: &str = "ucx-no-rdma";
pub const BELOW_PORT_RATE: &str = "below-port-rate";
pub const TRANSPORT_UNKNOWN: &str = "transport-unknown";

/// An HCA port as NCCL lists it (`[0]mlx5_0:1/IB`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NetDevice {
    pub name: String,
    pub port: Option<u32>,
    /// `IB` or `RoCE`, as NCCL prints it.
    pub link_layer: Option<String>,
}

/// What NCCL's INFO log says about the path: see docs/runners.md, "Transport evidence".
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NcclEvidence {
    /// `2.28.9+cuda13.0`.
    #[serde(default)]
    pub version: Option<String>,
    /// `IB`, `Socket`, or a net plugin's name (`IBext_v8`), from `Using network ...`.
    #[serde(default)]
    pub network: Option<String>,
    #[serde(default)]
    pub network_line: Option<String>,
    /// The `NET/IB : Using ...` list.
    #[serde(default)]
    pub devices: Vec<NetDevice>,
    /// The bootstrap / out-of-band interface, `eth0:192.0.2.2<0>`.
    #[serde(default)]
    pub oob: Option<String>,
    /// Channel connections per transport family: `P2P`, `SHM`, `NET/IB`, `NET/Socket`,
    /// `NET/<plugin>`, `COLLNET` ...
    #[serde(default)]
    pub transports: BTreeMap<String, u64>,
    /// Distinct `via ...` transports verbatim: `P2P/CUMEM/read`, `NET/IB/0/GDRDMA`.
    #[serde(default)]
    pub channel_transports: BTreeSet<String>,
    /// The first channel line that went over a network transport.
    #[serde(default)]
    pub net_channel_line: Option<String>,
    /// True when a network channel used GPUDirect RDMA, false when network channels ran
    /// without it, `None` when nothing crossed a network.
    #[serde(default)]
    pub gdr: Option<bool>,
    /// The line GPUDirect RDMA was judged on when it was not used.
    #[serde(default)]
    pub gdr_line: Option<String>,
    /// The RoCE GID index NCCL reports (from its NET/IB lines or `NCCL_IB_GID_INDEX`).
    #[serde(default)]
    pub gid_index: Option<u32>,
    /// NCCL's own lines about why the IB transport was not used, verbatim.
    #[serde(default)]
    pub ib_unavailable: Vec<String>,
    /// `NCCL_X set by environment to Y.`: what NCCL read.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Every `NCCL WARN` message (at most 50).
    #[serde(default)]
    pub warnings: Vec<String>,
    /// Channel lines seen at all: without them a multi-rank run cannot say what carried it.
    #[serde(default)]
    pub channel_lines: u64,
}

impl NcclEvidence {
    /// Connections over a network transport (any `NET/...`).
    pub fn net_connections(&self) -> u64 {
        self.transports
            .iter()
            .filter(|(k, _)| k.starts_with("NET/"))
            .map(|(_, n)| n)
            .sum()
    }

    pub fn socket_connections(&self) -> u64 {
        self.transports.get("NET/Socket").copied().unwrap_or(0)
    }

    /// Nothing in the log says which network NCCL chose or what the channels used.
    pub fn is_silent(&self) -> bool {
        self.network.is_none() && self.channel_lines == 0
    }
}

/// The contract of `heddle-agent check nccl-log`: the evidence and the findings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NcclReport {
    pub network: Option<String>,
    pub devices: Vec<NetDevice>,
    pub gdr: Option<bool>,
    pub transports: BTreeMap<String, u64>,
    pub findings: Vec<Finding>,
    pub oob: Option<String>,
    pub gid_index: Option<u32>,
    pub nccl_version: Option<String>,
    pub warnings: Vec<String>,
}

impl NcclReport {
    pub fn new(ev: &NcclEvidence, findings: Vec<Finding>) -> NcclReport {
        NcclReport {
            network: ev.network.clone(),
            devices: ev.devices.clone(),
            gdr: ev.gdr,
            transports: ev.transports.clone(),
            findings,
            oob: ev.oob.clone(),
            gid_index: ev.gid_index,
            nccl_version: ev.version.clone(),
            warnings: ev.warnings.clone(),
        }
    }

    pub fn failed(&self) -> bool {
        self.findings.iter().any(|f| f.level == Level::Fail)
    }
}

/// What UCX used and could have used.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UcxEvidence {
    /// `transport/device` lanes UCX selected for its endpoints (`ep_cfg[..]` info lines),
    /// e.g. `rc_mlx5/mlx5_0:1`, `tcp/eth0`, `sysv/memory`.
    #[serde(default)]
    pub selected: BTreeSet<String>,
    /// The first `ep_cfg` line, verbatim.
    #[serde(default)]
    pub selected_line: Option<String>,
    /// `transport/device` from `ucx_info -d`.
    #[serde(default)]
    pub available: BTreeSet<String>,
    /// `loopback` (one node) or `two-node`.
    #[serde(default)]
    pub mode: Option<String>,
}

/// What perftest's header says about the path.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PerftestEvidence {
    pub device: Option<String>,
    pub port: Option<u32>,
    pub gid_index: Option<u32>,
    /// `IB` or `Ethernet`.
    pub link_layer: Option<String>,
    pub mtu: Option<u32>,
    pub transport: Option<String>,
}

/// An ACTIVE RDMA port of the node, as its facts say.
#[derive(Debug, Clone, PartialEq)]
pub struct ActivePort {
    pub device: String,
    pub port: u32,
    /// `InfiniBand` or `Ethernet` (RoCE).
    pub link_layer: String,
    pub rate: Option<String>,
    pub gbits: Option<f64>,
}

impl ActivePort {
    pub fn describe(&self) -> String {
        let layer = if self.link_layer.eq_ignore_ascii_case("ethernet") {
            "RoCE"
        } else {
            "InfiniBand"
        };
        match &self.rate {
            Some(r) => format!("{} port {} ({layer}, {r})", self.device, self.port),
            None => format!("{} port {} ({layer})", self.device, self.port),
        }
    }
}

/// `400 Gb/sec (4X NDR)` → 400.
pub fn port_rate_gbits(rate: &str) -> Option<f64> {
    let (number, rest) = rate.trim().split_once(' ')?;
    if !rest.trim_start().starts_with("Gb/sec") {
        return None;
    }
    number.parse().ok()
}

/// ACTIVE IB or RoCE ports in the facts, sorted by device and port.
pub fn active_ports(facts: &NodeFacts) -> Vec<ActivePort> {
    let mut out = Vec::new();
    for d in &facts.rdma.devices {
        for p in &d.ports {
            let Some(layer) = p.link_layer.as_deref() else {
                continue;
            };
            if p.state != "ACTIVE" {
                continue;
            }
            // An Ethernet port without a RoCE GID cannot carry RDMA (Azure's accelerated
            // networking device in seed 001 lists one).
            let roce = layer.eq_ignore_ascii_case("ethernet");
            if roce && !p.gids.is_empty() && !p.gids.iter().any(|g| g.gid_type.is_some()) {
                continue;
            }
            out.push(ActivePort {
                device: d.name.clone(),
                port: p.port,
                link_layer: layer.to_string(),
                rate: p.rate.clone(),
                gbits: p.rate.as_deref().and_then(port_rate_gbits),
            });
        }
    }
    out
}

fn ports_list(ports: &[ActivePort]) -> String {
    let mut names: Vec<String> = ports.iter().take(4).map(ActivePort::describe).collect();
    if ports.len() > 4 {
        names.push(format!("{} more", ports.len() - 4));
    }
    names.join(", ")
}

/// Whether GPUDirect RDMA is possible by the facts: `Some(Ok(why))` yes, `Some(Err(why))`
/// no, `None` when the facts do not say (an agent without the `gpudirect` section).
pub fn gdr_possible(facts: &NodeFacts) -> Option<Result<String, String>> {
    let g = facts.gpudirect.as_ref()?;
    let Some(module) = g.peer_mem_module.clone() else {
        return Some(Err(
            "no peer-memory module (nvidia_peermem or nv_peer_mem) is loaded".into(),
        ));
    };
    let t = &facts.topology;
    let gpus: Vec<usize> = (0..t.devices.len())
        .filter(|&i| t.devices[i].starts_with("GPU"))
        .collect();
    let hcas: Vec<usize> = (0..t.devices.len())
        .filter(|&i| facts.rdma.devices.iter().any(|d| d.name == t.devices[i]))
        .collect();
    for &g in &gpus {
        for &h in &hcas {
            let rel = t.matrix.get(g).and_then(|r| r.get(h)).map(String::as_str);
            if matches!(rel, Some("PIX") | Some("PXB")) {
                return Some(Ok(format!(
                    "{module} is loaded and {} sits behind the same PCIe switch as {} ({})",
                    t.devices[h],
                    t.devices[g],
                    rel.unwrap_or("")
                )));
            }
        }
    }
    Some(Err(format!(
        "{module} is loaded but no HCA shares a PCIe switch with a GPU (topology PIX/PXB)"
    )))
}

fn why_not_ib(ev: &NcclEvidence) -> String {
    let mut lines: Vec<&str> = ev.ib_unavailable.iter().map(String::as_str).collect();
    lines.dedup();
    if lines.is_empty() {
        "NCCL's log gives no reason".into()
    } else {
        format!(
            "NCCL said: {}",
            lines
                .iter()
                .take(4)
                .map(|l| format!("\"{l}\""))
                .collect::<Vec<_>>()
                .join("; ")
        )
    }
}

/// NCCL's log against the node's facts (see docs/health.md, "Transport findings").
/// `facts` is `None` when the node's facts are unknown: only the facts-free rules apply.
pub fn classify_nccl(ev: Option<&NcclEvidence>, facts: Option<&NodeFacts>) -> Vec<Finding> {
    let Some(ev) = ev.filter(|e| !e.is_silent()) else {
        return vec![Finding {
            code: TRANSPORT_UNKNOWN.into(),
            level: Level::Warn,
            evidence: None,
            reason: "NCCL's INFO log says nothing about the network or the channels' transports \
                     (the log was not captured, NCCL_DEBUG was set below INFO, or NCCL is too old to \
                     log them), so this run cannot show it took the fast path; rerun without \
                     NCCL_DEBUG / NCCL_DEBUG_SUBSYS overrides"
                .into(),
        }];
    };
    let mut out = Vec::new();
    let ports = facts.map(active_ports).unwrap_or_default();
    let socket_chosen = ev.network.as_deref() == Some("Socket");
    if !ports.is_empty() && (socket_chosen || ev.socket_connections() > 0) {
        let evidence = if ev.socket_connections() > 0 {
            ev.net_channel_line
                .clone()
                .or_else(|| ev.network_line.clone())
        } else {
            ev.network_line.clone()
        };
        let disabled = ev
            .env
            .get("NCCL_IB_DISABLE")
            .is_some_and(|v| v.trim_end_matches('.') == "1");
        let todo = if disabled {
            "NCCL_IB_DISABLE=1 is set: remove it from the job's or the profile's environment"
        } else {
            "check that NCCL_IB_HCA names the ACTIVE HCAs, that the test sees /dev/infiniband and \
             libibverbs (containers need the devices and the verbs libraries mounted), and for \
             RoCE that NCCL_IB_GID_INDEX names a RoCE v2 GID (`heddle env NODE` recommends one)"
        };
        out.push(Finding {
            code: SOCKET_FALLBACK.into(),
            level: Level::Fail,
            evidence,
            reason: format!(
                "NCCL used TCP sockets (NET/Socket, {} connection(s)) although {} {} ACTIVE: \
                 inter-node traffic runs at a fraction of the port rate. {}. To fix: {todo}",
                ev.socket_connections(),
                ports_list(&ports),
                if ports.len() == 1 { "is" } else { "are" },
                why_not_ib(ev)
            ),
        });
    }
    let rdma_network = ev.network.as_deref().is_some_and(|n| n != "Socket")
        || ev
            .transports
            .iter()
            .any(|(k, n)| *n > 0 && k.starts_with("NET/") && k != "NET/Socket");
    if rdma_network
        && ev.gdr == Some(false)
        && let Some(Some(Ok(why))) = facts.map(gdr_possible)
    {
        out.push(Finding {
            code: GDR_NOT_USED.into(),
            level: Level::Warn,
            evidence: ev.gdr_line.clone(),
            reason: format!(
                "NCCL ran its network traffic without GPUDirect RDMA, so every message was \
                 staged through host memory, although {why}. \
                 Check NCCL_NET_GDR_LEVEL / NCCL_NET_GDR_READ in the environment, and that the \
                 module matches the running driver (`dmesg | grep peermem`)"
            ),
        });
    }
    out
}

/// Whether a UCX transport name is one of the verbs (RDMA) transports.
pub fn is_verbs_transport(name: &str) -> bool {
    let t = name.split('/').next().unwrap_or(name);
    ["rc", "dc", "ud"]
        .iter()
        .any(|p| t == *p || t.starts_with(&format!("{p}_")))
}

/// Whether a UCX transport moves bytes between nodes.
fn is_network_transport(name: &str) -> bool {
    let t = name.split('/').next().unwrap_or(name);
    is_verbs_transport(t) || matches!(t, "tcp" | "sockcm" | "rdmacm" | "srd")
}

/// UCX's selection against the node's facts.
pub fn classify_ucx(ev: Option<&UcxEvidence>, facts: Option<&NodeFacts>) -> Vec<Finding> {
    let Some(ev) = ev else {
        return vec![Finding {
            code: TRANSPORT_UNKNOWN.into(),
            level: Level::Warn,
            evidence: None,
            reason: "the UCX run recorded no transport evidence (an agent without it); rerun \
                     it with a current agent"
                .into(),
        }];
    };
    let ports = facts.map(active_ports).unwrap_or_default();
    let mut out = Vec::new();
    if !ports.is_empty()
        && !ev.available.is_empty()
        && !ev.available.iter().any(|t| is_verbs_transport(t))
    {
        out.push(Finding {
            code: UCX_NO_RDMA.into(),
            level: Level::Fail,
            evidence: Some(format!(
                "ucx_info -d: {}",
                ev.available.iter().cloned().collect::<Vec<_>>().join(" ")
            )),
            reason: format!(
                "UCX offers no verbs transport (rc, dc, ud) although {} {} ACTIVE: UCX was built \
                 without verbs, or cannot open /dev/infiniband. Install UCX with its IB transports \
                 (e.g. ucx-ib / MLNX_OFED's UCX) and make the devices visible to the test",
                ports_list(&ports),
                if ports.len() == 1 { "is" } else { "are" },
            ),
        });
    }
    if ev.selected.is_empty() {
        out.push(Finding {
            code: TRANSPORT_UNKNOWN.into(),
            level: Level::Warn,
            evidence: None,
            reason: "UCX's info log named no endpoint transports (UCX_LOG_LEVEL was set below \
                     info, or UCX is too old to log them), so the run cannot show which path it took"
                .into(),
        });
        return out;
    }
    let network: Vec<&String> = ev
        .selected
        .iter()
        .filter(|t| is_network_transport(t))
        .collect();
    let verbs = ev.selected.iter().any(|t| is_verbs_transport(t));
    if !ports.is_empty() && !network.is_empty() && !verbs {
        out.push(Finding {
            code: UCX_NO_RDMA.into(),
            level: Level::Fail,
            evidence: ev.selected_line.clone(),
            reason: format!(
                "UCX carried the test over {} and no verbs transport (rc, dc, ud) although {} {} \
                 ACTIVE. Remove UCX_TLS restrictions that leave out rc/dc/ud, or set \
                 UCX_NET_DEVICES to the ACTIVE HCA port (e.g. {}:{})",
                network
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                ports_list(&ports),
                if ports.len() == 1 { "is" } else { "are" },
                ports[0].device,
                ports[0].port
            ),
        });
    }
    out
}

/// The HCA ports NCCL's RDMA channels ran over (`NET/IB/<i>` indexes its device list),
/// with their summed rate in Gb/s from the facts and a description; `None` when the log
/// or the facts do not say.
pub fn nccl_used_ports(ev: &NcclEvidence, facts: &NodeFacts) -> Option<(f64, String)> {
    let ports = active_ports(facts);
    let mut used = BTreeSet::new();
    for t in &ev.channel_transports {
        let mut parts = t.split('/');
        if parts.next() != Some("NET") || parts.next() == Some("Socket") {
            continue;
        }
        if let Some(i) = parts.next().and_then(|i| i.parse::<usize>().ok()) {
            used.insert(i);
        }
    }
    let mut total = 0.0;
    let mut names = Vec::new();
    for i in used {
        let d = ev.devices.get(i)?;
        let p = ports
            .iter()
            .find(|p| p.device == d.name && Some(p.port) == d.port)?;
        total += p.gbits?;
        names.push(format!(
            "{}:{} {}",
            p.device,
            p.port,
            p.rate.as_deref().unwrap_or("")
        ));
    }
    (total > 0.0).then(|| (total, names.join(", ")))
}

/// The floor a perftest bandwidth must reach: this fraction of the port's rate (the pass
/// rule of NVIDIA's multi-node performance checks).
pub const PERFTEST_PORT_FRACTION: f64 = 0.9;
/// The floor of NCCL's inter-node bus bandwidth: this fraction of the summed rate of the
/// HCAs it used. nccl-tests on healthy NDR/HDR fabrics reaches about 90 % of line rate in
/// busbw at large sizes; 0.75 leaves room for protocol overhead on smaller fabrics.
pub const NCCL_PORT_FRACTION: f64 = 0.75;

#[cfg(test)]
mod tests;
