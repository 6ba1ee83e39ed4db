//! Every node, problems first, a page at a time. The server filters, counts and pages
//! (`GET /api/v1/nodes` and `/api/v1/nodes/counts`): the page asks for the first problem
//! nodes, then for healthy ones once those run out, and for more only when asked ("Load more", or scrolling near the end). A fleet
//! of 50,000 nodes costs one page of rows to show, and at most [`MAX_ROWS`] rows in the DOM.

use heddle_types::nodes::{NodeCounts, NodeSummary};
use leptos::prelude::*;
use leptos::task::spawn_local;

use crate::api::{self, ApiError, Load};
use crate::ui::{ago, error_line, liveness_badge, loaded, port_badge};

/// Rows per request: small enough to render at once, large enough to scroll through.
const PAGE: usize = 200;
/// Rows the page keeps; past them it asks for a narrower filter instead of growing.
const MAX_ROWS: usize = 2000;
/// Scrolling this close to the end of the page loads the next page.
const NEAR_END_PX: f64 = 600.0;
/// Typing settles this long before the server is asked.
const DEBOUNCE_MS: u32 = 250;

/// What the filter controls say, as the server's query parameters.
#[derive(Debug, Clone, Default, PartialEq)]
struct Filter {
    q: String,
    liveness: String,
    layer: String,
    only_problems: bool,
}

impl Filter {
    /// The filters as query parameters, with `problems` when given.
    fn query(&self, problems: Option<bool>) -> String {
        let mut parts = Vec::new();
        let q = self.q.trim();
        if !q.is_empty() {
            parts.push(format!("q={}", api::seg(q)));
        }
        // The filter's first name, which servers of every version take.
        if !self.liveness.is_empty() {
            parts.push(format!("liveness={}", api::seg(&self.liveness)));
        }
        if !self.layer.is_empty() {
            parts.push(format!("link_layer={}", api::seg(&self.layer)));
        }
        if let Some(p) = problems {
            parts.push(format!("problems={p}"));
        }
        parts.join("&")
    }

    fn is_empty(&self) -> bool {
        self.query(None).is_empty() && !self.only_problems
    }
}

/// Where the list goes on: within the problem nodes or the healthy ones, after `cursor`.
#[derive(Debug, Clone, PartialEq)]
struct Next {
    problems: bool,
    cursor: Option<String>,
}

impl Next {
    const FIRST: Next = Next {
        problems: true,
        cursor: None,
    };
}

/// Up to [`PAGE`] rows from `next` on, problem nodes first: when they run out before the
/// page is full, the healthy ones follow (unless only problems are wanted).
async fn fetch(
    filter: &Filter,
    mut next: Next,
) -> Result<(Vec<NodeSummary>, Option<Next>), ApiError> {
    let mut rows = Vec::new();
    loop {
        let mut path = format!(
            "/nodes?limit={}&{}",
            PAGE - rows.len(),
            filter.query(Some(next.problems))
        );
        if let Some(c) = &next.cursor {
            path.push_str(&format!("&cursor={}", api::seg(c)));
        }
        let (mut page, cursor) = api::get_page::<NodeSummary>(&path).await?;
        rows.append(&mut page);
        next = match cursor {
            Some(c) => Next {
                problems: next.problems,
                cursor: Some(c),
            },
            None if next.problems && !filter.only_problems => Next {
                problems: false,
                cursor: None,
            },
            None => return Ok((rows, None)),
        };
        if rows.len() >= PAGE || next.cursor.is_some() {
            return Ok((rows, Some(next)));
        }
    }
}

/// `50000` as `50,000`.
fn thousands(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(d);
    }
    if n < 0 { format!("-{out}") } else { out }
}

