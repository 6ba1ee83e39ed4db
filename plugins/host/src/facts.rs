//! A node's facts as plugins receive them: checked once, shared by every plugin called on
//! them, and cut down to what each plugin declared it reads (contract 0.2 `reads`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::Value;

use crate::HostError;

/// Facts known to be a JSON object. Build one per node and pass it to every plugin: the
/// check, and any projection a set of `reads` needs, happen once per node rather than once
/// per call.
pub struct FactsJson {
    value: OnceLock<Value>,
    full: OnceLock<Arc<str>>,
    /// Serialised projections by the [`Reads`] they answer (few distinct sets per fleet).
    projections: Mutex<Vec<(Arc<Reads>, Arc<str>)>>,
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

    /// What a plugin that declared `reads` is given: the whole document when it declared
    /// nothing, else only those parts, each at its usual path.
    pub fn for_reads(&self, reads: &Arc<Reads>) -> Arc<str> {
        let Some(keep) = &reads.keep else {
            self.as_str();
            return self.full.get().expect("just set").clone();
        };
        let mut cache = self.projections.lock().unwrap_or_else(|p| p.into_inner());
        // The same plan (one per compiled plugin) is found by address; an equal one from
        // another plugin by content.
        if let Some((_, json)) = cache.iter().find(|(r, _)| Arc::ptr_eq(r, reads) || r.pointers == reads.pointers) {
            return json.clone();
        }
        let json = serialise(&Cut(self.value(), keep));
        cache.push((reads.clone(), json.clone()));
        json
    }
}

/// Serialises into a buffer kept per thread, so a projection costs one exact allocation
/// instead of a growing buffer reallocated (and copied) several times.
fn serialise(value: &impl serde::Serialize) -> Arc<str> {
    thread_local!(static BUFFER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) });
    BUFFER.with_borrow_mut(|buf| {
        buf.clear();
        // Serialising a `Value` cannot fail, and serde_json writes UTF-8; an empty object keeps
        // the plugin running should either ever happen.
        match serde_json::to_writer(&mut *buf, value).ok().and_then(|()| std::str::from_utf8(buf).ok()) {
            Some(json) => Arc::from(json),
            None => Arc::from("{}"),
        }
    })
}

/// A plugin's `reads`, parsed once when the plugin is compiled. Each pointer (RFC 6901) keeps
/// the subtree it names at its usual path; pointers that name nothing are left out. A `*`
/// token stands for every element of an array or member of an object (`/gpus/*/index` keeps
/// each GPU with only its index); any other step into an array keeps the array whole, since
/// a partial array would renumber.
#[derive(Debug)]
pub struct Reads {
    pointers: Vec<String>,
    /// `None`: nothing declared, so the whole document.
    keep: Option<Keep>,
}

impl Reads {
    pub fn new(pointers: &[String]) -> Self {
        let keep = (!pointers.is_empty()).then(|| {
            let mut keep = Keep::none();
            for pointer in pointers {
                let tokens: Vec<String> =
                    pointer.split('/').skip(1).map(|t| t.replace("~1", "/").replace("~0", "~")).collect();
                keep.add(&tokens);
            }
            keep
        });
        Self { pointers: pointers.to_vec(), keep }
    }

    pub fn pointers(&self) -> &[String] {
        &self.pointers
    }
}

/// `facts` cut down to `pointers` (see [`Reads`]).
pub fn project(facts: &Value, pointers: &[String]) -> Value {
    match &Reads::new(pointers).keep {
        None => facts.clone(),
        Some(keep) => serde_json::to_value(Cut(facts, keep)).unwrap_or_default(),
    }
}

/// What to keep of a value.
#[derive(Debug)]
enum Keep {
    All,
    /// Of an object, these members; of an array, the whole array if an element named by
    /// index is there.
    Some(BTreeMap<String, Keep>),
    /// Of an array or object, every element or member, each cut the same way.
    Each(Box<Keep>),
}

impl Keep {
    fn none() -> Self {
        Keep::Some(BTreeMap::new())
    }

