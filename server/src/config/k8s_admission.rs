//! The flags of the Kubernetes admission webhook (`k8s_admission.rs`).

use std::path::PathBuf;

/// What the webhook injects (server flags).
#[derive(Debug, Clone, clap::Args)]
pub struct AdmissionConfig {
    /// Serve the Kubernetes mutating admission webhook at `/k8s/admission/v1/mutate` (over
    /// HTTPS: the API server calls webhooks over TLS only).
    #[arg(long, env = "HEDDLE_K8S_ADMISSION", default_value_t = false)]
    pub k8s_admission: bool,
    /// The directory on each GPU node that holds the NCCL environment plugin, the env file
    /// and `ucx.conf` (the agent DaemonSet fills it).
    #[arg(
        long,
        env = "HEDDLE_K8S_INJECT_HOST_DIR",
        default_value = "/var/lib/heddle-agent/job"
    )]
    pub k8s_inject_host_dir: PathBuf,
    /// Where that directory appears in GPU containers (read-only).
    #[arg(
        long,
        env = "HEDDLE_K8S_INJECT_MOUNT_PATH",
        default_value = "/var/lib/heddle-agent/job"
    )]
    pub k8s_inject_mount_path: PathBuf,
}
