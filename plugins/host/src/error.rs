//! Why a plugin could not be loaded or did not produce a detection.
//!
//! One enum for the whole host boundary: the server maps [`HostError::code`] to an HTTP status
//! (422 for anything the plugin did, 500 for [`HostError::Internal`]), the CLI and the agent
//! print the `Display` text, which always says what the plugin did and which limit stopped it.

use crate::report::Usage;

#[derive(Debug, Clone, thiserror::Error)]
pub enum HostError {
    /// The bytes are not a WebAssembly component (a core module, garbage, a truncated file).
    #[error("not a WebAssembly component: {0}")]
    NotAComponent(String),

    #[error("component is larger than the {limit}-byte cap ({size} bytes)")]
    TooLarge { size: usize, limit: usize },

    /// Compiling took longer than `Limits::max_compile_time`. Said to the uploader (the
    /// component is too costly), but a stored plugin that hits it is retried later rather than
    /// judged: a busy machine compiles slower.
    #[error("component took longer than {limit_ms} ms to compile")]
    CompileTimeout { limit_ms: u64 },

    /// The component imports something outside the sandbox's allow-list.
    #[error(
        "component imports `{import}`, which plugins may not use (allowed: heddle:plugin/log and \
         the WASI 0.2 interfaces language runtimes link: wasi:cli, wasi:io, wasi:clocks, wasi:random, \
         wasi:filesystem with nothing preopened, wasi:sockets with every socket refused)"
    )]
    DisallowedImport { import: String },

    /// Imports within the allow-list that this host cannot satisfy (e.g. an unknown version).
    #[error("component cannot be linked: {0}")]
    Link(String),

    /// A valid component, but not of the `heddle:plugin/detector` world.
    #[error("component does not implement {expected}: it exports [{found}]")]
    WrongWorld {
        expected: &'static str,
        found: String,
    },

    #[error(
        "plugin used its whole fuel budget ({limit} units) without returning: probably an endless loop"
    )]
    FuelExhausted { limit: u64, usage: Usage },

    /// The plugin ran past its deadline, or asked to wait on a clock past it.
    #[error("plugin ran or waited past its {limit_ms} ms wall-clock deadline")]
    Timeout { limit_ms: u64, usage: Usage },

    #[error("plugin tried to grow a memory to {requested} bytes, over the {limit}-byte cap")]
    MemoryLimit {
        requested: usize,
        limit: usize,
        usage: Usage,
    },

    #[error("plugin returned {size} bytes of output, over the {limit}-byte cap")]
    OutputTooLarge {
        size: usize,
        limit: usize,
        usage: Usage,
    },

    /// The plugin returned something no consumer could use safely (e.g. an environment
    /// variable name that is not a shell identifier).
    #[error("plugin returned invalid output: {0}")]
    InvalidOutput(String),

    /// The plugin crashed: a Rust panic, `unreachable`, an out-of-bounds access.
    #[error("plugin trapped: {message}{}", stderr_suffix(.stderr))]
    Trap {
        message: String,
        stderr: String,
        usage: Usage,
    },

    /// The plugin ran to completion and reported an error of its own.
    #[error("plugin reported error `{code}`: {message}")]
    Plugin {
        code: String,
        message: String,
        usage: Usage,
    },

    #[error("facts are not valid JSON: {0}")]
    BadFacts(String),

    /// The host could not run the plugin now (every pooled instance slot busy, no thread to
    /// be had); nothing is known about the plugin, so callers retry later.
    #[error("plugin host busy: {0}")]
    Unavailable(String),

    /// A failure of the host itself, not attributable to the plugin.
    #[error("plugin host failure: {0}")]
    Internal(String),
}

/// The tail of stderr worth putting in a one-line error: a Rust panic prints
/// "thread … panicked at file:line:col:" then the message, then a `note:` about backtraces.
fn stderr_suffix(stderr: &str) -> String {
    let lines: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("note: "))
        .collect();
    let tail = &lines[lines.len().saturating_sub(2)..];
    if tail.is_empty() {
        String::new()
    } else {
        format!(" (stderr: {})", tail.join(" "))
    }
}

impl HostError {
    /// A stable, machine-readable name for the failure.
    pub fn code(&self) -> &'static str {
        match self {
            Self::NotAComponent(_) => "not-a-component",
            Self::TooLarge { .. } => "too-large",
            Self::CompileTimeout { .. } => "compile-timeout",
            Self::DisallowedImport { .. } => "disallowed-import",
            Self::Link(_) => "link",
            Self::WrongWorld { .. } => "wrong-world",
            Self::FuelExhausted { .. } => "fuel-exhausted",
            Self::Timeout { .. } => "timeout",
            Self::MemoryLimit { .. } => "memory-limit",
            Self::OutputTooLarge { .. } => "output-too-large",
            Self::InvalidOutput(_) => "invalid-output",
            Self::Trap { .. } => "trap",
            Self::Plugin { .. } => "plugin-error",
            Self::BadFacts(_) => "bad-facts",
            Self::Unavailable(_) => "unavailable",
            Self::Internal(_) => "internal",
        }
    }

    /// Resources the plugin used before it was stopped, when it got to run at all.
    pub fn usage(&self) -> Option<&Usage> {
        match self {
            Self::FuelExhausted { usage, .. }
            | Self::Timeout { usage, .. }
            | Self::MemoryLimit { usage, .. }
            | Self::OutputTooLarge { usage, .. }
            | Self::Trap { usage, .. }
            | Self::Plugin { usage, .. } => Some(usage),
            _ => None,
        }
    }

    /// True when the plugin itself is at fault (bad upload, misbehaviour); false for host
    /// failures and bad facts.
    pub fn is_plugin_fault(&self) -> bool {
        !matches!(
            self,
            Self::Internal(_) | Self::Unavailable(_) | Self::BadFacts(_)
        )
    }

    /// True when the failure says nothing about the plugin's verdict on a node: the host
    /// failed or was busy, or compiling ran out of time on this machine. Such outcomes are
    /// not recorded, replace nothing, and the call is retried later.
    pub fn is_host_side(&self) -> bool {
        matches!(
            self,
            Self::Internal(_) | Self::Unavailable(_) | Self::CompileTimeout { .. }
        )
    }
}
