//! A measured matrix (node×node or GPU×GPU) as a heatmap: each cell coloured by its figure
//! against the matrix's median, the same table look as the topology heatmap, and the
//! culprits an analysis names.

use heddle_types::investigations::{Analysis, Conclusion, Matrix};
use leptos::prelude::*;

/// CSS class of a figure against the median: the lower, the redder.
pub fn ratio_class(value: f64, median: Option<f64>, threshold: f64) -> &'static str {
    match median.filter(|m| *m > 0.0) {
        None => "m-none",
        Some(m) => {
            let r = value / m;
            if r < threshold {
                "m-bad"
            } else if r < (1.0 + threshold) / 2.0 {
                "m-warn"
            } else {
                "m-good"
            }
        }
    }
}

#[component]
pub fn MatrixHeatmap(
    matrix: Matrix,
    analysis: Analysis,
    /// The copy path of each cell (GPU matrices), shown under the figure.
    #[prop(optional)]
    paths: Option<Vec<Vec<Option<String>>>>,
    id: &'static str,
) -> impl IntoView {
    if matrix.labels.is_empty() {
        return view! { <p class="empty">"Nothing measured yet."</p> }.into_any();
    }
    let header = matrix
        .labels
        .iter()
        .map(|l| view! { <th class="mono">{l.clone()}</th> })
        .collect_view();
    let rows = matrix
        .labels
        .iter()
        .enumerate()
        .map(|(i, from)| {
            let cells = matrix
                .labels
                .iter()
                .enumerate()
                .map(|(j, to)| {
                    let v = matrix
                        .values
                        .get(i)
                        .and_then(|r| r.get(j))
                        .copied()
                        .flatten();
                    let path = paths
                        .as_ref()
                        .and_then(|p| p.get(i).and_then(|r| r.get(j)).cloned().flatten());
                    match v {
                        Some(v) => {
                            let class = format!(
                                "cell {}",
                                ratio_class(v, analysis.median, analysis.threshold)
                            );
                            let title = format!("{from} → {to}: {v:.2} {}", matrix.unit);
                            view! { <td class=class title=title>{format!("{v:.1}")}
                            {path.map(|p| view! { <div class="small">{p}</div> })}</td> }
                            .into_any()
                        }
                        None => view! { <td class="cell m-none">"—"</td> }.into_any(),
                    }
                })
                .collect_view();
            view! { <tr><th class="mono">{from.clone()}</th>{cells}</tr> }
        })
        .collect_view();
    view! {
        <div class="heatmap-wrap">
            <table class="heatmap" id=id>
                <thead><tr><th>{format!("{} ({})", matrix.metric, matrix.unit)}</th>{header}</tr></thead>
                <tbody>{rows}</tbody>
            </table>
            <p class="legend">
                <span class="legend-item"><span class="swatch m-good">"  "</span>" near the median"</span>
                <span class="legend-item"><span class="swatch m-warn">"  "</span>" below it"</span>
                <span class="legend-item"><span class="swatch m-bad">"  "</span>{format!(" under {:.0}% of it", analysis.threshold * 100.0)}</span>
            </p>
        </div>
    }
    .into_any()
}

pub fn conclusion_badge(c: Conclusion) -> impl IntoView + use<> {
    let class = match c {
        Conclusion::Culprit => "badge bad",
        Conclusion::NoCulprit => "badge good",
        Conclusion::Pending => "badge run",
        Conclusion::Inconclusive => "badge warn",
    };
    view! { <span class=class>{c.as_str().replace('_', " ")}</span> }
}

/// The analysis in words and its culprits with their evidence.
#[component]
pub fn AnalysisView(analysis: Analysis) -> impl IntoView {
    let culprits = analysis
        .culprits
        .iter()
        .map(|c| {
            view! { <tr>
                <td>{format!("{:?}", c.kind).to_lowercase()}</td>
                <td class="mono">{c.members.join(" ↔ ")}</td>
                <td class="num">{format!("{:.2}", c.figure)}</td>
                <td class="num">{format!("{:.2}", c.median)}</td>
                <td class="num">{format!("{:.0}%", c.ratio * 100.0)}</td>
                <td>{c.explanation.clone()}</td>
            </tr> }
        })
        .collect_view();
    let has = !analysis.culprits.is_empty();
    view! {
        <p id="analysis">{conclusion_badge(analysis.verdict)}" "{analysis.summary.clone()}</p>
        {has.then(|| view! {
            <table class="grid" id="culprits"><thead><tr><th>"Culprit"</th><th>"Who"</th><th>"Figure"</th><th>"Median"</th><th>"Ratio"</th><th>"Why"</th></tr></thead>
            <tbody>{culprits}</tbody></table>
        })}
        {(!analysis.missing.is_empty()).then(|| view! {
            <p class="muted">{format!("Not measured: {}", analysis.missing.iter().map(|[a, b]| format!("{a}↔{b}")).collect::<Vec<_>>().join(", "))}</p>
        })}
    }
}
