//! `heddle env NODE --explain` and the plugin findings of `heddle nodes show`: where each
//! variable came from and what it overrode, and every plugin's warnings in full.

use heddle_types::agent::NodeJobEnv;
use heddle_types::health::Verdict;
use heddle_types::node_checks::NodeCheck;
use heddle_types::plugins::PluginOutcome;
use heddle_types::recommend::ExplainedVar;

use crate::client::Client;
use crate::client::encode;
use crate::output::print_json;

/// Prints each variable with its source, reason and the values it overrode.
pub async fn env_explain(client: &Client, node: &str, json: bool) -> anyhow::Result<()> {
    let vars: Vec<ExplainedVar> = client
        .get(&format!("/api/v1/nodes/{}/env/explain", encode(node)))
        .await?;
    if json {
        return print_json(&vars);
    }
    print!("{}", render_explain(node, &vars));
    // What the node env file leaves out of the environment above; an older server does
    // not say, and the explanation stands without it.
    let job_env: Option<NodeJobEnv> = client
        .get(&format!("/api/v1/nodes/{}/job-env", encode(node)))
        .await
        .ok();
    if let Some(env) = job_env {
        print!("{}", render_left_out(&env));
    }
    Ok(())
}

/// The variables of the node's environment its jobs do not get, each as a warning line
/// with its code (`heddle env NODE --format nccl-conf` prints the same on stderr).
pub fn render_left_out(env: &NodeJobEnv) -> String {
    env.left_out
        .iter()
        .map(|l| format!("warning[{}]: {}\n", l.code, one_line(&l.message)))
        .collect()
}

pub fn render_explain(node: &str, vars: &[ExplainedVar]) -> String {
    if vars.is_empty() {
        return format!(
            "# no recommendations for {node}: no enabled plugin applies and no tuning profile \
             covers it (`heddle nodes show {node}` lists the plugins' warnings)\n"
        );
    }
    let mut out = String::new();
    for v in vars {
        out.push_str(&format!("{}={}\n", v.name, v.value));
        out.push_str(&format!("    from      {}\n", v.source));
        out.push_str(&format!("    because   {}\n", one_line(&v.reason)));
        for o in &v.overridden {
            let what = if o.value == v.value {
                format!("same value from {}", o.source)
            } else {
                format!("{} from {} ({})", o.value, o.source, one_line(&o.reason))
            };
            out.push_str(&format!("    overrode  {what}\n"));
        }
        if let Some(note) = agreement_note(v) {
            out.push_str(&format!("    agree     {note}\n"));
        }
    }
    out
}

/// Said of a variable that every rank of a communicator must see alike, when it comes from
/// a source that may not give it to every node: a run across this node and one without
/// the same value is refused.
fn agreement_note(v: &ExplainedVar) -> Option<String> {
    use heddle_types::must_agree::{Mismatch, find, must_agree};
    let (name, source) = (v.name.as_str(), v.source.as_str());
    // A site-wide profile gives every node of the site the same value (the server says
    // so in the reason it writes for profiles).
    if !must_agree(name) || v.reason.starts_with("chosen by site tuning profile") {
        return None;
    }
    let what = match find(name).map(|e| e.mismatch) {
        Some(Mismatch::Error) => "fails",
        _ => "hangs",
    };
    let from = if source.starts_with("plugin:") {
        "this plugin recommends it per node"
    } else {
        "it comes from a per-node source"
    };
    Some(format!(
        "every rank of a communicator must see the same {name} (a mismatch {what}); {from}, \
         so a run across this node and one with another value is refused unless the run \
         sets {name} itself or a site-wide tuning profile gives it to every node"
    ))
}

