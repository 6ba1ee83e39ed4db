use super::*;

fn var(name: &str, value: &str, source: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: value.into(),
        source: source.into(),
    }
}

#[test]
fn the_catalogue_is_consistent() {
    for e in CATALOGUE {
        assert_eq!(
            CATALOGUE.iter().filter(|o| o.name == e.name).count(),
            1,
            "{} listed twice",
            e.name
        );
        assert!(!e.evidence.is_empty(), "{} has no evidence", e.name);
        // A variable refused for a mismatch must say what the mismatch does; one that may
        // differ must not claim a failure.
        match e.agreement {
            Agreement::Must => assert!(
                matches!(e.mismatch, Mismatch::Hang | Mismatch::Error),
                "{}",
                e.name
            ),
            Agreement::Should => assert_eq!(e.mismatch, Mismatch::Slowdown, "{}", e.name),
            Agreement::Reconciled | Agreement::PerNode => {
                assert_eq!(e.mismatch, Mismatch::None, "{}", e.name)
            }
        }
        // Every catalogued name is one a run may set at all.
        crate::env_policy::check_name(e.name).unwrap();
    }
    assert!(must_agree("NCCL_MAX_NCHANNELS"));
    assert!(find("NCCL_MAX_NCHANNELS").unwrap().measured.is_some());
    assert!(must_agree("NCCL_ALGO") && must_agree("NCCL_PROTO"));
    // UCX negotiates transports per endpoint pair; per-node lists are normal.
    assert!(!must_agree("UCX_TLS"));
    for per_node in [
        "NCCL_IB_HCA",
        "NCCL_SOCKET_IFNAME",
        "NCCL_IB_GID_INDEX",
        "UCX_NET_DEVICES",
    ] {
        assert_eq!(find(per_node).unwrap().agreement, Agreement::PerNode);
        assert!(!must_agree(per_node));
    }
    assert!(
        !must_agree("NCCL_NVLS_ENABLE"),
        "reconciled by NCCL at init"
    );
    assert!(!must_agree("NCCL_DEBUG"), "not catalogued: free to differ");
}

#[test]
fn a_node_profile_on_one_node_splits_the_run() {
    let a = [var("NCCL_IB_HCA", "mlx5_0", "plugin:azure@1")];
    let b = [
        var("NCCL_IB_HCA", "mlx5_4", "plugin:azure@1"),
        var("NCCL_MAX_NCHANNELS", "1", "tuning:b-fast"),
    ];
    let c = [var("NCCL_IB_HCA", "mlx5_0", "plugin:azure@1")];
    let found = splits([("a", &a[..]), ("b", &b[..]), ("c", &c[..])]);
    assert_eq!(
        found,
        vec![Split {
            name: "NCCL_MAX_NCHANNELS".into(),
            values: vec![
                SplitValue {
                    value: None,
                    sources: vec![],
                    nodes: vec!["a".into(), "c".into()]
                },
                SplitValue {
                    value: Some("1".into()),
                    sources: vec!["tuning:b-fast".into()],
                    nodes: vec!["b".into()]
                },
            ]
        }],
        "the HCA differs by design and is no split"
    );
    let err = check([("a", &a[..]), ("b", &b[..]), ("c", &c[..])]).unwrap_err();
    let msg = err.to_string();
    for part in [
        "NCCL_MAX_NCHANNELS",
        "a c unset",
        "b \"1\" from tuning:b-fast",
        "hangs",
        "Set NCCL_MAX_NCHANNELS in the run's env",
        "site-wide tuning profile",
    ] {
        assert!(msg.contains(part), "{part:?} missing from {msg}");
    }
}

#[test]
fn equal_values_and_the_runs_own_value_pass() {
    // What runs_env gives every node once the run sets the variable itself.
    let a = [var("NCCL_MAX_NCHANNELS", "1", "run")];
    let b = [var("NCCL_MAX_NCHANNELS", "1", "run")];
    assert!(check([("a", &a[..]), ("b", &b[..])]).is_ok());
    // Equal values from different sources agree.
    let c = [var("NCCL_ALGO", "Ring", "tuning:site")];
    let d = [var("NCCL_ALGO", "Ring", "plugin:x@1")];
    assert!(check([("c", &c[..]), ("d", &d[..])]).is_ok());
    // One node alone never splits.
    assert!(check([("c", &c[..])]).is_ok());
}

#[test]
fn several_splits_and_values_are_all_named() {
    let a = [
        var("NCCL_ALGO", "Ring", "tuning:a"),
        var("NCCL_NCHANNELS_PER_NET_PEER", "2", "p"),
    ];
    let b = [
        var("NCCL_ALGO", "Tree", "tuning:b"),
        var("NCCL_NCHANNELS_PER_NET_PEER", "2", "p"),
    ];
    let c = [
        var("NCCL_ALGO", "Ring", "plugin:x@1"),
        var("NCCL_NCHANNELS_PER_NET_PEER", "1", "q"),
    ];
    let found = splits([("a", &a[..]), ("b", &b[..]), ("c", &c[..])]);
    let names: Vec<&str> = found.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["NCCL_ALGO", "NCCL_NCHANNELS_PER_NET_PEER"]);
    // The majority value first, with both of its sources.
    assert_eq!(found[0].values[0].value.as_deref(), Some("Ring"));
    assert_eq!(found[0].values[0].sources, ["tuning:a", "plugin:x@1"]);
    let msg = EnvSplits(found).to_string();
    assert!(
        msg.contains("NCCL_NCHANNELS_PER_NET_PEER (a mismatch fails the communicator)"),
        "{msg}"
    );
    assert!(
        msg.contains("Set NCCL_ALGO, NCCL_NCHANNELS_PER_NET_PEER in the run's env"),
        "{msg}"
    );
}

#[test]
fn long_node_lists_are_cut() {
    let set = [var("NCCL_PROTO", "LL", "tuning:n")];
    let unset: Vec<EnvVar> = Vec::new();
    let names: Vec<String> = (0..20).map(|i| format!("n{i:02}")).collect();
    let nodes = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), if i == 0 { &set[..] } else { &unset[..] }));
    let msg = check(nodes).unwrap_err().to_string();
    assert!(msg.contains("and 11 more unset"), "{msg}");
}

#[test]
fn job_env_files_leave_out_what_the_site_does_not_share() {
    let env = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let me = env(&[
        ("NCCL_MAX_NCHANNELS", "1"),
        ("NCCL_ALGO", "Ring"),
        ("NCCL_IB_HCA", "mlx5_0"),
    ]);
    let p1 = env(&[("NCCL_ALGO", "Ring"), ("NCCL_IB_HCA", "mlx5_2")]);
    let p2 = env(&[("NCCL_ALGO", "Ring"), ("NCCL_MAX_NCHANNELS", "2")]);
    let out = job_env_leave_out("me", &me, [("p2", &p2), ("p1", &p1), ("me", &me)]);
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].name, "NCCL_MAX_NCHANNELS");
    assert_eq!(out[0].code, ENV_SPLITS_COMMUNICATOR);
    assert_eq!(out[0].differing_nodes, ["p1", "p2"]);
    assert!(out[0].message.contains("p1 p2"), "{}", out[0].message);
    // A site where everyone has it writes it.
    let p3 = env(&[("NCCL_MAX_NCHANNELS", "1"), ("NCCL_ALGO", "Ring")]);
    assert!(job_env_leave_out("me", &me, [("p3", &p3)]).is_empty());
    // A node alone in its site writes everything.
    assert!(job_env_leave_out("me", &me, []).is_empty());
}
