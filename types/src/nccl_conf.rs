//! The one reader and writer of `NAME=value` environment files: NCCL's own configuration
//! format (`/etc/nccl.conf`, `~/.nccl.conf`, `NCCL_CONF_FILE`), which is also the node env
//! file the agent keeps for the environment plugin (`/var/lib/heddle-agent/nccl.env`) and
//! what `heddle env --format nccl-conf` prints.
//!
//! NCCL reads such a file line by line: everything before the first `=` is the name, the
//! rest of the line is the value, verbatim (no quoting, no escapes, no trimming), lines
//! starting with `#` and lines without `=` are skipped, and a value is cut at 1023 bytes.
//! Heddle writes only what NCCL would read back unchanged, and reads strictly: a line NCCL
//! would skip silently or read differently is an error here, so a hand-edited or hostile
//! file is refused whole rather than half applied.

use std::fmt;

use crate::env_policy;

/// Longest value NCCL reads back whole from a conf file (its buffer is 1024 bytes).
pub const MAX_CONF_VALUE_LEN: usize = 1023;
/// Largest file accepted; a node's whole environment is a few kilobytes.
pub const MAX_CONF_FILE_LEN: usize = 64 * 1024;
/// Most entries accepted in one file.
pub const MAX_CONF_ENTRIES: usize = 256;

/// One `NAME=value` line.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Entry {
    pub name: String,
    pub value: String,
}

/// Why a conf file or one of its lines was refused. `line` is 1-based.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfError {
    TooLarge {
        len: usize,
    },
    TooManyEntries,
    NotUtf8,
    /// A line that is neither blank, a `#` comment, nor `NAME=value`.
    Malformed {
        line: usize,
    },
    /// The name is not an identifier, or the value is too long or holds a control character.
    Invalid {
        line: usize,
        why: String,
    },
    Duplicate {
        line: usize,
        name: String,
    },
}

impl fmt::Display for ConfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfError::TooLarge { len } => write!(
                f,
                "the file is {len} bytes; at most {MAX_CONF_FILE_LEN} are read"
            ),
            ConfError::TooManyEntries => {
                write!(f, "the file has more than {MAX_CONF_ENTRIES} entries")
            }
            ConfError::NotUtf8 => write!(f, "the file is not UTF-8 text"),
            ConfError::Malformed { line } => {
                write!(f, "line {line} is not NAME=value, a # comment or blank")
            }
            ConfError::Invalid { line, why } => write!(f, "line {line}: {why}"),
            ConfError::Duplicate { line, name } => {
                write!(f, "line {line} sets {name} a second time")
            }
        }
    }
}

impl std::error::Error for ConfError {}

/// Reads a conf file's bytes. Only the syntax and the shape of each line are checked here;
/// which names may be set is the caller's policy (`env_policy::check_var` for values that
/// reach a job). Blank lines and `#` comments are skipped; a line with spaces around the
/// name, a `\r`, or any control character in the value is refused, because NCCL would keep
/// those characters in the name or value.
pub fn parse(bytes: &[u8]) -> Result<Vec<Entry>, ConfError> {
    if bytes.len() > MAX_CONF_FILE_LEN {
        return Err(ConfError::TooLarge { len: bytes.len() });
    }
    let text = std::str::from_utf8(bytes).map_err(|_| ConfError::NotUtf8)?;
    let mut entries: Vec<Entry> = Vec::new();
    for (i, line) in text.split('\n').enumerate() {
        let line_no = i + 1;
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((name, value)) = line.split_once('=') else {
            return Err(ConfError::Malformed { line: line_no });
        };
        env_policy::check_identifier(name).map_err(|e| ConfError::Invalid {
            line: line_no,
            why: e.to_string(),
        })?;
        check_conf_value(name, value).map_err(|why| ConfError::Invalid { line: line_no, why })?;
        if entries.iter().any(|e| e.name == name) {
            return Err(ConfError::Duplicate {
                line: line_no,
                name: name.to_string(),
            });
        }
        if entries.len() == MAX_CONF_ENTRIES {
            return Err(ConfError::TooManyEntries);
        }
        entries.push(Entry {
            name: name.to_string(),
            value: value.to_string(),
        });
    }
    Ok(entries)
}

/// Whether NCCL would read `value` back unchanged from a conf line, and the policy's value
/// rule (no control characters) holds.
pub fn check_conf_value(name: &str, value: &str) -> Result<(), String> {
    env_policy::check_value(name, value).map_err(|e| e.to_string())?;
    if value.len() > MAX_CONF_VALUE_LEN {
        return Err(format!(
            "the value of {name} is {} bytes; NCCL reads at most {MAX_CONF_VALUE_LEN} from a conf file",
            value.len()
        ));
    }
    Ok(())
}

