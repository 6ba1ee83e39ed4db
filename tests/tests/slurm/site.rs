//! The Slurm test's setting: the server with its verdicts, an agent per node name, and the
//! hooks with their conf files.

use super::*;

/// What the steps share: the binaries under test, a private directory, the server with
/// its admin API and a viewer token for the prolog. Dropped in this order: the server,
/// its database, the directory.
pub(crate) struct Site {
    pub(crate) agent_bin: PathBuf,
    pub(crate) drive: PathBuf,
    pub(crate) plugin: PathBuf,
    pub(crate) heddle_bin: PathBuf,
    pub(crate) fixture: PathBuf,
    pub(crate) server: ServerProcess,
    pub(crate) api: Api,
    pub(crate) viewer: String,
    _db: TestDb,
    pub(crate) tmp: tempfile::TempDir,
}

impl Site {
    /// A node's directory of `what` (its job env file, state, spool, Slurm notes).
    pub(crate) fn node_dir(&self, n: &str, what: &str) -> PathBuf {
        self.tmp.path().join(format!("{what}-{n}"))
    }

    /// The task prolog's settings: `agent` under test, its timeout, the node env file.
    pub(crate) fn write_task_conf(&self, agent: &Path, timeout_s: u32, env_file: Option<&Path>) {
        let dir = self.tmp.path();
        let env_file = env_file.map_or_else(
            || format!("{}/job-$SLURMD_NODENAME/nccl.env", dir.display()),
            |p| p.display().to_string(),
        );
        std::fs::write(
            dir.join("slurm-task.conf"),
            format!(
                "agent={}\ntimeout_s={timeout_s}\nHEDDLE_NCCL_ENV_FILE={env_file}\n\
                 HEDDLE_FACTS_ROOT={}; export HEDDLE_FACTS_ROOT\n\
                 HEDDLE_SLURM_DIR={}/slurm-$SLURMD_NODENAME; export HEDDLE_SLURM_DIR\n",
                agent.display(),
                self.fixture.display(),
                dir.display()
            ),
        )
        .unwrap();
    }

    /// The prolog's settings: the server at `url`, and whether it drains a failing node.
    pub(crate) fn write_prolog_conf(&self, url: &str, drain: bool) {
        let dir = self.tmp.path();
        std::fs::write(
            dir.join("slurm-prolog.conf"),
            format!(
                "heddle={}\nHEDDLE_URL={url}\nHEDDLE_TOKEN={}\nHEDDLE_SLURM_DRAIN={drain}\n\
                 HEDDLE_SLURM_PREFLIGHT_CHECK=memcpy\nHEDDLE_SLURM_PREFLIGHT_TIMEOUT=2s\n\
                 HEDDLE_SLURM_DIR={}/slurm-$SLURMD_NODENAME\n",
                self.heddle_bin.display(),
                self.viewer,
                dir.display()
            ),
        )
        .unwrap();
    }
}

/// The server, and each node's verdict for the prolog's pre-flight (memcpy against an
/// operator expectation of 10 GB/s): hn-1 fails it, hn-2 clears it but fell 20 % below
/// its own baseline (WARN), hn-3 passes.
pub(crate) async fn a_server_with_three_verdicts() -> Site {
    let (agent_bin, drive, plugin) = (
        built("heddle-agent"),
        built("heddle-profiler-drive"),
        built("libheddle_nccl_profiler.so"),
    );
    let tmp = tempfile::tempdir().unwrap();
    let fixture = repo().join(FIXTURE);
    let heddle_bin = built("heddle");
    let db = TestDb::create().await;
    let server = ServerProcess::start(&db.url, free_port(), ADMIN, 2, &[])
        .await
        .unwrap();
    let api = Api::at(&server.url, ADMIN);
    api.ok(
        Method::POST,
        "/api/v1/expectations",
        Some(ADMIN),
        Some(json!({"test": "memcpy", "metric": "algbw_gbs", "value": 10.0, "source": "site acceptance"})),
    )
    .await;
    node_with_history(&api, "hn-1", &[8.0]).await;
    node_with_history(&api, "hn-2", &[15.0, 15.0, 15.0, 12.0]).await;
    node_with_history(&api, "hn-3", &[12.0]).await;
    let viewer = api
        .ok(
            Method::POST,
            "/api/v1/tokens",
            Some(ADMIN),
            Some(json!({"name": "slurm-prolog", "role": "viewer"})),
        )
        .await["token"]
        .as_str()
        .unwrap()
        .to_string();
    Site {
        agent_bin,
        drive,
        plugin,
        heddle_bin,
        fixture,
        server,
        api,
        viewer,
        _db: db,
        tmp,
    }
}

