//! Plugins: what is installed, which version runs, and the admin actions (upload, enable,
//! disable, roll back to an older version) plus the operator's dry run.

use heddle_types::auth::Role;
use heddle_types::plugins::{DryRunReport, DryRunRequest, Plugin, PluginEnable, PluginVersion};
use leptos::prelude::*;

use super::plugin_dry_run::report_view;
use super::plugin_upload::Upload;
use crate::api::{self, ApiError, Load, seg};
use crate::session::use_session;
use crate::ui::{Outcome, ago, error_line, loaded, outcome_line};

#[component]
pub fn Plugins() -> impl IntoView {
    let session = use_session();
    let (plugins, reload) = api::load(|| api::get::<Vec<Plugin>>("/plugins"));
    let list = move |ps: Vec<Plugin>| {
        if ps.is_empty() {
            return view! { <p class="empty" id="plugins-empty">"No plugins yet. Upload a component built with the plugin SDK."</p> }.into_any();
        }
        ps.into_iter()
            .map(|p| view! { <PluginCard plugin=p reload=reload/> })
            .collect_view()
            .into_any()
    };
    view! {
        <section>
            <h1>"Plugins"</h1>
            {move || session.can(Role::Admin).then(|| view! { <Upload on_done=reload/> })}
            {move || (!session.can(Role::Admin)).then(|| view! { <p class="muted">"Only admins upload, enable or disable plugins."</p> })}
            {loaded(plugins, "plugins", list)}
        </section>
    }
}

#[component]
fn PluginCard(plugin: Plugin, reload: impl Fn() + Copy + Send + Sync + 'static) -> impl IntoView {
    let session = use_session();
    let name = plugin.name.clone();
    let (versions, reload_versions) = {
        let n = seg(&name);
        api::load(move || {
            let n = n.clone();
            async move { api::get::<Vec<PluginVersion>>(&format!("/plugins/{n}/versions")).await }
        })
    };
    let action = RwSignal::new(Outcome::Idle);
    let dry = RwSignal::new(None::<Load<DryRunReport>>);
    let enabled = plugin.enabled;
    let active = plugin.active_version.clone();
    let act = {
        let name = name.clone();
        move |path: String, body: Option<String>| {
            let name = name.clone();
            action.set(Outcome::Busy);
            leptos::task::spawn_local(async move {
                let r: Result<Plugin, ApiError> = match &body {
                    Some(v) => {
                        api::post(
                            &format!("/plugins/{}/{path}", seg(&name)),
                            &PluginEnable {
                                version: Some(v.clone()),
                            },
                        )
                        .await
                    }
                    None => {
                        api::post(
                            &format!("/plugins/{}/{path}", seg(&name)),
                            &serde_json::json!({}),
                        )
                        .await
                    }
                };
                action.set(match r {
                    Ok(p) if p.enabled => Outcome::Done(format!(
                        "{} {} is enabled.",
                        p.name,
                        p.active_version.unwrap_or_default()
                    )),
                    Ok(p) => Outcome::Done(format!("{} is disabled.", p.name)),
                    Err(e) => Outcome::Failed(e),
                });
                reload();
                reload_versions();
            });
        }
    };
    let dry_run = {
        let name = name.clone();
        move |version: String| {
            let name = name.clone();
            dry.set(Some(Load::Loading));
            leptos::task::spawn_local(async move {
                let path = format!("/plugins/{}/versions/{}/dry-run", seg(&name), seg(&version));
                let r = api::post::<_, DryRunReport>(&path, &DryRunRequest::default()).await;
                dry.set(Some(match r {
                    Ok(r) => Load::Ready(r),
                    Err(e) => Load::Failed(e),
                }));
            });
        }
    };
    let disable = {
        let act = act.clone();
        move |_| act("disable".into(), None)
    };
    let table = move |vs: Vec<PluginVersion>| {
        let act = act.clone();
        let dry_run = dry_run.clone();
        let rows = vs
            .into_iter()
            .map(|v| {
                let is_active = active.as_deref() == Some(v.version.as_str());
                let (ver, ver2) = (v.version.clone(), v.version.clone());
                let act = act.clone();
                let dry_run = dry_run.clone();
                let enable_label = if is_active { "Enable" } else if active.is_some() { "Activate (roll back/forward)" } else { "Enable" };
                view! { <tr class=if is_active { "active" } else { "" }>
                    <td class="mono">{v.version.clone()}{is_active.then_some(" (active)")}</td>
                    <td>{v.description.clone().unwrap_or_default()}</td>
                    <td class="mono small">{format!("{} · {} KiB · {}", &v.sha256[..12], v.size_bytes / 1024, v.contract.clone().unwrap_or_default())}</td>
                    <td>{v.uploaded_by.clone()}" · "{ago(Some(v.created_at))}</td>
                    <td class="actions">
                        <Show when=move || session.can(Role::Operator)>
                            <button class="dry-run-btn" on:click={ let d = dry_run.clone(); let ver = ver.clone(); move |_| d(ver.clone()) }>"Dry run"</button>
                        </Show>
                        <Show when=move || session.can(Role::Admin) && !(is_active && enabled)>
                            <button class="enable-btn" on:click={ let a = act.clone(); let ver = ver2.clone(); move |_| a("enable".into(), Some(ver.clone())) }>{enable_label}</button>
                        </Show>
                    </td>
                </tr> }
            })
            .collect_view();
        view! { <table class="grid versions"><thead><tr><th>"Version"</th><th>"Description"</th><th>"Artifact"</th><th>"Uploaded"</th><th></th></tr></thead>
        <tbody>{rows}</tbody></table> }
    };
    view! {
        <article class="plugin" data-plugin=name.clone()>
            <div class="title-row">
                <h2>{name.clone()}</h2>
                {if enabled {
                    view! { <span class="badge good">{format!("enabled · {}", plugin.active_version.clone().unwrap_or_default())}</span> }.into_any()
                } else {
                    view! { <span class="badge warn">"disabled"</span> }.into_any()
                }}
                <Show when=move || enabled && session.can(Role::Admin)>
                    <button class="disable-btn" on:click=disable.clone()>"Disable"</button>
                </Show>
            </div>
            {loaded(versions, "versions", table)}
            {outcome_line(action)}
            {move || dry.get().map(|d| match d {
                Load::Loading => view! { <p class="loading">"Running the plugin on every node's facts…"</p> }.into_any(),
                Load::Failed(e) => error_line("Dry run failed", &e).into_any(),
                Load::Ready(r) => report_view(r).into_any(),
            })}
        </article>
    }
}