#[component]
pub fn Fleet() -> impl IntoView {
    let typed = RwSignal::new(String::new());
    let q = RwSignal::new(String::new());
    let liveness = RwSignal::new(String::new());
    let layer = RwSignal::new(String::new());
    let only_problems = RwSignal::new(false);
    let filter = Memo::new(move |_| Filter {
        q: q.get(),
        liveness: liveness.get(),
        layer: layer.get(),
        only_problems: only_problems.get(),
    });
    let status = RwSignal::new(Load::<()>::Loading);
    let rows = RwSignal::new(Vec::<NodeSummary>::new());
    let next = RwSignal::new(None::<Next>);
    let counts = RwSignal::new(None::<Result<NodeCounts, ApiError>>);
    // True from a change of the controls until its first page is in: the count line then
    // says so, rather than showing the previous filter's figures beside new rows.
    let pending = RwSignal::new(true);
    let more = RwSignal::new(None::<Result<(), ApiError>>);
    let generation = StoredValue::new(0u64);
    let refreshes = RwSignal::new(0u32);

    Effect::new(move || {
        let f = filter.get();
        refreshes.track();
        generation.update_value(|g| *g += 1);
        let mine = generation.get_value();
        let current = move || generation.try_get_value() == Some(mine);
        counts.set(None);
        more.set(None);
        if matches!(status.get_untracked(), Load::Failed(_)) {
            status.set(Load::Loading);
        }
        let f2 = f.clone();
        spawn_local(async move {
            let result = fetch(&f2, Next::FIRST).await;
            if !current() {
                return;
            }
            match result {
                Ok((page, after)) => {
                    rows.set(page);
                    next.set(after);
                    status.set(Load::Ready(()));
                }
                Err(e) => status.set(Load::Failed(e)),
            }
            pending.set(false);
        });
        spawn_local(async move {
            let c = api::get::<NodeCounts>(&format!(
                "/nodes/counts?{}",
                f.query(f.only_problems.then_some(true))
            ))
            .await;
            if current() {
                counts.set(Some(c));
            }
        });
    });
    // Time to first render, readable by tests and by a person in the browser's performance
    // panel: navigation start to the first fleet table with data.
    let marked = StoredValue::new(false);
    Effect::new(move || {
        if matches!(status.get(), Load::Ready(_)) && !marked.get_value() {
            marked.set_value(true);
            if let Some(p) = window().performance() {
                let _ = p.mark("heddle:fleet-rendered");
            }
        }
    });

    // `by_scrolling`: asked for by reaching the end of the page, which does not retry a
    // failed load (the button does).
    let load_more = move |by_scrolling: bool| {
        let Some(from) = next.get_untracked() else {
            return;
        };
        match more.get_untracked() {
            Some(Ok(())) => return,
            Some(Err(_)) if by_scrolling => return,
            _ => {}
        }
        if rows.with_untracked(Vec::len) >= MAX_ROWS {
            return;
        }
        more.set(Some(Ok(())));
        let mine = generation.get_value();
        let f = filter.get_untracked();
        spawn_local(async move {
            let result = fetch(&f, from).await;
            if generation.try_get_value() != Some(mine) {
                return;
            }
            match result {
                Ok((page, after)) => {
                    rows.update(|r| r.extend(page));
                    next.set(after);
                    more.set(None);
                }
                Err(e) => more.set(Some(Err(e))),
            }
        });
    };
    // The next page comes by itself when the end of the table is in sight.
    let near_end = window_event_listener(leptos::ev::scroll, move |_| {
        let w = window();
        let seen = w
            .inner_height()
            .ok()
            .and_then(|h| h.as_f64())
            .unwrap_or(0.0)
            + w.scroll_y().unwrap_or(0.0);
        let end = document().body().map_or(0, |b| b.scroll_height());
        if seen >= f64::from(end) - NEAR_END_PX {
            load_more(true);
        }
    });
    on_cleanup(move || near_end.remove());
    let on_type = move |ev| {
        let v = event_target_value(&ev);
        typed.set(v.clone());
        pending.set(true);
        spawn_local(async move {
            gloo_timers::future::TimeoutFuture::new(DEBOUNCE_MS).await;
            if typed.try_get_untracked().as_ref() == Some(&v) {
                q.set(v);
            }
        });
    };
    let changed = move |set: RwSignal<String>| {
        move |ev| {
            pending.set(true);
            set.set(event_target_value(&ev));
        }
    };

    let count_line = move || {
        let shown = rows.with(Vec::len);
        if pending.get() {
            return "Searching…".to_string();
        }
        let c = match counts.get() {
            None => return format!("{shown} nodes shown; counting…"),
            Some(Err(e)) => return format!("{shown} nodes shown; not counted: {}", e.describe()),
            Some(Ok(c)) => c,
        };
        let mut line = format!("{} of {} nodes", thousands(c.total), thousands(c.fleet));
        if c.problems > 0 {
            line.push_str(&format!(" · {} with problems", thousands(c.problems)));
        }
        if (shown as i64) < c.total {
            line.push_str(&format!(" · showing the first {}", thousands(shown as i64)));
        }
        line
    };
    let empty_fleet = Memo::new(move |_| rows.with(Vec::is_empty) && filter.with(Filter::is_empty));
    let footer = move || {
        let shown = rows.with(Vec::len);
        match (next.get(), more.get()) {
            (None, _) => ().into_any(),
            (Some(_), _) if shown >= MAX_ROWS => view! {
                <p class="muted" id="fleet-cap">{format!("Showing the first {} nodes: search or filter to find the rest.", thousands(shown as i64))}</p>
            }
            .into_any(),
            (Some(_), Some(Ok(()))) => view! { <p class="loading">"Loading more…"</p> }.into_any(),
            (Some(_), failed) => view! {
                {failed.and_then(Result::err).map(|e| error_line("Could not load more nodes", &e))}
                <button id="fleet-more" on:click=move |_| load_more(false)>"Load more"</button>
            }
            .into_any(),
        }
    };
    let table = move |()| {
        move || {
            if empty_fleet.get() {
                return view! {
                    <div class="empty" id="fleet-empty">
                        <p>"No nodes yet. Nodes appear when an agent enrolls."</p>
                        <p><a href="/agents">"Create an enrollment token"</a>" to start one."</p>
                    </div>
                }
                .into_any();
            }
            view! {
                <p class="muted" id="fleet-count">{count_line}</p>
                <table class="grid" id="fleet-table">
                    <thead><tr>
                        <th>"Node"</th><th>"Liveness"</th><th>"GPUs"</th><th>"HCAs"</th><th>"Ports"</th>
                        <th>"Link"</th><th>"Traits"</th><th>"Problems"</th><th>"Last seen"</th>
                    </tr></thead>
                    <tbody>
                        <For each=move || rows.get() key=|n| n.id let:n>{row(&n)}</For>
                    </tbody>
                </table>
                {footer}
            }
            .into_any()
        }
    };
    view! {
        <section>
            <div class="title-row">
                <h1>"Fleet"</h1>
                <button class="link" on:click=move |_| { pending.set(true); refreshes.update(|n| *n += 1) }>"Refresh"</button>
            </div>
            <div class="filters">
                <input id="fleet-search" type="search" placeholder="Search host, GPU, HCA, trait, site…"
                    prop:value=move || typed.get() on:input=on_type />
                <select id="fleet-liveness" on:change=changed(liveness)>
                    <option value="">"Any liveness"</option>
                    <option value="online">"Online"</option>
                    <option value="stale">"Stale"</option>
                    <option value="offline">"Offline"</option>
                </select>
                <select id="fleet-layer" on:change=changed(layer)>
                    <option value="">"Any link layer"</option>
                    <option value="InfiniBand">"InfiniBand"</option>
                    <option value="Ethernet">"RoCE / Ethernet"</option>
                    <option value="none">"No RDMA"</option>
                </select>
                <label><input type="checkbox" id="fleet-problems"
                    on:change=move |ev| { pending.set(true); only_problems.set(event_target_checked(&ev)) } />" Problems only"</label>
            </div>
            {loaded(status, "nodes", table)}
        </section>
    }
}

