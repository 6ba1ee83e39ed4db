//! Parsers for UCX's own tools: `ucx_info -d` (which transports and devices UCX sees) and
//! `ucx_perftest` (the result table). Both formats are for humans, so the parsers are
//! tested against real captures under `agent/tests/captures/`.

use serde::Serialize;

/// One transport on one device, as `ucx_info -d` lists it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct UcxTransport {
    pub memory_domain: Option<String>,
    pub component: Option<String>,
    pub transport: String,
    pub device: String,
    /// `network`, `intra-node`, `loopback`... (newer UCX only).
    pub device_type: Option<String>,
    pub system_device: Option<String>,
    /// As printed, e.g. `11794.23 MB/sec` or `1131.64/ppn + 0.00 MB/sec`.
    pub bandwidth: Option<String>,
    pub latency: Option<String>,
}

/// Longest value kept of one `# key: value` line (UCX's own are under 40 characters):
/// the memory domain, component and transport are copied into every device below them,
/// so a long one would be copied once per line of a broken output. Longer keys are none
/// of UCX's.
const MAX_VALUE: usize = 64;
const MAX_KEY: usize = 32;

fn clipped(value: &str) -> String {
    let end = (0..=MAX_VALUE.min(value.len()))
        .rev()
        .find(|i| value.is_char_boundary(*i))
        .unwrap_or(0);
    value[..end].to_string()
}

/// `ucx_info -d`, old layout (blank `#` lines, lower-case `component`) or new.
pub fn parse_info_devices(text: &str) -> Vec<UcxTransport> {
    let mut out: Vec<UcxTransport> = Vec::new();
    let mut md: Option<String> = None;
    let mut component: Option<String> = None;
    let mut transport: Option<String> = None;
    for line in text.lines() {
        let Some(body) = line.strip_prefix('#') else {
            continue;
        };
        let Some((key, value)) = body.split_once(':') else {
            continue;
        };
        if key.len() > MAX_KEY {
            continue;
        }
        let (key, value) = (key.trim().to_ascii_lowercase(), clipped(value.trim()));
        match key.as_str() {
            "memory domain" => {
                md = Some(value);
                component = None;
                transport = None;
            }
            "component" => component = Some(value),
            "transport" => transport = Some(value),
            "device" => {
                if let Some(t) = &transport {
                    out.push(UcxTransport {
                        memory_domain: md.clone(),
                        component: component.clone(),
                        transport: t.clone(),
                        device: value,
                        ..Default::default()
                    });
                }
            }
            "type" => set_last(&mut out, |t| t.device_type = Some(value)),
            "system device" => set_last(&mut out, |t| t.system_device = Some(value)),
            "bandwidth" => set_last(&mut out, |t| t.bandwidth = Some(value)),
            "latency" => set_last(&mut out, |t| t.latency = Some(value)),
            _ => {}
        }
    }
    out
}

fn set_last(out: &mut [UcxTransport], f: impl FnOnce(&mut UcxTransport)) {
    if let Some(t) = out.last_mut() {
        f(t);
    }
}

/// `# Version 1.13.1` (ucx_info -v) or `# Library version: 1.x` (older).
pub fn parse_version(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let l = l.trim_start_matches('#').trim();
        l.strip_prefix("Library version:")
            .or_else(|| l.strip_prefix("Version"))
            .map(|v| v.trim().to_string())
    })
}

/// One line of the `ucx_perftest` table: a progress line or the `Final:` one.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PerfLine {
    pub is_final: bool,
    pub iterations: u64,
    /// Latency (latency tests) or send overhead (bandwidth tests), in µs.
    pub percentile_us: f64,
    pub average_us: f64,
    pub overall_us: f64,
    /// ucx_perftest's MB/s are MiB/s (2^20 bytes).
    pub bw_average_mbs: f64,
    pub bw_overall_mbs: f64,
    pub msgrate_average: f64,
    pub msgrate_overall: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PerfResult {
    /// `latency` or `overhead`, from the table header: what the µs columns mean.
    pub time_metric: String,
    pub lines: Vec<PerfLine>,
}

impl PerfResult {
    pub fn final_line(&self) -> Option<&PerfLine> {
        self.lines
            .iter()
            .rev()
            .find(|l| l.is_final)
            .or(self.lines.last())
    }
}

