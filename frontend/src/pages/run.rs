//! One run: live job progress (polled every second until every job has ended), then the
//! results as the nccl-tests table and a busbw chart, with other runs of the same kind
//! available to overlay.

use std::time::Duration;

use heddle_types::auth::Role;
use heddle_types::health::ResultVerdict;
use heddle_types::jobs::{Job, JobResult, Run};
use leptos::prelude::*;
use leptos_router::hooks::use_params_map;
use uuid::Uuid;

use super::runs::state_badge;
use crate::api::{self, ApiError, Load};
use crate::chart::{BusBwChart, Series};
use crate::session::use_session;
use crate::ui::{Outcome, loaded, opt_num, outcome_line, size, when};

fn finished(state: &str) -> bool {
    matches!(state, "succeeded" | "failed" | "cancelled" | "skipped")
}

#[component]
pub fn RunPage() -> impl IntoView {
    let params = use_params_map();
    move || {
        let id = params.with(|p| p.get("id").unwrap_or_default());
        match id.parse::<Uuid>() {
            Ok(id) => view! { <RunView id=id/> }.into_any(),
            Err(_) => {
                view! { <p class="error">{format!("{id:?} is not a run id.")}</p> }.into_any()
            }
        }
    }
}

#[component]
fn RunView(id: Uuid) -> impl IntoView {
    let session = use_session();
    let (run, reload) =
        api::load(move || async move { api::get::<Run>(&format!("/runs/{id}")).await });
    let (results, reload_results) = api::load(move || async move {
        api::get::<Vec<JobResult>>(&format!("/runs/{id}/results")).await
    });
    let is_done = move || matches!(run.get(), Load::Ready(r) if finished(r.state.as_str()));
    // Poll while the run is live; stop once it has ended (a failed load keeps polling, the
    // server may be restarting).
    if let Ok(handle) = set_interval_with_handle(
        move || {
            if !run.with_untracked(|r| matches!(r, Load::Ready(r) if finished(r.state.as_str()))) {
                reload();
            }
        },
        Duration::from_secs(1),
    ) {
        on_cleanup(move || handle.clear());
    }
    // Results arrive job by job: fetch them again whenever another job has ended.
    let ended = Memo::new(move |_| match run.get() {
        Load::Ready(r) => r.jobs.iter().filter(|j| j.state.is_terminal()).count(),
        _ => 0,
    });
    Effect::new(move |prev: Option<usize>| {
        let n = ended.get();
        if prev.is_some_and(|p| p != n) {
            reload_results();
        }
        n
    });
    let cancel = RwSignal::new(Outcome::Idle);
    let do_cancel = move |_| {
        cancel.set(Outcome::Busy);
        leptos::task::spawn_local(async move {
            let r: Result<serde_json::Value, ApiError> =
                api::post(&format!("/runs/{id}/cancel"), &serde_json::json!({})).await;
            cancel.set(match r {
                Ok(_) => Outcome::Done("Cancellation requested.".into()),
                Err(e) => Outcome::Failed(e),
            });
            reload();
        });
    };
    let header = move |r: Run| {
        let title = r
            .label
            .clone()
            .unwrap_or_else(|| format!("Run {}", &r.id.to_string()[..8]));
        let env = r
            .spec
            .env
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ");
        let kind = r.spec.kind.clone();
        view! {
            <div class="title-row"><h1>{title}</h1><span id="run-state">{state_badge(r.state.as_str())}</span>
                {match r.spec.kind.as_str() {
                    "sweep" => Some(view! { <a id="run-sweep-link" href=format!("/sweeps/{}", r.id)>"Sweep table"</a> }.into_any()),
                    "p2p" => Some(view! { <a id="run-p2p-link" href=format!("/p2p/{}", r.id)>"GPU×GPU matrix"</a> }.into_any()),
                    _ => None,
                }}</div>
            <p class="muted">{format!("{} · by {} · started {} · finished {}", r.spec.kind, r.created_by, when(Some(r.created_at)), when(r.finished_at))}</p>
            {lines_table("run-params", "Params", heddle_types::kinds::shown::params(&r.spec.kind, r.spec.params.raw()))}
            {(!env.is_empty()).then(|| view! { <p class="mono small" id="run-env-line">{format!("env {env}")}</p> })}
            {agreed_line(&r.jobs)}
            {env_tables(r.jobs.clone())}
            {jobs_table(r.jobs)}
            <RunResults id=id kind=kind results=results/>
        }
    };
    view! {
        <section class="run">
            {loaded(run, "the run", header)}
            <Show when=move || !is_done() && session.can(Role::Operator)>
                <button id="run-cancel" on:click=do_cancel>"Cancel run"</button>
            </Show>
            {outcome_line(cancel)}
        </section>
    }
}

