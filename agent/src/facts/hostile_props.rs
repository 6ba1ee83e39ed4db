//! Property tests of what the facts are read from: sysfs and procfs files, the kernel
//! log's records, NCCL config files, tools' version lines, and whole fixture trees with
//! some files rewritten. A broken node (or a container that fakes one) writes any of
//! these; the collector must answer with facts and per-field errors, never a panic, in
//! bounded time and size. Strategies and bounds: `crate::prop_kit`.

use std::path::{Path, PathBuf};

use proptest::prelude::*;

use super::conditions::{parse_nccl_conf, parse_xid_record};
use super::pci::{parse_hex_u16, parse_hex_u32};
use super::rdma::parse_gid;
use super::software::{parse_ofed, parse_ucx_version};
use crate::facts::cpulist::{MAX_CPUS, parse_cpulist};
use crate::prop_kit::{any_bytes, bounded, config, lines_of, mutated, seeds, text, timed};

const CONF_WORDS: &[&str] = &["NCCL_IB_HCA", "=", "==", "#", " ", "\t", "mlx5_0:1", "\r"];
const KMSG_WORDS: &[&str] = &[
    "4,1093,63291739215,-;",
    "NVRM: Xid (",
    "PCI:0000:07:00",
    "): ",
    "79",
    ",",
    ";",
    " SUBSYSTEM=pci",
];

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn cpulists(bytes in prop_oneof![any_bytes(), lines_of(&["0", "-", ",", "65535", "4294967295", " "]), mutated(seeds(&[], "cpulist"))]) {
        let t = text(&bytes);
        if let Ok(cpus) = timed(&bytes, || parse_cpulist(&t))? {
            prop_assert!(cpus.len() <= MAX_CPUS);
            // What the kernel would write for the same set reads back the same.
            let written: Vec<String> = cpus.iter().map(usize::to_string).collect();
            prop_assert_eq!(parse_cpulist(&written.join(",")).unwrap(), cpus);
        }
    }

    #[test]
    fn nccl_conf_files(bytes in prop_oneof![any_bytes(), lines_of(CONF_WORDS)]) {
        let t = text(&bytes);
        let vars = timed(&bytes, || parse_nccl_conf(&t))?;
        bounded(&bytes, &vars, 8)?;
        for (k, v) in &vars {
            prop_assert!(!k.is_empty() && k.trim() == k && v.trim() == v);
        }
        // Written back one per line, it reads the same.
        let written: String = vars.iter().filter(|(k, _)| !k.starts_with('#') && !k.contains('=')).map(|(k, v)| format!("{k}={v}\n")).collect();
        let again = parse_nccl_conf(&written);
        prop_assert!(again.iter().all(|(k, v)| vars.get(k) == Some(v)));
    }

    #[test]
    fn kernel_log_records(bytes in prop_oneof![any_bytes(), lines_of(KMSG_WORDS), mutated(seeds(&[], "kmsg"))]) {
        let t = text(&bytes);
        let events: Vec<_> = timed(&bytes, || t.lines().filter_map(parse_xid_record).collect())?;
        bounded(&bytes, &events, 8)?;
    }

    #[test]
    fn version_lines(bytes in prop_oneof![any_bytes(), mutated(seeds(&["ucx_info_v.txt"], "ucx"))]) {
        let t = text(&bytes);
        let v = timed(&bytes, || parse_ucx_version(&t))?;
        prop_assert!(v.is_none_or(|v| v.len() <= t.len()));
        prop_assert!(parse_ofed(&t).is_none_or(|v| v.len() <= t.len()));
    }

    #[test]
    fn sysfs_numbers(s in "\\PC{0,40}", n in any::<u32>(), gid in any::<[u16; 8]>()) {
        let _ = (parse_hex_u32(&s), parse_hex_u16(&s), parse_gid(&s));
        // sysfs's own spellings read back as written.
        prop_assert_eq!(parse_hex_u32(&format!("0x{n:08x}\n")), Some(n));
        prop_assert_eq!(parse_hex_u16(&format!("0x{:04x}", n as u16)), Some(n as u16));
        let written: Vec<String> = gid.iter().map(|g| format!("{g:04x}")).collect();
        let bytes = parse_gid(&written.join(":")).unwrap();
        let back: Vec<u16> = bytes.chunks(2).map(|c| u16::from_be_bytes([c[0], c[1]])).collect();
        prop_assert_eq!(back, gid.to_vec());
    }
}