    /// Widens what is kept by one pointer's remaining tokens.
    fn add(&mut self, tokens: &[String]) {
        let Some((first, rest)) = tokens.split_first() else {
            *self = Keep::All;
            return;
        };
        match self {
            Keep::All => {}
            Keep::Each(each) if first == "*" => each.add(rest),
            Keep::Some(members) if first != "*" => members.entry(first.clone()).or_insert_with(Keep::none).add(rest),
            Keep::Some(members) if members.is_empty() => {
                let mut each = Keep::none();
                each.add(rest);
                *self = Keep::Each(Box::new(each));
            }
            // `*` beside a named member at the same level: keep the value whole.
            _ => *self = Keep::All,
        }
    }

    /// Whether some pointer behind `self` names something in `value`: a member whose
    /// pointers all miss is left out rather than passed as an empty object.
    fn finds(&self, value: &Value) -> bool {
        match (self, value) {
            (Keep::All | Keep::Each(_), _) => true,
            (Keep::Some(members), Value::Object(map)) => {
                members.iter().any(|(name, keep)| map.get(name).is_some_and(|v| keep.finds(v)))
            }
            (Keep::Some(members), Value::Array(items)) => members.iter().any(|(token, keep)| {
                let index = (token == "0" || !token.starts_with('0')).then(|| token.parse::<usize>().ok()).flatten();
                index.and_then(|i| items.get(i)).is_some_and(|v| keep.finds(v))
            }),
            (Keep::Some(_), _) => false,
        }
    }
}

struct Cut<'a>(&'a Value, &'a Keep);

impl serde::Serialize for Cut<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeSeq};
        match (self.0, self.1) {
            (Value::Object(map), Keep::Some(members)) => {
                let mut out = s.serialize_map(None)?;
                for (name, keep) in members {
                    if let Some(v) = map.get(name).filter(|v| keep.finds(v)) {
                        out.serialize_entry(name, &Cut(v, keep))?;
                    }
                }
                out.end()
            }
            (Value::Object(map), Keep::Each(keep)) => {
                let mut out = s.serialize_map(Some(map.len()))?;
                for (name, v) in map {
                    out.serialize_entry(name, &Cut(v, keep))?;
                }
                out.end()
            }
            (Value::Array(items), Keep::Each(keep)) => {
                let mut out = s.serialize_seq(Some(items.len()))?;
                for v in items {
                    out.serialize_element(&Cut(v, keep))?;
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
            "rdma": {"devices": [{"name": "mlx5_0", "gids": [1]}]},
            "gpus": [{"index": 0, "uuid": "GPU-1"}],
            "a/b": {"c~d": 1},
        });
        let reads = |r: &[&str]| {
            let pointers: Vec<String> = r.iter().map(|s| s.to_string()).collect();
            let checked = FactsJson::from_value(facts.clone()).unwrap();
            let streamed: Value = serde_json::from_str(&checked.for_reads(&Arc::new(Reads::new(&pointers)))).unwrap();
            assert_eq!(project(&facts, &pointers), streamed, "{r:?}");
            streamed
        };
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
    fn facts_are_checked_once_and_projections_reused() {
        assert_eq!(FactsJson::parse("[1]").err().unwrap().code(), "bad-facts");
        assert_eq!(FactsJson::parse("{").err().unwrap().code(), "bad-facts");
        let f = FactsJson::parse(r#"{"a": {"b": 1}, "c": 2}"#).unwrap();
        assert_eq!(f.as_str(), r#"{"a": {"b": 1}, "c": 2}"#, "the caller's bytes, untouched");
        let reads = Arc::new(Reads::new(&["/a".into()]));
        let one = f.for_reads(&reads);
        assert_eq!(&*one, r#"{"a":{"b":1}}"#);
        assert!(Arc::ptr_eq(&one, &f.for_reads(&reads)));
        assert!(Arc::ptr_eq(&one, &f.for_reads(&Arc::new(Reads::new(&["/a".into()])))), "equal reads of another plugin");
        assert_eq!(&*f.for_reads(&Arc::new(Reads::new(&[]))), f.as_str());
    }
}
