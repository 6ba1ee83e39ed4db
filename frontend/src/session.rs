//! Who is signed in. The token typed into the sign-in form goes once to
//! `POST /api/v1/session`, which checks it and keeps it in an HttpOnly, SameSite=Strict
//! cookie: no script on the page (an injected one included) can read it, and a reload keeps
//! the session. `GET /api/v1/whoami` tells the name and role that decide which actions are
//! shown. The server checks every call anyway; hiding buttons only spares a person a
//! refusal.

use heddle_types::auth::{Role, SessionCreate, WhoAmI};
use leptos::prelude::*;

use crate::api::{self, ApiError};

#[derive(Clone, Copy)]
pub struct Session {
    pub who: RwSignal<Option<WhoAmI>>,
    /// Set while the session cookie (if any) is being checked at start-up.
    pub checking: RwSignal<bool>,
}

impl Session {
    pub fn provide() -> Session {
        let session = Session {
            who: RwSignal::new(None),
            checking: RwSignal::new(true),
        };
        provide_context(session);
        leptos::task::spawn_local(async move {
            // No cookie, or one the server no longer accepts: the sign-in form.
            if let Ok(w) = api::get::<WhoAmI>("/whoami").await {
                session.who.set(Some(w));
            }
            session.checking.set(false);
        });
        session
    }

    /// Whether the signed-in role may do what `needed` may.
    pub fn can(&self, needed: Role) -> bool {
        self.who
            .with(|w| w.as_ref().is_some_and(|w| w.role >= needed))
    }

    /// Clears the cookie first, so a sign-in right after cannot race the sign-out.
    pub fn sign_out(&self) {
        let who = self.who;
        leptos::task::spawn_local(async move {
            let _ = api::delete("/session").await;
            who.set(None);
        });
    }
}

pub fn use_session() -> Session {
    expect_context::<Session>()
}

/// Token form; on success the server holds the token in the session cookie and the page
/// behind it renders.
#[component]
pub fn SignIn() -> impl IntoView {
    let session = use_session();
    let token = RwSignal::new(String::new());
    let error = RwSignal::new(None::<ApiError>);
    let busy = RwSignal::new(false);
    let submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let t = token.get_untracked().trim().to_string();
        if t.is_empty() {
            return;
        }
        busy.set(true);
        token.set(String::new());
        leptos::task::spawn_local(async move {
            match api::post::<_, WhoAmI>("/session", &SessionCreate { token: t }).await {
                Ok(w) => {
                    error.set(None);
                    session.who.set(Some(w));
                }
                Err(e) => error.set(Some(e)),
            }
            busy.set(false);
        });
    };
    view! {
        <section class="signin">
            <h1>"Heddle"</h1>
            <p class="muted">"Sign in with an API token (" <code>"hdl_…"</code> "). "
                "An admin creates one with " <code>"heddle tokens create --name you --role viewer"</code> "."</p>
            <form on:submit=submit>
                <label for="token">"API token"</label>
                <input id="token" name="token" type="password" autocomplete="off" placeholder="hdl_…"
                    prop:value=move || token.get() on:input=move |ev| token.set(event_target_value(&ev)) />
                <button type="submit" disabled=move || busy.get()>
                    {move || if busy.get() { "Checking…" } else { "Sign in" }}
                </button>
            </form>
            {move || error.get().map(|e| view! { <p class="error" role="alert">{e.describe()}</p> })}
        </section>
    }
}
