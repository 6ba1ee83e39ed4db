//! The replica's plugin engine: one wasmtime host whose compile cache (in memory, and on disk
//! with `cache_dir`) is the only one, shared by upload validation, dry runs and the
//! reconciler; and the evaluation of many nodes spread over the cores.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use heddle_plugin_host::{
    ComponentInfo, FactsJson, HostConfig, HostError, Limits, LoadedPlugin, PluginHost, Report,
};

/// The server's plugin engine: one per replica.
pub struct PluginRuntime {
    host: Arc<PluginHost>,
    pub limits: Limits,
    /// Wakes the reconciler early (facts changed, a plugin was enabled).
    pub wake: tokio::sync::Notify,
    /// Node evaluations this replica ran (one per node per batch, whatever the plugin count).
    evaluated: AtomicU64,
}

impl PluginRuntime {
    pub fn new(limits: Limits) -> anyhow::Result<Self> {
        Self::with_options(
            limits,
            None,
            HostConfig::default().pooling_keep_resident_bytes,
        )
    }

    /// The server's engine as configured (`HEDDLE_PLUGIN_*`).
    pub fn from_config(config: &crate::config::Config) -> anyhow::Result<Self> {
        Self::with_options(
            config.plugin_limits(),
            config.plugin_cache_dir.clone(),
            config.plugin_keep_resident_bytes,
        )
    }

    /// With `cache_dir`, compiled components are kept on local disk (see
    /// `heddle_plugin_host::HostConfig::cache_dir`), so a restart does not recompile them;
    /// `keep_resident_bytes` is `HostConfig::pooling_keep_resident_bytes`.
    pub fn with_options(
        limits: Limits,
        cache_dir: Option<std::path::PathBuf>,
        keep_resident_bytes: usize,
    ) -> anyhow::Result<Self> {
        // Pre-allocated instance slots: a fresh store per call without mapping and unmapping a
        // linear memory each time. Two slots per core covers the evaluation threads plus API
        // calls (dry runs, uploads); beyond that a call waits for a slot to free up.
        let threads = eval_threads();
        let config = HostConfig {
            pooling_instances: Some(u32::try_from(threads * 2 + 8).unwrap_or(64)),
            pooling_max_memory_bytes: limits.max_memory_bytes.next_power_of_two(),
            pooling_keep_resident_bytes: keep_resident_bytes,
            cache_dir,
            ..HostConfig::default()
        };
        let host = PluginHost::new(config)
            .map_err(|e| anyhow::anyhow!("starting the plugin host: {e}"))?;
        Ok(PluginRuntime {
            host: Arc::new(host),
            limits,
            wake: tokio::sync::Notify::new(),
            evaluated: AtomicU64::new(0),
        })
    }

    /// Node evaluations this replica has run since it started (dry runs included).
    pub fn evaluated_nodes(&self) -> u64 {
        self.evaluated.load(Ordering::Relaxed)
    }

    /// Parses and checks an uploaded component (world, imports, size), keeping it compiled
    /// for the dry runs and evaluations that follow. CPU-bound, so it runs on the blocking
    /// pool.
    pub async fn validate(&self, bytes: Arc<Vec<u8>>) -> Result<ComponentInfo, HostError> {
        let host = self.host.clone();
        let limits = self.limits;
        tokio::task::spawn_blocking(move || host.validate(&bytes, &limits))
            .await
            .unwrap_or_else(|e| Err(HostError::Internal(format!("validation task failed: {e}"))))
    }

    /// Runs every plugin on every node's facts, spread over one thread per core; the outcome
    /// of node `i`, plugin `j` is `[i][j]`. One blocking task for the whole batch, so a call
    /// costs the plugin's own time and nothing for scheduling. Threads take nodes from a
    /// shared queue a few at a time (one slow node does not leave a core idle) and drop each
    /// node's facts as soon as its plugins ran, so freeing them is spread over the cores too.
    pub async fn evaluate(
        &self,
        plugins: Vec<LoadedPlugin>,
        facts: Vec<FactsJson>,
    ) -> Vec<Vec<Result<Report, HostError>>> {
        /// Nodes a thread takes per visit to the queue.
        const GRAB: usize = 16;
        let host = self.host.clone();
        let limits = self.limits;
        let nodes = facts.len();
        self.evaluated.fetch_add(nodes as u64, Ordering::Relaxed);
        let result = tokio::task::spawn_blocking(move || {
            let queue = Mutex::new(facts.into_iter().enumerate());
            let work = || {
                let mut done = Vec::new();
                loop {
                    let grabbed: Vec<(usize, FactsJson)> = queue
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .by_ref()
                        .take(GRAB)
                        .collect();
                    if grabbed.is_empty() {
                        return done;
                    }
                    for (i, f) in grabbed {
                        done.push((
                            i,
                            plugins
                                .iter()
                                .map(|p| host.call(p, &f, &limits))
                                .collect::<Vec<_>>(),
                        ));
                    }
                }
            };
            let mut outcomes: Vec<Vec<Result<Report, HostError>>> = Vec::new();
            outcomes.resize_with(nodes, Vec::new);
            std::thread::scope(|scope| {
                let workers: Vec<_> = (0..eval_threads().min(nodes.div_ceil(GRAB)))
                    .filter_map(|n| {
                        std::thread::Builder::new()
                            .name(format!("heddle-plugins-{n}"))
                            .spawn_scoped(scope, work)
                            .ok()
                    })
                    .collect();
                // With no thread to be had, this one does the work.
                let mut done = if workers.is_empty() {
                    work()
                } else {
                    Vec::new()
                };
                done.extend(
                    workers
                        .into_iter()
                        .flat_map(|w| w.join().unwrap_or_default()),
                );
                for (i, r) in done {
                    outcomes[i] = r;
                }
            });
            outcomes
        })
        .await;
        match result {
            Ok(outcomes) if outcomes.len() == nodes => outcomes,
            Ok(_) | Err(_) => (0..nodes)
                .map(|_| {
                    vec![Err(HostError::Internal(
                        "plugin evaluation task failed".into(),
                    ))]
                })
                .collect(),
        }
    }

    /// Compiles and checks a component on the blocking pool (or takes it from the cache).
    pub async fn load(&self, bytes: Vec<u8>) -> Result<LoadedPlugin, HostError> {
        let host = self.host.clone();
        let limits = self.limits;
        tokio::task::spawn_blocking(move || host.load(&bytes, &limits))
            .await
            .unwrap_or_else(|e| Err(HostError::Internal(format!("compile task failed: {e}"))))
    }

    /// The compiled plugin stored under `sha256`: from the host's cache, or read from
    /// Postgres and compiled. Bytes in Postgres were validated at upload, so a failure here
    /// is reported as the plugin's outcome on every node, not as a server error.
    pub async fn plugin(
        &self,
        db: &sqlx::PgPool,
        sha256: &str,
    ) -> Result<Result<LoadedPlugin, HostError>, sqlx::Error> {
        if let Some(p) = self.host.cached_plugin(sha256) {
            return Ok(Ok(p));
        }
        let bytes = sqlx::query_scalar!("SELECT bytes FROM plugin_blobs WHERE sha256 = $1", sha256)
            .fetch_one(db)
            .await?;
        Ok(self.load(bytes).await)
    }
}

/// Threads that evaluate plugins: one per core.
fn eval_threads() -> usize {
    std::thread::available_parallelism().map_or(2, usize::from)
}
