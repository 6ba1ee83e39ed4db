//! One node: facts, the topology heatmap, the recommended environment with the reasons and
//! sources behind each variable, what its NCCL jobs get and what was left out of that, its
//! open regressions (each linking to its series), what every plugin said, and the history
//! of its facts.

use heddle_types::agent::NodeJobEnv;
use heddle_types::facts::NodeFacts;
use heddle_types::health::Verdict;
use heddle_types::node_checks::NodeCheck;
use heddle_types::nodes::{FactsSnapshot, NodeDetail};
use heddle_types::plugins::{Detection, PluginOutcome};
use leptos::prelude::*;
use leptos_router::hooks::use_params_map;

use super::health::verdict_badge;
use super::node_facts::FactsView;
use crate::api::{self, seg};
use crate::topology::Heatmap;
use crate::ui::{ago, liveness_badge, loaded, when};

#[component]
pub fn NodePage() -> impl IntoView {
    let params = use_params_map();
    let id = move || params.with(|p| p.get("id").unwrap_or_default());
    view! { {move || { let id = id(); view! { <NodeView id=id/> } }} }
}

#[component]
fn NodeView(id: String) -> impl IntoView {
    let key = seg(&id);
    let (node, _) = {
        let k = key.clone();
        api::load(move || {
            let k = k.clone();
            async move { api::get::<NodeDetail>(&format!("/nodes/{k}")).await }
        })
    };
    let (env, _) = {
        let k = key.clone();
        api::load(move || {
            let k = k.clone();
            async move { api::get_text(&format!("/nodes/{k}/env")).await }
        })
    };
    let (job_env, _) = {
        let k = key.clone();
        api::load(move || {
            let k = k.clone();
            async move { api::get::<NodeJobEnv>(&format!("/nodes/{k}/job-env")).await }
        })
    };
    let (outcomes, _) = {
        let k = key.clone();
        api::load(move || {
            let k = k.clone();
            async move { api::get::<Vec<PluginOutcome>>(&format!("/nodes/{k}/plugins")).await }
        })
    };
    let (history, _) = api::load(move || {
        let k = key.clone();
        async move { api::get::<Vec<FactsSnapshot>>(&format!("/nodes/{k}/facts/history")).await }
    });
    view! {
        <section class="node">
            {loaded(node, "the node", |n: NodeDetail| view! { <NodeBody node=n/> })}
            <h2>"Environment export"</h2>
            {loaded(env, "the environment", |text: String| view! { <EnvBlock text=text/> })}
            <h2>"Jobs' environment"</h2>
            {loaded(job_env, "the jobs' environment", job_env_view)}
            <h2>"Plugins on this node"</h2>
            {loaded(outcomes, "plugin outcomes", plugin_table)}
            <h2>"Fact history"</h2>
            {loaded(history, "the fact history", history_table)}
        </section>
    }
}

#[component]
fn NodeBody(node: NodeDetail) -> impl IntoView {
    let s = node.summary;
    let facts = node.facts.map(serde_json::from_value::<NodeFacts>);
    let recs = node
        .recommendations
        .iter()
        .map(|r| {
            view! { <tr><td class="mono">{r.name.clone()}</td><td class="mono">{r.value.clone()}</td>
                <td>{r.reason.clone()}</td><td class="mono small">{r.source.clone()}</td></tr> }
        })
        .collect_view();
    let no_recs = node.recommendations.is_empty();
    let checks = checks_table(node.checks);
    let traits = s
        .traits
        .iter()
        .map(|(k, v)| view! { <span class="chip">{format!("{k}={v}")}</span> })
        .collect_view();
    let (facts_view, topo_view) = match facts {
        None => (view! { <p class="empty">"No facts yet: the agent sends them after enrolling."</p> }.into_any(), ().into_any()),
        Some(Err(e)) => (view! { <p class="error">{format!("These facts do not match the dashboard's schema: {e}")}</p> }.into_any(), ().into_any()),
        Some(Ok(f)) => {
            let topo = f.topology.clone();
            let gdr = gpudirect_table(f.gpudirect.clone());
            (view! { {gdr}<FactsView facts=f/> }.into_any(), view! { <Heatmap topology=topo/> }.into_any())
        }
    };
    view! {
        <div class="title-row">
            <h1 id="node-title">{s.hostname.clone()}</h1>
            {liveness_badge(s.liveness.as_str())}
            <span class="muted">{format!("last seen {} · facts {}", ago(s.last_seen_at), ago(s.facts_updated_at))}</span>
        </div>
        <p>{s.site.clone().map(|x| format!("Site {x} · ")).unwrap_or_default()}{traits}</p>
        <h2>"Recommendations"</h2>
        {if no_recs {
            view! { <p class="empty">"No recommendations: no enabled plugin or tuning profile says anything about this node."</p> }.into_any()
        } else {
            view! { <table class="grid" id="recommendations"><thead><tr><th>"Variable"</th><th>"Value"</th><th>"Why"</th><th>"Source"</th></tr></thead>
                <tbody>{recs}</tbody></table> }.into_any()
        }}
        <h2>"Checks"</h2>
        {checks}
        <h2>"Regressions"</h2>
        <super::regressions::NodeRegressions node=s.id.to_string()/>
        <h2>"Workloads"</h2>
        <super::workloads::Workloads node=s.id.to_string()/>
        <h2>"Topology"</h2>
        {topo_view}
        <h2>"Facts"</h2>
        {facts_view}
    }
}

