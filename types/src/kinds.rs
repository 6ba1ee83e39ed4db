//! One module per test kind, and the list of them.
//!
//! A kind's module holds everything about it that more than one component reads: its
//! parameters (the struct with its defaults and limits, documented for the launcher's
//! form), what readers take from its results' summaries, the test names and headline
//! figures a verdict judges, the one line on the path its bytes took (`heddle runs show`,
//! the run page) and what its transport evidence says. The server checks a run's params
//! and judges its results through this module, the agent's runner for a kind decodes the same
//! params type, and the dashboard builds its launcher form from [`catalogue`].
//!
//! A job spec carries its params typed by its kind ([`RunParams`], in [`Params`] beside the
//! JSON they came as), and a result's summary is read by its kind once ([`RunSummary`]).
//!
//! Adding a kind is one module here with its [`TestKind`] impl and one line in the list of
//! kinds below (which makes [`KINDS`], [`RunParams`] and [`RunSummary`]),
//! its runner `agent/src/runner/<kind>.rs` (one line in the agent's runner table), and
//! optionally its page `frontend/src/pages/kinds/<kind>.rs`.

pub mod env;
pub mod fail;
mod headline;
pub mod memcpy;
pub mod nccl;
pub mod p2p;
pub mod rdma;
pub mod rdma_ab;
#[macro_use]
mod run_params;
pub mod shown;
pub mod sleep;
pub mod sweep;
pub mod ucx;

pub use headline::lower_is_better;
pub use run_params::Params;

use serde::Deserialize;
use serde::de::{DeserializeOwned, Deserializer};
use serde_json::Value;

use crate::facts::NodeFacts;
use crate::health::Figure;
use crate::params::{KindParams, ParamDoc, ParamError, RunKind, RunKindParam};
use crate::rows::ResultRow;
use crate::transport::Finding;

/// What a result is judged on: the verdict's test and the figures it compares.
#[derive(Debug, Clone, PartialEq)]
pub struct Judged {
    /// The one test of the figures, or the kind's own name when there are several (or
    /// none to name it by).
    pub test: String,
    pub figures: Vec<Figure>,
}

/// A test kind: its parameters (the [`KindParams`] it extends) and what its results say.
pub trait TestKind: KindParams {
    /// What readers take from a result's summary. Every field is optional and read on its
    /// own ([`lenient`]): a field that does not decode is absent, the others stay.
    type Summary: DeserializeOwned + Default + std::fmt::Debug + Clone;

    /// Test names are `<kind>.<test>`; the figures are those a verdict judges.
    fn judged(&self, rows: &[ResultRow]) -> Judged;

    /// Figures regressions follow per GPU pair; never judged.
    fn pairs(_rows: &[ResultRow]) -> Vec<Figure> {
        Vec::new()
    }

    /// One line on the path a result took, from the evidence in its summary.
    fn path_line(_summary: &Self::Summary) -> Option<String> {
        None
    }

    /// What the transport evidence of a succeeded result says against the node's facts.
    /// Kinds that record no transport have nothing to say.
    fn findings(_summary: &Self::Summary, _facts: Option<&NodeFacts>) -> Vec<Finding> {
        Vec::new()
    }
}

/// A summary field read on its own: present when it decodes as `T`, absent otherwise
/// (a result of an older or newer agent), so one odd field does not hide the others.
pub fn lenient<'de, D: Deserializer<'de>, T: DeserializeOwned>(
    d: D,
) -> Result<Option<T>, D::Error> {
    let v = Value::deserialize(d)?;
    Ok(serde_json::from_value(v).ok())
}

/// A result's summary as `S` reads it; any JSON gives one (an empty one at worst).
pub fn summary<S: DeserializeOwned + Default>(summary: &Value) -> S {
    serde_json::from_value(summary.clone()).unwrap_or_default()
}

/// One kind of the list: its documentation, and each reader's entry into its module.
#[derive(Clone, Copy)]
pub struct KindEntry {
    pub name: &'static str,
    pub description: &'static str,
    pub params: &'static [ParamDoc],
    pub defaults: fn() -> Value,
    judged: fn(&Value, &[ResultRow]) -> Option<Judged>,
    pairs: fn(&[ResultRow]) -> Vec<Figure>,
}

const fn entry<T: TestKind>() -> KindEntry {
    KindEntry {
        name: T::KIND,
        description: T::DESCRIPTION,
        params: T::PARAMS,
        defaults: T::defaults,
        judged: judged_as::<T>,
        pairs: T::pairs,
    }
}

