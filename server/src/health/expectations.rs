//! Expected figures per test and hardware.
