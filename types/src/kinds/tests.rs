use serde_json::json;

use super::nccl::{NcclParams, parse_budget};
use super::sweep::SweepParams;
use super::*;
use crate::params::ParamType;

/// A value every required parameter accepts, for kinds that cannot decode `{}`.
fn required_example(doc: &ParamDoc) -> Value {
    match doc.ty {
        ParamType::Number | ParamType::Integer => json!(doc.min.unwrap_or(1.0).max(1.0)),
        ParamType::EnvGrid => json!({"NCCL_ALGO": ["Ring", "Tree"]}),
        other => panic!("no example for a required {other:?}"),
    }
}

fn minimal(k: &KindEntry) -> Value {
    let mut obj = serde_json::Map::new();
    for d in k.params.iter().filter(|d| d.required) {
        obj.insert(d.name.into(), required_example(d));
    }
    Value::Object(obj)
}

#[test]
fn every_kinds_defaults_round_trip() {
    for k in KINDS {
        let decoded = decode(k, &minimal(k)).unwrap_or_else(|e| panic!("{}: {e}", k.name));
        let again = decode(k, &decoded).unwrap_or_else(|e| panic!("{}: {e}", k.name));
        assert_eq!(decoded, again, "{}", k.name);
        // What the catalogue calls each default is what a job without params runs with.
        let cat = catalogue().into_iter().find(|c| c.name == k.name).unwrap();
        for p in &cat.params {
            if let Some(d) = &p.default {
                assert_eq!(decoded.get(&p.name), Some(d), "{}.{}", k.name, p.name);
            }
        }
        // Every field the struct writes is documented, and nothing else.
        for key in decoded.as_object().unwrap().keys() {
            assert!(
                k.params.iter().any(|d| d.name == key),
                "{}.{key} has no doc",
                k.name
            );
        }
    }
}

#[test]
fn every_documented_param_is_a_field_and_required_means_required() {
    for k in KINDS {
        for d in k.params {
            // An unknown name would be refused; a documented one with its default is not.
            let mut p = minimal(k);
            let cat = catalogue();
            let default = cat
                .iter()
                .find(|c| c.name == k.name)
                .and_then(|c| c.params.iter().find(|p| p.name == d.name))
                .and_then(|p| p.default.clone());
            if let Some(v) = default {
                p[d.name] = v;
                decode(k, &p).unwrap_or_else(|e| panic!("{}.{}: {e}", k.name, d.name));
            }
            if d.required {
                let mut without = minimal(k);
                without.as_object_mut().unwrap().remove(d.name);
                let err = decode(k, &without).unwrap_err();
                assert!(err.to_string().contains(d.name), "{}: {err}", k.name);
            }
        }
    }
}

#[test]
fn hostile_and_unknown_params_are_named() {
    let cases = [
        ("nccl", json!({"iters": "many"}), "iters"),
        ("nccl", json!({"iters": 0}), "iters"),
        ("nccl", json!({"op": "gossip"}), "op"),
        ("nccl", json!({"dtype": 4}), "dtype"),
        ("nccl", json!({"max_bytes": 32u64 << 30}), "max_bytes"),
        (
            "nccl",
            json!({"min_bytes": 1024, "max_bytes": 8}),
            "max_bytes",
        ),
        ("nccl", json!({"budget": "2h"}), "budget"),
        ("nccl", json!({"budget": "ten"}), "budget"),
        ("nccl", json!({"check": "yes"}), "check"),
        ("nccl", json!({"iterz": 3}), "iterz"),
        ("sweep", json!({}), "grid"),
        ("sweep", json!({"grid": {"LD_PRELOAD": ["x"]}}), "grid"),
        (
            "sweep",
            json!({"grid": {"NCCL_NET_PLUGIN": ["/tmp/evil.so"]}}),
            "grid",
        ),
        (
            "sweep",
            json!({"grid": {"NCCL_ALGO": ["Ring\nTree"]}}),
            "grid",
        ),
        ("sweep", json!({"grid": {"NCCL_ALGO": "Ring"}}), "grid"),
        ("sweep", json!({"grid": {"NCCL_ALGO": [true]}}), "grid"),
        (
            "sweep",
            json!({"grid": {"NCCL_A": (0..9).collect::<Vec<_>>(),
                                  "NCCL_B": (0..9).collect::<Vec<_>>()}}),
            "grid",
        ),
        (
            "sweep",
            json!({"grid": {"NCCL_ALGO": ["Ring"]}, "gpus": 0}),
            "gpus",
        ),
        ("p2p", json!({"gpus": [0, 0]}), "gpus"),
        ("p2p", json!({"gpus": [-1]}), "gpus"),
        ("p2p", json!({"size": 0}), "size"),
        ("rdma", json!({"test": "ib_write_bw; rm -rf /"}), "test"),
        ("rdma", json!({"device": "../mlx5_0"}), "device"),
        ("rdma", json!({"ib_port": 3}), "ib_port"),
        ("ucx", json!({"tests": ["tag_lat", "nope"]}), "tests"),
        ("ucx", json!({"sizes": [0]}), "sizes"),
        ("ucx", json!({"memory": "disk"}), "memory"),
        ("memcpy", json!({"factor": 1.0}), "factor"),
        ("sleep", json!({"seconds": -1}), "seconds"),
        ("sleep", json!({"seconds": 1e9}), "seconds"),
        ("fail", json!({"exit_code": 0}), "exit_code"),
        ("env", json!({"anything": 1}), "anything"),
    ];
    for (kind, mut params, name) in cases {
        let err = check(kind, &mut params).unwrap_err();
        let text = err.to_string();
        assert!(text.contains(name), "{kind} {params}: {text}");
        if let SpecParamsError::Param(p) = &err {
            assert_eq!(p.param.as_deref(), Some(name), "{kind}: {text}");
        }
    }
    let err = check("nccl", &mut json!([1])).unwrap_err();
    assert!(err.to_string().contains("object"), "{err}");
    let err = check("warp-drive", &mut json!({})).unwrap_err();
    assert!(matches!(err, SpecParamsError::UnknownKind(_)));
    assert!(
        err.to_string().contains("nccl") && err.to_string().contains("sleep"),
        "{err}"
    );
}

