//! The GPU×GPU matrix of a `p2p` result: one row per copy, labelled `{src, dst, kind,
//! path}` with `algbw_gbs`. Device-to-device copies between two GPUs fill the matrix
//! (`src` → `dst`), copies within one GPU its diagonal, and the culprit analysis is the one
//! investigations use, over GPUs instead of nodes.

use std::collections::BTreeMap;

use heddle_types::investigations::{Matrix, P2pMatrix};
use heddle_types::jobs::ResultRow;
use uuid::Uuid;

use super::{InvestigateError, culprit};

/// One cell: the figure at the largest size, from the `p2p` path when a pair was copied
/// both directly and staged through the host.
#[derive(Debug, Clone, PartialEq)]
struct Cell {
    size: i64,
    value: f64,
    path: Option<String>,
}

fn better(old: &Cell, new: &Cell) -> bool {
    let direct = |c: &Cell| c.path.as_deref() == Some("p2p");
    (direct(new), new.size) > (direct(old), old.size)
}

/// Builds the d2d matrix; `None` when no row is a d2d copy between numbered GPUs.
pub fn build(rows: &[ResultRow]) -> Option<(Matrix, Vec<Vec<Option<String>>>)> {
    let mut cells: BTreeMap<(u32, u32), Cell> = BTreeMap::new();
    for r in rows {
        // Bidirectional rows count the bytes of both directions: not comparable with the
        // one-way copies the matrix holds.
        if r.labels.get("kind").map(String::as_str) != Some("d2d")
            || r.labels.get("mode").is_some_and(|m| m == "bidir")
        {
            continue;
        }
        let gpu = |k: &str| r.labels.get(k).and_then(|v| v.parse::<u32>().ok());
        let (Some(src), Some(dst), Some(value)) = (
            gpu("src"),
            gpu("dst"),
            r.algbw_gbs.filter(|v| v.is_finite()),
        ) else {
            continue;
        };
        let new = Cell {
            size: r.size_bytes,
            value,
            path: r.labels.get("path").cloned(),
        };
        match cells.get(&(src, dst)) {
            Some(old) if !better(old, &new) => {
                // Same path and size measured twice (in place, a repeat): average them.
                if old.size == new.size && old.path == new.path {
                    let c = cells.get_mut(&(src, dst)).expect("present");
                    c.value = (c.value + new.value) / 2.0;
                }
            }
            _ => {
                cells.insert((src, dst), new);
            }
        }
    }
    let mut gpus: Vec<u32> = cells.keys().flat_map(|&(s, d)| [s, d]).collect();
    gpus.sort_unstable();
    gpus.dedup();
    if gpus.is_empty() {
        return None;
    }
    let index = |g: u32| gpus.binary_search(&g).expect("listed");
    let n = gpus.len();
    let mut values = vec![vec![None; n]; n];
    let mut paths = vec![vec![None; n]; n];
    for (&(s, d), c) in &cells {
        values[index(s)][index(d)] = Some(c.value);
        paths[index(s)][index(d)] = c.path.clone();
    }
    let labels = gpus.iter().map(u32::to_string).collect();
    Some((
        Matrix {
            labels,
            metric: "algbw_gbs".into(),
            unit: "GB/s".into(),
            values,
        },
        paths,
    ))
}

/// The matrix and analysis of a stored result.
pub async fn for_result(
    db: &sqlx::PgPool,
    result_id: Uuid,
    threshold: f64,
) -> Result<P2pMatrix, InvestigateError> {
    let head = sqlx::query!(
        "SELECT j.node_id, n.hostname FROM results r JOIN jobs j ON j.id = r.job_id
         JOIN nodes n ON n.id = j.node_id WHERE r.id = $1",
        result_id,
    )
    .fetch_optional(db)
    .await?
    .ok_or(InvestigateError::NoSuchResult(result_id))?;
    let (node_id, hostname) = (head.node_id, head.hostname);
    let rows = sqlx::query!(
        r#"SELECT size_bytes, algbw_gbs,
                labels AS "labels: sqlx::types::Json<BTreeMap<String, String>>"
         FROM result_rows WHERE result_id = $1 AND labels->>'kind' = 'd2d'"#,
        result_id,
    )
    .fetch_all(db)
    .await?;
    let rows: Vec<ResultRow> = rows
        .into_iter()
        .map(|r| ResultRow {
            size_bytes: r.size_bytes,
            algbw_gbs: r.algbw_gbs,
            labels: r.labels.0,
            ..Default::default()
        })
        .collect();
    let (matrix, paths) = build(&rows).ok_or_else(|| {
        InvestigateError::Invalid(format!(
            "result {result_id} has no d2d rows with src and dst GPU labels (is it a p2p result?)"
        ))
    })?;
    let analysis = culprit::analyse(&matrix, threshold, culprit::GPUS);
    Ok(P2pMatrix {
        result_id,
        node_id,
        hostname,
        matrix,
        paths,
        analysis,
    })
}

