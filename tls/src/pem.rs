//! PEM files: certificate chains, private keys, and the two paired for a server.

use std::path::Path;
use std::sync::Arc;

use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::TlsError;

/// Every certificate in a PEM file, in file order (for a server: leaf first, then the
/// intermediates).
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .map_err(|e| read_error("certificates", path, e))?;
    if certs.is_empty() {
        return Err(TlsError::Empty {
            what: "certificate",
            path: path.display().to_string(),
            marker: "CERTIFICATE",
        });
    }
    Ok(certs)
}

/// The first private key in a PEM file (PKCS#8, PKCS#1 RSA or SEC1 EC).
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| match e {
        pem::Error::NoItemsFound => TlsError::Empty {
            what: "private key",
            path: path.display().to_string(),
            marker: "PRIVATE KEY",
        },
        e => read_error("private key", path, e),
    })
}

/// A server's certificate chain and the key that signs for it, checked to belong together.
pub fn load_certified_key(cert: &Path, key: &Path) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain = load_certs(cert)?;
    let der = load_key(key)?;
    let certified = CertifiedKey::from_der(chain, der, &crate::provider()).map_err(|e| {
        TlsError::KeyMismatch {
            cert: cert.display().to_string(),
            key: key.display().to_string(),
            detail: e.to_string(),
        }
    })?;
    Ok(Arc::new(certified))
}

fn read_error(what: &'static str, path: &Path, e: pem::Error) -> TlsError {
    TlsError::Read {
        what,
        path: path.display().to_string(),
        detail: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_ca::TestCa;

    #[test]
    fn a_certificate_and_its_key_load_and_pair() {
        let ca = TestCa::new();
        let dir = ca.write_server_files("localhost");
        let ck = load_certified_key(&dir.cert, &dir.key).unwrap();
        assert_eq!(ck.cert.len(), 1);
    }

    #[test]
    fn a_key_of_another_certificate_is_refused_with_both_paths() {
        let ca = TestCa::new();
        let a = ca.write_server_files("localhost");
        let b = ca.write_server_files("localhost");
        let err = load_certified_key(&a.cert, &b.key).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, TlsError::KeyMismatch { .. }), "{msg}");
        assert!(msg.contains(&a.cert.display().to_string()), "{msg}");
        assert!(msg.contains(&b.key.display().to_string()), "{msg}");
    }

    #[test]
    fn files_without_pem_blocks_say_what_was_expected() {
        let ca = TestCa::new();
        let files = ca.write_server_files("localhost");
        // A key file given as the certificate, and the other way round.
        let err = load_certs(&files.key).unwrap_err().to_string();
        assert!(err.contains("BEGIN CERTIFICATE"), "{err}");
        let err = load_key(&files.cert).unwrap_err().to_string();
        assert!(err.contains("BEGIN PRIVATE KEY"), "{err}");
        let missing = files.cert.with_file_name("absent.pem");
        let err = load_certs(&missing).unwrap_err().to_string();
        assert!(err.contains("absent.pem"), "{err}");
    }
}
