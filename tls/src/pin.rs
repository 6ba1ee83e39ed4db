//! Certificate pins: the SHA-256 of the leaf certificate's DER-encoded SubjectPublicKeyInfo.
//!
//! The public key rather than the whole certificate, so a certificate renewed with the same
//! key keeps its pin (as with HPKP and curl's `--pinnedpubkey`). Written `sha256//<base64>`;
//! bare base64 and 64 hex digits (colons allowed) are read too.

use std::fmt;
use std::str::FromStr;

use base64::Engine as _;
use rustls_pki_types::CertificateDer;
use sha2::{Digest, Sha256};

use crate::TlsError;

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Pin([u8; 32]);

const PREFIX: &str = "sha256//";

impl Pin {
    /// The pin of a DER certificate: the hash of its SubjectPublicKeyInfo.
    pub fn of_certificate(cert: &CertificateDer<'_>) -> Result<Pin, TlsError> {
        let parsed = rustls::server::ParsedCertificate::try_from(cert)
            .map_err(|e| TlsError::BadCertificate(e.to_string()))?;
        Ok(Pin(Sha256::digest(
            parsed.subject_public_key_info().as_ref(),
        )
        .into()))
    }

    pub fn bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Display for Pin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b64 = base64::engine::general_purpose::STANDARD.encode(self.0);
        write!(f, "{PREFIX}{b64}")
    }
}

impl fmt::Debug for Pin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for Pin {
    type Err = String;

    fn from_str(s: &str) -> Result<Pin, String> {
        let s = s.trim();
        let body = s.strip_prefix(PREFIX).unwrap_or(s);
        let hex_digits: String = body.chars().filter(|c| *c != ':').collect();
        let bytes = if hex_digits.len() == 64 && hex_digits.bytes().all(|b| b.is_ascii_hexdigit()) {
            hex::decode(&hex_digits).map_err(|e| e.to_string())?
        } else {
            base64::engine::general_purpose::STANDARD
                .decode(body)
                .map_err(|_| invalid(s))?
        };
        let bytes: [u8; 32] = bytes.try_into().map_err(|_| invalid(s))?;
        Ok(Pin(bytes))
    }
}

fn invalid(s: &str) -> String {
    format!(
        "{s:?} is not a SHA-256 pin: write sha256//<base64 of 32 bytes> (the server logs its \
         own at start-up) or 64 hex digits"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_ca::TestCa;

    #[test]
    fn the_three_spellings_parse_to_one_pin() {
        let bytes: [u8; 32] = std::array::from_fn(|i| i as u8 * 7);
        let pin = Pin(bytes);
        let written = pin.to_string();
        assert!(written.starts_with("sha256//"), "{written}");
        assert_eq!(written.parse::<Pin>().unwrap(), pin);
        assert_eq!(written["sha256//".len()..].parse::<Pin>().unwrap(), pin);
        assert_eq!(hex::encode(bytes).parse::<Pin>().unwrap(), pin);
        let colons: Vec<String> = bytes.iter().map(|b| format!("{b:02X}")).collect();
        assert_eq!(colons.join(":").parse::<Pin>().unwrap(), pin);
    }

    #[test]
    fn wrong_lengths_and_garbage_are_refused() {
        let short_hex = "ab".repeat(31);
        for bad in [
            "",
            "sha256//",
            "abc",
            "sha256//AAAA",
            &short_hex,
            "not base64!",
        ] {
            let err = bad.parse::<Pin>().unwrap_err();
            assert!(err.contains("not a SHA-256 pin"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn the_pin_follows_the_key_not_the_certificate() {
        let ca = TestCa::new();
        let a = ca.issue("localhost");
        let b = ca.issue("localhost");
        let pa = Pin::of_certificate(&a.cert_der).unwrap();
        assert_ne!(pa, Pin::of_certificate(&b.cert_der).unwrap());
        // Same key, new certificate (a renewal): same pin.
        let renewed = ca.reissue(&a, "localhost");
        assert_ne!(renewed.cert_der, a.cert_der);
        assert_eq!(Pin::of_certificate(&renewed.cert_der).unwrap(), pa);
        // And it is the SHA-256 of the SPKI as rcgen reports it.
        let spki = rcgen::PublicKeyData::subject_public_key_info(&a.key);
        assert_eq!(pa.bytes(), &<[u8; 32]>::from(Sha256::digest(&spki)));
    }
}
