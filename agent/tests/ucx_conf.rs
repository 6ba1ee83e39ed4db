//! The managed UCX block as the real UCX reads it: `ucx_info -c` (Debian's ucx-utils, UCX
//! 1.13.1 here) with `UCX_CONFIG_DIR` pointing at a directory holding the file the agent
//! manages. UCX reads `$UCX_CONFIG_DIR/ucx.conf` after its system file, so this is the same
//! reader and parser as for `/etc/ucx/ucx.conf`, without touching the machine's.

use std::path::Path;
use std::process::Command;

use heddle_agent::host_conf::{self, BEGIN, Change, END, HostConfConfig, UCX_MAX_LINE};
use heddle_types::nccl_conf::Entry;

fn entry(n: &str, v: &str) -> Entry {
    Entry {
        name: n.into(),
        value: v.into(),
    }
}

/// `ucx_info -c` in a clean environment (no `~/ucx.conf`, no `./ucx.conf`), as NAME → value.
fn ucx_config(dir: &Path, extra_env: &[(&str, &str)]) -> Option<Vec<(String, String)>> {
    let out = Command::new("ucx_info")
        .arg("-c")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", dir)
        .env("UCX_CONFIG_DIR", dir)
        .envs(extra_env.iter().copied())
        .current_dir(dir)
        .output();
    let out = match out {
        Ok(o) if o.status.success() => o,
        Ok(o) => panic!("ucx_info -c failed: {}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => {
            eprintln!("SKIPPED: ucx_info is not installed ({e}); apt-get install ucx-utils");
            return None;
        }
    };
    Some(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

fn value<'a>(cfg: &'a [(String, String)], name: &str) -> &'a str {
    cfg.iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("ucx_info does not list {name}"))
}

#[test]
fn ucx_reads_the_managed_block_and_the_environment_still_wins() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("ucx.conf");
    // The admin's own file: a setting of theirs and a CPU-filtered section, as UCX 1.17+
    // ships it.
    let theirs =
        "UCX_RNDV_SCHEME=put_zcopy\n[Grace Hopper]\nCPU model=Grace\nUCX_IB_ODP_MEM_TYPES=host\n";
    std::fs::write(&conf, theirs).unwrap();
    let cfg = HostConfConfig {
        manage_nccl_conf: false,
        nccl_conf: dir.path().join("nccl.conf"),
        nccl_env_plugin: None,
        nccl_conf_values: false,
        manage_ucx_conf: true,
        ucx_conf: conf.clone(),
    };
    let node = [
        entry("NCCL_IB_HCA", "=mlx5_0"),
        entry("UCX_TLS", "rc,cuda_copy,cuda_ipc"),
        entry("UCX_RNDV_THRESH", "8192"),
        entry("UCX_NET_DEVICES", "mlx5_0:1,mlx5_1:1"),
        entry("UCX_RNDV_SCHEME", "get_zcopy"),
    ];
    let report = host_conf::sync_host_confs(&cfg, &node);
    assert!(matches!(report.files[0].1, Ok(Change::Written)));
    let text = std::fs::read_to_string(&conf).unwrap();
    assert!(text.starts_with(&format!("{BEGIN}\nUCX_TLS=rc,cuda_copy,cuda_ipc\n")));
    assert!(text.ends_with(&format!("{END}\n{theirs}")));

    let Some(seen) = ucx_config(dir.path(), &[]) else {
        return;
    };
    assert_eq!(value(&seen, "UCX_TLS"), "rc,cuda_copy,cuda_ipc");
    assert_eq!(value(&seen, "UCX_RNDV_THRESH"), "8K");
    assert_eq!(value(&seen, "UCX_NET_DEVICES"), "mlx5_0:1,mlx5_1:1");
    // The admin's line comes after the block, and UCX keeps the last value it reads.
    assert_eq!(value(&seen, "UCX_RNDV_SCHEME"), "put_zcopy");

    // A variable in the process environment beats the file.
    let seen = ucx_config(dir.path(), &[("UCX_TLS", "tcp")]).unwrap();
    assert_eq!(value(&seen, "UCX_TLS"), "tcp");
    assert_eq!(value(&seen, "UCX_RNDV_THRESH"), "8K");

    // Nothing left to write: the block goes, and UCX is back to its defaults.
    host_conf::sync_host_confs(&cfg, &[]);
    assert_eq!(std::fs::read_to_string(&conf).unwrap(), theirs);
    let seen = ucx_config(dir.path(), &[]).unwrap();
    assert_eq!(value(&seen, "UCX_TLS"), "all");
}

#[test]
fn a_value_longer_than_ucx_reads_whole_is_refused_because_it_would_smuggle_a_setting() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("ucx.conf");
    // UCX cuts the line after 199 bytes and reads the rest as a line of its own.
    let prefix = "UCX_NET_DEVICES=";
    let hostile = format!(
        "{}UCX_RNDV_THRESH=77",
        "x".repeat(UCX_MAX_LINE + 1 - prefix.len())
    );
    std::fs::write(&conf, format!("{prefix}{hostile}\n")).unwrap();
    let Some(seen) = ucx_config(dir.path(), &[]) else {
        return;
    };
    assert_eq!(
        value(&seen, "UCX_RNDV_THRESH"),
        "77",
        "the attack works on a raw file"
    );

    // Through the agent, the value is left out with a reason and nothing is smuggled.
    std::fs::remove_file(&conf).unwrap();
    let (lines, skipped) = host_conf::ucx_block(&conf, &[entry("UCX_NET_DEVICES", &hostile)]);
    assert!(lines.is_empty());
    assert_eq!(skipped[0].name, "UCX_NET_DEVICES");
    host_conf::apply_block(&conf, host_conf::Placement::Top, &lines).unwrap();
    let seen = ucx_config(dir.path(), &[]).unwrap();
    assert_eq!(value(&seen, "UCX_RNDV_THRESH"), "auto");
}
