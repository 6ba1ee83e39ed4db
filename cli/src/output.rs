//! What every subcommand prints with `--json`.

use serde::Serialize;

/// Pretty JSON on stdout, for scripts.
pub fn print_json<T: Serialize>(v: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}
