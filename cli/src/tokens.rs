//! `heddle tokens`: API tokens.

use clap::Subcommand;
use heddle_types::auth::{Role, TokenCreate, TokenCreated, TokenInfo};

use crate::client::Client;
use crate::output::print_json;
use crate::table;

#[derive(Subcommand)]
pub enum TokensCmd {
    /// Create a token; the secret is printed once.
    Create {
        #[arg(long)]
        name: String,
        #[arg(long)]
        role: Role,
        /// How long until the token stops working: 30d, 12w (default: never).
        #[arg(long, value_parser = crate::args::days)]
        expires_in: Option<u32>,
        /// The same in days, as a number (older spelling).
        #[arg(long, hide = true, conflicts_with = "expires_in")]
        expires_in_days: Option<u32>,
    },
    Ls,
    Revoke {
        id: uuid::Uuid,
    },
}

pub async fn run(client: &Client, cmd: TokensCmd, json: bool) -> anyhow::Result<()> {
    match cmd {
        TokensCmd::Create {
            name,
            role,
            expires_in,
            expires_in_days,
        } => {
            let body = TokenCreate {
                name,
                role,
                expires_in_days: expires_in.or(expires_in_days),
            };
            let t: TokenCreated = client.post("/api/v1/tokens", &body).await?;
            if json {
                print_json(&t)?;
            } else {
                eprintln!(
                    "created {} token {:?}; it is shown once:",
                    t.info.role, t.info.name
                );
                println!("{}", t.token);
            }
        }
        TokensCmd::Ls => {
            let list: Vec<TokenInfo> = client.get("/api/v1/tokens").await?;
            if json {
                return print_json(&list);
            }
            let mut t = table::new(&["ID", "NAME", "ROLE", "LAST USED", "EXPIRES", "REVOKED"]);
            for k in &list {
                t.add_row(vec![
                    k.id.to_string(),
                    k.name.clone(),
                    k.role.to_string(),
                    table::ago(k.last_used_at),
                    table::opt(&k.expires_at),
                    table::opt(&k.revoked_at),
                ]);
            }
            println!("{t}");
        }
        TokensCmd::Revoke { id } => {
            client.delete(&format!("/api/v1/tokens/{id}")).await?;
            println!("revoked token {id}");
        }
    }
    Ok(())
}
