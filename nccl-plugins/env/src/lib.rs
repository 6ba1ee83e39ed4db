//! Heddle's NCCL environment plugin (`libnccl-env-heddle.so`). NCCL 2.28.7 and later load an
//! environment plugin and ask it for every setting instead of calling `getenv`; this one
//! answers with the job's own environment first, then the node's Heddle-recommended value
//! from the node env file the agent keeps (`/var/lib/heddle-agent/nccl.env`, or
//! `HEDDLE_NCCL_ENV_FILE`), then nothing. So every NCCL job on the node runs with the node's
//! environment without its launcher changing, and a job that sets a variable keeps its own.
//!
//! It runs inside training jobs, so: the file is read once, in `init`, into a table that is
//! never changed or freed (every returned pointer stays valid for the life of the process
//! and a lookup takes no lock and allocates nothing); a missing, unsafe or malformed file
//! makes the plugin behave exactly like NCCL without one, saying why once in NCCL's INFO
//! log; every exported function catches panics. The ABI is `ncclEnv_v1_t` of NCCL's
//! `nccl/env_v1.h`, the only version NCCL defines.

use std::ffi::{CStr, CString, c_char, c_int};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::OnceLock;

pub mod log;
pub mod node_file;

/// `ncclResult_t` values of NCCL's `err.h`.
const NCCL_SUCCESS: c_int = 0;
const NCCL_INTERNAL_ERROR: c_int = 2;

/// Name NCCL prints as "ENV/Plugin: Using heddle (v1)".
pub const PLUGIN_NAME: &CStr = c"heddle";

/// The owner a node env file must have: root, who alone may install code on the node.
const REQUIRED_OWNER: u32 = 0;

/// `ncclEnv_v1_t`, field for field (`nccl/env_v1.h`): a name and three functions.
#[repr(C)]
pub struct NcclEnvV1 {
    pub name: *const c_char,
    pub init: unsafe extern "C" fn(u8, u8, u8, *const c_char) -> c_int,
    pub finalize: extern "C" fn() -> c_int,
    pub get_env: unsafe extern "C" fn(*const c_char) -> *const c_char,
}

// SAFETY: the struct is immutable and its name points at a static string.
unsafe impl Sync for NcclEnvV1 {}

/// The symbol NCCL looks up in the library.
#[allow(non_upper_case_globals)]
#[unsafe(no_mangle)]
pub static ncclEnvPlugin_v1: NcclEnvV1 = NcclEnvV1 {
    name: PLUGIN_NAME.as_ptr(),
    init,
    finalize,
    get_env,
};

/// What `init` found, fixed for the life of the process.
enum Node {
    /// No file applied: every lookup is the process environment only.
    None,
    Applied(Table),
}

/// The node's values, sorted by name, as NUL-terminated strings that are never freed.
struct Table {
    sha256: CString,
    vars: Vec<(Box<[u8]>, CString)>,
}

impl Table {
    fn get(&self, name: &[u8]) -> Option<&CStr> {
        self.vars
            .binary_search_by(|(n, _)| (**n).cmp(name))
            .ok()
            .map(|i| self.vars[i].1.as_c_str())
    }
}

static NODE: OnceLock<Node> = OnceLock::new();

/// The file to read: `HEDDLE_NCCL_ENV_FILE` from the process environment, else the default.
fn node_file_path() -> PathBuf {
    std::env::var_os("HEDDLE_NCCL_ENV_FILE")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(heddle_types::nccl_conf::DEFAULT_NODE_ENV_FILE))
}

fn process_env(name: &CStr) -> Option<&'static CStr> {
    // SAFETY: `name` is NUL-terminated; getenv's result, when not NULL, is a NUL-terminated
    // string that lives as long as the environment entry (as for NCCL without a plugin).
    let p = unsafe { libc::getenv(name.as_ptr()) };
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) })
}

