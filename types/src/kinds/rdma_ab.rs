//! `rdma_ab`: one NCCL collective over the same sizes twice, once with the node's own
//! environment (the RDMA leg) and once forced onto TCP sockets (the socket leg), and the
//! ratio of the two per size band. The one home of what the legs are, how they compare and
//! what makes the comparison conclusive, its parameters (`nccl`'s) and what its results
//! are judged on: the agent's runner, the server's verdict, the CLI and the dashboard all
//! read it from here. Rules and thresholds: docs/health.md, "RDMA
//! against sockets".

use serde::{Deserialize, Serialize};

use super::nccl::{NCCL_DOCS, NcclParams, NcclSummary};
use super::{Judged, TestKind, lenient};
use crate::facts::NodeFacts;
use crate::health::Figure;
use crate::params::{KindParams, ParamDoc, ParamError};
use crate::rows::ResultRow;
use crate::sweeps::Band;
use crate::transport::{self, Finding, Level, NcclEvidence};

pub const KIND: &str = "rdma_ab";
/// The label on every row that says which leg measured it.
pub const LEG_LABEL: &str = "leg";
/// The figure a result of this kind is judged on: RDMA busbw over socket busbw in the
/// large band. Higher is better.
pub const SPEEDUP_METRIC: &str = "rdma_speedup";
/// The built-in floor of [`SPEEDUP_METRIC`] on a node with an ACTIVE IB/RoCE port. Seed
/// 003's RoCE cluster shows 4.2× (122.3 against 29.1 GB/s busbw, 16 GPUs) and 2.5× (32
/// GPUs); sockets over the same 100 GbE RoCE NIC can reach a good part of its rate, so
/// "clearly faster" starts at 1.5×. Operators tune it with an expectation on
/// `rdma_ab.<op>` / `rdma_speedup`.
pub const MIN_SPEEDUP: f64 = 1.5;

/// The verdict reason of an RDMA leg not clearly faster than the socket leg.
pub const RDMA_NOT_HELPING: &str = "rdma-not-helping";
/// The comparison says nothing: the node has no ACTIVE IB/RoCE port, a leg did not take
/// the path it was meant to, or no size reached the large band.
pub const RDMA_AB_INCONCLUSIVE: &str = "rdma-ab-inconclusive";

/// `rdma_ab`: the `nccl` measurement twice, with the node's environment and forced to
/// sockets; the same parameters as `nccl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RdmaAbParams(pub NcclParams);

impl KindParams for RdmaAbParams {
    const KIND: &'static str = KIND;
    const DESCRIPTION: &'static str = "The same NCCL sweep with the node's environment and \
        forced to sockets (NCCL_IB_DISABLE=1): both tables and the ratio per size band. Needs \
        two ranks or more (several nodes, or gpus ≥ 2).";
    const PARAMS: &'static [ParamDoc] = NCCL_DOCS;

    fn check(&self) -> Result<(), ParamError> {
        self.0.check()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Leg {
    /// The node's own environment: RDMA when the node can do it.
    Rdma,
    /// Forced onto NCCL's TCP socket transport.
    Socket,
}

impl Leg {
    pub const ALL: [Leg; 2] = [Leg::Rdma, Leg::Socket];

    pub fn as_str(self) -> &'static str {
        match self {
            Leg::Rdma => "rdma",
            Leg::Socket => "socket",
        }
    }

    /// What a leg's test process gets on top of the job's environment. The socket leg
    /// turns NCCL's IB transport off and names the Socket network, so a net plugin cannot
    /// carry it either. On one node both legs turn off NVLink/PCIe peer access and shared
    /// memory, so the ranks' traffic crosses the network (the HCA's loopback for RDMA).
    pub fn env(self, world_size: i32) -> Vec<(&'static str, &'static str)> {
        let mut env = Vec::new();
        if world_size <= 1 {
            env.extend([("NCCL_P2P_DISABLE", "1"), ("NCCL_SHM_DISABLE", "1")]);
        }
        if self == Leg::Socket {
            env.extend([("NCCL_IB_DISABLE", "1"), ("NCCL_NET", "Socket")]);
        }
        env
    }

    /// The leg a row belongs to, from its label.
    pub fn of(row: &ResultRow) -> Option<Leg> {
        match row.labels.get(LEG_LABEL).map(String::as_str) {
            Some("rdma") => Some(Leg::Rdma),
            Some("socket") => Some(Leg::Socket),
            _ => None,
        }
    }
}

impl std::fmt::Display for Leg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One size measured by both legs (bus bandwidth, mean of the rows at that size).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AbPoint {
    pub size_bytes: i64,
    pub rdma_busbw_gbs: f64,
    pub socket_busbw_gbs: f64,
    /// `rdma / socket`; `None` when the socket leg measured nothing.
    pub ratio: Option<f64>,
}

/// The legs over one size band (the bands of sweeps: small below 64 KiB, large from 64
/// MiB): mean busbw of each over the sizes both measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AbBand {
    pub band: Band,
    pub sizes: u32,
    /// The largest size of the band that both legs measured.
    pub max_size_bytes: i64,
    pub rdma_busbw_gbs: f64,
    pub socket_busbw_gbs: f64,
    pub ratio: Option<f64>,
}