#[test]
fn collective_aliases_are_canonicalised_and_the_rest_kept() {
    let mut p = json!({"op": "allreduce", "dtype": "bf16", "min_bytes": 1024});
    check("nccl", &mut p).unwrap();
    assert_eq!(
        p,
        json!({"op": "all_reduce", "dtype": "bf16", "min_bytes": 1024})
    );
    let mut p = json!({"op": "All-Gather", "grid": {"NCCL_PROTO": ["LL", 4]}});
    check("sweep", &mut p).unwrap();
    assert_eq!(p["op"], "all_gather");
    let mut p = json!({"tests": ["tag_bw"]});
    check("ucx", &mut p).unwrap();
    assert_eq!(p, json!({"tests": ["tag_bw"]}));
    let mut p = Value::Null;
    check("nccl", &mut p).unwrap();
    assert_eq!(p, Value::Null);
}

#[test]
fn sweep_cells_are_the_cartesian_product() {
    let p = SweepParams::decode(
        &json!({"grid": {"NCCL_PROTO": ["LL", "Simple"], "NCCL_ALGO": ["Ring", "Tree", "NVLS"], "NCCL_NCHANNELS": [4]}}),
    )
    .unwrap();
    let c = p.cells().unwrap();
    assert_eq!(c.len(), 6);
    assert_eq!(c[0]["NCCL_ALGO"], "Ring");
    assert_eq!(c[0]["NCCL_PROTO"], "LL");
    assert_eq!(c[0]["NCCL_NCHANNELS"], "4");
    assert_eq!(c[5]["NCCL_ALGO"], "NVLS");
}

#[test]
fn budgets_parse_as_durations_or_seconds() {
    use std::time::Duration;
    assert_eq!(parse_budget("10s").unwrap(), Duration::from_secs(10));
    assert_eq!(parse_budget("500ms").unwrap(), Duration::from_millis(500));
    assert_eq!(parse_budget("1.5").unwrap(), Duration::from_millis(1500));
    for bad in ["", "-1", "ten seconds"] {
        assert!(parse_budget(bad).is_err(), "{bad}");
    }
    let p = NcclParams::decode(&json!({"budget": 2.5})).unwrap();
    assert_eq!(
        p.budget.unwrap().duration().unwrap(),
        Duration::from_millis(2500)
    );
}

#[test]
fn the_catalogue_describes_every_param() {
    let cat = catalogue();
    assert_eq!(cat.len(), KINDS.len());
    let nccl = cat.iter().find(|k| k.name == "nccl").unwrap();
    let iters = nccl.params.iter().find(|p| p.name == "iters").unwrap();
    assert_eq!(
        (
            iters.ty,
            iters.default.clone(),
            iters.min,
            iters.unit.as_deref()
        ),
        (
            ParamType::Integer,
            Some(json!(20)),
            Some(1.0),
            Some("iterations")
        )
    );
    let op = nccl.params.iter().find(|p| p.name == "op").unwrap();
    assert_eq!(op.choices.len(), 7);
    for k in &cat {
        assert!(!k.description.is_empty());
        for p in &k.params {
            assert!(!p.help.is_empty(), "{}.{}", k.name, p.name);
        }
    }
    let back: Vec<RunKind> = serde_json::from_value(serde_json::to_value(&cat).unwrap()).unwrap();
    assert_eq!(back, cat);
}

/// [`check_params`] on a JSON value, rewriting it as a run would store it.
fn check(kind: &str, params: &mut Value) -> Result<(), SpecParamsError> {
    let checked = check_params(kind, &Params::new(kind, params.clone()))?;
    *params = checked.raw().clone();
    Ok(())
}

/// `params` decoded as `k`'s and encoded again (defaults filled in).
fn decode(k: &KindEntry, params: &Value) -> Result<Value, SpecParamsError> {
    RunParams::decode(k.name, params).map(|t| t.to_value())
}