/// Reads the file and says, once, what it applied or why it applied nothing.
fn load() -> Node {
    let path = node_file_path();
    let shown = path.display().to_string();
    let loaded = node_file::load(&path, REQUIRED_OWNER);
    let mut vars: Vec<(Box<[u8]>, CString)> = Vec::new();
    let sha256 = match &loaded {
        Ok(file) => {
            for e in &file.entries {
                if let Ok(value) = CString::new(e.value.as_str()) {
                    vars.push((e.name.as_bytes().into(), value));
                }
            }
            vars.sort_by(|a, b| a.0.cmp(&b.0));
            CString::new(file.sha256.as_str()).ok()
        }
        Err(_) => None,
    };
    let table = sha256.map(|sha256| Table { sha256, vars });
    // NCCL_DEBUG and NCCL_DEBUG_SUBSYS as NCCL itself will see them through this plugin.
    let setting = |name: &CStr| -> Option<String> {
        process_env(name)
            .or_else(|| table.as_ref()?.get(name.to_bytes()))
            .map(|v| v.to_string_lossy().into_owned())
    };
    if log::enabled(
        setting(c"NCCL_DEBUG").as_deref(),
        setting(c"NCCL_DEBUG_SUBSYS").as_deref(),
    ) {
        report(&shown, &loaded, table.as_ref());
    }
    table.map_or(Node::None, Node::Applied)
}

fn report(
    path: &str,
    loaded: &Result<node_file::NodeFile, node_file::Refusal>,
    table: Option<&Table>,
) {
    let file = match (loaded, table) {
        (Ok(file), Some(_)) => file,
        (Err(why), _) => {
            log::info(&format!(
                "applies no node settings: {path} was not applied because {why}"
            ));
            return;
        }
        (Ok(_), None) => return,
    };
    for (name, why) in &file.dropped {
        log::info(&format!("{name} from {path} ignored: {why}"));
    }
    for e in &file.entries {
        let ours = CString::new(e.name.as_str())
            .ok()
            .is_some_and(|n| process_env(&n).is_none());
        if ours {
            log::info(&format!(
                "{}={} from {path} sha256 {}",
                e.name, e.value, file.sha256
            ));
        } else {
            log::info(&format!(
                "{} is set by the job; its value wins over {path}",
                e.name
            ));
        }
    }
    if file.entries.is_empty() {
        log::info(&format!("{path} sha256 {} sets nothing", file.sha256));
    }
}

unsafe extern "C" fn init(_major: u8, _minor: u8, _patch: u8, _suffix: *const c_char) -> c_int {
    match catch_unwind(|| {
        NODE.get_or_init(load);
    }) {
        Ok(()) => NCCL_SUCCESS,
        // NCCL then falls back to its internal environment handling.
        Err(_) => NCCL_INTERNAL_ERROR,
    }
}

/// Nothing to release: the table outlives NCCL, so addresses NCCL still holds stay valid.
extern "C" fn finalize() -> c_int {
    NCCL_SUCCESS
}

/// The job's environment, then the node's value, then NULL. A lookup only.
unsafe extern "C" fn get_env(name: *const c_char) -> *const c_char {
    if name.is_null() {
        return std::ptr::null();
    }
    // SAFETY: NCCL passes a NUL-terminated name.
    let name = unsafe { CStr::from_ptr(name) };
    let found = catch_unwind(AssertUnwindSafe(|| {
        process_env(name).or_else(|| match NODE.get() {
            Some(Node::Applied(table)) => table.get(name.to_bytes()),
            _ => None,
        })
    }));
    match found {
        Ok(Some(v)) => v.as_ptr(),
        Ok(None) => std::ptr::null(),
        Err(_) => process_env(name).map_or(std::ptr::null(), CStr::as_ptr),
    }
}

/// SHA-256 (hex, NUL-terminated) of the node env file this process applied, or NULL when it
/// applied none (no file, refused, or NCCL has not initialised the plugin). Heddle's
/// profiler plugin finds this with `dlopen(RTLD_NOLOAD)` + `dlsym` to record whether a job
/// ran with Heddle's environment.
#[unsafe(no_mangle)]
pub extern "C" fn heddle_nccl_env_applied() -> *const c_char {
    catch_unwind(|| match NODE.get() {
        Some(Node::Applied(table)) => table.sha256.as_ptr(),
        _ => std::ptr::null(),
    })
    .unwrap_or(std::ptr::null())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// `ncclEnv_v1_t` of `nccl/env_v1.h` on LP64: four pointers, in this order.
    #[test]
    fn the_struct_is_laid_out_as_ncclenv_v1_t() {
        assert_eq!(size_of::<NcclEnvV1>(), 4 * size_of::<*const c_char>());
        assert_eq!(offset_of!(NcclEnvV1, name), 0);
        assert_eq!(offset_of!(NcclEnvV1, init), 8);
        assert_eq!(offset_of!(NcclEnvV1, finalize), 16);
        assert_eq!(offset_of!(NcclEnvV1, get_env), 24);
    }
}
