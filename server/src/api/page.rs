//! Keyset pagination for list endpoints: `?limit=` and an opaque `?cursor=` in, the page's
//! rows as the body (so clients that read one page keep working) and, when the page is
//! full, the cursor of the next one in the `x-next-cursor` header. A cursor is the sort
//! key of the page's last row; the next page starts after it, so rows inserted or deleted
//! meanwhile neither repeat nor shift what follows.

use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use heddle_types::NEXT_CURSOR_HEADER;

use crate::http::error::{ApiError, Json};

/// Cursor version, so a cursor of another shape is refused rather than misread.
const PREFIX: &str = "c1:";

/// The cursor that resumes after a row whose sort key is `key`.
pub fn encode(key: &str) -> String {
    URL_SAFE_NO_PAD.encode(format!("{PREFIX}{key}"))
}

/// The sort key a cursor resumes after.
pub fn decode(cursor: &str) -> Result<String, ApiError> {
    let refuse =
        || ApiError::BadRequest("cursor is not one this server handed out (x-next-cursor)".into());
    if cursor.len() > 1024 {
        return Err(refuse());
    }
    let bytes = URL_SAFE_NO_PAD.decode(cursor).map_err(|_| refuse())?;
    let text = String::from_utf8(bytes).map_err(|_| refuse())?;
    let key = text.strip_prefix(PREFIX).ok_or_else(refuse)?;
    if key.chars().any(char::is_control) {
        return Err(refuse());
    }
    Ok(key.to_string())
}

/// One page of a list, answered as its JSON array plus the next cursor.
pub struct Page<T> {
    pub rows: Vec<T>,
    pub next: Option<String>,
}

impl<T> Page<T> {
    /// A page of at most `limit` rows: `rows` was fetched with `limit + 1`, so a row beyond
    /// the limit means there is a next page, which starts after the last row kept.
    pub fn of(mut rows: Vec<T>, limit: i64, key: impl Fn(&T) -> String) -> Page<T> {
        let limit = usize::try_from(limit).unwrap_or(0);
        let next = if rows.len() > limit {
            rows.truncate(limit);
            rows.last().map(|r| encode(&key(r)))
        } else {
            None
        };
        Page { rows, next }
    }

    pub fn map<U>(self, f: impl FnMut(T) -> U) -> Page<U> {
        Page {
            rows: self.rows.into_iter().map(f).collect(),
            next: self.next,
        }
    }
}

impl<T: serde::Serialize> IntoResponse for Page<T> {
    fn into_response(self) -> Response {
        let mut response = Json(self.rows).into_response();
        if let Some(next) = self.next.and_then(|n| HeaderValue::from_str(&n).ok()) {
            response.headers_mut().insert(NEXT_CURSOR_HEADER, next);
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_foreign_ones_are_refused() {
        let c = encode("dgx-01.example");
        assert!(
            c.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        );
        assert_eq!(decode(&c).unwrap(), "dgx-01.example");
        for bad in [
            "",
            "!!",
            &URL_SAFE_NO_PAD.encode("x:1"),
            &URL_SAFE_NO_PAD.encode("c1:\n"),
        ] {
            assert!(
                matches!(decode(bad), Err(ApiError::BadRequest(_))),
                "{bad:?}"
            );
        }
        assert!(decode(&"A".repeat(2000)).is_err());
    }

    #[test]
    fn a_full_page_has_a_next_cursor_after_its_last_row() {
        let page = Page::of(vec![1, 2, 3], 2, |n| n.to_string());
        assert_eq!(page.rows, vec![1, 2]);
        assert_eq!(decode(&page.next.unwrap()).unwrap(), "2");
        let last = Page::of(vec![1, 2], 2, |n| n.to_string());
        assert_eq!((last.rows.len(), last.next), (2, None));
    }
}
