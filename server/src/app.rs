//! The top of the server: [`serve`] starts this replica's background workers (`workers/`)
//! and serves the routes of `router.rs` until it is told to stop.

use anyhow::Context;

use crate::state::AppState;
use crate::{http, router, workers};

/// Serves the API on `listener` until `shutdown` resolves, then drains in-flight requests:
/// HTTPS when the configuration names a certificate (reloaded while serving), plain HTTP
/// otherwise. Also runs this replica's background workers (`workers/`) for as long as it
/// serves, and stops them once it has stopped serving.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let addr = listener.local_addr()?;
    // Before anything else, so a wrong path fails the start at once.
    let tls = http::tls::CertFiles::from_config(&state.config)?;
    if let Some(token) =
        http::auth::bootstrap_admin(&state.db, state.config.admin_token.as_deref()).await?
    {
        // Printed once, on the first start against an empty database.
        println!("heddle-server: created admin token (shown once): {token}");
        tracing::warn!("created the first admin token; it was printed on stdout and is not logged");
    }
    let workers = workers::start(&state, tls.clone());
    let app = router::app(state).into_make_service_with_connect_info::<std::net::SocketAddr>();
    let result = match tls {
        Some(files) => {
            use axum::serve::ListenerExt;
            let acceptor = files.acceptor()?;
            let pin = files.pin().map(|p| p.to_string()).unwrap_or_default();
            tracing::info!(%addr, %pin, "serving HTTPS (clients may pin this key with --pin-sha256)");
            // `tap_io` only so that axum's connect-info impl (for any listener) applies.
            let listener = http::tls::TlsListener::new(listener, acceptor).tap_io(|_| {});
            axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await
        }
        None => {
            if !addr.ip().is_loopback() {
                tracing::warn!(
                    %addr,
                    "serving plain HTTP on a non-loopback address: tokens and credentials cross \
                     the network unencrypted. Give --tls-cert and --tls-key, or put a \
                     TLS-terminating proxy in front (docs/security.md)"
                );
            }
            tracing::info!(%addr, "serving");
            axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await
        }
    };
    // After the last request: what this replica heard from its agents reaches the database,
    // and the enrollment token uses it held go back to their tokens.
    workers.stop().await;
    result.context("serving HTTP")
}
