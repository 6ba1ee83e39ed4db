//! What about a node can explain a change of its figures: the fields of its facts that a
//! driver, firmware or software update moves, and the environment its tests ran with.

use std::collections::BTreeMap;

use super::FactChange;

/// Facts fields compared around a change: JSON pointers, the names stored and the words
/// people read them by.
const FIELDS: &[(&str, &str, &str)] = &[
    (
        "/software/nvidia_driver",
        "software.nvidia_driver",
        "driver",
    ),
    ("/software/cuda_driver", "software.cuda_driver", "CUDA"),
    ("/software/nccl", "software.nccl", "NCCL"),
    ("/software/ucx", "software.ucx", "UCX"),
    ("/software/ofed", "software.ofed", "OFED"),
    ("/software/rdma_core", "software.rdma_core", "rdma-core"),
    ("/software/mlx5_core", "software.mlx5_core", "mlx5_core"),
    ("/host/kernel", "host.kernel", "kernel"),
    ("/host/os/version_id", "host.os.version_id", "OS"),
    (
        "/gpudirect/peer_mem_module",
        "gpudirect.peer_mem_module",
        "peer memory module",
    ),
    ("/gpudirect/iommu", "gpudirect.iommu", "IOMMU"),
];

/// The compared fields of a node's facts (JSON as stored), plus the GPU count and the
/// firmware of each HCA (`rdma.devices[].fw_ver`) when the facts have them.
pub fn fields(facts: &serde_json::Value) -> BTreeMap<String, String> {
    let text = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Null => None,
        other => Some(other.to_string()),
    };
    let mut out = BTreeMap::new();
    for (pointer, name, _) in FIELDS {
        if let Some(v) = facts.pointer(pointer).and_then(text) {
            out.insert((*name).to_string(), v);
        }
    }
    if let Some(gpus) = facts.get("gpus").and_then(|g| g.as_array()) {
        out.insert("gpus.count".into(), gpus.len().to_string());
    }
    if let Some(devices) = facts.pointer("/rdma/devices").and_then(|d| d.as_array()) {
        for d in devices {
            if let (Some(name), Some(fw)) = (
                d.get("name").and_then(|n| n.as_str()),
                d.get("fw_ver").and_then(text),
            ) {
                out.insert(format!("rdma.{name}.fw_ver"), fw);
            }
        }
    }
    out
}

/// A field's name as people read it: `driver` for `software.nvidia_driver`, `mlx5_0
/// firmware` for `rdma.mlx5_0.fw_ver`, the variable for `env.NCCL_ALGO`.
pub fn label(field: &str) -> String {
    if let Some((_, _, words)) = FIELDS.iter().find(|f| f.1 == field) {
        return (*words).to_string();
    }
    if field == "gpus.count" {
        return "GPU count".into();
    }
    if let Some(hca) = field
        .strip_prefix("rdma.")
        .and_then(|f| f.strip_suffix(".fw_ver"))
    {
        return format!("{hca} firmware");
    }
    field.strip_prefix("env.").unwrap_or(field).to_string()
}

/// A job's applied environment (`[{name, value, source}]`) as `env.<NAME>` fields.
pub fn env_fields(applied_env: &serde_json::Value) -> BTreeMap<String, String> {
    applied_env
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let name = e.get("name")?.as_str()?;
            let value = e.get("value")?.as_str()?;
            Some((format!("env.{name}"), value.to_string()))
        })
        .collect()
}

/// Fields whose values differ, in field order.
pub fn diff(
    before: &BTreeMap<String, String>,
    after: &BTreeMap<String, String>,
) -> Vec<FactChange> {
    let mut names: Vec<&String> = before.keys().chain(after.keys()).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .filter(|n| before.get(*n) != after.get(*n))
        .map(|n| FactChange {
            field: n.clone(),
            before: before.get(n).cloned(),
            after: after.get(n).cloned(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_driver_update_and_a_new_variable_are_the_changes() {
        let a = json!({"software": {"nvidia_driver": "550.54.15", "nccl": "2.21.5"},
                       "host": {"kernel": "6.8.0"}, "gpus": [{}, {}],
                       "rdma": {"devices": [{"name": "mlx5_0", "fw_ver": "28.39.1002"}]}});
        let mut b = a.clone();
        b["software"]["nvidia_driver"] = json!("560.28.03");
        let mut fa = fields(&a);
        let mut fb = fields(&b);
        fa.extend(env_fields(&json!([])));
        fb.extend(env_fields(
            &json!([{"name": "NCCL_ALGO", "value": "Ring", "source": "run"}]),
        ));
        assert_eq!(fa["rdma.mlx5_0.fw_ver"], "28.39.1002");
        let labels: Vec<String> = fa.keys().map(|k| label(k)).collect();
        assert_eq!(
            labels,
            ["GPU count", "kernel", "mlx5_0 firmware", "NCCL", "driver"].map(String::from)
        );
        assert_eq!(fa["gpus.count"], "2");
        assert_eq!(
            diff(&fa, &fb),
            vec![
                FactChange {
                    field: "env.NCCL_ALGO".into(),
                    before: None,
                    after: Some("Ring".into())
                },
                FactChange {
                    field: "software.nvidia_driver".into(),
                    before: Some("550.54.15".into()),
                    after: Some("560.28.03".into())
                },
            ]
        );
    }
}
