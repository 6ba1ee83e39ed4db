//! Who the process is, read once when NCCL first initialises the plugin: the job identity
//! the agent files the spool under, the NCCL version that loaded the plugin, and whether
//! Heddle's environment plugin applied the node's settings here. Every lookup may fail;
//! a failure leaves the field empty and nothing else.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::io::{BufRead, BufReader};

use heddle_types::observe::JobIdentity;

use crate::names::clean_text;

/// Kubernetes pod and namespace: Heddle's injection names first, then the names most pod
/// specs give the downward API fields.
const POD_VARS: [&str; 2] = ["HEDDLE_POD_NAME", "POD_NAME"];
const NAMESPACE_VARS: [&str; 2] = ["HEDDLE_POD_NAMESPACE", "POD_NAMESPACE"];
/// The environment plugin's file name and the symbol it exports.
const ENV_PLUGIN: &str = "libnccl-env-heddle.so";
const ENV_APPLIED_SYMBOL: &CStr = c"heddle_nccl_env_applied";

fn var(names: &[&str]) -> Option<String> {
    names
        .iter()
        .filter_map(|n| std::env::var(n).ok())
        .map(|v| clean_text(v.trim()))
        .find(|v| !v.is_empty())
}

/// Field 22 (`starttime`) of a `/proc/<pid>/stat` line. The command name (field 2) may
/// hold spaces and parentheses, so fields are counted after its last `)`.
pub fn start_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // Fields 3.. follow; starttime is the 20th of them.
    rest.split_whitespace().nth(19)?.parse().ok()
}

pub fn job_identity() -> JobIdentity {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let comm = std::fs::read_to_string("/proc/self/comm")
        .ok()
        .map(|c| clean_text(c.trim_end_matches('\n')))
        .filter(|c| !c.is_empty());
    JobIdentity {
        pid: std::process::id(),
        // SAFETY: getuid has no preconditions and cannot fail.
        uid: unsafe { libc::getuid() },
        start_ticks: start_ticks(&stat).unwrap_or(0),
        slurm_job_id: var(&["SLURM_JOB_ID"]),
        slurm_step_id: var(&["SLURM_STEP_ID"]),
        k8s_namespace: var(&NAMESPACE_VARS),
        k8s_pod: var(&POD_VARS),
        torchrun_run_id: var(&["TORCHELASTIC_RUN_ID"]),
        comm,
    }
}

/// A loaded library's handle without loading anything: `dlopen(RTLD_NOLOAD)`. Closed on
/// drop (which only drops the reference this took).
struct Loaded(*mut c_void);

impl Loaded {
    fn find(path: &CStr) -> Option<Loaded> {
        // SAFETY: `path` is NUL-terminated; RTLD_NOLOAD never runs a library's
        // constructors, it only returns a handle to one already loaded.
        let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
        (!h.is_null()).then(|| Loaded(h))
    }

    fn symbol(&self, name: &CStr) -> *mut c_void {
        // SAFETY: the handle is open; `name` is NUL-terminated.
        unsafe { libc::dlsym(self.0, name.as_ptr()) }
    }
}

impl Drop for Loaded {
    fn drop(&mut self) {
        // SAFETY: the handle came from dlopen and is closed once.
        unsafe { libc::dlclose(self.0) };
    }
}

/// The NCCL version, from `ncclGetVersion` of the library that holds NCCL's logger (the
/// one that loaded this plugin), else of whatever the process resolves globally.
pub fn nccl_version(logger: *const c_void) -> Option<String> {
    type GetVersion = unsafe extern "C" fn(*mut c_int) -> c_int;
    let mut lib = None;
    if !logger.is_null() {
        // SAFETY: dladdr only reads the loader's tables; `info` is written on success.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        if unsafe { libc::dladdr(logger, &mut info) } != 0 && !info.dli_fname.is_null() {
            // SAFETY: dladdr gave a NUL-terminated path.
            lib = Loaded::find(unsafe { CStr::from_ptr(info.dli_fname) });
        }
    }
    let sym = match &lib {
        Some(l) => l.symbol(c"ncclGetVersion"),
        // SAFETY: RTLD_DEFAULT lookup of a NUL-terminated name.
        None => unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"ncclGetVersion".as_ptr()) },
    };
    if sym.is_null() {
        return None;
    }
    // SAFETY: ncclGetVersion(int*) is NCCL's public API; it only writes the int.
    let get: GetVersion = unsafe { std::mem::transmute::<*mut c_void, GetVersion>(sym) };
    let mut code: c_int = 0;
    if unsafe { get(&mut code) } != 0 || code <= 0 {
        return None;
    }
    Some(version_string(code))
}

