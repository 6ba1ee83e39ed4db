//! heddle-fabric-oracle: a fabric model that answers `heddle investigate simulate`'s tests
//! (`serve`), and the fat trees to run it on (`topology`). docs/fabric.md.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use heddle_types::fabric::generate::{FatTree, fat_tree};
use heddle_types::fabric::index::Index;
use heddle_types::fabric::model::{Fault, Model};
use heddle_types::fabric::sim::{MAX_LINE_BYTES, ToOracle};
use heddle_types::fabric::{Fabric, MAX_FILE_BYTES};

#[derive(Parser)]
#[command(
    version,
    about = "A fabric model that answers the investigation planner's tests"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Answer rounds on stdin with results on stdout, one JSON object a line, until
    /// `{"done": true}` or the end of input.
    Serve {
        /// The fabric, a Heddle fabric file.
        #[arg(long)]
        topology: PathBuf,
        /// A fault: KIND:ID[:slow=F|:hang][:p=P], KIND one of node, nic, leaf, uplink,
        /// spine; e.g. nic:n0042/mlx5_3, uplink:leaf-su2-r0~spine-r0-0:p=0.33. Repeat it
        /// for several.
        #[arg(long = "fault")]
        faults: Vec<Fault>,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Relative standard deviation of a healthy test's bandwidth.
        #[arg(long, default_value_t = 0.03)]
        noise: f64,
    },
    /// Print a rail-optimized two-tier fat tree as a Heddle fabric file.
    Topology {
        #[arg(long)]
        nodes: usize,
        #[arg(long, default_value_t = 8)]
        rails: u32,
        #[arg(long, default_value_t = 32)]
        nodes_per_leaf: usize,
        #[arg(long, default_value_t = 1)]
        spines_per_rail: usize,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("heddle-fabric-oracle: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<(), String> {
    match cli.command {
        Cmd::Topology {
            nodes,
            rails,
            nodes_per_leaf,
            spines_per_rail,
        } => {
            if nodes == 0 || nodes > heddle_types::fabric::MAX_NODES || rails == 0 || rails > 64 {
                return Err("--nodes 1 to 200000 and --rails 1 to 64".into());
            }
            let f = fat_tree(&FatTree {
                nodes,
                rails,
                nodes_per_leaf,
                spines_per_rail,
            });
            println!("{}", serde_json::to_string(&f).map_err(|e| e.to_string())?);
            Ok(())
        }
        Cmd::Serve {
            topology,
            faults,
            seed,
            noise,
        } => {
            let bytes =
                std::fs::read(&topology).map_err(|e| format!("{}: {e}", topology.display()))?;
            if bytes.len() > MAX_FILE_BYTES {
                return Err(format!(
                    "{}: larger than {MAX_FILE_BYTES} bytes",
                    topology.display()
                ));
            }
            let fabric =
                Fabric::from_json(&bytes).map_err(|e| format!("{}:\n{e}", topology.display()))?;
            let ix = Index::new(&fabric);
            let mut model = Model::new(&ix, &faults, seed)?;
            model.noise = noise.clamp(0.0, 0.5);
            let stdin = std::io::stdin().lock();
            let mut out = std::io::stdout().lock();
            for line in stdin.split(b'\n') {
                let line = line.map_err(|e| e.to_string())?;
                if line.len() > MAX_LINE_BYTES {
                    return Err(format!("a line longer than {MAX_LINE_BYTES} bytes"));
                }
                let req = match serde_json::from_slice(&line) {
                    Ok(ToOracle::Done(_)) => break,
                    Ok(ToOracle::Round(req)) => req,
                    Err(e) => return Err(format!("not a round or the end: {e}")),
                };
                let res = model.answer(&req);
                let text = serde_json::to_string(&res).map_err(|e| e.to_string())?;
                writeln!(out, "{text}")
                    .and_then(|_| out.flush())
                    .map_err(|e| e.to_string())?;
            }
            Ok(())
        }
    }
}
