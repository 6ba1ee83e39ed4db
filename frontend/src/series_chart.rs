//! One regressions series over time as a hand-written SVG: the figures as dots, each change
//! point as a vertical line with the levels before and after it as horizontal segments and
//! the 95 % interval of the new level as a band, and the node's facts changes as markers on
//! the time axis, each naming what changed.

use chrono::{DateTime, Utc};
use heddle_types::regress::{self, SeriesChart};
use leptos::prelude::*;

use crate::chart::nice_step;

const W: f64 = 900.0;
const H: f64 = 360.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 28.0;
/// Room under the plot for the time labels and the facts markers' labels.
const BOTTOM: f64 = 78.0;

/// Where on the plot a time and a value go.
#[derive(Clone, Copy)]
struct Scale {
    t0: i64,
    t1: i64,
    lo: f64,
    hi: f64,
}

impl Scale {
    fn x(&self, t: DateTime<Utc>) -> f64 {
        let span = (self.t1 - self.t0).max(1) as f64;
        LEFT + (t.timestamp_millis() - self.t0) as f64 / span * (W - LEFT - RIGHT)
    }
    fn y(&self, v: f64) -> f64 {
        TOP + (1.0 - (v - self.lo) / (self.hi - self.lo)) * (H - TOP - BOTTOM)
    }
}

/// The value axis: around the figures and levels, not from zero, so a 5 % step is visible.
fn value_range(values: impl Iterator<Item = f64>) -> (f64, f64, f64) {
    let (mut lo, mut hi) = (f64::MAX, f64::MIN);
    for v in values.filter(|v| v.is_finite()) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if lo > hi {
        return (0.0, 1.0, 0.2);
    }
    let pad = ((hi - lo) * 0.15).max(hi.abs() * 0.01).max(1e-9);
    let step = nice_step((hi - lo + 2.0 * pad) * 5.0 / 6.0);
    let lo = ((lo - pad) / step).floor() * step;
    let hi = ((hi + pad) / step).ceil() * step;
    (lo, hi, step)
}

fn pct(v: f64) -> String {
    format!("{:+.1} %", v * 100.0)
}

/// What a facts marker names: `driver 550.54.15 → 560.28.03; kernel 6.8.0-45 → 6.8.0-49`.
pub fn marker_text(m: &regress::FactsMarker) -> String {
    m.changes
        .iter()
        .map(regress::change_label)
        .collect::<Vec<_>>()
        .join("; ")
}