/// The node's named checks, those that warn or fail first, each with its reason in full.
pub fn checks_table(checks: &[NodeCheck]) -> comfy_table::Table {
    let mut t = crate::table::new(&["CHECK", "SUBJECT", "STATE", "REASON"]);
    let rank = |v: Verdict| match v {
        Verdict::Fail => 0,
        Verdict::Warn => 1,
        Verdict::Unknown => 2,
        Verdict::Pass => 3,
    };
    let mut sorted: Vec<&NodeCheck> = checks.iter().collect();
    sorted.sort_by_key(|c| rank(c.state));
    for c in sorted {
        t.add_row(vec![
            c.name.clone(),
            c.subject.clone().unwrap_or_else(|| "-".into()),
            c.state.to_string(),
            one_line(&c.reason),
        ]);
    }
    t
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Every plugin's warnings in full, and the plugins that failed (their rules did not run).
pub async fn plugin_findings(client: &Client, node: &str) -> anyhow::Result<String> {
    let outcomes: Vec<PluginOutcome> = client
        .get(&format!("/api/v1/nodes/{}/plugins", encode(node)))
        .await?;
    Ok(render_findings(&outcomes))
}

pub fn render_findings(outcomes: &[PluginOutcome]) -> String {
    let mut out = String::new();
    for o in outcomes {
        if let Some(err) = &o.error {
            out.push_str(&format!(
                "skipped  {}@{} failed, so none of its rules ran: {}\n",
                o.plugin,
                o.version,
                one_line(err)
            ));
        }
        for w in o.output.iter().flat_map(|d| &d.warnings) {
            out.push_str(&format!("warning  {}: {}\n", o.plugin, one_line(w)));
        }
    }
    if out.is_empty() && !outcomes.is_empty() {
        out.push_str("plugins: no warnings\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use heddle_types::plugins::Detection;
    use heddle_types::recommend::OverriddenValue;

    #[test]
    fn explain_names_source_reason_and_what_lost() {
        let vars = vec![ExplainedVar {
            name: "NCCL_IB_HCA".into(),
            value: "=mlx5_bond_0".into(),
            source: "plugin:runai-roce@0.1.0".into(),
            reason: "the RoCE devices\n  with an IPv4 GID".into(),
            overridden: vec![
                OverriddenValue {
                    value: "=mlx5_0".into(),
                    source: "plugin:dgx-affinity@0.1.0".into(),
                    reason: "GPU-local".into(),
                },
                OverriddenValue {
                    value: "=mlx5_bond_0".into(),
                    source: "plugin:acme@1".into(),
                    reason: "x".into(),
                },
            ],
        }];
        assert_eq!(
            render_explain("n1", &vars),
            "NCCL_IB_HCA==mlx5_bond_0\n    from      plugin:runai-roce@0.1.0\n    because   the RoCE \
             devices with an IPv4 GID\n    overrode  =mlx5_0 from plugin:dgx-affinity@0.1.0 \
             (GPU-local)\n    overrode  same value from plugin:acme@1\n"
        );
        assert!(render_explain("n1", &[]).contains("no recommendations for n1"));
    }

    #[test]
    fn what_the_node_env_file_leaves_out_is_a_coded_warning() {
        let left = heddle_types::must_agree::LeftOut::unshown(
            "NCCL_ALGO".into(),
            "Ring".into(),
            "the node has no site",
        );
        let env = NodeJobEnv {
            node: "n1".into(),
            job_env_sha256: String::new(),
            entries: vec![],
            left_out: vec![left],
        };
        let text = render_left_out(&env);
        assert!(
            text.starts_with("warning[env-splits-communicator]: NCCL_ALGO=Ring is left out"),
            "{text}"
        );
        assert_eq!(text.lines().count(), 1, "{text}");
    }

    #[test]
    fn a_per_node_must_agree_value_is_flagged() {
        let var = |name: &str, source: &str, reason: &str| ExplainedVar {
            name: name.into(),
            value: "1".into(),
            source: source.into(),
            reason: reason.into(),
            overridden: vec![],
        };
        let text = render_explain(
            "n1",
            &[
                var("NCCL_ALGO", "plugin:acme@1", "x"),
                var("NCCL_IB_HCA", "plugin:acme@1", "x"),
                var(
                    "NCCL_PROTO",
                    "tuning:fast",
                    "chosen by node tuning profile \"fast\"",
                ),
                var(
                    "NCCL_BUFFSIZE",
                    "tuning:dc1",
                    "chosen by site tuning profile \"dc1\"",
                ),
            ],
        );
        let agree: Vec<&str> = text.lines().filter(|l| l.contains("agree  ")).collect();
        assert_eq!(agree.len(), 2, "{text}");
        assert!(
            agree[0].contains("same NCCL_ALGO")
                && agree[0].contains("this plugin recommends it per node")
        );
        assert!(agree[1].contains("same NCCL_PROTO") && agree[1].contains("per-node source"));
    }

    #[test]
    fn findings_list_every_warning_and_failure() {
        let outcome =
            |plugin: &str, output: Option<Detection>, error: Option<&str>| PluginOutcome {
                node_id: uuid::Uuid::nil(),
                hostname: "n1".into(),
                plugin: plugin.into(),
                version: "0.1.0".into(),
                output,
                error: error.map(str::to_string),
                usage: serde_json::json!({}),
                ran_at: chrono::Utc::now(),
            };
        let text = render_findings(&[
            outcome(
                "dgx-affinity",
                Some(Detection {
                    warnings: vec!["mlx5_7 port 1 is DOWN".into(), "GPU5 far".into()],
                    ..Detection::default()
                }),
                None,
            ),
            outcome("broken", None, Some("trap: boom [trap]")),
        ]);
        assert_eq!(
            text,
            "warning  dgx-affinity: mlx5_7 port 1 is DOWN\nwarning  dgx-affinity: GPU5 far\n\
             skipped  broken@0.1.0 failed, so none of its rules ran: trap: boom [trap]\n"
        );
    }
}
