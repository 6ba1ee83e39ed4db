//! The site's fabric, drawn tier by tier (spines above, leaves with their nodes below),
//! with what fabric investigations blamed marked on it; the list of fabric investigations;
//! and one investigation's answer in the fabric's terms and its tests, polled while it
//! runs.

use std::time::Duration;

use heddle_types::fabric::investigation::{
    FabricInvestigation, FabricPart, FabricTestState, marks,
};
use heddle_types::fabric::stored::{StoredFabric, tree};
use heddle_types::fabric::{Fabric, Tier};
use heddle_types::hostlist::compress;
use heddle_types::investigations::InvestigationState;
use leptos::prelude::*;
use leptos_router::hooks::use_params_map;
use uuid::Uuid;

use super::investigations::investigation_state_badge;
use crate::api::{self, Load};
use crate::ui::{ago, loaded, when};

#[component]
pub fn FabricPage() -> impl IntoView {
    let (fabric, _) = api::load(|| api::get::<StoredFabric>("/fabric"));
    let (list, _) =
        api::load(|| api::get::<Vec<FabricInvestigation>>("/fabric/investigations?limit=20"));
    // The drawing marks what the newest finished investigation blamed.
    let latest = move || {
        list.with(|l| match l {
            Load::Ready(l) => l
                .iter()
                .find(|i| i.state == InvestigationState::Done)
                .map(|i| (i.blamed.clone(), i.candidates.clone(), i.id)),
            _ => None,
        })
    };
    view! {
        <section>
            <h1>"Fabric"</h1>
            <p class="muted">"The site's switches and nodes as imported with "<code>"heddle fabric import"</code>
                "; fabric investigations ("<code>"heddle investigate fabric"</code>") find the broken NIC, cable, leaf, uplink or spine."</p>
            <h2>"Fabric investigations"</h2>
            {loaded(list, "fabric investigations", table)}
            <h2>"Switches"</h2>
            {move || {
                let (blamed, candidates, from) = latest().unwrap_or_default();
                loaded(fabric, "the fabric", move |f: StoredFabric| {
                    let note = (!blamed.is_empty() || !candidates.is_empty()).then(|| view! {
                        <p class="muted">"Marked: what investigation "
                            <a href=format!("/fabric/investigations/{from}")>{from.to_string()[..8].to_string()}</a>" blamed."</p>
                    });
                    view! {
                        <p class="muted">{format!("{} nodes, {} switches, {} links; imported from {} by {} {}",
                            f.summary.nodes, f.summary.switches, f.summary.links, f.summary.source.as_str(),
                            f.summary.imported_by, ago(Some(f.summary.imported_at)))}</p>
                        {note}
                        <Drawing fabric=f.fabric blamed=blamed.clone() candidates=candidates.clone()/>
                    }
                })
            }}
        </section>
    }
}

fn table(list: Vec<FabricInvestigation>) -> impl IntoView {
    if list.is_empty() {
        return view! { <p class="empty" id="fabric-investigations-empty">"No fabric investigations yet."</p> }
            .into_any();
    }
    let rows = list
        .into_iter()
        .map(|i| {
            let name = i
                .label
                .clone()
                .unwrap_or_else(|| i.id.to_string()[..8].to_string());
            let blamed = i
                .blamed
                .iter()
                .map(|b| b.id.clone())
                .collect::<Vec<_>>()
                .join(", ");
            view! { <tr>
                <td><a href=format!("/fabric/investigations/{}", i.id)>{name}</a></td>
                <td>{investigation_state_badge(i.state)}</td>
                <td class="num">{i.round}</td>
                <td class="num">{i.suspects.len()}</td>
                <td class="mono">{blamed}</td>
                <td class="muted">{ago(Some(i.created_at))}</td>
            </tr> }
        })
        .collect_view();
    view! { <table class="grid" id="fabric-investigations"><thead><tr><th>"Investigation"</th><th>"State"</th>
        <th>"Round"</th><th>"Suspects"</th><th>"Blamed"</th><th>"Started"</th></tr></thead><tbody>{rows}</tbody></table> }
    .into_any()
}

/// The fabric tier by tier, each switch a box: its name, its nodes as a hostlist, and what
/// is blamed on it or under it.
#[component]
fn Drawing(fabric: Fabric, blamed: Vec<FabricPart>, candidates: Vec<FabricPart>) -> impl IntoView {
    let marked = marks(&fabric, &blamed, &candidates);
    let switches = tree(&fabric);
    let tiers = [(Tier::Core, "Core"), (Tier::Spine, "Spines"), (Tier::Leaf, "Leaves")]
        .into_iter()
        .filter_map(|(tier, title)| {
            let boxes: Vec<_> = switches.iter().filter(|s| s.tier == tier).collect();
            if boxes.is_empty() {
                return None;
            }
            let boxes = boxes
                .into_iter()
                .map(|s| {
                    let m = marked.get(&s.name).cloned().unwrap_or_default();
                    let class = if m.blamed || !m.below.is_empty() && m.below.iter().any(|b| !b.starts_with("maybe"))
                        || m.uplinks.iter().any(|u| !u.starts_with("maybe"))
                    {
                        "sw blamed"
                    } else if m.candidate || !m.below.is_empty() || !m.uplinks.is_empty() {
                        "sw candidate"
                    } else {
                        "sw"
                    };
                    let mut lines = Vec::new();
                    if m.blamed {
                        lines.push("blamed".to_string());
                    } else if m.candidate {
                        lines.push("maybe at fault".to_string());
                    }
                    lines.extend(m.uplinks.iter().map(|u| format!("{u} blamed")));
                    lines.extend(m.below.iter().map(|b| format!("{b} blamed")));
                    let nodes = (!s.nodes.is_empty())
                        .then(|| format!("{} nodes: {}", s.nodes.len(), compress(&s.nodes)));
                    let below = (!s.switches.is_empty())
                        .then(|| format!("{} switches below", s.switches.len()));
                    view! {
                        <div class=class data-switch=s.name.clone()>
                            <div class="mono">{s.name.clone()}</div>
                            <div class="muted">{nodes}{below}</div>
                            {lines.into_iter().map(|l| view! { <div class="mark">{l}</div> }).collect_view()}
                        </div>
                    }
                })
                .collect_view();
            Some(view! { <h3>{title}</h3><div class="fabric-tier">{boxes}</div> })
        })
        .collect_view();
    view! { <div id="fabric-drawing">{tiers}</div> }
}

