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
        let tape = Tape::parse(&json)
            .map_err(|e| PluginError::bad_facts(format!("facts are not valid JSON: {e}")))?;
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

/// See [`Facts::entries`]; usable on any nested value.
pub fn entries(value: Json<'_>) -> Vec<(String, Json<'_>)> {
    if let Some(items) = value.as_array() {
        items
            .enumerate()
            .map(|(i, v)| {
                (
                    v.get("name")
                        .and_then(scalar_string)
                        .unwrap_or_else(|| i.to_string()),
                    v,
                )
            })
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
    value
        .as_u64()
        .or_else(|| value.as_str()?.trim().parse().ok())
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
        assert_eq!(
            f.get("").unwrap().get("a").unwrap().get("b").unwrap(),
            json!([7, {"c": "x"}])
        );
        let v = Facts::from_json(r#"{"a": {"b": 1}}"#.to_string()).unwrap();
        assert_eq!(v.u64_at("/a/b"), Some(1));
        assert_eq!(v.root(), json!({"a": {"b": 1}}));
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
