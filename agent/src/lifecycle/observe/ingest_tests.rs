//! Hostile spool files: each is refused with its reason, and nothing else happens (no
//! other file is read, nothing is ingested, the scan goes on).

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use heddle_types::observe::{CommObservation, JobIdentity, OpBand, SPOOL_FORMAT};

use super::*;

fn my_uid() -> u32 {
    // SAFETY: no preconditions.
    unsafe { libc::geteuid() }
}

pub(crate) fn sample(uid: u32, pid: u32, seq: u64) -> SpoolFile {
    SpoolFile {
        format: SPOOL_FORMAT,
        job: JobIdentity {
            pid,
            uid,
            start_ticks: 5000 + u64::from(pid),
            slurm_job_id: Some("77".into()),
            slurm_step_id: None,
            k8s_namespace: None,
            k8s_pod: None,
            torchrun_run_id: None,
            comm: Some("python3".into()),
        },
        seq,
        is_final: false,
        written_at: chrono::Utc::now(),
        plugin_version: "0.1.0".into(),
        nccl_version: None,
        env_applied: None,
        comms: vec![CommObservation {
            comm_hash: "ab12".into(),
            name: None,
            nranks: 2,
            nnodes: 1,
            rank: 0,
            ops: vec![OpBand {
                func: "AllReduce".into(),
                size_band: 28,
                ops: 10,
                bytes: 10 << 28,
                time_ns: 50_000_000,
                algos: Default::default(),
                protos: Default::default(),
                max_channels: 8,
                exec_ops: 0,
                exec_bytes: 0,
                exec_ns: 0,
            }],
            net: vec![],
            proxy_ops: 0,
            dropped_events: 0,
            finalized_at: None,
            progress: None,
        }],
        dropped_events: 0,
        dropped_comms: 0,
    }
}

fn spool() -> (tempfile::TempDir, JobSpool) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("jobs");
    let s = JobSpool::open(&dir).unwrap();
    (tmp, s)
}

fn write(s: &JobSpool, name: &str, f: &SpoolFile) {
    std::fs::write(s.path().join(name), serde_json::to_vec(f).unwrap()).unwrap();
}

fn only_refusal(r: &ScanReport) -> &Refusal {
    assert!(r.ingested.is_empty(), "{:?}", r.ingested);
    assert_eq!(r.refused.len(), 1, "{:?}", r.refused);
    &r.refused[0].1
}

#[test]
fn creates_a_sticky_directory_and_refuses_an_unsafe_one() {
    let (tmp, s) = spool();
    let meta = std::fs::metadata(s.path()).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o1733);
    assert_eq!(meta.uid(), my_uid());

    // The agent's own empty directory is made sticky; one with files in it is refused.
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    std::fs::set_permissions(&empty, std::fs::Permissions::from_mode(0o755)).unwrap();
    JobSpool::open(&empty).unwrap();
    assert_eq!(std::fs::metadata(&empty).unwrap().mode() & 0o7777, 0o1733);
    let plain = tmp.path().join("plain");
    std::fs::create_dir(&plain).unwrap();
    std::fs::write(plain.join("x"), b"").unwrap();
    std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o777)).unwrap();
    let err = JobSpool::open(&plain).err().unwrap().to_string();
    assert!(
        err.contains("without the sticky bit") && err.contains("1733"),
        "{err}"
    );

    let link = tmp.path().join("link");
    std::os::unix::fs::symlink(s.path(), &link).unwrap();
    let err = JobSpool::open(&link).err().unwrap().to_string();
    assert!(err.contains("symbolic link"), "{err}");

    let file = tmp.path().join("file");
    std::fs::write(&file, b"").unwrap();
    let err = JobSpool::open(&file).err().unwrap().to_string();
    assert!(err.contains("not a directory"), "{err}");
}

#[test]
fn a_good_file_is_read_once_until_it_changes() {
    let (_t, mut s) = spool();
    write(&s, "a.json", &sample(my_uid(), 1, 1));
    let r = s.scan(SystemTime::now());
    assert_eq!(r.ingested.len(), 1);
    assert_eq!(r.ingested[0].file.seq, 1);
    assert!(s.scan(SystemTime::now()).ingested.is_empty());
    // A rewrite (temp + rename, as the plugin does) is a new inode.
    let tmp = s.path().join(".a.json.tmp");
    std::fs::write(&tmp, serde_json::to_vec(&sample(my_uid(), 1, 2)).unwrap()).unwrap();
    std::fs::rename(&tmp, s.path().join("a.json")).unwrap();
    let r = s.scan(SystemTime::now());
    assert_eq!(r.ingested[0].file.seq, 2);
}

#[test]
fn symlink_to_a_secret_is_refused_without_reading_it() {
    let (t, mut s) = spool();
    let secret = t.path().join("secret.json");
    // Would parse as a spool file: the refusal must come from the link, not the content.
    std::fs::write(
        &secret,
        serde_json::to_vec(&sample(my_uid(), 1, 1)).unwrap(),
    )
    .unwrap();
    std::os::unix::fs::symlink(&secret, s.path().join("evil.json")).unwrap();
    let r = s.scan(SystemTime::now());
    assert_eq!(only_refusal(&r), &Refusal::Symlink);
    assert!(!s.path().join("evil.json").exists());
    assert!(secret.exists(), "the link's target is never touched");
    assert_eq!(s.refusals.get("symlink"), Some(&1));
}

