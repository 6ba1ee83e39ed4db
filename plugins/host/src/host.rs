//! The engine, the compile cache and the per-call store: where limits are enforced.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use wasmtime::component::{HasSelf, Linker};
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, PoolConcurrencyLimitError, PoolingAllocationConfig,
    Store, Trap,
};

use crate::HostError;
use crate::bindings::{v01, v02};
use crate::clock::{self, WaitDenied};
use crate::compile::{self, DiskCache};
use crate::facts::{FactsJson, Reads};
use crate::limits::{Limits, MemoryDenied};
use crate::output::{check_info, check_output, convert_v01, convert_v02};
use crate::policy::{self, Contract};
use crate::report::{CompileTime, ComponentInfo, Detection, LogLevel, PluginInfo, Report, Usage};
use crate::sandbox::State;

/// Engine-wide settings, fixed when the host is created. Per-call limits are [`Limits`].
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// Compiled components kept, keyed by sha256 (oldest evicted first).
    pub cache_capacity: usize,
    /// Epoch tick: the granularity of the wall-clock deadline.
    pub epoch_tick: Duration,
    /// Pre-allocate this many instance slots (faster store creation, fixed memory ceiling of
    /// `pooling_max_memory_bytes` per memory). `None` allocates on demand.
    pub pooling_instances: Option<u32>,
    pub pooling_max_memory_bytes: usize,
    /// With pooling: bytes of each slot's memory (and tables) kept resident between
    /// instances and cleared with memset instead of being returned to the kernel.
    pub pooling_keep_resident_bytes: usize,
    /// Map a component's initialised memory copy-on-write from its image (wasmtime's
    /// `memory_init_cow`) instead of copying its data segments into the slot. Off by default:
    /// every call starts a fresh instance, and with the image mapped the pages a call writes
    /// are copy-on-write faults again on every call, which for a CPython component (megabytes
    /// of pre-initialised heap) cost ~2.4 ms of system time per call against ~1 ms for the
    /// whole call when the segments are copied into a slot kept resident
    /// (docs/benchmarks.md, "Python plugins").
    pub memory_init_cow: bool,
    /// Stack for WebAssembly code; deep recursion traps instead of overflowing the host.
    pub max_wasm_stack: usize,
    /// A private directory (created 0700) where compiled components are kept across
    /// processes, by sha256 of their bytes and of the engine settings. `None` compiles in
    /// every process.
    pub cache_dir: Option<PathBuf>,
}

impl Default for HostConfig {
    fn default() -> Self {
        Self {
            cache_capacity: 64,
            epoch_tick: Duration::from_millis(10),
            pooling_instances: None,
            pooling_max_memory_bytes: 256 << 20,
            pooling_keep_resident_bytes: 32 << 20,
            memory_init_cow: false,
            max_wasm_stack: 256 << 10,
            cache_dir: None,
        }
    }
}

/// The pre-linked instance template, in the bindings of the contract the component exports.
enum Pre {
    V01(v01::DetectorPre<State>),
    V02(v02::DetectorPre<State>),
}

impl Pre {
    fn contract(&self) -> Contract {
        match self {
            Pre::V01(_) => Contract::V01,
            Pre::V02(_) => Contract::V02,
        }
    }

    fn info(&self, store: &mut Store<State>) -> wasmtime::Result<PluginInfo> {
        Ok(match self {
            Pre::V01(pre) => {
                let i = pre
                    .instantiate(&mut *store)?
                    .heddle_plugin_plugin()
                    .call_info(&mut *store)?;
                PluginInfo {
                    name: i.name,
                    version: i.version,
                    description: i.description,
                    reads: Vec::new(),
                }
            }
            Pre::V02(pre) => {
                let i = pre
                    .instantiate(&mut *store)?
                    .heddle_plugin_plugin()
                    .call_info(&mut *store)?;
                PluginInfo {
                    name: i.name,
                    version: i.version,
                    description: i.description,
                    reads: i.reads,
                }
            }
        })
    }

