//! A sweep run read as a table: its grid cells × size bands, the winner of each band, and
//! the request that keeps a winner as a tuning profile.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Message sizes grouped the way tuning decisions are made: latency-bound, in between,
/// and bandwidth-bound. Bounds are on `size_bytes` of a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Band {
    /// Below 64 KiB.
    Small,
    /// 64 KiB up to (not including) 64 MiB.
    Medium,
    /// 64 MiB and above.
    Large,
}

impl Band {
    pub const ALL: [Band; 3] = [Band::Small, Band::Medium, Band::Large];
    pub const MEDIUM_FROM: i64 = 64 << 10;
    pub const LARGE_FROM: i64 = 64 << 20;

    pub fn of(size_bytes: i64) -> Band {
        if size_bytes < Band::MEDIUM_FROM {
            Band::Small
        } else if size_bytes < Band::LARGE_FROM {
            Band::Medium
        } else {
            Band::Large
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Band::Small => "small",
            Band::Medium => "medium",
            Band::Large => "large",
        }
    }
}

impl std::str::FromStr for Band {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Band::ALL
            .into_iter()
            .find(|b| b.as_str() == s)
            .ok_or_else(|| format!("unknown band {s:?} (small, medium or large)"))
    }
}

/// Mean bus bandwidth (GB/s) per band; `None` where the sweep measured no size in it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BandBusbw {
    pub small: Option<f64>,
    pub medium: Option<f64>,
    pub large: Option<f64>,
}

impl BandBusbw {
    pub fn get(&self, band: Band) -> Option<f64> {
        match band {
            Band::Small => self.small,
            Band::Medium => self.medium,
            Band::Large => self.large,
        }
    }

    pub fn set(&mut self, band: Band, v: Option<f64>) {
        match band {
            Band::Small => self.small = v,
            Band::Medium => self.medium = v,
            Band::Large => self.large = v,
        }
    }
}

/// One cell of the grid: the `NCCL_*` values it ran with and what it measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SweepCell {
    pub env: BTreeMap<String, String>,
    pub busbw_gbs: BandBusbw,
    pub peak_busbw_gbs: Option<f64>,
    /// Elements that failed validation in this cell; a cell with any cannot win.
    pub wrong: i64,
    pub rows: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SweepWinner {
    pub band: Band,
    pub env: BTreeMap<String, String>,
    pub busbw_gbs: f64,
    /// The best other cell's figure in this band, when there is one.
    pub runner_up_busbw_gbs: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SweepTable {
    pub run_id: Uuid,
    pub node_id: Uuid,
    pub hostname: String,
    /// The collective the sweep measured (`all_reduce`, ...).
    pub collective: Option<String>,
    pub cells: Vec<SweepCell>,
    /// One entry per band in which at least one valid cell measured something.
    pub winners: Vec<SweepWinner>,
}

/// Where a kept profile applies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum ProfileScope {
    /// The node the sweep ran on.
    #[default]
    Node,
    /// That node's site.
    Site,
}

/// Keep a band's winning cell as a tuning profile.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SweepKeep {
    pub name: String,
    #[serde(default = "large")]
    pub band: Band,
    #[serde(default)]
    pub scope: ProfileScope,
}

fn large() -> Band {
    Band::Large
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bands_split_at_64k_and_64m() {
        assert_eq!(Band::of(8), Band::Small);
        assert_eq!(Band::of((64 << 10) - 1), Band::Small);
        assert_eq!(Band::of(64 << 10), Band::Medium);
        assert_eq!(Band::of((64 << 20) - 1), Band::Medium);
        assert_eq!(Band::of(64 << 20), Band::Large);
        assert_eq!("medium".parse::<Band>(), Ok(Band::Medium));
        assert!("huge".parse::<Band>().is_err());
    }

    #[test]
    fn keep_defaults_to_large_and_node() {
        let k: SweepKeep = serde_json::from_str(r#"{"name": "ring-ll128"}"#).unwrap();
        assert_eq!((k.band, k.scope), (Band::Large, ProfileScope::Node));
        assert!(serde_json::from_str::<SweepKeep>(r#"{"name": "x", "band": "huge"}"#).is_err());
    }
}