/// NCCL's version code: major*10000 + minor*100 + patch since 2.9, major*1000 + minor*100
/// + patch before.
pub fn version_string(code: c_int) -> String {
    if code >= 10000 {
        format!("{}.{}.{}", code / 10000, (code % 10000) / 100, code % 100)
    } else {
        format!("{}.{}.{}", code / 1000, (code % 1000) / 100, code % 100)
    }
}

/// The hash of the env file Heddle's environment plugin applied in this process, if that
/// plugin is loaded here and says it applied one.
pub fn env_applied() -> Option<String> {
    let lib = env_plugin_path()
        .and_then(|p| CString::new(p).ok())
        .and_then(|p| Loaded::find(&p))
        .or_else(|| Loaded::find(&CString::new(ENV_PLUGIN).ok()?))?;
    let sym = lib.symbol(ENV_APPLIED_SYMBOL);
    if sym.is_null() {
        return None;
    }
    type Applied = unsafe extern "C" fn() -> *const c_char;
    // SAFETY: the symbol is the environment plugin's `extern "C" fn() -> *const c_char`.
    let applied: Applied = unsafe { std::mem::transmute::<*mut c_void, Applied>(sym) };
    let p = unsafe { applied() };
    if p.is_null() {
        return None;
    }
    // SAFETY: a NUL-terminated string owned by the plugin for the life of the process.
    let s = unsafe { CStr::from_ptr(p) }.to_str().ok()?;
    (!s.is_empty() && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| s.to_ascii_lowercase())
}

/// The network NCCL's proxy uses in this process, when its transports report no network
/// events: what `NCCL_NET` names, else the external net plugin (`NCCL_NET_PLUGIN`), else
/// IB when the process holds RDMA devices open (`/dev/infiniband/uverbs*`) and IB is not
/// disabled, else sockets. Read on the writer thread only.
pub fn network_in_use() -> String {
    let env = |n: &str| {
        std::env::var(n)
            .ok()
            .map(|v| clean_text(v.trim()))
            .filter(|v| !v.is_empty())
    };
    infer_network(
        env("NCCL_NET").as_deref(),
        env("NCCL_NET_PLUGIN").as_deref(),
        verbs_open(),
        env("NCCL_IB_DISABLE").as_deref() == Some("1"),
    )
}

pub fn infer_network(
    nccl_net: Option<&str>,
    plugin: Option<&str>,
    verbs_open: bool,
    ib_disabled: bool,
) -> String {
    if let Some(n) = nccl_net {
        return match n.to_ascii_lowercase().as_str() {
            "ib" => "IB".into(),
            "socket" => "Socket".into(),
            _ => n.to_string(),
        };
    }
    if let Some(p) = plugin.filter(|p| !p.eq_ignore_ascii_case("none")) {
        return p.to_string();
    }
    if verbs_open && !ib_disabled {
        "IB".into()
    } else {
        "Socket".into()
    }
}

/// Whether any of the process's descriptors is an RDMA device.
fn verbs_open() -> bool {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return false;
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .any(|t| t.starts_with("/dev/infiniband/"))
}

/// The environment plugin's path as mapped in this process (`/proc/self/maps`).
fn env_plugin_path() -> Option<String> {
    let maps = std::fs::File::open("/proc/self/maps").ok()?;
    BufReader::new(maps)
        .lines()
        .map_while(Result::ok)
        .find_map(|line| {
            let path = line.split_whitespace().nth(5)?;
            (path.rsplit('/').next() == Some(ENV_PLUGIN)).then(|| path.to_string())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_start_ticks_after_the_command_name() {
        let line =
            "4242 (py (thon) 3) S 1 4242 4242 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 987654 1 2";
        assert_eq!(start_ticks(line), Some(987654));
        let own = std::fs::read_to_string("/proc/self/stat").unwrap();
        assert!(start_ticks(&own).unwrap() > 0);
        assert_eq!(start_ticks("garbage"), None);
    }

    #[test]
    fn network_inference() {
        assert_eq!(
            infer_network(Some("socket"), Some("aws-ofi"), true, false),
            "Socket"
        );
        assert_eq!(
            infer_network(Some("AWS Libfabric"), None, false, false),
            "AWS Libfabric"
        );
        assert_eq!(infer_network(None, Some("aws-ofi"), true, false), "aws-ofi");
        assert_eq!(infer_network(None, Some("none"), true, false), "IB");
        assert_eq!(infer_network(None, None, true, true), "Socket");
        assert_eq!(infer_network(None, None, false, false), "Socket");
        assert!(!verbs_open());
    }

    #[test]
    fn versions_and_identity() {
        assert_eq!(version_string(22803), "2.28.3");
        assert_eq!(version_string(2708), "2.7.8");
        let id = job_identity();
        assert_eq!(id.pid, std::process::id());
        assert!(id.start_ticks > 0);
        // Not loaded in the test process.
        assert_eq!(env_applied(), None);
    }
}