/// The client side's table; the server prints only the test description.
pub fn parse_perftest(text: &str) -> Result<PerfResult, String> {
    let mut metric = None;
    let mut lines = Vec::new();
    for raw in text.lines() {
        let l = raw.trim();
        if l.starts_with('|') {
            for m in ["latency", "overhead"] {
                if l.contains(&format!("{m} (usec)")) {
                    metric = Some(m.to_string());
                }
            }
            continue;
        }
        let (is_final, rest) = match l.strip_prefix("Final:") {
            Some(r) => (true, r),
            None => (false, l),
        };
        let nums: Vec<f64> = rest
            .split_whitespace()
            .map(|t| t.replace(',', "").parse::<f64>())
            .collect::<Result<_, _>>()
            .unwrap_or_default();
        if nums.len() != 8 {
            continue;
        }
        lines.push(PerfLine {
            is_final,
            iterations: nums[0] as u64,
            percentile_us: nums[1],
            average_us: nums[2],
            overall_us: nums[3],
            bw_average_mbs: nums[4],
            bw_overall_mbs: nums[5],
            msgrate_average: nums[6],
            msgrate_overall: nums[7],
        });
    }
    if lines.is_empty() {
        return Err("no result line in ucx_perftest output".into());
    }
    Ok(PerfResult {
        time_metric: metric.unwrap_or_else(|| "latency".into()),
        lines,
    })
}

/// The lanes UCX selected, from its info log's `ep_cfg[N]: tag(tcp/lo tcp/eth0)` lines
/// (`UCX_LOG_LEVEL=info`): every `transport/device` inside the parentheses, and the first
/// such line verbatim (from `ep_cfg` on).
pub fn parse_ep_cfg(text: &str) -> (std::collections::BTreeSet<String>, Option<String>) {
    let mut lanes = std::collections::BTreeSet::new();
    let mut first = None;
    for line in text.lines() {
        let Some(at) = line.find("ep_cfg[") else {
            continue;
        };
        let cfg = line[at..].trim();
        first.get_or_insert_with(|| cfg.to_string());
        let Some((_, rest)) = cfg.split_once("]:") else {
            continue;
        };
        for group in rest.split('(').skip(1) {
            let inside = group.split(')').next().unwrap_or("");
            for lane in inside.split_whitespace() {
                if lane.contains('/') {
                    lanes.insert(lane.trim_end_matches([',', ';']).to_string());
                }
            }
        }
    }
    (lanes, first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perftest_garbage_is_an_error_and_progress_lines_count() {
        assert!(parse_perftest("Waiting for connection...\n").is_err());
        let text = "|    Stage     | # iterations | 50.0%ile | average | overall |\n\
                    |   latency (usec)  |\n\
                    \x20                 1000      1.0     2.0     2.0   3.0   3.0   4   4\n\
                    Final:               2000      1.5     2.5     2.5   3.5   3.5   5   5\n";
        let r = parse_perftest(text).unwrap();
        assert_eq!(r.time_metric, "latency");
        assert_eq!(r.lines.len(), 2);
        assert!(!r.lines[0].is_final);
        assert_eq!(r.final_line().unwrap().iterations, 2000);
    }

    #[test]
    fn ep_cfg_lanes() {
        let (lanes, line) = parse_ep_cfg(
            "[1] [vm:1:0] ucp_worker.c:1763 UCX  INFO    ep_cfg[0]: tag(tcp/lo tcp/eth0)\n\
             [1] [vm:1:0] ucp_worker.c:1763 UCX  INFO    ep_cfg[1]: tag(self/memory rc_mlx5/mlx5_0:1); rma(rc_mlx5/mlx5_0:1)\n",
        );
        assert_eq!(
            lanes.into_iter().collect::<Vec<_>>(),
            ["rc_mlx5/mlx5_0:1", "self/memory", "tcp/eth0", "tcp/lo"]
        );
        assert_eq!(line.as_deref(), Some("ep_cfg[0]: tag(tcp/lo tcp/eth0)"));
        assert_eq!(parse_ep_cfg("Final: 1 2 3").0.len(), 0);
    }

    #[test]
    fn version_lines() {
        assert_eq!(
            parse_version("# Version 1.13.1\n# Git branch x").as_deref(),
            Some("1.13.1")
        );
        assert_eq!(
            parse_version("# Library version: 1.8.0\n").as_deref(),
            Some("1.8.0")
        );
        assert_eq!(parse_version("nothing"), None);
    }
}
