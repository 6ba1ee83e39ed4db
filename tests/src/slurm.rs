//! A real Slurm on this machine, for the Slurm test: munged with a key and socket of its
//! own, slurmctld, and one slurmd per node name (`slurmd -N NAME`, every node at
//! 127.0.0.1 on a port of its own), configured in a private directory. No systemd and no
//! cgroups (`proctrack/linuxproc`, `task/none`). Dropping it cancels what still runs and
//! stops every daemon with its process group. Debian 12's packages, which `scripts/setup.sh
//! --test` installs: `slurmctld slurmd slurm-client munge`. `topology` is the fabric its
//! `topology.conf` describes.

pub mod topology;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The programs the cluster needs.
pub const PROGRAMS: [&str; 10] = [
    "munged",
    "mungekey",
    "slurmctld",
    "slurmd",
    "srun",
    "sbatch",
    "scontrol",
    "scancel",
    "sinfo",
    "squeue",
];

/// Where a program is: `PATH`, then the sbin directories daemons live in.
pub fn find(program: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .chain(["/usr/sbin", "/sbin", "/usr/bin"])
        .map(|d| Path::new(d).join(program))
        .find(|p| p.is_file())
}

/// The programs of [`PROGRAMS`] this machine lacks.
pub fn missing() -> Vec<&'static str> {
    PROGRAMS.into_iter().filter(|p| find(p).is_none()).collect()
}

/// The scripts slurmd runs around jobs and tasks.
pub struct Hooks {
    pub prolog: PathBuf,
    pub task_prolog: PathBuf,
    pub epilog: PathBuf,
}

/// A daemon in a process group of its own; stopped with the group when dropped.
struct Daemon {
    name: String,
    child: Child,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let group = -(self.child.id() as i32);
        // SAFETY: signals a process group this test started.
        unsafe { libc::kill(group, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // SAFETY: as above; whatever of the group is left.
        unsafe { libc::kill(group, libc::SIGKILL) };
        if self.child.try_wait().ok().flatten().is_none() {
            eprintln!("slurm test cluster: {} killed", self.name);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Slurm {
    pub dir: PathBuf,
    pub conf: PathBuf,
    pub nodes: Vec<String>,
    pub partition: String,
    /// Stopped in reverse order: the slurmds, slurmctld, munged.
    daemons: Vec<Daemon>,
}

fn short_hostname() -> String {
    let h = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    h.trim()
        .split('.')
        .next()
        .unwrap_or("localhost")
        .to_string()
}

fn user_name() -> String {
    // SAFETY: getpwuid returns a pointer into static storage or null; read at once.
    unsafe {
        let pw = libc::getpwuid(libc::geteuid());
        if pw.is_null() {
            return "root".into();
        }
        std::ffi::CStr::from_ptr((*pw).pw_name)
            .to_string_lossy()
            .into_owned()
    }
}

fn spawn(name: &str, program: &str, args: &[&str], log: &Path) -> anyhow::Result<Daemon> {
    let bin = find(program).ok_or_else(|| anyhow::anyhow!("{program} is not installed"))?;
    let child = Command::new(bin)
        .args(args)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(log)?)
        .stderr(std::fs::File::create(log.with_extension("err"))?)
        .spawn()?;
    Ok(Daemon {
        name: name.into(),
        child,
    })
}

impl Slurm {
    /// Starts munged, slurmctld and one slurmd per name in `nodes`, under `dir` (made
    /// 0711: munged insists that every directory above its socket be searchable by all;
    /// what is private beneath it stays 0700), and waits until every node is idle. With a
    /// `topology`, it is `topology.conf` beside `slurm.conf`, read by `topology/tree`.
    pub fn start(
        dir: &Path,
        nodes: &[&str],
        hooks: &Hooks,
        topology: Option<&str>,
    ) -> anyhow::Result<Slurm> {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))?;
        let sub = |name: &str, mode: u32| -> anyhow::Result<PathBuf> {
            let p = dir.join(name);
            std::fs::create_dir_all(&p)?;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode))?;
            Ok(p)
        };
        let munge = sub("munge", 0o700)?;
        let munge_run = sub("munge-run", 0o755)?;
        let state = sub("slurm-state", 0o700)?;
        let spool = sub("slurmd-spool", 0o755)?;
        let logs = sub("slurm-log", 0o755)?;
        let run = sub("slurm-run", 0o755)?;
        let socket = munge_run.join("munge.sock");
        let key = munge.join("munge.key");
        let status = Command::new(find("mungekey").unwrap())
            .args(["--create", "--keyfile"])
            .arg(&key)
            .status()?;
        anyhow::ensure!(status.success(), "mungekey failed");
        let mut daemons = vec![spawn(
            "munged",
            "munged",
            &[
                "--foreground",
                &format!("--key-file={}", key.display()),
                &format!("--socket={}", socket.display()),
                &format!("--pid-file={}", munge.join("munged.pid").display()),
                &format!("--log-file={}", munge.join("munged.log").display()),
                &format!("--seed-file={}", munge.join("munged.seed").display()),
            ],
            &munge.join("munged.out"),
        )?];
        wait_until("munged's socket", Duration::from_secs(10), || {
            socket.exists()
        })?;

