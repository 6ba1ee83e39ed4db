//! Communication-stack versions: NVIDIA driver, NCCL, UCX, MLNX_OFED.
//!
//! Module versions are read from the root's sysfs; the NCCL library and the `ucx_info`
//! and `ofed_info` tools are consulted only on the live machine, each with a short
//! timeout so a wedged tool cannot stall the agent.

use std::ffi::c_int;
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use heddle_types::facts::{Probe, ProbeState, SoftwareFacts};

use super::sysfs::Root;

pub const DEFAULT_NCCL_LIBRARY: &str = "libnccl.so.2";
const TOOL_TIMEOUT: Duration = Duration::from_secs(5);

pub fn collect(root: &mut Root, nccl_library: &str) -> SoftwareFacts {
    let mut sw = SoftwareFacts {
        nvidia_driver: root.opt("sys/module/nvidia/version", "/software/nvidia_driver"),
        mlx5_core: root.opt("sys/module/mlx5_core/version", "/software/mlx5_core"),
        ..Default::default()
    };
    if root.is_live() {
        let (version, probe) = nccl_version(nccl_library);
        sw.nccl = version;
        sw.nccl_probe = Some(probe);
        sw.ucx = run_tool("ucx_info", &["-v"]).and_then(|out| parse_ucx_version(&out));
        sw.ofed = run_tool("ofed_info", &["-s"]).and_then(|out| parse_ofed(&out));
    }
    sw
}

/// Loads NCCL and asks it for its version; a missing library is normal on CPU nodes.
pub fn nccl_version(library: &str) -> (Option<String>, Probe) {
    // SAFETY: libnccl's constructors do not touch the GPU; `ncclGetVersion(int*)` only
    // writes the version.
    unsafe {
        let lib = match libloading::Library::new(library) {
            Ok(l) => l,
            Err(e) => {
                return (
                    None,
                    Probe {
                        state: ProbeState::Missing,
                        message: format!("no NCCL: {library} could not be loaded ({e})"),
                    },
                );
            }
        };
        let get: libloading::Symbol<unsafe extern "C" fn(*mut c_int) -> c_int> =
            match lib.get(b"ncclGetVersion\0") {
                Ok(f) => f,
                Err(e) => {
                    return (
                        None,
                        Probe {
                            state: ProbeState::Failed,
                            message: format!("{library} has no ncclGetVersion: {e}"),
                        },
                    );
                }
            };
        let mut code: c_int = 0;
        let rc = get(&mut code);
        if rc != 0 {
            return (
                None,
                Probe {
                    state: ProbeState::Failed,
                    message: format!("ncclGetVersion returned error {rc}"),
                },
            );
        }
        let v = decode_nccl_version(code);
        (
            Some(v.clone()),
            Probe {
                state: ProbeState::Available,
                message: format!("NCCL {v} from {library}"),
            },
        )
    }
}

/// NCCL encodes 2.9+ as `major*10000 + minor*100 + patch`, older as `major*1000 + …`.
pub fn decode_nccl_version(code: i32) -> String {
    if code >= 10000 {
        format!("{}.{}.{}", code / 10000, (code % 10000) / 100, code % 100)
    } else {
        format!("{}.{}.{}", code / 1000, (code % 1000) / 100, code % 100)
    }
}

/// Runs a tool from PATH, returning stdout when it exits successfully within the timeout.
fn run_tool(program: &str, args: &[&str]) -> Option<String> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                let mut out = String::new();
                child.stdout.take()?.read_to_string(&mut out).ok()?;
                return status.success().then_some(out);
            }
            Ok(None) if start.elapsed() < TOOL_TIMEOUT => {
                std::thread::sleep(Duration::from_millis(5))
            }
            _ => {
                tracing::warn!(program, "timed out; ignoring");
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

/// `ucx_info -v` prints `# Library version: 1.15.0` (1.10+), `# Version 1.13.1`
/// (Debian 12's 1.13) or `# UCT version=1.9.0 …`.
pub fn parse_ucx_version(out: &str) -> Option<String> {
    out.lines().find_map(|l| {
        let l = l.trim_start_matches('#').trim();
        l.strip_prefix("Library version:")
            .or_else(|| l.strip_prefix("Version "))
            .map(|v| v.trim().to_string())
            .or_else(|| {
                l.strip_prefix("UCT version=")
                    .and_then(|v| v.split_whitespace().next())
                    .map(str::to_string)
            })
    })
}

/// `ofed_info -s` prints `MLNX_OFED_LINUX-5.8-1.0.1.1:`.
pub fn parse_ofed(out: &str) -> Option<String> {
    let l = out.lines().map(str::trim).find(|l| !l.is_empty())?;
    Some(l.trim_end_matches(':').to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_versions_decode_both_encodings() {
        assert_eq!(decode_nccl_version(22105), "2.21.5");
        assert_eq!(decode_nccl_version(2708), "2.7.8");
    }

    #[test]
    fn ucx_and_ofed_outputs_parse() {
        let new = "# Library version: 1.15.0\n# Library path: /usr/lib/libucs.so.0\n# API headers version: 1.15.0\n";
        assert_eq!(parse_ucx_version(new).as_deref(), Some("1.15.0"));
        let old = "# UCT version=1.9.0 revision 1d0a420\n# configured with: --prefix=/usr\n";
        assert_eq!(parse_ucx_version(old).as_deref(), Some("1.9.0"));
        // Debian 12's ucx-utils, as the agent image runs it.
        let debian = "# Version 1.13.1\n# Git branch '<unknown>', revision 0000000\n# Configured with: --build=x86_64-linux-gnu --prefix=/usr --with-verbs --enable-cma\n";
        assert_eq!(parse_ucx_version(debian).as_deref(), Some("1.13.1"));
        assert_eq!(parse_ucx_version("nothing"), None);
        assert_eq!(
            parse_ofed("MLNX_OFED_LINUX-5.8-1.0.1.1:\n").as_deref(),
            Some("MLNX_OFED_LINUX-5.8-1.0.1.1")
        );
    }

    #[test]
    fn missing_nccl_is_a_statement_not_a_panic() {
        let (v, probe) = nccl_version("libnccl-not-here.so.2");
        assert_eq!(v, None);
        assert_eq!(probe.state, ProbeState::Missing);
        assert!(probe.message.starts_with("no NCCL"));
    }
}
