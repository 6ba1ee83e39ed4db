//! A run's params and a result's summary as people read them, for the dashboard's run page
//! (and anything else that prints them): each param the kind documents, in the catalogue's
//! order, with its unit (sizes in binary units), then any key the kind does not document as
//! given; a summary's fields one a line by name, nested values as compact JSON.

use serde_json::Value;

use super::find_kind;

/// One line: a name, its value as text, and what the kind says of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    pub name: String,
    pub value: String,
    pub help: Option<&'static str>,
}

/// `params` of a run of `kind`, documented keys first. Params that are not an object are
/// one line, `params`.
pub fn params(kind: &str, params: &Value) -> Vec<Line> {
    let Value::Object(map) = params else {
        return match params {
            Value::Null => Vec::new(),
            other => vec![Line {
                name: "params".into(),
                value: other.to_string(),
                help: None,
            }],
        };
    };
    let docs = find_kind(kind).map(|k| k.params).unwrap_or(&[]);
    let mut out = Vec::with_capacity(map.len());
    for doc in docs {
        if let Some(v) = map.get(doc.name) {
            out.push(Line {
                name: doc.name.to_string(),
                value: text(v, doc.unit),
                help: Some(doc.help),
            });
        }
    }
    for (k, v) in map {
        if !docs.iter().any(|d| d.name == k) {
            out.push(Line {
                name: k.clone(),
                value: text(v, None),
                help: None,
            });
        }
    }
    out
}

/// A result's `summary`, a line per field by name; `kind` is left out (the page says it
/// already).
pub fn summary(summary: &Value) -> Vec<Line> {
    match summary {
        Value::Null => Vec::new(),
        Value::Object(map) => map
            .iter()
            .filter(|(k, _)| k.as_str() != "kind")
            .map(|(k, v)| Line {
                name: k.clone(),
                value: text(v, None),
                help: None,
            })
            .collect(),
        other => vec![Line {
            name: "summary".into(),
            value: other.to_string(),
            help: None,
        }],
    }
}

fn text(v: &Value, unit: Option<&str>) -> String {
    match (v, unit) {
        (Value::Number(n), Some("bytes")) => match n.as_u64() {
            Some(b) => format!("{} ({b} bytes)", size(b)),
            None => n.to_string(),
        },
        (Value::Number(n), Some(u)) => format!("{n} {u}"),
        (Value::String(s), _) => s.clone(),
        (Value::Array(items), _) if items.iter().all(|i| !i.is_object() && !i.is_array()) => items
            .iter()
            .map(|i| text(i, unit))
            .collect::<Vec<_>>()
            .join(", "),
        (other, _) => other.to_string(),
    }
}

/// Sizes as nccl-tests people read them: 8 B, 64 KiB, 1 MiB, 8 GiB, 1.5 GiB.
pub fn size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn params_follow_the_catalogue_with_units_then_the_rest() {
        let lines = params(
            "nccl",
            &json!({"zzz": [1, 2], "max_bytes": 1073741824u64, "op": "all_gather", "iters": 5}),
        );
        let names: Vec<&str> = lines.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["op", "max_bytes", "iters", "zzz"], "{lines:?}");
        assert_eq!(lines[1].value, "1 GiB (1073741824 bytes)");
        assert_eq!(lines[2].value, "5 iterations");
        assert_eq!(lines[3].value, "1, 2");
        assert!(lines[0].help.is_some() && lines[3].help.is_none());
        // A kind this build does not know: every key as given.
        assert_eq!(
            params("future", &json!({"a": {"b": 1}}))[0].value,
            r#"{"b":1}"#
        );
        assert!(params("nccl", &Value::Null).is_empty());
        assert_eq!(params("nccl", &json!(3))[0].name, "params");
    }

    #[test]
    fn summaries_are_a_line_a_field() {
        let lines = summary(&json!({"kind": "nccl", "nccl": "2.28.3", "transport": "IB",
            "channels": 16, "hosts": ["a", "b"], "net": {"IB": 3}}));
        let shown: Vec<(String, String)> = lines.into_iter().map(|l| (l.name, l.value)).collect();
        assert_eq!(
            shown,
            [
                ("channels".into(), "16".into()),
                ("hosts".into(), "a, b".into()),
                ("nccl".into(), "2.28.3".into()),
                ("net".into(), r#"{"IB":3}"#.into()),
                ("transport".into(), "IB".into()),
            ]
        );
        assert_eq!(size(1536 << 20), "1.5 GiB");
    }
}
