use std::os::unix::fs::PermissionsExt;

use super::*;

fn entry(n: &str, v: &str) -> Entry {
    Entry {
        name: n.into(),
        value: v.into(),
    }
}

fn lines(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap()
}

#[test]
fn the_admins_lines_stay_byte_for_byte_and_the_block_goes_last_for_nccl() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nccl.conf");
    // No newline at the end, a comment and a CRLF line NCCL would read oddly: all theirs.
    std::fs::write(&path, "# site\nNCCL_DEBUG=WARN\r\nNCCL_SOCKET_IFNAME=ib0").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
    let body = lines(&["NCCL_ENV_PLUGIN=/opt/heddle/libnccl-env-heddle.so"]);
    assert_eq!(
        apply_block(&path, Placement::Bottom, &body).unwrap(),
        Change::Written
    );
    assert_eq!(
        read(&path),
        format!(
            "# site\nNCCL_DEBUG=WARN\r\nNCCL_SOCKET_IFNAME=ib0\n{BEGIN}\n\
             NCCL_ENV_PLUGIN=/opt/heddle/libnccl-env-heddle.so\n{END}\n"
        )
    );
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o640, "the file keeps its mode");
    // Again: nothing changes, not even the inode.
    let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&path).unwrap());
    assert_eq!(
        apply_block(&path, Placement::Bottom, &body).unwrap(),
        Change::Unchanged
    );
    let ino2 = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&path).unwrap());
    assert_eq!(ino, ino2);
    // A new value replaces the block in place of the old one.
    let body2 = lines(&["NCCL_ENV_PLUGIN=/x.so", "NCCL_IB_HCA==mlx5_0"]);
    apply_block(&path, Placement::Bottom, &body2).unwrap();
    assert_eq!(
        read(&path),
        format!(
            "# site\nNCCL_DEBUG=WARN\r\nNCCL_SOCKET_IFNAME=ib0\n{BEGIN}\n\
             NCCL_ENV_PLUGIN=/x.so\nNCCL_IB_HCA==mlx5_0\n{END}\n"
        )
    );
    // Nothing to write: the block and its markers go, the admin's lines stay.
    assert_eq!(
        apply_block(&path, Placement::Bottom, &[]).unwrap(),
        Change::Removed
    );
    assert_eq!(
        read(&path),
        "# site\nNCCL_DEBUG=WARN\r\nNCCL_SOCKET_IFNAME=ib0\n"
    );
    assert_eq!(
        apply_block(&path, Placement::Bottom, &[]).unwrap(),
        Change::Unchanged
    );
}

#[test]
fn ucx_blocks_go_before_any_section() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ucx.conf");
    let theirs = "[Grace Hopper]\nCPU model=Grace\nUCX_REG_NONBLOCK_MEM_TYPES=host\n";
    std::fs::write(&path, theirs).unwrap();
    apply_block(&path, Placement::Top, &lines(&["UCX_TLS=rc,cuda_copy"])).unwrap();
    assert_eq!(
        read(&path),
        format!("{BEGIN}\nUCX_TLS=rc,cuda_copy\n{END}\n{theirs}")
    );
    apply_block(&path, Placement::Top, &[]).unwrap();
    assert_eq!(read(&path), theirs);
}

#[test]
fn a_missing_file_is_created_only_with_something_to_write() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("etc/ucx/ucx.conf");
    assert_eq!(
        apply_block(&path, Placement::Top, &[]).unwrap(),
        Change::Unchanged
    );
    assert!(!path.exists() && !path.parent().unwrap().exists());
    apply_block(&path, Placement::Top, &lines(&["UCX_TLS=tcp"])).unwrap();
    assert_eq!(read(&path), format!("{BEGIN}\nUCX_TLS=tcp\n{END}\n"));
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o644, "readable by every job");
    // No temporary file is left behind.
    let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["ucx.conf"]);
}

#[test]
fn a_symlink_is_refused_and_its_target_untouched() {
    // The attack: someone who can write the directory points the conf at a file root owns,
    // hoping the agent rewrites it.
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("shadow");
    std::fs::write(&target, "root:secret\n").unwrap();
    let link = dir.path().join("nccl.conf");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let err =
        apply_block(&link, Placement::Bottom, &lines(&["NCCL_ENV_PLUGIN=/x.so"])).unwrap_err();
    assert!(matches!(err, HostConfError::Symlink(_)), "{err}");
    assert!(err.to_string().contains("symbolic link"));
    assert_eq!(read(&target), "root:secret\n");
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
}

#[test]
fn broken_markers_and_odd_files_are_errors_that_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nccl.conf");
    for text in [
        format!("A=1\n{BEGIN}\nNCCL_X=1\n"),
        format!("{BEGIN}\n{END}\n{BEGIN}\n{END}\n"),
        format!("{END}\n"),
    ] {
        std::fs::write(&path, &text).unwrap();
        let err = apply_block(&path, Placement::Bottom, &lines(&["NCCL_X=2"])).unwrap_err();
        assert!(matches!(err, HostConfError::Markers { .. }), "{err}");
        assert_eq!(read(&path), text);
    }
    std::fs::write(&path, b"\xff\xfe").unwrap();
    assert!(matches!(
        apply_block(&path, Placement::Bottom, &[]),
        Err(HostConfError::NotUtf8(_))
    ));
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    assert!(matches!(
        apply_block(&sub, Placement::Bottom, &[]),
        Err(HostConfError::NotRegular(_))
    ));
    std::fs::write(&path, vec![b'#'; MAX_FILE_LEN + 1]).unwrap();
    assert!(matches!(
        apply_block(&path, Placement::Bottom, &[]),
        Err(HostConfError::TooLarge { .. })
    ));
}

