//! `heddle preflight`, `heddle health` and `heddle expectations`: "is this normal?".

use std::process::ExitCode;

use clap::Subcommand;
use heddle_types::health::{
    Expectation, ExpectationCreate, FleetHealth, NodeHealth, PreflightRequest, PreflightResponse,
    Reason, ResultVerdict, Verdict,
};

use crate::client::Client;
use crate::exit::Exit;
use crate::output::print_json;
use crate::progress::Progress;
use crate::table;

#[derive(Subcommand)]
pub enum ExpectationsCmd {
    /// Operator, plugin (with --node) and built-in expectations.
    Ls {
        #[arg(long)]
        test: Option<String>,
        /// Also list what this node's plugins expect.
        #[arg(long)]
        node: Option<String>,
    },
    /// Add an expectation: `test`'s `metric` should reach `value` (GB/s, or a ratio for
    /// rdma_speedup; at most, for time_us).
    Add {
        #[arg(long)]
        test: String,
        #[arg(long, default_value = "busbw_gbs")]
        metric: String,
        #[arg(long)]
        value: f64,
        /// Where the figure comes from (datasheet, acceptance test, measurement).
        #[arg(long)]
        source: String,
        #[arg(long)]
        min_size_bytes: Option<i64>,
        #[arg(long)]
        gpu_model: Option<String>,
        #[arg(long)]
        gpu_count: Option<i32>,
        #[arg(long)]
        world_size: Option<i32>,
        #[arg(long)]
        node: Option<String>,
    },
    Rm {
        id: uuid::Uuid,
    },
}

fn first_reason(reasons: &[Reason]) -> String {
    reasons
        .first()
        .map(|r| r.message.clone())
        .unwrap_or_default()
}

/// Exit code 0/1/2 for pass/fail/warn and 7 when the verdict is unknown; when none could
/// be had, the code of the error (3 unreachable, 4 refused token, 5 unknown nodes...).
pub async fn preflight(client: &Client, request: &PreflightRequest, json: bool) -> ExitCode {
    let waiting = match request.wait_s {
        Some(0) => "reading verdicts".to_string(),
        Some(s) => format!("checking stale nodes, up to {s} s"),
        None => "checking stale nodes".to_string(),
    };
    let spinner = Progress::spinner(
        json,
        &format!("preflight on {} node(s): {waiting}", request.nodes.len()),
    );
    let answer = client.post("/api/v1/preflight", request).await;
    spinner.finish();
    let answer: PreflightResponse = match answer {
        Ok(a) => a,
        Err(err) => {
            eprintln!("heddle: preflight could not decide: {err}");
            return Exit::of_client_error(&err).into();
        }
    };
    if json {
        if let Err(e) = print_json(&answer) {
            eprintln!("heddle: {e}");
        }
    } else {
        let mut t = table::new(&["NODE", "VERDICT", "FROM", "JUDGED", "REASON"]);
        for n in &answer.nodes {
            t.add_row(vec![
                n.node.clone(),
                n.verdict.to_string(),
                n.from.clone(),
                table::ago(n.judged_at),
                first_reason(&n.reasons),
            ]);
        }
        println!("{t}");
        println!(
            "preflight {}: {} ({} node(s))",
            answer.check.as_str(),
            answer.verdict.as_str().to_uppercase(),
            answer.nodes.len()
        );
    }
    Exit::of_verdict(answer.verdict).into()
}

