//! NCCL collective names: the one spelling that runs, results, verdicts and expectations
//! store (nccl-tests' binary names without `_perf`), and the aliases people type.
//!
//! Names are normalised once, where a run enters the server, so that a run started as
//! `allreduce` is judged as `nccl.all_reduce` like every other all-reduce.

/// The canonical names, in nccl-tests' order.
pub const COLLECTIVES: [&str; 7] = [
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "alltoall",
    "sendrecv",
];

/// The canonical name of a collective given in any accepted spelling (case, `-` or `_`,
/// `allreduce`, `all2all`, `send_recv`, ...).
pub fn canonical_collective(name: &str) -> Result<&'static str, String> {
    let norm = name.trim().to_ascii_lowercase().replace('-', "_");
    let norm = match norm.as_str() {
        "allreduce" => "all_reduce",
        "allgather" => "all_gather",
        "reducescatter" => "reduce_scatter",
        "all_to_all" | "all2all" => "alltoall",
        "send_recv" => "sendrecv",
        other => other,
    };
    COLLECTIVES.into_iter().find(|c| *c == norm).ok_or_else(|| {
        format!(
            "unknown collective {name:?} (one of {})",
            COLLECTIVES.join(", ")
        )
    })
}

/// busbw / algbw of a collective (canonical name) on `nranks` ranks, from nccl-tests'
/// PERFORMANCE.md: the fraction of the data that must cross the slowest link, so that
/// busbw is comparable with the hardware peak whatever the rank count. 1 for unknown names.
pub fn bus_factor(collective: &str, nranks: u32) -> f64 {
    let n = f64::from(nranks.max(1));
    match collective {
        "all_reduce" => 2.0 * (n - 1.0) / n,
        "all_gather" | "reduce_scatter" | "alltoall" => (n - 1.0) / n,
        _ => 1.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_map_to_one_name() {
        for (given, want) in [
            ("allreduce", "all_reduce"),
            ("All-Reduce", "all_reduce"),
            ("all_reduce", "all_reduce"),
            ("allgather", "all_gather"),
            ("ReduceScatter", "reduce_scatter"),
            ("all2all", "alltoall"),
            ("all_to_all", "alltoall"),
            ("send_recv", "sendrecv"),
            (" broadcast ", "broadcast"),
        ] {
            assert_eq!(canonical_collective(given), Ok(want), "{given}");
        }
        let err = canonical_collective("gather").unwrap_err();
        assert!(err.contains("all_reduce"), "{err}");
    }
}
