//! Enrollment, heartbeats, the job loop and the result spool.

#[derive(Debug, clap::Args)]
pub struct RunArgs {}

pub fn command(_args: RunArgs) -> anyhow::Result<()> {
    anyhow::bail!("the agent loop is not built yet")
}
