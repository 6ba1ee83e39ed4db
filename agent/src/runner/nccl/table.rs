//! The nccl-tests table, column for column, so a reader (or a script) used to
//! `all_reduce_perf` output reads ours without a second thought.

use heddle_types::jobs::ResultRow;

const HEADER: &str = "\
#                                                              out-of-place                       in-place          
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       ";

pub fn header() -> &'static str {
    HEADER
}

/// nccl-tests' precision rule: fewer decimals as the time grows.
fn time(us: f64) -> String {
    if us >= 10_000.0 {
        format!("{us:7.0}")
    } else if us >= 100.0 {
        format!("{us:7.1}")
    } else {
        format!("{us:7.2}")
    }
}

fn half(row: Option<&ResultRow>) -> String {
    match row {
        Some(r) => format!(
            "  {}  {:6.2}  {:6.2}  {:>5}",
            time(r.time_us.unwrap_or(0.0)),
            r.algbw_gbs.unwrap_or(0.0),
            r.busbw_gbs.unwrap_or(0.0),
            r.wrong
                .map(|w| w.to_string())
                .unwrap_or_else(|| "N/A".into()),
        ),
        None => format!("  {:>7}  {:>6}  {:>6}  {:>5}", "N/A", "N/A", "N/A", "N/A"),
    }
}

/// One line for a size: the out-of-place row and, when run, the in-place row.
pub fn line(oop: &ResultRow, ip: Option<&ResultRow>) -> String {
    format!(
        "{:12}  {:12}  {:>8}  {:>6}  {:6}{}{}",
        oop.size_bytes,
        oop.count.unwrap_or(0),
        oop.dtype.as_deref().unwrap_or(""),
        oop.extra
            .get("redop")
            .and_then(|v| v.as_str())
            .unwrap_or("none"),
        oop.root.unwrap_or(-1),
        half(Some(oop)),
        half(ip),
    )
}

/// The whole table for rows in emission order (out-of-place, then in-place when present,
/// per size), with nccl-tests' closing lines.
pub fn render(rows: &[ResultRow]) -> String {
    let mut out = String::from(HEADER);
    out.push('\n');
    let mut i = 0;
    let mut busbw_sum = 0.0;
    let mut n = 0;
    let mut wrong = 0;
    while i < rows.len() {
        let oop = &rows[i];
        let ip = rows
            .get(i + 1)
            .filter(|r| r.in_place == Some(true) && r.size_bytes == oop.size_bytes);
        out.push_str(&line(oop, ip));
        out.push('\n');
        for r in std::iter::once(oop).chain(ip) {
            busbw_sum += r.busbw_gbs.unwrap_or(0.0);
            n += 1;
            wrong += r.wrong.unwrap_or(0);
        }
        i += 1 + usize::from(ip.is_some());
    }
    out.push_str(&format!(
        "# Out of bounds values : {wrong} {}\n",
        if wrong == 0 { "OK" } else { "FAILED" }
    ));
    out.push_str(&format!(
        "# Avg bus bandwidth    : {:.4} \n",
        if n > 0 { busbw_sum / n as f64 } else { 0.0 }
    ));
    out
}
