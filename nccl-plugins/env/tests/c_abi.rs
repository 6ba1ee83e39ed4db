//! The built `libheddle_nccl_env.so` loaded as NCCL loads it: `dlopen`, `dlsym
//! ncclEnvPlugin_v1`, `init`, `getEnv`, `finalize`. The plugin reads its file once per
//! process, so each case runs in a child process (this test binary, running only `probe`)
//! with its own environment, and reads back what the child printed.
//!
//! The plugin accepts only a root-owned file. Cases that need a file applied write one as
//! the user running the tests, so they check what they can when not root and say so (CI
//! runs them as root).

use std::ffi::{CStr, CString, c_char, c_int};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

#[repr(C)]
struct NcclEnvV1 {
    name: *const c_char,
    init: unsafe extern "C" fn(u8, u8, u8, *const c_char) -> c_int,
    finalize: unsafe extern "C" fn() -> c_int,
    get_env: unsafe extern "C" fn(*const c_char) -> *const c_char,
}

/// The library cargo built beside this test binary.
fn built_library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.ancestors()
        .map(|dir| dir.join("libheddle_nccl_env.so"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "libheddle_nccl_env.so was not built next to {}; run `cargo test -p heddle-nccl-env`",
                exe.display()
            )
        })
}

fn is_root() -> bool {
    // SAFETY: getuid has no preconditions.
    unsafe { libc::getuid() == 0 }
}

/// Runs in a child process only (`HEDDLE_ENV_PROBE` set): loads the plugin, asks for each
/// name in `HEDDLE_ENV_PROBE_ASK` and prints the answers.
#[test]
fn probe() {
    let Ok(mode) = std::env::var("HEDDLE_ENV_PROBE") else {
        return;
    };
    // SAFETY: loading the library runs no initialiser with preconditions.
    let lib = unsafe { libloading::Library::new(built_library()) }.unwrap();
    // SAFETY: the symbol is a `ncclEnv_v1_t` (what these tests pin).
    let plugin: &NcclEnvV1 =
        unsafe { &**lib.get::<*const NcclEnvV1>(b"ncclEnvPlugin_v1\0").unwrap() };
    let applied: libloading::Symbol<extern "C" fn() -> *const c_char> =
        unsafe { lib.get(b"heddle_nccl_env_applied\0") }.unwrap();
    // SAFETY: the struct's name is a static C string.
    println!(
        "NAME {}",
        unsafe { CStr::from_ptr(plugin.name) }.to_str().unwrap()
    );
    let before = applied();
    println!(
        "BEFORE_INIT {}",
        if before.is_null() { "null" } else { "set" }
    );
    let rc = unsafe { (plugin.init)(2, 28, 7, c"".as_ptr()) };
    println!("INIT {rc}");
    let sha = applied();
    if sha.is_null() {
        println!("APPLIED none");
    } else {
        println!(
            "APPLIED {}",
            unsafe { CStr::from_ptr(sha) }.to_str().unwrap()
        );
    }
    let ask = std::env::var("HEDDLE_ENV_PROBE_ASK").unwrap_or_default();
    let get_env = plugin.get_env;
    let get = move |name: &str| -> *const c_char {
        let n = CString::new(name).unwrap();
        unsafe { get_env(n.as_ptr()) }
    };
    for name in ask.split(',').filter(|n| !n.is_empty()) {
        let p = get(name);
        if p.is_null() {
            println!("ANSWER {name} NULL");
        } else {
            println!(
                "ANSWER {name}={}",
                unsafe { CStr::from_ptr(p) }.to_str().unwrap()
            );
        }
    }
    if mode == "stable" {
        // The same address every time, and after finalize, with the contents unchanged.
        let name = ask.split(',').next().unwrap();
        let first = get(name);
        let text = unsafe { CStr::from_ptr(first) }.to_owned();
        for _ in 0..1000 {
            assert_eq!(get(name), first);
        }
        assert_eq!(unsafe { (plugin.finalize)() }, 0);
        assert_eq!(unsafe { CStr::from_ptr(first) }, text.as_c_str());
        println!("STABLE ok");
    }
    if mode == "threads" {
        let names: Vec<String> = ask.split(',').map(String::from).collect();
        let expect: Vec<usize> = names.iter().map(|n| get(n) as usize).collect();
        std::thread::scope(|s| {
            for t in 0..16 {
                let (names, expect, get) = (&names, &expect, &get);
                s.spawn(move || {
                    for i in 0..20_000 {
                        let k = (i + t) % names.len();
                        assert_eq!(get(&names[k]) as usize, expect[k], "{}", names[k]);
                    }
                });
            }
        });
        println!("THREADS ok");
    }
    // A second init (NCCL re-initialised in the same process) changes nothing.
    assert_eq!(unsafe { (plugin.init)(2, 28, 7, c"".as_ptr()) }, 0);
    assert_eq!(applied(), sha);
    // A NULL name is answered NULL, not a crash.
    assert!(unsafe { (plugin.get_env)(std::ptr::null()) }.is_null());
    assert_eq!(unsafe { (plugin.finalize)() }, 0);
}

