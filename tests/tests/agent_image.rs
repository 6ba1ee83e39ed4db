//! The agent image as a GPU node runs it (docker/README.md's flags, less the GPU and RDMA
//! devices this machine lacks): NCCL is inside it at the version docker/build-images.sh
//! pins, the user-space RDMA stack and UCX load, `HEDDLE_NCCL_LIBRARY` still picks another
//! library, and host checks read the host's /etc mounted at /host/etc. Fails, naming the
//! command, when Docker or the image is missing.

use heddle_e2e::fleet::{docker, docker_output, image};
use serde_json::Value;

/// The NCCL version docker/build-images.sh puts in the image: the pin has one home.
fn pinned_nccl() -> String {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docker/build-images.sh");
    let text = std::fs::read_to_string(&script).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("nccl_version="))
        .unwrap_or_else(|| panic!("no nccl_version= in {}", script.display()))
        .trim()
        .to_string()
}

/// A fresh 0700 directory under the temporary directory, removed on drop.
struct PrivateDir(std::path::PathBuf);

impl PrivateDir {
    fn new() -> Self {
        use std::os::unix::fs::DirBuilderExt;
        let path =
            std::env::temp_dir().join(format!("heddle-agent-image-{}", uuid::Uuid::new_v4()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .unwrap();
        PrivateDir(path)
    }

    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn facts(extra: &[&str]) -> Value {
    let agent = image("heddle-agent");
    // docker/README.md's flags but `--ulimit memlock=-1`, which an engine without
    // CAP_SYS_RESOURCE (a rootless or nested one, like CI's) refuses to set.
    let mut args = vec![
        "run",
        "--rm",
        "--net=host",
        "--ipc=host",
        "--cap-add=IPC_LOCK",
        "-v",
        "/sys:/sys:ro",
    ];
    args.extend_from_slice(extra);
    args.extend_from_slice(&[&agent, "facts"]);
    let out = docker(&args).unwrap_or_else(|e| panic!("{e}"));
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("facts are not JSON ({e}): {out}"))
}

#[test]
fn the_agent_image_carries_nccl_rdma_core_and_reads_the_hosts_etc() {
    let agent = image("heddle-agent");
    let present = docker_output(&["image", "inspect", &agent])
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        present,
        "image {agent} is missing (or Docker does not answer); build it: \
         cargo build -p heddle-agent && HEDDLE_BIN_DIR=$CARGO_TARGET_DIR/debug docker/build-images.sh"
    );

    // A host /etc that is not the image's, so reading it is visible.
    let host_etc = PrivateDir::new();
    std::fs::write(
        host_etc.path().join("os-release"),
        "ID=heddle-host\nVERSION_ID=\"7.1\"\nPRETTY_NAME=\"the host, not the image\"\n",
    )
    .unwrap();
    std::fs::write(host_etc.path().join("waagent.conf"), "OS.EnableRDMA=y\n").unwrap();
    let mount = format!("{}:/host/etc:ro", host_etc.path().display());

    let f = facts(&["-v", &mount, "-e", "HEDDLE_HOST_ETC=/host/etc"]);
    let sw = &f["software"];
    assert_eq!(sw["nccl"].as_str(), Some(pinned_nccl().as_str()), "{sw}");
    assert_eq!(sw["nccl_probe"]["state"], "available", "{sw}");
    assert!(
        sw["rdma_core"].as_str().is_some_and(|v| !v.is_empty()),
        "libibverbs from rdma-core loads: {sw}"
    );
    assert!(sw["ucx"].as_str().is_some(), "ucx_info answers: {sw}");
    assert_eq!(f["host"]["os"]["id"], "heddle-host", "{}", f["host"]);
    assert_eq!(f["host"]["os"]["version_id"], "7.1");
    assert_eq!(f["host"]["azure_enable_rdma"], true);

    // Without the mount the image's own Debian answers; HEDDLE_NCCL_LIBRARY overrides NCCL.
    let f = facts(&["-e", "HEDDLE_NCCL_LIBRARY=/opt/other/libnccl.so.2"]);
    assert_eq!(f["host"]["os"]["id"], "debian");
    let sw = &f["software"];
    assert!(sw["nccl"].is_null(), "{sw}");
    assert!(
        sw["nccl_probe"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("/opt/other/libnccl.so.2")),
        "{sw}"
    );
}
