//! One parameter struct per job kind, with the defaults and limits its runner applies
//! (`nccl` and `sweep` are in `nccl.rs`).

use serde::{Deserialize, Serialize};

use super::ParamType::{Boolean, Integer, IntegerList, Number, String as Str, StringList};
use super::{KindParams, ParamDoc, ParamError};

const GIB: f64 = (1u64 << 30) as f64;

/// `p2p`: copy bandwidth between the GPUs of one node and between each GPU and the host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct P2pParams {
    pub size: u64,
    pub warmup: u64,
    pub iters: u64,
    pub bidirectional: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpus: Option<Vec<u64>>,
}

impl Default for P2pParams {
    fn default() -> Self {
        P2pParams {
            size: 256 << 20,
            warmup: 5,
            iters: 20,
            bidirectional: false,
            gpus: None,
        }
    }
}

impl KindParams for P2pParams {
    const KIND: &'static str = "p2p";
    const DESCRIPTION: &'static str =
        "GPU↔GPU and host↔GPU copy bandwidth on one node (a GPU×GPU matrix).";
    const PARAMS: &'static [ParamDoc] = &[
        ParamDoc::new("size", Integer, "Bytes per copy.")
            .unit("bytes")
            .range(1.0, 16.0 * GIB),
        ParamDoc::new("warmup", Integer, "Untimed copies per pair.")
            .unit("iterations")
            .range(0.0, 100_000.0),
        ParamDoc::new("iters", Integer, "Timed copies per pair.")
            .unit("iterations")
            .range(1.0, 100_000.0),
        ParamDoc::new(
            "bidirectional",
            Boolean,
            "Also copy both directions of a pair at once.",
        ),
        ParamDoc::new(
            "gpus",
            IntegerList,
            "Device indices to measure (default: all).",
        )
        .range(0.0, 1023.0),
    ];

    fn check(&self) -> Result<(), ParamError> {
        if let Some(g) = &self.gpus {
            let mut sorted = g.clone();
            sorted.sort_unstable();
            sorted.dedup();
            if g.is_empty() || sorted.len() != g.len() {
                return Err(ParamError::new(
                    "gpus",
                    format!("must list distinct devices, got {g:?}"),
                ));
            }
        }
        Ok(())
    }
}

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

pub const UCX_TESTS: &[&str] = &[
    "tag_lat",
    "tag_bw",
    "tag_sync_lat",
    "tag_sync_bw",
    "ucp_put_lat",
    "ucp_put_bw",
    "ucp_get",
    "stream_bw",
    "stream_lat",
    "ucp_am_lat",
    "ucp_am_bw",
];
pub const UCX_MEMORY: &[&str] = &["host", "cuda", "cuda-managed", "rocm"];

/// `ucx`: ucx_perftest's UCP tests between two processes (one node) or two nodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UcxParams {
    pub tests: Vec<String>,
    pub sizes: Vec<u64>,
    pub iters: u64,
    pub warmup: u64,
    pub memory: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_host: Option<String>,
}

impl Default for UcxParams {
    fn default() -> Self {
        UcxParams {
            tests: vec!["tag_lat".into(), "tag_bw".into()],
            sizes: vec![8, 4096, 65536, 1 << 20],
            iters: 10_000,
            warmup: 1_000,
            memory: "host".into(),
            server_host: None,
        }
    }
}

impl KindParams for UcxParams {
    const KIND: &'static str = "ucx";
    const DESCRIPTION: &'static str = "ucx_perftest's UCP tests: latency and bandwidth over UCX, on one node or rank 0 to rank 1.";
    const PARAMS: &'static [ParamDoc] = &[
        ParamDoc::new("tests", StringList, "ucx_perftest tests to run.").choices(UCX_TESTS),
        ParamDoc::new("sizes", IntegerList, "Message sizes.")
            .unit("bytes")
            .range(1.0, GIB),
        ParamDoc::new("iters", Integer, "Iterations per test and size.")
            .unit("iterations")
            .range(1.0, 100_000_000.0),
        ParamDoc::new("warmup", Integer, "Untimed iterations.")
            .unit("iterations")
            .range(0.0, 100_000_000.0),
        ParamDoc::new("memory", Str, "Memory the buffers live in.").choices(UCX_MEMORY),
        ParamDoc::new(
            "server_host",
            Str,
            "Address of rank 0 (default: its hostname).",
        ),
    ];

    fn check(&self) -> Result<(), ParamError> {
        if self.tests.is_empty() {
            return Err(ParamError::new("tests", "must not be empty"));
        }
        if self.sizes.is_empty() {
            return Err(ParamError::new("sizes", "must not be empty"));
        }
        Ok(())
    }
}

