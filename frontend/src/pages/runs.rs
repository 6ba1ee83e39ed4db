//! Runs: the launch form (`launch.rs`) and the recent runs. A run starts one job per chosen
//! node, ranked in the order the nodes were ticked.

use heddle_types::auth::Role;
use heddle_types::jobs::Run;
use leptos::prelude::*;

use super::launch::LaunchForm;
use crate::api;
use crate::session::use_session;
use crate::ui::{ago, loaded};

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
                <td>{r.spec.kind.clone()}</td><td>{state_badge(r.state.as_str())}</td><td>{nodes}</td>
                <td>{r.created_by.clone()}</td><td class="muted">{ago(Some(r.created_at))}</td>
            </tr> }
        })
        .collect_view();
    view! { <table class="grid" id="runs-table"><thead><tr><th>"Run"</th><th>"Kind"</th><th>"State"</th><th>"Nodes"</th><th>"By"</th><th>"Started"</th></tr></thead>
        <tbody>{rows}</tbody></table> }.into_any()
}
