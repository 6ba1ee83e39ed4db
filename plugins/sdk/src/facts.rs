//! Read-only access to the node facts JSON by JSON pointer.
//!
//! Plugins address facts by path (`/host/dmi/product_name`) rather than through typed structs
//! so that a plugin built today keeps working when the agent adds fields tomorrow: unknown
//! fields are simply never looked at, and a missing one is `None`, not a parse failure.

use std::cell::OnceCell;
use std::ops::Range;

use serde_json::Value;

use crate::PluginError;

/// The facts document, parsed lazily. `parse` only finds where each top-level section
/// (`host`, `gpus`, `rdma`, ...) starts and ends; a section becomes a [`Value`] the first time
/// a lookup reaches into it. Most plugins decide from one or two sections whether they apply
/// to a node at all, so they never pay for building the rest of the tree.
#[derive(Debug, Clone)]
pub struct Facts {
    raw: String,
    sections: Vec<Section>,
    /// The whole document, built only for [`Facts::root`].
    root: OnceCell<Value>,
}

#[derive(Debug, Clone)]
struct Section {
    name: String,
    span: Range<usize>,
    value: OnceCell<Value>,
}

impl Facts {
    pub fn parse(json: &str) -> Result<Self, PluginError> {
        let sections = scan::top_level(json)?
            .into_iter()
            .map(|(name, span)| Section { name, span, value: OnceCell::new() })
            .collect();
        Ok(Self { raw: json.to_owned(), sections, root: OnceCell::new() })
    }

    pub fn from_value(root: Value) -> Self {
        let sections = match &root {
            Value::Object(map) => map
                .iter()
                .map(|(name, v)| Section { name: name.clone(), span: 0..0, value: OnceCell::from(v.clone()) })
                .collect(),
            _ => Vec::new(),
        };
        Self { raw: String::new(), sections, root: OnceCell::from(root) }
    }

    /// The whole document as one tree (builds every section).
    pub fn root(&self) -> &Value {
        self.root.get_or_init(|| {
            Value::Object(self.sections.iter().map(|s| (s.name.clone(), self.section(s).clone())).collect())
        })
    }

    fn section<'a>(&'a self, s: &'a Section) -> &'a Value {
        // The span came out of a successful parse, so it is valid JSON.
        s.value.get_or_init(|| serde_json::from_str(&self.raw[s.span.clone()]).unwrap_or(Value::Null))
    }

    /// RFC 6901 pointer lookup (`/gpus/0/name`).
    pub fn get(&self, pointer: &str) -> Option<&Value> {
        let Some(path) = pointer.strip_prefix('/') else {
            return if pointer.is_empty() { Some(self.root()) } else { None };
        };
        let (first, rest) = path.find('/').map_or((path, ""), |i| (&path[..i], &path[i..]));
        let first = first.replace("~1", "/").replace("~0", "~");
        // The last of duplicate keys wins, as in a parsed `Value`.
        let section = self.sections.iter().rev().find(|s| s.name == first)?;
        self.section(section).pointer(rest).filter(|v| !v.is_null())
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

/// What a host passes a plugin that declared `reads`: the subtrees at those JSON pointers, each
/// at its usual path (elements of arrays are kept whole). Mirrors the host's projection so
/// native tests see what the plugin will see.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn project(facts: &Value, pointers: &[String]) -> Value {
    let mut out = Value::Object(serde_json::Map::new());
    for pointer in pointers.iter().filter(|p| facts.pointer(p).is_some()) {
        let (mut slot, mut source) = (&mut out, facts);
        let tokens: Vec<String> = pointer.split('/').skip(1).map(|t| t.replace("~1", "/").replace("~0", "~")).collect();
        for (i, token) in tokens.iter().enumerate() {
            let (Value::Object(map), Value::Object(dst)) = (source, slot) else { break };
            source = &map[token.as_str()];
            if i + 1 == tokens.len() || source.is_array() {
                dst.insert(token.clone(), source.clone());
                break;
            }
            slot = dst.entry(token.clone()).or_insert_with(|| Value::Object(serde_json::Map::new()));
        }
    }
    out
}

/// Finds the top-level members of a JSON object without building anything: the one pass every
/// call pays, so it only tracks strings and brackets. Sections are validated by `serde_json`
/// when they are built; the host hands plugins only documents it has already checked.
mod scan {
    use std::ops::Range;

    use crate::PluginError;

    fn bad(at: usize, what: &str) -> PluginError {
        PluginError::bad_facts(format!("facts are not valid JSON: {what} at byte {at}"))
    }

    fn skip_ws(b: &[u8], mut i: usize) -> usize {
        while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | b'\r') {
            i += 1;
        }
        i
    }

    /// `i` is at an opening quote; returns the index just past the closing one.
    fn skip_string(b: &[u8], mut i: usize) -> Result<usize, PluginError> {
        let start = i;
        i += 1;
        while i < b.len() {
            match b[i] {
                b'"' => return Ok(i + 1),
                b'\\' => i += 2,
                _ => i += 1,
            }
        }
        Err(bad(start, "unterminated string"))
    }

