//! The JSON body extractor every handler uses: the size limit of the route
//! (`DefaultBodyLimit`), a nesting cap checked on the raw bytes before anything is parsed,
//! and rejections in the API's `{error, message}` shape.

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, JsonRejection};
use axum::extract::{FromRequest, Request};
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

/// Deepest nesting of arrays and objects accepted in a request body. Facts, results and
/// plugin documents nest fewer than 10 levels; serde_json would stop at 128, but the
/// values are stored as JSONB and handed to plugins, which walk them recursively again.
pub const MAX_JSON_DEPTH: usize = 64;

/// `axum::Json` with the nesting cap, whose rejections become `ApiError`s (`error.rs`).
#[derive(Debug)]
pub struct Json<T>(pub T);

/// Why a request body was refused; `error.rs` turns it into the API's error response.
#[derive(Debug, thiserror::Error)]
pub enum BodyRejection {
    #[error("expected a JSON body: send it with `Content-Type: application/json`")]
    NotJson,
    #[error("the JSON body nests arrays and objects deeper than {0} levels; flatten it")]
    TooDeep(usize),
    #[error(transparent)]
    Bytes(#[from] BytesRejection),
    #[error(transparent)]
    Json(#[from] JsonRejection),
}

impl<T, S> FromRequest<S> for Json<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = BodyRejection;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        if !is_json(req.headers()) {
            return Err(BodyRejection::NotJson);
        }
        let bytes = Bytes::from_request(req, state).await?;
        check_depth(&bytes, MAX_JSON_DEPTH)?;
        let axum::Json(value) = axum::Json::<T>::from_bytes(&bytes)?;
        Ok(Json(value))
    }
}

impl<T: serde::Serialize> IntoResponse for Json<T> {
    fn into_response(self) -> Response {
        axum::Json(self.0).into_response()
    }
}

fn is_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = value
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// Refuses a body whose arrays and objects nest deeper than `max`, by one pass over the
/// bytes (brackets inside strings do not count), before any parser recurses into it.
pub fn check_depth(bytes: &[u8], max: usize) -> Result<(), BodyRejection> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for &b in bytes {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return Err(BodyRejection::TooDeep(max));
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested(n: usize) -> String {
        format!("{}{}", "[".repeat(n), "]".repeat(n))
    }

    #[test]
    fn depth_is_counted_outside_strings_only() {
        assert!(check_depth(nested(64).as_bytes(), 64).is_ok());
        assert!(matches!(
            check_depth(nested(65).as_bytes(), 64),
            Err(BodyRejection::TooDeep(64))
        ));
        let in_string = format!(r#"{{"a": "{}"}}"#, "[".repeat(1000));
        assert!(check_depth(in_string.as_bytes(), 2).is_ok());
        // An escaped quote does not end the string.
        let escaped = format!(r#"{{"a": "\"{}"}}"#, "{".repeat(10));
        assert!(check_depth(escaped.as_bytes(), 1).is_ok());
        assert!(check_depth(br#"{"a": {"b": [1, {"c": 2}]}}"#, 4).is_ok());
        assert!(check_depth(br#"{"a": {"b": [1, {"c": 2}]}}"#, 3).is_err());
    }

    #[test]
    fn json_content_types() {
        let mut h = HeaderMap::new();
        assert!(!is_json(&h));
        h.insert(
            header::CONTENT_TYPE,
            "application/json; charset=utf-8".parse().unwrap(),
        );
        assert!(is_json(&h));
        h.insert(
            header::CONTENT_TYPE,
            "application/problem+json".parse().unwrap(),
        );
        assert!(is_json(&h));
        h.insert(header::CONTENT_TYPE, "text/plain".parse().unwrap());
        assert!(!is_json(&h));
    }
}
