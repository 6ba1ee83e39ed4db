//! The order pairs run in: a round-robin tournament (the circle method), so each round
//! holds every node at most once, cut into batches of at most `k` pairs.

/// Rounds in which every pair of `n` nodes meets exactly once and no node plays twice in a
/// round: `n − 1` rounds of `n / 2` pairs for even `n`, `n` rounds of `(n − 1) / 2` for odd.
/// Pairs are `(a, b)` with `a < b`.
pub fn rounds(n: usize) -> Vec<Vec<(usize, usize)>> {
    if n < 2 {
        return Vec::new();
    }
    // An odd count gets a phantom node; whoever meets it sits the round out.
    let m = n + n % 2;
    let fixed = m - 1;
    (0..fixed)
        .map(|r| {
            let mut round = vec![(r, fixed)];
            for i in 1..m / 2 {
                round.push(((r + i) % fixed, (r + fixed - i) % fixed));
            }
            round
                .into_iter()
                .filter(|&(a, b)| a < n && b < n)
                .map(|(a, b)| (a.min(b), a.max(b)))
                .collect()
        })
        .collect()
}

/// Batches of at most `k` pairs, each inside one round (so node-disjoint); `k = 0` keeps
/// whole rounds.
pub fn batches(n: usize, k: usize) -> Vec<Vec<(usize, usize)>> {
    rounds(n)
        .into_iter()
        .flat_map(|round| {
            let size = if k == 0 { round.len().max(1) } else { k };
            round.chunks(size).map(<[_]>::to_vec).collect::<Vec<_>>()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn check(n: usize, k: usize) {
        let batches = batches(n, k);
        let mut seen = BTreeSet::new();
        for batch in &batches {
            assert!(!batch.is_empty(), "n={n} k={k}: an empty batch");
            if k > 0 {
                assert!(batch.len() <= k, "n={n} k={k}: {batch:?} is larger than k");
            }
            let mut busy = BTreeSet::new();
            for &(a, b) in batch {
                assert!(a < b && b < n, "n={n}: bad pair {a}-{b}");
                assert!(
                    busy.insert(a) && busy.insert(b),
                    "n={n} k={k}: a node twice in {batch:?}"
                );
                assert!(
                    seen.insert((a, b)),
                    "n={n} k={k}: pair {a}-{b} scheduled twice"
                );
            }
        }
        assert_eq!(
            seen.len(),
            n * n.saturating_sub(1) / 2,
            "n={n} k={k}: every pair exactly once"
        );
    }

    #[test]
    fn every_pair_once_and_no_node_twice_in_a_batch() {
        for n in 0..=17 {
            for k in [0, 1, 2, 3, 5, 100] {
                check(n, k);
            }
        }
        check(64, 0);
        check(64, 7);
    }

    #[test]
    fn rounds_are_as_few_as_possible() {
        assert_eq!(rounds(2), vec![vec![(0, 1)]]);
        assert_eq!(rounds(4).len(), 3);
        assert!(rounds(4).iter().all(|r| r.len() == 2));
        assert_eq!(rounds(5).len(), 5);
        assert!(rounds(5).iter().all(|r| r.len() == 2));
        assert_eq!(
            batches(6, 2).len(),
            10,
            "5 rounds of 3 pairs in batches of 2 and 1"
        );
        assert_eq!(batches(6, 0).len(), 5);
        assert!(rounds(1).is_empty() && rounds(0).is_empty());
    }
}
