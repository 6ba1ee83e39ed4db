//! Workloads: people's jobs as the NCCL profiler plugin saw them on a node. The node page
//! lists them (`Workloads`); a workload's page (`/workloads/{id}`, and `/jobs/{id}`, its
//! first address) shows its verdict, its ranks as lanes (how far each got, what it is in and
//! for how long, the culprit marked), its communicators and a bandwidth-by-size chart beside
//! the node's own latest test of each collective (dashed).

use heddle_types::health::NodeHealth;
use heddle_types::jobs::JobResult;
use heddle_types::observed::{RankRow, Workload, WorkloadSummary, band_label, band_of};
use leptos::prelude::*;
use leptos_router::hooks::use_params_map;
use uuid::Uuid;

use super::health::verdict_badge;
use crate::api::{self, ApiError, seg};
use crate::chart::{BusBwChart, Series};
use crate::ui::{ago, loaded, opt_num};

/// The node's observed workloads, most recently seen first (one page).
#[component]
pub fn Workloads(node: String) -> impl IntoView {
    let path = format!("/workloads?node={}&limit=20", seg(&node));
    let (workloads, _) = api::load(move || {
        let path = path.clone();
        async move { api::get::<Vec<WorkloadSummary>>(&path).await }
    });
    loaded(workloads, "workloads", |workloads: Vec<WorkloadSummary>| {
        if workloads.is_empty() {
            return view! { <p class="empty" id="workloads-empty">"No workload observed: the NCCL profiler plugin reports the jobs that ran here."</p> }.into_any();
        }
        let rows = workloads
            .into_iter()
            .map(|j| {
                let reason = j
                    .reasons
                    .first()
                    .and_then(|r| r.code.clone())
                    .unwrap_or_default();
                view! { <tr>
                    <td><a href=format!("/workloads/{}", j.id)>{j.workload_key.clone()}</a></td>
                    <td>{j.comm.clone().unwrap_or_default()}</td><td>{j.uid}</td>
                    <td>{verdict_badge(j.verdict)}</td><td class="mono small">{reason}</td>
                    <td class="muted">{ago(Some(j.last_seen_at))}</td>
                </tr> }
            })
            .collect_view();
        view! { <table class="grid" id="workloads"><thead><tr><th>"Workload"</th><th>"Program"</th><th>"Uid"</th>
            <th>"Verdict"</th><th>"Reason"</th><th>"Seen"</th></tr></thead><tbody>{rows}</tbody></table> }.into_any()
    })
}

#[component]
pub fn WorkloadPage() -> impl IntoView {
    let params = use_params_map();
    move || {
        let id = params.with(|p| p.get("id").unwrap_or_default());
        match id.parse::<Uuid>() {
            Ok(id) => view! { <WorkloadView id=id/> }.into_any(),
            Err(_) => {
                view! { <p class="error">{format!("{id:?} is not a workload id.")}</p> }.into_any()
            }
        }
    }
}

/// A workload and, per NCCL test of the node, the rows of its latest result there.
#[derive(Clone)]
struct Loaded {
    workload: Workload,
    baselines: Vec<(String, JobResult)>,
}

async fn fetch(id: Uuid) -> Result<Loaded, ApiError> {
    let workload: Workload = api::get(&format!("/workloads/{id}")).await?;
    let health: NodeHealth =
        api::get(&format!("/nodes/{}/health", workload.summary.node_id)).await?;
    let mut baselines = Vec::new();
    for t in health.tests.iter().filter(|t| t.test.starts_with("nccl.")) {
        let results: Vec<JobResult> = api::get(&format!("/runs/{}/results", t.run_id)).await?;
        if let Some(r) = results.into_iter().find(|r| r.id == t.result_id) {
            baselines.push((t.test.clone(), r));
        }
    }
    Ok(Loaded {
        workload,
        baselines,
    })
}

#[component]
fn WorkloadView(id: Uuid) -> impl IntoView {
    let (state, _) = api::load(move || fetch(id));
    view! { <section>{loaded(state, "the workload", workload_body)}</section> }
}

