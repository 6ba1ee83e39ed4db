//! The Kubernetes mutating admission webhook (`POST /k8s/admission/v1/mutate`): GPU pods
//! get the node's Heddle environment by mechanism, not by value. A webhook runs before the
//! scheduler picks a node, so it cannot know the node's values; it mounts the directory
//! each node's agent keeps (the NCCL environment plugin, the env file, a `ucx.conf`) and
//! points NCCL and UCX at it:
//! - `NCCL_ENV_PLUGIN=<mount>/libnccl-env-heddle.so` and `HEDDLE_NCCL_ENV_FILE=<mount>/nccl.env`
//!   (NCCL 2.28.7 and later load the plugin, which reads the env file);
//! - `UCX_CONFIG_DIR=<mount>`: every UCX from 1.12 reads `$UCX_CONFIG_DIR/ucx.conf`, which
//!   reaches the UCX builds in conda and pip environments that never read `/etc/ucx`;
//! - with the pod annotation `heddle.io/nccl-conf: "mount"`, the env file at
//!   `/etc/nccl.conf`, for images whose NCCL predates the environment plugin.
//!
//! The API server calls this without a bearer token, so it reads nothing but the review,
//! answers nothing but the patch, and never refuses a pod: a review it cannot read is
//! answered `allowed` without a patch (and the configuration's `failurePolicy: Ignore`
//! covers a webhook that does not answer). Which namespaces are mutated is the
//! configuration's `namespaceSelector` (`heddle.io/inject=enabled`): the review carries the
//! namespace's name, not its labels, so the code cannot check them.
//!
//! The AdmissionReview shapes are Kubernetes', not Heddle's: they live here, beside their
//! one reader, rather than in `heddle-types`, which holds the shapes Heddle's own
//! components exchange.

mod patch;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde::{Deserialize, Serialize};

use crate::config::AdmissionConfig;
use crate::http::error::ApiError;
use crate::state::AppState;

pub use patch::{ANNOTATION_INJECT, ANNOTATION_NCCL_CONF, VOLUME, mutations};

/// Largest review read: the API server sends at most 3 MiB in a request.
pub const MAX_REVIEW_BYTES: usize = 3 << 20;

/// `admission.k8s.io/v1` AdmissionReview, as the API server sends it (the fields read).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReviewIn {
    pub api_version: String,
    pub kind: String,
    pub request: Option<ReviewRequest>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReviewRequest {
    pub uid: String,
    pub kind: GroupVersionKind,
    pub operation: String,
    #[serde(default)]
    pub object: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
pub struct GroupVersionKind {
    #[serde(default)]
    pub group: String,
    pub version: String,
    pub kind: String,
}

/// The AdmissionReview answer.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ReviewOut {
    pub api_version: String,
    pub kind: String,
    pub response: ReviewResponse,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ReviewResponse {
    pub uid: String,
    pub allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch_type: Option<String>,
    /// The JSONPatch, base64 (standard alphabet, padded), as the API server expects.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

impl ReviewOut {
    fn allow(uid: String, warnings: Vec<String>) -> ReviewOut {
        ReviewOut {
            api_version: "admission.k8s.io/v1".into(),
            kind: "AdmissionReview".into(),
            response: ReviewResponse {
                uid,
                allowed: true,
                patch_type: None,
                patch: None,
                warnings,
            },
        }
    }
}

/// The answer to one review body. Never refuses: whatever cannot be read is allowed as is.
pub fn review(body: &[u8], cfg: &AdmissionConfig) -> ReviewOut {
    let parsed: ReviewIn = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(_) => {
            // The uid, if the rest is past reading, so the API server can match the answer.
            let uid = serde_json::from_slice::<serde_json::Value>(body)
                .ok()
                .and_then(|v| v.pointer("/request/uid")?.as_str().map(str::to_string))
                .unwrap_or_default();
            return ReviewOut::allow(
                uid,
                vec!["heddle: the admission review could not be read; the pod is unchanged".into()],
            );
        }
    };
    let Some(req) = parsed.request else {
        return ReviewOut::allow(String::new(), Vec::new());
    };
    let is_pod = req.kind.group.is_empty() && req.kind.version == "v1" && req.kind.kind == "Pod";
    if parsed.api_version != "admission.k8s.io/v1"
        || parsed.kind != "AdmissionReview"
        || !is_pod
        || req.operation != "CREATE"
    {
        return ReviewOut::allow(req.uid, Vec::new());
    }
    let Some(object) = req.object else {
        return ReviewOut::allow(req.uid, Vec::new());
    };
    match mutations(&object, cfg) {
        Ok(ops) if ops.is_empty() => ReviewOut::allow(req.uid, Vec::new()),
        Ok(ops) => {
            let json = serde_json::to_vec(&ops).expect("patch operations serialise");
            let mut out = ReviewOut::allow(req.uid, Vec::new());
            out.response.patch_type = Some("JSONPatch".into());
            out.response.patch = Some(base64::engine::general_purpose::STANDARD.encode(json));
            out
        }
        Err(why) => ReviewOut::allow(
            req.uid,
            vec![format!("heddle: {why}; the pod is unchanged")],
        ),
    }
}

/// `POST /k8s/admission/v1/mutate`. Answers 404 unless `--k8s-admission` is on.
pub async fn mutate(State(state): State<AppState>, body: Bytes) -> Response {
    let cfg = &state.config.k8s_admission;
    if !cfg.k8s_admission {
        return ApiError::NotFound("the Kubernetes admission webhook is off".into())
            .into_response();
    }
    let out = review(&body, cfg);
    if out.response.patch.is_some() {
        tracing::debug!(uid = %out.response.uid, "admission: pod mutated");
    }
    axum::Json(out).into_response()
}

/// The webhook's route, with its own body limit and timeout.
pub fn routes() -> axum::Router<AppState> {
    axum::Router::new()
        .route("/k8s/admission/v1/mutate", axum::routing::post(mutate))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_REVIEW_BYTES))
}

#[cfg(test)]
mod tests;