struct Probe {
    stdout: String,
    stderr: String,
}

impl Probe {
    fn answer(&self, name: &str) -> Option<String> {
        let null = format!("ANSWER {name} NULL");
        let set = format!("ANSWER {name}=");
        self.stdout
            .lines()
            .find_map(|l| {
                if l == null {
                    Some(None)
                } else {
                    l.strip_prefix(&set).map(|v| Some(v.to_string()))
                }
            })
            .unwrap_or_else(|| panic!("the probe did not answer {name}:\n{}", self.stdout))
    }

    fn applied(&self) -> Option<String> {
        let v = self
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix("APPLIED "))
            .unwrap_or_else(|| panic!("no APPLIED line:\n{}\n{}", self.stdout, self.stderr));
        (v != "none").then(|| v.to_string())
    }
}

/// Runs `probe` in a child with `env` added (a name written `!NAME` is removed instead),
/// asking for `ask`.
fn probe_with(mode: &str, file: &Path, ask: &[&str], env: &[(&str, &str)]) -> Probe {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "probe", "--nocapture", "--test-threads=1"])
        .env("HEDDLE_ENV_PROBE", mode)
        .env("HEDDLE_ENV_PROBE_ASK", ask.join(","))
        .env("HEDDLE_NCCL_ENV_FILE", file)
        .env("NCCL_DEBUG", "INFO")
        .env_remove("LD_PRELOAD")
        .env_remove("NCCL_DEBUG_SUBSYS");
    for (k, v) in env {
        match k.strip_prefix('!') {
            Some(unset) => cmd.env_remove(unset),
            None => cmd.env(k, v),
        };
    }
    let out = cmd.output().unwrap();
    let probe = Probe {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert!(
        out.status.success(),
        "probe failed:\n{}\n{}",
        probe.stdout,
        probe.stderr
    );
    assert!(probe.stdout.contains("NAME heddle\n"), "{}", probe.stdout);
    assert!(
        probe.stdout.contains("BEFORE_INIT null\n"),
        "{}",
        probe.stdout
    );
    assert!(probe.stdout.contains("INIT 0\n"), "{}", probe.stdout);
    probe
}

