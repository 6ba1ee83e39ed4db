//! The spool under SIGKILL: a writer process is killed at random moments while it spools
//! results; after each kill the spool must open cleanly, hold every entry whose write had
//! returned, in order, and nothing half-written.
//!
//! This binary is its own writer: with `HEDDLE_SPOOL_WRITER_DIR` set it writes entries
//! forever, printing each entry's number once `Spool::write` has returned.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use chrono::Utc;
use heddle_agent::spool::{Spool, SpoolEntry};
use heddle_types::jobs::{Outcome, ResultRow, ResultUpload};
use rand::Rng;
use uuid::Uuid;

const ROUNDS: usize = 20;

fn entry(n: u64) -> SpoolEntry {
    let now = Utc::now();
    // Enough rows that a write takes a while and a kill can land inside it.
    let rows = (0..200)
        .map(|i| ResultRow {
            size_bytes: 1 << (i % 30),
            count: None,
            dtype: None,
            op: Some("memcpy".into()),
            root: None,
            in_place: None,
            time_us: Some(i as f64),
            algbw_gbs: Some(1.0),
            busbw_gbs: None,
            wrong: Some(0),
            labels: Default::default(),
            extra: serde_json::json!({}),
        })
        .collect();
    SpoolEntry {
        job_id: Uuid::new_v4(),
        run_id: Uuid::new_v4(),
        spooled_at: now,
        upload: ResultUpload {
            upload_key: Uuid::new_v4().to_string(),
            outcome: Outcome::Succeeded,
            reason: None,
            exit_code: Some(0),
            stderr_tail: None,
            summary: serde_json::json!({ "n": n }),
            rows,
            started_at: now,
            finished_at: now,
            claim_id: None,
        },
    }
}

fn writer(dir: &str, start: u64) -> ! {
    let spool = Spool::open(dir).expect("opening the spool");
    let mut out = std::io::stdout().lock();
    for n in start.. {
        spool.write(&entry(n)).expect("spool write");
        writeln!(out, "{n}").unwrap();
        out.flush().unwrap();
    }
    unreachable!()
}

fn main() {
    if let Ok(dir) = std::env::var("HEDDLE_SPOOL_WRITER_DIR") {
        let start = std::env::var("HEDDLE_SPOOL_WRITER_START")
            .unwrap()
            .parse()
            .unwrap();
        writer(&dir, start);
    }
    // Under `cargo test` the harness flags (e.g. `--nocapture`) are passed; ignore them,
    // but honour a filter that names another test.
    if std::env::args()
        .skip(1)
        .any(|a| !a.starts_with('-') && !"spool_crash".contains(&a))
    {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("spool");
    let mut rng = rand::rng();
    let mut acknowledged: Vec<u64> = Vec::new();
    let mut next = 0u64;
    for round in 0..ROUNDS {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .env("HEDDLE_SPOOL_WRITER_DIR", &dir)
            .env("HEDDLE_SPOOL_WRITER_START", next.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(rng.random_range(5..80)));
        child.kill().unwrap();
        child.wait().unwrap();
        let mut text = String::new();
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        acknowledged.extend(text.lines().map(|l| l.parse::<u64>().unwrap()));

        let spool = Spool::open(&dir).expect("spool opens after a crash");
        let leftovers: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(".tmp-"))
            .collect();
        assert!(
            leftovers.is_empty(),
            "round {round}: temp files survive open"
        );
        let stored: Vec<u64> = spool
            .list()
            .unwrap()
            .iter()
            .map(|id| {
                let e = spool
                    .read(id)
                    .unwrap_or_else(|err| panic!("round {round}: {err}"));
                e.upload.summary["n"].as_u64().unwrap()
            })
            .collect();
        // In write order, every acknowledged write present, at most one more per round
        // (written, killed before it could say so).
        assert!(
            stored.windows(2).all(|w| w[0] < w[1]),
            "round {round}: order {stored:?}"
        );
        for n in &acknowledged {
            assert!(
                stored.contains(n),
                "round {round}: acknowledged entry {n} lost"
            );
        }
        assert!(stored.len() <= acknowledged.len() + round + 1);
        next = stored.last().map_or(next, |n| n + 1).max(next);
        acknowledged = stored;
    }
    assert!(
        !acknowledged.is_empty(),
        "no write completed in {ROUNDS} rounds"
    );
    println!(
        "spool_crash: {ROUNDS} kills, {} entries intact, order kept",
        acknowledged.len()
    );
}
