//! Runs: the launch form and the recent runs. A run starts one job per chosen node, ranked
//! in the order the nodes were ticked.

use std::collections::BTreeMap;

use heddle_types::auth::Role;
use heddle_types::jobs::{Run, RunCreate};
use heddle_types::nodes::NodeSummary;
use leptos::prelude::*;
use leptos_router::hooks::use_navigate;

use crate::api::{self, ApiError};
use crate::session::use_session;
use crate::ui::{ago, error_line, loaded};

/// `NAME=value` lines into a map; blank lines and `#` comments are skipped, and a leading
/// `export ` is accepted so a copied export block can be pasted as is.
pub fn parse_env(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line);
        let Some((k, v)) = line.split_once('=') else {
            return Err(format!("line {}: expected NAME=value, got {line:?}", i + 1));
        };
        let v = v.trim().trim_matches('\'').trim_matches('"');
        out.insert(k.trim().to_string(), v.to_string());
    }
    Ok(out)
}

pub fn state_badge(state: &str) -> impl IntoView + use<> {
    let class = match state {
        "succeeded" => "badge good",
        "failed" | "cancelled" => "badge bad",
        "running" | "leased" => "badge run",
        _ => "badge warn",
    };
    view! { <span class=class>{state.to_string()}</span> }
}

#[component]
pub fn Runs() -> impl IntoView {
    let session = use_session();
    let (runs, _) = api::load(|| api::get::<Vec<Run>>("/runs?limit=50"));
    view! {
        <section>
            <h1>"Runs"</h1>
            {move || if session.can(Role::Operator) {
                view! { <LaunchForm/> }.into_any()
            } else {
                view! { <p class="muted">"Your role cannot start runs (operators and admins can)."</p> }.into_any()
            }}
            <h2>"Recent runs"</h2>
            {loaded(runs, "runs", run_table)}
        </section>
    }
}

fn run_table(runs: Vec<Run>) -> impl IntoView {
    if runs.is_empty() {
        return view! { <p class="empty" id="runs-empty">"No runs yet."</p> }.into_any();
    }
    let rows = runs
        .into_iter()
        .map(|r| {
            let nodes = r.jobs.iter().map(|j| j.hostname.clone()).collect::<Vec<_>>().join(", ");
            view! { <tr>
                <td><a href=format!("/runs/{}", r.id)>{r.label.clone().unwrap_or_else(|| r.id.to_string()[..8].to_string())}</a></td>
                <td>{r.spec.kind.clone()}</td><td>{state_badge(&r.state)}</td><td>{nodes}</td>
                <td>{r.created_by.clone()}</td><td class="muted">{ago(Some(r.created_at))}</td>
            </tr> }
        })
        .collect_view();
    view! { <table class="grid" id="runs-table"><thead><tr><th>"Run"</th><th>"Kind"</th><th>"State"</th><th>"Nodes"</th><th>"By"</th><th>"Started"</th></tr></thead>
        <tbody>{rows}</tbody></table> }.into_any()
}