fn write_file(dir: &Path, text: &str, mode: u32) -> PathBuf {
    let path = dir.join("nccl.env");
    let _ = std::fs::remove_file(&path);
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

const NODE_FILE: &str = "# node gpu-1\nNCCL_IB_HCA=mlx5_0:1,mlx5_1:1\nNCCL_ALGO=Ring\nNCCL_NET_PLUGIN=/tmp/evil.so\nLD_PRELOAD=/tmp/evil.so\nNCCL_PROFILER_PLUGIN=/tmp/x/libnccl-profiler-inspector.so\n";

#[test]
fn node_values_apply_and_the_jobs_own_win() {
    if !is_root() {
        eprintln!(
            "not root: a root-owned node file cannot be written; the values part runs as root (CI)"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(dir.path(), NODE_FILE, 0o644);
    let p = probe_with(
        "plain",
        &path,
        &[
            "NCCL_IB_HCA",
            "NCCL_ALGO",
            "NCCL_NET_PLUGIN",
            "NCCL_PROFILER_PLUGIN",
            "NCCL_PROTO",
            "HOME",
            "LD_PRELOAD",
        ],
        &[("NCCL_ALGO", "Tree"), ("HOME", "/home/job")],
    );
    assert_eq!(
        p.answer("NCCL_IB_HCA").as_deref(),
        Some("mlx5_0:1,mlx5_1:1")
    );
    assert_eq!(
        p.answer("NCCL_ALGO").as_deref(),
        Some("Tree"),
        "the job's own value wins"
    );
    assert_eq!(
        p.answer("NCCL_NET_PLUGIN"),
        None,
        "a code loader is never taken from the file"
    );
    assert_eq!(
        p.answer("NCCL_PROFILER_PLUGIN"),
        None,
        "only Heddle's profiler may be named"
    );
    assert_eq!(p.answer("NCCL_PROTO"), None);
    assert_eq!(p.answer("LD_PRELOAD"), None, "never a loader variable");
    assert_eq!(p.answer("HOME").as_deref(), Some("/home/job"));
    let sha = sha256_hex(NODE_FILE.as_bytes());
    assert_eq!(p.applied().as_deref(), Some(sha.as_str()));
    let shown = path.display().to_string();
    assert!(
        p.stderr.contains(&format!(
            "NCCL INFO ENV/Plugin: heddle NCCL_IB_HCA=mlx5_0:1,mlx5_1:1 from {shown} sha256 {sha}\n"
        )),
        "{}",
        p.stderr
    );
    assert!(
        p.stderr
            .contains("ENV/Plugin: heddle NCCL_ALGO is set by the job"),
        "{}",
        p.stderr
    );
    assert!(
        p.stderr.contains("ENV/Plugin: heddle NCCL_NET_PLUGIN from"),
        "{}",
        p.stderr
    );
    assert!(
        p.stderr
            .contains("ENV/Plugin: heddle NCCL_PROFILER_PLUGIN from"),
        "{}",
        p.stderr
    );
    // Quiet unless NCCL would print INFO lines.
    let quiet = probe_with("plain", &path, &["NCCL_IB_HCA"], &[("NCCL_DEBUG", "WARN")]);
    assert_eq!(
        quiet.answer("NCCL_IB_HCA").as_deref(),
        Some("mlx5_0:1,mlx5_1:1")
    );
    assert!(!quiet.stderr.contains("ENV/Plugin"), "{}", quiet.stderr);
}

#[test]
fn heddles_profiler_may_be_named_and_the_file_may_turn_on_logging() {
    if !is_root() {
        eprintln!("not root: a root-owned node file cannot be written; this runs as root (CI)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let text = "NCCL_PROFILER_PLUGIN=/opt/heddle/lib/libnccl-profiler-heddle.so\nNCCL_DEBUG=INFO\n";
    let path = write_file(dir.path(), text, 0o600);
    let p = probe_with("plain", &path, &["NCCL_PROFILER_PLUGIN"], &[]);
    assert_eq!(
        p.answer("NCCL_PROFILER_PLUGIN").as_deref(),
        Some("/opt/heddle/lib/libnccl-profiler-heddle.so")
    );
    // NCCL_DEBUG=INFO from the node file makes the plugin log as it makes NCCL log.
    let p = probe_with("plain", &path, &["NCCL_DEBUG"], &[("!NCCL_DEBUG", "")]);
    assert_eq!(p.answer("NCCL_DEBUG").as_deref(), Some("INFO"));
    assert!(
        p.stderr.contains("ENV/Plugin: heddle NCCL_PROFILER_PLUGIN=/opt/heddle/lib/libnccl-profiler-heddle.so from"),
        "{}",
        p.stderr
    );
}

#[test]
fn values_are_stable_and_lookups_safe_from_many_threads() {
    if !is_root() {
        eprintln!("not root: a root-owned node file cannot be written; this runs as root (CI)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(dir.path(), NODE_FILE, 0o644);
    let p = probe_with("stable", &path, &["NCCL_IB_HCA"], &[]);
    assert!(p.stdout.contains("STABLE ok"), "{}", p.stdout);
    let p = probe_with(
        "threads",
        &path,
        &[
            "NCCL_IB_HCA",
            "NCCL_ALGO",
            "NCCL_PROTO",
            "NCCL_NET_PLUGIN",
            "PATH",
        ],
        &[],
    );
    assert!(p.stdout.contains("THREADS ok"), "{}", p.stdout);
}

/// Every refused file leaves the plugin answering exactly as `getenv` would, and says why.
#[test]
fn a_missing_corrupt_or_hostile_file_applies_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ask = ["NCCL_IB_HCA", "NCCL_ALGO"];
    let env = [("NCCL_ALGO", "Tree")];
    let check = |path: &Path, why: &str| {
        let p = probe_with("plain", path, &ask, &env);
        assert_eq!(p.applied(), None, "{why}");
        assert_eq!(p.answer("NCCL_IB_HCA"), None, "{why}");
        assert_eq!(p.answer("NCCL_ALGO").as_deref(), Some("Tree"), "{why}");
        assert!(
            p.stderr
                .contains("ENV/Plugin: heddle applies no node settings:")
                && p.stderr.contains(why),
            "{why}: {}",
            p.stderr
        );
        assert_eq!(
            p.stderr.matches("ENV/Plugin").count(),
            1,
            "said once: {}",
            p.stderr
        );
    };
    check(&dir.path().join("absent"), "does not exist");
    let good = write_file(dir.path(), NODE_FILE, 0o644);
    let link = dir.path().join("link.env");
    std::os::unix::fs::symlink(&good, &link).unwrap();
    check(&link, "symbolic link");
    check(dir.path(), "not a regular file");
    for mode in [0o664, 0o646] {
        let p = write_file(dir.path(), NODE_FILE, mode);
        check(&p, "lets group or others write it");
    }
    let p = write_file(dir.path(), &"#".repeat(64 * 1024 + 1), 0o644);
    check(&p, "at most");
    let p = write_file(dir.path(), "NCCL_IB_HCA=mlx5_0\ngarbage\n", 0o644);
    check(&p, "not a valid NCCL conf file");
    let p = write_file(
        dir.path(),
        "NCCL_IB_HCA=mlx5_0\nNCCL_IB_HCA=mlx5_1\n",
        0o644,
    );
    check(&p, "not a valid NCCL conf file");
    // A file of another owner: root's own test chowns it to nobody; anyone else's file is
    // already not root's.
    let p = write_file(dir.path(), NODE_FILE, 0o644);
    if is_root() {
        let c = CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::chown(c.as_ptr(), 65534, 65534) }, 0);
    }
    check(&p, "owned by uid");
}
