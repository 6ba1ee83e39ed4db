use clap::{Parser, Subcommand};

/// Heddle node agent.
#[derive(Parser)]
#[command(name = "heddle-agent", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print this node's facts as JSON.
    Facts(heddle_agent::facts::FactsArgs),
    /// Run the detector plugins (built-in and --plugin files) on this node's facts, offline.
    Detect(heddle_agent::detect::DetectArgs),
    /// Run a command as one local rank: pinned to its GPU's CPUs and NUMA node, with the
    /// node's recommended environment and the rank's own HCA (`exec --local-rank 0 -- CMD`).
    Exec(heddle_agent::exec::ExecArgs),
    /// Enroll (once), then heartbeat, report facts, claim and run jobs, upload results.
    Run(Box<heddle_agent::lifecycle::RunArgs>),
    /// Slurm integration (`slurm task-prolog`: the node's and the task's rank's environment
    /// as TaskProlog `export` lines).
    Slurm(heddle_agent::slurm::SlurmArgs),
    /// Run a test from the shell, without a server (e.g. `bench nccl all_reduce -b 8 -e 8G -g 2`).
    Bench(heddle_agent::bench::BenchArgs),
    /// Judge a test's evidence against this node's facts (`check nccl-log FILE`).
    Check(heddle_agent::check::CheckArgs),
    /// Runs one test inside a child process of `run` (input on stdin, events on stdout).
    #[command(hide = true)]
    Child(heddle_agent::runner::ChildArgs),
}

fn main() -> std::process::ExitCode {
    heddle_agent::init_tracing();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Child(args) => return heddle_agent::runner::child_command(args),
        Command::Check(args) => {
            return heddle_agent::check::command(args).unwrap_or_else(|err| {
                eprintln!("heddle-agent: {err:#}");
                std::process::ExitCode::from(heddle_agent::exit::USAGE)
            });
        }
        Command::Facts(args) => heddle_agent::facts::command(args),
        Command::Detect(args) => heddle_agent::detect::command(args),
        Command::Exec(args) => heddle_agent::exec::command(args),
        Command::Run(args) => heddle_agent::lifecycle::command(*args),
        Command::Bench(args) => heddle_agent::bench::command(args),
        Command::Slurm(args) => heddle_agent::slurm::command(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("heddle-agent: {err:#}");
            // One table for every subcommand: heddle_agent::exit.
            std::process::ExitCode::from(heddle_agent::exit::code_of(&err))
        }
    }
}
