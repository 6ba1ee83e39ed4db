//! The pages of one test kind, each named as the kind's module in `heddle_types::kinds`
//! and its runner on the agent: what a result of that kind shows beyond the run page's
//! rows and chart.

pub mod p2p;
pub mod rdma_ab;
pub mod sweep;
