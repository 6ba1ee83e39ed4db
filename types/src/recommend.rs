//! How recommendations from several sources become one environment: the one conflict rule,
//! used by the server (env export, `heddle env --explain`) and the agent (`detect`), and
//! the shape that explains its outcome.
//!
//! The rule, in rising precedence (the later one wins a variable):
//!
//! 1. plugins: the first-party ones in [`FIRST_PARTY_ORDER`] (generic topology before the
//!    environment-specific detectors), then every other plugin by name;
//! 2. recommendations an operator put under a source of their own, by source name;
//! 3. site tuning profiles, oldest first;
//! 4. node tuning profiles, oldest first.
//!
//! Every value that lost is kept in [`ExplainedVar::overridden`] with its source, so
//! nothing is dropped silently.
//!
//! A node's traits from several sources (plugins, an operator's sets) are merged by the same
//! rule, key by key ([`merge_traits`]).

use serde::{Deserialize, Serialize};

/// Built-in plugins, lowest precedence first: generic topology, then the detectors of a
/// specific environment, whose values are the more specific ones.
pub const FIRST_PARTY_ORDER: &[&str] = &["dgx-affinity", "azure-nd", "runai-roce"];

/// Where a candidate value sits in the rule. Compared field by field: `layer` first.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Rank {
    layer: Layer,
    /// Position among first-party plugins; every other source shares the last tier.
    tier: usize,
    name: String,
    seq: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Layer {
    Plugin,
    Operator,
    SiteProfile,
    NodeProfile,
}

impl Rank {
    /// A plugin's output, by the plugin's name (without version).
    pub fn plugin(name: &str) -> Self {
        Rank {
            layer: Layer::Plugin,
            tier: FIRST_PARTY_ORDER
                .iter()
                .position(|p| *p == name)
                .unwrap_or(FIRST_PARTY_ORDER.len()),
            name: name.to_string(),
            seq: 0,
        }
    }

    /// A set an operator put under a source of their own.
    pub fn operator(source: &str) -> Self {
        Rank {
            layer: Layer::Operator,
            tier: 0,
            name: source.to_string(),
            seq: 0,
        }
    }

    /// A tuning profile; `seq` orders profiles of one scope (creation order).
    pub fn profile(node_level: bool, seq: u64) -> Self {
        Rank {
            layer: if node_level {
                Layer::NodeProfile
            } else {
                Layer::SiteProfile
            },
            tier: 0,
            name: String::new(),
            seq,
        }
    }

    /// The rank of a stored source string: `plugin:<name>@<version>`, `tuning:<profile>`
    /// (pass `profile` for those) or an operator's own.
    pub fn of_source(source: &str) -> Self {
        match source.strip_prefix("plugin:") {
            Some(rest) => Rank::plugin(rest.split('@').next().unwrap_or(rest)),
            None => Rank::operator(source),
        }
    }
}

/// One value offered for a variable.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub name: String,
    pub value: String,
    pub reason: String,
    /// `plugin:<name>@<version>`, `tuning:<profile>`, or an operator's source.
    pub source: String,
    pub rank: Rank,
}

/// A variable of the effective environment: the value that won, where it came from and why,
/// and every value it overrode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ExplainedVar {
    pub name: String,
    pub value: String,
    pub source: String,
    pub reason: String,
    /// The values that lost, highest precedence first.
    #[serde(default)]
    pub overridden: Vec<OverriddenValue>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OverriddenValue {
    pub value: String,
    pub source: String,
    pub reason: String,
}

/// Applies the rule: per variable (sorted by name) the highest-ranked candidate wins. Of two
/// candidates with equal rank the later one wins, so a caller can pass profiles in order.
pub fn resolve(candidates: impl IntoIterator<Item = Candidate>) -> Vec<ExplainedVar> {
    let mut by_name: std::collections::BTreeMap<String, Vec<(usize, Candidate)>> =
        std::collections::BTreeMap::new();
    for (i, c) in candidates.into_iter().enumerate() {
        by_name.entry(c.name.clone()).or_default().push((i, c));
    }
    by_name
        .into_iter()
        .map(|(name, mut list)| {
            // Highest precedence first.
            list.sort_by(|(ia, a), (ib, b)| b.rank.cmp(&a.rank).then(ib.cmp(ia)));
            let mut it = list.into_iter().map(|(_, c)| c);
            let winner = it.next().expect("a group has at least one candidate");
            ExplainedVar {
                name,
                value: winner.value,
                source: winner.source,
                reason: winner.reason,
                overridden: it
                    .map(|c| OverriddenValue {
                        value: c.value,
                        source: c.source,
                        reason: c.reason,
                    })
                    .collect(),
            }
        })
        .collect()
}

