//! The planner against the fabric model, and the two pair schemes it replaces, at 1,000
//! and 10,000 nodes × 8 rails from 512 suspects: rounds, tests, node-seconds, precision,
//! recall and planning time a round (docs/benchmarks.md, "Fabric investigations").
//!
//! cargo run --release -p heddle-types --example fabric-bench [-- NODES...]

use heddle_types::fabric::generate::{FatTree, fat_tree, node_name};
use heddle_types::fabric::index::{Index, Kind};
use heddle_types::fabric::model::{Fault, Model, Rng, tally};
use heddle_types::fabric::plan::{self, Config, Planner, SLOW_FRACTION};
use heddle_types::fabric::sim::{self, Blame, RoundRequest, TEST_BYTES, TestSpec};

const SUSPECTS: usize = 512;

#[derive(Default)]
struct Sum {
    runs: usize,
    rounds: u64,
    max_rounds: u32,
    tests: u64,
    node_seconds: f64,
    right: usize,
    blamed: usize,
    faults: usize,
    max_plan_ms: f64,
}

fn scenarios(n: usize) -> Vec<(&'static str, Vec<String>)> {
    let node = |i: usize| node_name(i, n);
    vec![
        ("nic", vec![format!("nic:{}/mlx5_2", node(12))]),
        ("nic", vec![format!("nic:{}/mlx5_7:hang", node(499))]),
        ("node", vec![format!("node:{}", node(41))]),
        ("node", vec![format!("node:{}:slow=0.5", node(300))]),
        ("leaf", vec!["leaf:leaf-su3-r1".into()]),
        ("leaf", vec!["leaf:leaf-su15-r6:hang".into()]),
        ("uplink", vec!["uplink:leaf-su5-r0~spine-r0-0".into()]),
        (
            "uplink",
            vec!["uplink:leaf-su10-r4~spine-r4-0:slow=0.5".into()],
        ),
        ("spine", vec!["spine:spine-r3-0".into()]),
        ("spine", vec!["spine:spine-r7-0:hang".into()]),
        (
            "2 nic",
            vec![
                format!("nic:{}/mlx5_1", node(2)),
                format!("nic:{}/mlx5_5", node(199)),
            ],
        ),
        (
            "2 node",
            vec![format!("node:{}", node(9)), format!("node:{}", node(399))],
        ),
        (
            "2 leaf",
            vec!["leaf:leaf-su1-r2".into(), "leaf:leaf-su9-r5".into()],
        ),
        (
            "2 uplink",
            vec![
                "uplink:leaf-su2-r3~spine-r3-0".into(),
                "uplink:leaf-su12-r6~spine-r6-0".into(),
            ],
        ),
        (
            "2 spine",
            vec!["spine:spine-r1-0".into(), "spine:spine-r5-0".into()],
        ),
        ("~nic", vec![format!("nic:{}/mlx5_2:p=0.33", node(12))]),
        ("~node", vec![format!("node:{}:p=0.33", node(41))]),
        ("~leaf", vec!["leaf:leaf-su3-r1:p=0.33".into()]),
        (
            "~uplink",
            vec!["uplink:leaf-su5-r0~spine-r0-0:p=0.33".into()],
        ),
        ("~spine", vec!["spine:spine-r3-0:p=0.33".into()]),
    ]
}

fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let sizes = if sizes.is_empty() {
        vec![1000, 10_000]
    } else {
        sizes
    };
    println!(
        "| nodes | faults | method | rounds (mean / max) | tests (mean) | node-seconds (mean) | precision | recall | planning a round (max) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for &n in &sizes {
        let fabric = fat_tree(&FatTree {
            nodes: n,
            rails: 8,
            nodes_per_leaf: 32,
            spines_per_rail: 1,
        });
        let ix = Index::new(&fabric);
        let suspects: Vec<String> = (0..SUSPECTS).map(|i| node_name(i, n)).collect();
        for group in ["single", "two", "intermittent, p = 1/3"] {
            let mut sums: [(&str, Sum); 3] = [
                ("planner", Sum::default()),
                ("all pairs", Sum::default()),
                ("pairs, then re-pair", Sum::default()),
            ];
            for (i, (kind, list)) in scenarios(n).into_iter().enumerate() {
                let of = match kind.chars().next() {
                    Some('2') => "two",
                    Some('~') => "intermittent, p = 1/3",
                    _ => "single",
                };
                if of != group {
                    continue;
                }
                let faults: Vec<Fault> = list.iter().map(|f| f.parse().unwrap()).collect();
                let seed = 1000 + i as u64;
                for (m, (_, sum)) in sums.iter_mut().enumerate() {
                    let mut model = Model::new(&ix, &faults, seed).unwrap();
                    let (rounds, tests, node_s, blamed, plan_ms) = match m {
                        0 => planner(&ix, &suspects, &mut model, seed),
                        1 => all_pairs(&ix, &suspects, &mut model),
                        _ => repair(&ix, &suspects, &mut model, seed),
                    };
                    let (r, b, t) = tally(&ix, &blamed, &faults);
                    sum.runs += 1;
                    sum.rounds += rounds as u64;
                    sum.max_rounds = sum.max_rounds.max(rounds);
                    sum.tests += tests;
                    sum.node_seconds += node_s;
                    (sum.right, sum.blamed, sum.faults) =
                        (sum.right + r, sum.blamed + b, sum.faults + t);
                    sum.max_plan_ms = sum.max_plan_ms.max(plan_ms);
                }
            }
            for (name, s) in &sums {
                let k = s.runs.max(1) as f64;
                let plan = if *name == "planner" {
                    format!("{:.3} s", s.max_plan_ms / 1e3)
                } else {
                    "–".into()
                };
                println!(
                    "| {n} | {group} ({} runs) | {name} | {:.1} / {} | {:.0} | {:.0} | {:.2} | {:.2} | {plan} |",
                    s.runs,
                    s.rounds as f64 / k,
                    s.max_rounds,
                    s.tests as f64 / k,
                    s.node_seconds / k,
                    s.right as f64 / s.blamed.max(1) as f64,
                    s.right as f64 / s.faults.max(1) as f64,
                );
            }
        }
    }
}