fn workload_body(l: Loaded) -> impl IntoView {
    let s = l.workload.summary;
    let reasons = s
        .reasons
        .iter()
        .map(|r| view! { <li><span class="mono">{r.code.clone().unwrap_or_else(|| r.basis.clone())}</span>" "{r.message.clone()}</li> })
        .collect_view();
    let mut series = Vec::new();
    for c in &l.workload.comms {
        let mut funcs: Vec<&str> = c.bands.iter().map(|b| b.func.as_str()).collect();
        funcs.dedup();
        for f in funcs {
            series.push(Series {
                name: format!("{} {f}", short_hash(&c.comm_hash)),
                points: c
                    .bands
                    .iter()
                    .filter(|b| b.func == f)
                    .filter_map(|b| Some(((1u64 << b.size_band.min(62)) as f64, b.busbw_gbs?)))
                    .collect(),
                dashed: false,
            });
            let test =
                heddle_types::collective::canonical_collective(f).map(|c| format!("nccl.{c}"));
            if let Some((t, r)) = l.baselines.iter().find(|(t, _)| Ok(t) == test.as_ref()) {
                series.push(Series {
                    name: format!("{t} test on {}", r.hostname),
                    points: r
                        .rows
                        .iter()
                        .filter_map(|row| Some((row.size_bytes as f64, row.busbw_gbs?)))
                        .collect(),
                    dashed: true,
                });
            }
        }
    }
    series.dedup_by(|a, b| a.name == b.name);
    let comms = l
        .workload
        .comms
        .into_iter()
        .map(|c| {
            let bands = c
                .bands
                .into_iter()
                .map(|b| view! { <tr><td>{b.func}</td><td>{crate::ui::size(1i64 << b.size_band.min(62))}</td><td>{b.ops}</td>
                    <td>{opt_num(b.algbw_gbs, 2)}</td><td>{opt_num(b.busbw_gbs, 2)}</td></tr> })
                .collect_view();
            view! {
                <h3 class="mono">{format!("Communicator {}: {} ranks on {} nodes ({} here), transport {}",
                    c.comm_hash, c.nranks, c.nnodes, c.local_ranks, c.transport.unwrap_or_else(|| "-".into()))}</h3>
                <table class="grid"><thead><tr><th>"Function"</th><th>"Size"</th><th>"Ops"</th><th>"algbw GB/s"</th><th>"busbw GB/s"</th></tr></thead>
                <tbody>{bands}</tbody></table>
            }
        })
        .collect_view();
    view! {
        <div class="title-row">
            <h1 id="workload-title">{s.workload_key.clone()}</h1>
            {verdict_badge(s.verdict)}
            <span class="muted">{format!("on {} · uid {} · {} · seen {}", s.hostname, s.uid,
                if s.finished { "finished" } else { "running" }, ago(Some(s.last_seen_at)))}</span>
        </div>
        <p><a href=format!("/nodes/{}", s.node_id)>{format!("Node {}", s.hostname)}</a>
            {format!(" · {} processes · env {}", s.processes, s.env_applied.clone().unwrap_or_else(|| "not applied".into()))}</p>
        <ul id="workload-reasons">{reasons}</ul>
        {rank_lanes(l.workload.ranks)}
        <h2>"Bus bandwidth by size"</h2>
        <p class="muted">"Dashed: the node's latest test of the same collective."</p>
        <BusBwChart series=series/>
        {comms}
    }
}

/// A communicator's hash as shown: its first 8 characters. The hash comes from a file the
/// workload's user wrote, and may hold any visible character: cut by characters, never bytes.
fn short_hash(hash: &str) -> String {
    hash.chars().take(8).collect()
}

/// The workload's ranks as lanes, one a rank of each communicator across every node: the bar is
/// how many collectives the rank has completed of the most any rank started, the text what
/// it is in and for how long, how late it arrives and when it last reported. Culprits (a
/// rank the others wait for, a straggler) are marked.
fn rank_lanes(ranks: Vec<RankRow>) -> impl IntoView {
    if ranks.is_empty() {
        return ().into_any();
    }
    let most = ranks
        .iter()
        .map(|r| r.coll_started)
        .max()
        .unwrap_or(0)
        .max(1);
    let lanes = ranks
        .into_iter()
        .map(|r| {
            let share = (r.coll_done as f64 / most as f64 * 100.0).clamp(0.0, 100.0);
            let doing = match &r.in_flight {
                Some(f) => format!(
                    "in {} #{}{} ({}) for {:.0} s",
                    f.func,
                    f.seq,
                    if f.p2p { " p2p" } else { "" },
                    band_label(band_of(f.bytes)),
                    r.quiet_s
                ),
                None => format!("idle {:.0} s", r.quiet_s),
            };
            let late = r
                .lateness_ms
                .map(|l| format!(" · {l:.0} ms late"))
                .unwrap_or_default();
            let seen = if r.finalized {
                "finalized".to_string()
            } else {
                format!("seen {:.0} s ago", r.silent_s)
            };
            let class = if r.culprit { "lane culprit" } else { "lane" };
            view! {
                <div class=class>
                    <span class="lane-who mono">{format!("{} rank {} · {}", short_hash(&r.comm_hash), r.rank, r.hostname)}</span>
                    <span class="lane-bar"><span class="lane-done" style=format!("width: {share:.1}%")></span></span>
                    <span class="lane-what">{format!("done #{} of #{} started · {doing}{late} · {seen}", r.coll_done, r.coll_started)}</span>
                    {r.culprit.then(|| view! { <span class="badge bad">"culprit"</span> })}
                </div>
            }
        })
        .collect_view();
    view! {
        <h2>"Ranks"</h2>
        <p class="muted">"One lane a rank, on every node: the bar is the collectives it completed, of the most any rank started."</p>
        <div id="workload-ranks" class="lanes">{lanes}</div>
    }
    .into_any()
}
