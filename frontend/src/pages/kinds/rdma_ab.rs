//! An `rdma_ab` result on the run's page: the RDMA leg and the socket leg as two lines of
//! the busbw chart, both tables side by side and the ratio per size band (the verdict
//! reads the large band; docs/health.md, "RDMA against sockets").

use heddle_types::jobs::JobResult;
use heddle_types::kinds::rdma_ab::{AbComparison, KIND, Leg};
use heddle_types::sweeps::Band;
use leptos::prelude::*;

use crate::chart::Series;
use crate::ui::{opt_num, size};

fn is_ab(r: &JobResult) -> bool {
    r.summary.get("kind").and_then(|k| k.as_str()) == Some(KIND)
}

/// The two lines of an `rdma_ab` result (`None` for other kinds).
pub fn series(label: &str, r: &JobResult, dashed: bool) -> Option<Vec<Series>> {
    if !is_ab(r) {
        return None;
    }
    let c = AbComparison::from_rows(&r.rows);
    let line = |leg: Leg| Series {
        name: format!("{label} {} {leg} leg", r.hostname),
        points: c
            .points
            .iter()
            .map(|p| {
                let y = match leg {
                    Leg::Rdma => p.rdma_busbw_gbs,
                    Leg::Socket => p.socket_busbw_gbs,
                };
                (p.size_bytes as f64, y)
            })
            .collect(),
        dashed,
    };
    Some(vec![line(Leg::Rdma), line(Leg::Socket)])
}

fn ratio(r: Option<f64>) -> String {
    r.map(|x| format!("{x:.2}×")).unwrap_or_else(|| "—".into())
}

/// Both legs per size and the ratio per band (nothing for other kinds).
pub fn tables(r: &JobResult) -> Option<AnyView> {
    if !is_ab(r) {
        return None;
    }
    let c = AbComparison::from_rows(&r.rows);
    let points = c
        .points
        .iter()
        .map(|p| {
            view! { <tr><td class="num">{size(p.size_bytes)}</td><td class="num">{opt_num(Some(p.rdma_busbw_gbs), 2)}</td>
                <td class="num">{opt_num(Some(p.socket_busbw_gbs), 2)}</td><td class="num">{ratio(p.ratio)}</td></tr> }
        })
        .collect_view();
    let bands = c
        .bands
        .iter()
        .map(|b| {
            view! { <tr><td>{b.band.as_str()}</td><td class="num">{b.sizes}</td><td class="num">{opt_num(Some(b.rdma_busbw_gbs), 2)}</td>
                <td class="num">{opt_num(Some(b.socket_busbw_gbs), 2)}</td><td class="num">{ratio(b.ratio)}</td></tr> }
        })
        .collect_view();
    let note = format!(
        "RDMA leg: the node's environment; socket leg: NCCL_IB_DISABLE=1. Bands: small < {} KiB, large ≥ {} MiB; the verdict reads the large band.",
        Band::MEDIUM_FROM >> 10,
        Band::LARGE_FROM >> 20
    );
    Some(
        view! {
            <div class="rdma-ab">
                <p class="muted">{note}</p>
                <table class="grid" id="rdma-ab-bands"><thead><tr><th>"band"</th><th>"sizes"</th><th>"RDMA busbw (GB/s)"</th>
                    <th>"socket busbw (GB/s)"</th><th>"RDMA / socket"</th></tr></thead><tbody>{bands}</tbody></table>
                <table class="grid" id="rdma-ab-sizes"><thead><tr><th>"size"</th><th>"RDMA busbw (GB/s)"</th>
                    <th>"socket busbw (GB/s)"</th><th>"RDMA / socket"</th></tr></thead><tbody>{points}</tbody></table>
            </div>
        }
        .into_any(),
    )
}
