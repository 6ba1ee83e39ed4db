//! What the parent tells a test child (stdin) and what the child tells back (stdout).
//!
//! The parent writes one [`ChildInput`] JSON document on the child's stdin and closes it.
//! The child writes one [`ChildEvent`] JSON object per line on stdout and free-form text on
//! stderr (whose tail ends up in the result). The exit status carries the verdict: 0 is
//! success (or a skip, when a `skipped` event was sent), anything else is a failure.

use std::io::Write;

use heddle_types::jobs::{Progress, ResultRow};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Everything a child needs to run one test; the job's `env` is already in its
/// environment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChildInput {
    pub kind: String,
    #[serde(default)]
    pub params: serde_json::Value,
    pub job_id: Uuid,
    pub run_id: Uuid,
    pub rank: i32,
    pub world_size: i32,
    /// How a multi-node test meets its peers through the server. It travels here, on the
    /// child's stdin, and never in an environment variable: whatever the test starts
    /// (`ucx_perftest`, `ib_write_bw`...) inherits the environment, not this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rendezvous: Option<RendezvousAccess>,
}

/// The server replicas, this agent's credential and what it trusts for TLS, for the
/// rendezvous calls of one job.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct RendezvousAccess {
    pub servers: Vec<String>,
    pub credential: String,
    /// The agent's `--ca-file`.
    #[serde(default)]
    pub ca_file: Option<std::path::PathBuf>,
    /// The agent's `--pin-sha256` values (`sha256//<base64>`).
    #[serde(default)]
    pub pins: Vec<String>,
    /// Prefixes every rendezvous name of the test (`<scope>.<name>`), so one job can run
    /// the same test twice (the legs of `rdma_ab`) without meeting its first run's blobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
}

/// Never prints the credential (inputs end up in logs and panic messages).
impl std::fmt::Debug for RendezvousAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RendezvousAccess")
            .field("servers", &self.servers)
            .field("credential", &"<redacted>")
            .field("ca_file", &self.ca_file)
            .field("pins", &self.pins)
            .field("scope", &self.scope)
            .finish()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum ChildEvent {
    /// Forwarded to the server with the next lease renewal.
    Progress(Progress),
    /// One measured row of the result.
    Row { row: ResultRow },
    /// Keys merged into the result's `summary` (later keys win).
    Summary {
        summary: serde_json::Map<String, serde_json::Value>,
    },
    /// The node cannot run this test; with exit status 0 the outcome is `skipped`.
    Skipped { reason: String },
    /// What the test is about to do: its message sizes in order and how long its slowest
    /// step (communicator set-up included) may take. The parent arms its stall watch with
    /// it, and names the size a stalled test stopped at.
    Plan {
        sizes_bytes: Vec<i64>,
        slowest_step_s: f64,
    },
}

/// Writes events as JSON lines, flushed one by one so the parent sees progress at once.
pub struct Emitter<W: Write> {
    out: W,
}

impl<W: Write> Emitter<W> {
    pub fn new(out: W) -> Self {
        Emitter { out }
    }

    pub fn emit(&mut self, event: &ChildEvent) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(event).expect("child events always serialize");
        line.push(b'\n');
        self.out.write_all(&line)?;
        self.out.flush()
    }

    pub fn progress(
        &mut self,
        fraction: Option<f64>,
        message: impl Into<String>,
    ) -> std::io::Result<()> {
        self.emit(&ChildEvent::Progress(Progress {
            fraction,
            message: message.into(),
        }))
    }

    pub fn row(&mut self, row: ResultRow) -> std::io::Result<()> {
        self.emit(&ChildEvent::Row { row })
    }

    pub fn into_inner(self) -> W {
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_json_lines_that_parse_back() {
        let mut em = Emitter::new(Vec::new());
        em.progress(Some(0.5), "half").unwrap();
        em.emit(&ChildEvent::Skipped {
            reason: "no GPU".into(),
        })
        .unwrap();
        let text = String::from_utf8(em.into_inner()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            r#"{"event":"progress","fraction":0.5,"message":"half"}"#
        );
        let back: ChildEvent = serde_json::from_str(lines[1]).unwrap();
        assert_eq!(
            back,
            ChildEvent::Skipped {
                reason: "no GPU".into()
            }
        );
    }

    #[test]
    fn the_credential_is_not_in_debug_output() {
        let a = RendezvousAccess {
            servers: vec!["http://s:1".into()],
            credential: "hda_secret".into(),
            ca_file: None,
            pins: Vec::new(),
            scope: None,
        };
        assert!(!format!("{a:?}").contains("hda_secret"));
    }

    #[test]
    fn row_event_round_trips() {
        let line = r#"{"event":"row","row":{"size_bytes":1024,"time_us":2.0,"algbw_gbs":0.512}}"#;
        let ev: ChildEvent = serde_json::from_str(line).unwrap();
        match ev {
            ChildEvent::Row { row } => {
                assert_eq!(row.size_bytes, 1024);
                assert_eq!(row.algbw_gbs, Some(0.512));
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}
