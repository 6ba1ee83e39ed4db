//! Sweeps: the `sweep` runs, and one sweep's cells × size bands with each band's best cell
//! highlighted (what `heddle sweeps show` prints).

use heddle_types::jobs::Run;
use heddle_types::sweeps::{Band, SweepTable};
use leptos::prelude::*;
use leptos_router::hooks::use_params_map;
use uuid::Uuid;

use crate::api;
use crate::pages::runs::state_badge;
use crate::ui::{ago, loaded, opt_num};

/// A list of the runs of one kind, each linking to `{base}/{id}`.
pub fn kind_runs_table(runs: Vec<Run>, base: &'static str, id: &'static str) -> AnyView {
    if runs.is_empty() {
        return view! { <p class="empty">"None yet. Start one from the Runs page."</p> }.into_any();
    }
    let rows = runs
        .into_iter()
        .map(|r| {
            let name = r.label.clone().unwrap_or_else(|| r.id.to_string()[..8].to_string());
            let nodes = r.jobs.iter().map(|j| j.hostname.clone()).collect::<Vec<_>>().join(", ");
            view! { <tr>
                <td><a href=format!("{base}/{}", r.id)>{name}</a></td><td>{state_badge(r.state.as_str())}</td>
                <td>{nodes}</td><td class="muted">{ago(Some(r.created_at))}</td>
            </tr> }
        })
        .collect_view();
    view! { <table class="grid" id=id><thead><tr><th>"Run"</th><th>"State"</th><th>"Nodes"</th><th>"Started"</th></tr></thead>
        <tbody>{rows}</tbody></table> }
    .into_any()
}

#[component]
pub fn Sweeps() -> impl IntoView {
    let (runs, _) = api::load(|| api::get::<Vec<Run>>("/runs?kind=sweep&limit=50"));
    view! {
        <section>
            <h1>"Sweeps"</h1>
            <p class="muted">"NCCL measured over a grid of NCCL variables on one node; each size band's best cell can be kept as a tuning profile ("
                <code>"heddle sweeps keep"</code>")."</p>
            {loaded(runs, "sweeps", |r| kind_runs_table(r, "/sweeps", "sweeps-table"))}
        </section>
    }
}

#[component]
pub fn SweepPage() -> impl IntoView {
    let params = use_params_map();
    move || {
        let id = params.with(|p| p.get("id").unwrap_or_default());
        match id.parse::<Uuid>() {
            Ok(id) => {
                let (table, _) = api::load(move || async move {
                    api::get::<SweepTable>(&format!("/runs/{id}/sweep")).await
                });
                view! { <section>
                    <div class="title-row"><h1>"Sweep"</h1><a href=format!("/runs/{id}")>"the run"</a></div>
                    {loaded(table, "the sweep", sweep_table)}
                </section> }
                .into_any()
            }
            Err(_) => {
                view! { <p class="error">{format!("{id:?} is not a run id.")}</p> }.into_any()
            }
        }
    }
}

fn sweep_table(t: SweepTable) -> impl IntoView {
    let names: Vec<String> = {
        let mut n: Vec<String> = t.cells.iter().flat_map(|c| c.env.keys().cloned()).collect();
        n.sort();
        n.dedup();
        n
    };
    let wins = |env: &std::collections::BTreeMap<String, String>, band: Band| {
        t.winners.iter().any(|w| w.band == band && &w.env == env)
    };
    let head = names
        .iter()
        .map(|n| view! { <th class="mono">{n.clone()}</th> })
        .collect_view();
    let rows = t
        .cells
        .iter()
        .map(|c| {
            let row_class = if Band::ALL.iter().any(|b| wins(&c.env, *b)) { "best" } else { "" };
            let vals = names
                .iter()
                .map(|n| view! { <td class="mono">{c.env.get(n).cloned().unwrap_or_else(|| "—".into())}</td> })
                .collect_view();
            let band = |b: Band, v: Option<f64>| {
                let class = if wins(&c.env, b) { "num win" } else { "num" };
                view! { <td class=class>{opt_num(v, 2)}{wins(&c.env, b).then_some(" ★")}</td> }
            };
            view! { <tr class=row_class>
                {vals}
                {band(Band::Small, c.busbw_gbs.small)}{band(Band::Medium, c.busbw_gbs.medium)}{band(Band::Large, c.busbw_gbs.large)}
                <td class="num">{opt_num(c.peak_busbw_gbs, 2)}</td><td class="num">{c.wrong}</td><td class="num">{c.rows}</td>
            </tr> }
        })
        .collect_view();
    let winners = t
        .winners
        .iter()
        .map(|w| {
            let env = w.env.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ");
            let margin = w.runner_up_busbw_gbs.map(|r| format!(" (runner-up {r:.2})")).unwrap_or_default();
            view! { <li><b>{w.band.as_str()}</b>": "<code>{env}</code>{format!(" {:.2} GB/s{margin}", w.busbw_gbs)}</li> }
        })
        .collect_view();
    view! {
        <p class="muted">{format!("{} on {}: {} cells", t.collective.clone().unwrap_or_else(|| "nccl".into()), t.hostname, t.cells.len())}</p>
        <h2>"Best cell per size band"</h2>
        <ul id="sweep-winners">{winners}</ul>
        <table class="grid" id="sweep-cells">
            <thead><tr>{head}<th>"small busbw"</th><th>"medium busbw"</th><th>"large busbw"</th><th>"peak"</th><th>"wrong"</th><th>"rows"</th></tr></thead>
            <tbody>{rows}</tbody>
        </table>
        <p class="muted">"Bands: small < 64 KiB ≤ medium < 64 MiB ≤ large; busbw in GB/s, the mean of the cell's rows in the band. ★ the band's best cell."</p>
    }
}