/// One agent per node name, each re-enrolled by a token bound to its node, on the dgx1
/// sysfs, with its own node env file, job spool and Slurm notes directory; returned once
/// each has written its node env file and GPU map.
pub(crate) async fn an_agent_per_node_with_its_env_file(site: &Site) -> Vec<Agent> {
    let Site {
        agent_bin,
        fixture,
        server,
        api,
        ..
    } = site;
    let dir = site.tmp.path();
    let node_dir = |n: &str, what: &str| site.node_dir(n, what);
    let mut agents = Vec::new();
    for n in NODES {
        std::fs::create_dir_all(node_dir(n, "job")).unwrap();
        let token = api.enrollment_token(Some(n)).await;
        let log = std::fs::File::create(dir.join(format!("agent-{n}.log"))).unwrap();
        agents.push(Agent(
            Command::new(agent_bin)
                .arg("run")
                .args(["--server", &server.url, "--enroll-token", &token])
                .arg("--state-dir")
                .arg(node_dir(n, "state"))
                .args(["--hostname", n, "--claim-interval", "200ms"])
                .arg("--facts-root")
                .arg(fixture)
                .arg("--nccl-env-file")
                .arg(node_dir(n, "job").join("nccl.env"))
                .arg("--job-spool")
                .arg(node_dir(n, "spool"))
                .args(["--job-spool-interval", "200ms"])
                .env("HEDDLE_LOG", "info")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap(),
        ));
    }
    for n in NODES {
        let env_file = node_dir(n, "job").join("nccl.env");
        wait_until(
            &format!("{n}'s node env file"),
            Duration::from_secs(60),
            || {
                std::fs::read_to_string(&env_file).is_ok_and(|t| t.contains("NCCL_IB_HCA="))
                    // The GPU map the task prolog reads instead of computing it per task.
                    && env_file.with_file_name("gpu-map.json").is_file()
            },
        )
        .unwrap_or_else(|e| {
            panic!(
                "{e}: {}",
                std::fs::read_to_string(dir.join(format!("agent-{n}.log"))).unwrap_or_default()
            )
        });
    }
    agents
}

/// The hooks, as deploy/slurm/ ships them; their settings (the binaries under test among
/// them) in the conf files they read.
pub(crate) fn the_hooks_with_their_conf_files(site: &Site) -> Hooks {
    let Site {
        agent_bin, server, ..
    } = site;
    let dir = site.tmp.path();
    let prolog_conf = dir.join("slurm-prolog.conf");
    let task_conf = dir.join("slurm-task.conf");
    let epilog_conf = dir.join("slurm-epilog.conf");
    let write_task_conf = |a: &Path, t: u32, e: Option<&Path>| site.write_task_conf(a, t, e);
    let write_prolog_conf = |url: &str, drain: bool| site.write_prolog_conf(url, drain);
    // Tasks read the GPU map each node's agent keeps; the timeout covers a debug build
    // that computes the map itself (seconds), as a task does where the map is refused.
    write_task_conf(agent_bin, 60, None);
    write_prolog_conf(&server.url, false);
    std::fs::write(
        &epilog_conf,
        format!(
            "agent={}\nHEDDLE_JOB_SPOOL={}/spool-$SLURMD_NODENAME\n\
             HEDDLE_SLURM_DIR={}/slurm-$SLURMD_NODENAME\n",
            agent_bin.display(),
            dir.display(),
            dir.display()
        ),
    )
    .unwrap();
    Hooks {
        prolog: install_hook(
            &repo().join("deploy/slurm"),
            dir,
            "heddle-prolog",
            &prolog_conf,
        ),
        task_prolog: install_hook(
            &repo().join("deploy/slurm"),
            dir,
            "heddle-task-prolog",
            &task_conf,
        ),
        epilog: install_hook(
            &repo().join("deploy/slurm"),
            dir,
            "heddle-epilog",
            &epilog_conf,
        ),
    }
}
