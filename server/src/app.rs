//! The top of the server: [`serve`] starts this replica's background loops and serves the
//! routes of `router.rs` until it is told to stop.

use anyhow::Context;

use crate::state::AppState;
use crate::{credentials, http, investigate, leases, liveness, plugins, router, token_uses};

/// Serves the API on `listener` until `shutdown` resolves, then drains in-flight requests:
/// HTTPS when the configuration names a certificate (reloaded while serving), plain HTTP
/// otherwise. Also runs this replica's lease reaper, heartbeat flusher and plugin
/// reconciler for as long as it serves, and flushes heartbeats once more when it stops.
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
    let reaper = tokio::spawn(leases::run_reaper(state.clone()));
    let (stop_flusher, flusher_stop) = tokio::sync::oneshot::channel();
    let flusher = tokio::spawn(liveness::run_flusher(state.clone(), flusher_stop));
    let reconciler = tokio::spawn(plugins::run_reconciler(state.clone()));
    let revocations = tokio::spawn(credentials::run_feed(state.clone()));
    let (stop_returns, returns_stop) = tokio::sync::oneshot::channel();
    let returns = tokio::spawn(token_uses::run_returns(state.clone(), returns_stop));
    let investigator = tokio::spawn(investigate::run_loop(state.clone()));
    let reload_interval = state.config.tls_reload_interval();
    let app = router::app(state).into_make_service_with_connect_info::<std::net::SocketAddr>();
    let result = match tls {
        Some(files) => {
            use axum::serve::ListenerExt;
            let acceptor = files.acceptor()?;
            let pin = files.pin().map(|p| p.to_string()).unwrap_or_default();
            tracing::info!(%addr, %pin, "serving HTTPS (clients may pin this key with --pin-sha256)");
            let watcher = tokio::spawn(http::tls::watch(files, reload_interval));
            // `tap_io` only so that axum's connect-info impl (for any listener) applies.
            let listener = http::tls::TlsListener::new(listener, acceptor).tap_io(|_| {});
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await;
            watcher.abort();
            served
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
    reaper.abort();
    reconciler.abort();
    revocations.abort();
    investigator.abort();
    // After the last request: what this replica heard from its agents reaches the database.
    let _ = stop_flusher.send(());
    // And the enrollment token uses it held go back to their tokens.
    let _ = stop_returns.send(());
    if let Err(err) = returns.await {
        tracing::warn!(error = %err, "giving back enrollment token uses ended abnormally");
    }
    if let Err(err) = flusher.await {
        tracing::warn!(error = %err, "the heartbeat flusher ended abnormally");
    }
    result.context("serving HTTP")
}
