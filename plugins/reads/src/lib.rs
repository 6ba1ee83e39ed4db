//! What a plugin's `reads` (contract 0.2) pass it of a node's facts. The host cuts facts
//! with it before every call, and the SDK with the same code in a plugin's native tests, so
//! a lookup outside the declared reads fails in tests exactly as it would in production.

use std::collections::BTreeMap;

use serde_json::Value;

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
                let tokens: Vec<String> = pointer
                    .split('/')
                    .skip(1)
                    .map(|t| t.replace("~1", "/").replace("~0", "~"))
                    .collect();
                keep.add(&tokens);
            }
            keep
        });
        Self {
            pointers: pointers.to_vec(),
            keep,
        }
    }

    pub fn pointers(&self) -> &[String] {
        &self.pointers
    }

    /// Whether nothing was declared, so a plugin gets the whole document.
    pub fn whole(&self) -> bool {
        self.keep.is_none()
    }

    /// `facts` cut down, serialisable straight from the borrowed value without copying it.
    pub fn cut<'a>(&'a self, facts: &'a Value) -> impl serde::Serialize + 'a {
        Projected {
            facts,
            keep: self.keep.as_ref(),
        }
    }

    /// `facts` cut down, as a value of its own.
    pub fn project(&self, facts: &Value) -> Value {
        serde_json::to_value(self.cut(facts)).unwrap_or_default()
    }
}

struct Projected<'a> {
    facts: &'a Value,
    keep: Option<&'a Keep>,
}

impl serde::Serialize for Projected<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.keep {
            None => self.facts.serialize(s),
            Some(keep) => Cut(self.facts, keep).serialize(s),
        }
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
            Keep::Some(members) if first != "*" => members
                .entry(first.clone())
                .or_insert_with(Keep::none)
                .add(rest),
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
            (Keep::Some(members), Value::Object(map)) => members
                .iter()
                .any(|(name, keep)| map.get(name).is_some_and(|v| keep.finds(v))),
            (Keep::Some(members), Value::Array(items)) => members.iter().any(|(token, keep)| {
                let index = (token == "0" || !token.starts_with('0'))
                    .then(|| token.parse::<usize>().ok())
                    .flatten();
                index
                    .and_then(|i| items.get(i))
                    .is_some_and(|v| keep.finds(v))
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
            let reads = Reads::new(&pointers);
            let streamed: Value =
                serde_json::from_str(&serde_json::to_string(&reads.cut(&facts)).unwrap()).unwrap();
            assert_eq!(reads.project(&facts), streamed, "{r:?}");
            streamed
        };
        assert_eq!(
            reads(&["/host/dmi/sys_vendor", "/rdma"]),
            json!({
                "host": {"dmi": {"sys_vendor": "Microsoft Corporation"}},
                "rdma": {"devices": [{"name": "mlx5_0", "gids": [1]}]},
            })
        );
        assert_eq!(
            reads(&["/gpus/0/index"]),
            json!({"gpus": [{"index": 0, "uuid": "GPU-1"}]}),
            "arrays stay whole"
        );
        assert_eq!(
            reads(&["/host/dmi", "/host/dmi/sys_vendor"])["host"]["dmi"]["serial"],
            "x"
        );
        assert_eq!(
            reads(&["/missing", "/host/nothing", "/gpus/1/index", "/gpus/01"]),
            json!({})
        );
        assert_eq!(reads(&["/a~1b/c~0d"]), json!({"a/b": {"c~d": 1}}));
        assert_eq!(
            reads(&["/rdma/devices/*/name", "/gpus/*/index", "/gpus/*/missing"]),
            json!({
                "rdma": {"devices": [{"name": "mlx5_0"}]},
                "gpus": [{"index": 0}],
            })
        );
        assert_eq!(
            reads(&["/host/*/sys_vendor"]),
            json!({"host": {"hostname": "n1", "dmi": {"sys_vendor": "Microsoft Corporation"}}})
        );
        assert_eq!(
            reads(&["/gpus/*", "/gpus/*/index"]),
            json!({"gpus": [{"index": 0, "uuid": "GPU-1"}]}),
            "every GPU whole"
        );
        assert_eq!(
            reads(&["/host/*/sys_vendor", "/host/hostname"])["host"]["dmi"]["serial"],
            "x",
            "`*` beside a name keeps it whole"
        );
        assert_eq!(
            reads(&["/missing/*/x", "/host/hostname/*"]),
            json!({"host": {"hostname": "n1"}})
        );
    }

    #[test]
    fn nothing_declared_is_the_whole_document() {
        let facts = json!({"a": 1, "b": {"c": 2}});
        let reads = Reads::new(&[]);
        assert!(reads.whole());
        assert_eq!(reads.project(&facts), facts);
    }
}
