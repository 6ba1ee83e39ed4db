//! Slurm's hostlist syntax, as the CLI's `--nodes` and Slurm's own files (`topology.conf`)
//! write it: `gpu-node-[01-16,20]`, several bracket groups (`rack[1-2]-n[1-4]`), lists
//! (`a,b[1-2]`). Names keep their order (ranks follow it) and the zero padding of each
//! range's first number; nothing is sorted or deduplicated.

/// The most names one `--nodes` may expand to: the API's own limit on a pre-flight, and
/// far beyond any run's. Checked before anything is expanded, so `[1-99999999]` costs
/// nothing. Readers of whole fabrics pass their own bound to [`expand_at_most`].
pub const MAX_NODES: usize = 4096;

use crate::names::HOSTNAME;

/// Longest number in a range: 18 digits always fit in a `u64`.
const MAX_DIGITS: usize = 18;

/// The names one `--nodes` value expands to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeList(pub Vec<String>);

/// One name pattern: literal text and bracket groups, in order.
enum Part {
    Text(String),
    Group(Vec<String>),
}

/// Expands a hostlist expression into at most [`MAX_NODES`] names.
pub fn expand(s: &str) -> Result<NodeList, String> {
    expand_at_most(s, MAX_NODES)
}

/// Expands a hostlist expression into at most `max` names; more is an error, found before
/// anything past the bound is made.
pub fn expand_at_most(s: &str, max: usize) -> Result<NodeList, String> {
    let mut names = Vec::new();
    for item in split_top_level(s)? {
        let item = item.trim();
        if item.is_empty() {
            return Err(format!(
                "{s:?} has an empty name (two commas, or one at an end)"
            ));
        }
        if item.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!("{item:?}: a node name has no spaces"));
        }
        let parts = parse_item(item, max - names.len(), max)
            .map_err(|e| e.unwrap_or_else(|| format!("{s:?} expands to more than {max} names")))?;
        let mut expanded = vec![String::new()];
        for p in &parts {
            expanded = match p {
                Part::Text(t) => expanded.into_iter().map(|e| e + t).collect(),
                // The first group varies slowest, as Slurm writes them out.
                Part::Group(g) => expanded
                    .iter()
                    .flat_map(|e| g.iter().map(move |n| format!("{e}{n}")))
                    .collect(),
            };
        }
        names.extend(expanded);
    }
    Ok(NodeList(names))
}

/// Splits at the commas outside brackets, checking that brackets pair up.
fn split_top_level(s: &str) -> Result<Vec<&str>, String> {
    let mut items = Vec::new();
    let (mut open, mut start) = (false, 0);
    for (i, c) in s.char_indices() {
        match c {
            '[' if open => return Err(format!("{s:?}: brackets do not nest")),
            '[' => open = true,
            ']' if !open => return Err(format!("{s:?}: ']' without '['")),
            ']' => open = false,
            ',' if !open => {
                items.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if open {
        return Err(format!("{s:?}: '[' is not closed"));
    }
    items.push(&s[start..]);
    Ok(items)
}

/// The parts of one name pattern that expands to at most `room` names; `Err(None)` when
/// it would expand to more. Checked group by group, so `[1-4096]` written ten thousand
/// times is refused at its second group rather than after it was all parsed, and the
/// longest name it makes is checked against the host name rule, so that no name is longer
/// than a node's may be.
fn parse_item(item: &str, room: usize, max: usize) -> Result<Vec<Part>, Option<String>> {
    let mut parts = Vec::new();
    let mut rest = item;
    let (mut count, mut longest) = (1usize, 0usize);
    while !rest.is_empty() {
        match rest.find('[') {
            Some(0) => {
                let end = rest.find(']').expect("brackets were checked");
                let group = parse_group(item, &rest[1..end], max)?;
                count = count.saturating_mul(group.len());
                if count > room {
                    return Err(None);
                }
                longest += group.iter().map(String::len).max().unwrap_or(0);
                parts.push(Part::Group(group));
                rest = &rest[end + 1..];
            }
            Some(i) => {
                parts.push(Part::Text(rest[..i].to_string()));
                rest = &rest[i..];
            }
            None => {
                parts.push(Part::Text(rest.to_string()));
                rest = "";
            }
        }
        if let Some(Part::Text(t)) = parts.last() {
            longest += t.len();
        }
        if longest > HOSTNAME.max_len {
            return Err(Some(format!(
                "{item:?} makes names longer than {} characters",
                HOSTNAME.max_len
            )));
        }
    }
    // A name without a group is one name too.
    if count > room {
        return Err(None);
    }
    Ok(parts)
}

/// `01-16,20`: the numbers of one bracket group, each padded to its range's first number.
fn parse_group(item: &str, group: &str, max: usize) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for range in group.split(',') {
        let (lo, hi) = range.split_once('-').unwrap_or((range, range));
        for n in [lo, hi] {
            if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!(
                    "{item:?}: [{group}] must hold numbers and ranges like [01-16,20]"
                ));
            }
            if n.len() > MAX_DIGITS {
                return Err(format!("{item:?}: {n} has more than {MAX_DIGITS} digits"));
            }
        }
        let (a, b): (u64, u64) = (lo.parse().unwrap(), hi.parse().unwrap());
        if a > b {
            return Err(format!("{item:?}: the range {range} runs backwards"));
        }
        let len = b - a + 1;
        if len > (max - out.len()) as u64 {
            return Err(format!(
                "{item:?}: [{group}] expands to more than {max} names"
            ));
        }
        let width = lo.len();
        out.extend((a..=b).map(|n| format!("{n:0width$}")));
    }
    Ok(out)
}

