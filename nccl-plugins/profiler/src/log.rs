//! Lines in NCCL's own log, through the logger NCCL hands to `init`. Only `init` and the
//! one line that says the plugin turned itself off use it; never the event path.

use std::ffi::CString;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use crate::abi::{LOG_INFO, LOG_SUBSYS_INIT, Logger};

static LOGGER: AtomicUsize = AtomicUsize::new(0);

pub fn set_logger(logger: Option<Logger>) {
    if let Some(l) = logger {
        LOGGER.store(l as usize, Relaxed);
    }
}

/// One INFO line, `PROFILER/Plugin: <message>`; nothing when NCCL gave no logger.
pub fn info(message: &str) {
    let f = LOGGER.load(Relaxed);
    if f == 0 {
        return;
    }
    // SAFETY: the word was stored from a `Logger` by `set_logger`.
    let logger: Logger = unsafe { std::mem::transmute::<usize, Logger>(f) };
    let line = CString::new(format!("PROFILER/Plugin: {}", message.replace('\0', " ")))
        .unwrap_or_default();
    // SAFETY: printf-style call with one `%s` argument that is a NUL-terminated string.
    unsafe {
        logger(
            LOG_INFO,
            LOG_SUBSYS_INIT,
            c"heddle-profiler".as_ptr(),
            0,
            c"%s".as_ptr(),
            line.as_ptr(),
        )
    };
}