fn row(n: &NodeSummary) -> impl IntoView + use<> {
    let problems = n.problems();
    let class = if problems.is_empty() { "" } else { "problem" };
    let gpus = match (&n.gpu_model, n.gpu_count) {
        (_, 0) => "none".to_string(),
        (Some(m), c) => format!("{c} × {m}"),
        (None, c) => format!("{c} × unknown"),
    };
    let href = format!("/nodes/{}", n.id);
    let ports = n.port_states.iter().map(|s| port_badge(s)).collect_view();
    let traits = n
        .traits
        .iter()
        .map(|(k, v)| view! { <span class="chip">{format!("{k}={v}")}</span> })
        .collect_view();
    view! {
        <tr class=class data-host=n.hostname.clone()>
            <td><a href=href>{n.hostname.clone()}</a>{n.site.clone().map(|s| view! { <span class="muted">{format!(" · {s}")}</span> })}</td>
            <td>{liveness_badge(n.liveness.as_str())}</td>
            <td>{gpus}</td>
            <td class="mono">{if n.hcas.is_empty() { "—".to_string() } else { n.hcas.join(" ") }}</td>
            <td>{ports}</td>
            <td>{n.link_layers.join(", ")}</td>
            <td>{traits}</td>
            <td class="problems">{problems.join("; ")}</td>
            <td class="muted">{ago(n.last_seen_at)}</td>
        </tr>
    }
}
