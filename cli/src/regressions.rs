//! `heddle regressions`: level shifts of nodes' figures over time. `ls` asks the server;
//! `detect`, `generate` and `score` run the same detector offline on JSON lines
//! (`heddle_types::regress`).

use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use heddle_types::regress::{self, Config, DetectOutput, Regression, detect, input, synth};

use crate::client::{Client, query};
use crate::exit::UsageError;
use crate::output::print_json;
use crate::table;

#[derive(Subcommand)]
pub enum RegressionsCmd {
    /// Open regressions, newest first: figures that moved for the worse and stayed.
    Ls {
        /// Only this node (id or hostname).
        #[arg(long)]
        node: Option<String>,
        /// Only changes at or after this time: RFC 3339, or an age (`7d`, `12h`).
        #[arg(long)]
        since: Option<String>,
        /// Only this test kind (`nccl`) or test (`nccl.all_reduce`).
        #[arg(long)]
        kind: Option<String>,
        /// Also improvements and changes a later one superseded.
        #[arg(long)]
        all: bool,
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Find level shifts in JSON lines `{"series", "t", "value"}` (a file, or `-` for
    /// stdin), without a server.
    Detect {
        #[arg(long)]
        input: PathBuf,
        #[command(flatten)]
        tuning: Tuning,
    },
    /// Write synthetic daily series with known steps and outliers (the detector's test
    /// bench): the series as JSON lines to `--out`, what was injected to `--truth`.
    Generate {
        #[arg(long, default_value_t = 1000)]
        series: usize,
        #[arg(long, default_value_t = 90)]
        points: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[arg(long)]
        out: PathBuf,
        #[arg(long)]
        truth: PathBuf,
    },
    /// Run the detector on generated series and score it against their truth: recall of
    /// steps within 2 points of their time, false alarms, outliers that raised nothing.
    Score {
        #[arg(long)]
        input: PathBuf,
        #[arg(long)]
        truth: PathBuf,
        #[command(flatten)]
        tuning: Tuning,
    },
}

/// The detector's knobs (docs/health.md, "Regressions").
#[derive(Args)]
pub struct Tuning {
    /// The smallest relative change reported.
    #[arg(long, default_value_t = regress::detect::DEFAULT_MIN_EFFECT)]
    min_effect: f64,
    /// Points needed on each side of a change.
    #[arg(long, default_value_t = regress::detect::DEFAULT_MIN_POINTS)]
    min_points: usize,
    /// PELT's price of a change, in noise units per ln(points).
    #[arg(long, default_value_t = regress::detect::DEFAULT_PENALTY)]
    penalty: f64,
}

impl Tuning {
    fn config(&self) -> anyhow::Result<Config> {
        if !(0.0..1.0).contains(&self.min_effect) {
            return Err(UsageError("--min-effect must be in [0, 1)".into()).into());
        }
        if !(1..=100).contains(&self.min_points) {
            return Err(UsageError("--min-points must be 1 to 100".into()).into());
        }
        if !(self.penalty.is_finite() && self.penalty > 0.0) {
            return Err(UsageError("--penalty must be a positive number".into()).into());
        }
        Ok(Config {
            min_effect: self.min_effect,
            min_points: self.min_points,
            penalty: self.penalty,
        })
    }
}

/// Whether the command needs no server.
pub fn is_offline(cmd: &RegressionsCmd) -> bool {
    !matches!(cmd, RegressionsCmd::Ls { .. })
}

/// Reads at most [`input::MAX_INPUT_BYTES`] (and one more, to tell that it was more).
fn read_bounded(path: &Path) -> anyhow::Result<String> {
    let limit = input::MAX_INPUT_BYTES as u64 + 1;
    let mut text = String::new();
    let read = if path == Path::new("-") {
        std::io::stdin().take(limit).read_to_string(&mut text)
    } else {
        std::fs::File::open(path)
            .with_context(|| format!("cannot open {}", path.display()))?
            .take(limit)
            .read_to_string(&mut text)
    };
    read.with_context(|| format!("cannot read {} as UTF-8 text", path.display()))?;
    Ok(text)
}

fn parse_input(path: &Path) -> anyhow::Result<input::Series> {
    let text = read_bounded(path)?;
    input::parse(&text).map_err(|e| UsageError(format!("{}: {e}", path.display())).into())
}

pub fn offline(cmd: RegressionsCmd, json: bool) -> anyhow::Result<ExitCode> {
    match cmd {
        RegressionsCmd::Detect { input, tuning } => {
            let series = parse_input(&input)?;
            let change_points = regress::detect_all(&series, &tuning.config()?);
            if json {
                print_json(&DetectOutput { change_points })?;
            } else {
                let mut t = table::new(&["SERIES", "T", "BEFORE", "AFTER", "CHANGE", "95 % CI"]);
                for c in &change_points {
                    t.add_row(vec![
                        c.series.clone(),
                        c.t.to_rfc3339(),
                        format!("{:.3}", c.before),
                        format!("{:.3}", c.after),
                        pct(c.relative_change),
                        format!("{} to {}", pct(c.ci_low), pct(c.ci_high)),
                    ]);
                }
                println!(
                    "{t}\n{} change point(s) in {} series",
                    change_points.len(),
                    series.len()
                );
            }
        }
        RegressionsCmd::Generate {
            series,
            points,
            seed,
            out,
            truth,
        } => {
            if series == 0
                || series > input::MAX_SERIES
                || !(1..=detect::MAX_POINTS).contains(&points)
            {
                return Err(UsageError(format!(
                    "--series must be 1 to {}, --points 1 to {}",
                    input::MAX_SERIES,
                    detect::MAX_POINTS
                ))
                .into());
            }
            let spec = synth::Spec {
                series,
                points,
                seed,
                ..synth::Spec::default()
            };
            let (lines, injected) = synth::generate(&spec);
            write_lines(&out, &lines)?;
            write_lines(&truth, &injected)?;
            if !json {
                println!(
                    "{} points in {series} series to {}; {} injected steps and outliers to {}",
                    lines.len(),
                    out.display(),
                    injected.len(),
                    truth.display()
                );
            }
        }
        RegressionsCmd::Score {
            input,
            truth,
            tuning,
        } => {
            let series = parse_input(&input)?;
            let found = regress::detect_all(&series, &tuning.config()?);
            let text = read_bounded(&truth)?;
            let mut injected = Vec::new();
            for (i, line) in text
                .lines()
                .enumerate()
                .filter(|(_, l)| !l.trim().is_empty())
            {
                let t: synth::Truth = serde_json::from_str(line)
                    .map_err(|e| UsageError(format!("{}: line {}: {e}", truth.display(), i + 1)))?;
                injected.push(t);
            }
            let score = synth::score(&injected, &found, series.len());
            if json {
                print_json(&score)?;
            } else {
                println!(
                    "steps of 5-15 %: {} of {} found within {} points ({:.1} %)\n\
                     steps of 3-5 %:  {} of {} found ({:.1} %)\n\
                     false alarms:    {} in {} series ({:.2} per 100 series)\n\
                     outliers:        {} of {} raised nothing\n\
                     size error:      {:.2} percentage points (mean, found steps)",
                    score.found_5_to_15,
                    score.steps_5_to_15,
                    score.tolerance_days,
                    score.recall_5_to_15 * 100.0,
                    score.found_3_to_5,
                    score.steps_3_to_5,
                    score.recall_3_to_5 * 100.0,
                    score.false_alarms,
                    score.series,
                    score.false_alarms_per_100_series,
                    score.outliers_silent,
                    score.outliers,
                    score.mean_abs_size_error_pp,
                );
            }
        }
        RegressionsCmd::Ls { .. } => unreachable!("asks the server"),
    }
    Ok(ExitCode::SUCCESS)
}

fn write_lines<T: serde::Serialize>(path: &Path, items: &[T]) -> anyhow::Result<()> {
    let file =
        std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let mut w = BufWriter::new(file);
    for item in items {
        serde_json::to_writer(&mut w, item)?;
        w.write_all(b"\n")?;
    }
    w.flush()
        .with_context(|| format!("cannot write {}", path.display()))
}

fn pct(v: f64) -> String {
    format!("{:+.1} %", v * 100.0)
}

/// The TEST column: test and metric, and the GPU pair of a per-pair series.
fn series(r: &Regression) -> String {
    match &r.pair {
        Some(pair) => format!("{} {} pair {pair}", r.test, r.metric),
        None => format!("{} {}", r.test, r.metric),
    }
}

/// `--since`: an RFC 3339 time, or an age before now.
fn since(text: &str) -> anyhow::Result<String> {
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(text) {
        return Ok(t.with_timezone(&chrono::Utc).to_rfc3339());
    }
    let age = heddle_types::duration::parse(text)
        .map_err(|e| UsageError(format!("--since: an RFC 3339 time or an age (7d): {e}")))?;
    let age =
        chrono::Duration::from_std(age).map_err(|_| UsageError("--since: too long ago".into()))?;
    Ok((chrono::Utc::now() - age).to_rfc3339())
}

pub async fn run(client: &Client, cmd: RegressionsCmd, json: bool) -> anyhow::Result<ExitCode> {
    let (node, since_arg, kind, all, limit) = match cmd {
        RegressionsCmd::Ls {
            node,
            since,
            kind,
            all,
            limit,
        } => (node, since, kind, all, limit),
        other => return offline(other, json),
    };
    let since = since_arg.as_deref().map(since).transpose()?;
    let q = query(&[
        ("node", &node),
        ("since", &since),
        ("kind", &kind),
        ("all", &all.then(|| "true".to_string())),
        ("limit", &Some(limit.to_string())),
    ]);
    let found: Vec<Regression> = client.get(&format!("/api/v1/regressions{q}")).await?;
    if json {
        print_json(&found)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut t = table::new(&[
        "NODE", "TEST", "BAND", "WHEN", "BEFORE", "AFTER", "CHANGE", "WHY",
    ]);
    for r in &found {
        let why: Vec<String> = r
            .facts_changes
            .iter()
            .map(|c| {
                format!(
                    "{}: {} → {}",
                    c.field,
                    c.before.as_deref().unwrap_or("-"),
                    c.after.as_deref().unwrap_or("-")
                )
            })
            .collect();
        t.add_row(vec![
            r.hostname.clone(),
            series(r),
            format!("2^{}", r.size_band),
            r.t.format("%Y-%m-%d %H:%M").to_string(),
            format!("{:.2}", r.before),
            format!("{:.2}", r.after),
            format!(
                "{} ({} to {})",
                pct(r.relative_change),
                pct(r.ci_low),
                pct(r.ci_high)
            ),
            why.join("; "),
        ]);
    }
    println!("{t}");
    for r in &found {
        println!("- {}", r.summary);
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_test_column_names_the_pair_of_a_per_pair_series() {
        let mut r: Regression = serde_json::from_value(serde_json::json!({
            "id": "00000000-0000-0000-0000-000000000001",
            "node_id": "00000000-0000-0000-0000-000000000002",
            "hostname": "g1", "test": "p2p.d2d", "metric": "algbw_gbs", "size_band": 28,
            "world_size": 1, "t": "2026-11-14T16:21:00Z", "before": 370.0, "after": 333.0,
            "relative_change": -0.1, "ci_low": -0.11, "ci_high": -0.09, "points_before": 10,
            "points_after": 10, "worse": true, "open": true, "facts_changes": [],
            "fleet": {"compared": 1, "moved": 1, "moved_nodes": ["g1"], "moved_low": -0.1,
                      "moved_high": -0.1, "shared": []},
            "summary": "", "detected_at": "2026-11-14T16:21:00Z"
        }))
        .unwrap();
        assert_eq!(series(&r), "p2p.d2d algbw_gbs");
        r.pair = Some("0-1".into());
        assert_eq!(series(&r), "p2p.d2d algbw_gbs pair 0-1");
    }
}
