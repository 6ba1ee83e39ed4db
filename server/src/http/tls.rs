//! HTTPS served by the server itself: the certificate and key from PEM files, reloaded when
//! either file changes, and a listener that finishes TLS handshakes off the accept path.
//!
//! Reloading is by polling the files' metadata (modification time, size, inode;
//! `workers/tls_reload.rs`), which also notices a Kubernetes secret volume swapping its
//! symlinks. A replacement that cannot be
//! used (half written, key not matching the certificate) is logged and the previous
//! certificate stays in service; the next change is tried again.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use anyhow::Context;
use heddle_tls::Pin;
use heddle_tls::rustls::server::{ClientHello, ResolvesServerCert};
use heddle_tls::rustls::sign::CertifiedKey;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::config::Config;

/// Handshakes in progress at once; beyond this the listener stops accepting until one ends.
const MAX_HANDSHAKES: usize = 1024;
/// A client that has not finished its handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The certificate files and what was last loaded from them.
#[derive(Debug)]
pub struct CertFiles {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<Arc<CertifiedKey>>,
    /// The files' metadata at the last load attempt, successful or not.
    seen: Mutex<Option<Stamp>>,
}

/// What tells a file apart from its previous version without reading it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileStamp {
    modified: Option<SystemTime>,
    len: u64,
    ino: u64,
    dev: u64,
}

type Stamp = (FileStamp, FileStamp);

fn stamp(path: &Path) -> std::io::Result<FileStamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path)?;
    Ok(FileStamp {
        modified: m.modified().ok(),
        len: m.len(),
        ino: m.ino(),
        dev: m.dev(),
    })
}

impl CertFiles {
    /// The TLS files of `config`, loaded; `None` for plain HTTP. An unusable file is an
    /// error here, at start-up, unlike on a reload.
    pub fn from_config(config: &Config) -> anyhow::Result<Option<Arc<CertFiles>>> {
        match (&config.tls_cert, &config.tls_key) {
            (None, None) => Ok(None),
            (Some(cert), Some(key)) => CertFiles::load(cert, key).map(Some),
            _ => anyhow::bail!(
                "give both --tls-cert and --tls-key (HEDDLE_TLS_CERT, HEDDLE_TLS_KEY) to serve \
                 HTTPS, or neither for plain HTTP"
            ),
        }
    }

    pub fn load(cert: &Path, key: &Path) -> anyhow::Result<Arc<CertFiles>> {
        let seen = stamp(cert).ok().zip(stamp(key).ok());
        let certified = heddle_tls::pem::load_certified_key(cert, key)
            .context("loading the TLS certificate (--tls-cert, --tls-key)")?;
        Ok(Arc::new(CertFiles {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            current: RwLock::new(certified),
            seen: Mutex::new(seen),
        }))
    }

    /// The pin clients give with `--pin-sha256` to accept only this certificate's key.
    pub fn pin(&self) -> Option<Pin> {
        let current = self.current.read().expect("certificate lock").clone();
        current
            .cert
            .first()
            .and_then(|leaf| Pin::of_certificate(leaf).ok())
    }

    /// Loads the files again if either changed since the last attempt. True when a new
    /// certificate is now in service.
    pub fn reload_if_changed(&self) -> bool {
        let now = match stamp(&self.cert).and_then(|c| Ok((c, stamp(&self.key)?))) {
            Ok(s) => Some(s),
            Err(err) => {
                // Between a delete and a create: wait for the file to come back.
                tracing::debug!(error = %err, "TLS certificate or key file unreadable");
                return false;
            }
        };
        {
            let mut seen = self.seen.lock().expect("stamp lock");
            if *seen == now {
                return false;
            }
            *seen = now;
        }
        match heddle_tls::pem::load_certified_key(&self.cert, &self.key) {
            Ok(certified) => {
                *self.current.write().expect("certificate lock") = certified;
                tracing::info!(
                    cert = %self.cert.display(),
                    pin = %self.pin().map(|p| p.to_string()).unwrap_or_default(),
                    "TLS certificate reloaded"
                );
                true
            }
            Err(err) => {
                tracing::error!(
                    error = %err,
                    "the changed TLS certificate or key cannot be used; still serving the \
                     previous one"
                );
                false
            }
        }
    }

