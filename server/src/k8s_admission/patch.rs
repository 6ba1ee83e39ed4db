//! Which JSONPatch operations a pod gets. Reads the pod through a typed subset (unknown
//! fields are ignored, never rewritten): every operation adds, none replaces or removes,
//! so whatever the pod already says stays.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use serde_json::{Value, json};

use super::AdmissionConfig;

/// Pod annotation: `"false"` leaves the pod alone.
pub const ANNOTATION_INJECT: &str = "heddle.io/inject";
/// Pod annotation: `"mount"` also mounts the node's env file at `/etc/nccl.conf`.
pub const ANNOTATION_NCCL_CONF: &str = "heddle.io/nccl-conf";
/// The injected volume; its presence marks a pod already mutated.
pub const VOLUME: &str = "heddle-job";
const VOLUME_NCCL_CONF: &str = "heddle-nccl-conf";
const GPU_RESOURCE: &str = "nvidia.com/gpu";
const NCCL_CONF_PATH: &str = "/etc/nccl.conf";
/// Most containers of either kind looked at; a real pod has a handful.
const MAX_CONTAINERS: usize = 256;

#[derive(Debug, Deserialize)]
struct Pod {
    #[serde(default)]
    metadata: Meta,
    spec: Spec,
}

#[derive(Debug, Default, Deserialize)]
struct Meta {
    #[serde(default)]
    annotations: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Spec {
    #[serde(default)]
    volumes: Option<Vec<Named>>,
    #[serde(default)]
    containers: Vec<Container>,
    #[serde(default)]
    init_containers: Option<Vec<Container>>,
}

#[derive(Debug, Deserialize)]
struct Named {
    name: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Container {
    #[serde(default)]
    resources: Option<Resources>,
    #[serde(default)]
    env: Option<Vec<Named>>,
    #[serde(default)]
    volume_mounts: Option<Vec<Mount>>,
}

#[derive(Debug, Default, Deserialize)]
struct Resources {
    #[serde(default)]
    limits: Option<BTreeMap<String, Value>>,
    #[serde(default)]
    requests: Option<BTreeMap<String, Value>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Mount {
    mount_path: String,
}

/// A quantity of GPUs other than zero (`"1"`, `8`, `"0"`, ...): whether it asks for any.
fn asks(q: &Value) -> bool {
    match q {
        Value::String(s) => s.trim().parse::<f64>() != Ok(0.0),
        Value::Number(n) => n.as_f64() != Some(0.0),
        _ => false,
    }
}

impl Container {
    fn wants_gpu(&self) -> bool {
        let Some(r) = &self.resources else {
            return false;
        };
        [&r.limits, &r.requests]
            .into_iter()
            .flatten()
            .any(|m| m.get(GPU_RESOURCE).is_some_and(asks))
    }

    fn sets(&self, name: &str) -> bool {
        self.env.iter().flatten().any(|e| e.name == name)
    }

    fn mounts_at(&self, path: &str) -> bool {
        self.volume_mounts
            .iter()
            .flatten()
            .any(|m| m.mount_path.trim_end_matches('/') == path.trim_end_matches('/'))
    }
}

fn path_str(p: &Path) -> Result<&str, String> {
    p.to_str()
        .filter(|s| s.starts_with('/') && !s.chars().any(char::is_control))
        .ok_or_else(|| format!("{} is not an absolute path", p.display()))
}

/// The operations for `pod` (empty: leave it as it is). An error says why a pod that
/// looked like a candidate could not be read.
pub fn mutations(pod: &Value, cfg: &AdmissionConfig) -> Result<Vec<Value>, String> {
    let pod: Pod = serde_json::from_value(pod.clone())
        .map_err(|e| format!("the pod could not be read ({e})"))?;
    let annotations = pod.metadata.annotations.unwrap_or_default();
    if annotations.get(ANNOTATION_INJECT).map(String::as_str) == Some("false") {
        return Ok(Vec::new());
    }
    if pod.spec.volumes.iter().flatten().any(|v| v.name == VOLUME) {
        return Ok(Vec::new());
    }
    let init = pod.spec.init_containers.unwrap_or_default();
    if pod.spec.containers.len() > MAX_CONTAINERS || init.len() > MAX_CONTAINERS {
        return Err("the pod has too many containers".into());
    }
    let gpu: Vec<(&str, usize, &Container)> = [
        ("containers", &pod.spec.containers),
        ("initContainers", &init),
    ]
    .into_iter()
    .flat_map(|(field, list)| {
        list.iter()
            .enumerate()
            .filter(|(_, c)| c.wants_gpu())
            .map(move |(i, c)| (field, i, c))
    })
    .collect();
    if gpu.is_empty() {
        return Ok(Vec::new());
    }
    let host_dir = path_str(&cfg.k8s_inject_host_dir)?.trim_end_matches('/');
    let mount = path_str(&cfg.k8s_inject_mount_path)?.trim_end_matches('/');
    let nccl_conf = annotations.get(ANNOTATION_NCCL_CONF).map(String::as_str) == Some("mount");

    let mut ops = Vec::new();
    // DirectoryOrCreate: a node without the agent gets an empty directory rather than a
    // pod that cannot start; NCCL and UCX then find nothing there and run as before.
    let mut volumes = vec![json!({
        "name": VOLUME,
        "hostPath": {"path": host_dir, "type": "DirectoryOrCreate"},
    })];
    if nccl_conf {
        volumes.push(json!({
            "name": VOLUME_NCCL_CONF,
            "hostPath": {"path": format!("{host_dir}/nccl.env"), "type": "FileOrCreate"},
        }));
    }
    add_all(
        &mut ops,
        "/spec/volumes",
        pod.spec.volumes.is_some(),
        volumes,
    );

    let env = [
        ("NCCL_ENV_PLUGIN", format!("{mount}/libnccl-env-heddle.so")),
        ("HEDDLE_NCCL_ENV_FILE", format!("{mount}/nccl.env")),
        ("UCX_CONFIG_DIR", mount.to_string()),
    ];
    for (field, i, c) in gpu {
        let base = format!("/spec/{field}/{i}");
        let mut mounts = Vec::new();
        if !c.mounts_at(mount) {
            mounts.push(json!({"name": VOLUME, "mountPath": mount, "readOnly": true}));
        }
        if nccl_conf && !c.mounts_at(NCCL_CONF_PATH) {
            mounts.push(
                json!({"name": VOLUME_NCCL_CONF, "mountPath": NCCL_CONF_PATH, "readOnly": true}),
            );
        }
        add_all(
            &mut ops,
            &format!("{base}/volumeMounts"),
            c.volume_mounts.is_some(),
            mounts,
        );
        let vars = env
            .iter()
            .filter(|(name, _)| !c.sets(name))
            .map(|(name, value)| json!({"name": name, "value": value}))
            .collect();
        add_all(&mut ops, &format!("{base}/env"), c.env.is_some(), vars);
    }
    Ok(ops)
}

/// `add` operations for `items` at the list `path`: the whole list when the pod has none,
/// else one append each.
fn add_all(ops: &mut Vec<Value>, path: &str, exists: bool, items: Vec<Value>) {
    if items.is_empty() {
        return;
    }
    if exists {
        for item in items {
            ops.push(json!({"op": "add", "path": format!("{path}/-"), "value": item}));
        }
    } else {
        ops.push(json!({"op": "add", "path": path, "value": items}));
    }
}