    /// Instantiates and calls `detect`; the outer error is a trap, the inner one the plugin's.
    fn detect(
        &self,
        store: &mut Store<State>,
        facts_json: &str,
    ) -> wasmtime::Result<Result<Detection, (String, String)>> {
        Ok(match self {
            Pre::V01(pre) => pre
                .instantiate(&mut *store)?
                .heddle_plugin_plugin()
                .call_detect(&mut *store, facts_json)?
                .map(convert_v01)
                .map_err(|e| (e.code, e.message)),
            Pre::V02(pre) => pre
                .instantiate(&mut *store)?
                .heddle_plugin_plugin()
                .call_detect(&mut *store, facts_json)?
                .map(convert_v02)
                .map_err(|e| (e.code, e.message)),
        })
    }
}

/// A compiled, checked component with its pre-linked instance template.
struct Prepared {
    pre: Pre,
    info: Arc<PluginInfo>,
    /// `info.reads`, parsed.
    reads: Arc<Reads>,
    imports: Vec<String>,
    sha256: String,
    size: usize,
    compile_micros: u64,
    /// Loaded from the disk cache instead of compiled.
    from_disk: bool,
    /// Insertion order, for eviction.
    seq: u64,
}

/// Compiled components by sha256 of their bytes, with an insertion counter for eviction.
#[derive(Default)]
struct Cache {
    entries: HashMap<[u8; 32], Arc<Prepared>>,
    seq: u64,
}

/// A compiled, checked plugin, cheap to clone; see [`PluginHost::load`].
#[derive(Clone)]
pub struct LoadedPlugin {
    prepared: Arc<Prepared>,
}

impl LoadedPlugin {
    pub fn info(&self) -> &PluginInfo {
        &self.prepared.info
    }

    pub fn sha256(&self) -> &str {
        &self.prepared.sha256
    }
}

/// Runs detector plugins. Create one per process and share it (`Arc<PluginHost>`): it owns
/// the engine, the compile cache and the single epoch ticker thread. Calls are synchronous and
/// CPU-bound; async callers should use `spawn_blocking`.
pub struct PluginHost {
    engine: Engine,
    linker: Linker<State>,
    cache: Mutex<Cache>,
    disk: Option<DiskCache>,
    config: HostConfig,
    _ticker: Ticker,
}

