//! The run launcher: the kind is picked from the server's run-kinds catalogue and its
//! parameters are asked for as a form (defaults, units, allowed values, help), nodes are
//! ticked from the fleet. Only parameters changed from their default are sent, so a run
//! stores what its creator chose. The server's refusal of a parameter (`params.NAME: ...`)
//! is shown beside that parameter.

use std::collections::BTreeMap;

use heddle_types::env_input;
use heddle_types::jobs::{Run, RunCreate};
use heddle_types::nodes::NodeSummary;
use heddle_types::params::{ParamType, RunKind, RunKindParam};
use leptos::prelude::*;
use leptos_router::hooks::use_navigate;
use serde_json::{Map, Value};

use crate::api::{self, ApiError, Load};
use crate::ui::{error_line, loaded, size};

/// A parameter's value as a form field holds it.
pub fn field_text(ty: ParamType, v: &Value) -> String {
    match (ty, v) {
        (_, Value::String(s)) => s.clone(),
        (ParamType::EnvGrid, Value::Object(o)) => o
            .iter()
            .map(|(k, vals)| {
                let vals: Vec<String> = vals
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|x| x.as_str().map_or_else(|| x.to_string(), str::to_string))
                    .collect();
                format!("{k}={}", vals.join(","))
            })
            .collect::<Vec<_>>()
            .join("\n"),
        (_, Value::Array(a)) => a
            .iter()
            .map(|x| x.as_str().map_or_else(|| x.to_string(), str::to_string))
            .collect::<Vec<_>>()
            .join(", "),
        (_, Value::Null) => String::new(),
        (_, other) => other.to_string(),
    }
}

/// A number when the text is one; otherwise the text, for the server to refuse by name.
fn scalar(ty: ParamType, text: &str) -> Value {
    let t = text.trim();
    match ty {
        ParamType::Integer | ParamType::Number | ParamType::Duration => {
            serde_json::from_str::<serde_json::Number>(t)
                .map(Value::Number)
                .unwrap_or_else(|_| Value::String(t.to_string()))
        }
        ParamType::Boolean => Value::Bool(t == "true"),
        _ => Value::String(t.to_string()),
    }
}

/// A form field's text as the parameter's JSON value.
pub fn field_value(ty: ParamType, text: &str) -> Value {
    let items = || text.split(',').map(str::trim).filter(|s| !s.is_empty());
    match ty {
        ParamType::IntegerList => {
            Value::Array(items().map(|s| scalar(ParamType::Integer, s)).collect())
        }
        ParamType::StringList => Value::Array(items().map(|s| Value::String(s.into())).collect()),
        ParamType::EnvGrid => {
            let mut grid = Map::new();
            for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
                // A line that is no pair goes as a name without values, which the server
                // refuses by name beside the parameter.
                let (name, vals) = env_input::split(line).unwrap_or((line, ""));
                let vals = vals.split(',').map(str::trim).filter(|s| !s.is_empty());
                grid.insert(
                    name.trim().into(),
                    vals.map(|v| Value::String(v.into())).collect(),
                );
            }
            Value::Object(grid)
        }
        other => scalar(other, text),
    }
}

/// The params of a run: each field whose text differs from its default's.
pub fn build_params(kind: &RunKind, texts: &BTreeMap<String, String>) -> Value {
    let mut out = Map::new();
    for p in &kind.params {
        let text = texts.get(&p.name).cloned().unwrap_or_default();
        let default = p
            .default
            .as_ref()
            .map(|d| field_text(p.ty, d))
            .unwrap_or_default();
        if text.trim() == default.trim() || (text.trim().is_empty() && p.ty != ParamType::Boolean) {
            continue;
        }
        out.insert(p.name.clone(), field_value(p.ty, &text));
    }
    Value::Object(out)
}

fn default_texts(kind: &RunKind) -> BTreeMap<String, String> {
    kind.params
        .iter()
        .map(|p| {
            let t = p
                .default
                .as_ref()
                .map(|d| field_text(p.ty, d))
                .unwrap_or_default();
            (p.name.clone(), t)
        })
        .collect()
}