    /// The rustls server configuration, which asks `self` for the certificate at every
    /// handshake.
    pub fn acceptor(self: &Arc<Self>) -> anyhow::Result<TlsAcceptor> {
        let mut config =
            heddle_tls::rustls::ServerConfig::builder_with_provider(heddle_tls::provider())
                .with_safe_default_protocol_versions()
                .context("TLS protocol versions")?
                .with_no_client_auth()
                .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(TlsAcceptor::from(Arc::new(config)))
    }
}

impl ResolvesServerCert for CertFiles {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().expect("certificate lock").clone())
    }
}

/// A TCP listener whose connections come out with their TLS handshake done. Handshakes run
/// in tasks of their own, so a client that stalls mid-handshake delays nobody else.
pub struct TlsListener {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    handshakes: JoinSet<Option<(TlsStream<TcpStream>, SocketAddr)>>,
}

impl TlsListener {
    pub fn new(tcp: TcpListener, acceptor: TlsAcceptor) -> TlsListener {
        TlsListener {
            tcp,
            acceptor,
            handshakes: JoinSet::new(),
        }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            tokio::select! {
                (tcp, addr) = axum::serve::Listener::accept(&mut self.tcp),
                    if self.handshakes.len() < MAX_HANDSHAKES =>
                {
                    let acceptor = self.acceptor.clone();
                    self.handshakes.spawn(async move {
                        match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                            Ok(Ok(tls)) => Some((tls, addr)),
                            Ok(Err(err)) => {
                                tracing::debug!(%addr, error = %err, "TLS handshake failed");
                                None
                            }
                            Err(_) => {
                                tracing::debug!(%addr, "TLS handshake timed out");
                                None
                            }
                        }
                    });
                }
                Some(done) = self.handshakes.join_next(), if !self.handshakes.is_empty() => {
                    if let Ok(Some(conn)) = done {
                        return conn;
                    }
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.tcp.local_addr()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use heddle_tls::test_ca::{TestCa, write_atomically};

    #[test]
    fn half_a_configuration_is_refused() {
        let mut config = Config::for_database("postgres://unused");
        config.tls_cert = Some("/etc/cert.pem".into());
        let err = CertFiles::from_config(&config).unwrap_err().to_string();
        assert!(err.contains("--tls-key"), "{err}");
        config.tls_cert = None;
        assert!(CertFiles::from_config(&config).unwrap().is_none());
    }

    #[test]
    fn a_missing_file_fails_the_start_and_names_the_flag() {
        let ca = TestCa::new();
        let files = ca.write_server_files("localhost");
        let err = CertFiles::load(&files.cert, &files.dir.path().join("absent.key")).unwrap_err();
        let msg = format!("{err:#}");
        assert!(
            msg.contains("--tls-cert") && msg.contains("absent.key"),
            "{msg}"
        );
    }

    #[test]
    fn a_change_is_loaded_once_and_a_bad_one_keeps_the_old_certificate() {
        let ca = TestCa::new();
        let mut files = ca.write_server_files("localhost");
        let served = CertFiles::load(&files.cert, &files.key).unwrap();
        let first = files.issued.pin();
        assert_eq!(served.pin(), Some(first));
        assert!(!served.reload_if_changed(), "nothing changed");

        let next = ca.issue("localhost");
        let second = next.pin();
        files.replace(next);
        assert!(served.reload_if_changed());
        assert_eq!(served.pin(), Some(second));
        assert!(!served.reload_if_changed(), "loaded once");

        // A certificate whose key is not the one on disk: refused, the old one stays.
        let other = ca.issue("localhost");
        write_atomically(&files.cert, other.cert_pem.as_bytes());
        assert!(!served.reload_if_changed());
        assert_eq!(served.pin(), Some(second));
        // Its key arrives: now it loads.
        write_atomically(&files.key, other.key_pem.as_bytes());
        assert!(served.reload_if_changed());
        assert_eq!(served.pin(), Some(other.pin()));
    }
}