/// A stored run's params as its results are judged: by their types, not by today's limits
/// (they were checked when the run was created), null being `{}`.
fn judged_as<T: TestKind>(params: &Value, rows: &[ResultRow]) -> Option<Judged> {
    let params = match params {
        Value::Null => Value::Object(Default::default()),
        other => other.clone(),
    };
    let typed: T = serde_json::from_value(params).ok()?;
    Some(typed.judged(rows))
}

// The list of kinds, in the order the launcher lists them: one line per kind.
kinds! {
    Nccl(nccl::NcclParams),
    Sweep(sweep::SweepParams),
    RdmaAb(rdma_ab::RdmaAbParams),
    P2p(p2p::P2pParams),
    Rdma(rdma::RdmaParams),
    Ucx(ucx::UcxParams),
    Memcpy(memcpy::MemcpyParams),
    Env(env::EnvParams),
    Sleep(sleep::SleepParams),
    Fail(fail::FailParams),
}

pub fn find_kind(kind: &str) -> Option<&'static KindEntry> {
    KINDS.iter().find(|k| k.name == kind)
}

/// What a result of `kind` is judged on, from its run's params and its rows. A kind this
/// build does not know, or params that do not decode, give the kind's name and no figure.
pub fn judged(kind: &str, params: &Params, rows: &[ResultRow]) -> Judged {
    let mut judged = params.judged(kind, rows);
    if let [one] = judged.figures.as_slice() {
        judged.test = one.test.clone();
    }
    judged
}

/// One figure per GPU pair of a result of `kind`, for regressions; none for most kinds.
pub fn pairs(kind: &str, rows: &[ResultRow]) -> Vec<Figure> {
    find_kind(kind).map_or_else(Vec::new, |k| (k.pairs)(rows))
}

/// One line on the path a result took, for people (`heddle runs show`, the run page), from
/// the evidence in a result's summary: `network IB over mlx5_0:1/IB (GPUDirect RDMA);
/// channels: NET/IB 12, P2P 24`.
pub fn path_line(kind: &str, summary: &Value) -> Option<String> {
    RunSummary::read(kind, summary).path_line()
}

/// What the evidence of a succeeded result of `kind` says against the node's facts.
pub fn findings(kind: &str, summary: &Value, facts: Option<&NodeFacts>) -> Vec<Finding> {
    RunSummary::read(kind, summary).findings(facts)
}

/// Why a job spec's kind or params were refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpecParamsError {
    UnknownKind(String),
    Param(ParamError),
}

impl std::fmt::Display for SpecParamsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SpecParamsError::UnknownKind(kind) => {
                let known: Vec<&str> = KINDS.iter().map(|k| k.name).collect();
                write!(f, "unknown kind {kind:?} (one of {})", known.join(", "))
            }
            SpecParamsError::Param(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for SpecParamsError {}

/// Checks a job's params against its kind. The collective (`op`) is rewritten in its one
/// canonical spelling (`allreduce` → `all_reduce`); the rest is kept as given, so what a
/// run stores is what its creator sent.
pub fn check_params(kind: &str, params: &Params) -> Result<Params, SpecParamsError> {
    let entry = find_kind(kind).ok_or_else(|| SpecParamsError::UnknownKind(kind.into()))?;
    params.typed().map_err(Clone::clone)?;
    let mut raw = params.raw().clone();
    if let Some(normalize) = entry
        .params
        .iter()
        .find(|d| d.name == "op")
        .and_then(|d| d.normalize)
        && let Some(Value::String(op)) = raw.get_mut("op")
    {
        *op = normalize(op)
            .map_err(|m| SpecParamsError::Param(ParamError::new("op", m)))?
            .to_string();
    }
    Ok(Params::new(kind, raw))
}

/// The catalogue, generated from the parameter types: defaults are what `{}` decodes to.
pub fn catalogue() -> Vec<RunKind> {
    KINDS
        .iter()
        .map(|k| {
            let defaults = (k.defaults)();
            RunKind {
                name: k.name.into(),
                description: k.description.into(),
                params: k
                    .params
                    .iter()
                    .map(|p| RunKindParam {
                        name: p.name.into(),
                        ty: p.ty,
                        required: p.required,
                        default: defaults.get(p.name).filter(|v| !v.is_null()).cloned(),
                        unit: p.unit.map(Into::into),
                        min: p.min,
                        max: p.max,
                        choices: p.choices.iter().map(|c| (*c).into()).collect(),
                        help: p.help.into(),
                    })
                    .collect(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests;
