//! What a figure should reach, from three origins, most specific first: operators (the
//! `expectations` table, `/api/v1/expectations`), enabled plugins (their output's
//! `expectations` array, per node) and the built-in table below. For each figure the first
//! origin with a matching expectation decides; within it every match applies.
//!
//! Built-in figures are floors, not typical values: a healthy node clears them easily and a
//! degraded one (a lane down, a link renegotiated, P2P disabled) does not. Each row names
//! where its reference comes from and the fraction taken of it.

pub mod operators;

use heddle_types::health::{Expectation, Figure, Severity};
use heddle_types::kinds::rdma_ab;
use heddle_types::transport;
use uuid::Uuid;

pub use operators::from_operators;

/// What is known about the run and node a figure was measured on.
#[derive(Debug, Clone, Default)]
pub struct Context {
    pub node_id: Uuid,
    pub hostname: String,
    pub gpu_model: Option<String>,
    /// GPUs the test used in all (NCCL ranks), when the result says.
    pub gpus: Option<i32>,
    pub world_size: i32,
    pub params: serde_json::Value,
    pub facts: Option<serde_json::Value>,
    /// The HCA ports NCCL's network channels used, by its log: their summed rate in
    /// Gb/s and a description (`mlx5_0:1 400 Gb/sec, ...`).
    pub nccl_ports: Option<(f64, String)>,
    /// The HCA and port a perftest ran on, by its own output (`perftest_evidence`).
    pub perftest_port: Option<(String, u32)>,
}

const GIB: i64 = 1 << 30;

/// One built-in single-node NCCL reference.
struct NcclRef {
    test: &'static str,
    /// Matches GPU names containing this, and not `exclude`.
    gpu: &'static str,
    exclude: Option<&'static str>,
    gpus: i32,
    min_size_bytes: i64,
    reference_gbs: f64,
    source: &'static str,
}

/// Floors are this fraction of the reference.
const NCCL_FLOOR: f64 = 0.8;

const NCCL_REFS: &[NcclRef] = &[
    NcclRef {
        test: "nccl.all_reduce",
        gpu: "H200",
        exclude: Some("NVL"),
        gpus: 2,
        min_size_bytes: GIB,
        reference_gbs: 326.0,
        source: "measured by Heddle on 2x H200 over NVLink, NCCL 2.28.9: busbw 326 GB/s at 1 GiB, 346 at 8 GiB (docs/benchmarks.md)",
    },
    NcclRef {
        test: "nccl.all_reduce",
        gpu: "H100",
        exclude: Some("PCIe"),
        gpus: 8,
        min_size_bytes: GIB,
        reference_gbs: 460.0,
        source: "published nccl-tests reference for 8x H100 SXM5 over NVLink 4: busbw 460-480 GB/s at large sizes (docs.alayanew.com, \"NCCL-tests in practice\", 2026)",
    },
    NcclRef {
        test: "nccl.all_reduce",
        gpu: "A100",
        exclude: Some("PCIe"),
        gpus: 8,
        min_size_bytes: GIB,
        reference_gbs: 230.0,
        source: "published nccl-tests reference for 8x A100 SXM4 over NVLink 3: busbw 230-250 GB/s at large sizes (docs.alayanew.com, \"NCCL-tests in practice\", 2026)",
    },
];

/// PCIe generation and width of a GPU's host link, from NVIDIA's datasheets.
const PCIE_BY_GPU: &[(&str, u32, u32, &str)] = &[
    (
        "H200",
        5,
        16,
        "NVIDIA H200 datasheet: PCIe Gen5 x16, 128 GB/s",
    ),
    (
        "H100",
        5,
        16,
        "NVIDIA H100 datasheet: PCIe Gen5 x16, 128 GB/s",
    ),
    (
        "A100",
        4,
        16,
        "NVIDIA A100 datasheet: PCIe Gen4 x16, 64 GB/s",
    ),
    (
        "V100",
        3,
        16,
        "NVIDIA V100 datasheet: PCIe Gen3 x16, 32 GB/s",
    ),
];

/// Host-device copies should reach this fraction of the link's raw rate per direction.
const PCIE_FLOOR: f64 = 0.7;
/// perftest bandwidth should reach this fraction of the port's rate (NVIDIA's multi-node
/// performance checks pass at 90 %).
const RDMA_FLOOR: f64 = transport::PERFTEST_PORT_FRACTION;
/// Built-in floors derived from the rate of the ports that carried a figure start with
/// this; their reasons carry the code `below-port-rate`.
pub const PORT_RATE_SOURCE: &str = "port rate: ";