#[test]
fn huge_file_is_refused_before_reading() {
    let (_t, mut s) = spool();
    let f = std::fs::File::create(s.path().join("huge.json")).unwrap();
    f.set_len(64 << 30).unwrap(); // sparse: 64 GiB that would never fit in memory
    let r = s.scan(SystemTime::now());
    assert_eq!(only_refusal(&r), &Refusal::TooLarge(64 << 30));
}

#[test]
fn truncated_file_is_refused() {
    let (_t, mut s) = spool();
    let bytes = serde_json::to_vec(&sample(my_uid(), 1, 1)).unwrap();
    std::fs::write(s.path().join("cut.json"), &bytes[..bytes.len() / 2]).unwrap();
    let r = s.scan(SystemTime::now());
    let Refusal::Content(why) = only_refusal(&r) else {
        panic!("{:?}", r.refused)
    };
    assert!(why.contains("not a spool file"), "{why}");
}

#[test]
fn a_file_claiming_another_uid_is_refused() {
    let (_t, mut s) = spool();
    // Owned by this process's uid, claiming to be another user's job.
    let other = my_uid().wrapping_add(1);
    write(&s, "forged.json", &sample(other, 1, 1));
    let r = s.scan(SystemTime::now());
    assert_eq!(
        only_refusal(&r),
        &Refusal::Owner {
            file_uid: my_uid(),
            job_uid: other
        }
    );
    assert!(check_owner(0, 0).is_ok());
    assert!(check_owner(1000, 0).is_err());
}

#[test]
fn fifo_is_refused_without_blocking() {
    let (_t, mut s) = spool();
    let c = CString::new(s.path().join("pipe.json").as_os_str().as_bytes()).unwrap();
    // SAFETY: valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
    let r = s.scan(SystemTime::now());
    assert_eq!(only_refusal(&r), &Refusal::NotRegular("FIFO"));
}

#[test]
fn directory_is_refused_once_and_left() {
    let (_t, mut s) = spool();
    std::fs::create_dir(s.path().join("dir.json")).unwrap();
    let r = s.scan(SystemTime::now());
    assert_eq!(only_refusal(&r), &Refusal::NotRegular("directory"));
    assert!(s.path().join("dir.json").is_dir());
    // Logged once: an unchanged directory is not looked at again.
    assert!(s.scan(SystemTime::now()).refused.is_empty());
    assert_eq!(s.refusals.get("not_regular"), Some(&1));
}

#[test]
fn hard_link_is_refused() {
    let (t, mut s) = spool();
    let outside = t.path().join("outside");
    std::fs::write(
        &outside,
        serde_json::to_vec(&sample(my_uid(), 1, 1)).unwrap(),
    )
    .unwrap();
    std::fs::hard_link(&outside, s.path().join("linked.json")).unwrap();
    let r = s.scan(SystemTime::now());
    assert_eq!(only_refusal(&r), &Refusal::HardLinked(2));
    assert!(outside.exists());
}

#[test]
fn a_flood_of_small_files_is_read_a_bounded_slice_per_scan() {
    let (_t, mut s) = spool();
    let n = MAX_FILES_PER_UID * 3;
    for i in 0..n {
        std::fs::write(s.path().join(format!("junk-{i}.json")), b"{}").unwrap();
    }
    write(&s, "good.json", &sample(my_uid(), 9, 1));
    let mut refused = 0;
    let mut scans = 0;
    let mut good = 0;
    while refused + good < n + 1 {
        let r = s.scan(SystemTime::now());
        // One owner: at most MAX_FILES_PER_UID reads per scan, the rest deferred.
        assert!(r.refused.len() + r.ingested.len() <= MAX_FILES_PER_UID);
        refused += r.refused.len();
        good += r.ingested.len();
        scans += 1;
        assert!(scans <= 4, "the flood must drain");
    }
    assert_eq!((refused, good), (n, 1));
    // Refused files are removed: the flood does not stay.
    let left: Vec<_> = std::fs::read_dir(s.path()).unwrap().collect();
    assert_eq!(left.len(), 1);
    assert_eq!(s.refusals.get("content"), Some(&(n as u64)));
}

#[test]
fn temporary_and_foreign_names_are_not_read() {
    let (_t, mut s) = spool();
    std::fs::write(s.path().join(".x.json"), b"garbage").unwrap();
    std::fs::write(s.path().join("notes.txt"), b"garbage").unwrap();
    let r = s.scan(SystemTime::now());
    assert!(r.ingested.is_empty() && r.refused.is_empty());
}

#[test]
fn stale_files_are_flagged_and_removed_once_read() {
    let (_t, mut s) = spool();
    write(&s, "old.json", &sample(my_uid(), 1, 1));
    let later = SystemTime::now() + STALE_AFTER + Duration::from_secs(5);
    let r = s.scan(later);
    assert!(r.ingested[0].stale);
    assert!(
        s.path().join("old.json").exists(),
        "kept until its content is safe"
    );
    s.scan(later);
    assert!(!s.path().join("old.json").exists());
}
