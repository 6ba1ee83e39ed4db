//! Which node or link is bad, from a square matrix of a bandwidth figure. The same function
//! reads the node×node matrix of an investigation and the GPU×GPU matrix of a `p2p` result.
//!
//! A node is bad when at least half of its pairs (both, when it has two) are below
//! `threshold` × the median of the pairs that do not involve it. Nodes are named one at a
//! time, worst first, and a named node's pairs leave the comparison, so two bad nodes do
//! not hide each other; never more than `(n − 1) / 2` nodes are named, since when most
//! nodes are "low" the few fast ones are the odd ones out. A link is bad when its figure
//! (its lowest direction) is below `threshold` × the median of the remaining pairs while
//! both its ends are fine in their other pairs.

use heddle_types::investigations::{
    Analysis, Conclusion, Culprit, CulpritKind, Matrix, PairFigure,
};

/// What a row and a pair are called in sentences.
#[derive(Debug, Clone, Copy)]
pub struct Nouns {
    pub node: &'static str,
    pub link: &'static str,
}

pub const NODES: Nouns = Nouns {
    node: "node",
    link: "link",
};
pub const GPUS: Nouns = Nouns {
    node: "GPU",
    link: "GPU pair",
};

fn cell(m: &Matrix, i: usize, j: usize) -> Option<f64> {
    m.values
        .get(i)?
        .get(j)
        .copied()
        .flatten()
        .filter(|v| v.is_finite())
}

pub fn median(values: &[f64]) -> Option<f64> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// The higher middle value: below a threshold only when at least half the values are.
fn upper_median(values: &[f64]) -> Option<f64> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

/// Every off-diagonal figure between members.
fn entries(m: &Matrix, member: &[bool]) -> Vec<f64> {
    let n = member.len();
    (0..n)
        .flat_map(|i| (0..n).map(move |j| (i, j)))
        .filter(|&(i, j)| i != j && member[i] && member[j])
        .filter_map(|(i, j)| cell(m, i, j))
        .collect()
}

/// Figures of `i` with the other members (both directions), leaving out `except`.
fn row(m: &Matrix, i: usize, member: &[bool], except: Option<usize>) -> Vec<f64> {
    (0..member.len())
        .filter(|&j| j != i && member[j] && Some(j) != except)
        .flat_map(|j| [cell(m, i, j), cell(m, j, i)])
        .flatten()
        .collect()
}

/// The figures between `i` and `j`: `i → j`, and `j → i` when it says something else.
fn pair_figures(m: &Matrix, i: usize, j: usize) -> Vec<PairFigure> {
    let fig = |a: usize, b: usize, value| PairFigure {
        from: m.labels[a].clone(),
        to: m.labels[b].clone(),
        value,
    };
    let (ij, ji) = (cell(m, i, j), cell(m, j, i));
    let mut out: Vec<PairFigure> = ij.map(|v| fig(i, j, v)).into_iter().collect();
    if let Some(v) = ji.filter(|v| Some(*v) != ij) {
        out.push(fig(j, i, v));
    }
    out
}

fn gbs(v: f64) -> String {
    format!("{v:.1} GB/s")
}

fn pct(ratio: f64) -> String {
    format!("{:.0}%", ratio * 100.0)
}

