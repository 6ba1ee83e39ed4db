//! Agents: enrollment tokens with the exact lines that start an agent, enrollments waiting
//! for approval (a host name that already has a live agent), and the enrolled agents with
//! their state (online, stale or offline by heartbeat age, or revoked). Creating, approving
//! and revoking is for admins: others see the list without the buttons, and the server's
//! refusal where they may not read.

use heddle_types::auth::{
    AgentInfo, EnrollmentTokenCreate, EnrollmentTokenCreated, EnrollmentTokenInfo,
    PendingEnrollment, Role,
};
use leptos::prelude::*;

use crate::api::{self, ApiError};
use crate::session::use_session;
use crate::ui::{Outcome, ago, liveness_badge, loaded, outcome_line, when};

/// The two ways to start an agent with a fresh enrollment token. The server URL is the one
/// this page was loaded from, which is what agents on the same network reach too.
pub fn start_lines(server: &str, token: &str) -> (String, String) {
    let docker = format!(
        "docker run -d --name heddle-agent --restart unless-stopped --network host --gpus all \\\n  \
         --device /dev/infiniband -v /sys:/sys:ro -v heddle-agent:/var/lib/heddle-agent \\\n  \
         heddle-agent:latest run --server {server} --enroll-token {token} --state-dir /var/lib/heddle-agent"
    );
    let plain = format!(
        "heddle-agent run --server {server} --enroll-token {token} --state-dir /var/lib/heddle-agent"
    );
    (docker, plain)
}

