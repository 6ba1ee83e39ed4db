use base64::Engine;
use serde_json::{Value, json};

use super::*;

const WORKER: &str = include_str!("testdata/pytorchjob-worker.json");

fn cfg() -> AdmissionConfig {
    AdmissionConfig {
        k8s_admission: true,
        k8s_inject_host_dir: "/var/lib/heddle-agent/job".into(),
        k8s_inject_mount_path: "/var/lib/heddle-agent/job".into(),
    }
}

fn worker() -> Value {
    serde_json::from_str(WORKER).unwrap()
}

fn run(review_doc: &Value) -> ReviewOut {
    let out = review(&serde_json::to_vec(review_doc).unwrap(), &cfg());
    // Whatever happens, the answer is a v1 AdmissionReview that admits the pod.
    assert_eq!(out.api_version, "admission.k8s.io/v1");
    assert_eq!(out.kind, "AdmissionReview");
    assert!(out.response.allowed);
    out
}

/// The pod after the answer's patch, applied as the API server would.
fn patched(review_doc: &Value, out: &ReviewOut) -> Value {
    let mut pod = review_doc["request"]["object"].clone();
    if let Some(p) = &out.response.patch {
        assert_eq!(out.response.patch_type.as_deref(), Some("JSONPatch"));
        let bytes = base64::engine::general_purpose::STANDARD.decode(p).unwrap();
        let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
        json_patch::patch(&mut pod, &patch).unwrap();
    }
    pod
}