/// Both tables side by side, and the ratio per band.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AbComparison {
    pub points: Vec<AbPoint>,
    pub bands: Vec<AbBand>,
}

fn ratio(rdma: f64, socket: f64) -> Option<f64> {
    (socket > 0.0 && rdma.is_finite() && socket.is_finite()).then(|| rdma / socket)
}

impl AbComparison {
    /// Pairs the legs' rows by size (rows without a leg label or a busbw are left out).
    pub fn from_rows(rows: &[ResultRow]) -> AbComparison {
        use std::collections::BTreeMap;
        // size → (sum, n) per leg
        let mut by_size: BTreeMap<i64, [(f64, u32); 2]> = BTreeMap::new();
        for r in rows {
            let (Some(leg), Some(bw)) = (Leg::of(r), r.busbw_gbs.filter(|b| b.is_finite())) else {
                continue;
            };
            let slot = &mut by_size.entry(r.size_bytes).or_default()[leg as usize];
            slot.0 += bw;
            slot.1 += 1;
        }
        let points: Vec<AbPoint> = by_size
            .into_iter()
            .filter(|(_, l)| l[0].1 > 0 && l[1].1 > 0)
            .map(|(size, l)| {
                let rdma = l[0].0 / f64::from(l[0].1);
                let socket = l[1].0 / f64::from(l[1].1);
                AbPoint {
                    size_bytes: size,
                    rdma_busbw_gbs: rdma,
                    socket_busbw_gbs: socket,
                    ratio: ratio(rdma, socket),
                }
            })
            .collect();
        let mut bands = Vec::new();
        for band in Band::ALL {
            let inside: Vec<&AbPoint> = points
                .iter()
                .filter(|p| Band::of(p.size_bytes) == band)
                .collect();
            let Some(last) = inside.last() else { continue };
            let n = inside.len() as f64;
            let rdma = inside.iter().map(|p| p.rdma_busbw_gbs).sum::<f64>() / n;
            let socket = inside.iter().map(|p| p.socket_busbw_gbs).sum::<f64>() / n;
            bands.push(AbBand {
                band,
                sizes: inside.len() as u32,
                max_size_bytes: last.size_bytes,
                rdma_busbw_gbs: rdma,
                socket_busbw_gbs: socket,
                ratio: ratio(rdma, socket),
            });
        }
        AbComparison { points, bands }
    }

    pub fn band(&self, band: Band) -> Option<&AbBand> {
        self.bands.iter().find(|b| b.band == band)
    }

    /// What the verdict is judged on: the large band's ratio, at its largest size.
    pub fn speedup(&self) -> Option<(i64, f64)> {
        let b = self.band(Band::Large)?;
        Some((b.max_size_bytes, b.ratio?))
    }
}

impl TestKind for RdmaAbParams {
    type Summary = RdmaAbSummary;

    /// Judged on the ratio of the legs in the large band.
    fn judged(&self, rows: &[ResultRow]) -> Judged {
        let test = format!("{KIND}.{}", self.0.op);
        let figures = AbComparison::from_rows(rows)
            .speedup()
            .map(|(size_bytes, value)| Figure {
                test: test.clone(),
                metric: SPEEDUP_METRIC.into(),
                size_bytes,
                value,
                pair: None,
            });
        Judged {
            test,
            figures: figures.into_iter().collect(),
        }
    }

    /// Both legs' paths: `rdma leg: network IB ... | socket leg: network Socket ...`.
    fn path_line(summary: &RdmaAbSummary) -> Option<String> {
        let legs: Vec<String> = Leg::ALL
            .iter()
            .filter_map(|leg| {
                let line = super::nccl::path_line(summary.leg_evidence(*leg)?);
                Some(format!("{leg} leg: {line}"))
            })
            .collect();
        (!legs.is_empty()).then(|| legs.join(" | "))
    }

    fn findings(summary: &RdmaAbSummary, facts: Option<&NodeFacts>) -> Vec<Finding> {
        classify_summary(summary, facts)
    }
}

