//! How a kind's parameters are described, decoded and checked.
//!
//! Every job kind has one parameter struct in its module under [`crate::kinds`], with serde
//! defaults and `deny_unknown_fields`, and one [`KindParams`] impl that documents each
//! parameter (type, unit, range, allowed values, help). This module is the machinery they
//! share and knows no kind: decoding that names the parameter at fault, the checks of the
//! documented ranges and choices, and the catalogue's wire shapes ([`RunKind`]).

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The value type of one parameter, as a form would ask for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ParamType {
    Integer,
    Number,
    Boolean,
    String,
    /// `"10s"`, `"500ms"`, `"2m"` or a number of seconds.
    Duration,
    IntegerList,
    StringList,
    /// An object mapping `NCCL_*` names to lists of values (a sweep's grid).
    EnvGrid,
}

/// One parameter of a kind, as written beside its struct.
#[derive(Debug, Clone, Copy)]
pub struct ParamDoc {
    pub name: &'static str,
    pub ty: ParamType,
    pub required: bool,
    pub unit: Option<&'static str>,
    pub min: Option<f64>,
    pub max: Option<f64>,
    /// Allowed values of a string (or of each item of a string list).
    pub choices: &'static [&'static str],
    /// Accepts other spellings of `choices` (aliases, case); returns the canonical one.
    pub normalize: Option<fn(&str) -> Result<&'static str, String>>,
    pub help: &'static str,
}

impl ParamDoc {
    pub const fn new(name: &'static str, ty: ParamType, help: &'static str) -> ParamDoc {
        ParamDoc {
            name,
            ty,
            required: false,
            unit: None,
            min: None,
            max: None,
            choices: &[],
            normalize: None,
            help,
        }
    }
    pub const fn unit(mut self, unit: &'static str) -> ParamDoc {
        self.unit = Some(unit);
        self
    }
    pub const fn range(mut self, min: f64, max: f64) -> ParamDoc {
        self.min = Some(min);
        self.max = Some(max);
        self
    }
    pub const fn choices(mut self, choices: &'static [&'static str]) -> ParamDoc {
        self.choices = choices;
        self
    }
    pub const fn normalize(mut self, f: fn(&str) -> Result<&'static str, String>) -> ParamDoc {
        self.normalize = Some(f);
        self
    }
    pub const fn required(mut self) -> ParamDoc {
        self.required = true;
        self
    }

    /// Checks one decoded value against the documented range and choices.
    fn check(&self, v: &Value) -> Result<(), String> {
        match v {
            Value::Null => Ok(()),
            Value::Array(items) => items.iter().try_for_each(|i| self.check(i)),
            Value::Number(n) => {
                let x = n.as_f64().unwrap_or(f64::NAN);
                let low = self.min.is_some_and(|m| x < m);
                let high = self.max.is_some_and(|m| x > m);
                if low || high || !x.is_finite() {
                    return Err(format!("must be in {}, got {n}", self.range_text()));
                }
                Ok(())
            }
            Value::String(s) if self.ty != ParamType::Duration => {
                if let Some(f) = self.normalize {
                    return f(s).map(drop);
                }
                if !self.choices.is_empty() && !self.choices.contains(&s.as_str()) {
                    return Err(format!(
                        "unknown value {s:?} (one of {})",
                        self.choices.join(", ")
                    ));
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn range_text(&self) -> String {
        let show = |x: f64| format!("{x}");
        match (self.min, self.max) {
            (Some(a), Some(b)) => format!("{}..={}", show(a), show(b)),
            (Some(a), None) => format!("{}..", show(a)),
            (None, Some(b)) => format!("..={}", show(b)),
            (None, None) => "any".into(),
        }
    }
}

/// A parameter that was refused, with the parameter's name when one is to blame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamError {
    pub param: Option<String>,
    pub message: String,
}

impl ParamError {
    pub fn new(param: impl Into<String>, message: impl Into<String>) -> ParamError {
        ParamError {
            param: Some(param.into()),
            message: message.into(),
        }
    }
    pub(crate) fn whole(message: impl Into<String>) -> ParamError {
        ParamError {
            param: None,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for ParamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.param {
            Some(p) => write!(f, "params.{p}: {}", self.message),
            None => write!(f, "params: {}", self.message),
        }
    }
}

impl std::error::Error for ParamError {}

/// The parameters of one job kind.
pub trait KindParams: Serialize + DeserializeOwned {
    const KIND: &'static str;
    const DESCRIPTION: &'static str;
    /// Every field of the struct, in form order.
    const PARAMS: &'static [ParamDoc];

    /// What a job without these params runs with: the fields that have a default.
    fn defaults() -> Value {
        Self::decode(&Value::Null)
            .ok()
            .and_then(|t| serde_json::to_value(t).ok())
            .unwrap_or(Value::Null)
    }

    /// Rules across fields (min ≤ max, ...), after each field passed its own.
    fn check(&self) -> Result<(), ParamError> {
        Ok(())
    }

    /// Decodes a job's `params` (null is `{}`), naming the parameter at fault.
    fn decode(params: &Value) -> Result<Self, ParamError> {
        let params = match params {
            Value::Null => Value::Object(Default::default()),
            Value::Object(_) => params.clone(),
            other => return Err(ParamError::whole(format!("must be an object, got {other}"))),
        };
        let typed: Self = decode_object(Self::KIND, Self::PARAMS, params)?;
        check_documented(Self::PARAMS, &typed)?;
        typed.check()?;
        Ok(typed)
    }
}

/// serde's decoding with the failing field's path, and unknown fields named with the
/// kind's known ones.
pub(crate) fn decode_object<T: DeserializeOwned>(
    kind: &str,
    docs: &[ParamDoc],
    params: Value,
) -> Result<T, ParamError> {
    if let Some(obj) = params.as_object()
        && let Some(unknown) = obj.keys().find(|k| !docs.iter().any(|d| d.name == *k))
    {
        let known: Vec<&str> = docs.iter().map(|d| d.name).collect();
        return Err(ParamError::new(
            unknown.clone(),
            format!(
                "unknown parameter of kind {kind} (known: {})",
                known.join(", ")
            ),
        ));
    }
    serde_path_to_error::deserialize(params).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        if path == "." || path.is_empty() {
            ParamError::whole(inner)
        } else {
            let top = path.split(['.', '[']).next().unwrap_or(&path).to_string();
            ParamError::new(top, inner)
        }
    })
}

fn check_documented<T: Serialize>(docs: &[ParamDoc], typed: &T) -> Result<(), ParamError> {
    let v = serde_json::to_value(typed).map_err(|e| ParamError::whole(e.to_string()))?;
    for doc in docs {
        if let Some(field) = v.get(doc.name) {
            doc.check(field).map_err(|m| ParamError::new(doc.name, m))?;
        }
    }
    Ok(())
}

/// A kind as the catalogue endpoint describes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunKind {
    pub name: String,
    pub description: String,
    pub params: Vec<RunKindParam>,
}

/// One parameter of a kind: what a form needs to ask for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunKindParam {
    pub name: String,
    #[serde(rename = "type")]
    pub ty: ParamType,
    pub required: bool,
    /// What a job without this parameter runs with; absent when there is none (the
    /// runner decides, e.g. "all GPUs").
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub default: Option<Value>,
    #[serde(default)]
    pub unit: Option<String>,
    #[serde(default)]
    pub min: Option<f64>,
    #[serde(default)]
    pub max: Option<f64>,
    #[serde(default)]
    pub choices: Vec<String>,
    pub help: String,
}