#[component]
pub fn Agents() -> impl IntoView {
    let session = use_session();
    let admin = move || session.can(Role::Admin);
    let (agents, reload_agents) = api::load(|| api::get::<Vec<AgentInfo>>("/agents"));
    let (tokens, reload_tokens) =
        api::load(|| api::get::<Vec<EnrollmentTokenInfo>>("/enrollment-tokens"));
    let (pending, reload_pending) = api::load(move || async move {
        // Only admins may list them; for others the section stays empty.
        if session.can(Role::Admin) {
            api::get::<Vec<PendingEnrollment>>("/agents/pending").await
        } else {
            Ok(Vec::new())
        }
    });
    let label = RwSignal::new(String::new());
    let uses = RwSignal::new(String::from("1"));
    let hours = RwSignal::new(String::from("1"));
    let node = RwSignal::new(String::new());
    let created = RwSignal::new(None::<Result<EnrollmentTokenCreated, ApiError>>);
    let revoke = RwSignal::new(Outcome::Idle);
    let create = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let body = EnrollmentTokenCreate {
            name: Some(label.get_untracked().trim().to_string()).filter(|s| !s.is_empty()),
            max_uses: uses.get_untracked().trim().parse().ok(),
            expires_in_hours: hours.get_untracked().trim().parse().ok(),
            node: Some(node.get_untracked().trim().to_string()).filter(|s| !s.is_empty()),
        };
        leptos::task::spawn_local(async move {
            created.set(Some(api::post("/enrollment-tokens", &body).await));
            reload_tokens();
        });
    };
    let revoke_at = move |path: String, what: String| {
        revoke.set(Outcome::Busy);
        leptos::task::spawn_local(async move {
            revoke.set(match api::delete(&path).await {
                Ok(()) => Outcome::Done(format!("Revoked {what}.")),
                Err(e) => Outcome::Failed(e),
            });
            reload_agents();
            reload_tokens();
        });
    };
    let decide = move |path: String, what: String| {
        revoke.set(Outcome::Busy);
        leptos::task::spawn_local(async move {
            revoke.set(
                match api::post::<_, PendingEnrollment>(&path, &serde_json::json!({})).await {
                    Ok(_) => Outcome::Done(what),
                    Err(e) => Outcome::Failed(e),
                },
            );
            reload_pending();
            reload_agents();
        });
    };
    let pending_rows = move |list: Vec<PendingEnrollment>| {
        if list.is_empty() {
            return ().into_any();
        }
        let rows = list
            .into_iter()
            .map(|p| {
                let approve = format!("/agents/pending/{}/approve", p.id);
                let reject = format!("/agents/pending/{}/reject", p.id);
                let host = p.hostname.clone();
                let approved = format!("Approved the enrollment of {host}: it replaces the live agent when it asks next.");
                let rejected = format!("Rejected the enrollment of {host}; its live agent stays.");
                view! { <tr data-host=p.hostname.clone()>
                    <td>{p.hostname.clone()}</td><td>{p.state.clone()}</td>
                    <td class="muted">{ago(Some(p.requested_at))}</td>
                    <td class="muted">{ago(p.live_agent_last_heartbeat_at)}</td>
                    <td>{(p.state == "pending").then(|| view! {
                        <button class="approve-enrollment" on:click=move |_| decide(approve.clone(), approved.clone())>"Approve"</button>
                        " "
                        <button class="reject-enrollment" on:click=move |_| decide(reject.clone(), rejected.clone())>"Reject"</button>
                    })}</td>
                </tr> }
            })
            .collect_view();
        view! {
            <h2>"Waiting for approval"</h2>
            <p class="muted">"Each asks to enroll under the name of a node whose agent is still live. Approve only a host you rebuilt: it replaces that agent."</p>
            <table class="grid" id="pending-table"><thead><tr><th>"Host"</th><th>"State"</th><th>"Asked"</th><th>"Live agent's heartbeat"</th><th></th></tr></thead>
            <tbody>{rows}</tbody></table>
        }.into_any()
    };
    let origin = window().location().origin().unwrap_or_default();
    let created_view = move || {
        created.get().map(|r| match r {
            Ok(t) => {
                let (docker, plain) = start_lines(&origin, &t.token);
                view! {
                    <div class="created" id="enroll-created">
                        <p class="ok">"Token created. It is shown once: start agents with one of these lines."</p>
                        <h3>"Docker"</h3><pre id="docker-line">{docker}</pre>
                        <h3>"Binary"</h3><pre id="agent-line">{plain}</pre>
                        <p class="muted">{format!("{} uses, expires {}", t.info.max_uses, when(Some(t.info.expires_at)))}</p>
                    </div>
                }
                .into_any()
            }
            Err(e) => crate::ui::error_line("Could not create the token", &e).into_any(),
        })
    };
    let agent_rows = move |list: Vec<AgentInfo>| {
        if list.is_empty() {
            return view! { <p class="empty" id="agents-empty">"No agents enrolled yet."</p> }
                .into_any();
        }
        let rows = list
            .into_iter()
            .map(|a| {
                let path = format!("/agents/{}", a.id);
                let what = format!("the agent on {}", a.hostname);
                let revoked = a.revoked_at.is_some();
                view! { <tr data-host=a.hostname.clone()>
                    <td><a href=format!("/nodes/{}", a.node_id)>{a.hostname.clone()}</a></td>
                    <td>{if revoked { view! { <span class="badge bad">"revoked"</span> }.into_any() } else { liveness_badge(&a.state).into_any() }}</td>
                    <td>{a.version.clone().unwrap_or_default()}</td><td class="muted">{ago(a.last_heartbeat_at)}</td>
                    <td class="muted">{when(Some(a.created_at))}</td>
                    <td>{(!revoked && admin()).then(|| view! { <button class="revoke-agent" on:click=move |_| revoke_at(path.clone(), what.clone())>"Revoke"</button> })}</td>
                </tr> }
            })
            .collect_view();
        view! { <table class="grid" id="agents-table"><thead><tr><th>"Host"</th><th>"State"</th><th>"Version"</th><th>"Heartbeat"</th><th>"Enrolled"</th><th></th></tr></thead>
            <tbody>{rows}</tbody></table> }.into_any()
    };
    let token_rows = move |list: Vec<EnrollmentTokenInfo>| {
        if list.is_empty() {
            return view! { <p class="empty">"No enrollment tokens."</p> }.into_any();
        }
        let rows = list
            .into_iter()
            .map(|t| {
                let path = format!("/enrollment-tokens/{}", t.id);
                let name = t.name.clone().unwrap_or_else(|| t.id.to_string()[..8].to_string());
                let what = format!("enrollment token {name}");
                let live = t.revoked_at.is_none();
                view! { <tr><td>{name}</td><td>{format!("{}/{}", t.uses, t.max_uses)}</td><td>{when(Some(t.expires_at))}</td>
                    <td>{if live { "" } else { "revoked" }}</td>
                    <td>{(live && admin()).then(|| view! { <button on:click=move |_| revoke_at(path.clone(), what.clone())>"Revoke"</button> })}</td></tr> }
            })
            .collect_view();
        view! { <table class="grid"><thead><tr><th>"Token"</th><th>"Uses"</th><th>"Expires"</th><th></th><th></th></tr></thead><tbody>{rows}</tbody></table> }.into_any()
    };
    view! {
        <section>
            <h1>"Agents"</h1>
            <Show when=admin fallback=|| view! { <p class="muted">"Only admins enroll or revoke agents."</p> }>
            <form class="launch" id="enroll-form" on:submit=create>
                <h2>"Enroll agents"</h2>
                <div class="form-row">
                    <input id="enroll-name" placeholder="label, e.g. rack-12" prop:value=move || label.get() on:input=move |ev| label.set(event_target_value(&ev))/>
                    <label>"Uses "<input class="short" prop:value=move || uses.get() on:input=move |ev| uses.set(event_target_value(&ev))/></label>
                    <label>"Hours "<input class="short" prop:value=move || hours.get() on:input=move |ev| hours.set(event_target_value(&ev))/></label>
                    <input id="enroll-node" placeholder="only for host (re-enroll)" prop:value=move || node.get() on:input=move |ev| node.set(event_target_value(&ev))/>
                    <button type="submit" id="enroll-create">"Create enrollment token"</button>
                </div>
            </form>
            </Show>
            {created_view}
            {outcome_line(revoke)}
            {loaded(pending, "pending enrollments", pending_rows)}
            <h2>"Enrolled agents"</h2>
            {loaded(agents, "agents", agent_rows)}
            <h2>"Enrollment tokens"</h2>
            {loaded(tokens, "enrollment tokens", token_rows)}
        </section>
    }
}