#[component]
pub fn FabricInvestigationPage() -> impl IntoView {
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
        api::get::<FabricInvestigation>(&format!("/fabric/investigations/{id}")).await
    });
    let (fabric, _) = api::load(|| api::get::<StoredFabric>("/fabric"));
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
    view! { <section>{move || loaded(inv, "the investigation", move |i| detail(i, fabric))}</section> }
}

fn part_row(p: &FabricPart) -> impl IntoView + use<> {
    let kind = serde_json::to_value(p.component)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    view! { <tr>
        <td>{kind}</td><td class="mono">{p.id.clone()}</td>
        <td class="num">{format!("{:.0}%", p.confidence * 100.0)}</td>
        <td>{p.place.clone()}</td>
        <td class="mono">{format!("{} ({})", p.nodes, p.node_count)}</td>
        <td class="muted">{p.evidence.join("; ")}</td>
    </tr> }
}

fn detail(i: FabricInvestigation, fabric: RwSignal<Load<StoredFabric>>) -> impl IntoView {
    let title = i
        .label
        .clone()
        .unwrap_or_else(|| format!("Fabric investigation {}", &i.id.to_string()[..8]));
    let this_round: Vec<_> = i.tests.iter().filter(|t| t.round == i.round).collect();
    let ended = this_round
        .iter()
        .filter(|t| t.state != FabricTestState::Running)
        .count();
    let failed = i
        .tests
        .iter()
        .filter(|t| t.state == FabricTestState::Failed)
        .count();
    let parts = i
        .blamed
        .iter()
        .chain(&i.candidates)
        .map(part_row)
        .collect_view();
    let verdict = match (i.state, i.conclusive) {
        (InvestigationState::Running, _) => "still running".to_string(),
        (InvestigationState::Failed, _) => "failed".to_string(),
        (_, Some(false)) => "inconclusive: the candidates below".to_string(),
        _ if i.blamed.is_empty() => "nothing blamed".to_string(),
        _ => format!("{} blamed", i.blamed.len()),
    };
    let tests = i
        .tests
        .iter()
        .rev()
        .take(500)
        .map(|t| {
            view! { <tr>
                <td class="num">{t.round}</td><td class="mono">{t.id.clone()}</td>
                <td class="mono">{compress(&t.nodes)}</td>
                <td>{t.rail.map(|r| r.to_string()).unwrap_or_else(|| "all".into())}</td>
                <td>{t.state.as_str()}</td>
                <td class="num">{t.busbw_gbs.map(|v| format!("{v:.1}")).unwrap_or_else(|| "—".into())}</td>
                <td>{t.run_id.map(|r| view! { <a href=format!("/runs/{r}")>{r.to_string()[..8].to_string()}</a> })}</td>
                <td class="error">{t.error.clone()}</td>
            </tr> }
        })
        .collect_view();
    let (blamed, candidates) = (i.blamed.clone(), i.candidates.clone());
    view! {
        <div class="title-row"><h1>{title}</h1><span id="fabric-investigation-state">{investigation_state_badge(i.state)}</span></div>
        <p class="muted">{format!("{} suspects, {} nodes it may test; round {} of at most {}; started by {} {}, finished {}",
            i.suspects.len(), i.nodes_available, i.round, i.max_rounds, i.created_by, when(Some(i.created_at)), when(i.finished_at))}</p>
        <p id="fabric-investigation-progress">{format!("round {}: {ended}/{} tests ended; {} tests in all, {failed} failed; {:.0} node-seconds. {verdict}",
            i.round, this_round.len(), i.tests.len(), i.node_seconds)}</p>
        {i.error.clone().map(|e| view! { <p class="error">{e}</p> })}
        <h2>"Blamed"</h2>
        <table class="grid" id="fabric-blamed"><thead><tr><th>"Component"</th><th>"Id"</th><th>"Sure"</th><th>"Where"</th>
            <th>"Its traffic"</th><th>"Evidence"</th></tr></thead><tbody>{parts}</tbody></table>
        {i.notes.iter().map(|n| view! { <p class="muted">{n.clone()}</p> }).collect_view()}
        <h2>"Fabric"</h2>
        {move || loaded(fabric, "the fabric", {
            let (blamed, candidates) = (blamed.clone(), candidates.clone());
            move |f: StoredFabric| view! { <Drawing fabric=f.fabric blamed=blamed.clone() candidates=candidates.clone()/> }
        })}
        <h2>"Tests"</h2>
        <table class="grid" id="fabric-tests"><thead><tr><th>"Round"</th><th>"Test"</th><th>"Nodes"</th><th>"Rail"</th>
            <th>"State"</th><th>"busbw GB/s"</th><th>"Run"</th><th>"Error"</th></tr></thead><tbody>{tests}</tbody></table>
    }
}
