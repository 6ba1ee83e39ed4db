//! A throwaway certificate authority for tests (feature `test-ca`): a fresh CA key per
//! value, server certificates for any name, and the PEM files a server or client reads.
//! Files go to a private temporary directory removed with the value that holds it.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SerialNumber,
};
use rustls_pki_types::CertificateDer;

use crate::Pin;

pub struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    pub cert_pem: String,
    pub cert_der: CertificateDer<'static>,
}

/// A certificate issued by a `TestCa`, with its key.
pub struct Issued {
    pub cert_pem: String,
    pub cert_der: CertificateDer<'static>,
    pub key: KeyPair,
    pub key_pem: String,
}

impl Issued {
    pub fn pin(&self) -> Pin {
        Pin::of_certificate(&self.cert_der).expect("a certificate rcgen made parses")
    }
}

/// PEM files for a server (`cert`, `key`) and its clients (`ca`), in a private directory.
pub struct ServerFiles {
    pub dir: tempfile::TempDir,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
    pub issued: Issued,
}

impl ServerFiles {
    /// Replaces the certificate and key files with `issued`'s, each in one rename, the key
    /// first, as a certificate manager would.
    pub fn replace(&mut self, issued: Issued) {
        write_atomically(&self.key, issued.key_pem.as_bytes());
        write_atomically(&self.cert, issued.cert_pem.as_bytes());
        self.issued = issued;
    }
}

impl Default for TestCa {
    fn default() -> Self {
        Self::new()
    }
}

impl TestCa {
    pub fn new() -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("no names");
        params.distinguished_name.push(
            DnType::CommonName,
            format!("Heddle test CA {}", next_serial()),
        );
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().expect("generating a CA key");
        let cert = params.self_signed(&key).expect("self-signing the CA");
        TestCa {
            cert_pem: cert.pem(),
            cert_der: cert.der().clone(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A server certificate for `name` (a DNS name or an IP address) with a new key.
    pub fn issue(&self, name: &str) -> Issued {
        self.sign(name, KeyPair::generate().expect("generating a server key"))
    }

    /// A new certificate for `name` with the key of `previous` (a renewal).
    pub fn reissue(&self, previous: &Issued, name: &str) -> Issued {
        let key = KeyPair::from_pem(&previous.key_pem).expect("re-reading a key rcgen wrote");
        self.sign(name, key)
    }

    fn sign(&self, name: &str, key: KeyPair) -> Issued {
        let mut params = CertificateParams::new(vec![name.to_string()]).expect("a valid name");
        params.distinguished_name.push(DnType::CommonName, name);
        params.serial_number = Some(SerialNumber::from(next_serial()));
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("signing a server certificate");
        Issued {
            cert_pem: cert.pem(),
            cert_der: cert.der().clone(),
            key_pem: key.serialize_pem(),
            key,
        }
    }

    /// A server certificate for `name`, written with its key and this CA's certificate.
    pub fn write_server_files(&self, name: &str) -> ServerFiles {
        let dir = tempfile::Builder::new()
            .prefix("heddle-tls-")
            .tempdir()
            .expect("creating a private temporary directory");
        let issued = self.issue(name);
        let cert = dir.path().join("server.crt");
        let key = dir.path().join("server.key");
        let ca = dir.path().join("ca.crt");
        write_atomically(&cert, issued.cert_pem.as_bytes());
        write_atomically(&key, issued.key_pem.as_bytes());
        write_atomically(&ca, self.cert_pem.as_bytes());
        ServerFiles {
            dir,
            cert,
            key,
            ca,
            issued,
        }
    }
}

fn next_serial() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(1);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    (nanos & !0xffff) | (COUNTER.fetch_add(1, Ordering::Relaxed) & 0xffff)
}

/// Writes a sibling file and renames it over `path`, so a reader never sees half a file
/// (and a new inode tells the change apart even within one tick of the file-time clock).
pub fn write_atomically(path: &Path, bytes: &[u8]) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .expect("writing a test PEM file");
    f.write_all(bytes).expect("writing a test PEM file");
    f.sync_all().ok();
    std::fs::rename(&tmp, path).expect("renaming a test PEM file into place");
}
