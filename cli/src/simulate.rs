//! `heddle investigate simulate`: the investigation planner against an oracle process,
//! offline, speaking the line protocol of `heddle_types::fabric::sim` on the oracle's
//! stdin and stdout.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, Stdio};

use anyhow::{Context, bail};
use heddle_types::fabric::index::Index;
use heddle_types::fabric::plan::{self, Config, Observation, Planner};
use heddle_types::fabric::sim::{Answer, Done, MAX_LINE_BYTES, RoundRequest, RoundResults};
use heddle_types::fabric::{self, Fabric};

use crate::exit::Exit;

pub struct Args<'a> {
    pub topology: &'a Path,
    pub suspects: &'a str,
    pub oracle: &'a str,
    pub evidence: Option<&'a Path>,
    pub config: Config,
}

/// An `--evidence` file: a JSON array of observed jobs.
pub fn read_evidence(path: &Path) -> anyhow::Result<Vec<Observation>> {
    let bytes = read_bounded(path)?;
    serde_json::from_slice(&bytes)
        .with_context(|| format!("{}: a JSON array of observed jobs", path.display()))
}

pub fn run(args: Args, json: bool) -> anyhow::Result<ExitCode> {
    let fabric = read_fabric(args.topology)?;
    let suspects = heddle_types::hostlist::expand_at_most(args.suspects, fabric::MAX_NODES)
        .map_err(|e| anyhow::anyhow!("--suspects: {e}"))?
        .0;
    let ix = Index::new(&fabric);
    let mut planner = Planner::new(&ix, &suspects, args.config).map_err(anyhow::Error::msg)?;
    if let Some(path) = args.evidence {
        let list = read_evidence(path)?;
        planner
            .observe(&list)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    }
    let mut oracle = Oracle::start(args.oracle)?;
    let answer = plan::run(&mut planner, &mut |req| {
        oracle.ask(req).map_err(|e| format!("{e:#}"))
    })
    .map_err(anyhow::Error::msg)?;
    oracle.finish()?;
    if json {
        println!("{}", serde_json::to_string(&answer)?);
    } else {
        print(&answer);
    }
    Ok(match (answer.conclusive, answer.blamed.is_empty()) {
        (false, _) => Exit::Undecided.into(),
        (true, true) => ExitCode::SUCCESS,
        (true, false) => Exit::Failed.into(),
    })
}

fn read_bounded(path: &Path) -> anyhow::Result<Vec<u8>> {
    let f = std::fs::File::open(path).with_context(|| format!("{}", path.display()))?;
    let mut bytes = Vec::new();
    f.take(fabric::MAX_FILE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() > fabric::MAX_FILE_BYTES {
        bail!(
            "{}: larger than {} bytes",
            path.display(),
            fabric::MAX_FILE_BYTES
        );
    }
    Ok(bytes)
}

pub fn read_fabric(path: &Path) -> anyhow::Result<Fabric> {
    let bytes = read_bounded(path)?;
    Fabric::from_json(&bytes).map_err(|e| anyhow::anyhow!("{}:\n{e}", path.display()))
}

fn print(a: &Answer) {
    if a.blamed.is_empty() {
        println!("nothing blamed");
    }
    for b in &a.blamed {
        println!(
            "{:?} {} (confidence {:.3})",
            b.component, b.id, b.confidence
        );
        for e in &b.evidence {
            println!("    {e}");
        }
    }
    if !a.candidates.is_empty() {
        println!("inconclusive between:");
        for b in &a.candidates {
            println!("    {:?} {} ({:.3})", b.component, b.id, b.confidence);
        }
    }
    for n in &a.notes {
        println!("note: {n}");
    }
    println!(
        "{} rounds, {} tests, {} node-seconds",
        a.rounds, a.tests, a.node_seconds
    );
}

struct Oracle {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Oracle {
    fn start(command: &str) -> anyhow::Result<Oracle> {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(command)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting the oracle {command:?}"))?;
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("stdout was piped"));
        Ok(Oracle {
            child,
            stdin,
            stdout,
        })
    }

    fn send(&mut self, line: &str) -> anyhow::Result<()> {
        let stdin = self
            .stdin
            .as_mut()
            .context("the oracle's stdin is closed")?;
        stdin.write_all(line.as_bytes())?;
        stdin.write_all(b"\n")?;
        stdin.flush().context("writing to the oracle")
    }

    fn ask(&mut self, req: &RoundRequest) -> anyhow::Result<RoundResults> {
        // An oracle that stopped reading may still have written something: read it first.
        let sent = self.send(&serde_json::to_string(req)?);
        let mut line = Vec::new();
        (&mut self.stdout)
            .take(MAX_LINE_BYTES as u64 + 1)
            .read_until(b'\n', &mut line)
            .context("reading the oracle's answer")?;
        if line.is_empty() {
            match sent {
                Err(e) => bail!(
                    "the oracle ended before answering round {} ({e:#})",
                    req.round
                ),
                Ok(()) => bail!("the oracle ended before answering round {}", req.round),
            }
        }
        if line.len() > MAX_LINE_BYTES {
            bail!(
                "the oracle's answer to round {} is longer than {MAX_LINE_BYTES} bytes",
                req.round
            );
        }
        serde_json::from_slice(&line).with_context(|| {
            let shown: String = String::from_utf8_lossy(&line).chars().take(200).collect();
            format!(
                "the oracle's answer to round {} is not results: {shown:?}",
                req.round
            )
        })
    }

    fn finish(mut self) -> anyhow::Result<()> {
        self.send(&serde_json::to_string(&Done { done: true })?)?;
        drop(self.stdin.take());
        let status = self.child.wait()?;
        if !status.success() {
            bail!("the oracle exited with {status}");
        }
        Ok(())
    }
}
