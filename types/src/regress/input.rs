//! The offline detector's input: JSON lines `{"series": "<id>", "t": "<RFC 3339>", "value":
//! <number>}`, read as untrusted text with every bound checked and every error naming its
//! line.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Deserialize;

/// The largest input accepted, in bytes.
pub const MAX_INPUT_BYTES: usize = 64 << 20;
/// The most distinct series in one input.
pub const MAX_SERIES: usize = 100_000;
/// The longest series id.
pub const MAX_SERIES_ID: usize = 256;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    series: String,
    t: DateTime<Utc>,
    value: f64,
}

/// Why the input was refused; `line` is 1-based.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InputError {
    TooLarge(usize),
    Line { line: usize, message: String },
    TooManySeries,
}

impl std::fmt::Display for InputError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InputError::TooLarge(n) => {
                write!(
                    f,
                    "the input is {n} bytes; at most {MAX_INPUT_BYTES} are read"
                )
            }
            InputError::Line { line, message } => write!(f, "line {line}: {message}"),
            InputError::TooManySeries => write!(f, "more than {MAX_SERIES} series"),
        }
    }
}

impl std::error::Error for InputError {}

/// Points by series id, each series sorted by time (stable, so equal times keep the
/// input's order). Blank lines are skipped.
pub type Series = BTreeMap<String, Vec<(DateTime<Utc>, f64)>>;

pub fn parse(text: &str) -> Result<Series, InputError> {
    if text.len() > MAX_INPUT_BYTES {
        return Err(InputError::TooLarge(text.len()));
    }
    let mut out = Series::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let err = |message: String| InputError::Line { line, message };
        if raw.trim().is_empty() {
            continue;
        }
        // serde's own position counts within the line: say the column only.
        let l: Line = serde_json::from_str(raw)
            .map_err(|e| err(e.to_string().replace(" at line 1 column ", " at column ")))?;
        if l.series.is_empty() || l.series.len() > MAX_SERIES_ID {
            return Err(err(format!(
                "series must be 1 to {MAX_SERIES_ID} bytes long"
            )));
        }
        if l.series.chars().any(char::is_control) {
            return Err(err("series contains a control character".into()));
        }
        if !l.value.is_finite() {
            return Err(err("value must be a finite number".into()));
        }
        if !out.contains_key(&l.series) && out.len() >= MAX_SERIES {
            return Err(InputError::TooManySeries);
        }
        out.entry(l.series).or_default().push((l.t, l.value));
    }
    for points in out.values_mut() {
        points.sort_by_key(|p| p.0);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_series_sorted_by_time() {
        let text = r#"{"series":"a","t":"2026-01-02T00:00:00Z","value":2}

{"series":"a","t":"2026-01-01T00:00:00Z","value":1.5}
{"series":"b","t":"2026-01-01T00:00:00+02:00","value":3}"#;
        let s = parse(text).unwrap();
        assert_eq!(s["a"].iter().map(|p| p.1).collect::<Vec<_>>(), [1.5, 2.0]);
        assert_eq!(s["b"][0].0.to_rfc3339(), "2025-12-31T22:00:00+00:00");
    }

    #[test]
    fn errors_name_the_line() {
        let ok = r#"{"series":"a","t":"2026-01-01T00:00:00Z","value":1}"#;
        for (bad, says) in [
            (
                r#"{"series":"a","t":"yesterday","value":1}"#,
                "input contains invalid characters",
            ),
            (
                r#"{"series":"a","t":"2026-01-01T00:00:00Z","value":"1"}"#,
                "invalid type",
            ),
            (
                r#"{"series":"a","t":"2026-01-01T00:00:00Z"}"#,
                "missing field `value`",
            ),
            (
                r#"{"series":"","t":"2026-01-01T00:00:00Z","value":1}"#,
                "series must be",
            ),
            (
                r#"{"series":"a\u0007","t":"2026-01-01T00:00:00Z","value":1}"#,
                "control character",
            ),
            (
                r#"{"series":"a","t":"2026-01-01T00:00:00Z","value":1,"x":2}"#,
                "unknown field",
            ),
            (
                r#"{"series":"a","t":"2026-01-01T00:00:00Z","value":1e999}"#,
                "line 2",
            ),
            ("not json", "expected ident"),
        ] {
            let e = parse(&format!("{ok}\n{bad}\n")).unwrap_err().to_string();
            assert!(e.starts_with("line 2: ") && e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn too_large_input_is_refused_before_reading() {
        let big = " ".repeat(MAX_INPUT_BYTES + 1);
        assert_eq!(parse(&big), Err(InputError::TooLarge(MAX_INPUT_BYTES + 1)));
    }
}
