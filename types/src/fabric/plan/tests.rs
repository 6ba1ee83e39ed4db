use super::*;
use crate::fabric::generate::{FatTree, fat_tree, node_name};
use crate::fabric::model::{Fault, Model};
use crate::fabric::sim;

fn small() -> Index {
    Index::new(&fat_tree(&FatTree {
        nodes: 64,
        rails: 4,
        nodes_per_leaf: 8,
        spines_per_rail: 1,
    }))
}

fn suspects(n: usize, of: usize) -> Vec<String> {
    (0..n).map(|i| node_name(i, of)).collect()
}

fn run(ix: &Index, faults: &[&str], cfg: Config) -> sim::Answer {
    let faults: Vec<Fault> = faults.iter().map(|f| f.parse().unwrap()).collect();
    let mut model = Model::new(ix, &faults, 7).unwrap();
    let mut planner = Planner::new(ix, &suspects(64, 64), cfg).unwrap();
    super::run(&mut planner, &mut |req| Ok(model.answer(req))).unwrap()
}

fn ids(a: &sim::Answer) -> Vec<&str> {
    a.blamed.iter().map(|b| b.id.as_str()).collect()
}

#[test]
fn each_kind_of_single_fault_is_named() {
    let ix = small();
    for (fault, id) in [
        ("nic:n0013/mlx5_2", "n0013/mlx5_2"),
        ("node:n0042", "n0042"),
        ("leaf:leaf-su3-r1", "leaf-su3-r1"),
        ("uplink:leaf-su5-r0~spine-r0-0", "leaf-su5-r0~spine-r0-0"),
        ("spine:spine-r3-0", "spine-r3-0"),
        ("nic:n0007/mlx5_0:hang", "n0007/mlx5_0"),
    ] {
        let a = run(&ix, &[fault], Config::default());
        assert_eq!(ids(&a), [id], "{fault}: {a:#?}");
        assert!(a.conclusive && a.blamed[0].confidence >= 0.95, "{a:#?}");
        assert!(a.rounds <= 10, "{fault}: {} rounds", a.rounds);
    }
}

#[test]
fn two_faults_are_both_named() {
    let ix = small();
    let a = run(
        &ix,
        &["nic:n0003/mlx5_1", "uplink:leaf-su6-r2~spine-r2-0"],
        Config::default(),
    );
    let mut got = ids(&a);
    got.sort();
    assert_eq!(got, ["leaf-su6-r2~spine-r2-0", "n0003/mlx5_1"], "{a:#?}");
}

#[test]
fn no_fault_blames_nothing() {
    let a = run(&small(), &[], Config::default());
    assert!(a.blamed.is_empty(), "{a:#?}");
}

#[test]
fn rounds_respect_max_nodes_and_share_no_nic() {
    let ix = small();
    let cfg = Config {
        max_nodes: 10,
        ..Config::default()
    };
    let mut planner = Planner::new(&ix, &suspects(64, 64), cfg).unwrap();
    let faults: Vec<Fault> = vec!["nic:n0020/mlx5_3".parse().unwrap()];
    let mut model = Model::new(&ix, &faults, 3).unwrap();
    while let Some(req) = planner.next_round() {
        let mut nodes = HashSet::new();
        let mut nics = HashSet::new();
        for t in &req.tests {
            for n in &t.nodes {
                nodes.insert(n.clone());
                assert!(
                    nics.insert((n.clone(), t.rail)),
                    "{n} twice on rail {:?}",
                    t.rail
                );
            }
        }
        assert!(nodes.len() <= 10, "{} nodes", nodes.len());
        planner.record(&model.answer(&req)).unwrap();
    }
    let a = planner.answer();
    assert!(a.blamed.iter().all(|b| b.id == "n0020/mlx5_3"), "{a:#?}");
}

#[test]
fn results_are_checked() {
    let ix = small();
    let mut planner = Planner::new(&ix, &suspects(8, 64), Config::default()).unwrap();
    let req = planner.next_round().unwrap();
    let wrong = sim::RoundResults {
        round: 2,
        results: vec![],
    };
    assert!(planner.record(&wrong).unwrap_err().contains("round 2"));
    let none = sim::RoundResults {
        round: 1,
        results: vec![],
    };
    assert!(planner.record(&none).unwrap_err().contains("no result"));
    let mut planner = Planner::new(&ix, &suspects(8, 64), Config::default()).unwrap();
    let req2 = planner.next_round().unwrap();
    assert_eq!(req, req2, "planning is deterministic");
    let mut res = Model::new(&ix, &[], 1).unwrap().answer(&req2);
    res.results.push(res.results[0].clone());
    assert!(planner.record(&res).unwrap_err().contains("answered twice"));
    assert!(Planner::new(&ix, &["nowhere".into()], Config::default()).is_err());
}

/// The server's way: a fresh planner on every step, given back the stored rounds with
/// their results, chooses the next round; it names the fault as one planner run through.
#[test]
fn a_planner_rebuilt_from_stored_rounds_goes_on_where_it_stopped() {
    let ix = small();
    let faults: Vec<Fault> = vec!["nic:n0021/mlx5_3".parse().unwrap()];
    let mut model = Model::new(&ix, &faults, 7).unwrap();
    let mut stored: Vec<(sim::RoundRequest, sim::RoundResults)> = Vec::new();
    let answer = loop {
        let mut p = Planner::new(&ix, &suspects(64, 64), Config::default()).unwrap();
        for (req, res) in &stored {
            p.resume(req).unwrap();
            p.record(res).unwrap();
        }
        match p.next_round() {
            Some(req) => {
                assert_eq!(req.round as usize, stored.len() + 1);
                let ids: HashSet<&str> = stored
                    .iter()
                    .flat_map(|(r, _)| r.tests.iter().map(|t| t.id.as_str()))
                    .collect();
                assert!(
                    req.tests.iter().all(|t| !ids.contains(t.id.as_str())),
                    "test ids are never used twice"
                );
                let res = model.answer(&req);
                stored.push((req, res));
            }
            None => break p.answer(),
        }
    };
    assert_eq!(ids(&answer), ["n0021/mlx5_3"], "{answer:#?}");
    assert_eq!(answer.rounds as usize, stored.len());

    // A round whose last tests never ran: their ids are not given again.
    let mut p = Planner::new(&ix, &suspects(64, 64), Config::default()).unwrap();
    let mut first = stored[0].0.clone();
    let kept = first.tests.len() / 2;
    let last: u64 = first.tests.last().unwrap().id[1..].parse().unwrap();
    first.tests.truncate(kept);
    let mut results = stored[0].1.clone();
    results.results.truncate(kept);
    p.resume(&first).unwrap();
    p.record(&results).unwrap();
    p.ids_past(last);
    let next = p.next_round().unwrap();
    let lowest: u64 = next
        .tests
        .iter()
        .map(|t| t.id[1..].parse::<u64>().unwrap())
        .min()
        .unwrap();
    assert!(lowest > last, "t{lowest} after t{last}");

    // A round that does not follow, or names a node the fabric lacks, is refused.
    let mut p = Planner::new(&ix, &suspects(64, 64), Config::default()).unwrap();
    assert!(p.resume(&stored[1].0).is_err());
    let mut bad = stored[0].0.clone();
    bad.tests[0].nodes[0] = "n9999".into();
    let err = p.resume(&bad).unwrap_err();
    assert!(err.contains("n9999"), "{err}");
}
