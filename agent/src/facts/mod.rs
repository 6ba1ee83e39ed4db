//! Node fact collection from sysfs, NVML and verbs.

#[derive(Debug, clap::Args)]
pub struct FactsArgs {
    /// Filesystem root to read (a fixture tree in tests); NVML and verbs only when `/`.
    #[arg(long, default_value = "/")]
    pub root: std::path::PathBuf,
}

pub fn command(_args: FactsArgs) -> anyhow::Result<()> {
    anyhow::bail!("fact collection is not built yet")
}
