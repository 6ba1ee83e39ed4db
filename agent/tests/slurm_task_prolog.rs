//! `heddle-agent slurm task-prolog` as slurmstepd runs it: the binary, in a task's
//! environment (nothing else), reading the dgx1 fixture tree and a node env file; stdout
//! must be exactly Slurm's `export` lines, and the exit status 0 whatever happens.

use std::path::PathBuf;
use std::process::Command;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn prolog(env: &[(&str, &str)], env_file: &std::path::Path) -> (String, String, i32) {
    let out = Command::new(env!("CARGO_BIN_EXE_heddle-agent"))
        .args(["slurm", "task-prolog", "--root"])
        .arg(fixtures().join("dgx1"))
        .arg("--nccl-env-file")
        .arg(env_file)
        .env_clear()
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
        out.status.code().unwrap_or(-1),
    )
}

#[test]
fn a_task_on_gpu6_gets_exactly_these_lines() {
    let started = std::time::Instant::now();
    let (stdout, stderr, code) = prolog(
        &[
            ("SLURM_LOCALID", "6"),
            ("SLURM_JOB_ID", "4242"),
            ("NCCL_SOCKET_IFNAME", "ib3"),
        ],
        &fixtures().join("nccl-env/dgx1.env"),
    );
    eprintln!("task-prolog took {:?} (debug build)", started.elapsed());
    assert_eq!(code, 0);
    // Last, the line that names what was exported (for a step inside a batch job).
    let (stdout, marker) = stdout.trim_end().rsplit_once('\n').unwrap();
    let names: Vec<&str> = marker
        .strip_prefix("export HEDDLE_SLURM_EXPORTED=")
        .unwrap_or_else(|| panic!("{marker}"))
        .split(',')
        .map(|e| e.split(':').next().unwrap())
        .collect();
    let exported: Vec<&str> = stdout
        .lines()
        .map(|l| {
            l.strip_prefix("export ")
                .unwrap()
                .split('=')
                .next()
                .unwrap()
        })
        .collect();
    assert_eq!(names, exported);
    assert_eq!(
        format!("{stdout}\n"),
        "export CUDA_DEVICE_ORDER=PCI_BUS_ID\n\
         export HEDDLE_LOCAL_RANK_CPUS=20-39,60-79\n\
         export HEDDLE_LOCAL_RANK_GPU=6\n\
         export HEDDLE_LOCAL_RANK_HCA=mlx5_3\n\
         export HEDDLE_LOCAL_RANK_NETDEV=ib3\n\
         export HEDDLE_LOCAL_RANK_NUMA=1\n\
         export NCCL_IB_HCA==mlx5_0,mlx5_1,mlx5_2,mlx5_3\n\
         export UCX_MEMTYPE_CACHE=n\n\
         export UCX_NET_DEVICES=mlx5_3:1\n\
         export UCX_RNDV_SCHEME=get_zcopy\n\
         export UCX_RNDV_THRESH=8192\n\
         export UCX_TLS=rc,cuda_copy,cuda_ipc\n"
    );
    // The env file's hostile line is refused on stderr, where Slurm ignores it.
    assert!(stderr.contains("heddle-agent task-prolog: NCCL_NET_PLUGIN is not set"));
    assert!(
        !stderr.lines().any(|l| l.starts_with("export ")
            || l.starts_with("print ")
            || l.starts_with("unset "))
    );
}

#[test]
fn a_missing_or_hostile_env_file_never_fails_the_task() {
    let dir = tempfile::tempdir().unwrap();
    let (stdout, stderr, code) = prolog(&[("SLURM_LOCALID", "0")], &dir.path().join("absent"));
    assert_eq!(code, 0);
    // Without the node's UCX list the rank's port cannot be named: nothing is guessed.
    assert!(!stdout.contains("UCX_NET_DEVICES"));
    assert!(stdout.contains("export HEDDLE_LOCAL_RANK_HCA=mlx5_0\n"));
    assert!(stderr.contains("cannot read"));
    // A line that would smuggle a second export: the whole file is refused.
    let f = dir.path().join("nccl.env");
    std::fs::write(
        &f,
        "NCCL_PROTO=Simple\nNCCL_ALGO=Ring\rexport LD_PRELOAD=/tmp/x.so\n",
    )
    .unwrap();
    let (stdout, stderr, code) = prolog(&[("SLURM_LOCALID", "0")], &f);
    assert_eq!(code, 0);
    assert!(!stdout.contains("LD_PRELOAD") && !stdout.contains("NCCL_PROTO"));
    assert!(stderr.contains("is refused whole"));
    for line in stdout.lines() {
        assert!(line.starts_with("export "), "{line:?}");
    }
}

/// The GPU map the agent keeps beside the env file is what the task's rank values come
/// from (not computed again per task); one written for another facts root, or a FIFO in
/// its place, is not used, and the task still gets its values.
#[test]
fn the_agents_gpu_map_is_used_and_one_that_does_not_fit_is_not() {
    use heddle_agent::gpu_map::{self, GpuMap};
    let dir = tempfile::tempdir().unwrap();
    let env_file = dir.path().join("nccl.env");
    std::fs::copy(fixtures().join("nccl-env/dgx1.env"), &env_file).unwrap();
    let mut map = GpuMap::compute(&fixtures().join("dgx1")).unwrap();
    // Marked: GPU6's HCA as only the map says it.
    for a in map.affinity.iter_mut().filter(|a| a.gpu == 6) {
        a.nic = Some("mlx5_0".into());
    }
    map.write(dir.path()).unwrap();
    let started = std::time::Instant::now();
    let (stdout, stderr, code) = prolog(&[("SLURM_LOCALID", "6")], &env_file);
    eprintln!(
        "task-prolog with the agent's map took {:?} (debug build)",
        started.elapsed()
    );
    assert_eq!(code, 0);
    assert!(
        stdout.contains("export HEDDLE_LOCAL_RANK_HCA=mlx5_0\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("export UCX_NET_DEVICES=mlx5_0:1\n"),
        "{stdout}"
    );
    assert!(!stderr.contains("computing"), "{stderr}");

    map.root = "/elsewhere".into();
    map.write(dir.path()).unwrap();
    let (stdout, stderr, code) = prolog(&[("SLURM_LOCALID", "6")], &env_file);
    assert_eq!(code, 0);
    assert!(
        stdout.contains("export HEDDLE_LOCAL_RANK_HCA=mlx5_3\n"),
        "{stdout}"
    );
    assert!(
        stderr.contains("computed for facts root /elsewhere"),
        "{stderr}"
    );

    let path = gpu_map::beside(&env_file);
    std::fs::remove_file(&path).unwrap();
    let status = Command::new("mkfifo").arg(&path).status().unwrap();
    assert!(status.success());
    let (stdout, stderr, code) = prolog(&[("SLURM_LOCALID", "6")], &env_file);
    assert_eq!(code, 0);
    assert!(
        stdout.contains("export HEDDLE_LOCAL_RANK_HCA=mlx5_3\n"),
        "{stdout}"
    );
    assert!(stderr.contains("not a regular file"), "{stderr}");
}
