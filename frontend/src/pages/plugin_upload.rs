//! Uploading a plugin version: a file input or a file dropped on the zone, sent as the raw
//! component bytes. The server validates the component before storing anything, so its
//! refusal (wrong world, forbidden import, too large) is shown as it wrote it.

use heddle_types::plugins::PluginVersion;
use leptos::prelude::*;

use crate::api::{self, seg};
use crate::ui::{Outcome, outcome_line};

#[component]
pub fn Upload(on_done: impl Fn() + Copy + Send + Sync + 'static) -> impl IntoView {
    let name = RwSignal::new(String::new());
    let version = RwSignal::new(String::new());
    let file = RwSignal::new_local(None::<web_sys::File>);
    let over = RwSignal::new(false);
    let outcome = RwSignal::new(Outcome::Idle);
    let take = move |f: web_sys::File| {
        if name.get_untracked().is_empty() {
            let stem = f.name().trim_end_matches(".wasm").to_string();
            name.set(stem);
        }
        file.set(Some(f));
    };
    let on_pick = move |ev: leptos::ev::Event| {
        let input: web_sys::HtmlInputElement = event_target(&ev);
        if let Some(f) = input.files().and_then(|l| l.get(0)) {
            take(f);
        }
    };
    let on_drop = move |ev: leptos::ev::DragEvent| {
        ev.prevent_default();
        over.set(false);
        if let Some(f) = ev
            .data_transfer()
            .and_then(|d| d.files())
            .and_then(|l| l.get(0))
        {
            take(f);
        }
    };
    let submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let (n, v) = (
            name.get_untracked().trim().to_string(),
            version.get_untracked().trim().to_string(),
        );
        let Some(f) = file.get_untracked() else {
            return outcome.set(Outcome::Done("Choose or drop a .wasm file first.".into()));
        };
        if n.is_empty() || v.is_empty() {
            return outcome.set(Outcome::Done(
                "A plugin name and a version are needed.".into(),
            ));
        }
        outcome.set(Outcome::Busy);
        leptos::task::spawn_local(async move {
            let r = api::post_file::<PluginVersion>(
                &format!("/plugins/{}/versions/{}", seg(&n), seg(&v)),
                f,
            )
            .await;
            outcome.set(match r {
                Ok(pv) => Outcome::Done(format!(
                    "Uploaded {} {} ({} bytes, sha256 {}…). Dry-run it before enabling.",
                    pv.plugin,
                    pv.version,
                    pv.size_bytes,
                    &pv.sha256[..12]
                )),
                Err(e) => Outcome::Failed(e),
            });
            on_done();
        });
    };
    let file_line = move || match file.get() {
        Some(f) => format!("{} ({:.0} KiB)", f.name(), f.size() / 1024.0),
        None => "Drop a .wasm component here, or choose one.".into(),
    };
    view! {
        <form class="upload" id="upload" on:submit=submit>
            <h2>"Upload a version"</h2>
            <div class=move || if over.get() { "dropzone over" } else { "dropzone" } id="dropzone"
                on:dragover=move |ev: leptos::ev::DragEvent| { ev.prevent_default(); over.set(true); }
                on:dragleave=move |_| over.set(false)
                on:drop=on_drop>
                <p>{file_line}</p>
                <input type="file" id="plugin-file" accept=".wasm,application/wasm" on:change=on_pick/>
            </div>
            <div class="form-row">
                <input id="plugin-name" placeholder="name, e.g. runai-roce" prop:value=move || name.get() on:input=move |ev| name.set(event_target_value(&ev))/>
                <input id="plugin-version" placeholder="version, e.g. 0.1.0" prop:value=move || version.get() on:input=move |ev| version.set(event_target_value(&ev))/>
                <button type="submit" id="plugin-upload">"Upload"</button>
            </div>
            {outcome_line(outcome)}
        </form>
    }
}
