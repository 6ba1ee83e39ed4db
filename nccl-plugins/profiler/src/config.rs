//! The plugin's settings, read from the job's environment when NCCL first initialises it.

use std::path::PathBuf;
use std::time::Duration;

use crate::abi::event;

pub const DEFAULT_SPOOL: &str = "/var/spool/heddle/jobs";
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);
pub const DEFAULT_SLOTS: usize = 4096;
/// How long an operation may be in flight (or, without a completion signal, the
/// communicator quiet after starting one) before the file is written at once rather than
/// at the next interval: what the server's hang verdict waits on.
pub const DEFAULT_STALL: Duration = Duration::from_secs(3);
/// The share of each interval with kernel channel events on. NCCL's kernel profiling
/// costs a job about 10 µs per small operation on 2× H200 (docs/benchmarks.md, "NCCL
/// profiler plugin"); a tenth of the time keeps GPU times for every band a job uses for
/// more than a few intervals at a tenth of that cost.
pub const DEFAULT_KERNEL_SHARE: f64 = 0.1;

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `HEDDLE_PROFILER_SPOOL`: where the process's file goes.
    pub spool: PathBuf,
    /// `HEDDLE_PROFILER_INTERVAL_S`: seconds between rewrites (fractions allowed, at least
    /// 0.05, at most 3600).
    pub interval: Duration,
    /// `HEDDLE_PROFILER_SLOTS`: operations in flight at once before timing is dropped.
    pub slots: usize,
    /// `HEDDLE_PROFILER_KERNEL`: the share of each interval with kernel channel events
    /// (GPU execution times) on, from its start: `0` never, `1` always, a fraction in
    /// between (default [`DEFAULT_KERNEL_SHARE`]).
    pub kernel: f64,
    /// `HEDDLE_PROFILER_NET=0` turns off network plugin events (which network was used).
    pub net: bool,
    /// `HEDDLE_PROFILER_DISABLE=1`: load, record nothing.
    pub disabled: bool,
    /// `HEDDLE_PROFILER_STALL_S`: seconds in flight before a prompt write (0.1 to 3600,
    /// default [`DEFAULT_STALL`]).
    pub stall: Duration,
}

/// `0`/`off` is 0, `1`/`on` is 1, a number from 0 to 1 is itself; anything else is the
/// default.
fn share(value: Option<String>, default: f64) -> f64 {
    match value.as_deref().map(str::trim) {
        Some("false" | "off" | "no") => 0.0,
        Some("true" | "on" | "yes") => 1.0,
        Some(v) => v
            .parse::<f64>()
            .ok()
            .filter(|x| (0.0..=1.0).contains(x))
            .unwrap_or(default),
        None => default,
    }
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
            kernel: share(get("HEDDLE_PROFILER_KERNEL"), DEFAULT_KERNEL_SHARE),
            net: flag(get("HEDDLE_PROFILER_NET"), true),
            disabled: flag(get("HEDDLE_PROFILER_DISABLE"), false),
            stall: get("HEDDLE_PROFILER_STALL_S")
                .and_then(|v| v.trim().parse::<f64>().ok())
                .filter(|s| s.is_finite())
                .map(|s| Duration::from_secs_f64(s.clamp(0.1, 3600.0)))
                .unwrap_or(DEFAULT_STALL),
        }
    }

    pub fn from_env() -> Config {
        Config::from_vars(|n| std::env::var(n).ok())
    }

    /// Whether kernel channel events are on all the time (completion is then known for
    /// every operation).
    pub fn kernel_always(&self) -> bool {
        self.kernel >= 1.0
    }

    /// How long kernel channel events stay on at the start of each interval, when they
    /// are on for part of it only.
    pub fn kernel_window(&self) -> Option<Duration> {
        (self.kernel > 0.0 && self.kernel < 1.0).then(|| self.interval.mul_f64(self.kernel))
    }

    /// The events the plugin asks NCCL for at the start of an interval. Collectives and
    /// point-to-point operations always; kernel channels for GPU times (unless never);
    /// network plugin events (which bring proxy operation and step events with them) for
    /// the network.
    pub fn activation_mask(&self) -> u64 {
        self.mask_with_kernel(self.kernel > 0.0)
    }

    /// The events the plugin asks NCCL for, with kernel channels or without.
    pub fn mask_with_kernel(&self, kernel: bool) -> u64 {
        let mut mask = event::COLL | event::P2P;
        if kernel {
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
        assert!(c.net && !c.disabled);
        assert_eq!(c.kernel, DEFAULT_KERNEL_SHARE);
        assert_eq!(c.kernel_window(), Some(Duration::from_millis(500)));
        assert_eq!(c.activation_mask(), 0b1100_1110);
        assert_eq!(c.mask_with_kernel(false), 0b1100_1110 & !event::KERNEL_CH);
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
        assert_eq!(c.stall, DEFAULT_STALL);
        let stall = Config::from_vars(|n| (n == "HEDDLE_PROFILER_STALL_S").then(|| "0.5".into()));
        assert_eq!(stall.stall, Duration::from_millis(500));
        assert!(c.kernel == 0.0 && c.net);
        assert_eq!(c.kernel_window(), None);
        assert_eq!(c.activation_mask() & event::KERNEL_CH, 0);
    }

    #[test]
    fn kernel_share() {
        let with =
            |v: &str| Config::from_vars(|n| (n == "HEDDLE_PROFILER_KERNEL").then(|| v.to_string()));
        for (v, want) in [
            ("0", 0.0),
            ("off", 0.0),
            ("1", 1.0),
            (" on ", 1.0),
            ("0.25", 0.25),
            ("2", 0.1),
            ("-1", 0.1),
            ("NaN", 0.1),
            ("x", 0.1),
        ] {
            assert_eq!(with(v).kernel, want, "{v:?}");
        }
        assert_eq!(
            with("1").kernel_window(),
            None,
            "always on: nothing to switch"
        );
        assert_eq!(
            with("0.25").kernel_window(),
            Some(Duration::from_millis(1250))
        );
        assert_ne!(with("1").activation_mask() & event::KERNEL_CH, 0);
    }
}
