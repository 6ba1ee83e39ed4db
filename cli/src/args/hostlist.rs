//! Slurm's hostlist syntax for `--nodes`: `gpu-node-[01-16,20]`, several bracket groups
//! (`rack[1-2]-n[1-4]`), lists (`a,b[1-2]`). Names keep their order (ranks follow it) and
//! the zero padding of each range's first number; nothing is sorted or deduplicated.

/// The most names one `--nodes` may expand to: the API's own limit on a pre-flight, and
/// far beyond any run's. Checked before anything is expanded, so `[1-99999999]` costs
/// nothing.
pub const MAX_NODES: usize = 4096;

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

/// Expands a hostlist expression into names.
pub fn expand(s: &str) -> Result<NodeList, String> {
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
        let parts = parse_item(item)?;
        let mut count: usize = 1;
        for p in &parts {
            if let Part::Group(g) = p {
                count = count.saturating_mul(g.len());
            }
        }
        if count.saturating_add(names.len()) > MAX_NODES {
            return Err(format!("{s:?} expands to more than {MAX_NODES} names"));
        }
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

fn parse_item(item: &str) -> Result<Vec<Part>, String> {
    let mut parts = Vec::new();
    let mut rest = item;
    while !rest.is_empty() {
        match rest.find('[') {
            Some(0) => {
                let end = rest.find(']').expect("brackets were checked");
                parts.push(Part::Group(parse_group(item, &rest[1..end])?));
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
    }
    Ok(parts)
}

/// `01-16,20`: the numbers of one bracket group, each padded to its range's first number.
fn parse_group(item: &str, group: &str) -> Result<Vec<String>, String> {
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
        if len > (MAX_NODES - out.len()) as u64 {
            return Err(format!(
                "{item:?}: [{group}] expands to more than {MAX_NODES} names"
            ));
        }
        let width = lo.len();
        out.extend((a..=b).map(|n| format!("{n:0width$}")));
    }
    Ok(out)
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
}
