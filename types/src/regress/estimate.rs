//! Robust estimates the detector rests on: medians, the noise scale of a series and the
//! Hodges–Lehmann shift between two samples with its distribution-free confidence interval.

/// The two-sided 95 % quantile of the standard normal distribution.
pub const Z_95: f64 = 1.959_963_984_540_054;

/// Scale factor that makes a median absolute deviation estimate a normal standard deviation.
const MAD_TO_SD: f64 = 1.482_6;

/// The median of finite values (`None` when there are none). Sorts a copy.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(median_sorted(&v))
}

/// The median of a sorted, non-empty slice.
pub fn median_sorted(v: &[f64]) -> f64 {
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        // Halves first: the sum of two large values would overflow.
        v[n / 2 - 1] / 2.0 + v[n / 2] / 2.0
    }
}

/// The noise's standard deviation, robust to level shifts and outliers: the median absolute
/// deviation of first differences, scaled to a normal standard deviation and divided by √2
/// (a difference of two independent points has twice the variance of one). A shift moves
/// only one difference, an outlier two.
pub fn noise_sd(values: &[f64]) -> f64 {
    if values.len() < 3 {
        return 0.0;
    }
    let diffs: Vec<f64> = values.windows(2).map(|w| w[1] - w[0]).collect();
    let Some(m) = median(&diffs) else {
        return 0.0;
    };
    let dev: Vec<f64> = diffs.iter().map(|d| (d - m).abs()).collect();
    median(&dev).map_or(0.0, |mad| MAD_TO_SD * mad / std::f64::consts::SQRT_2)
}

/// The Hodges–Lehmann estimate of how much `after` is shifted from `before` (the median of
/// every pairwise difference `after[j] - before[i]`) and its confidence interval by
/// inverting the Mann–Whitney test (Lehmann 1963; Hollander & Wolfe, *Nonparametric
/// Statistical Methods*, §4.3), with the normal approximation of the U statistic's
/// critical value at `z`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shift {
    pub estimate: f64,
    pub low: f64,
    pub high: f64,
}

pub fn hodges_lehmann(before: &[f64], after: &[f64], z: f64) -> Option<Shift> {
    let (n1, n2) = (before.len(), after.len());
    if n1 == 0 || n2 == 0 {
        return None;
    }
    let mut d: Vec<f64> = Vec::with_capacity(n1 * n2);
    for a in after {
        for b in before {
            d.push(a - b);
        }
    }
    if d.iter().any(|x| !x.is_finite()) {
        return None;
    }
    d.sort_by(f64::total_cmp);
    let m = (n1 * n2) as f64;
    let sd = (m * (n1 + n2 + 1) as f64 / 12.0).sqrt();
    // The number of differences cut from each end: C = floor(n1 n2 / 2 - z sd), at least 0;
    // the interval is [d(C+1), d(n1 n2 - C)] in 1-based order statistics.
    let c = (m / 2.0 - z * sd).floor().max(0.0) as usize;
    let c = c.min((d.len() - 1) / 2);
    Some(Shift {
        estimate: median_sorted(&d),
        low: d[c],
        high: d[d.len() - 1 - c],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_of_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[f64::NAN]), None);
        assert_eq!(median(&[f64::MAX, f64::MAX]), Some(f64::MAX));
    }

    #[test]
    fn noise_sd_ignores_one_shift_and_one_outlier() {
        let mut v: Vec<f64> = (0..60u64)
            .map(|i| 100.0 + ((i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) % 100) as f64 / 50.0)
            .collect();
        let clean = noise_sd(&v);
        assert!(clean > 0.3 && clean < 1.0, "{clean}");
        for x in &mut v[30..] {
            *x -= 30.0;
        }
        v[5] = 0.0;
        assert!(
            (noise_sd(&v) - clean).abs() < 0.15 * clean,
            "{} {clean}",
            noise_sd(&v)
        );
    }

    #[test]
    fn hodges_lehmann_of_a_clean_shift_brackets_it() {
        let before: Vec<f64> = (0..20).map(|i| 100.0 + f64::from(i % 5)).collect();
        let after: Vec<f64> = before.iter().map(|x| x - 7.0).collect();
        let s = hodges_lehmann(&before, &after, Z_95).unwrap();
        assert_eq!(s.estimate, -7.0);
        assert!(s.low <= -7.0 && s.high >= -7.0 && s.high < 0.0, "{s:?}");
    }

    #[test]
    fn hodges_lehmann_of_tiny_samples_spans_everything() {
        let s = hodges_lehmann(&[1.0], &[2.0, 3.0], Z_95).unwrap();
        assert_eq!((s.low, s.high), (1.0, 2.0));
        assert!(hodges_lehmann(&[], &[1.0], Z_95).is_none());
    }
}
