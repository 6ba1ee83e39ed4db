//! Tests of `json`.

use super::parse::special;
use serde_json::json;

use super::*;

fn parsed(src: &str) -> serde_json::Value {
    Tape::parse(src).unwrap().root(src).to_value()
}

#[test]
fn agrees_with_serde_json() {
    let docs = [
        r#"{"a": {"b": [1, {"c": "x"}]}, "d~/e": 2, "n": null, "t": true, "f": false}"#,
        r#"[ -0, 1.5e3, -2E-2, 18446744073709551615, 1.0, "", "é ü \u00e9 \"q\" \\ \/ \n", {} , [] ]"#,
        r#"  "just a string"  "#,
        r#"{"escaped\tkey": "v", "gids": ["0000:0000:0000:0000:0000:ffff:0a00:0001", "fe80::1"]}"#,
        "{\"long\": \"abcdefghijklmnopqrstuvwxyz0123456789 and some more text past eight\"}",
    ];
    for doc in docs {
        let want: serde_json::Value = serde_json::from_str(doc).unwrap();
        assert_eq!(parsed(doc), want, "{doc}");
    }
}

#[test]
fn reads_the_fixtures_as_serde_json_does() {
    for src in [
        include_str!("../../../fixtures/azure-nd40rs-v2.json"),
        include_str!("../../../fixtures/dgx1.json"),
        include_str!("../../../fixtures/runai-roce.json"),
    ] {
        let want: serde_json::Value = serde_json::from_str(src).unwrap();
        let tape = Tape::parse(src).unwrap();
        assert_eq!(tape.root(src).to_value(), want);
        // Every pointer to every value finds the same value.
        fn walk(v: &serde_json::Value, at: String, out: &mut Vec<(String, serde_json::Value)>) {
            out.push((at.clone(), v.clone()));
            match v {
                serde_json::Value::Object(m) => m.iter().for_each(|(k, c)| {
                    walk(
                        c,
                        format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")),
                        out,
                    )
                }),
                serde_json::Value::Array(a) => a
                    .iter()
                    .enumerate()
                    .for_each(|(i, c)| walk(c, format!("{at}/{i}"), out)),
                _ => {}
            }
        }
        let mut all = Vec::new();
        walk(&want, String::new(), &mut all);
        for (pointer, value) in all {
            assert_eq!(
                tape.root(src).pointer(&pointer).map(Json::to_value),
                Some(value),
                "{pointer}"
            );
        }
    }
}

#[test]
fn refuses_what_serde_json_refuses() {
    for bad in [
        "",
        " ",
        "{",
        "[1,]",
        "[1 2]",
        "{\"a\"}",
        "{\"a\":}",
        "{\"a\":1,}",
        "{\"a\":1",
        "{a:1}",
        "[01]",
        "[1.]",
        "[.5]",
        "[1e]",
        "[-]",
        "[tru]",
        "[nul]",
        "\"x",
        "\"\\x\"",
        "\"\\u12\"",
        "\"a\nb\"",
        "[1] [2]",
        "{}x",
        "]",
        "[\"\\ud800\"]",
    ] {
        assert!(
            serde_json::from_str::<serde_json::Value>(bad).is_err(),
            "serde_json accepts {bad:?}"
        );
        assert!(Tape::parse(bad).is_err(), "accepted {bad:?}");
    }
    let deep = format!("{}1{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
    assert!(Tape::parse(&deep).is_ok());
    let deeper = format!(
        "{}1{}",
        "[".repeat(MAX_DEPTH + 1),
        "]".repeat(MAX_DEPTH + 1)
    );
    assert_eq!(
        Tape::parse(&deeper).unwrap_err().what,
        "nested more than 128 levels deep"
    );
}

#[test]
fn lookups_borrow_and_skip_subtrees() {
    let src = r#"{"gpus": [{"index": 0, "numa": [0, 1]}, {"index": 1}], "a/b": {"c~d": 7}, "k": 1, "k": 2}"#;
    let tape = Tape::parse(src).unwrap();
    let root = tape.root(src);
    assert_eq!(
        root.pointer("/gpus/1/index").and_then(Json::as_u64),
        Some(1)
    );
    assert_eq!(
        root.pointer("/gpus/0/numa/1").and_then(Json::as_u64),
        Some(1)
    );
    assert_eq!(root.pointer("/a~1b/c~0d").and_then(Json::as_i64), Some(7));
    assert_eq!(
        root.get("k").and_then(Json::as_u64),
        Some(1),
        "the first duplicate is found"
    );
    assert!(
        root.pointer("/gpus/01").is_none()
            && root.pointer("/gpus/2").is_none()
            && root.pointer("x").is_none()
    );
    assert_eq!(root.pointer("").unwrap().len(), 4);
    let gpus = root.get("gpus").unwrap();
    assert_eq!((gpus.len(), gpus.as_array().unwrap().len()), (2, 2));
    assert_eq!(
        (root.get("a/b").unwrap().len(), root.get("k").unwrap().len()),
        (1, 0)
    );
    assert_eq!(
        gpus.raw(),
        r#"[{"index": 0, "numa": [0, 1]}, {"index": 1}]"#
    );
    assert_eq!(root.keys().collect::<Vec<_>>(), ["gpus", "a/b", "k", "k"]);
    assert_eq!(gpus.get(0).unwrap(), json!({"index": 0, "numa": [0, 1]}));
    assert_eq!(format!("{}", root.get("a/b").unwrap()), r#"{"c~d":7}"#);
}

#[test]
fn numbers_convert_only_when_they_fit() {
    let src = "[18446744073709551615, -1, 1.0, 2e3, 3]";
    let tape = Tape::parse(src).unwrap();
    let n: Vec<Json> = tape.root(src).as_array().unwrap().collect();
    assert_eq!(n[0].as_u64(), Some(u64::MAX));
    assert_eq!((n[1].as_u64(), n[1].as_i64()), (None, Some(-1)));
    assert_eq!((n[2].as_u64(), n[2].as_f64()), (None, Some(1.0)));
    assert_eq!(n[3].as_f64(), Some(2000.0));
    assert_eq!(n[4].as_str(), None);
}

#[test]
fn special_bytes_are_found_in_any_lane() {
    for len in 0usize..20 {
        for (pos, c) in [
            (0usize, b'"'),
            (3, b'\\'),
            (7, 0x1f),
            (len.saturating_sub(1), b'"'),
        ] {
            let mut b = vec![b'a'; len];
            if pos < len {
                b[pos] = c;
                assert_eq!(special(&b, 0), pos, "{len} {pos} {c}");
            } else {
                assert_eq!(special(&b, 0), len);
            }
        }
        // Bytes above 0x7f (UTF-8) are never special.
        let b = "é".repeat(len).into_bytes();
        assert_eq!(special(&b, 0), b.len());
    }
}
