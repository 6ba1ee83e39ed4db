//! `heddle agents`: agents, enrollment tokens, and enrollments waiting for approval.

use clap::Subcommand;
use heddle_types::auth::{
    AgentInfo, EnrollmentTokenCreate, EnrollmentTokenCreated, PendingEnrollment,
};

use crate::client::Client;
use crate::output::print_json;
use crate::table;

#[derive(Subcommand)]
pub enum AgentsCmd {
    /// List agents with their state: online, stale, offline (by heartbeat age) or revoked.
    Ls,
    /// Create an enrollment token and print how to start an agent with it.
    EnrollToken {
        /// Agents that may enroll with it (server default 1).
        #[arg(long)]
        max_uses: Option<u32>,
        /// How long until it expires: 2h, 1d (whole hours; server default 1h).
        #[arg(long, value_parser = crate::args::hours)]
        expires_in: Option<u32>,
        /// The same in hours, as a number (older spelling).
        #[arg(long, hide = true, conflicts_with = "expires_in")]
        expires_in_hours: Option<u32>,
        /// Bind the token to this host name: only that node may enroll with it, and it
        /// replaces the node's live agent without approval (a rebuilt host).
        #[arg(long, value_name = "HOST")]
        node: Option<String>,
        /// A label for the token, e.g. the rack it is for.
        #[arg(long)]
        name: Option<String>,
    },
    /// Revoke an agent: its credential stops working and its jobs are requeued.
    Revoke { id: uuid::Uuid },
    /// Enrollments waiting for approval: a host name that already has a live agent.
    Pending,
    /// Let a waiting enrollment replace the node's live agent.
    Approve { id: uuid::Uuid },
    /// Refuse a waiting enrollment; the node's live agent stays.
    Reject { id: uuid::Uuid },
}

pub async fn run(client: &Client, cmd: AgentsCmd, json: bool, server: &str) -> anyhow::Result<()> {
    match cmd {
        AgentsCmd::Ls => {
            let list: Vec<AgentInfo> = client.get("/api/v1/agents").await?;
            if json {
                return print_json(&list);
            }
            let mut t = table::new(&["ID", "HOSTNAME", "STATE", "VERSION", "LAST HEARTBEAT"]);
            for a in &list {
                t.add_row(vec![
                    a.id.to_string(),
                    a.hostname.clone(),
                    a.state.clone(),
                    table::opt(&a.version),
                    table::ago(a.last_heartbeat_at),
                ]);
            }
            println!("{t}");
        }
        AgentsCmd::EnrollToken {
            max_uses,
            expires_in,
            expires_in_hours,
            node,
            name,
        } => {
            let body = EnrollmentTokenCreate {
                name,
                max_uses,
                expires_in_hours: expires_in.or(expires_in_hours),
                node,
            };
            let t: EnrollmentTokenCreated = client.post("/api/v1/enrollment-tokens", &body).await?;
            if json {
                return print_json(&t);
            }
            match &t.info.node {
                Some(node) => eprintln!(
                    "enrollment token for node {node} only (replaces its agent), expires {}; shown once.",
                    t.info.expires_at
                ),
                None => eprintln!(
                    "enrollment token for {} agent(s), expires {}; shown once.",
                    t.info.max_uses, t.info.expires_at
                ),
            }
            let host = t
                .info
                .node
                .as_ref()
                .map(|n| format!(" --hostname {n}"))
                .unwrap_or_default();
            eprintln!(
                "start an agent with:\n  heddle-agent run --server {server} --enroll-token {}{host} --state-dir /var/lib/heddle-agent",
                t.token
            );
            println!("{}", t.token);
        }
        AgentsCmd::Revoke { id } => {
            client.delete(&format!("/api/v1/agents/{id}")).await?;
            println!("revoked agent {id}");
        }
        AgentsCmd::Pending => {
            let list: Vec<PendingEnrollment> = client.get("/api/v1/agents/pending").await?;
            if json {
                return print_json(&list);
            }
            let mut t = table::new(&[
                "ID",
                "HOSTNAME",
                "STATE",
                "REQUESTED",
                "VERSION",
                "LIVE AGENT",
                "ITS LAST HEARTBEAT",
            ]);
            for p in &list {
                t.add_row(vec![
                    p.id.to_string(),
                    p.hostname.clone(),
                    p.state.clone(),
                    table::ago(Some(p.requested_at)),
                    table::opt(&p.agent_version),
                    table::opt(&p.live_agent_id),
                    table::ago(p.live_agent_last_heartbeat_at),
                ]);
            }
            println!("{t}");
            if !list.is_empty() {
                eprintln!(
                    "approve only an enrollment you expected (a rebuilt host): it replaces the live agent"
                );
            }
        }
        AgentsCmd::Approve { id } => {
            let p: PendingEnrollment = client
                .post_empty(&format!("/api/v1/agents/pending/{id}/approve"))
                .await?;
            if json {
                return print_json(&p);
            }
            println!(
                "approved: the waiting agent on {} gets its credential when it asks next, and replaces the live agent then",
                p.hostname
            );
        }
        AgentsCmd::Reject { id } => {
            let p: PendingEnrollment = client
                .post_empty(&format!("/api/v1/agents/pending/{id}/reject"))
                .await?;
            if json {
                return print_json(&p);
            }
            println!(
                "rejected the enrollment of {}; its live agent stays",
                p.hostname
            );
        }
    }
    Ok(())
}
