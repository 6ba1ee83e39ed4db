use super::*;

fn dgx1() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/dgx1")
}

#[test]
fn a_written_map_reads_back_for_its_own_root_only() {
    let map = GpuMap::compute(&dgx1()).unwrap();
    assert!(map.failed_plugins.is_empty(), "{:?}", map.failed_plugins);
    assert_eq!(map.gpus.len(), 8);
    assert_eq!(map.affinity(5).unwrap().nic.as_deref(), Some("mlx5_2"));
    let dir = tempfile::tempdir().unwrap();
    map.write(dir.path()).unwrap();
    let path = beside(&dir.path().join("nccl.env"));
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o644);
    assert_eq!(GpuMap::read(&path, &dgx1()).unwrap(), map);
    let err = GpuMap::read(&path, Path::new("/srv/other-tree")).unwrap_err();
    assert!(matches!(err, GpuMapError::OtherRoot { .. }), "{err}");
    assert!(err.to_string().contains("computed for facts root"), "{err}");
    // The live node takes the map from whatever root the agent reads it through (`/host`
    // for an agent in a container).
    assert_eq!(GpuMap::read(&path, Path::new("/")).unwrap(), map);
}

#[test]
fn hostile_map_files_are_refused_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let root = dgx1();
    let good = serde_json::to_value(GpuMap::compute(&root).unwrap()).unwrap();
    let refused = |name: &str, bytes: &[u8]| -> String {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        GpuMap::read(&p, &root).unwrap_err().to_string()
    };
    let with = |key: &str, value: serde_json::Value| {
        let mut v = good.clone();
        v[key] = value;
        serde_json::to_vec(&v).unwrap()
    };
    assert!(refused("big", &vec![b' '; MAX_FILE_LEN + 1]).contains("larger than"));
    assert!(refused("garbage", b"\x00\xff{").contains("is not a GPU map"));
    assert!(refused("schema", &with("schema", 2.into())).contains("schema 2"));
    assert!(refused("extra", &with("LD_PRELOAD", "/tmp/x.so".into())).contains("unknown field"));
    let many: Vec<_> = (0..=MAX_ENTRIES)
        .map(|i| serde_json::json!([i, null]))
        .collect();
    assert!(refused("many", &with("gpus", many.into())).contains("more than"));
    // Not a regular file: a directory, and a FIFO nobody writes (which must not block).
    let err = GpuMap::read(dir.path(), &root).unwrap_err().to_string();
    assert!(err.contains("not a regular file"), "{err}");
    let fifo = dir.path().join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let err = GpuMap::read(&fifo, &root).unwrap_err().to_string();
    assert!(err.contains("not a regular file"), "{err}");
    assert!(GpuMap::read(&dir.path().join("absent"), &root).is_err());
}
