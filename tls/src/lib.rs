//! TLS for Heddle: what the server, the agent and the CLI must agree on, kept in one place.
//!
//! - `pem`: reading certificates and keys from PEM files, with errors that name the file;
//! - `Pin`: the SHA-256 of a certificate's SubjectPublicKeyInfo, how it is written and parsed;
//! - `ClientTls`: the clients' trust settings (`--ca-file`, `--pin-sha256`), the rustls
//!   configuration built from them, and `explain`, which turns a handshake failure into a
//!   sentence that says what to do.
//!
//! rustls with the *ring* provider everywhere; no OpenSSL.

mod client;
pub mod pem;
mod pin;
#[cfg(any(test, feature = "test-ca"))]
pub mod test_ca;

use std::sync::Arc;

pub use client::{ClientTls, PinMismatch, describe, explain};
pub use pin::Pin;
pub use rustls;

/// The one crypto provider every Heddle TLS configuration uses.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {what} {path}: {detail}")]
    Read {
        what: &'static str,
        path: String,
        detail: String,
    },
    #[error("{path} holds no PEM {what}; expected a `-----BEGIN {marker}-----` block")]
    Empty {
        what: &'static str,
        path: String,
        marker: &'static str,
    },
    #[error("the certificate in {cert} does not match the key in {key}: {detail}")]
    KeyMismatch {
        cert: String,
        key: String,
        detail: String,
    },
    #[error("unusable certificate: {0}")]
    BadCertificate(String),
    #[error("building the TLS configuration: {0}")]
    Config(String),
}
