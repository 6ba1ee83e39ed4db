//! The Heddle dashboard: a client-side Leptos app served by `heddle-server` from
//! `HEDDLE_DASHBOARD_DIR`. It only speaks the public `/api/v1` with the person's own token,
//! so it can do nothing the CLI could not.

mod api;
mod chart;
mod matrix;
mod pages;
mod series_chart;
mod session;
mod topology;
mod ui;

use heddle_types::auth::Role;
use leptos::prelude::*;
use leptos_router::components::{A, Route, Router, Routes};
use leptos_router::path;

use session::{Session, SignIn, use_session};

fn main() {
    console_error_panic_hook::set_once();
    mount_to_body(App);
}

#[component]
fn App() -> impl IntoView {
    let session = Session::provide();
    view! {
        <Router>
            {move || {
                if session.checking.get() {
                    view! { <p class="loading page">"Checking your token…"</p> }.into_any()
                } else if session.who.with(Option::is_none) {
                    view! { <SignIn/> }.into_any()
                } else {
                    view! { <Shell/> }.into_any()
                }
            }}
        </Router>
    }
}

#[component]
fn Shell() -> impl IntoView {
    let session = use_session();
    let who = move || {
        session
            .who
            .get()
            .map(|w| format!("{} ({})", w.name, w.role))
            .unwrap_or_default()
    };
    view! {
        <header class="top">
            <A href="/" attr:class="brand">"Heddle"</A>
            <nav>
                <A href="/">"Fleet"</A>
                <A href="/runs">"Runs"</A>
                <A href="/investigations">"Investigations"</A>
                <A href="/fabric">"Fabric"</A>
                <A href="/p2p">"P2P"</A>
                <A href="/sweeps">"Sweeps"</A>
                <A href="/health">"Health"</A>
                <A href="/regressions">"Regressions"</A>
                <A href="/plugins">"Plugins"</A>
                <Show when=move || session.can(Role::Admin)>
                    <A href="/agents">"Agents"</A>
                </Show>
            </nav>
            <span class="who" id="who">{who}</span>
            <button class="link" on:click=move |_| session.sign_out()>"Sign out"</button>
        </header>
        <main>
            <Routes fallback=|| view! { <p class="empty">"No such page. " <a href="/">"Back to the fleet"</a></p> }>
                <Route path=path!("/") view=pages::fleet::Fleet/>
                <Route path=path!("/nodes/:id") view=pages::node::NodePage/>
                <Route path=path!("/runs") view=pages::runs::Runs/>
                <Route path=path!("/runs/:id") view=pages::run::RunPage/>
                <Route path=path!("/workloads/:id") view=pages::workloads::WorkloadPage/>
                // A workload's page at its first address, for links made before the rename.
                <Route path=path!("/jobs/:id") view=pages::workloads::WorkloadPage/>
                <Route path=path!("/investigations") view=pages::investigations::Investigations/>
                <Route path=path!("/investigations/:id") view=pages::investigations::InvestigationPage/>
                <Route path=path!("/fabric") view=pages::fabric::FabricPage/>
                <Route path=path!("/fabric/investigations/:id") view=pages::fabric::FabricInvestigationPage/>
                <Route path=path!("/p2p") view=pages::kinds::p2p::P2pRuns/>
                <Route path=path!("/p2p/:id") view=pages::kinds::p2p::P2pPage/>
                <Route path=path!("/sweeps") view=pages::kinds::sweep::Sweeps/>
                <Route path=path!("/sweeps/:id") view=pages::kinds::sweep::SweepPage/>
                <Route path=path!("/health") view=pages::health::Health/>
                <Route path=path!("/regressions") view=pages::regressions::Regressions/>
                <Route path=path!("/regressions/series") view=pages::regressions::SeriesPage/>
                <Route path=path!("/plugins") view=pages::plugins::Plugins/>
                <Route path=path!("/agents") view=pages::agents::Agents/>
            </Routes>
        </main>
    }
}