fn planner(
    ix: &Index,
    suspects: &[String],
    model: &mut Model,
    seed: u64,
) -> (u32, u64, f64, Vec<Blame>, f64) {
    let mut p = Planner::new(
        ix,
        suspects,
        Config {
            seed,
            ..Config::default()
        },
    )
    .unwrap();
    let a = plan::run(&mut p, &mut |req| Ok(model.answer(req))).unwrap();
    (
        a.rounds,
        a.tests as u64,
        a.node_seconds,
        a.blamed,
        a.max_planning_ms,
    )
}

/// Pair tests over every rail, judged as the planner judges: slower than
/// `SLOW_FRACTION` of the 80th percentile, or an error.
fn pair_round(
    model: &mut Model,
    round: u32,
    pairs: &[(usize, usize)],
    names: &[String],
) -> (Vec<bool>, f64) {
    let tests = pairs
        .iter()
        .enumerate()
        .map(|(i, &(a, b))| TestSpec {
            id: format!("t{i}"),
            kind: sim::ALL_REDUCE.into(),
            nodes: vec![names[a].clone(), names[b].clone()],
            rail: None,
            bytes: TEST_BYTES,
        })
        .collect();
    let res = model.answer(&RoundRequest { round, tests });
    let mut bw: Vec<f64> = res.results.iter().filter_map(|r| r.busbw_gbs).collect();
    bw.sort_by(f64::total_cmp);
    let reference = bw.get(bw.len() * 4 / 5).copied().unwrap_or(0.0);
    let secs = res
        .results
        .iter()
        .map(|r| 2.0 * r.seconds.unwrap_or(sim::DEFAULT_SECONDS))
        .sum();
    let failed = res
        .results
        .iter()
        .map(|r| r.busbw_gbs.is_none_or(|b| b < SLOW_FRACTION * reference))
        .collect();
    (failed, secs)
}

fn blame_nodes(names: &[String], bad: impl Iterator<Item = usize>) -> Vec<Blame> {
    bad.map(|i| Blame {
        component: Kind::Node,
        id: names[i].clone(),
        confidence: 1.0,
        evidence: vec![],
    })
    .collect()
}

/// SuperBench's scheme: every pair once (a round-robin, n − 1 rounds); a node is blamed
/// when most of its pairs failed.
fn all_pairs(_ix: &Index, names: &[String], model: &mut Model) -> (u32, u64, f64, Vec<Blame>, f64) {
    let n = names.len();
    let mut fails = vec![0u32; n];
    let (mut tests, mut secs) = (0u64, 0.0);
    for round in 0..n - 1 {
        // The circle method: node n−1 fixed, the others rotate.
        let pos = |k: usize| {
            if k == n - 1 {
                n - 1
            } else {
                (k + round) % (n - 1)
            }
        };
        let pairs: Vec<(usize, usize)> = (0..n / 2).map(|k| (pos(k), pos(n - 1 - k))).collect();
        let (failed, s) = pair_round(model, round as u32 + 1, &pairs, names);
        for (&(a, b), f) in pairs.iter().zip(failed) {
            if f {
                fails[a] += 1;
                fails[b] += 1;
            }
        }
        tests += pairs.len() as u64;
        secs += s;
    }
    let bad = (0..n).filter(|&i| fails[i] as usize * 2 > n - 1);
    ((n - 1) as u32, tests, secs, blame_nodes(names, bad), 0.0)
}

/// cluster-health-scanner's scheme: random pairs, then each node of a failing pair with a
/// node of a passing one; blamed when that fails too.
fn repair(
    _ix: &Index,
    names: &[String],
    model: &mut Model,
    seed: u64,
) -> (u32, u64, f64, Vec<Blame>, f64) {
    let n = names.len();
    let mut order: Vec<usize> = (0..n).collect();
    let mut rng = Rng::new(seed);
    for i in (1..n).rev() {
        order.swap(i, rng.below(i + 1));
    }
    let pairs: Vec<(usize, usize)> = order
        .chunks(2)
        .filter(|c| c.len() == 2)
        .map(|c| (c[0], c[1]))
        .collect();
    let (failed, s1) = pair_round(model, 1, &pairs, names);
    let mut good = Vec::new();
    let mut suspect = Vec::new();
    for (&(a, b), f) in pairs.iter().zip(&failed) {
        if *f {
            suspect.extend([a, b]);
        } else {
            good.extend([a, b]);
        }
    }
    let second: Vec<(usize, usize)> = suspect
        .iter()
        .zip(good.iter())
        .map(|(&s, &g)| (s, g))
        .collect();
    let (failed2, s2) = if second.is_empty() {
        (vec![], 0.0)
    } else {
        pair_round(model, 2, &second, names)
    };
    let bad = second
        .iter()
        .zip(failed2)
        .filter(|(_, f)| *f)
        .map(|(p, _)| p.0);
    let rounds = if second.is_empty() { 1 } else { 2 };
    (
        rounds,
        (pairs.len() + second.len()) as u64,
        s1 + s2,
        blame_nodes(names, bad),
        0.0,
    )
}
