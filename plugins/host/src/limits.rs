//! Per-call resource limits and the store's resource limiter.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Limits applied to every call into a plugin. Each call gets a fresh store, so nothing a
/// plugin allocates or burns carries over to the next call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Limits {
    /// Fuel units (roughly one per WebAssembly instruction). The first-party plugins use
    /// well under a million on an 8-GPU node.
    pub fuel: u64,
    /// Wall-clock backstop for anything fuel does not meter (host calls, compilation stalls).
    #[serde(with = "millis")]
    pub timeout: Duration,
    /// Cap on each linear memory, in bytes.
    pub max_memory_bytes: usize,
    /// Cap on the detection's total string bytes.
    pub max_output_bytes: usize,
    /// Cap on the bytes kept from stdout and from stderr each (the rest is discarded).
    pub max_stdio_bytes: usize,
    /// Cap on log messages kept per call (bytes); later messages are counted and dropped.
    pub max_log_bytes: usize,
    /// Cap on the size of a component's bytes. The default admits a CPython component built
    /// by componentize-py (about 18 MB) with room to spare.
    pub max_component_bytes: usize,
    /// How long compiling a component may take before the caller stops waiting for it.
    #[serde(with = "millis")]
    pub max_compile_time: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            fuel: 500_000_000,
            timeout: Duration::from_secs(2),
            max_memory_bytes: 64 << 20,
            max_output_bytes: 1 << 20,
            max_stdio_bytes: 64 << 10,
            max_log_bytes: 64 << 10,
            max_component_bytes: 32 << 20,
            max_compile_time: Duration::from_secs(60),
        }
    }
}

mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis().try_into().unwrap_or(u64::MAX))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(d)?))
    }
}

/// Raised (as the trap's cause) when a plugin asks for more memory than allowed, so the host
/// can tell "memory bomb" from any other crash.
#[derive(Debug, thiserror::Error)]
#[error("memory growth to {requested} bytes denied (cap {limit} bytes)")]
pub struct MemoryDenied {
    pub requested: usize,
    pub limit: usize,
}

/// At most one linear memory per store, each capped; records the peak for the report.
#[derive(Debug)]
pub struct Limiter {
    max_memory_bytes: usize,
    pub peak_memory_bytes: usize,
}

/// Tables hold function references; a Rust component needs a few with a few hundred entries.
const MAX_TABLE_ELEMENTS: usize = 100_000;

impl Limiter {
    pub fn new(max_memory_bytes: usize) -> Self {
        Self {
            max_memory_bytes,
            peak_memory_bytes: 0,
        }
    }
}

impl wasmtime::ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.max_memory_bytes {
            return Err(MemoryDenied {
                requested: desired,
                limit: self.max_memory_bytes,
            }
            .into());
        }
        self.peak_memory_bytes = self.peak_memory_bytes.max(desired);
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }

    fn memories(&self) -> usize {
        1
    }

    fn tables(&self) -> usize {
        16
    }

    fn instances(&self) -> usize {
        32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime::ResourceLimiter;

    #[test]
    fn growth_past_the_cap_is_an_identifiable_error() {
        let mut l = Limiter::new(1 << 20);
        assert!(l.memory_growing(0, 65536, None).unwrap());
        let err = l.memory_growing(65536, 2 << 20, None).unwrap_err();
        let denied = err.downcast_ref::<MemoryDenied>().expect("MemoryDenied");
        assert_eq!(denied.requested, 2 << 20);
        assert_eq!(l.peak_memory_bytes, 65536);
    }

    #[test]
    fn limits_round_trip_with_millisecond_timeout() {
        let l: Limits = serde_json::from_str(r#"{"timeout": 250, "fuel": 10}"#).unwrap();
        assert_eq!(l.timeout, Duration::from_millis(250));
        assert_eq!(l.fuel, 10);
        assert_eq!(l.max_memory_bytes, Limits::default().max_memory_bytes);
        let back: Limits = serde_json::from_str(&serde_json::to_string(&l).unwrap()).unwrap();
        assert_eq!(back, l);
    }
}
