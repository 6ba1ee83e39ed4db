//! The plugin's settings, read from the job's environment when NCCL first initialises it.

use std::path::PathBuf;
use std::time::Duration;

use crate::abi::event;

pub const DEFAULT_SPOOL: &str = "/var/spool/heddle/jobs";
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);
pub const DEFAULT_SLOTS: usize = 4096;

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `HEDDLE_PROFILER_SPOOL`: where the process's file goes.
    pub spool: PathBuf,
    /// `HEDDLE_PROFILER_INTERVAL_S`: seconds between rewrites (fractions allowed, at least
    /// 0.05, at most 3600).
    pub interval: Duration,
    /// `HEDDLE_PROFILER_SLOTS`: operations in flight at once before timing is dropped.
    pub slots: usize,
    /// `HEDDLE_PROFILER_KERNEL=0` turns off kernel channel events (GPU execution times).
    pub kernel: bool,
    /// `HEDDLE_PROFILER_NET=0` turns off network plugin events (which network was used).
    pub net: bool,
    /// `HEDDLE_PROFILER_DISABLE=1`: load, record nothing.
    pub disabled: bool,
}

fn flag(value: Option<String>, default: bool) -> bool {
    match value.as_deref().map(str::trim) {
        Some("0" | "false" | "off" | "no") => false,
        Some("1" | "true" | "on" | "yes") => true,
        _ => default,
    }
}

impl Config {
    /// From any source of variables (the process environment in the plugin).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Config {
        let interval = get("HEDDLE_PROFILER_INTERVAL_S")
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|s| s.is_finite())
            .map(|s| Duration::from_secs_f64(s.clamp(0.05, 3600.0)))
            .unwrap_or(DEFAULT_INTERVAL);
        Config {
            spool: get("HEDDLE_PROFILER_SPOOL")
                .filter(|s| !s.is_empty())
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(DEFAULT_SPOOL)),
            interval,
            slots: get("HEDDLE_PROFILER_SLOTS")
                .and_then(|v| v.trim().parse().ok())
                .filter(|&n: &usize| n > 0)
                .unwrap_or(DEFAULT_SLOTS),
            kernel: flag(get("HEDDLE_PROFILER_KERNEL"), true),
            net: flag(get("HEDDLE_PROFILER_NET"), true),
            disabled: flag(get("HEDDLE_PROFILER_DISABLE"), false),
        }
    }

    pub fn from_env() -> Config {
        Config::from_vars(|n| std::env::var(n).ok())
    }

    /// The events the plugin asks NCCL for. Collectives and point-to-point operations
    /// always; kernel channels for GPU times; network plugin events (which bring proxy
    /// operation and step events with them) for the network.
    pub fn activation_mask(&self) -> u64 {
        let mut mask = event::COLL | event::P2P;
        if self.kernel {
            mask |= event::KERNEL_CH;
        }
        if self.net {
            mask |= event::NET_PLUGIN | event::PROXY_OP;
        }
        mask
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_overrides() {
        let c = Config::from_vars(|_| None);
        assert_eq!(c.spool, PathBuf::from(DEFAULT_SPOOL));
        assert_eq!(c.interval, DEFAULT_INTERVAL);
        assert!(c.kernel && c.net && !c.disabled);
        assert_eq!(c.activation_mask(), 0b1100_1110);
        let c = Config::from_vars(|n| {
            Some(
                match n {
                    "HEDDLE_PROFILER_INTERVAL_S" => "0.001",
                    "HEDDLE_PROFILER_KERNEL" => "0",
                    "HEDDLE_PROFILER_SLOTS" => "junk",
                    "HEDDLE_PROFILER_SPOOL" => "/tmp/x",
                    _ => "",
                }
                .to_string(),
            )
        });
        assert_eq!(c.interval, Duration::from_millis(50));
        assert_eq!(c.slots, DEFAULT_SLOTS);
        assert!(!c.kernel && c.net);
        assert_eq!(c.activation_mask() & event::KERNEL_CH, 0);
    }
}