/// Names the culprits of a square matrix. `threshold` is a fraction in (0, 1).
pub fn analyse(m: &Matrix, threshold: f64, nouns: Nouns) -> Analysis {
    let n = m.labels.len();
    let all = vec![true; n];
    let median_all = median(&entries(m, &all));
    let missing: Vec<[String; 2]> = (0..n)
        .flat_map(|i| (i + 1..n).map(move |j| (i, j)))
        .filter(|&(i, j)| cell(m, i, j).is_none() && cell(m, j, i).is_none())
        .map(|(i, j)| [m.labels[i].clone(), m.labels[j].clone()])
        .collect();
    let mut culprits = Vec::new();
    let mut member = all.clone();
    find_nodes(m, threshold, nouns, &mut member, &mut culprits);
    find_links(m, threshold, nouns, &member, &mut culprits);
    let pairs_total = n * n.saturating_sub(1) / 2;
    let verdict_of = |verdict, summary: String| Analysis {
        verdict,
        culprits: culprits.clone(),
        median: median_all,
        threshold,
        missing: missing.clone(),
        summary,
    };
    let named: Vec<&str> = culprits.iter().map(|c| c.explanation.as_str()).collect();
    if n < 2 {
        return verdict_of(
            Conclusion::Inconclusive,
            format!("{n} {}(s): there is no pair to measure", nouns.node),
        );
    }
    if median_all.is_none() {
        return verdict_of(
            Conclusion::Inconclusive,
            format!("none of the {pairs_total} pair(s) produced a figure"),
        );
    }
    if !missing.is_empty() {
        let list: Vec<String> = missing.iter().map(|[a, b]| format!("{a}–{b}")).collect();
        let mut s = format!(
            "{} of {pairs_total} pair(s) have no figure ({})",
            missing.len(),
            list.join(", ")
        );
        for label in &m.labels {
            let mine = missing.iter().filter(|p| p.contains(label)).count();
            if n > 2 && mine == n - 1 {
                s.push_str(&format!(
                    "; every pair of {} {label} failed, which points at it",
                    nouns.node
                ));
            }
        }
        if !named.is_empty() {
            s.push_str(&format!("; among the measured pairs: {}", named.join("; ")));
        }
        return verdict_of(Conclusion::Inconclusive, s);
    }
    if n == 2 {
        let v = median_all.unwrap_or_default();
        return verdict_of(
            Conclusion::Inconclusive,
            format!(
                "two {}s give one pair ({}); there is nothing to compare it with: add a {} known to be good",
                nouns.node,
                gbs(v),
                nouns.node
            ),
        );
    }
    if !culprits.is_empty() {
        return verdict_of(Conclusion::Culprit, named.join("; "));
    }
    let med = median_all.unwrap_or_default();
    let ((lo, lo_at), (hi, hi_at)) = (extreme(m, true), extreme(m, false));
    // Uniform: nothing far below the median, and nothing far above it either (a few fast
    // pairs among slow ones are as telling as the reverse).
    if lo < threshold * med || hi * threshold > med {
        return verdict_of(
            Conclusion::Inconclusive,
            format!(
                "the figures vary (lowest {} at {lo_at}, highest {} at {hi_at}, median {}) but no single {} or {} explains it",
                gbs(lo),
                gbs(hi),
                gbs(med),
                nouns.node,
                nouns.link
            ),
        );
    }
    verdict_of(
        Conclusion::NoCulprit,
        format!(
            "no culprit found: all {pairs_total} pairs are between {} ({lo_at}) and {} ({hi_at}), median {}",
            gbs(lo),
            gbs(hi),
            gbs(med)
        ),
    )
}

/// The lowest (or highest) off-diagonal figure and where it is.
fn extreme(m: &Matrix, lowest: bool) -> (f64, String) {
    let n = m.labels.len();
    let mut best: Option<(f64, String)> = None;
    for i in 0..n {
        for j in (0..n).filter(|&j| j != i) {
            if let Some(v) = cell(m, i, j)
                && best
                    .as_ref()
                    .is_none_or(|(b, _)| if lowest { v < *b } else { v > *b })
            {
                best = Some((v, format!("{}–{}", m.labels[i], m.labels[j])));
            }
        }
    }
    best.unwrap_or((0.0, String::new()))
}

