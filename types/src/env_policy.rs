//! Which environment variables Heddle lets a run, a sweep cell, a tuning profile or a
//! recommendation set, and how they are written for a shell.
//!
//! The agent runs tests as root with the host's network and `/dev/infiniband`, and job
//! scripts `source` the env export, so a variable that names code (a library, a plugin, a
//! search path, a command) or a file to write is a way to run code as root on every node.
//! Only the families a network test is tuned with are accepted — `NCCL_*`, `UCX_*` and a
//! few CUDA/OpenMP names — minus their members that load code, run a command or read or
//! write a file. The server, the agent, the plugin host and the CLI all ask this module;
//! nothing else decides.
//!
//! Names are checked against the list; values, reasons and sources must be free of control
//! characters (a newline would end a shell comment or an `export` line), and everything
//! written for a shell is quoted by [`shell_quote`].

use std::fmt;

/// Longest accepted variable name.
pub const MAX_NAME_LEN: usize = 128;
/// Longest accepted value.
pub const MAX_VALUE_LEN: usize = 4096;

/// Prefixes of the variable families a job may tune.
pub const FAMILIES: &[&str] = &["NCCL_", "UCX_"];

/// Single variables outside the families that a test may need.
pub const NAMES: &[&str] = &[
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "CUDA_DEVICE_MAX_CONNECTIONS",
    "CUDA_LAUNCH_BLOCKING",
    "CUDA_MODULE_LOADING",
    "OMP_NUM_THREADS",
];

/// Members of the families that are refused, with why. Names whose words include one of
/// [`PATH_WORDS`] are refused as well, so a variable added by a later NCCL or UCX release
/// that takes a path is refused before anyone lists it here.
pub const DENIED: &[(&str, &str)] = &[
    ("NCCL_NET_PLUGIN", "loads a network plugin library"),
    ("NCCL_TUNER_PLUGIN", "loads a tuner plugin library"),
    ("NCCL_PROFILER_PLUGIN", "loads a profiler plugin library"),
    (
        "NCCL_ENV_PLUGIN",
        "loads a library that supplies every other setting",
    ),
    (
        "NCCL_CONF_FILE",
        "reads further settings, plugins included, from a file",
    ),
    ("NCCL_DEBUG_FILE", "writes a file"),
    ("NCCL_TOPO_FILE", "reads a file as root"),
    ("NCCL_TOPO_DUMP_FILE", "writes a file"),
    ("NCCL_GRAPH_FILE", "reads a file as root"),
    ("NCCL_GRAPH_DUMP_FILE", "writes a file"),
    (
        "UCX_MODULE_DIR",
        "loads UCX modules (libraries) from a directory",
    ),
    ("UCX_GDB_COMMAND", "runs a command when an error occurs"),
    (
        "UCX_HANDLE_ERRORS",
        "can attach a debugger (a command) when an error occurs",
    ),
    (
        "UCX_ERROR_MAIL_TO",
        "sends mail through a command when an error occurs",
    ),
    ("UCX_ERROR_MAIL_FOOTER", "goes with UCX_ERROR_MAIL_TO"),
    ("UCX_LOG_FILE", "writes a file"),
    (
        "UCX_STATS_DEST",
        "writes a file or sends to a network address",
    ),
    ("UCX_MEMTRACK_DEST", "writes a file"),
    ("UCX_PROFILE_FILE", "writes a file"),
    ("UCX_TUNING_PATH", "reads a file as root"),
    (
        "NCCL_COMM_ID",
        "replaces the rendezvous-protected unique id with a fixed address, so whoever reaches \
         that address can join or intercept the bootstrap, which NCCL does not defend against \
         hostile peers",
    ),
    (
        "NCCL_RAS_ADDR",
        "opens NCCL's unauthenticated RAS listener on the address given",
    ),
    (
        "NCCL_PROXY_PROFILE",
        "writes a profile file where it is told (in NCCL builds with proxy profiling)",
    ),
    (
        "UCX_PROFILE_MODE",
        "makes UCX create or truncate a profile file in the working directory at exit, \
         following symlinks",
    ),
];

/// Most variables one test's environment may hold, from every source together (the run's
/// env, tuning profiles, recommendations, the agent's own): far above any real tuning, far
/// below what makes `execve` fail with E2BIG.
pub const MAX_ENV_VARS: usize = 256;
/// Most bytes (`NAME=value` plus its NUL, summed) one test's environment may hold.
pub const MAX_ENV_BYTES: usize = 64 * 1024;

/// Words (between underscores) that mark a variable naming a path, a library or a command.
pub const PATH_WORDS: &[&str] = &[
    "PLUGIN", "FILE", "DIR", "PATH", "LIB", "LIBRARY", "COMMAND", "CMD", "DEST", "SOCK",
];