    /// `i` is at the first byte of a value; returns the index just past it.
    fn skip_value(b: &[u8], mut i: usize) -> Result<usize, PluginError> {
        let start = i;
        match b.get(i) {
            Some(b'"') => skip_string(b, i),
            Some(b'{' | b'[') => {
                let mut depth = 0usize;
                while i < b.len() {
                    match b[i] {
                        b'"' => {
                            i = skip_string(b, i)?;
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth -= 1;
                            if depth == 0 {
                                return Ok(i + 1);
                            }
                        }
                        _ => {}
                    }
                    i += 1;
                }
                Err(bad(start, "unclosed object or array"))
            }
            Some(_) => {
                while i < b.len() && !matches!(b[i], b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r') {
                    i += 1;
                }
                if i == start { Err(bad(start, "expected a value")) } else { Ok(i) }
            }
            None => Err(bad(start, "expected a value")),
        }
    }

    /// (name, span of the value) of every member of the top-level object, in order.
    pub fn top_level(json: &str) -> Result<Vec<(String, Range<usize>)>, PluginError> {
        let b = json.as_bytes();
        let mut i = skip_ws(b, 0);
        if b.get(i) != Some(&b'{') {
            return Err(PluginError::bad_facts("facts must be a JSON object"));
        }
        let mut members = Vec::new();
        i = skip_ws(b, i + 1);
        if b.get(i) == Some(&b'}') {
            i += 1;
        } else {
            loop {
                if b.get(i) != Some(&b'"') {
                    return Err(bad(i, "expected a member name"));
                }
                let end = skip_string(b, i)?;
                let raw_name = &json[i..end];
                let name = if raw_name.contains('\\') {
                    serde_json::from_str(raw_name).map_err(|e| bad(i, &e.to_string()))?
                } else {
                    raw_name[1..raw_name.len() - 1].to_owned()
                };
                i = skip_ws(b, end);
                if b.get(i) != Some(&b':') {
                    return Err(bad(i, "expected `:`"));
                }
                let start = skip_ws(b, i + 1);
                let stop = skip_value(b, start)?;
                members.push((name, start..stop));
                i = skip_ws(b, stop);
                match b.get(i) {
                    Some(b',') => i = skip_ws(b, i + 1),
                    Some(b'}') => {
                        i += 1;
                        break;
                    }
                    _ => return Err(bad(i, "expected `,` or `}`")),
                }
            }
        }
        if skip_ws(b, i) != b.len() {
            return Err(bad(i, "trailing characters"));
        }
        Ok(members)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn spans_cover_each_value_exactly() {
            let json = r#" { "a" : {"x": "}\"]", "y": [1, [2]]}, "b":-1.5e3 ,"c\u0041":"q","d":[] } "#;
            let m = top_level(json).unwrap();
            let got: Vec<(&str, &str)> = m.iter().map(|(n, r)| (n.as_str(), &json[r.clone()])).collect();
            assert_eq!(got, [("a", r#"{"x": "}\"]", "y": [1, [2]]}"#), ("b", "-1.5e3"), ("cA", r#""q""#), ("d", "[]")]);
            assert!(top_level("{}").unwrap().is_empty());
        }

        #[test]
        fn broken_documents_are_bad_facts() {
            for bad in ["", "[1]", "{", r#"{"a"}"#, r#"{"a":}"#, r#"{"a":1"#, r#"{"a":"x}"#, r#"{"a":[1}"#, r#"{"a":1} x"#, r#"{"a":1,}"#] {
                assert_eq!(top_level(bad).unwrap_err().code, "bad-facts", "{bad:?}");
            }
        }
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
    fn sections_are_parsed_when_reached() {
        let f = Facts::parse(r#"{"a": {"b": [1, {"c": "x"}]}, "d~/e": 2, "n": null, "a": {"b": [7]}}"#).unwrap();
        assert!(f.sections.iter().all(|s| s.value.get().is_none()), "nothing built yet");
        assert_eq!(f.get("/a/b/0"), Some(&json!(7)), "the last duplicate wins, as in a Value");
        assert_eq!(f.sections.iter().filter(|s| s.value.get().is_some()).count(), 1, "only `a` was built");
        assert_eq!(f.get("/d~0~1e"), Some(&json!(2)));
        assert!(f.get("/n").is_none() && f.get("/zz").is_none() && f.get("nope").is_none());
        assert_eq!(f.get("").unwrap()["a"]["b"], json!([7]));
        let v = Facts::from_value(json!({"a": {"b": 1}}));
        assert_eq!(v.u64_at("/a/b"), Some(1));
        assert_eq!(v.root(), &json!({"a": {"b": 1}}));
    }

    /// The same cases as the host's projection test (plugins/host/src/facts.rs): native tests
    /// must see what a host would pass.
    #[test]
    fn projection_matches_the_hosts() {
        let facts = json!({
            "host": {"hostname": "n1", "dmi": {"sys_vendor": "Microsoft Corporation", "serial": "x"}},
            "rdma": {"devices": [{"name": "mlx5_0"}]},
            "gpus": [{"index": 0}],
            "a/b": {"c~d": 1},
        });
        let reads = |r: &[&str]| project(&facts, &r.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(reads(&["/host/dmi/sys_vendor", "/rdma"]), json!({
            "host": {"dmi": {"sys_vendor": "Microsoft Corporation"}},
            "rdma": {"devices": [{"name": "mlx5_0"}]},
        }));
        assert_eq!(reads(&["/gpus/0/index"]), json!({"gpus": [{"index": 0}]}), "arrays stay whole");
        assert_eq!(reads(&["/host/dmi", "/host/dmi/sys_vendor"])["host"]["dmi"]["serial"], "x");
        assert_eq!(reads(&["/missing", "/host/nothing"]), json!({}));
        assert_eq!(reads(&["/a~1b/c~0d"]), json!({"a/b": {"c~d": 1}}));
    }

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