#[cfg(test)]
mod tests {
    use heddle_types::investigations::{Conclusion, CulpritKind};

    use super::*;

    fn row(src: &str, dst: &str, kind: &str, path: &str, size: i64, bw: f64) -> ResultRow {
        let labels = [("src", src), ("dst", dst), ("kind", kind), ("path", path)]
            .map(|(k, v)| (k.to_string(), v.to_string()));
        ResultRow {
            size_bytes: size,
            algbw_gbs: Some(bw),
            labels: labels.into_iter().collect(),
            ..Default::default()
        }
    }

    /// Four GPUs, two sizes; GPU 2's links are slow.
    fn rows(slow: impl Fn(u32, u32) -> bool) -> Vec<ResultRow> {
        let mut out = Vec::new();
        for s in 0..4u32 {
            for d in 0..4u32 {
                let (path, bw) = if s == d {
                    ("local", 1500.0)
                } else if slow(s, d) {
                    ("p2p", 40.0)
                } else {
                    ("p2p", 300.0)
                };
                out.push(row(
                    &s.to_string(),
                    &d.to_string(),
                    "d2d",
                    path,
                    1 << 20,
                    bw / 3.0,
                ));
                out.push(row(
                    &s.to_string(),
                    &d.to_string(),
                    "d2d",
                    path,
                    1 << 28,
                    bw,
                ));
            }
            out.push(row("host", &s.to_string(), "h2d", "staged", 1 << 28, 25.0));
        }
        out
    }

    #[test]
    fn builds_the_d2d_matrix_at_the_largest_size() {
        let (m, paths) = build(&rows(|_, _| false)).unwrap();
        assert_eq!(m.labels, ["0", "1", "2", "3"]);
        assert_eq!(m.values[0][1], Some(300.0));
        assert_eq!(m.values[2][2], Some(1500.0), "local copies on the diagonal");
        assert_eq!(paths[2][2].as_deref(), Some("local"));
        assert_eq!(
            culprit::analyse(&m, 0.75, culprit::GPUS).verdict,
            Conclusion::NoCulprit
        );
        assert!(
            build(&[row("host", "0", "h2d", "staged", 8, 1.0)]).is_none(),
            "no d2d rows, no matrix"
        );
    }

    #[test]
    fn names_a_bad_gpu_and_a_bad_link() {
        let (m, _) = build(&rows(|s, d| s == 2 || d == 2)).unwrap();
        let a = culprit::analyse(&m, 0.75, culprit::GPUS);
        assert_eq!(a.verdict, Conclusion::Culprit, "{a:?}");
        assert_eq!(
            (a.culprits[0].kind, a.culprits[0].members.clone()),
            (CulpritKind::Node, vec!["2".to_string()])
        );
        let (m, _) = build(&rows(|s, d| (s, d) == (0, 3) || (s, d) == (3, 0))).unwrap();
        let a = culprit::analyse(&m, 0.75, culprit::GPUS);
        assert_eq!(a.culprits.len(), 1, "{a:?}");
        assert_eq!(
            (a.culprits[0].kind, a.culprits[0].members.clone()),
            (CulpritKind::Link, vec!["0".to_string(), "3".to_string()])
        );
    }

    #[test]
    fn bidirectional_rows_are_left_out() {
        let mut bidir = row("0", "1", "d2d", "p2p", 1 << 28, 600.0);
        bidir.labels.insert("mode".into(), "bidir".into());
        let (m, _) = build(&[
            row("0", "1", "d2d", "p2p", 1 << 28, 300.0),
            bidir,
            row("1", "0", "d2d", "p2p", 1 << 28, 310.0),
        ])
        .unwrap();
        assert_eq!(m.values[0][1], Some(300.0));
        assert_eq!(m.values[1][0], Some(310.0));
    }

    #[test]
    fn a_direct_copy_wins_over_a_staged_one() {
        let rows = [
            row("0", "1", "d2d", "staged", 1 << 28, 20.0),
            row("0", "1", "d2d", "p2p", 1 << 20, 200.0),
            row("1", "0", "d2d", "staged", 1 << 28, 21.0),
        ];
        let (m, paths) = build(&rows).unwrap();
        assert_eq!(m.values[0][1], Some(200.0));
        assert_eq!(paths[0][1].as_deref(), Some("p2p"));
        assert_eq!(m.values[1][0], Some(21.0));
    }
}