/// Why a variable, value or text was refused. The message names the variable and says what
/// to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvError {
    /// Not something a shell can `export`.
    BadName(String),
    /// Outside every family a job may tune.
    NotAllowed(String),
    /// In a family, but it loads code, runs a command or touches a file.
    Denied { name: String, why: &'static str },
    /// The value is too long or holds a control character.
    BadValue { name: String, why: &'static str },
    /// A reason, source or other text shown beside a variable holds a control character.
    BadText { what: &'static str, name: String },
    /// A whole environment is larger than [`MAX_ENV_VARS`] or [`MAX_ENV_BYTES`].
    TooLarge {
        vars: usize,
        bytes: usize,
        sources: String,
    },
}

impl fmt::Display for EnvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EnvError::BadName(name) => write!(
                f,
                "{name:?} is not a valid environment variable name (letters, digits and '_', \
                 not starting with a digit, at most {MAX_NAME_LEN} characters)"
            ),
            EnvError::NotAllowed(name) => write!(
                f,
                "{name} is not a variable Heddle passes to tests: only {} and {} may be set",
                FAMILIES
                    .iter()
                    .map(|p| format!("{p}*"))
                    .collect::<Vec<_>>()
                    .join(", "),
                NAMES.join(", ")
            ),
            EnvError::Denied { name, why } => write!(
                f,
                "{name} is refused: it {why}; tests run as root, so Heddle never takes it from a \
                 run, sweep, tuning profile or recommendation (set it on the agent's own \
                 environment if every test on the node needs it)"
            ),
            EnvError::BadValue { name, why } => write!(f, "the value of {name} {why}"),
            EnvError::BadText { what, name } => write!(
                f,
                "the {what} of {name} holds a control character or an invisible or \
                 direction-changing one (newline, tab, escape, zero-width space, U+202E...); use \
                 plain visible text on one line"
            ),
            EnvError::TooLarge {
                vars,
                bytes,
                sources,
            } => write!(
                f,
                "the environment would hold {vars} variables and {bytes} bytes, over the limit of \
                 {MAX_ENV_VARS} variables and {MAX_ENV_BYTES} bytes for one test ({sources}); \
                 remove variables from the run's env or from the node's profiles"
            ),
        }
    }
}

impl std::error::Error for EnvError {}

/// Whether `name` is a shell identifier of acceptable length.
pub fn check_identifier(name: &str) -> Result<(), EnvError> {
    let mut chars = name.chars();
    let ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.len() <= MAX_NAME_LEN;
    if ok {
        Ok(())
    } else {
        Err(EnvError::BadName(name.to_string()))
    }
}

/// Whether `name` belongs to a family a job may tune, whether or not that member is denied.
/// The agent uses this to pass on what its own operator set.
pub fn in_family(name: &str) -> bool {
    NAMES.contains(&name) || FAMILIES.iter().any(|p| name.starts_with(p))
}

/// Why a family member is refused, if it is.
fn denial(name: &str) -> Option<&'static str> {
    if let Some((_, why)) = DENIED.iter().find(|(n, _)| *n == name) {
        return Some(why);
    }
    let family = FAMILIES.iter().find(|p| name.starts_with(*p))?;
    name[family.len()..]
        .split('_')
        .any(|w| PATH_WORDS.contains(&w))
        .then_some("names a path, a library or a command")
}

/// A name a run, sweep cell, tuning profile or recommendation may set.
pub fn check_name(name: &str) -> Result<(), EnvError> {
    check_identifier(name)?;
    if !in_family(name) {
        return Err(EnvError::NotAllowed(name.to_string()));
    }
    match denial(name) {
        Some(why) => Err(EnvError::Denied {
            name: name.to_string(),
            why,
        }),
        None => Ok(()),
    }
}

/// A value: at most [`MAX_VALUE_LEN`] bytes, no control character.
pub fn check_value(name: &str, value: &str) -> Result<(), EnvError> {
    if value.len() > MAX_VALUE_LEN {
        return Err(EnvError::BadValue {
            name: name.to_string(),
            why: "is longer than 4096 bytes",
        });
    }
    if value.chars().any(is_hidden) {
        return Err(EnvError::BadValue {
            name: name.to_string(),
            why: "holds a control character or an invisible or direction-changing one (newline, \
                  tab, NUL, escape, zero-width space, U+202E...); use plain visible text on one \
                  line",
        });
    }
    Ok(())
}

/// A character that a reader would not see as it acts: ASCII and C1 controls, Unicode
/// format characters (zero-width spaces and joiners, bidi embeddings, overrides and
/// isolates, the byte-order mark, tag characters) and the line and paragraph separators.
/// Text holding one can read differently from what it does (`heddle env` output whose
/// `export` line is visually reordered), so values and texts refuse them.
pub fn is_hidden(c: char) -> bool {
    use unicode_properties::{GeneralCategory, UnicodeGeneralCategory};
    c.is_control()
        || matches!(
            c.general_category(),
            GeneralCategory::Format
                | GeneralCategory::LineSeparator
                | GeneralCategory::ParagraphSeparator
        )
}

