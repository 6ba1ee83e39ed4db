//! Enrollment token uses back to their tokens: every half [`HOLD`], the blocks of uses this
//! replica took and has held longer than that (`token_uses.rs`); all of them when the
//! server stops, so none is left counted and unused.

use std::sync::Arc;
use std::time::Duration;

use super::Worker;
use crate::state::AppState;
use crate::token_uses::{self, HOLD, TokenUses};

pub struct TokenReturns {
    db: sqlx::PgPool,
    held: Arc<TokenUses>,
}

impl TokenReturns {
    pub fn new(state: &AppState) -> Self {
        TokenReturns {
            db: state.db.clone(),
            held: state.token_uses.clone(),
        }
    }
}

impl Worker for TokenReturns {
    const NAME: &'static str = "token_returns";
    const DRAINS: bool = true;

    fn interval(&self) -> Duration {
        HOLD / 2
    }

    async fn run(&mut self) -> anyhow::Result<()> {
        given_back(token_uses::return_due(&self.db, &self.held, false).await)
    }

    async fn stop(&mut self) -> anyhow::Result<()> {
        given_back(token_uses::return_due(&self.db, &self.held, true).await)
    }
}

/// What could not be given back is kept and tried again by the next run.
fn given_back(kept: usize) -> anyhow::Result<()> {
    if kept > 0 {
        anyhow::bail!("the uses of {kept} enrollment token(s) could not be given back yet");
    }
    Ok(())
}