/// What readers take from an `rdma_ab` result's summary: each leg's (`legs.<leg>`) and
/// the comparison.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct RdmaAbSummary {
    #[serde(default, deserialize_with = "lenient")]
    pub legs: Option<Legs>,
    #[serde(default, deserialize_with = "lenient")]
    pub comparison: Option<AbComparison>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Legs {
    #[serde(default, deserialize_with = "lenient")]
    pub rdma: Option<NcclSummary>,
    #[serde(default, deserialize_with = "lenient")]
    pub socket: Option<NcclSummary>,
}

impl RdmaAbSummary {
    /// A leg's NCCL evidence (`legs.<leg>.nccl_evidence`).
    pub fn leg_evidence(&self, leg: Leg) -> Option<&NcclEvidence> {
        let legs = self.legs.as_ref()?;
        let l = match leg {
            Leg::Rdma => legs.rdma.as_ref(),
            Leg::Socket => legs.socket.as_ref(),
        };
        l?.nccl_evidence.as_ref()
    }
}

fn inconclusive(evidence: Option<String>, reason: String) -> Finding {
    Finding {
        code: RDMA_AB_INCONCLUSIVE.into(),
        level: Level::Warn,
        evidence,
        reason,
    }
}

/// What an `rdma_ab` result's evidence says against the node's facts: the RDMA leg is
/// held to the NCCL rules (a socket fallback there fails); a socket leg that did not run
/// over sockets, legs whose traffic crossed no network, a sweep that never reached the
/// large band, or a node without an ACTIVE IB/RoCE port make the comparison inconclusive
/// (warn, never a silent pass). Whether the RDMA leg was fast enough is the verdict's
/// expectation on [`SPEEDUP_METRIC`].
pub fn classify(summary: &serde_json::Value, facts: Option<&NodeFacts>) -> Vec<Finding> {
    classify_summary(&super::summary(summary), facts)
}

fn classify_summary(summary: &RdmaAbSummary, facts: Option<&NodeFacts>) -> Vec<Finding> {
    let rdma = summary.leg_evidence(Leg::Rdma);
    let mut out: Vec<Finding> = transport::classify_nccl(rdma, facts)
        .into_iter()
        .map(|mut f| {
            f.reason = format!("RDMA leg: {}", f.reason);
            f
        })
        .collect();
    if let Some(ev) = rdma
        && ev.channel_lines > 0
        && ev.net_connections() == 0
    {
        out.push(inconclusive(
            None,
            "the RDMA leg's channels crossed no network (NVLink, PCIe or shared memory only), \
             so the two legs did not compare network transports"
                .into(),
        ));
    }
    match summary.leg_evidence(Leg::Socket) {
        None => out.push(inconclusive(
            None,
            "the socket leg recorded no NCCL transport evidence".into(),
        )),
        Some(ev) => {
            let other_net = ev
                .transports
                .iter()
                .any(|(k, n)| *n > 0 && k.starts_with("NET/") && k != "NET/Socket");
            let chose_other = ev.network.as_deref().is_some_and(|n| n != "Socket");
            if other_net || chose_other {
                out.push(inconclusive(
                    ev.network_line
                        .clone()
                        .or_else(|| ev.net_channel_line.clone()),
                    "the socket leg did not run over TCP sockets although NCCL_IB_DISABLE=1 \
                     and NCCL_NET=Socket were set, so the ratios compare RDMA with itself"
                        .into(),
                ));
            }
        }
    }
    if summary
        .comparison
        .as_ref()
        .and_then(AbComparison::speedup)
        .is_none()
    {
        out.push(inconclusive(
            None,
            format!(
                "no size of {} MiB or more was measured by both legs, so there is no large-band \
                 ratio to judge; run with max_bytes of at least {} MiB",
                Band::LARGE_FROM >> 20,
                Band::LARGE_FROM >> 20
            ),
        ));
    }
    match facts {
        None => out.push(inconclusive(
            None,
            "the node's facts are unknown, so nothing says whether RDMA should help here".into(),
        )),
        Some(f) if transport::active_ports(f).is_empty() => out.push(inconclusive(
            None,
            "the node's facts show no ACTIVE InfiniBand or RoCE port, so RDMA cannot help here: \
             the ratios are for information only (check `ibstatus` and the cabling if the node \
             should have one)"
                .into(),
        )),
        Some(_) => {}
    }
    out
}

/// Whether the facts say RDMA should help: at least one ACTIVE IB/RoCE port.
pub fn rdma_expected(facts: &NodeFacts) -> bool {
    !transport::active_ports(facts).is_empty()
}

#[cfg(test)]
mod tests;