/// Whether a whole environment fits [`MAX_ENV_VARS`] and [`MAX_ENV_BYTES`]. `sources`
/// names what contributed (e.g. "run env: 3, profile ib-tuned: 200, recommendations: 12")
/// and is repeated in the error, so the person refused knows where to cut.
pub fn check_env_size<'a>(
    env: impl IntoIterator<Item = (&'a str, &'a str)>,
    sources: &str,
) -> Result<(), EnvError> {
    let (vars, bytes) = env
        .into_iter()
        .fold((0, 0), |(n, b), (k, v)| (n + 1, b + k.len() + v.len() + 2));
    if vars > MAX_ENV_VARS || bytes > MAX_ENV_BYTES {
        return Err(EnvError::TooLarge {
            vars,
            bytes,
            sources: sources.to_string(),
        });
    }
    Ok(())
}

/// One variable, name and value.
pub fn check_var(name: &str, value: &str) -> Result<(), EnvError> {
    check_name(name)?;
    check_value(name, value)
}

/// Every variable of a set (a run's env, a tuning profile, a sweep winner).
pub fn check_env<'a>(
    env: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> Result<(), EnvError> {
    env.into_iter().try_for_each(|(k, v)| check_var(k, v))
}

/// Text shown beside a variable (a reason, a source): no control character.
pub fn check_text(what: &'static str, name: &str, text: &str) -> Result<(), EnvError> {
    if text.chars().any(is_hidden) {
        Err(EnvError::BadText {
            what,
            name: name.to_string(),
        })
    } else {
        Ok(())
    }
}

/// `text` as one shell word that stands for itself. Control characters are refused rather
/// than quoted: nothing Heddle exports needs them, and a reader would not see them.
pub fn shell_quote(text: &str) -> Result<String, EnvError> {
    check_text("text", "a shell word", text)?;
    shlex::try_quote(text)
        .map(|q| q.into_owned())
        .map_err(|_| EnvError::BadText {
            what: "text",
            name: "a shell word".into(),
        })
}

/// `export NAME=VALUE` with its line end, for a variable the policy allows.
pub fn export_line(name: &str, value: &str) -> Result<String, EnvError> {
    check_var(name, value)?;
    Ok(format!("export {name}={}\n", shell_quote(value)?))
}

