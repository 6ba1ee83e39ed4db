//! Regressions: figures that moved to a new level and stayed (docs/health.md,
//! "Regressions"). The list is the open ones newest first (or every change), filtered by
//! node, kind and time, with the filters in the address so a list can be linked to; each
//! links to its series: the chart with its change points and the node's facts changes on
//! the time axis (`series_chart.rs`), what changed around each change and the fleet's view.

use chrono::{NaiveDate, Utc};
use heddle_types::regress::{self, ChartPoint, RAW_MAX_DAYS, Regression, Resolution, SeriesChart};
use leptos::prelude::*;
use leptos_router::NavigateOptions;
use leptos_router::hooks::{use_navigate, use_query_map};

use crate::api::{self, seg};
use crate::series_chart::{SeriesChartView, marker_text};
use crate::ui::{loaded, size, when};

/// The series view of a change: `/regressions/series?node=..&test=..`.
pub fn series_href(r: &Regression) -> String {
    let pair = r
        .pair
        .as_deref()
        .map(|p| format!("&pair={}", seg(p)))
        .unwrap_or_default();
    format!(
        "/regressions/series?node={}&test={}&metric={}&band={}&world_size={}{pair}",
        r.node_id,
        seg(&r.test),
        seg(&r.metric),
        r.size_band,
        r.world_size
    )
}

/// What names a series: "nccl.all_reduce busbw_gbs · 8 GiB · 1 node", "p2p.d2d algbw_gbs
/// pair 0-1 · 256 MiB · 1 node".
struct SeriesName<'a> {
    test: &'a str,
    metric: &'a str,
    pair: Option<&'a str>,
    band: i32,
    world_size: i32,
}

impl SeriesName<'_> {
    fn of(r: &Regression) -> SeriesName<'_> {
        SeriesName {
            test: &r.test,
            metric: &r.metric,
            pair: r.pair.as_deref(),
            band: r.size_band,
            world_size: r.world_size,
        }
    }

    fn text(&self) -> String {
        let pair = self.pair.map(|p| format!(" pair {p}")).unwrap_or_default();
        format!(
            "{} {}{pair} · {} · {} node{}",
            self.test,
            self.metric,
            size(1i64 << self.band.clamp(0, 62)),
            self.world_size,
            if self.world_size == 1 { "" } else { "s" }
        )
    }
}

fn pct(v: f64) -> String {
    format!("{:+.1} %", v * 100.0)
}

fn state_badge(r: &Regression) -> impl IntoView + use<> {
    let (class, text) = if r.open {
        ("badge bad", "open")
    } else if r.worse {
        ("badge warn", "superseded")
    } else {
        ("badge good", "improved")
    };
    view! { <span class=class data-state=text>{text}</span> }
}