impl PluginHost {
    pub fn new(config: HostConfig) -> Result<Self, HostError> {
        let mut cfg = Config::new();
        cfg.wasm_component_model(true)
            .consume_fuel(true)
            .epoch_interruption(true)
            .max_wasm_stack(config.max_wasm_stack)
            .parallel_compilation(true)
            .memory_init_cow(config.memory_init_cow);
        if let Some(instances) = config.pooling_instances {
            let mut pool = PoolingAllocationConfig::default();
            pool.total_component_instances(instances)
                .total_core_instances(instances * 8)
                .total_memories(instances)
                .total_tables(instances * 8)
                .max_memory_size(config.pooling_max_memory_bytes)
                .max_memories_per_module(1);
            // Reset the first pages of a slot with memset rather than madvise, so the next
            // instance does not fault them back in. With PAGEMAP_SCAN (Linux 6.7+) only the
            // pages the call wrote are reset, so a budget that covers a CPython heap (32 MiB)
            // costs a Rust plugin nothing: it writes well under 1 MiB.
            pool.linear_memory_keep_resident(config.pooling_keep_resident_bytes)
                .table_keep_resident(config.pooling_keep_resident_bytes)
                .pagemap_scan(wasmtime::Enabled::Auto);
            cfg.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        }
        let engine = Engine::new(&cfg).map_err(internal)?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker).map_err(internal)?;
        // Clock waits are host code that no fuel or epoch reaches: replaced by ones that end
        // before the call's deadline.
        linker.allow_shadowing(true);
        clock::add_to_linker(&mut linker, State::clock).map_err(internal)?;
        linker.allow_shadowing(false);
        v01::Detector::add_to_linker::<State, HasSelf<State>>(&mut linker, |s| s)
            .map_err(internal)?;
        v02::Detector::add_to_linker::<State, HasSelf<State>>(&mut linker, |s| s)
            .map_err(internal)?;
        let ticker = Ticker::start(&engine, config.epoch_tick);
        let disk = config.cache_dir.as_deref().and_then(DiskCache::open);
        Ok(Self {
            engine,
            linker,
            cache: Mutex::new(Cache::default()),
            disk,
            config,
            _ticker: ticker,
        })
    }

    /// Compiles (or fetches from the cache), checks the imports and the world, and calls
    /// `info()`: everything the server needs to accept an upload.
    pub fn validate(&self, bytes: &[u8], limits: &Limits) -> Result<ComponentInfo, HostError> {
        let (prepared, cache_hit) = self.prepare(bytes, limits)?;
        Ok(ComponentInfo {
            plugin: (*prepared.info).clone(),
            sha256: prepared.sha256.clone(),
            size_bytes: prepared.size,
            contract: prepared.pre.contract().package().to_string(),
            imports: prepared.imports.clone(),
            compile_time: CompileTime {
                micros: if cache_hit {
                    0
                } else {
                    prepared.compile_micros
                },
                cache_hit: cache_hit || prepared.from_disk,
            },
        })
    }

    /// Runs `detect` on `facts_json` in a fresh store under `limits`. Hashes `bytes` to find
    /// the compiled component and checks the facts on every call; callers that run plugins
    /// often should [`Self::load`] once and [`Self::call`] the handle with [`FactsJson`].
    pub fn run(
        &self,
        bytes: &[u8],
        facts_json: &str,
        limits: &Limits,
    ) -> Result<Report, HostError> {
        let facts = FactsJson::parse(facts_json)?;
        let (prepared, cache_hit) = self.prepare(bytes, limits)?;
        self.call_prepared(&prepared, cache_hit, &facts, limits)
    }

    /// Compiles and checks a component once (like [`Self::validate`]) and returns a handle for
    /// [`Self::call`], which skips hashing the bytes.
    pub fn load(&self, bytes: &[u8], limits: &Limits) -> Result<LoadedPlugin, HostError> {
        let (prepared, _) = self.prepare(bytes, limits)?;
        Ok(LoadedPlugin { prepared })
    }

    /// The plugin compiled from bytes whose sha256 is `sha256` (lowercase hex), if this host
    /// holds it: lets a caller that stores components by hash (the server) skip reading the
    /// bytes again, with this host's cache as the only one.
    pub fn cached_plugin(&self, sha256: &str) -> Option<LoadedPlugin> {
        let mut key = [0u8; 32];
        hex::decode_to_slice(sha256, &mut key).ok()?;
        self.lock_cache()
            .entries
            .get(&key)
            .map(|prepared| LoadedPlugin {
                prepared: prepared.clone(),
            })
    }

    /// Runs `detect` of a loaded plugin on checked facts in a fresh store under `limits`.
    pub fn call(
        &self,
        plugin: &LoadedPlugin,
        facts: &FactsJson,
        limits: &Limits,
    ) -> Result<Report, HostError> {
        self.call_prepared(&plugin.prepared, true, facts, limits)
    }

    fn call_prepared(
        &self,
        prepared: &Prepared,
        cache_hit: bool,
        facts: &FactsJson,
        limits: &Limits,
    ) -> Result<Report, HostError> {
        let facts_json = facts.for_reads(&prepared.reads);
        let started = Instant::now();
        let mut store = self.store(limits)?;
        let outcome = prepared.pre.detect(&mut store, &facts_json);
        let (usage, (logs, stdout, stderr)) = finish(&mut store, limits, started, cache_hit);
        forward_logs(&prepared.info.name, &logs);
        let mut detection = match outcome {
            Err(err) => return Err(classify(err, usage, limits, stderr)),
            Ok(Err((code, message))) => {
                return Err(HostError::Plugin {
                    code,
                    message,
                    usage,
                });
            }
            Ok(Ok(d)) => d,
        };
        let size = detection.output_bytes();
        if size > limits.max_output_bytes {
            return Err(HostError::OutputTooLarge {
                size,
                limit: limits.max_output_bytes,
                usage,
            });
        }
        check_output(&detection)?;
        for (name, error) in detection.drop_refused_env(&prepared.info.name) {
            tracing::warn!(plugin = %prepared.info.name, %name, %error, "plugin recommendation dropped");
        }
        Ok(Report {
            plugin: prepared.info.clone(),
            sha256: prepared.sha256.clone(),
            detection,
            usage,
            logs,
            stdout,
            stderr,
        })
    }

    /// Number of compiled components held.
    pub fn cached(&self) -> usize {
        self.lock_cache().entries.len()
    }

    fn lock_cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn store(&self, limits: &Limits) -> Result<Store<State>, HostError> {
        let mut store = Store::new(&self.engine, State::new(limits));
        store.limiter(|s| &mut s.limiter);
        store.set_fuel(limits.fuel).map_err(internal)?;
        let tick = self.config.epoch_tick.as_nanos().max(1);
        let ticks = limits.timeout.as_nanos().div_ceil(tick) as u64;
        // +1: the current tick may be about to end.
        store.set_epoch_deadline(ticks.max(1) + 1);
        store.epoch_deadline_trap();
        Ok(store)
    }

    fn prepare(&self, bytes: &[u8], limits: &Limits) -> Result<(Arc<Prepared>, bool), HostError> {
        if bytes.len() > limits.max_component_bytes {
            return Err(HostError::TooLarge {
                size: bytes.len(),
                limit: limits.max_component_bytes,
            });
        }
        let key: [u8; 32] = Sha256::digest(bytes).into();
        if let Some(p) = self.lock_cache().entries.get(&key) {
            return Ok((p.clone(), true));
        }
        check_header(bytes)?;
        // Compiled from these wasm bytes, or loaded from what this host compiled from the same
        // bytes before; precompiled code is never accepted from outside (see `compile`).
        let compiled = compile::compile(
            &self.engine,
            bytes,
            &key,
            limits.max_compile_time,
            self.disk.as_ref(),
        )?;
        let (component, compile_micros) = (compiled.component, compiled.micros);
        let imports = policy::check_imports(&self.engine, &component)?;
        let contract = policy::check_exports(&self.engine, &component)?;
        let instance_pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(|e| HostError::Link(format!("{e:#}")))?;
        let wrong_world = |e: wasmtime::Error| HostError::WrongWorld {
            expected: policy::EXPORT_INTERFACE,
            found: format!("{e:#}"),
        };
        let pre = match contract {
            Contract::V01 => Pre::V01(v01::DetectorPre::new(instance_pre).map_err(wrong_world)?),
            Contract::V02 => Pre::V02(v02::DetectorPre::new(instance_pre).map_err(wrong_world)?),
        };

        let started = Instant::now();
        let mut store = self.store(limits)?;
        let outcome = pre.info(&mut store);
        let (usage, (_, _, stderr)) = finish(&mut store, limits, started, false);
        let info = match outcome {
            Ok(info) => info,
            // Traps (fuel, memory) are the plugin's doing; anything else is the sandbox refusing
            // its shape, e.g. a second linear memory.
            Err(e)
                if e.downcast_ref::<Trap>().is_none()
                    && e.downcast_ref::<MemoryDenied>().is_none()
                    && e.downcast_ref::<WaitDenied>().is_none()
                    && e.downcast_ref::<PoolConcurrencyLimitError>().is_none() =>
            {
                return Err(HostError::Link(format!("{e:#}")));
            }
            Err(e) => return Err(classify(e, usage, limits, stderr)),
        };
        check_info(&info)?;

        let mut cache = self.lock_cache();
        cache.seq += 1;
        let prepared = Arc::new(Prepared {
            pre,
            reads: Arc::new(Reads::new(&info.reads)),
            info: Arc::new(info),
            imports,
            sha256: hex::encode(key),
            size: bytes.len(),
            compile_micros,
            from_disk: compiled.from_disk,
            seq: cache.seq,
        });
        if cache.entries.len() >= self.config.cache_capacity.max(1)
            && let Some(oldest) = cache
                .entries
                .iter()
                .min_by_key(|(_, p)| p.seq)
                .map(|(k, _)| *k)
        {
            cache.entries.remove(&oldest);
        }
        cache.entries.insert(key, prepared.clone());
        tracing::debug!(plugin = %prepared.info.name, sha256 = %prepared.sha256, compile_micros,
            from_disk = compiled.from_disk, "compiled plugin");
        Ok((prepared, false))
    }
}