/// Whether `e` is a port-rate floor, and how much falling below it weighs: perftest
/// measures the port itself (fail); NCCL's busbw also pays for protocol and topology, so
/// its floor is a warning.
pub fn port_rate_rule(e: &Expectation) -> Option<Severity> {
    if e.origin != "builtin" || !e.source.starts_with(PORT_RATE_SOURCE) {
        return None;
    }
    Some(if e.test.starts_with("nccl.") {
        Severity::Warn
    } else {
        Severity::Fail
    })
}

/// Raw bandwidth per direction of a PCIe link in GB/s (GT/s per lane after line coding).
pub fn pcie_gbs(generation: u32, width: u32) -> Option<f64> {
    let (gts, coding) = match generation {
        1 => (2.5, 0.8),
        2 => (5.0, 0.8),
        3 => (8.0, 128.0 / 130.0),
        4 => (16.0, 128.0 / 130.0),
        5 => (32.0, 128.0 / 130.0),
        6 => (64.0, 242.0 / 256.0),
        _ => return None,
    };
    Some(gts * coding * f64::from(width) / 8.0)
}

fn contains_ci(haystack: &str, needle: &str) -> bool {
    haystack
        .to_ascii_lowercase()
        .contains(&needle.to_ascii_lowercase())
}

pub(super) fn builtin(
    origin_source: String,
    test: &str,
    metric: &str,
    min_size_bytes: i64,
    value: f64,
) -> Expectation {
    Expectation {
        id: None,
        origin: "builtin".into(),
        test: test.into(),
        metric: metric.into(),
        min_size_bytes,
        value,
        source: origin_source,
        gpu_model: None,
        gpu_count: None,
        world_size: None,
        node: None,
        created_by: None,
        created_at: None,
    }
}

fn port_rate_gbits(rate: &str) -> Option<f64> {
    transport::port_rate_gbits(rate).filter(|v| *v > 0.0)
}

/// The port a perftest ran on, by its own output (the `Device` of its header and the port
/// it was started on, `Context::perftest_port`), with that port's rate from the node's
/// facts. `None` when the result carries no such evidence or the facts do not list the
/// port's rate: no floor is better than one taken from a port that did not carry the test.
fn rdma_port(ctx: &Context) -> Option<(String, u64, String, f64)> {
    let (want_dev, want_port) = ctx.perftest_port.as_ref()?;
    let devices = ctx.facts.as_ref()?.pointer("/rdma/devices")?.as_array()?;
    let device = devices
        .iter()
        .find(|d| d.get("name").and_then(|n| n.as_str()) == Some(want_dev.as_str()))?;
    let port = device
        .get("ports")?
        .as_array()?
        .iter()
        .find(|p| p.get("port").and_then(|n| n.as_u64()) == Some(u64::from(*want_port)))?;
    let rate = port.get("rate")?.as_str()?;
    let gbits = port_rate_gbits(rate)?;
    Some((want_dev.clone(), u64::from(*want_port), rate.into(), gbits))
}