/// Writes entries as a conf file: `header` lines as `# ` comments first (each must be one
/// line), then `NAME=value` lines in the order given. Refuses anything [`parse`] would
/// refuse, so what is written reads back equal.
pub fn render(header: &[&str], entries: &[Entry]) -> Result<String, ConfError> {
    let mut out = String::new();
    for line in header {
        if line.chars().any(char::is_control) {
            return Err(ConfError::Malformed { line: 0 });
        }
        out.push_str("# ");
        out.push_str(line);
        out.push('\n');
    }
    for e in entries {
        out.push_str(&e.name);
        out.push('=');
        out.push_str(&e.value);
        out.push('\n');
    }
    let back = parse(out.as_bytes())?;
    debug_assert_eq!(back.as_slice(), entries);
    Ok(out)
}

/// Where the agent keeps the node env file and where the environment plugin reads it, unless
/// configured otherwise (`HEDDLE_NCCL_ENV_FILE` for both).
pub const DEFAULT_NODE_ENV_FILE: &str = "/var/lib/heddle-agent/nccl.env";

/// File name of Heddle's own NCCL profiler plugin: the one library a node env file may name.
pub const HEDDLE_PROFILER_LIB: &str = "libnccl-profiler-heddle.so";

/// Whether one entry of a node env file may reach a job: what
/// [`env_policy::check_var`](crate::env_policy::check_var) allows, plus
/// `NCCL_PROFILER_PLUGIN` naming Heddle's own profiler by an absolute path. That path comes
/// from the agent's own configuration (`--nccl-profiler-plugin`), never from the API, and
/// the file is root's, so this admits exactly the library the node's root installed. The
/// agent applies this rule before writing the file and the environment plugin again when
/// reading it.
pub fn check_node_entry(name: &str, value: &str) -> Result<(), String> {
    if name == "NCCL_PROFILER_PLUGIN" {
        return check_profiler_path(value);
    }
    env_policy::check_var(name, value).map_err(|e| e.to_string())
}

/// An absolute path, without `.` or `..` components, whose file name is
/// [`HEDDLE_PROFILER_LIB`].
pub fn check_profiler_path(value: &str) -> Result<(), String> {
    env_policy::check_value("NCCL_PROFILER_PLUGIN", value).map_err(|e| e.to_string())?;
    let mut parts = value.split('/');
    let absolute = parts.next() == Some("");
    let parts: Vec<&str> = parts.collect();
    let clean = parts
        .iter()
        .all(|p| !p.is_empty() && *p != "." && *p != "..");
    if absolute && clean && parts.last() == Some(&HEDDLE_PROFILER_LIB) {
        Ok(())
    } else {
        Err(format!(
            "NCCL_PROFILER_PLUGIN may only name Heddle's profiler plugin by an absolute path \
             ending in /{HEDDLE_PROFILER_LIB}, not {value:?}"
        ))
    }
}

/// SHA-256 (hex) of a node's job environment: of its entries as [`render`] writes them
/// without a header. The server sends it in heartbeats (`job_env_sha256`) and the agent
/// compares it with the entries of the file it last wrote, so an agent fetches the job
/// environment only when it changed.
pub fn job_env_sha256(entries: &[Entry]) -> Result<String, ConfError> {
    use sha2::{Digest, Sha256};
    let body = render(&[], entries)?;
    Ok(hex::encode(Sha256::digest(body.as_bytes())))
}

/// The node env file: what the agent writes to `/var/lib/heddle-agent/nccl.env` and what
/// `heddle env NODE --format nccl-conf` prints. `job_env` is the server's job environment
/// for the node; `profiler` the path of Heddle's profiler plugin when the agent is
/// configured with one, added as `NCCL_PROFILER_PLUGIN` (after the job environment, which
/// cannot hold that name). Every entry must pass [`check_node_entry`].
pub fn render_node_env(
    node: &str,
    job_env: &[Entry],
    profiler: Option<&str>,
) -> Result<String, ConfError> {
    let sha = job_env_sha256(job_env)?;
    let mut entries = job_env.to_vec();
    if let Some(path) = profiler {
        entries.retain(|e| e.name != "NCCL_PROFILER_PLUGIN");
        entries.push(Entry {
            name: "NCCL_PROFILER_PLUGIN".into(),
            value: path.into(),
        });
    }
    for (i, e) in entries.iter().enumerate() {
        check_node_entry(&e.name, &e.value)
            .map_err(|why| ConfError::Invalid { line: i + 1, why })?;
    }
    let node_line = format!("Heddle environment for node {node}");
    let sha_line = format!("job env sha256 {sha}");
    render(
        &[
            &node_line,
            &sha_line,
            "written by heddle-agent; do not edit",
        ],
        &entries,
    )
}

