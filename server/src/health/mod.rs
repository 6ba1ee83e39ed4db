//! Fleet health: is a measured figure normal? Every stored result is judged against
//! expectations (built-in, plugin-provided, operator-defined), the node's own history and
//! the fleet; the verdict is stored in `verdicts` and read by the API, metrics and
//! investigations.

pub mod expectations;
pub mod verdict;