fn find_nodes(
    m: &Matrix,
    threshold: f64,
    nouns: Nouns,
    member: &mut [bool],
    out: &mut Vec<Culprit>,
) {
    let n = member.len();
    let max_named = n.saturating_sub(1) / 2;
    let mut named = 0;
    while named < max_named {
        let mut worst: Option<(usize, f64, f64)> = None;
        for i in (0..n).filter(|&i| member[i]) {
            let r = row(m, i, member, None);
            let mut others = member.to_vec();
            others[i] = false;
            let (Some(fig), Some(med)) = (upper_median(&r), median(&entries(m, &others))) else {
                continue;
            };
            if med <= 0.0 {
                continue;
            }
            if worst.is_none_or(|(_, f, md)| fig / med < f / md) {
                worst = Some((i, fig, med));
            }
        }
        let Some((i, fig, med)) = worst.filter(|&(_, f, md)| f < threshold * md) else {
            break;
        };
        let figures: Vec<PairFigure> = (0..n)
            .filter(|&j| j != i)
            .flat_map(|j| pair_figures(m, i, j))
            .collect();
        let low = figures.iter().filter(|f| f.value < threshold * med).count();
        let label = &m.labels[i];
        out.push(Culprit {
            kind: CulpritKind::Node,
            members: vec![label.clone()],
            figure: fig,
            median: med,
            ratio: fig / med,
            explanation: format!(
                "{} {label} is bad: {low} of its {} figures are below {} of the median {} of the pairs without it (its median {})",
                nouns.node,
                figures.len(),
                pct(threshold),
                gbs(med),
                gbs(fig)
            ),
            figures,
        });
        member[i] = false;
        named += 1;
    }
}

