//! The supervisor against small shell scripts standing in for test children.

use super::*;
use uuid::Uuid;

fn sh(script: &str, timeout: Option<Duration>) -> ChildSpec {
    ChildSpec {
        program: "/bin/sh".into(),
        args: vec!["-c".into(), script.into()],
        input: ChildInput {
            kind: "script".into(),
            params: serde_json::json!({"x": 1}),
            job_id: Uuid::nil(),
            run_id: Uuid::nil(),
            rank: 0,
            world_size: 1,
            rendezvous: None,
        },
        env: BTreeMap::from([("HEDDLE_TEST_VAR".to_string(), "from-job".to_string())]),
        timeout,
        stall: None,
    }
}

async fn run(spec: ChildSpec) -> ChildReport {
    let (_stop_tx, stop_rx) = watch::channel(None);
    let (progress_tx, _progress_rx) = watch::channel(None);
    supervise(spec, stop_rx, progress_tx).await
}

#[tokio::test]
async fn the_child_gets_a_cleared_environment_plus_the_job_env() {
    // Cargo gives this test process CARGO_* variables; none may reach the child.
    let r = run(sh("env | cut -d= -f1 >&2", None)).await;
    assert_eq!(r.end, ChildEnd::Exited(0), "{}", r.stderr_tail);
    let names: Vec<&str> = r.stderr_tail.lines().collect();
    assert!(names.contains(&"HEDDLE_TEST_VAR"), "{names:?}");
    assert!(names.contains(&"PATH"), "{names:?}");
    for name in names {
        assert!(
            name == "HEDDLE_TEST_VAR"
                || name == "PWD"
                || name == "SHLVL"
                || name == "_"
                || crate::runner::child_env::passes(name),
            "{name} reached the child"
        );
    }
}

fn stall(ms: u64, from_start: bool) -> Option<StallLimit> {
    Some(StallLimit {
        beyond_slowest: Duration::from_millis(ms),
        from_start,
    })
}

