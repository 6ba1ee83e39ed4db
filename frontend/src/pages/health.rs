//! Health: every node's combined verdict (worst first) and the expectations results are
//! judged against. Operators add and delete their own expectations here; built-in ones are
//! listed with their sources.

use heddle_types::auth::Role;
use heddle_types::health::{Expectation, ExpectationCreate, FleetHealth, ResultVerdict, Verdict};
use leptos::prelude::*;

use crate::api;
use crate::session::use_session;
use crate::ui::{Outcome, ago, loaded, outcome_line, size};

pub fn verdict_badge(v: Verdict) -> impl IntoView + use<> {
    let class = match v {
        Verdict::Pass => "badge good",
        Verdict::Warn => "badge warn",
        Verdict::Fail => "badge bad",
        Verdict::Unknown => "badge",
    };
    view! { <span class=class data-verdict=v.as_str()>{v.as_str()}</span> }
}

/// A result's verdict and reasons, under its heading on the run page.
pub fn verdict_block(v: Option<ResultVerdict>) -> impl IntoView {
    let Some(v) = v else {
        return view! { <p class="muted verdict">"Not judged yet."</p> }.into_any();
    };
    let figure = match (&v.metric, v.value) {
        (Some(m), Some(x)) => format!(" · {x:.2} {m}"),
        _ => String::new(),
    };
    let reasons = v
        .reasons
        .iter()
        .map(|r| view! { <li class=format!("reason {:?}", r.severity).to_lowercase()>{r.message.clone()}<span class="muted small">{format!(" ({})", r.basis)}</span></li> })
        .collect_view();
    view! {
        <div class="verdict">
            <p>"Verdict: "{verdict_badge(v.verdict)}{format!(" {}{figure}", v.test)}</p>
            <ul class="reasons">{reasons}</ul>
        </div>
    }
    .into_any()
}

#[component]
pub fn Health() -> impl IntoView {
    let session = use_session();
    let (fleet, _) = api::load(|| api::get::<FleetHealth>("/health"));
    let (expectations, reload) = api::load(|| api::get::<Vec<Expectation>>("/expectations"));
    let (test, metric, value, source, min_size) = (
        RwSignal::new(String::new()),
        RwSignal::new("busbw_gbs".to_string()),
        RwSignal::new(String::new()),
        RwSignal::new(String::new()),
        RwSignal::new(String::new()),
    );
    let action = RwSignal::new(Outcome::Idle);
    let add = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let Ok(v) = value.get_untracked().trim().parse::<f64>() else {
            action.set(Outcome::Done("The value must be a number.".into()));
            return;
        };
        let body = ExpectationCreate {
            test: test.get_untracked().trim().to_string(),
            metric: metric.get_untracked(),
            value: v,
            source: source.get_untracked().trim().to_string(),
            min_size_bytes: min_size.get_untracked().trim().parse().ok(),
            gpu_model: None,
            gpu_count: None,
            world_size: None,
            node: None,
        };
        action.set(Outcome::Busy);
        leptos::task::spawn_local(async move {
            action.set(
                match api::post::<_, Expectation>("/expectations", &body).await {
                    Ok(e) => {
                        Outcome::Done(format!("Added: {} {} ≥ {}.", e.test, e.metric, e.value))
                    }
                    Err(e) => Outcome::Failed(e),
                },
            );
            reload();
        });
    };
    let remove = move |id: uuid::Uuid| {
        action.set(Outcome::Busy);
        leptos::task::spawn_local(async move {
            action.set(match api::delete(&format!("/expectations/{id}")).await {
                Ok(()) => Outcome::Done("Deleted.".into()),
                Err(e) => Outcome::Failed(e),
            });
            reload();
        });
    };
    let fleet_view = |f: FleetHealth| {
        let rows = f
            .nodes
            .into_iter()
            .map(|n| view! { <tr class="node-health">
                <td><a href=format!("/nodes/{}", n.node_id)>{n.hostname}</a></td><td>{verdict_badge(n.verdict)}</td>
                <td>{n.gpu_model.unwrap_or_default()}</td><td>{n.failing.join(", ")}</td><td>{ago(n.last_judged_at)}</td>
            </tr> })
            .collect_view();
        view! {
            <p id="health-counts">{format!("{} pass · {} warn · {} fail · {} unknown", f.pass, f.warn, f.fail, f.unknown)}</p>
            <table class="grid" id="fleet-health"><thead><tr><th>"Node"</th><th>"Verdict"</th><th>"GPU"</th><th>"Warn/fail tests"</th><th>"Judged"</th></tr></thead>
            <tbody>{rows}</tbody></table>
        }
    };
    let expectations_view = move |list: Vec<Expectation>| {
        let rows = list
            .into_iter()
            .map(|e| {
                let scope = [e.gpu_model.clone(), e.gpu_count.map(|n| format!("{n} GPUs")), e.node.clone()].into_iter().flatten().collect::<Vec<_>>().join(" · ");
                let del = e.id.filter(|_| session.can(Role::Operator)).map(|id| view! { <button class="link" on:click=move |_| remove(id)>"Delete"</button> });
                view! { <tr class="expectation" data-origin=e.origin.clone()>
                    <td>{e.origin.clone()}</td><td>{e.test.clone()}</td><td>{e.metric.clone()}</td><td class="num">{format!("≥ {}", size(e.min_size_bytes))}</td>
                    <td class="num">{format!("{:.2}", e.value)}</td><td>{scope}</td><td class="small">{e.source.clone()}</td><td>{del}</td>
                </tr> }
            })
            .collect_view();
        view! { <table class="grid" id="expectations"><thead><tr><th>"Origin"</th><th>"Test"</th><th>"Metric"</th><th>"Size"</th><th>"Value"</th><th>"Scope"</th><th>"Source"</th><th></th></tr></thead>
        <tbody>{rows}</tbody></table> }
    };
    view! {
        <section class="health">
            <h1>"Health"</h1>
            {loaded(fleet, "fleet health", fleet_view)}
            <h2>"Expectations"</h2>
            <p class="muted">"Operator expectations win over plugins', which win over the built-in floors. See docs/health.md."</p>
            <Show when=move || session.can(Role::Operator)>
                <form id="expectation-add" on:submit=add>
                    <input placeholder="test (nccl.all_reduce)" bind:value=test required/>
                    <select on:change=move |ev| metric.set(event_target_value(&ev))>
                        <option value="busbw_gbs">"busbw_gbs"</option><option value="algbw_gbs">"algbw_gbs"</option><option value="time_us">"time_us"</option><option value="rdma_speedup">"rdma_speedup"</option>
                    </select>
                    <input placeholder="value" bind:value=value required/>
                    <input placeholder="min size (bytes)" bind:value=min_size/>
                    <input placeholder="source (datasheet, acceptance test…)" bind:value=source required/>
                    <button type="submit">"Add"</button>
                </form>
            </Show>
            {outcome_line(action)}
            {loaded(expectations, "expectations", expectations_view)}
        </section>
    }
}