/// The values every rank of a multi-node run shares for the variables that must agree
/// (`heddle_types::must_agree`); a run stored before that rule may show a split.
fn agreed_line(jobs: &[Job]) -> Option<impl IntoView + use<>> {
    use heddle_types::must_agree;
    if jobs.len() < 2 {
        return None;
    }
    let splits = must_agree::splits(
        jobs.iter()
            .map(|j| (j.hostname.as_str(), j.applied_env.as_slice())),
    );
    let mut agreed: Vec<String> = jobs[0]
        .applied_env
        .iter()
        .filter(|e| must_agree::must_agree(&e.name) && !splits.iter().any(|s| s.name == e.name))
        .map(|e| format!("{}={}", e.name, e.value))
        .collect();
    agreed.sort();
    let split = (!splits.is_empty()).then(|| must_agree::EnvSplits(splits).to_string());
    if agreed.is_empty() && split.is_none() {
        return None;
    }
    Some(view! {
        <p class="mono small" id="run-agreed">{format!("agreed by every rank: {}", if agreed.is_empty() { "-".to_string() } else { agreed.join(" ") })}</p>
        {split.map(|s| view! { <p class="warn" id="run-split">{s}</p> })}
    })
}

/// The environment each node's test got, and where each variable came from.
fn env_tables(jobs: Vec<Job>) -> impl IntoView {
    jobs.into_iter()
        .filter(|j| !j.applied_env.is_empty())
        .map(|j| {
            let rows = j
                .applied_env
                .iter()
                .map(|e| view! { <tr><td class="mono">{e.name.clone()}</td><td class="mono">{e.value.clone()}</td><td>{e.source.clone()}</td></tr> })
                .collect_view();
            view! {
                <details class="applied-env"><summary>{format!("Environment of rank {} ({})", j.rank, j.hostname)}</summary>
                <table class="grid"><thead><tr><th>"Name"</th><th>"Value"</th><th>"Source"</th></tr></thead><tbody>{rows}</tbody></table></details>
            }
        })
        .collect_view()
}

/// Name-value lines (a run's params, a result's summary) as a small table; nothing when
/// there are none. A documented param's help is its tooltip.
fn lines_table(
    id: &'static str,
    title: &'static str,
    lines: Vec<heddle_types::kinds::shown::Line>,
) -> impl IntoView {
    (!lines.is_empty()).then(|| {
        let rows = lines
            .into_iter()
            .map(|l| view! { <tr title=l.help.unwrap_or_default()><th>{l.name}</th><td class="mono">{l.value}</td></tr> })
            .collect_view();
        view! { <table class="kv small" id=id><caption>{title}</caption><tbody>{rows}</tbody></table> }
    })
}

/// Which path the bytes took, and the transport reasons with the tool's own line.
fn transport_block(summary: serde_json::Value, verdict: Option<ResultVerdict>) -> impl IntoView {
    let kind = summary
        .get("kind")
        .and_then(|k| k.as_str())
        .unwrap_or_default();
    let path = heddle_types::kinds::path_line(kind, &summary);
    let findings = verdict
        .map(|v| v.reasons)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|reason| {
            let code = reason.code?;
            let evidence = reason.evidence.unwrap_or_default();
            let attr = code.clone();
            Some(view! { <li class="finding" data-code=attr><b>{code}</b>" "<span class="mono small">{evidence}</span></li> })
        })
        .collect_view();
    view! {
        <div class="transport">
            {path.map(|p| view! { <p class="mono small" id="transport-path">{format!("path: {p}")}</p> })}
            <ul class="findings">{findings}</ul>
        </div>
    }
}

fn jobs_table(jobs: Vec<Job>) -> impl IntoView {
    let rows = jobs
        .into_iter()
        .map(|j| {
            let pct = j.progress.as_ref().and_then(|p| p.fraction).map(|f| (f.clamp(0.0, 1.0) * 100.0).round());
            let msg = j.progress.as_ref().map(|p| p.message.clone()).unwrap_or_default();
            let bar = match (pct, j.state.is_terminal()) {
                (_, true) => String::new(),
                (Some(p), _) => format!("{p:.0}%"),
                (None, _) => String::new(),
            };
            view! { <tr class="job" data-state=j.state.as_str()>
                <td>{j.rank}</td><td><a href=format!("/nodes/{}", j.node_id)>{j.hostname.clone()}</a></td>
                <td>{state_badge(j.state.as_str())}</td>
                <td>
                    {pct.filter(|_| !j.state.is_terminal()).map(|p| view! { <progress max="100" value=p></progress> })}
                    {format!(" {bar} {msg}")}
                </td>
                <td>{format!("{}/{}", j.attempts, j.max_attempts)}</td>
                <td class="error">{j.error.clone().unwrap_or_default()}</td>
            </tr> }
        })
        .collect_view();
    view! { <table class="grid" id="jobs"><thead><tr><th>"Rank"</th><th>"Node"</th><th>"State"</th><th>"Progress"</th><th>"Attempts"</th><th>"Error"</th></tr></thead>
    <tbody>{rows}</tbody></table> }
}