fn changes_text(r: &Regression) -> String {
    if r.facts_changes.is_empty() {
        "nothing on the node".into()
    } else {
        r.facts_changes
            .iter()
            .map(regress::change_label)
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// Changes as table rows, each linking to its series.
pub fn regression_table(list: Vec<Regression>, empty: &'static str) -> AnyView {
    if list.is_empty() {
        return view! { <p class="empty" id="regressions-empty">{empty}</p> }.into_any();
    }
    let rows = list
        .into_iter()
        .map(|r| {
            let href = series_href(&r);
            view! { <tr class="regression" data-host=r.hostname.clone()>
                <td class="mono small">{r.t.format("%Y-%m-%d %H:%M").to_string()}</td>
                <td><a href=format!("/nodes/{}", r.node_id)>{r.hostname.clone()}</a></td>
                <td><a class="series-link" href=href>{SeriesName::of(&r).text()}</a></td>
                <td class="num">{format!("{:.2} → {:.2}", r.before, r.after)}</td>
                <td class="num">{pct(r.relative_change)}<span class="muted small">{format!(" ({} to {})", pct(r.ci_low), pct(r.ci_high))}</span></td>
                <td>{state_badge(&r)}</td>
                <td class="small">{changes_text(&r)}</td>
                <td class="small">{regress::fleet_text(&r.fleet)}</td>
            </tr> }
        })
        .collect_view();
    view! { <table class="grid" id="regressions-table"><thead><tr><th>"Changed"</th><th>"Node"</th><th>"Series"</th>
        <th>"Before → after"</th><th>"Change (95 % CI)"</th><th>"State"</th><th>"On the node"</th><th>"Fleet"</th></tr></thead>
        <tbody>{rows}</tbody></table> }.into_any()
}

/// A node's open regressions, for its page.
#[component]
pub fn NodeRegressions(node: String) -> impl IntoView {
    let path = format!("/regressions?node={}", seg(&node));
    let (state, _) = api::load(move || {
        let path = path.clone();
        async move { api::get::<Vec<Regression>>(&path).await }
    });
    loaded(state, "regressions", |l| {
        regression_table(
            l,
            "No open regression: no figure of this node moved for the worse and stayed.",
        )
    })
}

/// The list's filters as the API's query parameters; `since` is a day (`2026-01-31`).
fn api_query(node: &str, kind: &str, since: &str, all: bool) -> String {
    let mut parts = vec!["limit=200".to_string()];
    if !node.is_empty() {
        parts.push(format!("node={}", seg(node)));
    }
    if !kind.is_empty() {
        parts.push(format!("kind={}", seg(kind)));
    }
    if let Ok(day) = NaiveDate::parse_from_str(since, "%Y-%m-%d") {
        parts.push(format!("since={day}T00:00:00Z"));
    }
    if all {
        parts.push("all=true".into());
    }
    parts.join("&")
}

#[component]
pub fn Regressions() -> impl IntoView {
    let query = use_query_map();
    let param = move |k: &str| query.with(|q| q.get(k).unwrap_or_default());
    let (node, kind, since) = (
        RwSignal::new(param("node")),
        RwSignal::new(param("kind")),
        RwSignal::new(param("since")),
    );
    let navigate = use_navigate();
    // The filters live in the address: applying them navigates, and the list follows it.
    let go = move |all: bool| {
        let mut parts = Vec::new();
        for (k, v) in [
            ("node", node.get_untracked()),
            ("kind", kind.get_untracked()),
            ("since", since.get_untracked()),
        ] {
            let v = v.trim().to_string();
            if !v.is_empty() {
                parts.push(format!("{k}={}", seg(&v)));
            }
        }
        if all {
            parts.push("all=true".into());
        }
        navigate(
            &format!("/regressions?{}", parts.join("&")),
            NavigateOptions {
                replace: true,
                ..Default::default()
            },
        );
    };
    let all = move || param("all") == "true";
    let go2 = go.clone();
    let submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        go(all());
    };
    let toggle = move |ev| go2(event_target_checked(&ev));
    let list = move || {
        let path = format!(
            "/regressions?{}",
            api_query(&param("node"), &param("kind"), &param("since"), all())
        );
        let (state, _) = api::load(move || {
            let path = path.clone();
            async move { api::get::<Vec<Regression>>(&path).await }
        });
        let empty = if all() {
            "No changes match."
        } else {
            "No open regressions match."
        };
        loaded(state, "regressions", move |l| regression_table(l, empty))
    };
    view! {
        <section class="regressions">
            <h1>"Regressions"</h1>
            <p class="muted">"Figures that moved to a new level and stayed, each with what changed on the node and how comparable nodes moved. See docs/health.md, “Regressions”."</p>
            <form class="filters" id="regressions-filter" on:submit=submit>
                <input id="filter-node" placeholder="node" bind:value=node/>
                <input id="filter-kind" placeholder="kind or test (nccl, nccl.all_reduce)" bind:value=kind/>
                <label>"since "<input id="filter-since" type="date" bind:value=since/></label>
                <button type="submit" id="filter-apply">"Filter"</button>
                <label><input id="filter-all" type="checkbox" prop:checked=all on:change=toggle/>" all changes (closed ones and improvements too)"</label>
            </form>
            {list}
        </section>
    }
}

/// `?node=..&test=..&metric=..&band=..&world_size=..[&since=..][&until=..]`, as the API
/// takes it.
#[component]
pub fn SeriesPage() -> impl IntoView {
    let query = use_query_map();
    move || {
        let q = query.get();
        let get = |k: &str| q.get(k).unwrap_or_default();
        let mut parts = Vec::new();
        for k in [
            "node",
            "test",
            "metric",
            "band",
            "world_size",
            "pair",
            "since",
            "until",
        ] {
            let v = get(k);
            if !v.is_empty() {
                parts.push(format!("{k}={}", seg(&v)));
            }
        }
        let base: Vec<String> = parts
            .iter()
            .filter(|p| !p.starts_with("since=") && !p.starts_with("until="))
            .cloned()
            .collect();
        let path = format!("/regressions/series?{}", parts.join("&"));
        let (state, _) = api::load(move || {
            let path = path.clone();
            async move { api::get::<SeriesChart>(&path).await }
        });
        let ranges = range_links(&base.join("&"), &get("since"));
        view! {
            <section class="series">
                {loaded(state, "the series", move |c| series_body(c, ranges.clone()))}
            </section>
        }
    }
}

/// Links to the same series over the last week, month, quarter or all of it.
fn range_links(base: &str, since: &str) -> Vec<(String, String, bool)> {
    let now = Utc::now();
    let mut out = vec![(
        "all".to_string(),
        format!("/regressions/series?{base}"),
        since.is_empty(),
    )];
    for days in [7, 30, 90, 365] {
        let from = (now - chrono::Duration::days(days))
            .format("%Y-%m-%dT00:00:00Z")
            .to_string();
        // The day, not the moment, so the link (and a reload of it) stays the same all day.
        let current = since.starts_with(&from[..10]);
        out.push((
            format!("{days} days"),
            format!("/regressions/series?{base}&since={}", seg(&from)),
            current,
        ));
    }
    out
}

fn series_body(c: SeriesChart, ranges: Vec<(String, String, bool)>) -> impl IntoView {
    let title = SeriesName {
        test: &c.test,
        metric: &c.metric,
        pair: c.pair.as_deref(),
        band: c.size_band,
        world_size: c.world_size,
    }
    .text();
    let days = c.resolution == Resolution::Days;
    let what = if days { "days" } else { "figures" };
    let thinned = (c.stride > 1).then(|| {
        view! { <p class="muted" id="series-thinned">{format!("{} of {} {what} drawn (every {}th).", c.points.len(), c.total_points, c.stride)}</p> }
    });
    let daily = days.then(|| {
        view! { <p class="muted" id="series-daily">{format!("A range over {RAW_MAX_DAYS} days: one point a day, the median of its figures (the line through it spans the day's lowest to highest).")}</p> }
    });
    let range = ranges
        .into_iter()
        .map(|(label, href, current)| view! { <a href=href class=if current { "range current" } else { "range" }>{label}</a>" " })
        .collect_view();
    let markers = c
        .facts_markers
        .iter()
        .map(|m| view! { <li class="facts-change"><span class="mono small">{m.t.format("%Y-%m-%d %H:%M UTC").to_string()}</span>" "{marker_text(m)}</li> })
        .collect_view();
    let no_markers = c.facts_markers.is_empty();
    let changes = c
        .change_points
        .iter()
        .rev()
        .map(change_block)
        .collect_view();
    let no_changes = c.change_points.is_empty();
    let recent = recent_table(
        c.points.iter().rev().take(20).cloned().collect(),
        c.resolution,
    );
    view! {
        <div class="title-row">
            <h1 id="series-title">{title}</h1>
            <span class="muted">"on "<a href=format!("/nodes/{}", c.node_id)>{c.hostname.clone()}</a></span>
        </div>
        <p class="filters">"Range: "{range}<a href=format!("/regressions?node={}", c.node_id)>"this node's regressions"</a></p>
        <SeriesChartView chart=c.clone()/>
        {daily}
        {thinned}
        <h2>"Facts changes on the node"</h2>
        {if no_markers {
            view! { <p class="empty">"None in this range."</p> }.into_any()
        } else {
            view! { <ul id="facts-markers">{markers}</ul> }.into_any()
        }}
        <h2>"Change points"</h2>
        {if no_changes {
            view! { <p class="empty" id="no-change-points">"No change in this range."</p> }.into_any()
        } else {
            view! { <div id="change-points">{changes}</div> }.into_any()
        }}
        <h2>"Latest figures"</h2>
        {recent}
    }
}

fn change_block(r: &Regression) -> impl IntoView + use<> {
    view! {
        <article class="change" data-t=r.t.to_rfc3339()>
            <h3>{state_badge(r)}{format!(" {} · {:.2} → {:.2} · {} (95 % CI {} to {})",
                r.t.format("%Y-%m-%d %H:%M UTC"), r.before, r.after, pct(r.relative_change), pct(r.ci_low), pct(r.ci_high))}</h3>
            <p class="small">{format!("{} points before, {} after.", r.points_before, r.points_after)}</p>
            <p><strong>"On the node: "</strong><span class="node-changes">{changes_text(r)}</span></p>
            <p><strong>"Fleet: "</strong><span class="fleet-view">{regress::fleet_text(&r.fleet)}</span></p>
        </article>
    }
}

fn recent_table(points: Vec<ChartPoint>, resolution: Resolution) -> impl IntoView {
    let rows = points
        .into_iter()
        .map(|p| {
            let what = match (p.run_id, p.n) {
                (Some(run), _) => view! { <a href=format!("/runs/{run}")>"run"</a> }.into_any(),
                (None, Some(n)) => {
                    let range = format!("{n} figures, {:.2} to {:.2}", p.min.unwrap_or(p.value), p.max.unwrap_or(p.value));
                    view! { <span class="muted small">{range}</span> }.into_any()
                }
                (None, None) => view! { <span class="muted small">"run no longer kept"</span> }.into_any(),
            };
            let t = if resolution == Resolution::Days { p.t.format("%Y-%m-%d").to_string() } else { when(Some(p.t)) };
            view! { <tr><td class="mono small">{t}</td><td class="num">{format!("{:.2}", p.value)}</td><td>{what}</td></tr> }
        })
        .collect_view();
    let head = if resolution == Resolution::Days {
        ("Day", "Median")
    } else {
        ("Received", "Value")
    };
    view! { <table class="grid" id="series-points"><thead><tr><th>{head.0}</th><th>{head.1}</th><th></th></tr></thead><tbody>{rows}</tbody></table> }
}