/// Distinguishes "not wasm" and "a core module" from other failures, with the fix for each.
fn check_header(bytes: &[u8]) -> Result<(), HostError> {
    match bytes.get(..8) {
        Some([0, b'a', b's', b'm', _, _, 0x01, 0x00]) => Ok(()),
        Some([0, b'a', b's', b'm', 0x01, 0x00, 0x00, 0x00]) => Err(HostError::NotAComponent(
            "this is a core WebAssembly module; build the plugin with `--target wasm32-wasip2` so it is a component"
                .into(),
        )),
        _ => Err(HostError::NotAComponent("missing the WebAssembly magic number: not a .wasm file".into())),
    }
}

type Captured = (Vec<crate::report::LogRecord>, String, String);

/// Reads what the call used and produced out of the store.
fn finish(
    store: &mut Store<State>,
    limits: &Limits,
    started: Instant,
    cache_hit: bool,
) -> (Usage, Captured) {
    let elapsed = started.elapsed();
    let remaining = store.get_fuel().unwrap_or(0);
    let state = store.data_mut();
    let (stdout, stdout_dropped) = state.stdout.take();
    let (stderr, stderr_dropped) = state.stderr.take();
    let usage = Usage {
        fuel_consumed: limits.fuel.saturating_sub(remaining),
        elapsed,
        peak_memory_bytes: state.limiter.peak_memory_bytes,
        cache_hit,
        logs_dropped: state.logs.dropped,
        stdout_dropped_bytes: stdout_dropped,
        stderr_dropped_bytes: stderr_dropped,
    };
    (
        usage,
        (std::mem::take(&mut state.logs.records), stdout, stderr),
    )
}

