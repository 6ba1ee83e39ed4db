use super::*;

fn extracted(value: f64, wrong: i64) -> Extracted {
    Extracted {
        test: "nccl.all_reduce".into(),
        figures: vec![Figure {
            test: "nccl.all_reduce".into(),
            metric: "busbw_gbs".into(),
            size_bytes: 1 << 33,
            value,
            pair: None,
        }],
        wrong,
    }
}

fn expect(value: f64) -> Expectation {
    expectations::builtin("datasheet".into(), "nccl.all_reduce", "busbw_gbs", 0, value)
}

fn m(value: f64, samples: i64) -> Option<Median> {
    Some(Median { value, samples })
}

#[test]
fn below_the_expectation_fails_with_its_source() {
    let c = [Comparisons {
        expectations: vec![expect(260.0)],
        ..Default::default()
    }];
    let (v, r) = decide("succeeded", None, &extracted(250.0, 0), &c);
    assert_eq!(v, Verdict::Fail);
    assert_eq!(r[0].basis, "expectation:datasheet");
    assert_eq!((r[0].observed, r[0].expected), (Some(250.0), Some(260.0)));
    assert!(r[0].message.contains("8 GiB"), "{}", r[0].message);
    assert_eq!(
        decide("succeeded", None, &extracted(300.0, 0), &c).0,
        Verdict::Pass
    );
}

#[test]
fn baseline_and_fleet_warn_beyond_their_tolerances() {
    let base = |b, f| {
        [Comparisons {
            expectations: vec![expect(100.0)],
            baseline: b,
            fleet: f,
        }]
    };
    // 4 % below the node's median: fine; 6 %: warn.
    assert_eq!(
        decide(
            "succeeded",
            None,
            &extracted(326.4, 0),
            &base(m(340.0, 5), None)
        )
        .0,
        Verdict::Pass
    );
    let (v, r) = decide(
        "succeeded",
        None,
        &extracted(319.0, 0),
        &base(m(340.0, 5), None),
    );
    assert_eq!((v, r[0].basis.as_str()), (Verdict::Warn, "node-baseline"));
    // 8 % below the fleet: fine; 12 %: warn; too few samples: not compared.
    assert_eq!(
        decide(
            "succeeded",
            None,
            &extracted(312.8, 0),
            &base(None, m(340.0, 4))
        )
        .0,
        Verdict::Pass
    );
    let (v, r) = decide(
        "succeeded",
        None,
        &extracted(299.0, 0),
        &base(None, m(340.0, 4)),
    );
    assert_eq!((v, r[0].basis.as_str()), (Verdict::Warn, "fleet-median"));
    assert_eq!(
        decide(
            "succeeded",
            None,
            &extracted(100.0, 0),
            &base(m(340.0, 2), m(340.0, 2))
        )
        .0,
        Verdict::Pass
    );
}

#[test]
fn failures_wrong_elements_and_nothing_to_compare() {
    let none = [Comparisons::default()];
    let (v, r) = decide("failed", Some("NCCL error"), &extracted(0.0, 0), &none);
    assert_eq!(v, Verdict::Fail);
    assert!(r[0].message.contains("NCCL error"));
    let (v, r) = decide("succeeded", None, &extracted(340.0, 12), &none);
    assert_eq!(
        (v, r[0].basis.as_str(), r[0].observed),
        (Verdict::Fail, "validation", Some(12.0))
    );
    let (v, r) = decide("succeeded", None, &extracted(340.0, 0), &none);
    assert_eq!((v, r[0].severity), (Verdict::Unknown, Severity::Info));
    assert_eq!(
        decide("skipped", Some("no RDMA device"), &extracted(0.0, 0), &none).0,
        Verdict::Unknown
    );
}

#[test]
fn latencies_fail_above_the_allowed() {
    let e = Extracted {
        test: "rdma.ib_write_lat".into(),
        figures: vec![Figure {
            test: "rdma.ib_write_lat".into(),
            metric: "time_us".into(),
            size_bytes: 2,
            value: 3.0,
            pair: None,
        }],
        wrong: 0,
    };
    let mut x = expect(2.5);
    x.metric = "time_us".into();
    let (v, r) = decide(
        "succeeded",
        None,
        &e,
        &[Comparisons {
            expectations: vec![x],
            baseline: m(2.0, 5),
            fleet: None,
        }],
    );
    assert_eq!(v, Verdict::Fail);
    assert!(
        r[0].message.contains("above the allowed"),
        "{}",
        r[0].message
    );
    assert_eq!(
        r[1].basis, "node-baseline",
        "50 % slower than its baseline also warns"
    );
}
