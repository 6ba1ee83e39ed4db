//! What a client (the agent, the CLI) trusts: the system's roots, a private CA given with
//! `--ca-file`, and optionally the server's key pinned with `--pin-sha256`.

use std::error::Error as StdError;
use std::path::PathBuf;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, OtherError, RootCertStore, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use crate::{Pin, TlsError, pem};

/// The clients' TLS flags. `global`, so the CLI takes them after any subcommand.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ClientTls {
    /// PEM file of CA certificates trusted besides the system's roots: the private CA that
    /// signed the server's certificate.
    #[arg(long, env = "HEDDLE_CA_FILE", global = true, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    /// Also require the server's certificate to carry this key: the SHA-256 of the leaf
    /// certificate's SubjectPublicKeyInfo, written `sha256//<base64>` (the server logs its
    /// own at start-up). Checked on top of the CA and host name. Repeat or separate with
    /// commas to accept several keys during a rotation.
    #[arg(
        long = "pin-sha256",
        env = "HEDDLE_SERVER_PIN",
        value_delimiter = ',',
        global = true,
        value_name = "PIN"
    )]
    pub pins: Vec<Pin>,
}

impl ClientTls {
    /// The rustls configuration for these servers, or `None` when none of them is
    /// `https://` (then nothing is encrypted and nothing is verified). A pin with only
    /// `http://` servers is refused: it would silently protect nothing.
    pub fn for_urls<'a>(
        &self,
        urls: impl IntoIterator<Item = &'a str>,
    ) -> Result<Option<rustls::ClientConfig>, TlsError> {
        let any_https = urls
            .into_iter()
            .any(|u| u.trim().to_ascii_lowercase().starts_with("https://"));
        if any_https {
            return self.rustls_config().map(Some);
        }
        if !self.pins.is_empty() {
            return Err(TlsError::Config(
                "--pin-sha256 (HEDDLE_SERVER_PIN) is given but every server URL is http://, \
                 which cannot be pinned: use https:// URLs"
                    .into(),
            ));
        }
        if let Some(ca) = &self.ca_file {
            tracing::warn!(
                ca_file = %ca.display(),
                "--ca-file is ignored: every server URL is http://, nothing is encrypted"
            );
        }
        Ok(None)
    }

    /// System roots plus `--ca-file`, the host name checked, and the pins if any.
    pub fn rustls_config(&self) -> Result<rustls::ClientConfig, TlsError> {
        let provider = crate::provider();
        let mut roots = RootCertStore::empty();
        let native = rustls_native_certs::load_native_certs();
        for err in &native.errors {
            tracing::debug!(error = %err, "skipping unreadable system CA certificates");
        }
        roots.add_parsable_certificates(native.certs);
        if let Some(path) = &self.ca_file {
            for cert in pem::load_certs(path)? {
                roots.add(cert).map_err(|e| {
                    TlsError::BadCertificate(format!("{} (--ca-file): {e}", path.display()))
                })?;
            }
        }
        if roots.is_empty() {
            return Err(TlsError::Config(
                "no trusted CA certificates: the system has none (install the ca-certificates \
                 package) and no --ca-file (HEDDLE_CA_FILE) was given"
                    .into(),
            ));
        }
        let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
            .build()
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let verifier: Arc<dyn ServerCertVerifier> = if self.pins.is_empty() {
            webpki
        } else {
            Arc::new(PinningVerifier {
                inner: webpki,
                pins: self.pins.clone(),
            })
        };
        Ok(rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth())
    }
}

/// The usual verification first (chain to a trusted root, host name, validity), then the
/// leaf's key against the pins.
#[derive(Debug)]
struct PinningVerifier {
    inner: Arc<WebPkiServerVerifier>,
    pins: Vec<Pin>,
}

impl ServerCertVerifier for PinningVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verified = self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )?;
        let found = Pin::of_certificate(end_entity)
            .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::BadEncoding))?;
        if self.pins.contains(&found) {
            return Ok(verified);
        }
        Err(rustls::Error::InvalidCertificate(CertificateError::Other(
            OtherError(Arc::new(PinMismatch {
                found,
                expected: self.pins.clone(),
            })),
        )))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The server presented a valid certificate whose key is not among the pins.
#[derive(Debug, thiserror::Error)]
#[error(
    "the server's certificate key is {found}, which is not a pinned key ({pins}): the server's \
     key was replaced, or this is not the server you meant. Check the server's start-up log \
     for its pin and update --pin-sha256 (HEDDLE_SERVER_PIN)",
    pins = .expected.iter().map(Pin::to_string).collect::<Vec<_>>().join(", ")
)]
pub struct PinMismatch {
    pub found: Pin,
    pub expected: Vec<Pin>,
}