        let host = short_hostname();
        let user = user_name();
        let partition = "heddle".to_string();
        let mut conf = format!(
            "ClusterName=heddle-e2e\n\
             SlurmctldHost={host}(127.0.0.1)\n\
             SlurmctldPort={ctld_port}\n\
             SlurmUser={user}\n\
             SlurmdUser={user}\n\
             AuthType=auth/munge\n\
             AuthInfo=socket={socket}\n\
             CredType=cred/munge\n\
             StateSaveLocation={state}\n\
             SlurmdSpoolDir={spool}/%n\n\
             SlurmctldPidFile={run}/slurmctld.pid\n\
             SlurmdPidFile={run}/slurmd-%n.pid\n\
             SlurmctldLogFile={logs}/slurmctld.log\n\
             SlurmdLogFile={logs}/slurmd-%n.log\n\
             ProctrackType=proctrack/linuxproc\n\
             TaskPlugin=task/none\n\
             JobAcctGatherType=jobacct_gather/none\n\
             AccountingStorageType=accounting_storage/none\n\
             SwitchType=switch/none\n\
             MpiDefault=none\n\
             SchedulerType=sched/builtin\n\
             SelectType=select/cons_tres\n\
             SelectTypeParameters=CR_Core\n\
             ReturnToService=2\n\
             PrologFlags=Alloc\n\
             SchedulerParameters=nohold_on_prolog_fail\n\
             Prolog={prolog}\n\
             TaskProlog={task_prolog}\n\
             Epilog={epilog}\n",
            ctld_port = crate::free_port(),
            socket = socket.display(),
            state = state.display(),
            spool = spool.display(),
            run = run.display(),
            logs = logs.display(),
            prolog = hooks.prolog.display(),
            task_prolog = hooks.task_prolog.display(),
            epilog = hooks.epilog.display(),
        );
        for n in nodes {
            conf.push_str(&format!(
                "NodeName={n} NodeAddr=127.0.0.1 NodeHostname={host} Port={} CPUs=2 RealMemory=500\n",
                crate::free_port()
            ));
        }
        conf.push_str(&format!(
            "PartitionName={partition} Nodes={} Default=YES MaxTime=INFINITE State=UP\n",
            nodes.join(",")
        ));
        if let Some(text) = topology {
            std::fs::write(dir.join("topology.conf"), text)?;
            conf.push_str("TopologyPlugin=topology/tree\n");
        }
        let conf_path = dir.join("slurm.conf");
        std::fs::write(&conf_path, conf)?;
        let conf_arg = conf_path.to_str().unwrap().to_string();
        daemons.push(spawn(
            "slurmctld",
            "slurmctld",
            &["-D", "-f", &conf_arg],
            &logs.join("slurmctld.out"),
        )?);
        let mut slurm = Slurm {
            dir: dir.to_path_buf(),
            conf: conf_path,
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
            partition,
            daemons,
        };
        wait_until("slurmctld", Duration::from_secs(30), || {
            slurm.cmd("scontrol").arg("ping").output().is_ok_and(|o| {
                o.status.success() && String::from_utf8_lossy(&o.stdout).contains("UP")
            })
        })?;
        for n in nodes {
            slurm.daemons.push(spawn(
                &format!("slurmd {n}"),
                "slurmd",
                &["-D", "-f", &conf_arg, "-N", n],
                &logs.join(format!("slurmd-{n}.out")),
            )?);
        }
        wait_until("every node idle", Duration::from_secs(60), || {
            slurm
                .nodes
                .iter()
                .all(|n| slurm.node_field(n, "State").is_some_and(|s| s == "IDLE"))
        })?;
        Ok(slurm)
    }

    /// A Slurm client command for this cluster, with an environment of only `PATH` and
    /// `SLURM_CONF` (a task gets the submitter's environment).
    pub fn cmd(&self, program: &str) -> Command {
        let mut c = Command::new(find(program).unwrap_or_else(|| program.into()));
        c.env_clear()
            .env(
                "PATH",
                std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()),
            )
            .env("SLURM_CONF", &self.conf)
            .current_dir(&self.dir)
            .stdin(Stdio::null());
        c
    }

    /// Runs `srun ARGS` to its end.
    pub fn srun(&self, args: &[&str]) -> Output {
        self.cmd("srun").args(args).output().expect("running srun")
    }

    /// Submits `script` with `sbatch ARGS`; returns the job id. Its output goes to
    /// [`Slurm::output_path`].
    pub fn sbatch(&self, args: &[&str], script: &str) -> String {
        let path = self.dir.join(format!(
            "job-{}.sh",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::write(&path, script).unwrap();
        let out = self
            .cmd("sbatch")
            .args(["--parsable", "-o"])
            .arg(self.dir.join("job-%j.out"))
            .args(args)
            .arg(&path)
            .output()
            .expect("running sbatch");
        assert!(
            out.status.success(),
            "sbatch: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .split(';')
            .next()
            .unwrap()
            .to_string()
    }

    pub fn output_path(&self, job: &str) -> PathBuf {
        self.dir.join(format!("job-{job}.out"))
    }

    /// A field of `scontrol show -o KIND ID`: `JobState`, `NodeList`, `Reason`, ... (a
    /// `Reason` runs to the ` [user@time]` Slurm appends).
    pub fn field(&self, kind: &str, id: &str, field: &str) -> Option<String> {
        let out = self
            .cmd("scontrol")
            .args(["show", "-o", kind, id])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let key = format!(" {field}=");
        let start = text.find(&key).map(|i| i + key.len()).or_else(|| {
            text.strip_prefix(&format!("{field}="))
                .map(|_| field.len() + 1)
        })?;
        let rest = &text[start..];
        let end = if field == "Reason" {
            rest.find(" [").unwrap_or(rest.len())
        } else {
            rest.find(' ').unwrap_or(rest.len())
        };
        Some(rest[..end].trim().to_string())
    }

    pub fn node_field(&self, node: &str, field: &str) -> Option<String> {
        self.field("node", node, field)
    }

    pub fn job_field(&self, job: &str, field: &str) -> Option<String> {
        self.field("job", job, field)
    }

    /// Waits until job `job` has ended; returns its final state.
    pub fn wait_job(&self, job: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let state = self.job_field(job, "JobState").unwrap_or_default();
            if [
                "COMPLETED",
                "FAILED",
                "CANCELLED",
                "TIMEOUT",
                "NODE_FAIL",
                "BOOT_FAIL",
                "OUT_OF_MEMORY",
                "DEADLINE",
                "PREEMPTED",
            ]
            .contains(&state.as_str())
            {
                return state;
            }
            assert!(
                Instant::now() < deadline,
                "job {job} still {state} after {within:?}; {}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// slurmctld's and the slurmds' last log lines, for a failure message.
    pub fn logs(&self) -> String {
        let mut s = String::new();
        let logs = self.dir.join("slurm-log");
        for entry in std::fs::read_dir(&logs).into_iter().flatten().flatten() {
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            s.push_str(&format!("\n== {}\n", entry.path().display()));
            for l in tail.into_iter().rev() {
                s.push_str(l);
                s.push('\n');
            }
        }
        s
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        // Jobs first, so that no job step outlives the daemons.
        let _ = self
            .cmd("scancel")
            .args(["--partition", &self.partition])
            .output();
        let _ = wait_until("no job left", Duration::from_secs(10), || {
            self.cmd("squeue")
                .args(["-h", "-o", "%i"])
                .output()
                .is_ok_and(|o| o.status.success() && o.stdout.is_empty())
        });
        while let Some(d) = self.daemons.pop() {
            drop(d);
        }
    }
}

/// The installed copy of one of `deploy/slurm/`'s hooks (in `deploy`), its `conf=` line pointed at
/// `conf` (the one setting a site changes there).
pub fn install_hook(deploy: &Path, dir: &Path, name: &str, conf: &Path) -> PathBuf {
    let text = std::fs::read_to_string(deploy.join(name)).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("conf="))
        .unwrap_or_else(|| panic!("deploy/slurm/{name} has no conf= line"))
        .to_string();
    let path = dir.join(name);
    std::fs::write(
        &path,
        text.replace(&line, &format!("conf={}", conf.display())),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// A command's stdout and stderr, for assertions and their messages.
pub fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `NAME=value` of the variables Heddle sets, as each task printed them: (node, local
/// rank) → variables. Tasks print `T <node> <localid> <env line>`.
pub fn task_vars(output: &str) -> BTreeMap<(String, String), BTreeMap<String, String>> {
    let mut out: BTreeMap<(String, String), BTreeMap<String, String>> = BTreeMap::new();
    for l in output.lines() {
        let mut parts = l.splitn(4, ' ');
        let (Some("T"), Some(node), Some(local), Some(var)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let entry = out.entry((node.into(), local.into())).or_default();
        if let Some((k, v)) = var.split_once('=') {
            entry.insert(k.into(), v.into());
        }
    }
    out
}

/// A task command that prints Heddle's variables (and a line when it has none).
pub const PRINT_VARS: &str = "echo \"T $SLURMD_NODENAME $SLURM_LOCALID ran=yes\"; \
    env | grep -E '^(NCCL_|UCX_|HEDDLE_LOCAL_RANK_|HEDDLE_SLURM_EXPORTED|CUDA_DEVICE_ORDER|LD_PRELOAD)' \
    | sed \"s/^/T $SLURMD_NODENAME $SLURM_LOCALID /\"";

/// The variables `heddle-agent slurm task-prolog` exports for local rank `local` on the
/// sysfs at `root` with the node env file `env_file`, run directly (outside Slurm) and
/// computing the GPU map itself rather than reading the agent's: what every such task must
/// have received.
pub fn expected_exports(
    agent: &Path,
    root: &Path,
    env_file: &Path,
    local: &str,
) -> BTreeMap<String, String> {
    let out = Command::new(agent)
        .args(["slurm", "task-prolog", "--root"])
        .arg(root)
        .arg("--nccl-env-file")
        .arg(env_file)
        .args(["--gpu-map-file", "/nonexistent/gpu-map.json"])
        .env_clear()
        .env("SLURM_LOCALID", local)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("export "))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Polls `ready` every 100 ms until it holds or `within` passes.
pub fn wait_until(
    what: &str,
    within: Duration,
    mut ready: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    while !ready() {
        anyhow::ensure!(Instant::now() < deadline, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}
