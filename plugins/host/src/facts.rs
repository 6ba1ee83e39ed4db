//! A node's facts as plugins receive them: checked once, shared by every plugin called on
//! them, and cut down to what each plugin declared it reads (contract 0.2 `reads`).

use std::sync::{Arc, Mutex, OnceLock};

pub use heddle_plugin_reads::Reads;
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
        let value: Value =
            serde_json::from_str(json).map_err(|e| HostError::BadFacts(e.to_string()))?;
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
        Self {
            value: OnceLock::from(value),
            full: OnceLock::new(),
            projections: Mutex::default(),
        }
    }

    fn value(&self) -> &Value {
        self.value.get().expect("set at construction")
    }

    /// The whole document.
    pub fn as_str(&self) -> &str {
        self.full
            .get_or_init(|| Arc::from(self.value().to_string()))
    }

    /// What a plugin that declared `reads` is given: the whole document when it declared
    /// nothing, else only those parts, each at its usual path.
    pub fn for_reads(&self, reads: &Arc<Reads>) -> Arc<str> {
        if reads.whole() {
            self.as_str();
            return self.full.get().expect("just set").clone();
        }
        let mut cache = self.projections.lock().unwrap_or_else(|p| p.into_inner());
        // The same plan (one per compiled plugin) is found by address; an equal one from
        // another plugin by content.
        if let Some((_, json)) = cache
            .iter()
            .find(|(r, _)| Arc::ptr_eq(r, reads) || r.pointers() == reads.pointers())
        {
            return json.clone();
        }
        let json = serialise(&reads.cut(self.value()));
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
        match serde_json::to_writer(&mut *buf, value)
            .ok()
            .and_then(|()| std::str::from_utf8(buf).ok())
        {
            Some(json) => Arc::from(json),
            None => Arc::from("{}"),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn facts_are_checked_once_and_projections_reused() {
        assert_eq!(FactsJson::parse("[1]").err().unwrap().code(), "bad-facts");
        assert_eq!(FactsJson::parse("{").err().unwrap().code(), "bad-facts");
        let f = FactsJson::parse(r#"{"a": {"b": 1}, "c": 2}"#).unwrap();
        assert_eq!(
            f.as_str(),
            r#"{"a": {"b": 1}, "c": 2}"#,
            "the caller's bytes, untouched"
        );
        let reads = Arc::new(Reads::new(&["/a".into()]));
        let one = f.for_reads(&reads);
        assert_eq!(&*one, r#"{"a":{"b":1}}"#);
        assert!(Arc::ptr_eq(&one, &f.for_reads(&reads)));
        assert!(
            Arc::ptr_eq(&one, &f.for_reads(&Arc::new(Reads::new(&["/a".into()])))),
            "equal reads of another plugin"
        );
        assert_eq!(&*f.for_reads(&Arc::new(Reads::new(&[]))), f.as_str());
    }
}
