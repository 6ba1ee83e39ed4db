//! Argument parsers shared by the subcommands.

/// `KEY=VALUE`, as `--env` and `--param` take it.
pub fn key_value(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{s:?} is not KEY=VALUE"))
}