/// The parameter a server refusal names (`params.iters: ...`), if any.
pub fn refused_param(message: &str) -> Option<String> {
    let rest = message.split("params.").nth(1)?;
    let name: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

fn range_hint(p: &RunKindParam) -> String {
    match (p.min, p.max) {
        (Some(a), Some(b)) => format!("{a}–{b}"),
        (Some(a), None) => format!("≥ {a}"),
        (None, Some(b)) => format!("≤ {b}"),
        (None, None) => String::new(),
    }
}

#[component]
fn ParamField(
    param: RunKindParam,
    texts: RwSignal<BTreeMap<String, String>>,
    refused: RwSignal<Option<ApiError>>,
) -> impl IntoView {
    let name = param.name.clone();
    let id = format!("param-{name}");
    let n1 = name.clone();
    let value = move || texts.with(|t| t.get(&n1).cloned().unwrap_or_default());
    let n2 = name.clone();
    let set = move |v: String| {
        texts.update(|t| {
            t.insert(n2.clone(), v);
        })
    };
    let input = match param.ty {
        ParamType::Boolean => {
            let v = value.clone();
            view! { <input type="checkbox" id=id.clone() prop:checked=move || v() == "true"
            on:change=move |ev| set(event_target_checked(&ev).to_string())/> }
            .into_any()
        }
        ParamType::String if !param.choices.is_empty() => {
            let opts = param
                .choices
                .iter()
                .map(|c| view! { <option value=c.clone()>{c.clone()}</option> })
                .collect_view();
            let v = value.clone();
            view! { <select id=id.clone() prop:value=v on:change=move |ev| set(event_target_value(&ev))>{opts}</select> }
                .into_any()
        }
        ParamType::EnvGrid => {
            let v = value.clone();
            view! { <textarea id=id.clone() rows="3" placeholder="NCCL_ALGO=Ring,Tree\nNCCL_PROTO=Simple,LL"
                prop:value=v on:input=move |ev| set(event_target_value(&ev))></textarea> }
            .into_any()
        }
        _ => {
            let v = value.clone();
            let mode = if matches!(param.ty, ParamType::Integer | ParamType::Number) {
                "decimal"
            } else {
                "text"
            };
            view! { <input id=id.clone() inputmode=mode prop:value=v on:input=move |ev| set(event_target_value(&ev))/> }
                .into_any()
        }
    };
    let mut hints = Vec::new();
    if let Some(u) = &param.unit {
        hints.push(u.clone());
    }
    let range = range_hint(&param);
    if !range.is_empty() {
        hints.push(range);
    }
    if matches!(param.ty, ParamType::StringList) && !param.choices.is_empty() {
        hints.push(format!("any of: {}", param.choices.join(", ")));
    }
    if matches!(param.ty, ParamType::IntegerList | ParamType::StringList) {
        hints.push("comma-separated".into());
    }
    if param.required {
        hints.push("required".into());
    }
    let is_bytes = param.unit.as_deref() == Some("bytes") && param.ty == ParamType::Integer;
    let human = move || {
        if !is_bytes {
            return String::new();
        }
        value()
            .trim()
            .parse::<i64>()
            .map(|b| format!(" = {}", size(b)))
            .unwrap_or_default()
    };
    let n3 = name.clone();
    let err_id = format!("param-{name}-error");
    let err = move || {
        refused
            .get()
            .filter(|e| refused_param(&e.message).as_deref() == Some(n3.as_str()))
            .map(|e| e.message)
    };
    view! {
        <label for=id.clone()>{name.clone()}</label>
        <div class="param">
            {input}
            <span class="unit">{hints.join(" · ")}{human}</span>
            <div class="muted small">{param.help.clone()}</div>
            {move || err().map(|m| view! { <div class="error field-error" id=err_id.clone() role="alert">{m}</div> })}
        </div>
    }
}

#[component]
pub fn LaunchForm() -> impl IntoView {
    let (nodes, _) = api::load(|| api::get::<Vec<NodeSummary>>("/nodes"));
    let (kinds, _) = api::load(|| api::get::<Vec<RunKind>>("/run-kinds"));
    let kind = RwSignal::new(String::new());
    let texts = RwSignal::new(BTreeMap::<String, String>::new());
    let raw = RwSignal::new(false);
    let raw_text = RwSignal::new(String::from("{}"));
    let picked = RwSignal::new(Vec::<String>::new());
    let env = RwSignal::new(String::new());
    let recommended = RwSignal::new(true);
    let label = RwSignal::new(String::new());
    let timeout = RwSignal::new(String::new());
    let error = RwSignal::new(None::<String>);
    let refused = RwSignal::new(None::<ApiError>);
    let busy = RwSignal::new(false);
    let navigate = use_navigate();
    let current = move || match kinds.get() {
        Load::Ready(all) => {
            let k = kind.get();
            all.iter().find(|x| x.name == k).or(all.first()).cloned()
        }
        _ => None,
    };
    // The first kind is chosen once the catalogue is in; a new kind starts from its defaults.
    Effect::new(move |_| {
        if let Load::Ready(all) = kinds.get()
            && kind.with_untracked(String::is_empty)
            && let Some(first) = all.first()
        {
            kind.set(first.name.clone());
        }
    });
    Effect::new(move |_| {
        if let Some(k) = current() {
            texts.set(default_texts(&k));
            refused.set(None);
        }
    });
    let params_now = move || {
        current()
            .map(|k| texts.with(|t| build_params(&k, t)))
            .unwrap_or(Value::Null)
    };
    let toggle_raw = move |ev| {
        let on = event_target_checked(&ev);
        if on {
            raw_text.set(serde_json::to_string_pretty(&params_now()).unwrap_or_default());
        }
        raw.set(on);
    };
    let submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        refused.set(None);
        let params_v = if raw.get_untracked() {
            match serde_json::from_str::<Value>(raw_text.get_untracked().trim()) {
                Ok(v) if v.is_object() => v,
                Ok(_) => return error.set(Some("params must be a JSON object".into())),
                Err(e) => return error.set(Some(format!("params are not JSON: {e}"))),
            }
        } else {
            params_now()
        };
        let env_v = match env_input::lines(&env.get_untracked()) {
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
            kind: kind.get_untracked(),
            params: params_v,
            env: env_v,
            timeout_s,
            stall_s: None,
            nodes: picked.get_untracked(),
            max_attempts: None,
            label: (!label_v.is_empty()).then_some(label_v),
            recommended_env: Some(recommended.get_untracked()),
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
    let kind_select = move |all: Vec<RunKind>| {
        let opts = all
            .iter()
            .map(|k| view! { <option value=k.name.clone()>{k.name.clone()}</option> })
            .collect_view();
        view! { <select id="run-kind" prop:value=move || kind.get() on:change=move |ev| kind.set(event_target_value(&ev))>{opts}</select> }
    };
    let fields = move || {
        current().map(|k| {
            let fs = k
                .params
                .into_iter()
                .map(|p| view! { <ParamField param=p texts=texts refused=refused/> })
                .collect_view();
            view! {
                <span>"About"</span><p class="muted" id="run-kind-about">{k.description.clone()}</p>
                {fs}
            }
        })
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
                    {format!(" {host} ({})", n.liveness)}</label> }
            })
            .collect_view()
            .into_any()
    };
    // A refusal that names no parameter of the form is shown under the button.
    let general_refusal = move || {
        refused.get().filter(|e| {
            let named = refused_param(&e.message);
            raw.get()
                || named
                    .is_none_or(|n| current().is_none_or(|k| !k.params.iter().any(|p| p.name == n)))
        })
    };
    view! {
        <form class="launch" id="launch" on:submit=submit>
            <h2>"Launch a run"</h2>
            <div class="form-grid">
                <label for="run-kind">"Kind"</label>
                <div>{loaded(kinds, "run kinds", kind_select)}</div>
                {move || (!raw.get()).then(fields)}
                <label for="run-raw">"Advanced"</label>
                <label><input type="checkbox" id="run-raw" prop:checked=move || raw.get() on:change=toggle_raw/>" raw JSON params"</label>
                {move || raw.get().then(|| view! {
                    <label for="run-params">"Params (JSON)"</label>
                    <textarea id="run-params" rows="4" prop:value=move || raw_text.get() on:input=move |ev| raw_text.set(event_target_value(&ev))></textarea>
                })}
                <span>"Nodes (rank = order ticked)"</span>
                <div class="node-picks">{loaded(nodes, "nodes", node_boxes)}</div>
                <label for="run-env">"Env (NAME=value lines)"</label>
                <textarea id="run-env" rows="3" placeholder="NCCL_IB_HCA=mlx5_0" prop:value=move || env.get() on:input=move |ev| env.set(event_target_value(&ev))></textarea>
                <label for="run-recommended-env">"Recommended env"</label>
                <label><input type="checkbox" id="run-recommended-env" prop:checked=move || recommended.get()
                    on:change=move |ev| recommended.set(event_target_checked(&ev))/>
                    " apply each node's recommendations and tuning profiles under this env"</label>
                <label for="run-timeout">"Timeout (s)"</label>
                <input id="run-timeout" inputmode="numeric" prop:value=move || timeout.get() on:input=move |ev| timeout.set(event_target_value(&ev))/>
                <label for="run-label">"Label"</label>
                <input id="run-label" prop:value=move || label.get() on:input=move |ev| label.set(event_target_value(&ev))/>
            </div>
            <p class="muted">{move || format!("Order: {}", picked.with(|p| if p.is_empty() { "none ticked".into() } else { p.join(" → ") }))}</p>
            <button type="submit" id="run-start" disabled=move || busy.get()>{move || if busy.get() { "Starting…" } else { "Start run" }}</button>
            {move || error.get().map(|e| view! { <p class="error" role="alert">{e}</p> })}
            {move || general_refusal().map(|e| error_line("The server refused the run", &e))}
            {move || (refused.with(Option::is_some) && general_refusal().is_none()).then(|| view! {
                <p class="error" id="run-refused" role="alert">"The server refused a parameter; see the message beside it."</p> })}
        </form>
    }
}
