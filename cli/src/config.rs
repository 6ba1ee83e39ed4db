//! Where `heddle login` keeps the server URL and token: `$HEDDLE_CONFIG` or
//! `~/.config/heddle/cli.json`, readable by the owner only.

use std::path::PathBuf;

use anyhow::Context;
use serde::{Deserialize, Serialize};

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Saved {
    pub server: Option<String>,
    pub token: Option<String>,
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