#[tokio::test]
async fn a_child_that_stops_reporting_is_hung_at_the_size_after_its_last_row() {
    // Two sizes reported, then silence: the plan says 4096 B comes next.
    let script = r#"echo '{"event":"plan","sizes_bytes":[1024,2048,4096],"slowest_step_s":0.2}'
        echo '{"event":"row","row":{"size_bytes":1024}}'
        echo '{"event":"row","row":{"size_bytes":2048}}'
        exec sleep 30"#;
    let mut spec = sh(script, Some(Duration::from_secs(20)));
    spec.stall = stall(300, false);
    let started = std::time::Instant::now();
    let r = run(spec).await;
    let took = started.elapsed();
    let ChildEnd::Hung(h) = &r.end else {
        panic!("not hung: {:?} {}", r.end, r.stderr_tail)
    };
    assert_eq!(h.stage, "size 4096 B");
    assert_eq!(h.last_size_bytes, Some(2048));
    // The stall limit plus the step's allowance: the sizes so far took next to nothing,
    // so the pace allows far less than the plan's 0.2 s.
    assert!(
        h.limit >= Duration::from_millis(300) && h.limit < Duration::from_millis(400),
        "{:?}",
        h.limit
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
    let up = r.clone().into_upload("k".into());
    assert_eq!(up.outcome, Outcome::Failed);
    assert!(up.reason.as_deref().unwrap().starts_with("hung:"), "{up:?}");
    assert_eq!(up.summary[HUNG_KEY]["stage"], "size 4096 B");
}

#[tokio::test]
async fn silence_before_any_plan_is_a_hang_only_when_watched_from_the_start() {
    let mut spec = sh("exec sleep 30", Some(Duration::from_millis(1500)));
    spec.stall = stall(200, true);
    let r = run(spec).await;
    assert!(
        matches!(&r.end, ChildEnd::Hung(h) if h.stage == "init"),
        "{:?}",
        r.end
    );
    // Not armed: a kind that declares no plan runs to its wall-clock limit.
    let mut spec = sh("exec sleep 30", Some(Duration::from_millis(800)));
    spec.stall = stall(200, false);
    assert!(matches!(run(spec).await.end, ChildEnd::TimedOut(_)));
    // Progress keeps it alive past the limit.
    let script =
        r#"for i in 1 2 3 4 5 6; do echo '{"event":"progress","message":"x"}'; sleep 0.1; done"#;
    let mut spec = sh(script, Some(Duration::from_secs(10)));
    spec.stall = stall(300, true);
    assert_eq!(run(spec).await.end, ChildEnd::Exited(0));
}

#[test]
fn tail_keeps_the_last_bytes() {
    let mut t = Tail::new(8);
    t.push(b"hello ");
    t.push(b"world!");
    assert_eq!(t.text(), "o world!");
    t.push(&[b'x'; 20]);
    assert_eq!(t.text(), "xxxxxxxx");
    let mut u = Tail::new(3);
    u.push("aé".as_bytes()); // 'é' is two bytes: a cut in the middle must not show junk
    u.push("é".as_bytes());
    assert_eq!(u.text(), "é");
}

#[tokio::test]
async fn success_with_events_input_and_env() {
    let script = r#"
        input=$(cat)
        case "$input" in *'"kind":"script"'*) ;; *) echo "bad input: $input" >&2; exit 9;; esac
        echo '{"event":"progress","fraction":0.5,"message":"half"}'
        echo '{"event":"row","row":{"size_bytes":8,"time_us":1.0,"algbw_gbs":0.008}}'
        echo "not an event"
        echo "{\"event\":\"summary\",\"summary\":{\"var\":\"$HEDDLE_TEST_VAR\"}}"
        echo "some log" >&2
    "#;
    let r = run(sh(script, None)).await;
    assert_eq!(r.end, ChildEnd::Exited(0), "{}", r.stderr_tail);
    assert_eq!(r.rows.len(), 1);
    assert_eq!(r.summary["var"], "from-job");
    assert_eq!(r.unparsed_lines, 1);
    assert_eq!(r.stderr_tail, "some log\n");
    let up = r.into_upload("k".into());
    assert_eq!(up.outcome, Outcome::Succeeded);
    assert_eq!(up.exit_code, Some(0));
    assert_eq!(up.summary["unparsed_stdout_lines"], 1);
}

#[tokio::test]
async fn job_env_does_not_leak_into_the_agent() {
    let _ = run(sh("true", None)).await;
    assert!(std::env::var("HEDDLE_TEST_VAR").is_err());
}

#[tokio::test]
async fn failure_reports_status_and_last_stderr_line() {
    let r = run(sh("echo first >&2; echo 'link is down' >&2; exit 3", None)).await;
    let (outcome, reason, code) = r.outcome();
    assert_eq!(outcome, Outcome::Failed);
    assert_eq!(code, Some(3));
    assert_eq!(
        reason.as_deref(),
        Some("exited with status 3: link is down")
    );
}

#[tokio::test]
async fn stderr_tail_is_bounded() {
    let r = run(sh(
        "head -c 100000 /dev/zero | tr '\\0' 'a' >&2; echo END >&2; exit 1",
        None,
    ))
    .await;
    assert_eq!(r.stderr_tail.len(), STDERR_TAIL_BYTES);
    assert!(r.stderr_tail.ends_with("aEND\n"));
}

#[tokio::test]
async fn a_crash_is_a_signal() {
    let r = run(sh("kill -SEGV $$", None)).await;
    assert_eq!(r.end, ChildEnd::Signaled(libc::SIGSEGV));
    assert_eq!(
        r.outcome().1.as_deref(),
        Some("killed by signal 11 (SIGSEGV)")
    );
}