fn env_of(c: &Value) -> Vec<(String, String)> {
    c["env"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_string(),
                e["value"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

#[test]
fn a_gpu_pod_gets_the_volume_the_mount_and_the_variables() {
    let doc = worker();
    let out = run(&doc);
    assert_eq!(out.response.uid, "0df28fbd-5f5f-11e8-bc74-36e6bb280816");
    let pod = patched(&doc, &out);
    let volumes = pod["spec"]["volumes"].as_array().unwrap();
    assert_eq!(volumes.len(), 3, "the pod's own volumes stay");
    assert_eq!(
        volumes[2],
        json!({"name": "heddle-job", "hostPath": {"path": "/var/lib/heddle-agent/job", "type": "DirectoryOrCreate"}})
    );
    let gpu = &pod["spec"]["containers"][0];
    assert_eq!(
        gpu["volumeMounts"][2],
        json!({"name": "heddle-job", "mountPath": "/var/lib/heddle-agent/job", "readOnly": true})
    );
    let env = env_of(gpu);
    assert_eq!(
        env[..6],
        env_of(&doc["request"]["object"]["spec"]["containers"][0])[..]
    );
    assert_eq!(
        env[6..],
        [
            (
                "NCCL_ENV_PLUGIN".to_string(),
                "/var/lib/heddle-agent/job/libnccl-env-heddle.so".to_string()
            ),
            (
                "HEDDLE_NCCL_ENV_FILE".into(),
                "/var/lib/heddle-agent/job/nccl.env".into()
            ),
            ("UCX_CONFIG_DIR".into(), "/var/lib/heddle-agent/job".into()),
        ]
    );
    // The sidecar and the init container ask for no GPU: untouched.
    assert_eq!(
        pod["spec"]["containers"][1],
        doc["request"]["object"]["spec"]["containers"][1]
    );
    assert_eq!(
        pod["spec"]["initContainers"],
        doc["request"]["object"]["spec"]["initContainers"]
    );
    // No /etc/nccl.conf without the annotation.
    assert!(!pod.to_string().contains("/etc/nccl.conf"));
}

#[test]
fn mutating_twice_changes_nothing_more() {
    let mut doc = worker();
    let out = run(&doc);
    doc["request"]["object"] = patched(&doc, &out);
    let again = run(&doc);
    assert_eq!(again.response.patch, None);
    assert_eq!(patched(&doc, &again), doc["request"]["object"]);
}

#[test]
fn pods_without_gpus_and_opted_out_pods_are_untouched() {
    let mut doc = worker();
    let spec = &mut doc["request"]["object"]["spec"];
    spec["containers"][0]["resources"] = json!({"limits": {"cpu": "4", "nvidia.com/gpu": "0"}});
    let out = run(&doc);
    assert_eq!((out.response.patch, out.response.warnings.len()), (None, 0));

    let mut doc = worker();
    doc["request"]["object"]["metadata"]["annotations"]["heddle.io/inject"] = json!("false");
    assert_eq!(run(&doc).response.patch, None);

    // An update, or another kind, is never patched.
    let mut doc = worker();
    doc["request"]["operation"] = json!("UPDATE");
    assert_eq!(run(&doc).response.patch, None);
    let mut doc = worker();
    doc["request"]["kind"]["kind"] = json!("Deployment");
    assert_eq!(run(&doc).response.patch, None);
}

#[test]
fn the_containers_own_choices_stay_and_gpu_init_containers_count() {
    let mut doc = worker();
    let obj = &mut doc["request"]["object"];
    obj["spec"]["containers"][0]["env"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "UCX_CONFIG_DIR", "value": "/opt/ucx"}));
    // A bare pod: no volumes, no env, a GPU init container counted as a number.
    obj["spec"]["initContainers"][0]["resources"] = json!({"requests": {"nvidia.com/gpu": 1}});
    obj["spec"]["initContainers"][0]
        .as_object_mut()
        .unwrap()
        .remove("volumeMounts");
    obj["spec"].as_object_mut().unwrap().remove("volumes");
    obj["metadata"]["annotations"]["heddle.io/nccl-conf"] = json!("mount");
    let out = run(&doc);
    let pod = patched(&doc, &out);
    let names: Vec<_> = env_of(&pod["spec"]["containers"][0])
        .into_iter()
        .map(|(n, v)| format!("{n}={v}"))
        .collect();
    assert!(names.contains(&"UCX_CONFIG_DIR=/opt/ucx".to_string()));
    assert_eq!(
        names
            .iter()
            .filter(|n| n.starts_with("UCX_CONFIG_DIR="))
            .count(),
        1
    );
    let init = &pod["spec"]["initContainers"][0];
    assert_eq!(env_of(init).len(), 3);
    assert_eq!(init["volumeMounts"][1]["mountPath"], "/etc/nccl.conf");
    assert_eq!(
        pod["spec"]["volumes"][1],
        json!({"name": "heddle-nccl-conf", "hostPath": {"path": "/var/lib/heddle-agent/job/nccl.env", "type": "FileOrCreate"}})
    );
    // And once more: unchanged.
    doc["request"]["object"] = pod;
    assert_eq!(run(&doc).response.patch, None);
}

#[test]
fn a_malformed_review_is_answered_allowed_without_a_patch() {
    // Truncated JSON: no uid to be had.
    let out = review(&WORKER.as_bytes()[..200], &cfg());
    assert!(out.response.allowed && out.response.patch.is_none());
    assert_eq!(out.response.uid, "");
    // Valid JSON of the wrong shape keeps its uid.
    let doc = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                     "request": {"uid": "u-1", "kind": 7}});
    let out = review(&serde_json::to_vec(&doc).unwrap(), &cfg());
    assert_eq!(
        (out.response.uid.as_str(), out.response.allowed),
        ("u-1", true)
    );
    // A pod whose spec is not an object: allowed, unchanged, and said so.
    let mut doc = worker();
    doc["request"]["object"]["spec"] = json!("nonsense");
    let out = run(&doc);
    assert_eq!(out.response.patch, None);
    assert_eq!(out.response.warnings.len(), 1);
    // Not JSON at all, and nothing.
    for body in [&b"\xff\x00garbage"[..], b""] {
        let out = review(body, &cfg());
        assert!(out.response.allowed);
    }
    // The answer serialises as the API server reads it.
    let v = serde_json::to_value(review(b"{}", &cfg())).unwrap();
    assert_eq!(
        v,
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
               "response": {"uid": "", "allowed": true,
                            "warnings": ["heddle: the admission review could not be read; the pod is unchanged"]}})
    );
}
