//! `NAME=value` as people type it: one pair on a command line (the CLI's `--env` and
//! `--param`) or lines pasted into a form (the dashboard's run environment and env grids).
//!
//! This only splits, and refuses what cannot be a pair at all: text without `=`, nothing
//! before the `=`, or a name holding a control character. Which names and values a run may
//! use is [`crate::env_policy`]'s to say, where the server receives them; values are passed
//! on as typed (a `--param` value may be JSON over several lines).

use std::collections::BTreeMap;
use std::fmt;

/// Why a piece of text is not `NAME=value`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    NoEquals,
    NoName,
    ControlInName,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Refused::NoEquals => "expected NAME=value",
            Refused::NoName => "no name before '='",
            Refused::ControlInName => "a control character in the name",
        })
    }
}

/// `text` split at its first `=`, both sides as they are.
pub fn split(text: &str) -> Result<(&str, &str), Refused> {
    let (name, value) = text.split_once('=').ok_or(Refused::NoEquals)?;
    if name.is_empty() {
        return Err(Refused::NoName);
    }
    if name.chars().any(char::is_control) {
        return Err(Refused::ControlInName);
    }
    Ok((name, value))
}

/// One `KEY=VALUE` argument, as the CLI's `--env` and `--param` take it.
pub fn pair(s: &str) -> Result<(String, String), String> {
    match split(s) {
        Ok((k, v)) => Ok((k.to_string(), v.to_string())),
        Err(Refused::NoEquals) => Err(format!("{s:?} is not KEY=VALUE")),
        Err(e) => Err(format!("{s:?}: {e}")),
    }
}

/// `NAME=value` lines into a map; blank lines and `#` comments are skipped, and a leading
/// `export ` is accepted and quotes around a value are dropped, so a copied export block can
/// be pasted as is. A name given twice keeps its last value.
pub fn lines(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line).trim_start();
        let (k, v) = split(line).map_err(|e| format!("line {}: {e}, got {line:?}", i + 1))?;
        let v = v.trim().trim_matches('\'').trim_matches('"');
        out.insert(k.trim_end().to_string(), v.to_string());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pair_splits_at_its_first_equals() {
        assert_eq!(
            pair("NCCL_ALGO=Ring"),
            Ok(("NCCL_ALGO".into(), "Ring".into()))
        );
        assert_eq!(pair("grid=a=b"), Ok(("grid".into(), "a=b".into())));
        assert_eq!(pair("EMPTY="), Ok(("EMPTY".into(), String::new())));
        // A value is the server's to judge: JSON over lines, or a control character.
        assert_eq!(pair("g={\n}"), Ok(("g".into(), "{\n}".into())));
        assert_eq!(pair("X=a\u{1b}b"), Ok(("X".into(), "a\u{1b}b".into())));
    }

    #[test]
    fn a_pair_without_equals_or_name_is_refused() {
        assert_eq!(
            pair("NCCL_ALGO"),
            Err(r#""NCCL_ALGO" is not KEY=VALUE"#.into())
        );
        assert_eq!(pair(""), Err(r#""" is not KEY=VALUE"#.into()));
        assert_eq!(pair("=Ring"), Err(r#""=Ring": no name before '='"#.into()));
        assert_eq!(pair("="), Err(r#""=": no name before '='"#.into()));
    }

    #[test]
    fn control_characters_in_a_name_are_refused() {
        for s in [
            "A\nB=1",
            "A\rB=1",
            "\0=1",
            "A\u{1b}[2J=1",
            "A\u{7f}=1",
            "A\u{85}=1",
        ] {
            assert_eq!(split(s), Err(Refused::ControlInName), "{s:?}");
            assert!(pair(s).unwrap_err().contains("control character"), "{s:?}");
        }
    }

    #[test]
    fn lines_take_a_pasted_export_block() {
        let text = "# tuned\n\nexport NCCL_IB_HCA='mlx5_0'\n  NCCL_ALGO = \"Ring\"  \r\nexport  UCX_TLS=rc\nNCCL_ALGO=Tree\n";
        let env = lines(text).unwrap();
        assert_eq!(
            env,
            BTreeMap::from([
                ("NCCL_ALGO".to_string(), "Tree".to_string()),
                ("NCCL_IB_HCA".to_string(), "mlx5_0".to_string()),
                ("UCX_TLS".to_string(), "rc".to_string()),
            ])
        );
        assert_eq!(lines("").unwrap(), BTreeMap::new());
        assert_eq!(lines("\n  \n# only a comment\n").unwrap(), BTreeMap::new());
    }

    #[test]
    fn a_bad_line_is_named_by_its_number() {
        assert_eq!(
            lines("A=1\nNCCL_ALGO Ring\n"),
            Err(r#"line 2: expected NAME=value, got "NCCL_ALGO Ring""#.into())
        );
        assert_eq!(
            lines("=1"),
            Err(r#"line 1: no name before '=', got "=1""#.into())
        );
        assert_eq!(
            lines("export =1"),
            Err(r#"line 1: no name before '=', got "=1""#.into())
        );
        assert!(
            lines("A=1\nB\u{0}C=2")
                .unwrap_err()
                .starts_with("line 2: a control character")
        );
        assert!(
            lines("export")
                .unwrap_err()
                .starts_with("line 1: expected NAME=value")
        );
    }
}