/// An error with its whole cause chain (an HTTP client's top-level message usually names
/// none), followed by what to do when it is a TLS failure with a known remedy.
pub fn describe(err: &(dyn StdError + 'static)) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    if let Some(hint) = explain(err) {
        out.push_str(" -- ");
        out.push_str(&hint);
    }
    out
}

/// A sentence saying what to do about a failed TLS connection, when the error chain holds
/// a rustls error that has a known remedy. HTTP clients hide the rustls error inside I/O
/// errors (hyper-rustls nests one in another), whose `source()` skips what they wrap, so
/// each link is also opened as an `io::Error`, as deep as they go.
pub fn explain(err: &(dyn StdError + 'static)) -> Option<String> {
    let mut next = Some(err);
    while let Some(link) = next {
        let mut e: &(dyn StdError + 'static) = link;
        loop {
            if let Some(tls) = e.downcast_ref::<rustls::Error>() {
                return explain_rustls(tls);
            }
            match e
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
            {
                Some(inner) => e = inner,
                None => break,
            }
        }
        next = link.source();
    }
    None
}

fn explain_rustls(err: &rustls::Error) -> Option<String> {
    use CertificateError as C;
    let text = match err {
        rustls::Error::InvalidCertificate(cert) => match cert {
            C::UnknownIssuer => {
                "the server's certificate is not signed by a CA this client trusts: give that \
                 CA's certificate (PEM) with --ca-file (HEDDLE_CA_FILE)"
                    .to_string()
            }
            C::NotValidForName | C::NotValidForNameContext { .. } => {
                "the server's certificate does not name the host in the server URL: use a URL \
                 with a name (or IP address) the certificate lists"
                    .to_string()
            }
            C::Expired | C::ExpiredContext { .. } => {
                "the server's certificate has expired: renew it (the server reloads the files \
                 without a restart)"
                    .to_string()
            }
            C::NotValidYet | C::NotValidYetContext { .. } => {
                "the server's certificate is not valid yet: check both machines' clocks".to_string()
            }
            C::Other(other) => {
                let inner: &(dyn StdError + 'static) = &*other.0;
                inner.downcast_ref::<PinMismatch>()?.to_string()
            }
            _ => return None,
        },
        rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => {
            "the server did not answer in TLS: it may serve plain HTTP on this port (use an \
             http:// URL, or give the server --tls-cert and --tls-key)"
                .to_string()
        }
        _ => return None,
    };
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_only_needs_no_tls_and_refuses_pins() {
        let none = ClientTls::default();
        assert!(none.for_urls(["http://a:1"]).unwrap().is_none());
        let files = crate::test_ca::TestCa::new().write_server_files("localhost");
        let pinned = ClientTls {
            ca_file: Some(files.ca.clone()),
            pins: vec![
                "sha256//AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="
                    .parse()
                    .unwrap(),
            ],
        };
        let err = pinned.for_urls(["http://a:1"]).unwrap_err().to_string();
        assert!(err.contains("--pin-sha256"), "{err}");
        assert!(
            pinned
                .for_urls(["http://a:1", "HTTPS://b:2"])
                .unwrap()
                .is_some()
        );
    }

    #[test]
    fn an_unreadable_ca_file_is_named() {
        let tls = ClientTls {
            ca_file: Some("/nonexistent/ca.pem".into()),
            pins: vec![],
        };
        let err = tls.rustls_config().unwrap_err().to_string();
        assert!(err.contains("/nonexistent/ca.pem"), "{err}");
    }

    #[test]
    fn explain_finds_rustls_errors_inside_io_errors() {
        let unknown = rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, unknown);
        let hint = explain(&io).unwrap();
        assert!(hint.contains("--ca-file"), "{hint}");
        let pin: Pin = "sha256//AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="
            .parse()
            .unwrap();
        let mismatch = rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(
            Arc::new(PinMismatch {
                found: pin,
                expected: vec![pin],
            }),
        )));
        // Nested as hyper-rustls does.
        let nested = std::io::Error::other(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            mismatch,
        ));
        let hint = explain(&nested).unwrap();
        assert!(hint.contains("HEDDLE_SERVER_PIN"), "{hint}");
        assert!(explain(&std::io::Error::other("plain")).is_none());
    }
}
