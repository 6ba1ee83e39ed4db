//! Investigations ("which node is bad?"): the list with verdicts and culprits, and one
//! investigation's progress, node×node matrix and culprits, polled while it runs.

use std::time::Duration;

use heddle_types::investigations::{Investigation, InvestigationState, InvestigationSummary};
use leptos::prelude::*;
use leptos_router::hooks::use_params_map;
use uuid::Uuid;

use crate::api::{self, Load};
use crate::matrix::{AnalysisView, MatrixHeatmap, conclusion_badge};
use crate::ui::{ago, loaded, when};

pub fn investigation_state_badge(s: InvestigationState) -> impl IntoView + use<> {
    let class = match s {
        InvestigationState::Running => "badge run",
        InvestigationState::Done => "badge good",
        InvestigationState::Failed => "badge bad",
    };
    view! { <span class=class>{s.as_str()}</span> }
}

#[component]
pub fn Investigations() -> impl IntoView {
    let (list, _) = api::load(|| api::get::<Vec<InvestigationSummary>>("/investigations?limit=50"));
    view! {
        <section>
            <h1>"Investigations"</h1>
            <p class="muted">"Pairwise runs over a set of nodes that name the slow node or link. Started with "
                <code>"heddle investigate"</code>" or by a failing multi-node run."</p>
            {loaded(list, "investigations", table)}
        </section>
    }
}

fn table(list: Vec<InvestigationSummary>) -> impl IntoView {
    if list.is_empty() {
        return view! { <p class="empty" id="investigations-empty">"No investigations yet."</p> }
            .into_any();
    }
    let rows = list
        .into_iter()
        .map(|i| {
            let name = i.label.clone().unwrap_or_else(|| i.id.to_string()[..8].to_string());
            let culprits = i.culprits.iter().map(|c| c.members.join("↔")).collect::<Vec<_>>().join(", ");
            view! { <tr>
                <td><a href=format!("/investigations/{}", i.id)>{name}</a></td>
                <td>{i.kind.as_str()}</td>
                <td>{investigation_state_badge(i.state)}</td>
                <td>{format!("{}/{} pairs", i.progress.pairs_done + i.progress.pairs_failed, i.progress.pairs_total)}</td>
                <td>{conclusion_badge(i.verdict)}" "{culprits}</td>
                <td>{i.nodes.join(", ")}</td>
                <td class="muted">{ago(Some(i.created_at))}</td>
            </tr> }
        })
        .collect_view();
    view! { <table class="grid" id="investigations-table"><thead><tr><th>"Investigation"</th><th>"Kind"</th><th>"State"</th>
        <th>"Progress"</th><th>"Verdict"</th><th>"Nodes"</th><th>"Started"</th></tr></thead><tbody>{rows}</tbody></table> }
    .into_any()
}

#[component]
pub fn InvestigationPage() -> impl IntoView {
    let params = use_params_map();
    move || {
        let id = params.with(|p| p.get("id").unwrap_or_default());
        match id.parse::<Uuid>() {
            Ok(id) => view! { <InvestigationView id=id/> }.into_any(),
            Err(_) => {
                view! { <p class="error">{format!("{id:?} is not an investigation id.")}</p> }
                    .into_any()
            }
        }
    }
}

#[component]
fn InvestigationView(id: Uuid) -> impl IntoView {
    let (inv, reload) = api::load(move || async move {
        api::get::<Investigation>(&format!("/investigations/{id}")).await
    });
    if let Ok(handle) = set_interval_with_handle(
        move || {
            let running = inv.with_untracked(|i| match i {
                Load::Ready(i) => i.state == InvestigationState::Running,
                _ => true,
            });
            if running {
                reload();
            }
        },
        Duration::from_secs(2),
    ) {
        on_cleanup(move || handle.clear());
    }
    view! { <section>{loaded(inv, "the investigation", detail)}</section> }
}

fn detail(i: Investigation) -> impl IntoView {
    let p = &i.progress;
    let ended = p.pairs_done + p.pairs_failed;
    let pct = if p.pairs_total > 0 {
        100.0 * f64::from(ended) / f64::from(p.pairs_total)
    } else {
        0.0
    };
    let title = i
        .label
        .clone()
        .unwrap_or_else(|| format!("Investigation {}", &i.id.to_string()[..8]));
    let pairs = i
        .pairs
        .iter()
        .map(|pair| {
            view! { <tr>
                <td class="mono">{format!("{} ↔ {}", pair.a, pair.b)}</td><td>{pair.batch}</td>
                <td>{format!("{:?}", pair.state).to_lowercase()}</td>
                <td class="num">{pair.value.map(|v| format!("{v:.2}")).unwrap_or_else(|| "—".into())}</td>
                <td>{pair.run_id.map(|r| view! { <a href=format!("/runs/{r}")>{r.to_string()[..8].to_string()}</a> })}</td>
                <td class="error">{pair.error.clone()}</td>
            </tr> }
        })
        .collect_view();
    // 0 queues every pair at once, each node working through its pairs round by round.
    let batches = match i.batch_size {
        0 => "every pair queued at once".to_string(),
        k => format!("at most {k} pairs at once"),
    };
    view! {
        <div class="title-row"><h1>{title}</h1><span id="investigation-state">{investigation_state_badge(i.state)}</span></div>
        <p class="muted">{format!("{} test over {} nodes, {}; started by {} {}, finished {}",
            i.kind.as_str(), i.nodes.len(), batches, i.created_by, when(Some(i.created_at)), when(i.finished_at))}</p>
        <p id="investigation-progress">
            <progress max="100" value=format!("{pct:.0}")></progress>
            {format!(" {ended}/{} pairs ({} failed, {} running), {} batches", p.pairs_total, p.pairs_failed, p.pairs_running, p.batches_total)}
        </p>
        {i.error.clone().map(|e| view! { <p class="error">{e}</p> })}
        <h2>"Node × node"</h2>
        <MatrixHeatmap matrix=i.matrix.clone() analysis=i.analysis.clone() id="node-matrix"/>
        <h2>"Culprits"</h2>
        <AnalysisView analysis=i.analysis.clone()/>
        <h2>"Pairs"</h2>
        <table class="grid" id="pairs"><thead><tr><th>"Pair"</th><th>"Batch"</th><th>"State"</th><th>{i.matrix.metric.clone()}</th><th>"Run"</th><th>"Error"</th></tr></thead>
            <tbody>{pairs}</tbody></table>
    }
}
