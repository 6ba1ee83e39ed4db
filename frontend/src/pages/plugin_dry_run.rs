//! The report of a dry run: what a candidate version would change on every node compared
//! with the version active there now, and what each call cost in the sandbox.

use heddle_types::plugins::{DryRunNode, DryRunReport};
use leptos::prelude::*;

use super::node::usage_line;

fn diff_lines(n: &DryRunNode) -> Vec<(&'static str, String)> {
    let d = &n.diff;
    let mut out = Vec::new();
    let mut add = |class: &'static str, prefix: &str, what: &str, items: &[String]| {
        out.extend(
            items
                .iter()
                .map(|i| (class, format!("{prefix} {what} {i}"))),
        );
    };
    add("add", "+", "env", &d.env_added);
    add("del", "−", "env", &d.env_removed);
    add("chg", "~", "env", &d.env_changed);
    add("add", "+", "trait", &d.traits_added);
    add("del", "−", "trait", &d.traits_removed);
    add("chg", "~", "trait", &d.traits_changed);
    add("add", "+", "warning", &d.warnings_added);
    add("del", "−", "warning", &d.warnings_removed);
    out
}

pub fn report_view(r: DryRunReport) -> impl IntoView {
    let summary = format!(
        "{} {} on {} nodes: {} would change, {} failed.",
        r.plugin,
        r.version,
        r.nodes.len(),
        r.changed,
        r.failed
    );
    if r.nodes.is_empty() {
        return view! { <div class="dry-run" id="dry-run"><p class="empty">"No node has facts yet, so there is nothing to try it on."</p></div> }.into_any();
    }
    let rows = r
        .nodes
        .into_iter()
        .map(|n| {
            let lines = diff_lines(&n);
            let diff = if let Some(e) = &n.error {
                view! { <span class="error">{e.clone()}</span> }.into_any()
            } else if lines.is_empty() {
                view! { <span class="muted">"no change"</span> }.into_any()
            } else {
                lines
                    .into_iter()
                    .map(|(c, l)| view! { <div class=format!("diff {c}")>{l}</div> })
                    .collect_view()
                    .into_any()
            };
            view! { <tr>
                <td>{n.hostname.clone()}</td>
                <td>{n.active_version.clone().unwrap_or_else(|| "none".into())}</td>
                <td class="mono small">{diff}</td>
                <td class="mono small">{usage_line(&n.usage)}</td>
            </tr> }
        })
        .collect_view();
    view! {
        <div class="dry-run" id="dry-run">
            <p id="dry-run-summary">{summary}</p>
            <table class="grid"><thead><tr><th>"Node"</th><th>"Active now"</th><th>"Would change"</th><th>"Fuel · time · memory"</th></tr></thead>
                <tbody>{rows}</tbody></table>
        </div>
    }
    .into_any()
}