/// `memcpy`: host memory copy bandwidth; needs no GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MemcpyParams {
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub factor: f64,
    pub iters: u64,
}

impl Default for MemcpyParams {
    fn default() -> Self {
        MemcpyParams {
            min_bytes: 1 << 10,
            max_bytes: 64 << 20,
            factor: 2.0,
            iters: 20,
        }
    }
}

impl KindParams for MemcpyParams {
    const KIND: &'static str = "memcpy";
    const DESCRIPTION: &'static str = "Host memory copy bandwidth over a size sweep; needs no GPU.";
    const PARAMS: &'static [ParamDoc] = &[
        ParamDoc::new("min_bytes", Integer, "Smallest copy.")
            .unit("bytes")
            .range(1.0, GIB),
        ParamDoc::new("max_bytes", Integer, "Largest copy.")
            .unit("bytes")
            .range(1.0, GIB),
        ParamDoc::new("factor", Number, "Size multiplier between steps (> 1).").range(1.0, 1024.0),
        ParamDoc::new("iters", Integer, "Copies per size.")
            .unit("iterations")
            .range(1.0, 1_000_000.0),
    ];

    fn check(&self) -> Result<(), ParamError> {
        if self.max_bytes < self.min_bytes {
            return Err(ParamError::new(
                "max_bytes",
                format!("{} is below min_bytes ({})", self.max_bytes, self.min_bytes),
            ));
        }
        if self.factor <= 1.0 {
            return Err(ParamError::new(
                "factor",
                format!("must be > 1, got {}", self.factor),
            ));
        }
        Ok(())
    }
}

/// `env`: takes no parameters.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvParams {}

impl KindParams for EnvParams {
    const KIND: &'static str = "env";
    const DESCRIPTION: &'static str = "Reports the NCCL/UCX/CUDA variables a test process really gets on the node; measures nothing.";
    const PARAMS: &'static [ParamDoc] = &[];
}

/// `sleep`: waits, reporting progress; exercises cancellation and leases without hardware.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SleepParams {
    pub seconds: f64,
    /// Stops reporting progress after this many seconds while it keeps waiting: a test
    /// that hangs, for trying the agent's stall watch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub silent_after_s: Option<f64>,
}

impl KindParams for SleepParams {
    const KIND: &'static str = "sleep";
    const DESCRIPTION: &'static str =
        "Waits, reporting progress every second; for trying cancellation, leases and timeouts.";
    const PARAMS: &'static [ParamDoc] = &[
        ParamDoc::new("seconds", Number, "How long to wait.")
            .unit("s")
            .range(0.0, 86_400.0)
            .required(),
        ParamDoc::new(
            "silent_after_s",
            Number,
            "Stop reporting progress after this long while still waiting (a test that hangs).",
        )
        .unit("s")
        .range(0.0, 86_400.0),
    ];
}

/// `fail`: fails on purpose, to try failure reporting end to end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FailParams {
    pub exit_code: u64,
    pub message: String,
}

impl Default for FailParams {
    fn default() -> Self {
        FailParams {
            exit_code: 1,
            message: "requested failure".into(),
        }
    }
}

impl KindParams for FailParams {
    const KIND: &'static str = "fail";
    const DESCRIPTION: &'static str = "Fails on purpose with a message and exit code.";
    const PARAMS: &'static [ParamDoc] = &[
        ParamDoc::new("exit_code", Integer, "Exit status of the test.").range(1.0, 255.0),
        ParamDoc::new("message", Str, "What the test writes to stderr."),
    ];
}