/// Regular files of a tree, relative to it, in a stable order.
fn files(dir: &Path, under: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let ty = e.file_type().unwrap();
        if ty.is_dir() {
            files(&e.path(), under, out);
        } else if ty.is_file() {
            out.push(e.path().strip_prefix(under).unwrap().to_path_buf());
        }
    }
}

/// A fixture tree with up to four of its files rewritten (mutated, or replaced by
/// arbitrary bytes) gives facts, their errors saying what could not be read, within the
/// time bound and at most a bounded size over the real tree's facts.
#[test]
fn mutated_fixture_trees_give_facts() {
    for fixture in ["bare-metal-ib12", "runai-roce-pod", "garbage"] {
        let src = crate::prop_kit::agent_dir()
            .join("tests/fixtures")
            .join(fixture);
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let cp = std::process::Command::new("cp")
            .arg("-a")
            .arg(&src)
            .arg(&root)
            .status()
            .unwrap();
        assert!(cp.success());
        let mut all = Vec::new();
        files(&root, &root, &mut all);
        let opts = super::CollectOptions::for_root(&root);
        let real = serde_json::to_vec(&super::collect(&opts)).unwrap().len();
        let originals: Vec<Vec<u8>> = all
            .iter()
            .map(|f| std::fs::read(root.join(f)).unwrap())
            .collect();
        let seeds = originals.clone();
        let strategy = proptest::collection::vec(
            (0..all.len(), prop_oneof![mutated(seeds), any_bytes()]),
            1..4,
        );
        let mut runner = proptest::test_runner::TestRunner::new(config(24));
        runner
            .run(&strategy, |edits| {
                let mut written = 0;
                for (i, bytes) in &edits {
                    std::fs::write(root.join(&all[*i]), bytes).unwrap();
                    written += bytes.len();
                }
                let facts = timed(&[], || super::collect(&opts));
                for (i, _) in &edits {
                    std::fs::write(root.join(&all[*i]), &originals[*i]).unwrap();
                }
                let facts = facts?;
                let size = serde_json::to_vec(&facts).unwrap().len();
                prop_assert!(
                    size <= 2 * real + 64 * written + 4096,
                    "{fixture}: {size} bytes of facts, {real} from the real tree, {written} written"
                );
                super::facts_sha256(&facts);
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{fixture}: {e}"));
    }
}

/// A file past [`super::sysfs::MAX_READ`] (a fake `/proc` file, a config file grown
/// without bound) is refused and recorded, never read whole.
#[test]
fn oversized_files_are_refused_not_read() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("etc")).unwrap();
    std::fs::create_dir_all(dir.path().join("proc")).unwrap();
    let big = vec![b'x'; super::sysfs::MAX_READ as usize + 1];
    std::fs::write(dir.path().join("etc/hostname"), &big).unwrap();
    std::fs::write(dir.path().join("etc/nccl.conf"), &big).unwrap();
    std::fs::write(dir.path().join("proc/cmdline"), "ro quiet\n").unwrap();
    let root = super::sysfs::Root::new(dir.path());
    let err = root.read("etc/hostname").unwrap_err().to_string();
    assert!(err.contains("larger than"), "{err}");
    assert_eq!(root.read("proc/cmdline").unwrap(), "ro quiet");
    let facts = super::collect(&super::CollectOptions::for_root(dir.path()));
    let errors = serde_json::to_string(&facts.errors).unwrap();
    assert!(errors.contains("larger than"), "{errors}");
    assert!(serde_json::to_vec(&facts).unwrap().len() < 1 << 16);
}
