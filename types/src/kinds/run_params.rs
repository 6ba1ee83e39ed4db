//! A job's params typed by its kind: [`RunParams`], one variant per kind, decoded once
//! where a spec enters (the server's API, a stored run read back, the agent's lease) and
//! carried in [`JobSpec::params`](crate::jobs::JobSpec) as [`Params`], beside the JSON it
//! came as. The JSON is what is written back, byte for byte: a run stores what its creator
//! sent (`{}` stays `{}`, not every default spelled out), and an agent or server of another
//! version reads the same spec.
//!
//! A result's summary is typed the same way where its kind is known
//! ([`RunSummary`](super::RunSummary)): an
//! upload does not name its kind, so the server reads the summary by its job's kind when it
//! judges the result, and `heddle runs show` and the run page by their run's.

use serde::{Serialize, Serializer};
use serde_json::Value;

use super::{Judged, RunParams, SpecParamsError, decode_typed, find_kind};
use crate::rows::ResultRow;

/// Makes [`KINDS`](super::KINDS), [`RunParams`] and [`RunSummary`](super::RunSummary) from
/// the list of kinds in `kinds.rs`, written once.
macro_rules! kinds {
    ($($variant:ident($ty:ty)),* $(,)?) => {
        /// Every kind a run may have, in the order the launcher lists them.
        pub const KINDS: &[$crate::kinds::KindEntry] = &[$($crate::kinds::entry::<$ty>()),*];

        /// A job's params, decoded by its kind.
        #[derive(Debug, Clone, PartialEq)]
        pub enum RunParams {
            $($variant($ty)),*
        }

        $(impl From<$ty> for RunParams {
            fn from(p: $ty) -> RunParams {
                RunParams::$variant(p)
            }
        })*

        impl RunParams {
            /// The kind these params are of.
            pub fn kind(&self) -> &'static str {
                match self {
                    $(RunParams::$variant(_) => <$ty as $crate::params::KindParams>::KIND),*
                }
            }

            /// What a result of these params is judged on.
            pub fn judged(&self, rows: &[$crate::rows::ResultRow]) -> $crate::kinds::Judged {
                match self {
                    $(RunParams::$variant(p) => <$ty as $crate::kinds::TestKind>::judged(p, rows)),*
                }
            }

            /// The params with every default spelled out.
            pub fn to_value(&self) -> serde_json::Value {
                let v = match self {
                    $(RunParams::$variant(p) => serde_json::to_value(p)),*
                };
                v.unwrap_or(serde_json::Value::Null)
            }
        }

        /// What readers take from a result's summary, by the result's kind: decoded once,
        /// then asked for its path line and its transport findings.
        // One is read per result and dropped: the size of its largest variant costs nothing.
        #[allow(clippy::large_enum_variant)]
        #[derive(Debug, Clone)]
        pub enum RunSummary {
            $($variant(<$ty as $crate::kinds::TestKind>::Summary),)*
            /// A result of a kind this build does not know: nothing to read.
            Unknown,
        }

        impl RunSummary {
            /// Reads `summary` as `kind`'s; any JSON gives one (fields that do not
            /// decode are absent).
            pub fn read(kind: &str, summary: &serde_json::Value) -> RunSummary {
                $(if kind == <$ty as $crate::params::KindParams>::KIND {
                    return RunSummary::$variant($crate::kinds::summary(summary));
                })*
                RunSummary::Unknown
            }

            /// One line on the path the result took, from the evidence in its summary.
            pub fn path_line(&self) -> Option<String> {
                match self {
                    $(RunSummary::$variant(s) => <$ty as $crate::kinds::TestKind>::path_line(s),)*
                    RunSummary::Unknown => None,
                }
            }

            /// What the evidence of a succeeded result says against the node's facts.
            pub fn findings(
                &self,
                facts: Option<&$crate::facts::NodeFacts>,
            ) -> Vec<$crate::transport::Finding> {
                match self {
                    $(RunSummary::$variant(s) => <$ty as $crate::kinds::TestKind>::findings(s, facts),)*
                    RunSummary::Unknown => Vec::new(),
                }
            }
        }

        /// Decodes `params` as `kind`'s type, checked against its documented limits.
        fn decode_typed(
            kind: &str,
            params: &serde_json::Value,
        ) -> Option<Result<RunParams, $crate::params::ParamError>> {
            $(if kind == <$ty as $crate::params::KindParams>::KIND {
                return Some(<$ty as $crate::params::KindParams>::decode(params).map(RunParams::from));
            })*
            None
        }
    };
}

impl RunParams {
    /// Decodes `params` as `kind`'s: the error names the parameter at fault, or the kind
    /// when this build does not know it.
    pub fn decode(kind: &str, params: &Value) -> Result<RunParams, SpecParamsError> {
        decode_typed(kind, params)
            .ok_or_else(|| SpecParamsError::UnknownKind(kind.to_string()))?
            .map_err(SpecParamsError::Param)
    }
}

/// A job spec's params: the JSON they came as, and what it decodes to for the spec's kind.
#[derive(Debug, Clone)]
pub struct Params {
    raw: Value,
    typed: Result<RunParams, SpecParamsError>,
}

