//! P2P matrices: the `p2p` runs, and each node's GPU×GPU copy bandwidth of one run as a
//! heatmap with the bad GPU or GPU pair named.

use heddle_types::investigations::P2pMatrix;
use heddle_types::jobs::{JobResult, Outcome, Run};
use leptos::prelude::*;
use leptos_router::hooks::use_params_map;
use uuid::Uuid;

use super::sweep::kind_runs_table;
use crate::api::{self, ApiError};
use crate::matrix::{AnalysisView, MatrixHeatmap};
use crate::ui::{error_line, loaded};

#[component]
pub fn P2pRuns() -> impl IntoView {
    let (runs, _) = api::load(|| api::get::<Vec<Run>>("/runs?kind=p2p&limit=50"));
    view! {
        <section>
            <h1>"P2P matrices"</h1>
            <p class="muted">"GPU↔GPU copy bandwidth within a node, from "<code>"p2p"</code>" runs."</p>
            {loaded(runs, "p2p runs", |r| kind_runs_table(r, "/p2p", "p2p-table"))}
        </section>
    }
}

type Matrices = Vec<(String, Result<P2pMatrix, ApiError>)>;

async fn matrices(id: Uuid) -> Result<Matrices, ApiError> {
    let results = api::get::<Vec<JobResult>>(&format!("/runs/{id}/results")).await?;
    let mut out = Vec::new();
    for r in results
        .into_iter()
        .filter(|r| r.outcome == Outcome::Succeeded)
    {
        let m = api::get::<P2pMatrix>(&format!("/results/{}/p2p-matrix", r.id)).await;
        out.push((r.hostname, m));
    }
    Ok(out)
}

#[component]
pub fn P2pPage() -> impl IntoView {
    let params = use_params_map();
    move || {
        let id = params.with(|p| p.get("id").unwrap_or_default());
        match id.parse::<Uuid>() {
            Ok(id) => {
                let (ms, _) = api::load(move || matrices(id));
                view! { <section>
                    <div class="title-row"><h1>"P2P matrix"</h1><a href=format!("/runs/{id}")>"the run"</a></div>
                    {loaded(ms, "the matrices", render)}
                </section> }
                .into_any()
            }
            Err(_) => {
                view! { <p class="error">{format!("{id:?} is not a run id.")}</p> }.into_any()
            }
        }
    }
}

fn render(ms: Matrices) -> impl IntoView {
    if ms.is_empty() {
        return view! { <p class="empty">"No succeeded result yet."</p> }.into_any();
    }
    ms.into_iter()
        .map(|(host, m)| match m {
            Ok(m) => view! {
                <h2>{host}</h2>
                <MatrixHeatmap matrix=m.matrix.clone() analysis=m.analysis.clone() paths=m.paths.clone() id="gpu-matrix"/>
                <AnalysisView analysis=m.analysis.clone()/>
            }
            .into_any(),
            Err(e) => view! { <h2>{host.clone()}</h2>{error_line("No matrix", &e)} }.into_any(),
        })
        .collect_view()
        .into_any()
}