/// GPUDirect RDMA readiness: one row per named check.
fn gpudirect_table(g: Option<heddle_types::facts::GpuDirectFacts>) -> impl IntoView {
    let rows = g
        .map(|g| g.checks)
        .unwrap_or_default()
        .into_iter()
        .map(|c| {
            let state = c.state.clone();
            view! { <tr data-state=state><td class="mono">{c.name}</td><td>{c.state}</td><td>{c.reason}</td></tr> }
        })
        .collect_view();
    view! { <h3>"GPUDirect RDMA"</h3><table class="grid" id="gpudirect"><thead><tr><th>"Check"</th><th>"State"</th><th>"Why"</th></tr></thead><tbody>{rows}</tbody></table> }
}

/// The node's named checks (PCIe links, ECC, port counters, bonds, NCCL config files...),
/// those that warn or fail first, each with its reason in full.
fn checks_table(mut checks: Vec<NodeCheck>) -> impl IntoView {
    if checks.is_empty() {
        return view! { <p class="empty">"No checks yet: they run on the node's facts."</p> }
            .into_any();
    }
    let rank = |v: Verdict| match v {
        Verdict::Fail => 0,
        Verdict::Warn => 1,
        Verdict::Unknown => 2,
        Verdict::Pass => 3,
    };
    checks.sort_by_key(|c| rank(c.state));
    let rows = checks
        .into_iter()
        .map(|c| {
            view! { <tr class=format!("check-{}", c.state)><td class="mono">{c.name}</td>
            <td class="mono">{c.subject.unwrap_or_default()}</td>
            <td>{verdict_badge(c.state)}</td><td>{c.reason}</td></tr> }
        })
        .collect_view();
    view! { <table class="grid" id="checks"><thead><tr><th>"Check"</th><th>"Subject"</th><th>"State"</th><th>"Why"</th></tr></thead>
        <tbody>{rows}</tbody></table> }.into_any()
}

/// The `export` block with a copy button; the text stays selectable for browsers that
/// refuse clipboard access.
#[component]
fn EnvBlock(text: String) -> impl IntoView {
    let copied = RwSignal::new(None::<Result<(), String>>);
    let to_copy = text.clone();
    let copy = move |_| {
        let t = to_copy.clone();
        leptos::task::spawn_local(async move {
            let promise = window().navigator().clipboard().write_text(&t);
            let r = wasm_bindgen_futures::JsFuture::from(promise).await;
            copied.set(Some(r.map(|_| ()).map_err(|e| format!("{e:?}"))));
        });
    };
    let has_exports = text.lines().any(|l| l.starts_with("export "));
    view! {
        <div class="env">
            <button id="copy-env" on:click=copy>"Copy export block"</button>
            {move || copied.get().map(|r| match r {
                Ok(()) => view! { <span class="ok" id="copied">" Copied."</span> }.into_any(),
                Err(e) => view! { <span class="error">{format!(" The browser refused the clipboard ({e}); select the text instead.")}</span> }.into_any(),
            })}
            {(!has_exports).then(|| view! { <p class="muted">"Nothing to export yet."</p> })}
            <pre id="env-block">{text}</pre>
        </div>
    }
}

/// What every NCCL job on the node gets through Heddle's environment plugin, and what the
/// rank-agreement rule left out of it (docs/jobs.md).
fn job_env_view(env: NodeJobEnv) -> impl IntoView {
    let left = env
        .left_out
        .iter()
        .map(|l| view! { <li class="warn"><span class="mono">{l.code.clone()}</span>" "{l.message.clone()}</li> })
        .collect_view();
    let version: String = env.job_env_sha256.chars().take(12).collect();
    view! {
        <p id="job-env">{format!(
            "{} variable(s) reach every NCCL job on this node through Heddle's environment plugin (version {version}).",
            env.entries.len()
        )}</p>
        {(!env.left_out.is_empty()).then(|| view! { <ul class="reasons" id="job-env-left-out">{left}</ul> })}
    }
}

