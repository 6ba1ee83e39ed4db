//! Read-only access to the node facts JSON by JSON pointer.
//!
//! Plugins address facts by path (`/host/dmi/product_name`) rather than through typed structs
//! so that a plugin built today keeps working when the agent adds fields tomorrow: unknown
//! fields are simply never looked at, and a missing one is `None`, not a parse failure.

use serde_json::Value;

use crate::PluginError;

#[derive(Debug, Clone)]
pub struct Facts {
    root: Value,
}

impl Facts {
    pub fn parse(json: &str) -> Result<Self, PluginError> {
        let root: Value = serde_json::from_str(json)
            .map_err(|e| PluginError::bad_facts(format!("facts are not valid JSON: {e}")))?;
        if !root.is_object() {
            return Err(PluginError::bad_facts("facts must be a JSON object"));
        }
        Ok(Self { root })
    }

    pub fn from_value(root: Value) -> Self {
        Self { root }
    }

    pub fn root(&self) -> &Value {
        &self.root
    }

    /// RFC 6901 pointer lookup (`/gpus/0/name`).
    pub fn get(&self, pointer: &str) -> Option<&Value> {
        self.root.pointer(pointer).filter(|v| !v.is_null())
    }

    /// A string, or a number/bool rendered as one (sysfs values arrive as either).
    pub fn str_at(&self, pointer: &str) -> Option<&str> {
        self.get(pointer).and_then(Value::as_str)
    }

    pub fn string_at(&self, pointer: &str) -> Option<String> {
        scalar_string(self.get(pointer)?)
    }

    pub fn u64_at(&self, pointer: &str) -> Option<u64> {
        as_u64(self.get(pointer)?)
    }

    /// The children of an array or object at `pointer` as (name, value) pairs. Arrays of
    /// objects are named by their `name` field (else their index), objects by their keys, so a
    /// plugin need not care which of the two the agent chose for a collection.
    pub fn entries(&self, pointer: &str) -> Vec<(String, &Value)> {
        self.get(pointer).map(entries).unwrap_or_default()
    }
}

/// See [`Facts::entries`]; usable on any nested value.
pub fn entries(value: &Value) -> Vec<(String, &Value)> {
    match value {
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let name = v.get("name").and_then(scalar_string).unwrap_or_else(|| i.to_string());
                (name, v)
            })
            .collect(),
        Value::Object(map) => map.iter().map(|(k, v)| (k.clone(), v)).collect(),
        _ => Vec::new(),
    }
}

/// A scalar as a string: strings as-is, numbers and booleans formatted.
pub fn scalar_string(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// An unsigned integer from a number or a decimal string.
pub fn as_u64(value: &Value) -> Option<u64> {
    match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rejects_non_objects() {
        assert_eq!(Facts::parse("[1]").unwrap_err().code, "bad-facts");
        assert_eq!(Facts::parse("{").unwrap_err().code, "bad-facts");
    }

    #[test]
    fn entries_from_arrays_and_maps_agree() {
        let a = Facts::from_value(json!({"d": [{"name": "mlx5_0", "x": 1}, {"x": 2}]}));
        let names: Vec<_> = a.entries("/d").into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["mlx5_0", "1"]);
        let m = Facts::from_value(json!({"d": {"mlx5_0": {"x": 1}}}));
        let (name, v) = &m.entries("/d")[0];
        assert_eq!(name, "mlx5_0");
        assert_eq!(v["x"], 1);
        assert!(m.entries("/missing").is_empty());
    }

    #[test]
    fn numbers_read_from_strings_too() {
        let f = Facts::from_value(json!({"a": "7", "b": 8, "c": null}));
        assert_eq!(f.u64_at("/a"), Some(7));
        assert_eq!(f.u64_at("/b"), Some(8));
        assert_eq!(f.string_at("/b").as_deref(), Some("8"));
        assert!(f.get("/c").is_none());
    }
}
