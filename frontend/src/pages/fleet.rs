//! Every node, problems first, with a search box and filters. Filtering happens here on the
//! list the server sent: a fleet is thousands of rows at most, and typing stays instant.

use heddle_types::nodes::NodeSummary;
use leptos::prelude::*;

use crate::api::{self, Load};
use crate::ui::{ago, health_badge, loaded, port_badge};

/// Why a node needs a look, most serious first; empty for a healthy node.
pub fn problems(n: &NodeSummary) -> Vec<String> {
    let mut out = Vec::new();
    match n.health.as_str() {
        "online" => {}
        other => out.push(format!("agent {other}")),
    }
    if n.facts_updated_at.is_none() {
        out.push("no facts yet".into());
    }
    let down = n
        .port_states
        .iter()
        .filter(|s| s.as_str() != "ACTIVE")
        .count();
    if down > 0 {
        out.push(format!(
            "ports {}",
            n.port_states
                .iter()
                .filter(|s| s.as_str() != "ACTIVE")
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    out
}

fn severity(n: &NodeSummary) -> u8 {
    let health = match n.health.as_str() {
        "offline" => 4,
        "stale" => 2,
        _ => 0,
    };
    health
        + u8::from(n.port_states.iter().any(|s| s != "ACTIVE"))
        + u8::from(n.facts_updated_at.is_none())
}

fn matches(n: &NodeSummary, q: &str, health: &str, layer: &str, only_problems: bool) -> bool {
    let q = q.trim().to_lowercase();
    let text = q.is_empty()
        || n.hostname.to_lowercase().contains(&q)
        || n.gpu_model
            .as_deref()
            .is_some_and(|m| m.to_lowercase().contains(&q))
        || n.site
            .as_deref()
            .is_some_and(|s| s.to_lowercase().contains(&q))
        || n.hcas.iter().any(|h| h.to_lowercase().contains(&q))
        || n.traits
            .iter()
            .any(|(k, v)| format!("{k}={v}").to_lowercase().contains(&q));
    let health_ok = health.is_empty() || n.health == health;
    let layer_ok = match layer {
        "" => true,
        "none" => n.link_layers.is_empty(),
        l => n.link_layers.iter().any(|x| x == l),
    };
    text && health_ok && layer_ok && (!only_problems || severity(n) > 0)
}

#[component]
pub fn Fleet() -> impl IntoView {
    let (nodes, reload) = api::load(|| api::get::<Vec<NodeSummary>>("/nodes"));
    let q = RwSignal::new(String::new());
    let health = RwSignal::new(String::new());
    let layer = RwSignal::new(String::new());
    let only_problems = RwSignal::new(false);
    // Time to first render, readable by tests and by a person in the browser's performance
    // panel: navigation start to the first fleet table with data.
    let marked = StoredValue::new(false);
    Effect::new(move || {
        if matches!(nodes.get(), Load::Ready(_)) && !marked.get_value() {
            marked.set_value(true);
            if let Some(p) = window().performance() {
                let _ = p.mark("heddle:fleet-rendered");
            }
        }
    });
    let table = move |all: Vec<NodeSummary>| {
        if all.is_empty() {
            return view! {
                <div class="empty" id="fleet-empty">
                    <p>"No nodes yet. Nodes appear when an agent enrolls."</p>
                    <p><a href="/agents">"Create an enrollment token"</a>" to start one."</p>
                </div>
            }
            .into_any();
        }
        let total = all.len();
        let rows = move || {
            let (qv, hv, lv, pv) = (q.get(), health.get(), layer.get(), only_problems.get());
            let mut shown: Vec<&NodeSummary> = all
                .iter()
                .filter(|n| matches(n, &qv, &hv, &lv, pv))
                .collect();
            shown.sort_by(|a, b| {
                severity(b)
                    .cmp(&severity(a))
                    .then_with(|| a.hostname.cmp(&b.hostname))
            });
            let count = shown.len();
            let body = shown.into_iter().map(row).collect_view();
            view! {
                <p class="muted" id="fleet-count">{format!("{count} of {total} nodes")}</p>
                <table class="grid" id="fleet-table">
                    <thead><tr>
                        <th>"Node"</th><th>"Health"</th><th>"GPUs"</th><th>"HCAs"</th><th>"Ports"</th>
                        <th>"Link"</th><th>"Traits"</th><th>"Problems"</th><th>"Last seen"</th>
                    </tr></thead>
                    <tbody>{body}</tbody>
                </table>
            }
        };
        rows.into_any()
    };
    view! {
        <section>
            <div class="title-row">
                <h1>"Fleet"</h1>
                <button class="link" on:click=move |_| reload()>"Refresh"</button>
            </div>
            <div class="filters">
                <input id="fleet-search" type="search" placeholder="Search host, GPU, HCA, trait, site…"
                    prop:value=move || q.get() on:input=move |ev| q.set(event_target_value(&ev)) />
                <select id="fleet-health" on:change=move |ev| health.set(event_target_value(&ev))>
                    <option value="">"Any health"</option>
                    <option value="online">"Online"</option>
                    <option value="stale">"Stale"</option>
                    <option value="offline">"Offline"</option>
                </select>
                <select id="fleet-layer" on:change=move |ev| layer.set(event_target_value(&ev))>
                    <option value="">"Any link layer"</option>
                    <option value="InfiniBand">"InfiniBand"</option>
                    <option value="Ethernet">"RoCE / Ethernet"</option>
                    <option value="none">"No RDMA"</option>
                </select>
                <label><input type="checkbox" id="fleet-problems"
                    on:change=move |ev| only_problems.set(event_target_checked(&ev)) />" Problems only"</label>
            </div>
            {loaded(nodes, "nodes", table)}
        </section>
    }
}

fn row(n: &NodeSummary) -> impl IntoView + use<> {
    let problems = problems(n);
    let class = if problems.is_empty() { "" } else { "problem" };
    let gpus = match (&n.gpu_model, n.gpu_count) {
        (_, 0) => "none".to_string(),
        (Some(m), c) => format!("{c} × {m}"),
        (None, c) => format!("{c} × unknown"),
    };
    let href = format!("/nodes/{}", n.id);
    let ports = n.port_states.iter().map(|s| port_badge(s)).collect_view();
    let traits = n
        .traits
        .iter()
        .map(|(k, v)| view! { <span class="chip">{format!("{k}={v}")}</span> })
        .collect_view();
    view! {
        <tr class=class data-host=n.hostname.clone()>
            <td><a href=href>{n.hostname.clone()}</a>{n.site.clone().map(|s| view! { <span class="muted">{format!(" · {s}")}</span> })}</td>
            <td>{health_badge(&n.health)}</td>
            <td>{gpus}</td>
            <td class="mono">{if n.hcas.is_empty() { "—".to_string() } else { n.hcas.join(" ") }}</td>
            <td>{ports}</td>
            <td>{n.link_layers.join(", ")}</td>
            <td>{traits}</td>
            <td class="problems">{problems.join("; ")}</td>
            <td class="muted">{ago(n.last_seen_at)}</td>
        </tr>
    }
}
