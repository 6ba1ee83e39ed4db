//! Bus bandwidth against message size as a small hand-written SVG: a log₂ x axis (sizes
//! double from row to row in nccl-tests) and a linear y axis from zero, one line per series.

use leptos::prelude::*;

use crate::ui::size;

#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    /// (message size in bytes, bus bandwidth in GB/s), any order.
    pub points: Vec<(f64, f64)>,
    /// Overlaid runs are dashed so the run being looked at stands out.
    pub dashed: bool,
}

const W: f64 = 720.0;
const H: f64 = 320.0;
const LEFT: f64 = 56.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 12.0;
const BOTTOM: f64 = 40.0;
const COLOURS: [&str; 8] = [
    "#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#0891b2", "#be185d", "#4b5563",
];

/// A y-axis step of 1, 2 or 5 × 10ⁿ giving about five gridlines.
pub fn nice_step(max: f64) -> f64 {
    if max <= 0.0 {
        return 1.0;
    }
    let raw = max / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let n = raw / mag;
    mag * if n <= 1.0 {
        1.0
    } else if n <= 2.0 {
        2.0
    } else if n <= 5.0 {
        5.0
    } else {
        10.0
    }
}

#[component]
pub fn BusBwChart(series: Vec<Series>) -> impl IntoView {
    let pts: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|s| s.points.iter().copied())
        .filter(|(x, _)| *x > 0.0)
        .collect();
    if pts.is_empty() {
        return view! { <p class="empty">"No bus bandwidth figures to chart."</p> }.into_any();
    }
    let (mut xmin, mut xmax, mut ymax) = (f64::MAX, f64::MIN, 0f64);
    for (x, y) in &pts {
        xmin = xmin.min(x.log2());
        xmax = xmax.max(x.log2());
        ymax = ymax.max(*y);
    }
    if xmax - xmin < 1.0 {
        xmax = xmin + 1.0;
    }
    let step = nice_step(ymax);
    let ytop = (ymax / step).ceil().max(1.0) * step;
    let sx = move |x: f64| LEFT + (x.log2() - xmin) / (xmax - xmin) * (W - LEFT - RIGHT);
    let sy = move |y: f64| TOP + (1.0 - y / ytop) * (H - TOP - BOTTOM);
    let ygrid = (0..=((ytop / step).round() as usize))
        .map(|i| {
            let v = i as f64 * step;
            let y = sy(v);
            view! {
                <line x1=LEFT x2=W - RIGHT y1=y y2=y class="grid-line"/>
                <text x=LEFT - 6.0 y=y + 4.0 text-anchor="end" class="axis">{format!("{v}")}</text>
            }
        })
        .collect_view();
    // Size ticks every factor of 4 (or 16 on a long axis) so labels do not collide.
    let every = if xmax - xmin > 20.0 { 4 } else { 2 };
    let xgrid = ((xmin.ceil() as i64)..=(xmax.floor() as i64))
        .filter(|e| e % every == 0)
        .map(|e| {
            let x = sx(2f64.powi(e as i32));
            view! {
                <line x1=x x2=x y1=TOP y2=H - BOTTOM class="grid-line"/>
                <text x=x y=H - BOTTOM + 16.0 text-anchor="middle" class="axis">{size(1i64 << e.clamp(0, 62))}</text>
            }
        })
        .collect_view();
    let lines = series
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut p: Vec<(f64, f64)> = s.points.iter().copied().filter(|(x, _)| *x > 0.0).collect();
            p.sort_by(|a, b| a.0.total_cmp(&b.0));
            let d = p.iter().map(|(x, y)| format!("{:.1},{:.1}", sx(*x), sy(*y))).collect::<Vec<_>>().join(" ");
            let colour = COLOURS[i % COLOURS.len()];
            let dots = p.iter().map(|(x, y)| view! { <circle cx=sx(*x) cy=sy(*y) r="2.5" fill=colour><title>{format!("{}: {} → {y:.2} GB/s", s.name, size(*x as i64))}</title></circle> }).collect_view();
            view! {
                <polyline points=d fill="none" stroke=colour stroke-width="2" stroke-dasharray=if s.dashed { "6 4" } else { "" } class="series"/>
                {dots}
            }
        })
        .collect_view();
    let legend = series
        .iter()
        .enumerate()
        .map(|(i, s)| view! { <span class="legend-item"><span class="swatch" style=format!("background:{}", COLOURS[i % COLOURS.len()])></span>{format!(" {}{}", s.name, if s.dashed { " (overlaid)" } else { "" })}</span> })
        .collect_view();
    view! {
        <figure class="chart">
            <svg id="busbw-chart" viewBox=format!("0 0 {W} {H}") width="100%" role="img" aria-label="bus bandwidth by message size">
                {ygrid}{xgrid}
                <line x1=LEFT x2=LEFT y1=TOP y2=H - BOTTOM class="axis-line"/>
                <line x1=LEFT x2=W - RIGHT y1=H - BOTTOM y2=H - BOTTOM class="axis-line"/>
                <text x=(LEFT + W - RIGHT) / 2.0 y=H - 4.0 text-anchor="middle" class="axis">"message size (log scale)"</text>
                <text x="12" y=(TOP + H - BOTTOM) / 2.0 text-anchor="middle" class="axis" transform=format!("rotate(-90 12 {})", (TOP + H - BOTTOM) / 2.0)>"busbw GB/s"</text>
                {lines}
            </svg>
            <figcaption class="legend">{legend}</figcaption>
        </figure>
    }
    .into_any()
}
