use clap::Parser;
use heddle_server::{AppState, Config};

/// mimalloc rather than glibc's malloc: plugin evaluation threads free facts that request
/// threads allocated, which glibc serialises on the allocating thread's arena lock.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = Config::parse();
    init_tracing(config.log_json);
    let listener = tokio::net::TcpListener::bind(config.listen).await?;
    let state = AppState::new(config).await?;
    // The first-party plugins, enabled on a fresh database (docs/plugins.md).
    heddle_server::plugins_bundled::register(&state.db, &state.plugins).await?;
    heddle_server::serve(listener, state, shutdown_signal()).await
}

fn init_tracing(json: bool) {
    use tracing_subscriber::EnvFilter;
    let filter =
        EnvFilter::try_from_env("HEDDLE_LOG").unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
    tracing::info!("shutting down: draining in-flight requests");
}
