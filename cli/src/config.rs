//! Where `heddle login` keeps the server URL, token and TLS trust: `$HEDDLE_CONFIG`, or
//! `heddle/cli.json` in the XDG config directory (`$XDG_CONFIG_HOME`, `~/.config`),
//! readable by the owner only and replaced whole on each save.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

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
    path_from(
        std::env::var_os("HEDDLE_CONFIG"),
        std::env::var_os("XDG_CONFIG_HOME"),
        std::env::var_os("HOME"),
    )
}

/// `$HEDDLE_CONFIG`, else `$XDG_CONFIG_HOME/heddle/cli.json` (an absolute one only, as the
/// XDG base directory specification says), else `$HOME/.config/heddle/cli.json`.
fn path_from(
    heddle_config: Option<OsString>,
    xdg_config_home: Option<OsString>,
    home: Option<OsString>,
) -> PathBuf {
    if let Some(p) = heddle_config.filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let base = xdg_config_home
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .unwrap_or_else(|| {
            home.map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("."))
                .join(".config")
        });
    base.join("heddle/cli.json")
}

pub fn load() -> Saved {
    std::fs::read(path())
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// Writes the file whole or not at all: a temporary file beside it, mode 0600 from the
/// start (it holds a token), fsynced, renamed over the old one. A new directory is made
/// 0700.
pub fn save(saved: &Saved) -> anyhow::Result<PathBuf> {
    let p = path();
    save_to(&p, saved)?;
    Ok(p)
}

fn save_to(p: &Path, saved: &Saved) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = p
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    crate::files::write_atomic(p, &serde_json::to_vec_pretty(saved)?, 0o600)
        .with_context(|| format!("writing {}", p.display()))
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

    #[test]
    fn the_file_follows_xdg_and_heddle_config_wins() {
        let os = |s: &str| Some(OsString::from(s));
        assert_eq!(
            path_from(None, None, os("/home/a")),
            PathBuf::from("/home/a/.config/heddle/cli.json")
        );
        assert_eq!(
            path_from(None, os("/xdg"), os("/home/a")),
            PathBuf::from("/xdg/heddle/cli.json")
        );
        // A relative XDG_CONFIG_HOME is invalid and ignored, as the specification says.
        assert_eq!(
            path_from(None, os("rel"), os("/home/a")),
            PathBuf::from("/home/a/.config/heddle/cli.json")
        );
        assert_eq!(
            path_from(os("/etc/h.json"), os("/xdg"), os("/home/a")),
            PathBuf::from("/etc/h.json")
        );
    }

    #[test]
    fn a_save_replaces_the_file_whole_and_keeps_the_token_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("new/heddle/cli.json");
        let saved = Saved {
            server: Some("http://h:8080".into()),
            token: Some("secret".into()),
            ..Default::default()
        };
        save_to(&p, &saved).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&p), 0o600);
        assert_eq!(mode(p.parent().unwrap()), 0o700);
        // An old file others could read is replaced, not rewritten in place with its mode.
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        save_to(&p, &saved).unwrap();
        assert_eq!(mode(&p), 0o600);
        let back: Saved = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        assert_eq!(back.token.as_deref(), Some("secret"));
        // Nothing but the file is left in the directory.
        assert_eq!(std::fs::read_dir(p.parent().unwrap()).unwrap().count(), 1);
    }
}
