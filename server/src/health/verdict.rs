//! Verdicts on stored results.
