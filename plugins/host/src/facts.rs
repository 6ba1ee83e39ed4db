//! A node's facts as plugins receive them: checked once, shared by every plugin called on
//! them, and cut down to what each plugin declared it reads (contract 0.2 `reads`).

use std::sync::{Arc, Mutex, OnceLock};

use serde_json::Value;

use crate::HostError;

/// Facts known to be a JSON object. Build one per node and pass it to every plugin: the
/// check, and any projection a set of `reads` needs, happen once per node rather than once
/// per call.
pub struct FactsJson {
    value: OnceLock<Value>,
    full: OnceLock<Arc<str>>,
    /// Serialised projections by the `reads` they answer (few distinct sets per fleet).
    projections: Mutex<Vec<(Vec<String>, Arc<str>)>>,
}

impl FactsJson {
    /// Checks that `json` is a JSON object.
    pub fn parse(json: &str) -> Result<Self, HostError> {
        let value: Value = serde_json::from_str(json).map_err(|e| HostError::BadFacts(e.to_string()))?;
        if !value.is_object() {
            return Err(HostError::BadFacts("facts must be a JSON object".into()));
        }
        let facts = Self::from_object(value);
        let _ = facts.full.set(Arc::from(json));
        Ok(facts)
    }

    /// Facts already parsed (e.g. read from Postgres JSONB).
    pub fn from_value(value: Value) -> Result<Self, HostError> {
        if !value.is_object() {
            return Err(HostError::BadFacts("facts must be a JSON object".into()));
        }
        Ok(Self::from_object(value))
    }

    fn from_object(value: Value) -> Self {
        Self { value: OnceLock::from(value), full: OnceLock::new(), projections: Mutex::default() }
    }

    fn value(&self) -> &Value {
        self.value.get().expect("set at construction")
    }

    /// The whole document.
    pub fn as_str(&self) -> &str {
        self.full.get_or_init(|| Arc::from(self.value().to_string()))
    }

    /// What a plugin that reads `reads` is given: the whole document when `reads` is empty,
    /// else only those subtrees, each at its usual path.
    pub fn for_reads(&self, reads: &[String]) -> Arc<str> {
        if reads.is_empty() {
            self.as_str();
            return self.full.get().expect("just set").clone();
        }
        let mut cache = self.projections.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, json)) = cache.iter().find(|(r, _)| r.as_slice() == reads) {
            return json.clone();
        }
        let json: Arc<str> = Arc::from(Projection::new(self.value(), reads).to_string());
        cache.push((reads.to_vec(), json.clone()));
        json
    }
}

/// The subtrees of `facts` at `pointers` (RFC 6901), rebuilt at the same paths; pointers that
/// name nothing are left out, and elements of arrays are kept whole (a partial array would
/// renumber).
pub fn project(facts: &Value, pointers: &[String]) -> Value {
    let p = Projection::new(facts, pointers);
    serde_json::to_value(Cut(p.value, &p.keep)).unwrap_or_default()
}

/// A projection serialised straight from the borrowed facts, without copying the subtrees.
struct Projection<'a> {
    value: &'a Value,
    keep: Keep,
}

/// Which members of an object to keep: all of it, or some members, each with its own `Keep`.
enum Keep {
    All,
    Some(std::collections::BTreeMap<String, Keep>),
}

impl<'a> Projection<'a> {
    fn new(value: &'a Value, pointers: &[String]) -> Self {
        let mut keep = Keep::Some(Default::default());
        for pointer in pointers.iter().filter(|p| value.pointer(p).is_some()) {
            let (mut slot, mut source) = (&mut keep, value);
            let tokens: Vec<String> =
                pointer.split('/').skip(1).map(|t| t.replace("~1", "/").replace("~0", "~")).collect();
            for (i, token) in tokens.iter().enumerate() {
                let (Value::Object(map), Keep::Some(members)) = (source, slot) else { break };
                source = &map[token.as_str()];
                if i + 1 == tokens.len() || source.is_array() {
                    members.insert(token.clone(), Keep::All);
                    break;
                }
                slot = members.entry(token.clone()).or_insert_with(|| Keep::Some(Default::default()));
            }
        }
        Self { value, keep }
    }
}

impl std::fmt::Display for Projection<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let json = serde_json::to_string(&Cut(self.value, &self.keep)).map_err(|_| std::fmt::Error)?;
        f.write_str(&json)
    }
}

struct Cut<'a>(&'a Value, &'a Keep);

impl serde::Serialize for Cut<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        match (self.0, self.1) {
            (Value::Object(map), Keep::Some(members)) => {
                let mut out = s.serialize_map(Some(members.len()))?;
                for (name, keep) in members {
                    if let Some(v) = map.get(name) {
                        out.serialize_entry(name, &Cut(v, keep))?;
                    }
                }
                out.end()
            }
            (v, _) => v.serialize(s),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn projection_keeps_only_what_was_declared() {
        let facts = json!({
            "host": {"hostname": "n1", "dmi": {"sys_vendor": "Microsoft Corporation", "serial": "x"}},
            "rdma": {"devices": [{"name": "mlx5_0"}]},
            "gpus": [{"index": 0}],
            "a/b": {"c~d": 1},
        });
        let reads = |r: &[&str]| {
            let pointers: Vec<String> = r.iter().map(|s| s.to_string()).collect();
            let streamed: Value = serde_json::from_str(&Projection::new(&facts, &pointers).to_string()).unwrap();
            assert_eq!(project(&facts, &pointers), streamed, "{r:?}");
            streamed
        };
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
    fn facts_are_checked_once_and_projections_reused() {
        assert_eq!(FactsJson::parse("[1]").err().unwrap().code(), "bad-facts");
        assert_eq!(FactsJson::parse("{").err().unwrap().code(), "bad-facts");
        let f = FactsJson::parse(r#"{"a": {"b": 1}, "c": 2}"#).unwrap();
        assert_eq!(f.as_str(), r#"{"a": {"b": 1}, "c": 2}"#, "the caller's bytes, untouched");
        let one = f.for_reads(&["/a".into()]);
        assert_eq!(&*one, r#"{"a":{"b":1}}"#);
        assert!(Arc::ptr_eq(&one, &f.for_reads(&["/a".into()])));
        assert_eq!(&*f.for_reads(&[]), f.as_str());
    }
}