/// The shortest hostlist this module writes for `names`, in their order: runs of names
/// that differ only in a trailing number counting up by one become ranges
/// (`n01,n02,n03,n07` → `n[01-03,07]`). [`expand_at_most`] gives the same names back, in
/// the same order (duplicates included).
pub fn compress<S: AsRef<str>>(names: &[S]) -> String {
    /// One name pattern being built: a prefix and its ranges (first number's text, last number).
    struct Run<'a> {
        prefix: &'a str,
        ranges: Vec<(&'a str, u64)>,
    }
    fn write(out: &mut String, run: Run<'_>) {
        if !out.is_empty() {
            out.push(',');
        }
        out.push_str(run.prefix);
        if run.ranges.is_empty() {
            return;
        }
        if let [(lo, hi)] = run.ranges[..]
            && lo.parse::<u64>() == Ok(hi)
        {
            out.push_str(lo);
            return;
        }
        out.push('[');
        for (i, (lo, hi)) in run.ranges.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(lo);
            if lo.parse::<u64>() != Ok(*hi) {
                out.push_str(&format!("-{hi:0width$}", width = lo.len()));
            }
        }
        out.push(']');
    }
    let mut out = String::new();
    let mut run: Option<Run<'_>> = None;
    for name in names {
        let name = name.as_ref();
        let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        let digits = if digits > MAX_DIGITS { 0 } else { digits };
        let (prefix, number) = name.split_at(name.len() - digits);
        let Ok(n) = number.parse::<u64>() else {
            if let Some(r) = run.take() {
                write(&mut out, r);
            }
            write(
                &mut out,
                Run {
                    prefix: name,
                    ranges: Vec::new(),
                },
            );
            continue;
        };
        match &mut run {
            Some(r) if r.prefix == prefix => {
                let last = r.ranges.last_mut().expect("a run has a range");
                let follows = last.1.checked_add(1) == Some(n)
                    && format!("{n:0width$}", width = last.0.len()) == number;
                if follows {
                    last.1 = n;
                } else {
                    r.ranges.push((number, n));
                }
            }
            _ => {
                if let Some(r) = run.take() {
                    write(&mut out, r);
                }
                run = Some(Run {
                    prefix,
                    ranges: vec![(number, n)],
                });
            }
        }
    }
    if let Some(r) = run {
        write(&mut out, r);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(s: &str) -> Vec<String> {
        expand(s).unwrap_or_else(|e| panic!("{s}: {e}")).0
    }

    #[test]
    fn plain_names_and_lists() {
        assert_eq!(names("gpu-node-7"), ["gpu-node-7"]);
        assert_eq!(names("b,a"), ["b", "a"]);
        assert_eq!(names(" a , b "), ["a", "b"]);
        // Node ids are names too.
        let id = "6f1c2a9e-8d43-4f0e-9a51-0c2b7e1d3f40";
        assert_eq!(names(id), [id]);
    }

    #[test]
    fn ranges_keep_zero_padding_and_order() {
        assert_eq!(
            names("gpu-node-[01-03,20]"),
            ["gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-20"]
        );
        assert_eq!(names("n[8-10]"), ["n8", "n9", "n10"]);
        assert_eq!(names("n[098-101]"), ["n098", "n099", "n100", "n101"]);
        assert_eq!(names("n[5]"), ["n5"]);
        assert_eq!(names("n[3,1]"), ["n3", "n1"]);
        assert_eq!(names("gpu-node-[01-16,20]").len(), 17);
    }

    #[test]
    fn several_groups_and_lists() {
        assert_eq!(
            names("rack[1-2]-n[01-02]"),
            ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]
        );
        assert_eq!(names("a,b[1-2]"), ["a", "b1", "b2"]);
        assert_eq!(names("[1-2]x"), ["1x", "2x"]);
        assert_eq!(
            names("a[1-2].dc,b[9-10].dc"),
            ["a1.dc", "a2.dc", "b9.dc", "b10.dc"]
        );
    }

    #[test]
    fn compressed_lists_are_short_and_read_back() {
        for (names, want) in [
            (&["n01", "n02", "n03", "n07"][..], "n[01-03,07]"),
            (&["n9", "n10", "n11"], "n[9-11]"),
            (&["n1", "n02"], "n[1,02]"),
            (&["gpu-0412"], "gpu-0412"),
            (&["login", "n1", "n2", "m1", "n3"], "login,n[1-2],m1,n3"),
            (&["n1", "n1"], "n[1,1]"),
            (
                &["rack1-n01", "rack1-n02", "rack2-n01"],
                "rack1-n[01-02],rack2-n01",
            ),
            (&["3", "4"], "[3-4]"),
            (&[], ""),
        ] {
            assert_eq!(compress(names), want, "{names:?}");
            if !names.is_empty() {
                assert_eq!(super::expand(want).unwrap().0, names, "{want}");
            }
        }
        let long = format!("n{}", "1".repeat(30));
        assert_eq!(compress(std::slice::from_ref(&long)), long);
    }

    #[test]
    fn malformed_lists_say_what_is_wrong() {
        for (bad, want) in [
            ("", "empty name"),
            ("a,,b", "empty name"),
            ("a,", "empty name"),
            ("n[1-3", "not closed"),
            ("n1-3]", "without '['"),
            ("n[[1]]", "do not nest"),
            ("n[]", "numbers and ranges"),
            ("n[a-c]", "numbers and ranges"),
            ("n[1-]", "numbers and ranges"),
            ("n[1,,2]", "numbers and ranges"),
            ("n[-1]", "numbers and ranges"),
            ("n[5-1]", "runs backwards"),
            ("n[1-2 ]", "no spaces"),
            ("gpu node", "no spaces"),
            ("a\tb", "no spaces"),
            ("n[1234567890123456789]", "digits"),
        ] {
            let err = expand(bad).unwrap_err();
            assert!(err.contains(want), "{bad:?}: {err}");
        }
    }

    #[test]
    fn readers_of_whole_fabrics_set_their_own_bound() {
        assert_eq!(
            expand_at_most("n[00001-10000]", 20_000).unwrap().0.len(),
            10_000
        );
        assert!(
            expand("n[00001-10000]")
                .unwrap_err()
                .contains("more than 4096")
        );
        assert!(
            expand_at_most("a,b,c", 2)
                .unwrap_err()
                .contains("more than 2")
        );
    }

    #[test]
    fn huge_ranges_are_refused_before_expanding() {
        for hostile in [
            "n[1-99999999]",
            "n[0-999999999999999999]",
            "a[1-100]b[1-100]",
            "a[1-64]b[1-64]c[1-64]d[1-64]e[1-64]f[1-64]g[1-64]h[1-64]i[1-64]j[1-64]k[1-64]",
        ] {
            let err = expand(hostile).unwrap_err();
            assert!(
                err.contains(&format!("more than {MAX_NODES}")),
                "{hostile}: {err}"
            );
        }
        assert_eq!(
            expand(&format!("n[1-{MAX_NODES}]")).unwrap().0.len(),
            MAX_NODES
        );
        let list = format!("n[1-{MAX_NODES}],x");
        assert!(expand(&list).unwrap_err().contains("more than"));
    }

    /// The largest input a strategy below makes, and how long one may take to expand.
    const SLOW: std::time::Duration = std::time::Duration::from_secs(1);

    fn config() -> proptest::test_runner::Config {
        let cases = std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(512);
        proptest::test_runner::Config {
            failure_persistence: None,
            ..proptest::test_runner::Config::with_cases(cases)
        }
    }

    /// Text made of the syntax's own pieces, so most cases get past the first check.
    fn hostlist_like() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just("[".to_string()),
            Just("]".to_string()),
            Just(",".to_string()),
            Just("-".to_string()),
            Just("[1-4096]".to_string()),
            Just("[0-999999999999999999]".to_string()),
            "[0-9]{1,20}",
            "[a-z.-]{1,12}",
            "\\PC{0,3}",
            (1usize..300).prop_map(|n| "x".repeat(n)),
        ];
        proptest::collection::vec(piece, 0..40).prop_map(|p| p.concat())
    }

    use proptest::prelude::*;

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn any_text_expands_to_a_bounded_list_or_an_error(s in prop_oneof![hostlist_like(), "\\PC{0,200}"]) {
            let start = std::time::Instant::now();
            let out = expand(&s);
            prop_assert!(start.elapsed() < SLOW, "{:?} took {:?}", s, start.elapsed());
            match out {
                Ok(NodeList(names)) => {
                    prop_assert!(names.len() <= MAX_NODES);
                    for n in &names {
                        prop_assert!(!n.is_empty() && n.len() <= HOSTNAME.max_len, "{:?}", n);
                    }
                }
                Err(e) => prop_assert!(e.len() <= 16 * s.len() + 200, "{}", e),
            }
        }

        #[test]
        fn plain_lists_read_back_as_written(names in proptest::collection::vec("[a-z][a-z0-9.-]{0,30}", 1..50)) {
            prop_assert_eq!(expand(&names.join(",")).unwrap().0, names);
        }

        #[test]
        fn compressed_lists_expand_to_the_same_names(names in proptest::collection::vec("[a-c]{1,2}[0-9]{0,3}", 1..60)) {
            prop_assert_eq!(expand_at_most(&compress(&names), 1000).unwrap().0, names);
        }

        #[test]
        fn ranges_expand_in_order_with_padding(prefix in "[a-z]{1,10}", lo in 0u64..5000, len in 1u64..100, width in 1usize..8) {
            let hi = lo + len - 1;
            let text = format!("{prefix}[{lo:0width$}-{hi}]");
            let want: Vec<String> = (lo..=hi).map(|n| format!("{prefix}{n:0width$}")).collect();
            prop_assert_eq!(expand(&text).unwrap().0, want);
        }
    }

    #[test]
    fn many_groups_and_long_names_are_refused_early() {
        // Each group alone is allowed; their product is refused at the second one, before
        // ten thousand of them are parsed into 4096 numbers each.
        let groups = format!("n{}", "[1-4096]".repeat(10_000));
        let start = std::time::Instant::now();
        assert!(expand(&groups).unwrap_err().contains("more than"));
        assert!(start.elapsed() < SLOW);
        // 4096 names of 100 kB each would be 400 MB.
        let long = format!("{}[1-4096]", "x".repeat(100_000));
        assert!(expand(&long).unwrap_err().contains("longer than 253"));
        assert_eq!(names(&"y".repeat(253)).len(), 1);
        assert!(expand(&"y".repeat(254)).is_err());
        assert_eq!(
            expand(&format!("{}[1-9]", "y".repeat(252)))
                .unwrap()
                .0
                .len(),
            9
        );
    }
}
