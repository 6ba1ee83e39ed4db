//! Where `heddle login` keeps the server URL, token and TLS trust: `$HEDDLE_CONFIG` or
//! `~/.config/heddle/cli.json`, readable by the owner only.

use std::path::PathBuf;

use anyhow::Context;
use serde::{Deserialize, Serialize};

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Saved {
    pub server: Option<String>,
    pub token: Option<String>,
    /// `--ca-file` at login, as an absolute path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// `--pin-sha256` at login, as `sha256//<base64>`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pins: Vec<String>,
}

impl Saved {
    /// The TLS trust of a command talking to `server`: its flags (or `HEDDLE_CA_FILE`,
    /// `HEDDLE_SERVER_PIN`), else what `heddle login` saved for that same server, each
    /// setting on its own.
    pub fn tls(
        &self,
        flags: &heddle_tls::ClientTls,
        server: &str,
    ) -> anyhow::Result<heddle_tls::ClientTls> {
        if self.server.as_deref() != Some(server) {
            return Ok(flags.clone());
        }
        let ca_file = flags.ca_file.clone().or_else(|| self.ca_file.clone());
        let pins = if flags.pins.is_empty() {
            self.pins
                .iter()
                .map(|p| p.parse())
                .collect::<Result<Vec<heddle_tls::Pin>, String>>()
                .map_err(|e| anyhow::anyhow!("{e} (saved in {})", path().display()))?
        } else {
            flags.pins.clone()
        };
        Ok(heddle_tls::ClientTls { ca_file, pins })
    }

    /// What `heddle login` keeps of the trust it logged in with.
    pub fn remember_tls(&mut self, tls: &heddle_tls::ClientTls) -> anyhow::Result<()> {
        self.ca_file = match &tls.ca_file {
            Some(p) => {
                Some(std::path::absolute(p).with_context(|| format!("resolving {}", p.display()))?)
            }
            None => None,
        };
        self.pins = tls.pins.iter().map(|p| p.to_string()).collect();
        Ok(())
    }
}

pub fn path() -> PathBuf {
    if let Some(p) = std::env::var_os("HEDDLE_CONFIG") {
        return PathBuf::from(p);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".config/heddle/cli.json")
}

pub fn load() -> Saved {
    std::fs::read(path())
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

pub fn save(saved: &Saved) -> anyhow::Result<PathBuf> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let p = path();
    if let Some(dir) = p.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&p)
        .with_context(|| format!("writing {}", p.display()))?;
    f.write_all(&serde_json::to_vec_pretty(saved)?)?;
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_win_over_the_trust_saved_for_the_same_server() {
        let pin_a: heddle_tls::Pin = "sha256//AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="
            .parse()
            .unwrap();
        let server = "https://heddle:8443";
        let mut saved = Saved {
            server: Some(server.into()),
            ..Default::default()
        };
        saved
            .remember_tls(&heddle_tls::ClientTls {
                ca_file: Some("ca.pem".into()),
                pins: vec![pin_a],
            })
            .unwrap();
        assert!(saved.ca_file.as_ref().unwrap().is_absolute());
        let tls = saved
            .tls(&heddle_tls::ClientTls::default(), server)
            .unwrap();
        assert_eq!(tls.pins, vec![pin_a]);
        assert_eq!(tls.ca_file, saved.ca_file);
        let flags = heddle_tls::ClientTls {
            ca_file: Some("/other/ca.pem".into()),
            pins: vec![],
        };
        let tls = saved.tls(&flags, server).unwrap();
        assert_eq!(tls.ca_file.unwrap(), PathBuf::from("/other/ca.pem"));
        assert_eq!(tls.pins, vec![pin_a]);
        // Another server gets none of the saved trust.
        let other = saved.tls(&flags, "https://elsewhere:8443").unwrap();
        assert!(other.pins.is_empty());
        saved.pins = vec!["garbage".into()];
        let err = saved.tls(&flags, server).unwrap_err().to_string();
        assert!(err.contains("not a SHA-256 pin"), "{err}");
    }
}
