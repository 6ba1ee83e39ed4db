//! Serves the built dashboard when one is configured, and a plain status page otherwise,
//! so `/` always tells a person where they are.
//!
//! Every page is sent with a strict Content-Security-Policy: scripts only from this origin
//! (plus the inline boot script of `index.html`, allowed by its hash) and WebAssembly, no
//! framing, requests only to this origin. An injected `<script>` or a link to another
//! origin cannot run or leak the signed-in token.

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::response::Html;
use base64::Engine;
use sha2::{Digest, Sha256};
use tower_http::services::{ServeDir, ServeFile};
use tower_http::set_header::SetResponseHeaderLayer;

use crate::state::AppState;

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
    let (router, index) = match &state.config.dashboard_dir {
        Some(dir) if dir.join("index.html").is_file() => {
            // Client-side routes (e.g. /nodes/abc) fall back to index.html.
            let index = ServeFile::new(dir.join("index.html"));
            let html = std::fs::read_to_string(dir.join("index.html")).unwrap_or_default();
            (
                Router::new().fallback_service(ServeDir::new(dir).fallback(index)),
                html,
            )
        }
        Some(dir) => {
            tracing::warn!(dir = %dir.display(), "dashboard folder has no index.html; serving the status page");
            (status_page(), String::new())
        }
        None => (status_page(), String::new()),
    };
    let csp =
        HeaderValue::from_str(&content_security_policy(&index)).expect("the policy is plain ASCII");
    router
        .layer(SetResponseHeaderLayer::overriding(
            header::CONTENT_SECURITY_POLICY,
            csp,
        ))
        .layer(SetResponseHeaderLayer::overriding(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ))
        .layer(SetResponseHeaderLayer::overriding(
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        ))
}

fn status_page() -> Router<AppState> {
    Router::new().route("/", axum::routing::get(|| async { Html(FALLBACK) }))
}

/// The policy for the dashboard whose `index.html` is `index`: its inline scripts are
/// allowed by hash, nothing else inline runs. Styles may be inline (Leptos sets `style`
/// attributes); they cannot run code.
pub fn content_security_policy(index: &str) -> String {
    let hashes: String = inline_scripts(index)
        .map(|body| {
            let digest = Sha256::digest(body.as_bytes());
            format!(
                " 'sha256-{}'",
                base64::engine::general_purpose::STANDARD.encode(digest)
            )
        })
        .collect();
    format!(
        "default-src 'none'; script-src 'self' 'wasm-unsafe-eval'{hashes}; \
         style-src 'self' 'unsafe-inline'; img-src 'self' data:; font-src 'self'; \
         connect-src 'self'; manifest-src 'self'; base-uri 'none'; form-action 'self'; \
         frame-ancestors 'none'; object-src 'none'"
    )
}

/// The bodies of `<script>` elements without a `src`, exactly as the browser hashes them.
fn inline_scripts(html: &str) -> impl Iterator<Item = &str> {
    html.split("<script").skip(1).filter_map(|rest| {
        let (attrs, after) = rest.split_once('>')?;
        if attrs.contains("src=") {
            return None;
        }
        after.split_once("</script>").map(|(body, _)| body)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_boot_script_is_allowed_by_its_hash_and_nothing_else() {
        let html = "<head><script src=\"/a.js\"></script></head><body>\
                    <script type=\"module\">\nimport init from '/x.js';\n</script></body>";
        let bodies: Vec<&str> = inline_scripts(html).collect();
        assert_eq!(bodies, vec!["\nimport init from '/x.js';\n"]);
        let csp = content_security_policy(html);
        let digest =
            base64::engine::general_purpose::STANDARD.encode(Sha256::digest(bodies[0].as_bytes()));
        assert!(csp.contains(&format!("'sha256-{digest}'")), "{csp}");
        let script_src = csp
            .split(';')
            .find(|d| d.trim_start().starts_with("script-src"))
            .unwrap();
        assert!(!script_src.contains("unsafe-inline"), "{csp}");
        assert!(csp.contains("frame-ancestors 'none'"));
        assert!(!content_security_policy("").contains("sha256"));
    }
}