/// The job environment part of a node env file's entries: all but what the agent adds
/// from its own configuration.
pub fn job_env_part(entries: &[Entry]) -> Vec<Entry> {
    entries
        .iter()
        .filter(|e| e.name != "NCCL_PROFILER_PLUGIN")
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: &str, v: &str) -> Entry {
        Entry {
            name: n.into(),
            value: v.into(),
        }
    }

    #[test]
    fn reads_what_nccl_reads() {
        let got =
            parse(b"# made by heddle\n\nNCCL_IB_HCA==mlx5_0:1,mlx5_1:1\nNCCL_ALGO=Ring\n").unwrap();
        assert_eq!(
            got,
            vec![
                entry("NCCL_IB_HCA", "=mlx5_0:1,mlx5_1:1"),
                entry("NCCL_ALGO", "Ring")
            ]
        );
        assert_eq!(parse(b"").unwrap(), vec![]);
    }

    #[test]
    fn refuses_what_nccl_would_read_differently() {
        assert_eq!(
            parse(b"just words\n"),
            Err(ConfError::Malformed { line: 1 })
        );
        assert!(matches!(
            parse(b" NCCL_ALGO=Ring"),
            Err(ConfError::Invalid { line: 1, .. })
        ));
        assert!(matches!(
            parse(b"NCCL_ALGO=Ring\r\n"),
            Err(ConfError::Invalid { line: 1, .. })
        ));
        assert!(matches!(
            parse(b"A=1\nA=2\n"),
            Err(ConfError::Duplicate { line: 2, .. })
        ));
        assert_eq!(parse(b"A=\xff"), Err(ConfError::NotUtf8));
        let long = format!("A={}", "x".repeat(MAX_CONF_VALUE_LEN + 1));
        assert!(matches!(
            parse(long.as_bytes()),
            Err(ConfError::Invalid { .. })
        ));
        let big = vec![b'#'; MAX_CONF_FILE_LEN + 1];
        assert!(matches!(parse(&big), Err(ConfError::TooLarge { .. })));
        let many: String = (0..=MAX_CONF_ENTRIES)
            .map(|i| format!("V{i}=1\n"))
            .collect();
        assert_eq!(parse(many.as_bytes()), Err(ConfError::TooManyEntries));
    }

    #[test]
    fn render_round_trips() {
        let entries = vec![
            entry("NCCL_IB_HCA", "=mlx5_0"),
            entry("UCX_TLS", "rc,cuda_copy"),
        ];
        let text = render(&["node gpu-1", "sha256 abc"], &entries).unwrap();
        assert_eq!(
            text,
            "# node gpu-1\n# sha256 abc\nNCCL_IB_HCA==mlx5_0\nUCX_TLS=rc,cuda_copy\n"
        );
        assert_eq!(parse(text.as_bytes()).unwrap(), entries);
        assert!(render(&["two\nlines"], &entries).is_err());
        assert!(render(&[], &[entry("A", "x\ny")]).is_err());
    }

    #[test]
    fn a_node_file_may_name_only_heddles_profiler() {
        assert!(check_node_entry("NCCL_IB_HCA", "mlx5_0").is_ok());
        assert!(check_node_entry("NCCL_NET_PLUGIN", "/x/libnccl-net.so").is_err());
        assert!(check_node_entry("LD_PRELOAD", "/x.so").is_err());
        assert!(
            check_node_entry(
                "NCCL_PROFILER_PLUGIN",
                "/usr/lib/heddle/libnccl-profiler-heddle.so"
            )
            .is_ok()
        );
        for bad in [
            "libnccl-profiler-heddle.so",
            "./libnccl-profiler-heddle.so",
            "/tmp/../tmp/libnccl-profiler-heddle.so",
            "/usr/lib//libnccl-profiler-heddle.so",
            "/usr/lib/libnccl-profiler-inspector.so",
            "/usr/lib/libnccl-profiler-heddle.so.evil",
            "/usr/lib/libnccl-profiler-heddle.so/",
            "/usr/lib/libnccl-profiler-heddle.so\n",
            "",
        ] {
            assert!(
                check_node_entry("NCCL_PROFILER_PLUGIN", bad).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn the_node_file_carries_its_job_env_hash_and_the_profiler() {
        let env = vec![entry("NCCL_IB_HCA", "mlx5_0"), entry("NCCL_ALGO", "Ring")];
        let sha = job_env_sha256(&env).unwrap();
        assert_eq!(sha.len(), 64);
        assert_ne!(sha, job_env_sha256(&env[..1]).unwrap());
        let profiler = "/usr/lib/heddle/libnccl-profiler-heddle.so";
        let text = render_node_env("gpu-1", &env, Some(profiler)).unwrap();
        assert!(text.starts_with(&format!(
            "# Heddle environment for node gpu-1\n# job env sha256 {sha}\n# written by heddle-agent; do not edit\n"
        )), "{text}");
        let back = parse(text.as_bytes()).unwrap();
        assert_eq!(
            back.last().unwrap(),
            &entry("NCCL_PROFILER_PLUGIN", profiler)
        );
        assert_eq!(job_env_part(&back), env);
        assert_eq!(job_env_sha256(&job_env_part(&back)).unwrap(), sha);
        assert!(render_node_env("gpu-1", &env, Some("/tmp/evil.so")).is_err());
        assert!(render_node_env("gpu-1", &[entry("LD_PRELOAD", "/x.so")], None).is_err());
        assert!(render_node_env("gpu\n1", &env, None).is_err());
    }
}