#[component]
fn LaunchForm() -> impl IntoView {
    let (nodes, _) = api::load(|| api::get::<Vec<NodeSummary>>("/nodes"));
    let kind = RwSignal::new("nccl".to_string());
    let picked = RwSignal::new(Vec::<String>::new());
    let params = RwSignal::new(String::from("{}"));
    let env = RwSignal::new(String::new());
    let label = RwSignal::new(String::new());
    let timeout = RwSignal::new(String::new());
    let error = RwSignal::new(None::<String>);
    let refused = RwSignal::new(None::<ApiError>);
    let busy = RwSignal::new(false);
    let navigate = use_navigate();
    let submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        refused.set(None);
        let params_v =
            match serde_json::from_str::<serde_json::Value>(params.get_untracked().trim()) {
                Ok(v) if v.is_object() => v,
                Ok(_) => return error.set(Some("params must be a JSON object".into())),
                Err(e) => return error.set(Some(format!("params are not JSON: {e}"))),
            };
        let env_v = match parse_env(&env.get_untracked()) {
            Ok(v) => v,
            Err(e) => return error.set(Some(format!("env: {e}"))),
        };
        let timeout_s = match timeout.get_untracked().trim() {
            "" => None,
            t => match t.parse::<u32>() {
                Ok(v) => Some(v),
                Err(_) => return error.set(Some("timeout must be whole seconds".into())),
            },
        };
        if picked.get_untracked().is_empty() {
            return error.set(Some("pick at least one node".into()));
        }
        error.set(None);
        let label_v = label.get_untracked().trim().to_string();
        let body = RunCreate {
            kind: kind.get_untracked().trim().to_string(),
            params: params_v,
            env: env_v,
            timeout_s,
            nodes: picked.get_untracked(),
            max_attempts: None,
            label: (!label_v.is_empty()).then_some(label_v),
            recommended_env: None,
        };
        busy.set(true);
        let navigate = navigate.clone();
        leptos::task::spawn_local(async move {
            match api::post::<_, Run>("/runs", &body).await {
                Ok(run) => navigate(&format!("/runs/{}", run.id), Default::default()),
                Err(e) => refused.set(Some(e)),
            }
            busy.set(false);
        });
    };
    let node_boxes = move |all: Vec<NodeSummary>| {
        if all.is_empty() {
            return view! { <p class="empty">"No nodes to run on yet."</p> }.into_any();
        }
        all.into_iter()
            .map(|n| {
                let host = n.hostname.clone();
                let h2 = host.clone();
                let toggle = move |ev| {
                    let on = event_target_checked(&ev);
                    picked.update(|p| {
                        p.retain(|x| x != &h2);
                        if on {
                            p.push(h2.clone());
                        }
                    });
                };
                view! { <label class="node-pick"><input type="checkbox" name="node" value=host.clone() on:change=toggle/>
                    {format!(" {host} ({})", n.health)}</label> }
            })
            .collect_view()
            .into_any()
    };
    view! {
        <form class="launch" id="launch" on:submit=submit>
            <h2>"Launch a run"</h2>
            <div class="form-grid">
                <label for="run-kind">"Kind"</label>
                <div>
                    <input id="run-kind" list="kinds" prop:value=move || kind.get() on:input=move |ev| kind.set(event_target_value(&ev))/>
                    <datalist id="kinds"><option value="nccl"/><option value="memcpy"/><option value="rdma"/><option value="rdma_ab"/><option value="ucx"/>
                        <option value="p2p"/><option value="sweep"/><option value="sleep"/></datalist>
                </div>
                <span>"Nodes (rank = order ticked)"</span>
                <div class="node-picks">{loaded(nodes, "nodes", node_boxes)}</div>
                <label for="run-params">"Params (JSON)"</label>
                <textarea id="run-params" rows="3" prop:value=move || params.get() on:input=move |ev| params.set(event_target_value(&ev))></textarea>
                <label for="run-env">"Env (NAME=value lines)"</label>
                <textarea id="run-env" rows="3" placeholder="NCCL_IB_HCA=mlx5_0" prop:value=move || env.get() on:input=move |ev| env.set(event_target_value(&ev))></textarea>
                <label for="run-timeout">"Timeout (s)"</label>
                <input id="run-timeout" inputmode="numeric" prop:value=move || timeout.get() on:input=move |ev| timeout.set(event_target_value(&ev))/>
                <label for="run-label">"Label"</label>
                <input id="run-label" prop:value=move || label.get() on:input=move |ev| label.set(event_target_value(&ev))/>
            </div>
            <p class="muted">{move || format!("Order: {}", picked.with(|p| if p.is_empty() { "none ticked".into() } else { p.join(" → ") }))}</p>
            <button type="submit" id="run-start" disabled=move || busy.get()>{move || if busy.get() { "Starting…" } else { "Start run" }}</button>
            {move || error.get().map(|e| view! { <p class="error" role="alert">{e}</p> })}
            {move || refused.get().map(|e| error_line("The server refused the run", &e))}
        </form>
    }
}
