//! Argument parsers shared by the subcommands.

pub use heddle_types::hostlist::{MAX_NODES, NodeList, expand as hostlist};

/// `KEY=VALUE`, as `--env` and `--param` take it (`heddle_types::env_input`, the dashboard's
/// parser too).
pub fn key_value(s: &str) -> Result<(String, String), String> {
    heddle_types::env_input::pair(s)
}

/// A duration flag the API takes in whole seconds: `3600`, `90s`, `30m`, `1h`, `2d`.
pub fn seconds(s: &str) -> Result<u32, String> {
    heddle_types::duration::whole_seconds(s)
}

/// A duration the API takes in whole hours (`expires_in_hours`): `2h`, `1d`.
pub fn hours(s: &str) -> Result<u32, String> {
    whole_units(s, 3600, "hours, e.g. 2h or 1d")
}

/// A duration the API takes in whole days (`expires_in_days`): `30d`, `12w`.
pub fn days(s: &str) -> Result<u32, String> {
    whole_units(s, 86_400, "days, e.g. 30d or 12w")
}

fn whole_units(s: &str, unit: u64, what: &str) -> Result<u32, String> {
    let d = heddle_types::duration::parse(s)?;
    if d.subsec_nanos() != 0 || d.as_secs() % unit != 0 {
        return Err(format!("{s:?}: give whole {what}"));
    }
    u32::try_from(d.as_secs() / unit).map_err(|_| format!("{s:?} is too long"))
}

/// `--param`s as the JSON object of a request: each value parsed as JSON when it parses
/// (`max_bytes=1048576` is a number), else kept as a string (`op=all_gather`).
pub fn params(pairs: Vec<(String, String)>) -> serde_json::Value {
    pairs
        .into_iter()
        .map(|(k, v)| {
            let value = serde_json::from_str(&v).unwrap_or(serde_json::Value::String(v));
            (k, value)
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// The names of every `--nodes`, in order; more than [`MAX_NODES`] in all is refused.
pub fn nodes(lists: Vec<NodeList>) -> Result<Vec<String>, crate::exit::UsageError> {
    let names: Vec<String> = lists.into_iter().flat_map(|l| l.0).collect();
    if names.len() > MAX_NODES {
        return Err(crate::exit::UsageError(format!(
            "--nodes names {} nodes; at most {MAX_NODES}",
            names.len()
        )));
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_are_json_when_they_parse() {
        let p = params(vec![
            ("max_bytes".into(), "1048576".into()),
            ("op".into(), "all_gather".into()),
            ("grid".into(), r#"{"NCCL_PROTO":["LL"]}"#.into()),
        ]);
        assert_eq!(
            p,
            serde_json::json!({"max_bytes": 1048576, "op": "all_gather",
                "grid": {"NCCL_PROTO": ["LL"]}})
        );
    }

    #[test]
    fn repeated_node_flags_add_up_under_the_cap() {
        let a = hostlist("a,b[1-2]").unwrap();
        let b = hostlist("c").unwrap();
        assert_eq!(nodes(vec![a, b]).unwrap(), ["a", "b1", "b2", "c"]);
        let big = hostlist(&format!("n[1-{MAX_NODES}]")).unwrap();
        let err = nodes(vec![big, hostlist("one-more").unwrap()]).unwrap_err();
        assert!(err.0.contains("at most"), "{}", err.0);
    }

    #[test]
    fn durations_use_the_shared_parser() {
        assert_eq!(seconds("3600"), Ok(3600));
        assert_eq!(seconds("2m"), Ok(120));
        assert!(seconds("soon").is_err());
        assert_eq!(hours("2h"), Ok(2));
        assert_eq!(hours("1d"), Ok(24));
        assert!(hours("90m").unwrap_err().contains("whole hours"));
        // A bare number is seconds, never hours: refused rather than misread.
        assert!(hours("2").unwrap_err().contains("whole hours"));
        assert_eq!(days("30d"), Ok(30));
        assert_eq!(days("2w"), Ok(14));
        assert!(days("36h").unwrap_err().contains("whole days"));
    }
}
