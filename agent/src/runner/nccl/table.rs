//! The nccl-tests table, column for column, so a reader (or a script) used to
//! `all_reduce_perf` output reads ours without a second thought. The format strings are
//! those of nccl-tests 2.19.6 (`src/util.cu`: `writeResultHeader`,
//! `writeBenchmarkLinePreamble`, `writeBenchmarkLineBody`, `getFloatStr`,
//! `writeResultFooter`).

use heddle_types::jobs::ResultRow;

const HEADER: &str = "\
#                                                              out-of-place                       in-place          
#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong 
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)         ";

pub fn header() -> &'static str {
    HEADER
}

/// nccl-tests' `getFloatStr`: two decimals when they fit in `width`, else one, else none,
/// else exponent notation.
pub fn float(value: f64, width: usize) -> String {
    for prec in [2, 1, 0] {
        let s = format!("{value:width$.prec$}");
        if s.len() <= width {
            return s;
        }
    }
    let prec = if width >= 7 { 1 } else { 0 };
    c_exp(value, prec, width)
}

/// C's `%*.{prec}e`: the exponent has a sign and at least two digits.
fn c_exp(value: f64, prec: usize, width: usize) -> String {
    let s = format!("{value:.prec$e}");
    let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let sign = if exp < 0 { '-' } else { '+' };
    format!("{:>width$}", format!("{mantissa}e{sign}{:02}", exp.abs()))
}

/// C's `%g` (six significant digits, trailing zeros dropped), as nccl-tests prints the
/// wrong-element count and the average bus bandwidth.
pub fn g(value: f64) -> String {
    if value == 0.0 || !value.is_finite() {
        return if value.is_nan() {
            "nan".into()
        } else if value.is_infinite() {
            if value > 0.0 { "inf" } else { "-inf" }.into()
        } else {
            "0".into()
        };
    }
    let exp = value.abs().log10().floor() as i32;
    let trim = |s: String| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    };
    if (-4..6).contains(&exp) {
        let prec = (5 - exp).max(0) as usize;
        let s = trim(format!("{value:.prec$}"));
        // Rounding may carry into a seventh digit (999999.5): then it is exponent form.
        if s.trim_start_matches('-')
            .split('.')
            .next()
            .unwrap_or("")
            .len()
            <= 6
        {
            return s;
        }
    }
    let s = format!("{value:.5e}");
    let (mantissa, e) = s.split_once('e').unwrap_or((&s, "0"));
    let e: i32 = e.parse().unwrap_or(0);
    let sign = if e < 0 { '-' } else { '+' };
    format!("{}e{sign}{:02}", trim(mantissa.to_string()), e.abs())
}

fn half(row: Option<&ResultRow>) -> String {
    match row {
        Some(r) => {
            let body = format!(
                "  {:>7}  {:>6}  {:>6}",
                float(r.time_us.unwrap_or(0.0), 7),
                float(r.algbw_gbs.unwrap_or(0.0), 6),
                float(r.busbw_gbs.unwrap_or(0.0), 6),
            );
            match r.wrong {
                Some(w) => format!("{body}  {:>6}", g(w as f64)),
                // nccl-tests without validation (`-c 0`).
                None => format!("{body}    N/A"),
            }
        }
        None => format!("  {:>7}  {:>6}  {:>6}    N/A", "N/A", "N/A", "N/A"),
    }
}

/// The redop column: the reduction op for the collectives nccl-tests passes it to
/// (all_reduce, reduce, reduce_scatter and sendrecv), `none` for the others.
fn redop(r: &ResultRow) -> &str {
    r.extra
        .get("redop")
        .and_then(|v| v.as_str())
        .unwrap_or("none")
}

/// One line for a size: the out-of-place row and, when run, the in-place row.
pub fn line(oop: &ResultRow, ip: Option<&ResultRow>) -> String {
    format!(
        "{:12}  {:12}  {:>8}  {:>6}  {:6}{}{}",
        oop.size_bytes,
        oop.count.unwrap_or(0),
        oop.dtype.as_deref().unwrap_or(""),
        redop(oop),
        oop.root.unwrap_or(-1),
        half(Some(oop)),
        half(ip),
    )
}

/// nccl-tests' closing figures: the wrong elements of every row and the mean busbw.
pub fn closing(rows: &[ResultRow]) -> String {
    let wrong: i64 = rows.iter().filter_map(|r| r.wrong).sum();
    let busbw: Vec<f64> = rows.iter().map(|r| r.busbw_gbs.unwrap_or(0.0)).collect();
    let avg = busbw.iter().sum::<f64>() / busbw.len().max(1) as f64;
    format!(
        "# {:<20} : {wrong} {}\n# {:<20} : {} \n",
        "Out of bounds values",
        if wrong == 0 { "OK" } else { "FAILED" },
        "Avg bus bandwidth",
        g(avg)
    )
}

/// The whole table for rows in emission order (out-of-place, then in-place when present,
/// per size), with nccl-tests' closing lines.
pub fn render(rows: &[ResultRow]) -> String {
    let mut out = String::from(HEADER);
    out.push('\n');
    let mut i = 0;
    while i < rows.len() {
        let oop = &rows[i];
        let ip = rows
            .get(i + 1)
            .filter(|r| r.in_place == Some(true) && r.size_bytes == oop.size_bytes);
        out.push_str(&line(oop, ip));
        out.push('\n');
        i += 1 + usize::from(ip.is_some());
    }
    out.push_str(&closing(rows));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_follow_get_float_str() {
        assert_eq!(float(4.96, 7), "   4.96");
        assert_eq!(float(9999.99, 7), "9999.99");
        assert_eq!(float(10000.0, 7), "10000.0");
        assert_eq!(float(123456.7, 7), " 123457");
        assert_eq!(float(12345678.0, 7), "1.2e+07");
        assert_eq!(float(374.42, 6), "374.42");
        assert_eq!(float(1234.56, 6), "1234.6");
        assert_eq!(float(0.0, 6), "  0.00");
    }

    #[test]
    fn g_is_c_percent_g() {
        for (v, s) in [
            (0.0, "0"),
            (1.0, "1"),
            (47.44675, "47.4468"),
            (123.456789, "123.457"),
            (0.0001234, "0.0001234"),
            (0.00001234, "1.234e-05"),
            (1234567.0, "1.23457e+06"),
            (999999.5, "1e+06"),
            (100.0, "100"),
        ] {
            assert_eq!(g(v), s, "{v}");
        }
    }
}