/// The built-in expectations that apply to `figure`.
pub fn builtins(figure: &Figure, ctx: &Context) -> Vec<Expectation> {
    let mut out = Vec::new();
    let model = ctx.gpu_model.as_deref().unwrap_or_default();
    if figure.test.starts_with("nccl.") && figure.metric == "busbw_gbs" && ctx.world_size == 1 {
        for r in NCCL_REFS {
            let fits = r.test == figure.test
                && contains_ci(model, r.gpu)
                && !r.exclude.is_some_and(|x| contains_ci(model, x))
                && ctx.gpus == Some(r.gpus);
            if fits {
                let source = format!(
                    "{} ({:.0} % of {} GB/s)",
                    r.source,
                    NCCL_FLOOR * 100.0,
                    r.reference_gbs
                );
                let mut e = builtin(
                    source,
                    r.test,
                    "busbw_gbs",
                    r.min_size_bytes,
                    (r.reference_gbs * NCCL_FLOOR).floor(),
                );
                e.gpu_model = Some(r.gpu.into());
                e.gpu_count = Some(r.gpus);
                e.world_size = Some(1);
                out.push(e);
            }
        }
    }
    if figure.test.starts_with("nccl.")
        && figure.metric == "busbw_gbs"
        && ctx.world_size > 1
        && let Some((gbits, ports)) = &ctx.nccl_ports
    {
        let source = format!(
            "{PORT_RATE_SOURCE}{:.0} % of the summed rate of the HCA ports NCCL used ({ports}; NCCL's log and node facts)",
            transport::NCCL_PORT_FRACTION * 100.0
        );
        let mut e = builtin(
            source,
            &figure.test,
            "busbw_gbs",
            64 << 20,
            gbits / 8.0 * transport::NCCL_PORT_FRACTION,
        );
        e.world_size = Some(ctx.world_size);
        out.push(e);
    }
    let bw_perftest = matches!(
        figure.test.as_str(),
        "rdma.ib_write_bw" | "rdma.ib_read_bw" | "rdma.ib_send_bw"
    );
    if bw_perftest
        && figure.metric == "algbw_gbs"
        && let Some((dev, port, rate, gbits)) = rdma_port(ctx)
    {
        let source = format!(
            "{PORT_RATE_SOURCE}{:.0} % of {dev} port {port} rate {rate} (node facts; NVIDIA's multi-node checks pass at 90 %)",
            RDMA_FLOOR * 100.0
        );
        out.push(builtin(
            source,
            &figure.test,
            "algbw_gbs",
            65536,
            gbits / 8.0 * RDMA_FLOOR,
        ));
    }
    if figure.metric == rdma_ab::SPEEDUP_METRIC && figure.test.starts_with("rdma_ab.") {
        let facts = super::transport::node_facts(ctx.facts.as_ref());
        let ports = facts
            .as_ref()
            .map(transport::active_ports)
            .unwrap_or_default();
        if let Some(port) = ports.first() {
            let source = format!(
                "RDMA against sockets: the RDMA leg at least {:.1}× the socket leg's busbw at {} MiB \
                 and more, since {} is ACTIVE (node facts; docs/health.md)",
                rdma_ab::MIN_SPEEDUP,
                heddle_types::sweeps::Band::LARGE_FROM >> 20,
                port.describe()
            );
            out.push(builtin(
                source,
                &figure.test,
                rdma_ab::SPEEDUP_METRIC,
                heddle_types::sweeps::Band::LARGE_FROM,
                rdma_ab::MIN_SPEEDUP,
            ));
        }
    }
    if matches!(figure.test.as_str(), "p2p.h2d" | "p2p.d2h")
        && figure.metric == "algbw_gbs"
        && let Some((pattern, generation, width, sheet)) =
            PCIE_BY_GPU.iter().find(|(m, ..)| contains_ci(model, m))
        && let Some(raw) = pcie_gbs(*generation, *width)
    {
        let source = format!(
            "{sheet}: {raw:.1} GB/s per direction, {:.0} % of it",
            PCIE_FLOOR * 100.0
        );
        let mut e = builtin(
            source,
            &figure.test,
            "algbw_gbs",
            16 << 20,
            (raw * PCIE_FLOOR * 10.0).floor() / 10.0,
        );
        e.gpu_model = Some((*pattern).into());
        out.push(e);
    }
    out
}

/// Does a stored (operator or plugin) expectation apply to this figure on this node?
pub fn applies(e: &Expectation, figure: &Figure, ctx: &Context) -> bool {
    e.test == figure.test
        && e.metric == figure.metric
        && figure.size_bytes >= e.min_size_bytes
        && e.gpu_model.as_deref().is_none_or(|m| {
            ctx.gpu_model
                .as_deref()
                .is_some_and(|have| contains_ci(have, m))
        })
        && e.gpu_count.is_none_or(|n| ctx.gpus == Some(n))
        && e.world_size.is_none_or(|n| ctx.world_size == n)
        && e.node.as_deref().is_none_or(|n| n == ctx.hostname)
}

/// The expectations that decide `figure`: the first origin (operator, plugin, built-in)
/// that has any.
pub fn deciding(
    figure: &Figure,
    ctx: &Context,
    operator: &[Expectation],
    plugin: &[Expectation],
) -> Vec<Expectation> {
    for stored in [operator, plugin] {
        let hits: Vec<Expectation> = stored
            .iter()
            .filter(|e| applies(e, figure, ctx))
            .cloned()
            .collect();
        if !hits.is_empty() {
            return hits;
        }
    }
    builtins(figure, ctx)
        .into_iter()
        .filter(|e| figure.size_bytes >= e.min_size_bytes)
        .collect()
}