/// Merges traits from several sources by the rule above: per key the value of the
/// highest-ranked source wins (of two equal ranks, the later one).
pub fn merge_traits<'a>(
    sources: impl IntoIterator<
        Item = (
            Rank,
            &'a str,
            &'a std::collections::BTreeMap<String, String>,
        ),
    >,
) -> std::collections::BTreeMap<String, String> {
    let candidates = sources.into_iter().flat_map(|(rank, source, traits)| {
        traits.iter().map(move |(k, v)| Candidate {
            name: k.clone(),
            value: v.clone(),
            reason: String::new(),
            source: source.to_string(),
            rank: rank.clone(),
        })
    });
    resolve(candidates)
        .into_iter()
        .map(|v| (v.name, v.value))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(name: &str, value: &str, source: &str, rank: Rank) -> Candidate {
        Candidate {
            name: name.into(),
            value: value.into(),
            reason: format!("because {source}"),
            source: source.into(),
            rank,
        }
    }

    #[test]
    fn specific_plugins_beat_generic_ones_and_profiles_beat_plugins() {
        let out = resolve([
            c("A", "3", "tuning:n", Rank::profile(true, 0)),
            c(
                "A",
                "1",
                "plugin:runai-roce@0.1.0",
                Rank::of_source("plugin:runai-roce@0.1.0"),
            ),
            c("A", "2", "tuning:s", Rank::profile(false, 0)),
            c(
                "B",
                "x",
                "plugin:runai-roce@0.1.0",
                Rank::plugin("runai-roce"),
            ),
            c(
                "B",
                "y",
                "plugin:dgx-affinity@0.1.0",
                Rank::plugin("dgx-affinity"),
            ),
            c("B", "z", "plugin:azure-nd@0.1.0", Rank::plugin("azure-nd")),
        ]);
        assert_eq!(
            (out[0].value.as_str(), out[0].source.as_str()),
            ("3", "tuning:n")
        );
        let losers: Vec<_> = out[0]
            .overridden
            .iter()
            .map(|o| o.source.as_str())
            .collect();
        assert_eq!(losers, ["tuning:s", "plugin:runai-roce@0.1.0"]);
        assert_eq!(out[1].value, "x");
        assert_eq!(out[1].overridden[0].value, "z");
        assert_eq!(
            out[1].overridden[1].reason,
            "because plugin:dgx-affinity@0.1.0"
        );
    }

    #[test]
    fn traits_follow_the_rule_of_env_recommendations() {
        let map = |pairs: &[(&str, &str)]| -> std::collections::BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let (runai, dgx, zeta, ops) = (
            map(&[("fabric", "roce"), ("orchestrator", "runai")]),
            map(&[("fabric", "ib"), ("gpus", "8")]),
            map(&[("gpus", "4")]),
            map(&[("orchestrator", "slurm")]),
        );
        // Given in an order where "the source that sorts last wins" would pick otherwise.
        let merged = merge_traits([
            (Rank::operator("ops"), "ops", &ops),
            (Rank::plugin("runai-roce"), "plugin:runai-roce", &runai),
            (Rank::plugin("zeta"), "plugin:zeta", &zeta),
            (Rank::plugin("dgx-affinity"), "plugin:dgx-affinity", &dgx),
        ]);
        // runai-roce is more specific than dgx-affinity (given last); zeta, a plugin of the
        // site's own, beats the built-in dgx-affinity.
        assert_eq!(merged["fabric"], "roce");
        assert_eq!(merged["gpus"], "4");
        // An operator's own set beats every plugin, though "ops" sorts before "plugin:".
        assert_eq!(merged["orchestrator"], "slurm");
    }

    #[test]
    fn operator_plugins_beat_built_ins_by_name_and_later_profiles_win() {
        let out = resolve([
            c("A", "mine", "plugin:acme@1", Rank::plugin("acme")),
            c(
                "A",
                "roce",
                "plugin:runai-roce@1",
                Rank::plugin("runai-roce"),
            ),
            c("A", "zz", "plugin:zeta@1", Rank::plugin("zeta")),
            c("B", "old", "tuning:a", Rank::profile(true, 1)),
            c("B", "new", "tuning:b", Rank::profile(true, 2)),
            c("C", "manual", "ops", Rank::of_source("ops")),
            c(
                "C",
                "plugin",
                "plugin:zeta@1",
                Rank::of_source("plugin:zeta@1"),
            ),
        ]);
        assert_eq!(out[0].value, "zz");
        assert_eq!(out[0].overridden[0].value, "mine");
        assert_eq!(out[1].value, "new");
        assert_eq!(out[2].value, "manual");
    }
}
