use std::path::{Path, PathBuf};

use super::*;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn rank_input(tree: &str) -> GpuMap {
    let map = GpuMap::compute(&fixtures().join(tree)).unwrap();
    assert!(map.failed_plugins.is_empty(), "{:?}", map.failed_plugins);
    map
}

fn node_env() -> Vec<nccl_conf::Entry> {
    let mut messages = Vec::new();
    let e = read_env_file(&fixtures().join("nccl-env/dgx1.env"), &mut messages);
    assert!(messages.is_empty());
    e
}

fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn a_dgx1_task_gets_the_node_values_and_its_gpus_hca() {
    let out = prolog(
        &node_env(),
        Some(rank_input("dgx1")),
        &env(&[("SLURM_LOCALID", "5"), ("UCX_TLS", "tcp")]),
    );
    assert_eq!(
        out.stdout,
        "export CUDA_DEVICE_ORDER=PCI_BUS_ID\n\
         export HEDDLE_LOCAL_RANK_CPUS=20-39,60-79\n\
         export HEDDLE_LOCAL_RANK_GPU=5\n\
         export HEDDLE_LOCAL_RANK_HCA=mlx5_2\n\
         export HEDDLE_LOCAL_RANK_NETDEV=ib2\n\
         export HEDDLE_LOCAL_RANK_NUMA=1\n\
         export NCCL_IB_HCA==mlx5_0,mlx5_1,mlx5_2,mlx5_3\n\
         export NCCL_SOCKET_IFNAME==ib0\n\
         export UCX_MEMTYPE_CACHE=n\n\
         export UCX_NET_DEVICES=mlx5_2:1\n\
         export UCX_RNDV_SCHEME=get_zcopy\n\
         export UCX_RNDV_THRESH=8192\n"
    );
    // The hostile line never reaches the task; UCX_TLS was the task's own.
    assert_eq!(out.messages.len(), 1, "{:?}", out.messages);
    assert!(out.messages[0].starts_with("NCCL_NET_PLUGIN is not set: NCCL_NET_PLUGIN is refused"));
}

#[test]
fn slurm_step_gpus_names_the_tasks_gpu_when_cgroups_renumber() {
    // --gpus-per-task=1 with ConstrainDevices: the task sees its GPU as 0; SLURM_STEP_GPUS
    // holds the device number.
    let out = prolog(
        &node_env(),
        Some(rank_input("dgx1")),
        &env(&[
            ("SLURM_LOCALID", "0"),
            ("CUDA_VISIBLE_DEVICES", "0"),
            ("SLURM_STEP_GPUS", "6"),
        ]),
    );
    assert!(out.stdout.contains("export HEDDLE_LOCAL_RANK_GPU=6\n"));
    assert!(out.stdout.contains("export UCX_NET_DEVICES=mlx5_3:1\n"));
    // A task driving two GPUs keeps the node-wide list.
    let out = prolog(
        &node_env(),
        Some(rank_input("dgx1")),
        &env(&[("SLURM_LOCALID", "0"), ("SLURM_STEP_GPUS", "0,1")]),
    );
    assert!(
        out.stdout
            .contains("export UCX_NET_DEVICES=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1\n")
    );
    assert!(!out.stdout.contains("HEDDLE_LOCAL_RANK"));
}

#[test]
fn without_a_rank_or_env_file_the_task_gets_what_is_known() {
    let out = prolog(&node_env(), Some(rank_input("dgx1")), &env(&[]));
    assert!(out.stdout.contains("export UCX_NET_DEVICES=mlx5_0:1,"));
    assert_eq!(
        out.messages[0],
        "SLURM_LOCALID is not set; the task gets the node values only"
    );
    // A rank beyond the node's GPUs: node values, and why.
    let out = prolog(
        &node_env(),
        Some(rank_input("dgx1")),
        &env(&[("SLURM_LOCALID", "9")]),
    );
    assert!(out.messages[0].contains("GPU9, which this node does not have"));
    assert!(out.stdout.contains("export NCCL_IB_HCA="));
    let mut messages = Vec::new();
    assert!(read_env_file(Path::new("/nonexistent/nccl.env"), &mut messages).is_empty());
    assert!(messages[0].starts_with("cannot read /nonexistent/nccl.env"));
    // A path from the task's environment that never ends, or is no file: refused at once.
    for endless in ["/dev/zero", "/proc/self"] {
        let mut messages = Vec::new();
        assert!(read_env_file(Path::new(endless), &mut messages).is_empty());
        assert_eq!(messages.len(), 1, "{endless}");
    }
}