/// Expectations that this node's enabled plugins returned. Entries that make no sense (a
/// figure that is not a positive number) are skipped: a plugin's output must not stop a
/// result from being judged.
pub async fn from_plugins(
    db: &sqlx::PgPool,
    node_id: Uuid,
) -> Result<Vec<Expectation>, sqlx::Error> {
    Ok(from_plugin_outputs(
        crate::plugins::outcomes::expectations(db, node_id).await?,
    ))
}

/// Plugins' expectations as judging uses them: a value that is not a positive number is
/// ignored, the source names the plugin.
pub fn from_plugin_outputs(
    outputs: Vec<(String, heddle_types::plugins::Expectation)>,
) -> Vec<Expectation> {
    let mut out = Vec::new();
    for (plugin, e) in outputs {
        if !(e.value.is_finite() && e.value > 0.0) {
            tracing::debug!(%plugin, test = %e.test, value = e.value, "ignoring an expectation a plugin returned");
            continue;
        }
        out.push(Expectation {
            id: None,
            origin: "plugin".into(),
            test: e.test,
            metric: e.metric,
            min_size_bytes: i64::try_from(e.min_size_bytes).unwrap_or(i64::MAX),
            value: e.value,
            source: format!("plugin {plugin}: {}", e.source),
            gpu_model: None,
            gpu_count: None,
            world_size: None,
            node: None,
            created_by: None,
            created_at: None,
        });
    }
    out
}

/// Every built-in row, for `GET /api/v1/expectations` (the computed RDMA and PCIe ones are
/// listed by their rule, with the Gen5 x16 figure as an example).
pub fn builtin_table() -> Vec<Expectation> {
    let mut out: Vec<Expectation> = NCCL_REFS
        .iter()
        .map(|r| {
            let mut e = builtin(
                format!(
                    "{} ({:.0} % of {} GB/s)",
                    r.source,
                    NCCL_FLOOR * 100.0,
                    r.reference_gbs
                ),
                r.test,
                "busbw_gbs",
                r.min_size_bytes,
                (r.reference_gbs * NCCL_FLOOR).floor(),
            );
            e.gpu_model = Some(r.gpu.into());
            e.gpu_count = Some(r.gpus);
            e.world_size = Some(1);
            e
        })
        .collect();
    for (model, generation, width, sheet) in PCIE_BY_GPU {
        let raw = pcie_gbs(*generation, *width).expect("known generation");
        for test in ["p2p.h2d", "p2p.d2h"] {
            let mut e = builtin(
                format!(
                    "{sheet}: {raw:.1} GB/s per direction, {:.0} % of it",
                    PCIE_FLOOR * 100.0
                ),
                test,
                "algbw_gbs",
                16 << 20,
                (raw * PCIE_FLOOR * 10.0).floor() / 10.0,
            );
            e.gpu_model = Some((*model).into());
            out.push(e);
        }
    }
    for test in ["rdma.ib_write_bw", "rdma.ib_read_bw", "rdma.ib_send_bw"] {
        out.push(builtin(
            format!("{PORT_RATE_SOURCE}{:.0} % of the port's rate from node facts (the port in params.device/ib_port, else the slowest active port; NVIDIA's multi-node checks pass at 90 %); the value shown is for a 400 Gb/sec port", RDMA_FLOOR * 100.0),
            test,
            "algbw_gbs",
            65536,
            400.0 / 8.0 * RDMA_FLOOR,
        ));
    }
    for test in ["nccl.all_reduce", "nccl.all_gather", "nccl.reduce_scatter"] {
        let mut e = builtin(
            format!(
                "{PORT_RATE_SOURCE}{:.0} % of the summed rate of the HCA ports NCCL used, runs over several nodes (NCCL's log and node facts); the value shown is for one 400 Gb/sec port",
                transport::NCCL_PORT_FRACTION * 100.0
            ),
            test,
            "busbw_gbs",
            64 << 20,
            400.0 / 8.0 * transport::NCCL_PORT_FRACTION,
        );
        e.world_size = Some(2);
        out.push(e);
    }
    out
}

#[cfg(test)]
mod tests;