impl Params {
    /// The params of a spec of `kind`, as given. Params that do not decode are kept, with
    /// why: a stored run is still read, and an agent fails such a job with the reason
    /// rather than refusing its lease.
    pub fn new(kind: &str, raw: Value) -> Params {
        let typed = RunParams::decode(kind, &raw);
        Params { raw, typed }
    }

    /// The params as given (`null` when none were).
    pub fn raw(&self) -> &Value {
        &self.raw
    }

    /// The params decoded by the spec's kind.
    pub fn typed(&self) -> Result<&RunParams, &SpecParamsError> {
        self.typed.as_ref()
    }

    /// `name`'s value as given, if it was.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.raw.get(name)
    }

    /// What a result of `kind` with these params is judged on. Params a stored run was
    /// created with but that today's limits refuse are judged by their types alone; a kind
    /// this build does not know gives the kind's name and no figure.
    pub fn judged(&self, kind: &str, rows: &[ResultRow]) -> Judged {
        let judged = match &self.typed {
            Ok(typed) => Some(typed.judged(rows)),
            Err(_) => find_kind(kind).and_then(|k| (k.judged)(&self.raw, rows)),
        };
        judged.unwrap_or_else(|| Judged {
            test: kind.to_string(),
            figures: Vec::new(),
        })
    }
}

/// Two specs' params are the same when they were given the same (the typed value follows).
impl PartialEq for Params {
    fn eq(&self, other: &Params) -> bool {
        self.raw == other.raw
    }
}

/// Compares with the JSON as given.
impl PartialEq<Value> for Params {
    fn eq(&self, other: &Value) -> bool {
        self.raw == *other
    }
}

/// A parameter as given (`null` when it was not), as `Value` indexes.
impl std::ops::Index<&str> for Params {
    type Output = Value;
    fn index(&self, name: &str) -> &Value {
        &self.raw[name]
    }
}

impl Serialize for Params {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.raw.serialize(s)
    }
}

impl std::fmt::Display for Params {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.raw.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::RunSummary;
    use serde_json::json;

    #[test]
    fn each_kind_decodes_to_its_own_variant() {
        for k in super::super::KINDS {
            match RunParams::decode(k.name, &Value::Null) {
                Ok(typed) => {
                    assert_eq!(typed.kind(), k.name);
                    assert_eq!(typed.to_value(), (k.defaults)(), "{}", k.name);
                }
                // A kind with a required parameter (a sweep's grid, a sleep's seconds).
                Err(SpecParamsError::Param(e)) => {
                    let text = e.to_string();
                    assert!(
                        k.params.iter().any(|d| d.required && text.contains(d.name)),
                        "{}: {e}",
                        k.name
                    );
                }
                Err(e) => panic!("{}: {e}", k.name),
            }
        }
        let sleep = RunParams::decode("sleep", &json!({"seconds": 1})).unwrap();
        assert!(matches!(sleep, RunParams::Sleep(_)), "{sleep:?}");
    }

    #[test]
    fn the_json_given_is_kept_beside_the_typed_value() {
        let p = Params::new("nccl", json!({"gpus": 2}));
        assert_eq!(p.raw(), &json!({"gpus": 2}));
        let Ok(RunParams::Nccl(n)) = p.typed() else {
            panic!("{p:?}")
        };
        assert_eq!((n.gpus, n.op.as_str()), (2, "all_reduce"));
        assert_eq!(serde_json::to_string(&p).unwrap(), r#"{"gpus":2}"#);
    }

    #[test]
    fn params_that_do_not_decode_are_kept_with_why() {
        let p = Params::new("nccl", json!({"gpus": "two"}));
        assert_eq!(p.raw(), &json!({"gpus": "two"}));
        let err = p.typed().unwrap_err().to_string();
        assert!(err.starts_with("params.gpus:"), "{err}");
        let p = Params::new("from-the-future", json!({"x": 1}));
        assert_eq!(
            p.typed().unwrap_err(),
            &SpecParamsError::UnknownKind("from-the-future".into())
        );
        assert_eq!(p.judged("from-the-future", &[]).test, "from-the-future");
    }

    #[test]
    fn a_summary_is_read_by_its_kind() {
        let s = json!({"nccl_network": "Socket", "nccl_evidence": {"network": "Socket", "transports": {"NET/Socket": 4}}});
        let read = RunSummary::read("nccl", &s);
        assert!(matches!(read, RunSummary::Nccl(_)), "{read:?}");
        let line = read.path_line().unwrap();
        assert!(line.contains("Socket"), "{line}");
        assert!(RunSummary::read("sleep", &s).path_line().is_none());
        let unknown = RunSummary::read("from-the-future", &s);
        assert!(matches!(unknown, RunSummary::Unknown));
        assert!(unknown.findings(None).is_empty());
        // Any JSON gives one.
        assert!(
            RunSummary::read("nccl", &json!([1, 2]))
                .path_line()
                .is_none()
        );
    }

    #[test]
    fn stored_params_past_todays_limits_are_still_judged_by_their_types() {
        let p = Params::new("nccl", json!({"gpus": 100000, "op": "all_gather"}));
        assert!(p.typed().is_err());
        assert_eq!(p.judged("nccl", &[]).test, "nccl.all_gather");
    }
}