pub async fn health(client: &Client, node: Option<String>, json: bool) -> anyhow::Result<ExitCode> {
    match node {
        Some(node) => {
            let h: NodeHealth = client
                .get(&format!(
                    "/api/v1/nodes/{}/health",
                    crate::client::encode(&node)
                ))
                .await?;
            if json {
                print_json(&h)?;
            } else {
                println!(
                    "{} ({}): {}",
                    h.hostname,
                    h.node_id,
                    h.verdict.as_str().to_uppercase()
                );
                let mut t = table::new(&["TEST", "VERDICT", "FIGURE", "JUDGED", "REASON"]);
                for x in &h.tests {
                    let figure = match (&x.metric, x.value) {
                        (Some(m), Some(v)) => format!("{v:.2} {m}"),
                        _ => String::new(),
                    };
                    t.add_row(vec![
                        x.test.clone(),
                        x.verdict.to_string(),
                        figure,
                        table::ago(Some(x.judged_at)),
                        first_reason(&x.reasons),
                    ]);
                }
                println!("{t}");
                for r in &h.reasons {
                    let code = r.code.as_deref().unwrap_or(&r.basis);
                    println!(
                        "{} {code}: {}",
                        format!("{:?}", r.severity).to_uppercase(),
                        r.message
                    );
                }
            }
        }
        None => {
            let f: FleetHealth = client.get("/api/v1/health").await?;
            if json {
                print_json(&f)?;
            } else {
                let mut t = table::new(&["NODE", "VERDICT", "GPU", "WARN/FAIL TESTS", "JUDGED"]);
                for n in &f.nodes {
                    t.add_row(vec![
                        n.hostname.clone(),
                        n.verdict.to_string(),
                        table::opt(&n.gpu_model),
                        n.failing.join(","),
                        table::ago(n.last_judged_at),
                    ]);
                }
                println!(
                    "{t}\n{} pass, {} warn, {} fail, {} unknown",
                    f.pass, f.warn, f.fail, f.unknown
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn expectations(client: &Client, cmd: ExpectationsCmd, json: bool) -> anyhow::Result<()> {
    match cmd {
        ExpectationsCmd::Ls { test, node } => {
            let q: Vec<String> = [("test", test), ("node", node)]
                .into_iter()
                .filter_map(|(k, v)| v.map(|v| format!("{k}={}", crate::client::encode(&v))))
                .collect();
            let q = if q.is_empty() {
                String::new()
            } else {
                format!("?{}", q.join("&"))
            };
            let list: Vec<Expectation> = client.get(&format!("/api/v1/expectations{q}")).await?;
            if json {
                return print_json(&list);
            }
            let mut t = table::new(&[
                "ORIGIN", "TEST", "METRIC", "≥ SIZE", "VALUE", "SCOPE", "SOURCE", "ID",
            ]);
            for e in &list {
                let scope: Vec<String> = [
                    e.gpu_model.clone().map(|m| format!("gpu={m}")),
                    e.gpu_count.map(|n| format!("gpus={n}")),
                    e.world_size.map(|n| format!("nodes={n}")),
                    e.node.clone().map(|n| format!("node={n}")),
                ]
                .into_iter()
                .flatten()
                .collect();
                t.add_row(vec![
                    e.origin.clone(),
                    e.test.clone(),
                    e.metric.clone(),
                    e.min_size_bytes.to_string(),
                    format!("{:.2}", e.value),
                    scope.join(" "),
                    e.source.clone(),
                    e.id.map(|i| i.to_string()).unwrap_or_default(),
                ]);
            }
            println!("{t}");
        }
        ExpectationsCmd::Add {
            test,
            metric,
            value,
            source,
            min_size_bytes,
            gpu_model,
            gpu_count,
            world_size,
            node,
        } => {
            let body = ExpectationCreate {
                test,
                metric,
                value,
                source,
                min_size_bytes,
                gpu_model,
                gpu_count,
                world_size,
                node,
            };
            let e: Expectation = client.post("/api/v1/expectations", &body).await?;
            if json {
                print_json(&e)?
            } else {
                println!("{}", e.id.map(|i| i.to_string()).unwrap_or_default())
            }
        }
        ExpectationsCmd::Rm { id } => {
            client.delete(&format!("/api/v1/expectations/{id}")).await?;
            println!("deleted expectation {id}");
        }
    }
    Ok(())
}

/// The verdict line and reasons under a result in `heddle runs show`.
pub fn print_verdict(v: Option<&ResultVerdict>) {
    let Some(v) = v else {
        println!("verdict: not judged");
        return;
    };
    let figure = match (&v.metric, v.value) {
        (Some(m), Some(x)) => format!(" — {x:.2} {m}"),
        _ => String::new(),
    };
    println!(
        "verdict: {} ({}{figure})",
        v.verdict.as_str().to_uppercase(),
        v.test
    );
    for r in &v.reasons {
        let code = r
            .code
            .as_deref()
            .map(|c| format!("{c}: "))
            .unwrap_or_default();
        println!("  [{:?}] {code}{} ({})", r.severity, r.message, r.basis);
        if let Some(e) = &r.evidence {
            println!("      evidence: {e}");
        }
    }
    if v.verdict == Verdict::Unknown && v.reasons.is_empty() {
        println!("  nothing to compare with");
    }
}