/// A `# ...` comment line whose words are shell-quoted, so even a shell that did not treat
/// it as a comment would only see words.
pub fn comment_line(words: &[&str]) -> Result<String, EnvError> {
    let mut line = String::from("#");
    for w in words {
        line.push(' ');
        line.push_str(&shell_quote(w)?);
    }
    line.push('\n');
    Ok(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tuning_families_pass() {
        for name in [
            "NCCL_IB_HCA",
            "NCCL_SOCKET_IFNAME",
            "NCCL_ALGO",
            "NCCL_IB_GID_INDEX",
            "NCCL_DEBUG",
            "NCCL_DEBUG_SUBSYS",
            "UCX_TLS",
            "UCX_NET_DEVICES",
            "CUDA_VISIBLE_DEVICES",
        ] {
            assert_eq!(check_name(name), Ok(()), "{name}");
        }
    }

    #[test]
    fn code_loaders_and_files_are_denied() {
        for name in [
            "NCCL_NET_PLUGIN",
            "NCCL_TUNER_PLUGIN",
            "NCCL_PROFILER_PLUGIN",
            "NCCL_ENV_PLUGIN",
            "NCCL_CONF_FILE",
            "NCCL_DEBUG_FILE",
            "NCCL_TOPO_DUMP_FILE",
            "UCX_MODULE_DIR",
            "UCX_GDB_COMMAND",
            "UCX_HANDLE_ERRORS",
            "UCX_LOG_FILE",
            "UCX_VFS_SOCK_PATH",
            "NCCL_SOME_FUTURE_PLUGIN_NAME",
        ] {
            assert!(
                matches!(check_name(name), Err(EnvError::Denied { .. })),
                "{name}"
            );
        }
        for name in [
            "LD_PRELOAD",
            "LD_LIBRARY_PATH",
            "PATH",
            "HEDDLE_NCCL_LIBRARY",
            "HEDDLE_RENDEZVOUS_CREDENTIAL",
            "PYTHONPATH",
            "BASH_ENV",
            "OMPI_MCA_mca_base_component_path",
            "CUDA_CACHE_PATH",
        ] {
            assert_eq!(
                check_name(name),
                Err(EnvError::NotAllowed(name.into())),
                "{name}"
            );
        }
        for bad in ["", "1X", "A-B", "A B", "X\n"] {
            assert!(
                matches!(check_name(bad), Err(EnvError::BadName(_))),
                "{bad:?}"
            );
        }
        assert!(check_name(&format!("NCCL_{}", "A".repeat(200))).is_err());
    }

    #[test]
    fn messages_name_the_variable() {
        let e = check_name("LD_PRELOAD").unwrap_err().to_string();
        assert!(e.contains("LD_PRELOAD") && e.contains("NCCL_*"), "{e}");
        let e = check_name("NCCL_NET_PLUGIN").unwrap_err().to_string();
        assert!(e.contains("NCCL_NET_PLUGIN") && e.contains("plugin"), "{e}");
    }

    #[test]
    fn values_have_no_control_characters() {
        assert!(check_value("N", "mlx5_0:1,mlx5_1:1").is_ok());
        assert!(check_value("N", "$(touch x); `id` 'q' \"d\"").is_ok());
        for bad in ["a\nb", "a\rb", "a\0b", "a\tb", "a\u{1b}[2J", "a\u{85}b"] {
            assert!(check_value("N", bad).is_err(), "{bad:?}");
        }
        assert!(check_value("N", &"x".repeat(MAX_VALUE_LEN + 1)).is_err());
        assert!(check_text("reason", "N", "one line").is_ok());
        assert!(check_text("reason", "N", "two\nlines").is_err());
    }

    #[test]
    fn attacks_through_allowed_families_are_refused() {
        // Each was accepted before: a fixed bootstrap address, an open RAS listener, a
        // profile written where UCX or NCCL is told.
        for name in [
            "NCCL_COMM_ID",
            "NCCL_RAS_ADDR",
            "NCCL_PROXY_PROFILE",
            "UCX_PROFILE_MODE",
        ] {
            let e = check_var(name, "0.0.0.0:28028").unwrap_err();
            assert!(matches!(e, EnvError::Denied { .. }), "{name}: {e}");
            assert!(e.to_string().contains(name), "{e}");
        }
    }

    #[test]
    fn invisible_and_bidi_characters_are_refused() {
        for bad in [
            "mlx5_0\u{202E}1:5xlm",
            "a\u{2028}b",
            "a\u{2029}b",
            "a\u{200B}b",
            "a\u{200D}b",
            "a\u{2066}b\u{2069}",
            "\u{FEFF}x",
            "x\u{E0041}",
        ] {
            assert!(check_value("N", bad).is_err(), "{bad:?}");
            assert!(check_text("reason", "N", bad).is_err(), "{bad:?}");
            assert!(export_line("NCCL_ALGO", bad).is_err(), "{bad:?}");
        }
        // Visible non-ASCII text stays allowed in reasons.
        assert!(check_text("reason", "N", "GPU↔NIC affinity — naïve µs").is_ok());
    }

    #[test]
    fn environment_size_is_bounded() {
        let many: Vec<(String, String)> = (0..=MAX_ENV_VARS)
            .map(|i| (format!("NCCL_X{i}"), "1".to_string()))
            .collect();
        let e = check_env_size(
            many.iter().map(|(k, v)| (k.as_str(), v.as_str())),
            "profile big: 257",
        )
        .unwrap_err();
        assert!(e.to_string().contains("profile big: 257"), "{e}");
        let v = "x".repeat(4000);
        let fat: Vec<(String, &str)> = (0..17)
            .map(|i| (format!("NCCL_Y{i}"), v.as_str()))
            .collect();
        assert!(check_env_size(fat.iter().map(|(k, v)| (k.as_str(), *v)), "run env: 17").is_err());
        assert!(check_env_size([("NCCL_ALGO", "Ring")], "run env: 1").is_ok());
    }

    #[test]
    fn exports_are_quoted() {
        assert_eq!(
            export_line("NCCL_IB_HCA", "mlx5_0:1").unwrap(),
            "export NCCL_IB_HCA=mlx5_0:1\n"
        );
        assert_eq!(
            export_line("NCCL_ALGO", "").unwrap(),
            "export NCCL_ALGO=''\n"
        );
        let l = export_line("NCCL_ALGO", "it's $(reboot)").unwrap();
        assert!(
            l.starts_with("export NCCL_ALGO=") && !l.contains("=it's"),
            "{l}"
        );
        assert!(export_line("LD_PRELOAD", "x").is_err());
        assert!(export_line("NCCL_ALGO", "a\nb").is_err());
        assert_eq!(
            comment_line(&["from", "plugin:azure-nd@0.1.0"]).unwrap(),
            "# from plugin:azure-nd@0.1.0\n"
        );
        assert!(comment_line(&["a\nrm -rf /"]).is_err());
    }
}