fn plugin_table(outcomes: Vec<PluginOutcome>) -> impl IntoView {
    if outcomes.is_empty() {
        return view! { <p class="empty">"No plugin has run on this node (none enabled, or no facts yet)."</p> }.into_any();
    }
    let rows = outcomes
        .into_iter()
        .map(|o| {
            let said = o.output.as_ref().map(summarize_output).unwrap_or_default();
            let warnings = o
                .output
                .as_ref()
                .map(plugin_warnings)
                .unwrap_or_default()
                .into_iter()
                .map(|w| view! { <li class="warning">{w}</li> })
                .collect_view();
            view! { <tr>
                <td>{format!("{}@{}", o.plugin, o.version)}</td>
                <td>{match o.error {
                    Some(e) => view! { <span class="error">{format!("skipped: the plugin failed, so none of its rules ran: {e}")}</span> }.into_any(),
                    None => view! { <span>{said}</span><ul class="warnings">{warnings}</ul> }.into_any(),
                }}</td>
                <td class="mono small">{usage_line(&o.usage)}</td>
                <td class="muted">{ago(Some(o.ran_at))}</td>
            </tr> }
        })
        .collect_view();
    view! { <table class="grid"><thead><tr><th>"Plugin"</th><th>"Said"</th><th>"Cost"</th><th>"Ran"</th></tr></thead><tbody>{rows}</tbody></table> }.into_any()
}

/// "3 env, 2 traits, 1 warning" from a plugin's output.
pub fn summarize_output(d: &Detection) -> String {
    format!(
        "{} env, {} traits, {} warnings",
        d.env.len(),
        d.traits.len(),
        d.warnings.len()
    )
}

/// Every warning of a plugin's output, in full (dropped ports, rules skipped and why).
pub fn plugin_warnings(d: &Detection) -> Vec<String> {
    d.warnings.clone()
}

/// Fuel, time and peak memory of one plugin call, from its `usage` object.
pub fn usage_line(u: &serde_json::Value) -> String {
    let get = |k: &str| u.get(k).and_then(serde_json::Value::as_f64);
    let mut parts = Vec::new();
    if let Some(f) = get("fuel_consumed").or_else(|| get("fuel")) {
        parts.push(format!("fuel {f:.0}"));
    }
    if let Some(t) = get("elapsed").or_else(|| get("elapsed_us")) {
        parts.push(format!("{:.2} ms", t / 1000.0));
    }
    if let Some(m) = get("peak_memory_bytes").or_else(|| get("memory_bytes")) {
        parts.push(format!("{:.1} MiB", m / 1048576.0));
    }
    if u.get("cache_hit").and_then(serde_json::Value::as_bool) == Some(true) {
        parts.push("cached".into());
    }
    if parts.is_empty() {
        u.to_string()
    } else {
        parts.join(" · ")
    }
}

fn history_table(history: Vec<FactsSnapshot>) -> impl IntoView {
    if history.is_empty() {
        return view! { <p class="empty">"No facts recorded yet."</p> }.into_any();
    }
    let rows = history
        .into_iter()
        .map(|h| {
            let f = &h.facts;
            let count = |p: &str| f.pointer(p).and_then(|x| x.as_array()).map_or(0, Vec::len);
            let states: Vec<String> = f
                .pointer("/rdma/devices")
                .and_then(|d| d.as_array())
                .into_iter()
                .flatten()
                .flat_map(|d| d.get("ports").and_then(|p| p.as_array()).cloned().unwrap_or_default())
                .filter_map(|p| p.get("state").and_then(|s| s.as_str()).map(str::to_string))
                .collect();
            view! { <tr><td>{when(Some(h.collected_at))}</td><td class="mono">{h.facts_sha256[..12.min(h.facts_sha256.len())].to_string()}</td>
                <td>{count("/gpus")}</td><td>{count("/rdma/devices")}</td><td>{states.join(" ")}</td></tr> }
        })
        .collect_view();
    view! { <table class="grid" id="history"><thead><tr><th>"Collected"</th><th>"sha256"</th><th>"GPUs"</th><th>"HCAs"</th><th>"Ports"</th></tr></thead>
        <tbody>{rows}</tbody></table> }.into_any()
}