#[test]
fn nccl_block_has_the_plugin_and_optionally_the_nccl_values() {
    let f = Path::new("/etc/nccl.conf");
    let entries = [
        entry("NCCL_IB_HCA", "=mlx5_0,mlx5_1"),
        entry("UCX_TLS", "rc"),
        entry("NCCL_NET_PLUGIN", "/tmp/evil.so"),
    ];
    let plugin = Path::new("/var/lib/heddle-agent/job/libnccl-env-heddle.so");
    let (l, s) = nccl_block(f, Some(plugin), false, &entries);
    assert_eq!(
        l,
        ["NCCL_ENV_PLUGIN=/var/lib/heddle-agent/job/libnccl-env-heddle.so"]
    );
    assert!(s.is_empty());
    let (l, s) = nccl_block(f, Some(plugin), true, &entries);
    assert_eq!(l.len(), 2);
    assert_eq!(l[1], "NCCL_IB_HCA==mlx5_0,mlx5_1");
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].name, "NCCL_NET_PLUGIN");
    let (l, s) = nccl_block(f, Some(Path::new("relative.so")), false, &entries);
    assert!(l.is_empty());
    assert_eq!(s[0].why, "the path is not absolute");
    assert!(nccl_block(f, None, false, &entries).0.is_empty());
}

#[test]
fn ucx_block_keeps_only_what_ucx_reads_back_whole() {
    let f = Path::new("/etc/ucx/ucx.conf");
    let entries = [
        entry("UCX_NET_DEVICES", "mlx5_0:1,mlx5_1:1"),
        entry("NCCL_IB_HCA", "mlx5"),
        entry("UCX_TLS", "rc ;tcp"),
        entry("UCX_IB_GID_INDEX", " 3"),
        entry("UCX_RNDV_THRESH", ""),
        entry("UCX_MAX_EAGER_LANES", &"9".repeat(UCX_MAX_LINE)),
        entry("UCX_LOG_FILE", "/tmp/x"),
        entry("UCX_RNDV_SCHEME", "get_zcopy;x"),
    ];
    let (l, s) = ucx_block(f, &entries);
    assert_eq!(
        l,
        [
            "UCX_NET_DEVICES=mlx5_0:1,mlx5_1:1",
            "UCX_RNDV_SCHEME=get_zcopy;x"
        ]
    );
    let names: Vec<_> = s.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "UCX_TLS",
            "UCX_IB_GID_INDEX",
            "UCX_RNDV_THRESH",
            "UCX_MAX_EAGER_LANES",
            "UCX_LOG_FILE"
        ]
    );
    // The longest line UCX reads whole is accepted.
    let v = "x".repeat(UCX_MAX_LINE - "UCX_TLS=".len());
    assert!(check_ucx_value("UCX_TLS", &v).is_ok());
    assert!(check_ucx_value("UCX_TLS", &format!("{v}x")).is_err());
}

#[test]
fn sync_updates_each_file_on_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("nccl.conf");
    std::os::unix::fs::symlink("/dev/null", &link).unwrap();
    let cfg = HostConfConfig {
        manage_nccl_conf: true,
        nccl_conf: link.clone(),
        nccl_env_plugin: Some("/opt/libnccl-env-heddle.so".into()),
        nccl_conf_values: false,
        manage_ucx_conf: true,
        ucx_conf: dir.path().join("ucx.conf"),
    };
    let report = sync_host_confs(&cfg, &[entry("UCX_TLS", "rc,sm")]);
    assert!(matches!(
        report.first_error(),
        Some(HostConfError::Symlink(_))
    ));
    assert!(matches!(report.files[1].1, Ok(Change::Written)));
    assert_eq!(
        read(&cfg.ucx_conf),
        format!("{BEGIN}\nUCX_TLS=rc,sm\n{END}\n")
    );
    let off = HostConfConfig {
        manage_nccl_conf: false,
        manage_ucx_conf: false,
        ..cfg
    };
    assert!(sync_host_confs(&off, &[]).files.is_empty());
}

#[test]
fn the_replacement_keeps_the_files_owner() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: only root can give a file another owner");
        return;
    }
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ucx.conf");
    std::fs::write(&path, "UCX_TLS=tcp\n").unwrap();
    std::os::unix::fs::chown(&path, Some(4321), Some(4322)).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o664)).unwrap();
    apply_block(&path, Placement::Top, &lines(&["UCX_RNDV_THRESH=8192"])).unwrap();
    let m = std::fs::metadata(&path).unwrap();
    assert_eq!((m.uid(), m.gid(), m.mode() & 0o777), (4321, 4322, 0o664));
}