/// Names the limit that stopped a failed call.
fn classify(err: wasmtime::Error, usage: Usage, limits: &Limits, stderr: String) -> HostError {
    if let Some(denied) = err.downcast_ref::<MemoryDenied>() {
        return HostError::MemoryLimit {
            requested: denied.requested,
            limit: denied.limit,
            usage,
        };
    }
    if let Some(busy) = err.downcast_ref::<PoolConcurrencyLimitError>() {
        return HostError::Unavailable(busy.to_string());
    }
    let timeout = |usage| HostError::Timeout {
        limit_ms: limits.timeout.as_millis().try_into().unwrap_or(u64::MAX),
        usage,
    };
    if let Some(wait) = err.downcast_ref::<WaitDenied>() {
        tracing::debug!(%wait, "plugin asked to wait past its deadline");
        return timeout(usage);
    }
    match err.downcast_ref::<Trap>() {
        Some(Trap::OutOfFuel) => HostError::FuelExhausted {
            limit: limits.fuel,
            usage,
        },
        Some(Trap::Interrupt) => timeout(usage),
        Some(trap) => {
            tracing::debug!(error = ?err, "plugin trapped");
            HostError::Trap {
                message: trap.to_string(),
                stderr,
                usage,
            }
        }
        None => HostError::Trap {
            message: format!("{err:#}"),
            stderr,
            usage,
        },
    }
}

fn forward_logs(plugin: &str, logs: &[crate::report::LogRecord]) {
    for r in logs {
        match r.level {
            LogLevel::Trace => tracing::trace!(plugin, "{}", r.message),
            LogLevel::Debug => tracing::debug!(plugin, "{}", r.message),
            LogLevel::Info => tracing::info!(plugin, "{}", r.message),
            LogLevel::Warn => tracing::warn!(plugin, "{}", r.message),
            LogLevel::Error => tracing::error!(plugin, "{}", r.message),
        }
    }
}

fn internal(e: impl std::fmt::Display) -> HostError {
    HostError::Internal(e.to_string())
}

/// The one thread that advances the engine's epoch, which is what turns `Limits::timeout`
/// into a trap. It stops when the host is dropped.
struct Ticker {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Ticker {
    fn start(engine: &Engine, tick: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let weak = engine.weak();
        let flag = stop.clone();
        let handle = std::thread::Builder::new()
            .name("heddle-plugin-epoch".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(tick);
                    match weak.upgrade() {
                        Some(engine) => engine.increment_epoch(),
                        None => break,
                    }
                }
            })
            .ok();
        Self { stop, handle }
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_check_names_the_problem() {
        assert!(check_header(b"\0asm\x0d\x00\x01\x00").is_ok());
        assert!(
            check_header(b"\0asm\x01\x00\x00\x00")
                .unwrap_err()
                .to_string()
                .contains("core WebAssembly module")
        );
        assert!(
            check_header(b"PK\x03\x04zip!")
                .unwrap_err()
                .to_string()
                .contains("magic number")
        );
    }
}