#[component]
pub fn SeriesChartView(chart: SeriesChart) -> impl IntoView {
    if chart.points.is_empty() && chart.change_points.is_empty() {
        return view! { <p class="empty" id="series-empty">"No figures of this series in the range."</p> }.into_any();
    }
    let mut times: Vec<DateTime<Utc>> = chart.points.iter().map(|p| p.t).collect();
    times.extend(chart.change_points.iter().map(|c| c.t));
    times.extend(chart.facts_markers.iter().map(|m| m.t));
    let (first, last) = (times.iter().min().copied(), times.iter().max().copied());
    let (Some(first), Some(last)) = (first, last) else {
        return ().into_any();
    };
    let levels = chart.change_points.iter().flat_map(|c| {
        [
            c.before,
            c.after,
            c.before * (1.0 + c.ci_low),
            c.before * (1.0 + c.ci_high),
        ]
    });
    let extremes = chart.points.iter().flat_map(|p| [p.min, p.max]).flatten();
    let (lo, hi, step) = value_range(
        chart
            .points
            .iter()
            .map(|p| p.value)
            .chain(extremes)
            .chain(levels),
    );
    // A little room either side so the first and last dots are not on the frame.
    let span = (last - first).num_milliseconds().max(3_600_000);
    let s = Scale {
        t0: first.timestamp_millis() - span / 40,
        t1: last.timestamp_millis() + span / 40,
        lo,
        hi,
    };
    let bottom = H - BOTTOM;
    let ygrid = (0..=((hi - lo) / step).round() as usize)
        .map(|i| {
            let v = lo + i as f64 * step;
            let y = s.y(v);
            view! {
                <line x1=LEFT x2=W - RIGHT y1=y y2=y class="grid-line"/>
                <text x=LEFT - 6.0 y=y + 4.0 text-anchor="end" class="axis">{format!("{}", (v * 1000.0).round() / 1000.0)}</text>
            }
        })
        .collect_view();
    let ticks = 6;
    let long = span > 3 * 86_400_000;
    let xgrid = (0..=ticks)
        .map(|i| {
            let ms = s.t0 + (s.t1 - s.t0) * i / ticks;
            let t = DateTime::<Utc>::from_timestamp_millis(ms).unwrap_or(first);
            let x = s.x(t);
            let label = if long {
                t.format("%Y-%m-%d")
            } else {
                t.format("%m-%d %H:%M")
            };
            // The last label ends at the right edge rather than running past it.
            let anchor = if i == ticks { "end" } else { "middle" };
            view! {
                <line x1=x x2=x y1=TOP y2=bottom class="grid-line"/>
                <text x=x y=bottom + 14.0 text-anchor=anchor class="axis">{label.to_string()}</text>
            }
        })
        .collect_view();
    let line = chart
        .points
        .iter()
        .map(|p| format!("{:.1},{:.1}", s.x(p.t), s.y(p.value)))
        .collect::<Vec<_>>()
        .join(" ");
    let dots = chart
        .points
        .iter()
        .map(|p| {
            let (x, y) = (s.x(p.t), s.y(p.value));
            match (p.n, p.min, p.max) {
                // A day: its median, and its lowest to highest figure as a line through it.
                (Some(n), Some(min), Some(max)) => {
                    let tip = format!(
                        "{}: median {:.2} of {n} (lowest {min:.2}, highest {max:.2}) {}",
                        p.t.format("%Y-%m-%d"),
                        p.value,
                        chart.metric
                    );
                    view! { <g class="day"><title>{tip}</title>
                    <line class="spread" x1=x x2=x y1=s.y(min) y2=s.y(max)/>
                    <circle class="point" cx=x cy=y r="3"/></g> }
                    .into_any()
                }
                _ => {
                    let tip = format!(
                        "{}: {:.2} {}",
                        p.t.format("%Y-%m-%d %H:%M UTC"),
                        p.value,
                        chart.metric
                    );
                    view! { <circle class="point" cx=x cy=y r="3"><title>{tip}</title></circle> }
                        .into_any()
                }
            }
        })
        .collect_view();
    // Each change's levels run from the change before it (or the first figure) to the one
    // after it (or the last figure).
    let cps = &chart.change_points;
    let changes = cps
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let start = if i == 0 { first } else { cps[i - 1].t };
            let end = cps.get(i + 1).map_or(last, |n| n.t);
            let (x, x0, x1) = (s.x(c.t), s.x(start), s.x(end));
            let (ci_a, ci_b) = (s.y(c.before * (1.0 + c.ci_high)), s.y(c.before * (1.0 + c.ci_low)));
            let class = if c.open { "change-point open" } else if c.worse { "change-point closed" } else { "change-point improved" };
            let label = format!("{} ({} to {})", pct(c.relative_change), pct(c.ci_low), pct(c.ci_high));
            view! {
                <g class=class data-t=c.t.to_rfc3339()>
                    <title>{c.summary.clone()}</title>
                    <rect class="ci" x=x y=ci_a.min(ci_b) width=(x1 - x).max(1.0) height=(ci_b - ci_a).abs().max(1.0)/>
                    <line class="level before" x1=x0 x2=x y1=s.y(c.before) y2=s.y(c.before)/>
                    <line class="level after" x1=x x2=x1 y1=s.y(c.after) y2=s.y(c.after)/>
                    <line class="cp-line" x1=x x2=x y1=TOP - 6.0 y2=bottom/>
                    <text class="cp-label" x=x + 4.0 y=TOP - 10.0>{label}</text>
                </g>
            }
        })
        .collect_view();
    let markers = chart
        .facts_markers
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let x = s.x(m.t);
            let text = marker_text(m);
            let short = if text.chars().count() > 48 {
                format!("{}…", text.chars().take(47).collect::<String>())
            } else {
                text.clone()
            };
            // Labels of markers close together alternate between two rows.
            let y = bottom + 40.0 + 14.0 * (i % 2) as f64;
            view! {
                <g class="facts-marker" data-t=m.t.to_rfc3339() data-changes=text.clone()>
                    <title>{format!("{}: {text}", m.t.format("%Y-%m-%d %H:%M UTC"))}</title>
                    <line class="marker-line" x1=x x2=x y1=TOP y2=bottom + 24.0/>
                    <path class="marker" d=format!("M{x:.1},{:.1} l-6,10 h12 z", bottom + 18.0)/>
                    <text class="marker-label" x=x y=y text-anchor="middle">{short}</text>
                </g>
            }
        })
        .collect_view();
    let unit = chart.metric.clone();
    view! {
        <figure class="chart series">
            <svg id="series-chart" viewBox=format!("0 0 {W} {H}") width="100%" role="img"
                aria-label=format!("{} {} of {} over time", chart.test, chart.metric, chart.hostname)>
                {ygrid}{xgrid}
                <line x1=LEFT x2=LEFT y1=TOP y2=bottom class="axis-line"/>
                <line x1=LEFT x2=W - RIGHT y1=bottom y2=bottom class="axis-line"/>
                <text x="14" y=(TOP + bottom) / 2.0 text-anchor="middle" class="axis" transform=format!("rotate(-90 14 {})", (TOP + bottom) / 2.0)>{unit}</text>
                {changes}
                <polyline class="series-line" points=line fill="none"/>
                {dots}
                {markers}
            </svg>
            <figcaption class="legend">
                <span class="legend-item"><span class="swatch key-point"></span>" figure"</span>
                <span class="legend-item"><span class="swatch key-level"></span>" level before / after a change, 95 % interval shaded"</span>
                <span class="legend-item"><span class="swatch key-marker"></span>" facts change on the node"</span>
            </figcaption>
        </figure>
    }
    .into_any()
}
