//! Property tests of the agent's parsers of what other programs write: NCCL's INFO log,
//! UCX's and perftest's output, NCCL Inspector's logs (here), and sysfs, procfs and the
//! kernel log (`facts/hostile_props.rs`). A test, a job or a broken node writes these, so
//! each parser is fed arbitrary bytes and mutations of real inputs, and must answer
//! without a panic, in bounded time, with an answer bounded by its input (never a copy of
//! a long line per later line).
//!
//! The real inputs are `tests/captures/` and `tests/corpus/<parser>/`; a failing input
//! found here is added to the corpus, where every later run starts from it. Cases per
//! property: [`config`]'s default, or `PROPTEST_CASES`.

mod nccl_log;
mod observe;
mod tools;

pub(crate) use crate::prop_kit::*;