#[tokio::test]
async fn skipped_event_with_success_is_a_skip() {
    let r = run(sh(r#"echo '{"event":"skipped","reason":"no GPU"}'"#, None)).await;
    let (outcome, reason, _) = r.outcome();
    assert_eq!(outcome, Outcome::Skipped);
    assert_eq!(reason.as_deref(), Some("no GPU"));
}

#[tokio::test]
async fn timeout_kills_the_whole_group() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("grandchild.pid");
    // The grandchild keeps stdout open; the supervisor must neither hang nor leave it.
    let script = format!("sleep 30 & echo $! > {}; wait", pidfile.display());
    let start = std::time::Instant::now();
    let r = run(sh(&script, Some(Duration::from_millis(500)))).await;
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(r.end, ChildEnd::TimedOut(Duration::from_millis(500)));
    assert_eq!(r.outcome().1.as_deref(), Some("timed out after 0 s"));
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(is_dead(pid), "grandchild {pid} survived");
}

#[tokio::test]
async fn stop_request_ends_the_child() {
    let (stop_tx, stop_rx) = watch::channel(None);
    let (progress_tx, mut progress_rx) = watch::channel(None);
    let script = r#"echo '{"event":"progress","message":"started"}'; exec sleep 30"#;
    let task = tokio::spawn(supervise(sh(script, None), stop_rx, progress_tx));
    progress_rx.changed().await.unwrap();
    assert_eq!(
        progress_rx.borrow().as_ref().map(|p| p.message.clone()),
        Some("started".into())
    );
    stop_tx.send(Some(StopReason::Cancelled)).unwrap();
    let r = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.end, ChildEnd::Stopped(StopReason::Cancelled));
    assert_eq!(r.outcome().0, Outcome::Cancelled);
}

#[tokio::test]
async fn missing_program_is_a_spawn_failure() {
    let mut spec = sh("true", None);
    spec.program = "/nonexistent/heddle-agent".into();
    let r = run(spec).await;
    assert!(matches!(r.end, ChildEnd::SpawnFailed(_)));
    assert_eq!(r.outcome().0, Outcome::Failed);
}

/// Gone, or a zombie waiting for a reaper (the container's init may never reap it).
fn is_dead(pid: i32) -> bool {
    for _ in 0..50 {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => return true,
            Ok(stat) => {
                let state = stat
                    .rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .chars()
                    .next();
                if state == Some('Z') || state == Some('X') {
                    return true;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[tokio::test]
async fn each_child_gets_a_private_directory_removed_after() {
    // Before, a test ran in the agent's working directory with the agent's HOME, so a
    // `ucx.conf` planted there (or in HOME) set what the env policy refuses by name, and
    // NCCL's debug log and UCX's profile were written in a shared place.
    let out = tempfile::tempdir().unwrap();
    let report = out.path().join("where");
    let script = format!(
        "echo \"$PWD $HOME $TMPDIR $(stat -c %a .) $(ls -A | wc -l)\" > {r}; touch left-behind",
        r = report.display()
    );
    let r = run(sh(&script, None)).await;
    assert_eq!(r.end, ChildEnd::Exited(0), "{}", r.stderr_tail);
    let line = std::fs::read_to_string(&report).unwrap();
    let words: Vec<&str> = line.split_whitespace().collect();
    let [pwd, home, tmp, mode, entries] = words[..] else {
        panic!("{line}")
    };
    assert_eq!(pwd, home, "{line}");
    assert_eq!(pwd, tmp, "{line}");
    assert_eq!(mode, "700", "{line}");
    assert_eq!(entries, "0", "the directory starts empty: {line}");
    assert_ne!(
        std::path::Path::new(pwd),
        std::env::current_dir().unwrap(),
        "{line}"
    );
    assert!(
        !std::path::Path::new(pwd).exists(),
        "{pwd} was not removed after the test"
    );
    // A second child gets another one.
    let r = run(sh(&script, None)).await;
    assert_eq!(r.end, ChildEnd::Exited(0));
    let again = std::fs::read_to_string(&report).unwrap();
    assert_ne!(again.split_whitespace().next(), Some(pwd));
}