fn series_of(label: &str, results: &[JobResult], dashed: bool) -> Vec<Series> {
    results
        .iter()
        .filter(|r| r.rows.iter().any(|row| row.busbw_gbs.is_some()))
        .flat_map(|r| {
            super::kinds::rdma_ab::series(label, r, dashed).unwrap_or_else(|| {
                vec![Series {
                    name: format!("{label} {}", r.hostname),
                    points: r
                        .rows
                        .iter()
                        .filter_map(|row| Some((row.size_bytes as f64, row.busbw_gbs?)))
                        .collect(),
                    dashed,
                }]
            })
        })
        .collect()
}

#[component]
fn RunResults(id: Uuid, kind: String, results: RwSignal<Load<Vec<JobResult>>>) -> impl IntoView {
    let k = api::seg(&kind);
    let (others, _) = api::load(move || {
        let k = k.clone();
        async move { api::get::<Vec<Run>>(&format!("/runs?kind={k}&limit=10")).await }
    });
    let overlay = RwSignal::new(Vec::<(String, Vec<JobResult>)>::new());
    let toggle = move |run: Run, on: bool| {
        let name = run
            .label
            .clone()
            .unwrap_or_else(|| run.id.to_string()[..8].to_string());
        if !on {
            return overlay.update(|o| o.retain(|(n, _)| n != &name));
        }
        leptos::task::spawn_local(async move {
            if let Ok(r) = api::get::<Vec<JobResult>>(&format!("/runs/{}/results", run.id)).await {
                overlay.update(|o| o.push((name, r)));
            }
        });
    };
    let pickers = move |runs: Vec<Run>| {
        let others: Vec<Run> = runs
            .into_iter()
            .filter(|r| r.id != id && r.state == "succeeded")
            .collect();
        if others.is_empty() {
            return view! { <p class="muted">"No other finished runs of this kind to compare with."</p> }.into_any();
        }
        let boxes = others
            .into_iter()
            .map(|r| {
                let name = format!(" {} ({})", r.label.clone().unwrap_or_else(|| r.id.to_string()[..8].to_string()), when(Some(r.created_at)));
                let run = r.clone();
                view! { <label class="node-pick"><input type="checkbox" class="overlay" on:change=move |ev| toggle(run.clone(), event_target_checked(&ev))/>{name}</label> }
            })
            .collect_view();
        view! { <p>"Overlay: "{boxes}</p> }.into_any()
    };
    let body = move |rs: Vec<JobResult>| {
        if rs.is_empty() {
            return view! { <p class="empty" id="no-results">"No results yet: they appear as each job finishes."</p> }.into_any();
        }
        let mut series = series_of("this run", &rs, false);
        for (name, r) in overlay.get() {
            series.extend(series_of(&name, &r, true));
        }
        let tables = rs.into_iter().map(result_block).collect_view();
        view! { <BusBwChart series=series/>{tables} }.into_any()
    };
    view! {
        <h2>"Results"</h2>
        {loaded(others, "other runs", pickers)}
        {loaded(results, "results", body)}
    }
}

fn result_block(r: JobResult) -> impl IntoView {
    let rows = r
        .rows
        .iter()
        .map(|row| {
            view! { <tr>
                <td class="num">{size(row.size_bytes)}</td><td class="num">{row.count.map(|c| c.to_string()).unwrap_or_default()}</td>
                <td>{row.dtype.clone().unwrap_or_default()}</td><td>{row.op.clone().unwrap_or_default()}</td>
                <td class="num">{row.root.map(|c| c.to_string()).unwrap_or_default()}</td>
                <td>{row.in_place.map(|p| if p { "in-place" } else { "out-of-place" }).unwrap_or("")}</td>
                <td class="num">{opt_num(row.time_us, 1)}</td><td class="num">{opt_num(row.algbw_gbs, 2)}</td>
                <td class="num">{opt_num(row.busbw_gbs, 2)}</td><td class="num">{row.wrong.map(|c| c.to_string()).unwrap_or_default()}</td>
            </tr> }
        })
        .collect_view();
    let outcome = format!("{:?}", r.outcome).to_lowercase();
    let has_rows = !r.rows.is_empty();
    view! {
        <div class="result">
            <h3>{format!("{} · ", r.hostname)}{state_badge(&outcome)}</h3>
            {r.reason.clone().map(|x| view! { <p class="error">{x}</p> })}
            {super::health::verdict_block(r.verdict.clone())}
            {transport_block(r.summary.clone(), r.verdict.clone())}
            {super::kinds::rdma_ab::tables(&r)}
            {lines_table("result-summary", "Summary", heddle_types::kinds::shown::summary(&r.summary))}
            {has_rows.then(|| view! {
                <table class="grid nccl" id="nccl-table"><thead><tr><th>"size"</th><th>"count"</th><th>"type"</th><th>"redop"</th><th>"root"</th>
                    <th>"placement"</th><th>"time (us)"</th><th>"algbw (GB/s)"</th><th>"busbw (GB/s)"</th><th>"#wrong"</th></tr></thead>
                <tbody>{rows}</tbody></table>
            })}
            {r.stderr_tail.clone().filter(|s| !s.is_empty()).map(|s| view! { <details><summary>"stderr"</summary><pre>{s}</pre></details> })}
        </div>
    }
}
