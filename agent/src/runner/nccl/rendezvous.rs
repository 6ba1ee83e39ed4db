//! Handing NCCL's unique id from rank 0 to the other processes. Rank 0 creates it and
//! publishes it (base64, under the name `nccl-uid`); the others wait for it. Through the
//! server for jobs, through a file for the `bench` command on one host. A job's child
//! learns the servers and the agent's credential from its input on stdin.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine as _;
use uuid::Uuid;

use crate::runner::protocol::ChildInput;

pub const NAME: &str = "nccl-uid";

#[derive(Clone)]
pub enum Rendezvous {
    /// A file on a filesystem both processes see; use a fresh path per run, since a stale
    /// file would hand the others an old id.
    File(PathBuf),
    Server {
        servers: Vec<String>,
        credential: String,
        tls: heddle_tls::ClientTls,
        run_id: Uuid,
        /// Prefix of every name (`RendezvousAccess::scope`).
        scope: Option<String>,
    },
}

/// Never prints the credential.
impl std::fmt::Debug for Rendezvous {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rendezvous::File(path) => f.debug_tuple("File").field(path).finish(),
            Rendezvous::Server {
                servers,
                run_id,
                scope,
                ..
            } => f
                .debug_struct("Server")
                .field("servers", servers)
                .field("run_id", run_id)
                .field("scope", scope)
                .finish_non_exhaustive(),
        }
    }
}

impl Rendezvous {
    /// The server rendezvous the agent handed a test child in its input (never in its
    /// environment, which the child's own children inherit).
    pub fn for_job(input: &ChildInput) -> Option<Rendezvous> {
        let access = input.rendezvous.as_ref()?;
        let servers: Vec<String> = access
            .servers
            .iter()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
        let tls = heddle_tls::ClientTls {
            ca_file: access.ca_file.clone(),
            pins: access.pins.iter().filter_map(|p| p.parse().ok()).collect(),
        };
        (!servers.is_empty() && !access.credential.is_empty()).then(|| Rendezvous::Server {
            servers,
            credential: access.credential.clone(),
            tls,
            run_id: input.run_id,
            scope: access.scope.clone(),
        })
    }

    /// Rank 0 publishes `id`; everyone gets the id back.
    pub fn exchange(
        &self,
        is_root: bool,
        id: Option<[u8; 128]>,
        wait: Duration,
    ) -> Result<[u8; 128], String> {
        let blob = self.exchange_named(NAME, is_root, id.map(|i| i.to_vec()), wait)?;
        blob.as_slice()
            .try_into()
            .map_err(|_| format!("the published NCCL id has {} bytes, not 128", blob.len()))
    }

    /// Rank 0 publishes `blob` under `name`; everyone gets it back. (For a file
    /// rendezvous, `name` is ignored: the file is the name.)
    pub fn exchange_named(
        &self,
        name: &str,
        is_root: bool,
        blob: Option<Vec<u8>>,
        wait: Duration,
    ) -> Result<Vec<u8>, String> {
        match (is_root, blob) {
            (true, Some(blob)) => {
                self.put(name, &blob)?;
                Ok(blob)
            }
            (true, None) => Err("rank 0 has nothing to publish".into()),
            _ => self.get(name, wait),
        }
    }

    fn put(&self, name: &str, id: &[u8]) -> Result<(), String> {
        match self {
            Rendezvous::File(path) => {
                let text = base64::engine::general_purpose::STANDARD.encode(id);
                let (Some(dir), Some(file)) = (
                    path.parent().map(|d| {
                        if d.as_os_str().is_empty() {
                            Path::new(".")
                        } else {
                            d
                        }
                    }),
                    path.file_name().and_then(|n| n.to_str()),
                ) else {
                    return Err(format!("{} names no file", path.display()));
                };
                // Whole or not at all, and on disk before the other ranks read it.
                crate::files::write_atomic(dir, file, text.as_bytes(), 0o644)
                    .map_err(|e| format!("publishing {}: {e}", path.display()))
            }
            Rendezvous::Server {
                servers,
                credential,
                tls,
                run_id,
                scope,
            } => {
                let name = &scoped(scope, name);
                let client = client(servers, credential, tls)?;
                runtime()?
                    .block_on(client.rendezvous_put(*run_id, name, id))
                    .map_err(|e| format!("rendezvous PUT {name}: {e}"))
            }
        }
    }

    fn get(&self, name: &str, wait: Duration) -> Result<Vec<u8>, String> {
        match self {
            Rendezvous::File(path) => {
                let deadline = Instant::now() + wait;
                loop {
                    if let Ok(text) = std::fs::read_to_string(path) {
                        return base64::engine::general_purpose::STANDARD
                            .decode(text.trim())
                            .map_err(|e| format!("{} is not base64: {e}", path.display()));
                    }
                    if Instant::now() > deadline {
                        return Err(format!("no NCCL id in {} after {wait:?}", path.display()));
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            Rendezvous::Server {
                servers,
                credential,
                tls,
                run_id,
                scope,
            } => {
                let name = &scoped(scope, name);
                let client = client(servers, credential, tls)?;
                runtime()?
                    .block_on(client.rendezvous_get(*run_id, name, wait))
                    .map_err(|e| format!("rendezvous GET {name}: {e}"))?
                    .ok_or_else(|| format!("rank 0 published no {name} within {wait:?}"))
            }
        }
    }
}

/// `<scope>.<name>`, or `name` when unscoped.
fn scoped(scope: &Option<String>, name: &str) -> String {
    match scope {
        Some(s) => format!("{s}.{name}"),
        None => name.to_string(),
    }
}

fn client(
    servers: &[String],
    credential: &str,
    tls: &heddle_tls::ClientTls,
) -> Result<crate::client::Client, String> {
    let c = crate::client::Client::with_tls(servers, tls.clone()).map_err(|e| e.to_string())?;
    c.set_credential(credential.to_string());
    Ok(c)
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_rendezvous_hands_the_id_over() {
        let tmp = tempfile::tempdir().unwrap();
        let rv = Rendezvous::File(tmp.path().join("uid"));
        let id: [u8; 128] = std::array::from_fn(|i| (i * 7) as u8);
        let reader = {
            let rv = rv.clone();
            std::thread::spawn(move || rv.exchange(false, None, Duration::from_secs(10)))
        };
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(rv.exchange(true, Some(id), Duration::ZERO).unwrap(), id);
        assert_eq!(reader.join().unwrap().unwrap(), id);
    }

    #[test]
    fn scoped_names_keep_the_servers_name_rules() {
        assert_eq!(scoped(&None, NAME), "nccl-uid");
        assert_eq!(scoped(&Some("socket".into()), NAME), "socket.nccl-uid");
    }

    #[test]
    fn file_rendezvous_times_out_and_rejects_garbage() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("uid");
        let rv = Rendezvous::File(path.clone());
        let err = rv
            .exchange(false, None, Duration::from_millis(100))
            .unwrap_err();
        assert!(err.contains("no NCCL id"), "{err}");
        std::fs::write(&path, "aGVsbG8=").unwrap();
        let err = rv
            .exchange(false, None, Duration::from_millis(100))
            .unwrap_err();
        assert!(err.contains("5 bytes"), "{err}");
    }
}
