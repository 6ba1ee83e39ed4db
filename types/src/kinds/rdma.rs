//! `rdma`: one perftest (`ib_write_bw`, ...) on the node's HCA, or between two nodes;
//! judged on its bandwidth at the largest size (its latency at the smallest), and the port
//! perftest's header says it ran on.

use serde::{Deserialize, Serialize};

use super::headline::headline;
use super::{Judged, TestKind, lenient};
use crate::params::ParamType::{Boolean, Integer, String as Str};
use crate::params::{KindParams, ParamDoc, ParamError};
use crate::rows::ResultRow;
use crate::transport::PerftestEvidence;

const GIB: f64 = (1u64 << 30) as f64;

pub const PERFTESTS: &[&str] = &[
    "ib_write_bw",
    "ib_read_bw",
    "ib_send_bw",
    "ib_write_lat",
    "ib_read_lat",
    "ib_send_lat",
];

/// `rdma`: one perftest (`ib_write_bw`, ...) on the node's HCA, or between two nodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RdmaParams {
    pub test: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    pub ib_port: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gid_index: Option<u64>,
    /// Every size from 2 B up (perftest's `-a`) unless `size` is given; false: 64 KiB.
    pub all: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iters: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_host: Option<String>,
    pub port: u64,
}

impl Default for RdmaParams {
    fn default() -> Self {
        RdmaParams {
            test: "ib_write_bw".into(),
            device: None,
            ib_port: 1,
            gid_index: None,
            all: true,
            size: None,
            iters: None,
            server_host: None,
            port: 18515,
        }
    }
}

impl KindParams for RdmaParams {
    const KIND: &'static str = "rdma";
    const DESCRIPTION: &'static str = "A perftest (ib_write_bw, ...) on an RDMA device: loopback on one node, or rank 0 to rank 1.";
    const PARAMS: &'static [ParamDoc] = &[
        ParamDoc::new("test", Str, "perftest binary to run.").choices(PERFTESTS),
        ParamDoc::new(
            "device",
            Str,
            "RDMA device (default: the first active one).",
        ),
        ParamDoc::new("ib_port", Integer, "Port of the device.").range(1.0, 2.0),
        ParamDoc::new("gid_index", Integer, "GID index (RoCE).").range(0.0, 255.0),
        ParamDoc::new(
            "all",
            Boolean,
            "Every size from 2 B up unless size is given.",
        ),
        ParamDoc::new("size", Integer, "One message size.")
            .unit("bytes")
            .range(1.0, 8.0 * GIB),
        ParamDoc::new(
            "iters",
            Integer,
            "Iterations (perftest's default when absent).",
        )
        .unit("iterations")
        .range(1.0, 100_000_000.0),
        ParamDoc::new(
            "server_host",
            Str,
            "Address of rank 0 (default: its hostname).",
        ),
        ParamDoc::new("port", Integer, "TCP port of perftest's handshake.").range(1.0, 65535.0),
    ];

    fn check(&self) -> Result<(), ParamError> {
        if let Some(d) = &self.device
            && (d.is_empty() || d.contains('/') || d.starts_with('.'))
        {
            return Err(ParamError::new(
                "device",
                format!("invalid device name {d:?}"),
            ));
        }
        Ok(())
    }
}

impl TestKind for RdmaParams {
    type Summary = RdmaSummary;

    fn judged(&self, rows: &[ResultRow]) -> Judged {
        let test = format!("rdma.{}", self.test);
        let metric = if self.test.ends_with("_lat") {
            "time_us"
        } else {
            "algbw_gbs"
        };
        Judged {
            figures: headline(test.clone(), metric, rows.iter(), false)
                .into_iter()
                .collect(),
            test,
        }
    }

    fn path_line(summary: &RdmaSummary) -> Option<String> {
        let ev = summary.perftest_evidence.as_ref()?;
        let mut line = format!(
            "perftest on {} port {}",
            ev.device.as_deref().unwrap_or("an unreported device"),
            ev.port.map_or("?".into(), |p| p.to_string())
        );
        let details: Vec<String> = [
            ev.link_layer.as_ref().map(|l| format!("link {l}")),
            ev.transport.as_ref().map(|t| format!("transport {t}")),
            ev.mtu.map(|m| format!("MTU {m}")),
            ev.gid_index.map(|g| format!("GID index {g}")),
        ]
        .into_iter()
        .flatten()
        .collect();
        if !details.is_empty() {
            line.push_str(&format!(" ({})", details.join(", ")));
        }
        Some(line)
    }
}

/// What readers take from an `rdma` result's summary.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct RdmaSummary {
    /// What perftest's header said (device, port, link layer, MTU, ...).
    #[serde(default, deserialize_with = "lenient")]
    pub perftest_evidence: Option<PerftestEvidence>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::kinds::path_line;

    #[test]
    fn the_path_line_of_a_perftest_names_its_port() {
        let s = json!({"perftest_evidence": {"device": "mlx5_0", "port": 1, "link_layer": "Ethernet",
        "transport": "IB", "mtu": 4096, "gid_index": 3}});
        assert_eq!(
            path_line("rdma", &s).unwrap(),
            "perftest on mlx5_0 port 1 (link Ethernet, transport IB, MTU 4096, GID index 3)"
        );
        assert_eq!(
            path_line("rdma", &json!({"perftest_evidence": {}})).unwrap(),
            "perftest on an unreported device port ?"
        );
        assert_eq!(path_line("rdma", &json!({})), None);
    }
}
