use serde::{Deserialize, Serialize};

/// Body of every non-2xx API response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    /// Stable machine-readable code, e.g. `not_found`, `conflict`, `payload_too_large`.
    pub error: String,
    /// Human-readable explanation.
    pub message: String,
}
