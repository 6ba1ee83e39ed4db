//! Read-only access to the node facts JSON by JSON pointer.
//!
//! Plugins address facts by path (`/host/dmi/product_name`) rather than through typed structs
//! so that a plugin built today keeps working when the agent adds fields tomorrow: unknown
//! fields are simply never looked at, and a missing one is `None`, not a parse failure.

use crate::PluginError;
use crate::json::{Json, Tape};

/// The facts document: its text and a tape of its tokens ([`crate::json`]), so lookups
/// borrow from the text instead of building a tree.
#[derive(Debug, Clone)]
pub struct Facts {
    raw: String,
    tape: Tape,
}

impl Facts {
    pub fn parse(json: &str) -> Result<Self, PluginError> {
        Self::from_json(json.to_owned())
    }

    /// Like [`Facts::parse`], keeping `json` instead of copying it.
    pub fn from_json(json: String) -> Result<Self, PluginError> {
        let tape = Tape::parse(&json).map_err(|e| PluginError::bad_facts(format!("facts are not valid JSON: {e}")))?;
        let facts = Self { raw: json, tape };
        if !facts.root().is_object() {
            return Err(PluginError::bad_facts("facts must be a JSON object"));
        }
        Ok(facts)
    }

    /// The whole document.
    pub fn root(&self) -> Json<'_> {
        self.tape.root(&self.raw)
    }

    /// RFC 6901 pointer lookup (`/gpus/0/name`); `null` counts as missing.
    pub fn get(&self, pointer: &str) -> Option<Json<'_>> {
        self.root().pointer(pointer).filter(|v| !v.is_null())
    }

    pub fn str_at(&self, pointer: &str) -> Option<&str> {
        self.get(pointer).and_then(Json::as_str)
    }

    /// A string, or a number/bool rendered as one (sysfs values arrive as either).
    pub fn string_at(&self, pointer: &str) -> Option<String> {
        scalar_string(self.get(pointer)?)
    }

    /// An unsigned integer from a number or a decimal string.
    pub fn u64_at(&self, pointer: &str) -> Option<u64> {
        as_u64(self.get(pointer)?)
    }

    /// The children of an array or object at `pointer` as (name, value) pairs. Arrays of
    /// objects are named by their `name` field (else their index), objects by their keys, so a
    /// plugin need not care which of the two the agent chose for a collection.
    pub fn entries(&self, pointer: &str) -> Vec<(String, Json<'_>)> {
        self.get(pointer).map(entries).unwrap_or_default()
    }
}

/// What a host passes a plugin that declared `reads`: the subtrees at those JSON pointers, each
/// at its usual path; `*` stands for every element or member, any other step into an array
/// keeps the array whole. Mirrors the host's projection so native tests see what the plugin
/// will see.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn project(facts: &serde_json::Value, pointers: &[String]) -> serde_json::Value {
    use std::collections::BTreeMap;

    use serde_json::Value;

    enum Keep {
        All,
        Some(BTreeMap<String, Keep>),
        Each(Box<Keep>),
    }
    fn add(keep: &mut Keep, tokens: &[String]) {
        let Some((first, rest)) = tokens.split_first() else {
            *keep = Keep::All;
            return;
        };
        match keep {
            Keep::All => {}
            Keep::Each(each) if first == "*" => add(each, rest),
            Keep::Some(members) if first != "*" => add(members.entry(first.clone()).or_insert(Keep::Some(BTreeMap::new())), rest),
            Keep::Some(members) if members.is_empty() => {
                let mut each = Keep::Some(BTreeMap::new());
                add(&mut each, rest);
                *keep = Keep::Each(Box::new(each));
            }
            _ => *keep = Keep::All,
        }
    }
    fn finds(keep: &Keep, value: &Value) -> bool {
        match (keep, value) {
            (Keep::All | Keep::Each(_), _) => true,
            (Keep::Some(members), Value::Object(map)) => members.iter().any(|(n, k)| map.get(n).is_some_and(|v| finds(k, v))),
            (Keep::Some(members), Value::Array(items)) => members.iter().any(|(t, k)| {
                let index = (t == "0" || !t.starts_with('0')).then(|| t.parse::<usize>().ok()).flatten();
                index.and_then(|i| items.get(i)).is_some_and(|v| finds(k, v))
            }),
            (Keep::Some(_), _) => false,
        }
    }
    fn cut(value: &Value, keep: &Keep) -> Value {
        match (value, keep) {
            (Value::Object(map), Keep::Some(members)) => Value::Object(
                members
                    .iter()
                    .filter_map(|(name, k)| Some((name.clone(), cut(map.get(name).filter(|v| finds(k, v))?, k))))
                    .collect(),
            ),
            (Value::Object(map), Keep::Each(k)) => Value::Object(map.iter().map(|(n, v)| (n.clone(), cut(v, k))).collect()),
            (Value::Array(items), Keep::Each(k)) => Value::Array(items.iter().map(|v| cut(v, k)).collect()),
            (v, _) => v.clone(),
        }
    }

    let mut keep = Keep::Some(BTreeMap::new());
    for pointer in pointers {
        let tokens: Vec<String> = pointer.split('/').skip(1).map(|t| t.replace("~1", "/").replace("~0", "~")).collect();
        add(&mut keep, &tokens);
    }
    cut(facts, &keep)
}

