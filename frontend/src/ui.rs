//! Small pieces every page uses: the three states of a load, health badges, times and sizes
//! written for people.

use chrono::{DateTime, Utc};
use leptos::prelude::*;

use crate::api::{ApiError, Load};

/// Renders a load: a loading line, the server's error, or `render` of the value.
pub fn loaded<T, V>(
    state: RwSignal<Load<T>>,
    what: &'static str,
    render: impl Fn(T) -> V + Send + Sync + 'static,
) -> impl IntoView
where
    T: Clone + Send + Sync + 'static,
    V: IntoView + 'static,
{
    move || match state.get() {
        Load::Loading => view! { <p class="loading">{format!("Loading {what}…")}</p> }.into_any(),
        Load::Failed(e) => error_line(&format!("Could not load {what}"), &e).into_any(),
        Load::Ready(t) => render(t).into_any(),
    }
}

pub fn error_line(context: &str, e: &ApiError) -> impl IntoView + use<> {
    view! { <p class="error" role="alert">{format!("{context}: {}", e.describe())}</p> }
}

/// An action's outcome shown under its button.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Idle,
    Busy,
    Done(String),
    Failed(ApiError),
}

pub fn outcome_line(o: RwSignal<Outcome>) -> impl IntoView {
    move || match o.get() {
        Outcome::Idle => ().into_any(),
        Outcome::Busy => view! { <p class="loading">"Working…"</p> }.into_any(),
        Outcome::Done(m) => view! { <p class="ok" role="status">{m}</p> }.into_any(),
        Outcome::Failed(e) => error_line("Failed", &e).into_any(),
    }
}

/// An agent's liveness (`online`, `stale`, `offline`) or state (those, or `revoked`).
pub fn liveness_badge(liveness: &str) -> impl IntoView + use<> {
    let class = match liveness {
        "online" => "badge good",
        "stale" => "badge warn",
        _ => "badge bad",
    };
    view! { <span class=class>{liveness.to_string()}</span> }
}

pub fn port_badge(state: &str) -> impl IntoView + use<> {
    let class = if state == "ACTIVE" {
        "badge good"
    } else {
        "badge bad"
    };
    view! { <span class=class>{state.to_string()}</span> }
}

/// "12 s ago", "3 min ago", "2 h ago", or the date for anything older than two days.
pub fn ago(t: Option<DateTime<Utc>>) -> String {
    let Some(t) = t else { return "never".into() };
    let now_ms = js_sys::Date::now() as i64;
    let secs = (now_ms - t.timestamp_millis()).max(0) / 1000;
    match secs {
        0..60 => format!("{secs} s ago"),
        60..3600 => format!("{} min ago", secs / 60),
        3600..172_800 => format!("{} h ago", secs / 3600),
        _ => t.format("%Y-%m-%d %H:%M UTC").to_string(),
    }
}

pub fn when(t: Option<DateTime<Utc>>) -> String {
    t.map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_else(|| "—".into())
}

/// Message sizes as nccl-tests people read them: 8 B, 64 KiB, 1 MiB, 8 GiB.
pub fn size(bytes: i64) -> String {
    heddle_types::kinds::shown::size(bytes.max(0) as u64)
}

pub fn opt_num(v: Option<f64>, digits: usize) -> String {
    v.map(|v| format!("{v:.digits$}"))
        .unwrap_or_else(|| "—".into())
}