fn find_links(m: &Matrix, threshold: f64, nouns: Nouns, member: &[bool], out: &mut Vec<Culprit>) {
    let n = member.len();
    let Some(med) = median(&entries(m, member)).filter(|v| *v > 0.0) else {
        return;
    };
    for i in (0..n).filter(|&i| member[i]) {
        for j in (i + 1..n).filter(|&j| member[j]) {
            let figures = pair_figures(m, i, j);
            let Some(low) = figures.iter().map(|f| f.value).min_by(f64::total_cmp) else {
                continue;
            };
            if low >= threshold * med {
                continue;
            }
            // Both ends must be fine without this pair, else it is not the link alone.
            let fine = |x: usize, partner: usize| {
                upper_median(&row(m, x, member, Some(partner)))
                    .is_some_and(|v| v >= threshold * med)
            };
            if !(fine(i, j) && fine(j, i)) {
                continue;
            }
            let (a, b) = (&m.labels[i], &m.labels[j]);
            out.push(Culprit {
                kind: CulpritKind::Link,
                members: vec![a.clone(), b.clone()],
                figure: low,
                median: med,
                ratio: low / med,
                explanation: format!(
                    "{} {a}–{b} is bad: {} is below {} of the median {} while both ends are fine in their other pairs",
                    nouns.link,
                    gbs(low),
                    pct(threshold),
                    gbs(med)
                ),
                figures,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A symmetric node matrix with `good` everywhere, then the given overrides.
    fn nodes(n: usize, good: f64, set: &[(usize, usize, Option<f64>)]) -> Matrix {
        let mut values = vec![vec![None; n]; n];
        for (i, row) in values.iter_mut().enumerate() {
            for (j, v) in row.iter_mut().enumerate() {
                if i != j {
                    // A little noise, so nothing relies on exact ties.
                    *v = Some(good * (1.0 + 0.01 * ((i + j + i * j) % 5) as f64));
                }
            }
        }
        for &(i, j, v) in set {
            values[i][j] = v;
            values[j][i] = v;
        }
        Matrix {
            labels: (0..n).map(|i| format!("n{i}")).collect(),
            metric: "busbw_gbs".into(),
            unit: "GB/s".into(),
            values,
        }
    }

    /// Every pair of `bad` at `v`.
    fn bad_node(n: usize, bad: usize, v: f64) -> Vec<(usize, usize, Option<f64>)> {
        (0..n)
            .filter(|&j| j != bad)
            .map(|j| (bad, j, Some(v)))
            .collect()
    }

    fn members(a: &Analysis) -> Vec<(CulpritKind, Vec<String>)> {
        a.culprits
            .iter()
            .map(|c| (c.kind, c.members.clone()))
            .collect()
    }

    #[test]
    fn a_bad_node_is_named_for_every_node_count() {
        for n in 3..=9 {
            for bad in [0, n / 2, n - 1] {
                let a = analyse(&nodes(n, 100.0, &bad_node(n, bad, 35.0)), 0.75, NODES);
                assert_eq!(a.verdict, Conclusion::Culprit, "n={n} bad={bad}: {a:?}");
                assert_eq!(
                    members(&a),
                    vec![(CulpritKind::Node, vec![format!("n{bad}")])],
                    "n={n} bad={bad}: {}",
                    a.summary
                );
                let c = &a.culprits[0];
                assert!(c.median > 99.0 && c.figure < 40.0 && c.ratio < 0.4, "{c:?}");
                assert_eq!(
                    c.figures.len(),
                    n - 1,
                    "one figure per pair of a symmetric matrix"
                );
            }
        }
    }

    #[test]
    fn a_bad_link_is_named_and_its_nodes_are_not() {
        for n in 3..=8 {
            let a = analyse(&nodes(n, 100.0, &[(1, 2, Some(40.0))]), 0.75, NODES);
            assert_eq!(a.verdict, Conclusion::Culprit, "n={n}: {a:?}");
            assert_eq!(
                members(&a),
                vec![(CulpritKind::Link, vec!["n1".to_string(), "n2".to_string()])],
                "n={n}: {}",
                a.summary
            );
            assert_eq!(a.culprits[0].figure, 40.0);
            assert!(a.summary.contains("link n1–n2 is bad"), "{}", a.summary);
        }
    }

    #[test]
    fn two_disjoint_bad_links_are_both_named() {
        let a = analyse(
            &nodes(4, 100.0, &[(0, 1, Some(30.0)), (2, 3, Some(50.0))]),
            0.75,
            NODES,
        );
        assert_eq!(
            members(&a),
            vec![
                (CulpritKind::Link, vec!["n0".into(), "n1".into()]),
                (CulpritKind::Link, vec!["n2".into(), "n3".into()])
            ]
        );
    }

    #[test]
    fn two_bad_nodes_of_seven_do_not_hide_each_other() {
        let mut set = bad_node(7, 2, 40.0);
        set.extend(bad_node(7, 5, 45.0));
        set.push((2, 5, Some(20.0)));
        let a = analyse(&nodes(7, 100.0, &set), 0.75, NODES);
        let mut named = members(&a);
        named.sort_by(|x, y| x.1.cmp(&y.1));
        assert_eq!(
            named,
            vec![
                (CulpritKind::Node, vec!["n2".into()]),
                (CulpritKind::Node, vec!["n5".into()])
            ],
            "{}",
            a.summary
        );
    }

    #[test]
    fn a_uniform_matrix_has_no_culprit() {
        for n in 3..=8 {
            let a = analyse(&nodes(n, 100.0, &[]), 0.75, NODES);
            assert_eq!(a.verdict, Conclusion::NoCulprit, "n={n}: {a:?}");
            assert!(a.culprits.is_empty());
            assert!(a.summary.starts_with("no culprit found"), "{}", a.summary);
        }
        // Just above the threshold is still uniform enough.
        let a = analyse(&nodes(5, 100.0, &[(0, 1, Some(80.0))]), 0.75, NODES);
        assert_eq!(a.verdict, Conclusion::NoCulprit, "{a:?}");
    }

    #[test]
    fn two_nodes_cannot_be_told_apart() {
        let a = analyse(&nodes(2, 100.0, &[(0, 1, Some(10.0))]), 0.75, NODES);
        assert_eq!(a.verdict, Conclusion::Inconclusive);
        assert!(a.culprits.is_empty());
        assert!(a.summary.contains("nothing to compare"), "{}", a.summary);
        let a = analyse(&nodes(2, 100.0, &[(0, 1, None)]), 0.75, NODES);
        assert_eq!(a.verdict, Conclusion::Inconclusive);
        assert_eq!(a.missing.len(), 1);
    }

    #[test]
    fn missing_pairs_make_it_inconclusive_but_keep_the_suspects() {
        let mut set = bad_node(6, 4, 30.0);
        set.push((0, 1, None));
        let a = analyse(&nodes(6, 100.0, &set), 0.75, NODES);
        assert_eq!(a.verdict, Conclusion::Inconclusive);
        assert_eq!(a.missing, vec![["n0".to_string(), "n1".to_string()]]);
        assert_eq!(members(&a), vec![(CulpritKind::Node, vec!["n4".into()])]);
        assert!(
            a.summary.contains("1 of 15 pair(s) have no figure (n0–n1)"),
            "{}",
            a.summary
        );
        assert!(
            a.summary
                .contains("among the measured pairs: node n4 is bad"),
            "{}",
            a.summary
        );
    }

    #[test]
    fn a_node_whose_every_pair_failed_is_pointed_at() {
        let failed: Vec<_> = bad_node(5, 3, 0.0)
            .into_iter()
            .map(|(i, j, _)| (i, j, None))
            .collect();
        let a = analyse(&nodes(5, 100.0, &failed), 0.75, NODES);
        assert_eq!(a.verdict, Conclusion::Inconclusive);
        assert_eq!(a.missing.len(), 4);
        assert!(
            a.summary.contains("every pair of node n3 failed"),
            "{}",
            a.summary
        );
        let none = analyse(
            &nodes(3, 100.0, &[(0, 1, None), (0, 2, None), (1, 2, None)]),
            0.75,
            NODES,
        );
        assert_eq!(none.verdict, Conclusion::Inconclusive);
        assert!(
            none.summary.contains("none of the 3 pair(s)"),
            "{}",
            none.summary
        );
    }

    #[test]
    fn spread_without_a_pattern_is_inconclusive() {
        // Two slow nodes of four: the fast pair might as well be the odd one out.
        let a = analyse(
            &nodes(
                4,
                100.0,
                &[
                    (0, 2, Some(40.0)),
                    (0, 3, Some(40.0)),
                    (1, 2, Some(40.0)),
                    (1, 3, Some(40.0)),
                    (2, 3, Some(40.0)),
                ],
            ),
            0.75,
            NODES,
        );
        assert_eq!(a.verdict, Conclusion::Inconclusive, "{a:?}");
        assert!(a.culprits.is_empty(), "{a:?}");
        assert!(
            a.summary.contains("no single node or link explains it"),
            "{}",
            a.summary
        );
    }

    #[test]
    fn directed_gpu_matrices_name_a_gpu_or_a_one_way_link() {
        let gpus = |set: &[(usize, usize, f64)]| {
            let mut values = vec![vec![Some(300.0); 8]; 8];
            for (i, row) in values.iter_mut().enumerate() {
                row[i] = Some(1500.0);
            }
            for &(i, j, v) in set {
                values[i][j] = Some(v);
            }
            Matrix {
                labels: (0..8).map(|i| i.to_string()).collect(),
                metric: "algbw_gbs".into(),
                unit: "GB/s".into(),
                values,
            }
        };
        // GPU 6 is slow both ways with everyone; the diagonal (local copies) is ignored.
        let set: Vec<(usize, usize, f64)> = (0..8)
            .filter(|&j| j != 6)
            .flat_map(|j| [(6, j, 20.0), (j, 6, 22.0)])
            .collect();
        let a = analyse(&gpus(&set), 0.75, GPUS);
        assert_eq!(
            members(&a),
            vec![(CulpritKind::Node, vec!["6".into()])],
            "{}",
            a.summary
        );
        assert_eq!(
            a.culprits[0].figures.len(),
            14,
            "both directions of each pair"
        );
        assert!(a.summary.starts_with("GPU 6 is bad"), "{}", a.summary);
        // One direction of one pair is slow.
        let a = analyse(&gpus(&[(1, 3, 25.0)]), 0.75, GPUS);
        assert_eq!(
            members(&a),
            vec![(CulpritKind::Link, vec!["1".into(), "3".into()])],
            "{}",
            a.summary
        );
        assert_eq!(a.culprits[0].figures.len(), 2);
        assert_eq!(a.culprits[0].figure, 25.0);
        assert_eq!(
            analyse(&gpus(&[]), 0.75, GPUS).verdict,
            Conclusion::NoCulprit
        );
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(upper_median(&[1.0, 9.0]), Some(9.0));
        assert_eq!(upper_median(&[1.0, 2.0, 9.0]), Some(2.0));
    }
}
