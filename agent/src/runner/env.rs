//! `env`: reports the variables that tune NCCL, UCX and CUDA as the test process got
//! them, with nothing measured. It shows what a node's tests (and jobs started with
//! `heddle env`) really run with: the node's recommendations, tuning profiles and the
//! run's own env, after the agent's filtering.

use std::collections::BTreeMap;

use super::protocol::{ChildEvent, ChildInput};
use super::{RunError, Sink};

/// Prefixes of the variables reported; nothing else of the environment leaves the node.
pub const PREFIXES: &[&str] = &["NCCL_", "UCX_", "CUDA_", "UCC_", "OMPI_MCA_"];

pub fn seen(vars: impl Iterator<Item = (String, String)>) -> BTreeMap<String, String> {
    vars.filter(|(k, _)| PREFIXES.iter().any(|p| k.starts_with(p)))
        .collect()
}

pub fn run(_input: &ChildInput, out: &mut Sink<'_>) -> Result<(), RunError> {
    let mut summary = serde_json::Map::new();
    summary.insert("kind".into(), "env".into());
    summary.insert(
        "env".into(),
        serde_json::to_value(seen(std::env::vars())).expect("strings serialize"),
    );
    out.emit(&ChildEvent::Summary { summary })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_tuning_variables_are_reported() {
        let vars = [
            ("NCCL_IB_HCA", "mlx5_0"),
            ("UCX_TLS", "rc"),
            ("HOME", "/root"),
            ("AWS_SECRET_ACCESS_KEY", "x"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()));
        let got = super::seen(vars.into_iter());
        assert_eq!(got.keys().collect::<Vec<_>>(), ["NCCL_IB_HCA", "UCX_TLS"]);
    }
}