/// See [`Facts::entries`]; usable on any nested value.
pub fn entries(value: Json<'_>) -> Vec<(String, Json<'_>)> {
    if let Some(items) = value.as_array() {
        items
            .enumerate()
            .map(|(i, v)| (v.get("name").and_then(scalar_string).unwrap_or_else(|| i.to_string()), v))
            .collect()
    } else if let Some(members) = value.as_object() {
        members.map(|(k, v)| (k.to_string(), v)).collect()
    } else {
        Vec::new()
    }
}

/// A scalar as a string: strings as-is, numbers and booleans formatted.
pub fn scalar_string(value: Json<'_>) -> Option<String> {
    if let Some(s) = value.as_str() {
        return Some(s.to_string());
    }
    (value.is_number() || value.as_bool().is_some()).then(|| value.raw().to_string())
}

/// An unsigned integer from a number or a decimal string.
pub fn as_u64(value: Json<'_>) -> Option<u64> {
    value.as_u64().or_else(|| value.as_str()?.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pointer_lookups() {
        let f = Facts::parse(r#"{"a": {"b": [7, {"c": "x"}]}, "d~/e": 2, "n": null}"#).unwrap();
        assert_eq!(f.get("/a/b/0").unwrap(), json!(7));
        assert_eq!(f.str_at("/a/b/1/c"), Some("x"));
        assert_eq!(f.get("/d~0~1e").unwrap(), json!(2));
        assert!(f.get("/n").is_none() && f.get("/zz").is_none() && f.get("nope").is_none());
        assert_eq!(f.get("").unwrap().get("a").unwrap().get("b").unwrap(), json!([7, {"c": "x"}]));
        let v = Facts::from_json(r#"{"a": {"b": 1}}"#.to_string()).unwrap();
        assert_eq!(v.u64_at("/a/b"), Some(1));
        assert_eq!(v.root(), json!({"a": {"b": 1}}));
    }

    /// The same cases as the host's projection test (plugins/host/src/facts.rs): native tests
    /// must see what a host would pass.
    #[test]
    fn projection_matches_the_hosts() {
        let facts = json!({
            "host": {"hostname": "n1", "dmi": {"sys_vendor": "Microsoft Corporation", "serial": "x"}},
            "rdma": {"devices": [{"name": "mlx5_0", "gids": [1]}]},
            "gpus": [{"index": 0, "uuid": "GPU-1"}],
            "a/b": {"c~d": 1},
        });
        let reads = |r: &[&str]| project(&facts, &r.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(reads(&["/host/dmi/sys_vendor", "/rdma"]), json!({
            "host": {"dmi": {"sys_vendor": "Microsoft Corporation"}},
            "rdma": {"devices": [{"name": "mlx5_0", "gids": [1]}]},
        }));
        assert_eq!(reads(&["/gpus/0/index"]), json!({"gpus": [{"index": 0, "uuid": "GPU-1"}]}), "arrays stay whole");
        assert_eq!(reads(&["/host/dmi", "/host/dmi/sys_vendor"])["host"]["dmi"]["serial"], "x");
        assert_eq!(reads(&["/missing", "/host/nothing", "/gpus/1/index", "/gpus/01"]), json!({}));
        assert_eq!(reads(&["/a~1b/c~0d"]), json!({"a/b": {"c~d": 1}}));
        assert_eq!(reads(&["/rdma/devices/*/name", "/gpus/*/index", "/gpus/*/missing"]), json!({
            "rdma": {"devices": [{"name": "mlx5_0"}]},
            "gpus": [{"index": 0}],
        }));
        assert_eq!(reads(&["/host/*/sys_vendor"]), json!({"host": {"hostname": "n1", "dmi": {"sys_vendor": "Microsoft Corporation"}}}));
        assert_eq!(reads(&["/gpus/*", "/gpus/*/index"]), json!({"gpus": [{"index": 0, "uuid": "GPU-1"}]}), "every GPU whole");
        assert_eq!(reads(&["/host/*/sys_vendor", "/host/hostname"])["host"]["dmi"]["serial"], "x", "`*` beside a name keeps it whole");
        assert_eq!(reads(&["/missing/*/x", "/host/hostname/*"]), json!({"host": {"hostname": "n1"}}));
    }

    #[test]
    fn rejects_non_objects() {
        assert_eq!(Facts::parse("[1]").unwrap_err().code, "bad-facts");
        assert_eq!(Facts::parse("{").unwrap_err().code, "bad-facts");
    }

    #[test]
    fn entries_from_arrays_and_maps_agree() {
        let a = Facts::parse(r#"{"d": [{"name": "mlx5_0", "x": 1}, {"x": 2}]}"#).unwrap();
        let names: Vec<_> = a.entries("/d").into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["mlx5_0", "1"]);
        let m = Facts::parse(r#"{"d": {"mlx5_0": {"x": 1}}}"#).unwrap();
        let (name, v) = &m.entries("/d")[0];
        assert_eq!(name, "mlx5_0");
        assert_eq!(v.get("x").unwrap(), json!(1));
        assert!(m.entries("/missing").is_empty());
    }

    #[test]
    fn numbers_read_from_strings_too() {
        let f = Facts::parse(r#"{"a": "7", "b": 8, "c": null, "d": true}"#).unwrap();
        assert_eq!(f.u64_at("/a"), Some(7));
        assert_eq!(f.u64_at("/b"), Some(8));
        assert_eq!(f.string_at("/b").as_deref(), Some("8"));
        assert_eq!(f.string_at("/d").as_deref(), Some("true"));
        assert!(f.get("/c").is_none());
    }
}
