//! Serves the built dashboard when one is configured, and a plain status page otherwise,
//! so `/` always tells a person where they are.

use axum::Router;
use axum::response::Html;
use tower_http::services::{ServeDir, ServeFile};

use crate::AppState;

const FALLBACK: &str = r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Heddle</title></head>
<body style="font-family: sans-serif; max-width: 40em; margin: 3em auto">
<h1>Heddle</h1>
<p>This server runs without a built dashboard (set <code>HEDDLE_DASHBOARD_DIR</code>).</p>
<ul>
<li><a href="/api/v1/openapi.json">OpenAPI document</a></li>
<li><a href="/healthz">/healthz</a>, <a href="/readyz">/readyz</a>, <a href="/metrics">/metrics</a></li>
</ul>
<p>Use the <code>heddle</code> CLI or the API with a bearer token.</p>
</body></html>
"#;

pub fn routes(state: &AppState) -> Router<AppState> {
    match &state.config.dashboard_dir {
        Some(dir) if dir.join("index.html").is_file() => {
            // Client-side routes (e.g. /nodes/abc) fall back to index.html.
            let index = ServeFile::new(dir.join("index.html"));
            Router::new().fallback_service(ServeDir::new(dir).fallback(index))
        }
        Some(dir) => {
            tracing::warn!(dir = %dir.display(), "dashboard folder has no index.html; serving the status page");
            Router::new().route("/", axum::routing::get(|| async { Html(FALLBACK) }))
        }
        None => Router::new().route("/", axum::routing::get(|| async { Html(FALLBACK) })),
    }
}
