//! The one way the dashboard talks to the server: `/api/v1` on the origin it was served
//! from. The page keeps no token: after sign-in the server holds it in an HttpOnly,
//! SameSite=Strict cookie the browser sends with each call (see `session.rs`). Every failure
//! becomes an [`ApiError`] whose message is the server's own `{error, message}` body, so
//! refusals read as the server wrote them.

use gloo_net::http::{Request, Response};
use heddle_types::ErrorBody;
use leptos::prelude::*;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// A failed call: `status` is 0 when the server could not be reached at all.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub code: String,
    pub message: String,
}

impl ApiError {
    fn network(e: impl std::fmt::Display) -> Self {
        ApiError {
            status: 0,
            code: "network".into(),
            message: format!("the server could not be reached: {e}"),
        }
    }

    /// What a person should read: refusals say that the role is the reason.
    pub fn describe(&self) -> String {
        match self.status {
            0 => self.message.clone(),
            401 => format!("Not signed in or the token was refused ({}).", self.message),
            403 => format!(
                "Refused: {} Ask an admin for a token with a higher role.",
                self.message
            ),
            s => format!("{} ({s} {})", self.message, self.code),
        }
    }
}

async fn check(resp: Response) -> Result<Response, ApiError> {
    if resp.ok() {
        return Ok(resp);
    }
    let status = resp.status();
    let text = resp.text().await.unwrap_or_default();
    let (code, message) = match serde_json::from_str::<ErrorBody>(&text) {
        Ok(b) => (b.error, b.message),
        Err(_) => (
            resp.status_text(),
            if text.is_empty() {
                "no details".into()
            } else {
                text
            },
        ),
    };
    Err(ApiError {
        status,
        code,
        message,
    })
}

async fn send(req: Result<Request, gloo_net::Error>) -> Result<Response, ApiError> {
    let req = req.map_err(ApiError::network)?;
    check(req.send().await.map_err(ApiError::network)?).await
}

async fn json<T: DeserializeOwned>(resp: Response) -> Result<T, ApiError> {
    resp.json::<T>().await.map_err(|e| ApiError {
        status: 200,
        code: "decode".into(),
        message: format!("unexpected answer: {e}"),
    })
}

pub async fn get<T: DeserializeOwned>(path: &str) -> Result<T, ApiError> {
    json(send(Request::get(&format!("/api/v1{path}")).build()).await?).await
}

/// One page of a list and the cursor of the next one (`x-next-cursor`), when more follow.
pub async fn get_page<T: DeserializeOwned>(
    path: &str,
) -> Result<(Vec<T>, Option<String>), ApiError> {
    let resp = send(Request::get(&format!("/api/v1{path}")).build()).await?;
    let next = resp.headers().get(heddle_types::NEXT_CURSOR_HEADER);
    Ok((json(resp).await?, next))
}

pub async fn get_text(path: &str) -> Result<String, ApiError> {
    let resp = send(Request::get(&format!("/api/v1{path}")).build()).await?;
    resp.text().await.map_err(ApiError::network)
}

pub async fn post<B: Serialize, T: DeserializeOwned>(path: &str, body: &B) -> Result<T, ApiError> {
    json(send(Request::post(&format!("/api/v1{path}")).json(body)).await?).await
}

pub async fn delete(path: &str) -> Result<(), ApiError> {
    send(Request::delete(&format!("/api/v1{path}")).build())
        .await
        .map(|_| ())
}

/// Sends a file's bytes as the body, unread by the page: the browser streams the `File`.
pub async fn post_file<T: DeserializeOwned>(
    path: &str,
    file: web_sys::File,
) -> Result<T, ApiError> {
    let req = Request::post(&format!("/api/v1{path}"))
        .header("Content-Type", "application/wasm")
        .body(file);
    json(send(req).await?).await
}

/// Where an asynchronous load stands; pages render all three states.
#[derive(Debug, Clone, PartialEq)]
pub enum Load<T> {
    Loading,
    Ready(T),
    Failed(ApiError),
}

/// Loads `fetch()` into a signal now and again each time the returned `reload` is called.
/// Later answers replace earlier ones; a stale answer never overwrites a newer one.
pub fn load<T, F, Fut>(fetch: F) -> (RwSignal<Load<T>>, impl Fn() + Copy + Send + Sync + 'static)
where
    T: Clone + Send + Sync + 'static,
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<T, ApiError>> + 'static,
{
    let state = RwSignal::new(Load::Loading);
    let generation = StoredValue::new(0u64);
    let fetch = StoredValue::new(fetch);
    let reload = move || {
        generation.update_value(|g| *g += 1);
        let mine = generation.get_value();
        let fut = fetch.with_value(|f| f());
        leptos::task::spawn_local(async move {
            let result = fut.await;
            if generation.try_get_value() == Some(mine) {
                state.try_set(match result {
                    Ok(v) => Load::Ready(v),
                    Err(e) => Load::Failed(e),
                });
            }
        });
    };
    reload();
    (state, reload)
}

/// Percent-encodes a path segment (hostnames and plugin names are plain, but a person may
/// type anything into a form).
pub fn seg(s: &str) -> String {
    js_sys::encode_uri_component(s).into()
}
