//! The exit codes of every command, in one table: what a script or a job launcher reads.
//! 1 and 2 say what was found (a failed test, a warning); 3 and up say why nothing could
//! be found out, so a launcher can tell a bad node from a server it cannot reach.

use std::process::ExitCode;

use heddle_types::health::Verdict;
use reqwest::StatusCode;

use crate::client::ClientError;

/// What `heddle --help` prints under the options.
pub const HELP: &str = "\
Exit codes:
  0  success; a test passed, a pre-flight said PASS, an investigation found no culprit
  1  a test failed or was judged FAIL; an investigation named a culprit; a plugin failed
  2  warning: a result or a pre-flight judged WARN
  3  the server cannot be reached (connection, DNS, TLS, or a gateway's 502/503/504)
  4  authentication or authorization refused (401, 403)
  5  usage: bad arguments or input files, or a request the server refused (400, 404,
     409, 422...)
  6  the server failed (500) or gave an answer that cannot be read
  7  no verdict: a run was cancelled, a verdict is unknown, an investigation was
     inconclusive, pre-flight checks did not finish in time";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Success,
    Failed,
    Warning,
    Unreachable,
    Auth,
    Usage,
    Server,
    Undecided,
}

impl Exit {
    pub const fn code(self) -> u8 {
        match self {
            Exit::Success => 0,
            Exit::Failed => 1,
            Exit::Warning => 2,
            Exit::Unreachable => 3,
            Exit::Auth => 4,
            Exit::Usage => 5,
            Exit::Server => 6,
            Exit::Undecided => 7,
        }
    }

    pub fn of_verdict(v: Verdict) -> Exit {
        match v {
            Verdict::Pass => Exit::Success,
            Verdict::Warn => Exit::Warning,
            Verdict::Fail => Exit::Failed,
            Verdict::Unknown => Exit::Undecided,
        }
    }

    /// The worst of the verdicts on a test's results, where an unknown verdict (nothing
    /// to compare with yet) does not fail a test that ran.
    pub fn of_results(verdicts: impl IntoIterator<Item = Verdict>) -> Exit {
        let mut exit = Exit::Success;
        for v in verdicts {
            match v {
                Verdict::Fail => return Exit::Failed,
                Verdict::Warn => exit = Exit::Warning,
                Verdict::Pass | Verdict::Unknown => {}
            }
        }
        exit
    }

    pub fn of_client_error(err: &ClientError) -> Exit {
        match err {
            ClientError::Unreachable { .. } | ClientError::Tls(_) | ClientError::Build(_) => {
                Exit::Unreachable
            }
            ClientError::Api { status, .. } => Exit::of_status(*status),
            ClientError::Unexpected { status, .. } if status.is_success() => Exit::Server,
            ClientError::Unexpected { status, .. } => Exit::of_status(*status),
            ClientError::Encode(_) => Exit::Usage,
        }
    }

    fn of_status(status: StatusCode) -> Exit {
        match status.as_u16() {
            401 | 403 => Exit::Auth,
            502..=504 => Exit::Unreachable,
            400..=499 => Exit::Usage,
            _ => Exit::Server,
        }
    }

    /// An error that ended a command: the first API error in its chain decides; anything
    /// else went wrong with what was given (a file, a flag).
    pub fn of_error(err: &anyhow::Error) -> Exit {
        err.chain()
            .find_map(|e| e.downcast_ref::<ClientError>())
            .map_or(Exit::Usage, Exit::of_client_error)
    }
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> ExitCode {
        ExitCode::from(e.code())
    }
}

/// A mistake in the arguments found after clap parsed them (exit code 5).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    fn api(status: u16) -> ClientError {
        ClientError::Api {
            status: StatusCode::from_u16(status).unwrap(),
            code: "x".into(),
            message: "y".into(),
        }
    }

    #[test]
    fn errors_map_to_distinct_codes() {
        let unreachable = ClientError::Unreachable {
            url: "http://127.0.0.1:9".into(),
            detail: "connection refused".into(),
        };
        assert_eq!(Exit::of_client_error(&unreachable), Exit::Unreachable);
        for (status, want) in [
            (401, Exit::Auth),
            (403, Exit::Auth),
            (400, Exit::Usage),
            (404, Exit::Usage),
            (409, Exit::Usage),
            (422, Exit::Usage),
            (500, Exit::Server),
            (502, Exit::Unreachable),
            (503, Exit::Unreachable),
            (504, Exit::Unreachable),
        ] {
            assert_eq!(Exit::of_client_error(&api(status)), want, "{status}");
        }
        let garbled = ClientError::Unexpected {
            status: StatusCode::OK,
            body: "<html>".into(),
        };
        assert_eq!(Exit::of_client_error(&garbled), Exit::Server);
        let proxy = ClientError::Unexpected {
            status: StatusCode::FORBIDDEN,
            body: "<html>".into(),
        };
        assert_eq!(Exit::of_client_error(&proxy), Exit::Auth);
    }

    #[test]
    fn the_api_error_in_a_chain_decides() {
        let err = anyhow::Error::new(api(401)).context("fetching the run");
        assert_eq!(Exit::of_error(&err), Exit::Auth);
        let local = anyhow::anyhow!("reading plugin.wasm: no such file");
        assert_eq!(Exit::of_error(&local), Exit::Usage);
    }

    #[test]
    fn verdicts_and_results() {
        assert_eq!(Exit::of_verdict(Verdict::Pass).code(), 0);
        assert_eq!(Exit::of_verdict(Verdict::Fail).code(), 1);
        assert_eq!(Exit::of_verdict(Verdict::Warn).code(), 2);
        assert_eq!(Exit::of_verdict(Verdict::Unknown).code(), 7);
        use Verdict::*;
        assert_eq!(Exit::of_results([]), Exit::Success);
        assert_eq!(Exit::of_results([Pass, Unknown]), Exit::Success);
        assert_eq!(Exit::of_results([Pass, Warn, Unknown]), Exit::Warning);
        assert_eq!(Exit::of_results([Warn, Fail, Pass]), Exit::Failed);
    }

    #[test]
    fn codes_are_distinct_and_documented() {
        let all = [
            Exit::Success,
            Exit::Failed,
            Exit::Warning,
            Exit::Unreachable,
            Exit::Auth,
            Exit::Usage,
            Exit::Server,
            Exit::Undecided,
        ];
        let mut codes: Vec<u8> = all.iter().map(|e| e.code()).collect();
        codes.dedup();
        assert_eq!(codes.len(), all.len());
        for c in codes {
            assert!(
                HELP.contains(&format!("\n  {c}  ")),
                "{c} is not in the help"
            );
        }
    }
}