#[test]
fn values_slurm_cannot_carry_are_refused_not_printed() {
    // A newline would start a second `export` line of the writer's choosing.
    let entries = vec![
        nccl_conf::Entry {
            name: "NCCL_ALGO".into(),
            value: "Ring\nexport LD_PRELOAD=/tmp/x.so".into(),
        },
        nccl_conf::Entry {
            name: "LD_PRELOAD".into(),
            value: "/tmp/x.so".into(),
        },
        nccl_conf::Entry {
            name: "NCCL_PROTO".into(),
            value: "Simple".into(),
        },
    ];
    let out = prolog(&entries, None, &env(&[]));
    assert_eq!(out.stdout, "export NCCL_PROTO=Simple\n");
    assert_eq!(out.messages.len(), 2);
    assert!(out.messages.iter().all(|m| !m.contains('\n')));
    // A file with such a line is refused whole by the reader.
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("nccl.env");
    std::fs::write(&f, "NCCL_PROTO=Simple\nNCCL_ALGO=Ring\r\n").unwrap();
    let mut messages = Vec::new();
    assert!(read_env_file(&f, &mut messages).is_empty());
    assert!(messages[0].contains("is refused whole"));
}

/// The lines a TaskProlog printed, applied to `env` as slurmstepd applies them.
fn apply(env: &mut BTreeMap<String, String>, out: &Prolog) {
    for line in out.stdout.lines().chain(out.exported.lines()) {
        if let Some((k, v)) = line.strip_prefix("export ").and_then(|l| l.split_once('=')) {
            env.insert(k.into(), v.into());
        } else if let Some(k) = line.strip_prefix("unset ") {
            env.remove(k);
        }
    }
}

#[test]
fn a_step_inside_a_batch_job_gets_its_own_rank_values_not_the_batch_scripts() {
    // The batch script's task prolog ran as local rank 0; its values are in the
    // environment every step's task inherits, and the job changed one of them since.
    let mut batch = env(&[("SLURM_LOCALID", "0")]);
    let first = prolog(&node_env(), Some(rank_input("dgx1")), &batch);
    apply(&mut batch, &first);
    assert!(first.exported.starts_with("export HEDDLE_SLURM_EXPORTED="));
    batch.insert("UCX_RNDV_THRESH".into(), "65536".into());
    // A step's task of local rank 5, and one that gets no rank values.
    let mut task = batch.clone();
    task.insert("SLURM_LOCALID".into(), "5".into());
    let out = prolog(&node_env(), Some(rank_input("dgx1")), &task);
    apply(&mut task, &out);
    assert_eq!(task["HEDDLE_LOCAL_RANK_GPU"], "5");
    assert_eq!(task["UCX_NET_DEVICES"], "mlx5_2:1");
    assert_eq!(task["UCX_RNDV_THRESH"], "65536", "the job's own value wins");
    let mut bare = batch.clone();
    let out = prolog(&node_env(), None, &bare);
    apply(&mut bare, &out);
    assert!(!bare.contains_key("HEDDLE_LOCAL_RANK_GPU"), "{out:?}");
    assert_eq!(
        bare["UCX_NET_DEVICES"],
        "mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"
    );
    // A claim on a value the job set itself changes nothing.
    let mine = env(&[
        ("NCCL_IB_HCA", "mine"),
        (EXPORTED_VAR, "NCCL_IB_HCA:00000000"),
    ]);
    let out = prolog(&node_env(), None, &mine);
    assert!(!out.stdout.contains("NCCL_IB_HCA"), "{}", out.stdout);
}
