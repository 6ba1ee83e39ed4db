//! What a plugin returns: converted from each contract's bindings into the host's types, and
//! checked before anyone uses it.

use crate::HostError;
use crate::bindings::{v01, v02};
use crate::report::{Detection, EnvRecommendation, Expectation, GpuAffinity, PluginInfo};

/// What `info()` may return: bounded, and `reads` made of JSON pointers.
pub fn check_info(info: &PluginInfo) -> Result<(), HostError> {
    if info.name.is_empty()
        || info.name.len() > 64
        || info.version.len() > 64
        || info.description.len() > 1024
    {
        return Err(HostError::NotAComponent(format!(
            "info() must return a name of 1-64 bytes, a version up to 64 and a description up to 1024 (got {}, {}, {})",
            info.name.len(),
            info.version.len(),
            info.description.len()
        )));
    }
    if info.reads.len() > 64 {
        return Err(HostError::NotAComponent(format!(
            "info() declares {} reads; at most 64",
            info.reads.len()
        )));
    }
    if let Some(bad) = info
        .reads
        .iter()
        .find(|r| !r.starts_with('/') || r.len() > 256)
    {
        return Err(HostError::NotAComponent(format!(
            "info() declares read {bad:?}: reads are JSON pointers such as `/host/dmi` (at most 256 bytes)"
        )));
    }
    Ok(())
}

/// Both contract versions' records have the same shape where they overlap.
macro_rules! convert_common {
    ($d:expr) => {
        Detection {
            traits: $d.traits.into_iter().map(|t| (t.key, t.value)).collect(),
            env: $d
                .env
                .into_iter()
                .map(|e| EnvRecommendation {
                    name: e.name,
                    value: e.value,
                    reason: e.reason,
                })
                .collect(),
            affinity: $d
                .affinity
                .into_iter()
                .map(|a| GpuAffinity {
                    gpu: a.gpu,
                    cpus: a.cpus,
                    numa: a.numa,
                    nic: a.nic,
                    netdev: a.netdev,
                })
                .collect(),
            warnings: $d.warnings,
            expectations: Vec::new(),
        }
    };
}

pub fn convert_v01(d: v01::exports::heddle::plugin::plugin::Detection) -> Detection {
    convert_common!(d)
}

pub fn convert_v02(mut d: v02::exports::heddle::plugin::plugin::Detection) -> Detection {
    let expectations = std::mem::take(&mut d.expectations)
        .into_iter()
        .map(|e| Expectation {
            test: e.test,
            metric: e.metric,
            min_size_bytes: e.min_size_bytes,
            value: e.value,
            source: e.source,
        })
        .collect();
    Detection {
        expectations,
        ..convert_common!(d)
    }
}

/// Recommendations end up in shells (`export NAME=VALUE`) and process environments, so names
/// must be identifiers and nothing may contain NUL.
pub fn check_output(d: &Detection) -> Result<(), HostError> {
    for e in &d.env {
        if heddle_types::env_policy::check_identifier(&e.name).is_err() {
            return Err(HostError::InvalidOutput(format!(
                "environment variable name {:?} is not an identifier",
                e.name
            )));
        }
        if e.value.contains('\0') {
            return Err(HostError::InvalidOutput(format!(
                "value of {} contains a NUL byte",
                e.name
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_env(name: &str, value: &str) -> Detection {
        Detection {
            env: vec![EnvRecommendation {
                name: name.into(),
                value: value.into(),
                reason: String::new(),
            }],
            ..Detection::default()
        }
    }

    #[test]
    fn env_names_must_be_identifiers() {
        assert!(check_output(&with_env("NCCL_IB_HCA", "mlx5_0")).is_ok());
        assert!(check_output(&with_env("_X1", "")).is_ok());
        for bad in ["", "1X", "A-B", "X;rm -rf /", "A B", "X=Y"] {
            assert_eq!(
                check_output(&with_env(bad, "v")).unwrap_err().code(),
                "invalid-output",
                "{bad:?}"
            );
        }
        assert!(check_output(&with_env("X", "a\0b")).is_err());
    }
}
