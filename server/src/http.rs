//! The request layer every route passes through: credentials and tokens (`auth`), the JSON
//! body extractor (`json`), the one error type and its mapping to HTTP (`error`), request
//! limits (`limits`), request metrics and the `/metrics` token (`metrics`) and the HTTPS
//! listener (`tls`). Handlers are in `api/`, routes in `router.rs`.

pub mod auth;
pub mod error;
pub mod json;
pub mod limits;
pub mod metrics;
pub mod tls;
