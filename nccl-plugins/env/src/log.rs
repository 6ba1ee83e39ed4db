//! Lines in the job's NCCL log. Version 1 of the environment plugin interface passes no
//! logger to `init` (NCCL reads its own `NCCL_DEBUG` through this very plugin, so it has no
//! logger yet when it loads it), so the plugin writes NCCL's own line shape to stderr, where
//! NCCL's INFO lines go unless `NCCL_DEBUG_FILE` is set, and only when NCCL would print an
//! INFO line of its ENV subsystem. Lines are written at `init` only, never on a lookup.

use std::io::Write;

/// Whether NCCL, with these `NCCL_DEBUG` and `NCCL_DEBUG_SUBSYS` values, prints INFO lines
/// of its ENV subsystem (which is in NCCL's default subsystem set).
pub fn enabled(debug: Option<&str>, subsys: Option<&str>) -> bool {
    let level = debug.unwrap_or("").to_ascii_uppercase();
    if level != "INFO" && level != "TRACE" {
        return false;
    }
    let Some(subsys) = subsys else { return true };
    let subsys = subsys.to_ascii_uppercase();
    let (negate, list) = match subsys.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, subsys.as_str()),
    };
    let named = list.split(',').any(|s| s == "ENV" || s == "ALL");
    named != negate
}

/// One `NCCL INFO ENV/Plugin: heddle ...` line on stderr. A closed or full stderr loses the
/// line, nothing else.
pub fn info(message: &str) {
    let mut host = [0u8; 256];
    // SAFETY: the buffer is writable for its whole length.
    let host = if unsafe { libc::gethostname(host.as_mut_ptr().cast(), host.len() - 1) } == 0 {
        let end = host.iter().position(|&b| b == 0).unwrap_or(0);
        String::from_utf8_lossy(&host[..end])
            .split('.')
            .next()
            .unwrap_or("")
            .to_string()
    } else {
        String::new()
    };
    let pid = std::process::id();
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
    let line = format!("{host}:{pid}:{tid} [-] NCCL INFO ENV/Plugin: heddle {message}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::enabled;

    #[test]
    fn follows_nccls_level_and_subsystems() {
        assert!(!enabled(None, None));
        assert!(!enabled(Some("WARN"), None));
        assert!(enabled(Some("INFO"), None));
        assert!(enabled(Some("info"), None));
        assert!(enabled(Some("TRACE"), Some("INIT,ENV")));
        assert!(!enabled(Some("INFO"), Some("INIT,NET")));
        assert!(enabled(Some("INFO"), Some("ALL")));
        assert!(!enabled(Some("INFO"), Some("^ENV")));
        assert!(enabled(Some("INFO"), Some("^NET")));
    }
}
