//! Certificate reloading, when the server speaks HTTPS: checks the certificate and key
//! files every `HEDDLE_TLS_RELOAD_INTERVAL_S` and puts a changed pair in service
//! (`http/tls.rs`, which logs a pair it cannot use and keeps the previous one).

use std::sync::Arc;
use std::time::Duration;

use super::Worker;
use crate::http::tls::CertFiles;
use crate::state::AppState;

pub struct TlsReload {
    files: Arc<CertFiles>,
    interval: Duration,
}

impl TlsReload {
    pub fn new(state: &AppState, files: Arc<CertFiles>) -> Self {
        TlsReload {
            files,
            interval: state.config.tls_reload_interval(),
        }
    }
}

impl Worker for TlsReload {
    const NAME: &'static str = "tls_reload";

    fn interval(&self) -> Duration {
        self.interval
    }

    async fn run(&mut self) -> anyhow::Result<()> {
        let files = self.files.clone();
        // Reading two small files; off the async threads all the same.
        tokio::task::spawn_blocking(move || files.reload_if_changed()).await?;
        Ok(())
    }
}
