//! What the property tests of hostile input share (the agent's `hostile_props` and
//! `facts/hostile_props.rs`, `heddle-types`' `hostile_props`, the server's
//! `hostile_json`): generators of arbitrary and mutated bytes seeded from real inputs, the
//! case count, and the time and size bounds every parser must keep.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use proptest::prelude::*;

/// Cases per property unless `PROPTEST_CASES` says otherwise; failures are not written
/// beside the sources (the corpus holds regressions).
pub fn config(cases: u32) -> proptest::test_runner::Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    proptest::test_runner::Config {
        failure_persistence: None,
        ..proptest::test_runner::Config::with_cases(cases)
    }
}

/// How long one parse of one case may take: inputs here are under a megabyte, and every
/// parser is linear, so this is far above a real answer's time even in a debug build.
pub const SLOW: Duration = Duration::from_secs(2);

/// `f(input)`, failing the case when it took longer than [`SLOW`].
pub fn timed<T>(input: &[u8], f: impl FnOnce() -> T) -> Result<T, TestCaseError> {
    let start = Instant::now();
    let out = f();
    let took = start.elapsed();
    if took > SLOW {
        return Err(TestCaseError::fail(format!(
            "{took:?} for {} bytes",
            input.len()
        )));
    }
    Ok(out)
}

/// Fails the case when `output`, as JSON, is larger than `factor` bytes per input byte
/// plus 4 KiB of fixed fields. JSON escapes a control character in 6 bytes and a parser
/// may keep a line twice (a warning that is also a reason), so 16 allows every linear
/// answer and catches one that copies a long line per later line.
pub fn bounded<T: serde::Serialize>(
    input: &[u8],
    output: &T,
    factor: usize,
) -> Result<(), TestCaseError> {
    let size = serde_json::to_vec(output).map(|v| v.len()).unwrap_or(0);
    let limit = factor * input.len() + 4096;
    if size > limit {
        return Err(TestCaseError::fail(format!(
            "{size} bytes of output for {} bytes of input (limit {limit})",
            input.len()
        )));
    }
    Ok(())
}

/// The agent's captures named (`agent/tests/captures/`), then every file of
/// `agent/tests/corpus/<corpus>/`.
pub fn seeds(captures: &[&str], corpus: &str) -> Vec<Vec<u8>> {
    let agent_dir: PathBuf = crate::files::repo().join("agent");
    let mut out: Vec<Vec<u8>> = captures
        .iter()
        .map(|c| {
            let path = agent_dir.join("tests/captures").join(c);
            std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        })
        .collect();
    let dir = agent_dir.join("tests/corpus").join(corpus);
    if let Ok(rd) = std::fs::read_dir(&dir) {
        let mut paths: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        out.extend(paths.iter().filter_map(|p| std::fs::read(p).ok()));
    }
    assert!(!out.is_empty(), "no seeds for {corpus}");
    out
}

/// Bytes that break parsers: numbers past every integer type, floats that are not
/// numbers, control characters, bytes that are not UTF-8 (a lone surrogate as CESU-8
/// among them), a bidirectional override, and long runs.
fn nasty() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 1..16),
        Just(b"18446744073709551616".to_vec()),
        Just(b"999999999999999999999999999999999999999999".to_vec()),
        Just(b"-1".to_vec()),
        Just(b"-9223372036854775809".to_vec()),
        Just(b"1e309".to_vec()),
        Just(b"NaN".to_vec()),
        Just(b"inf".to_vec()),
        Just(b"\0".to_vec()),
        Just(b"\x1b[2J".to_vec()),
        Just(b"\r".to_vec()),
        Just(b"\n".to_vec()),
        Just(b"\t".to_vec()),
        Just(b"\xff\xfe".to_vec()),
        Just(b"\xed\xa0\x80".to_vec()),
        Just("\u{202e}".as_bytes().to_vec()),
        (1usize..4096).prop_map(|n| vec![b'9'; n]),
        (1usize..4096).prop_map(|n| vec![b'x'; n]),
        (1usize..512).prop_map(|n| vec![b' '; n]),
    ]
}

/// A place in an input, as a fraction of its length.
#[derive(Debug, Clone, Copy)]
struct Index(f64);

impl Index {
    /// A position below `len` (0 when `len` is 0).
    fn index(self, len: usize) -> usize {
        ((self.0 * len as f64) as usize).min(len.saturating_sub(1))
    }
}

fn place() -> impl Strategy<Value = Index> {
    (0.0f64..1.0).prop_map(Index)
}

/// One change to an input.
#[derive(Debug, Clone)]
enum Edit {
    /// Replaces a byte.
    Flip(Index, u8),
    /// Inserts [`nasty`] bytes.
    Insert(Index, Vec<u8>),
    /// Removes up to 64 bytes.
    Remove(Index, usize),
    /// Repeats the line around a byte, up to 256 times.
    Repeat(Index, usize),
    /// Cuts the input short.
    Truncate(Index),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        3 => (place(), any::<u8>()).prop_map(|(i, b)| Edit::Flip(i, b)),
        3 => (place(), nasty()).prop_map(|(i, b)| Edit::Insert(i, b)),
        1 => (place(), 1usize..64).prop_map(|(i, n)| Edit::Remove(i, n)),
        2 => (place(), 1usize..256).prop_map(|(i, n)| Edit::Repeat(i, n)),
        1 => place().prop_map(Edit::Truncate),
    ]
}

fn apply(mut b: Vec<u8>, edit: &Edit) -> Vec<u8> {
    if b.is_empty() {
        if let Edit::Insert(_, bytes) = edit {
            return bytes.clone();
        }
        return b;
    }
    match edit {
        Edit::Flip(i, byte) => {
            let at = i.index(b.len());
            b[at] = *byte;
        }
        Edit::Insert(i, bytes) => {
            let at = i.index(b.len() + 1);
            b.splice(at..at, bytes.iter().copied());
        }
        Edit::Remove(i, n) => {
            let at = i.index(b.len());
            let end = (at + n).min(b.len());
            b.drain(at..end);
        }
        Edit::Repeat(i, n) => {
            let at = i.index(b.len());
            let start = b[..at]
                .iter()
                .rposition(|c| *c == b'\n')
                .map_or(0, |p| p + 1);
            let end = b[at..]
                .iter()
                .position(|c| *c == b'\n')
                .map_or(b.len(), |p| at + p + 1);
            let mut line = b[start..end].to_vec();
            if line.last() != Some(&b'\n') {
                line.push(b'\n');
            }
            let copies: Vec<u8> = line.repeat(*n);
            b.splice(end..end, copies);
        }
        Edit::Truncate(i) => b.truncate(i.index(b.len() + 1)),
    }
    b
}

/// A seed with up to 8 edits.
pub fn mutated(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    (
        proptest::sample::select(seeds),
        proptest::collection::vec(edit(), 0..8),
    )
        .prop_map(|(seed, edits)| edits.iter().fold(seed, apply))
}

/// One real input with a few bytes replaced, inserted or removed, or cut short (to at
/// least half its length).
pub fn mutated_bytes(base: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    let len = base.len();
    (
        proptest::collection::vec((0..len, any::<u8>(), 0u8..3), 0..8),
        0..=len,
    )
        .prop_map(move |(edits, cut)| {
            let mut b = base.clone();
            for (at, byte, how) in edits {
                let at = at.min(b.len().saturating_sub(1));
                match how {
                    0 if !b.is_empty() => b[at] = byte,
                    1 => b.insert(at, byte),
                    _ if !b.is_empty() => {
                        b.remove(at);
                    }
                    _ => {}
                }
            }
            b.truncate(cut.max(b.len() / 2));
            b
        })
}

/// A valid JSON body with up to six bytes replaced, inserted or removed, or a JSON-ish
/// token put in.
pub fn mutated_json(valid: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    let token = prop_oneof![
        any::<u8>().prop_map(|b| vec![b]),
        Just(br"\ud800".to_vec()),
        Just(br"\u0000".to_vec()),
        Just(b"1e400".to_vec()),
        Just(b"18446744073709551616".to_vec()),
        Just(b"\xef\xbb\xbf".to_vec()),
        Just(b"\xed\xa0\x80".to_vec()),
        Just(b"\xff".to_vec()),
        Just(b"{".to_vec()),
        Just(b"[".to_vec()),
        Just(b"\"".to_vec()),
        Just(b",".to_vec()),
        Just(b"null".to_vec()),
    ];
    let len = valid.len();
    proptest::collection::vec((0..len, token, any::<bool>()), 1..6).prop_map(move |edits| {
        let mut b = valid.clone();
        for (at, bytes, replace) in edits {
            let at = at.min(b.len());
            if replace && at < b.len() {
                b.splice(at..at + 1, bytes);
            } else {
                b.splice(at..at, bytes);
            }
        }
        b
    })
}

/// A seed with one word of an early line stretched to up to 4 KiB and a later line repeated
/// up to 512 times: the shape that catches a parser keeping a header's or a section's
/// value in every line below it (a perftest column name, a UCX memory domain), which
/// random edits rarely build.
pub fn amplified(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    (
        proptest::sample::select(seeds),
        place(),
        place(),
        place(),
        1usize..4096,
        1usize..512,
    )
        .prop_map(|(seed, early, word, later, stretch, copies)| {
            let mut lines: Vec<Vec<u8>> = seed.split(|b| *b == b'\n').map(<[u8]>::to_vec).collect();
            let i = early.index(lines.len());
            let line = &mut lines[i];
            if !line.is_empty() {
                // Repeat one byte of a word (not a separator) so the word grows in place.
                let at = word.index(line.len());
                let byte = if line[at].is_ascii_whitespace() {
                    b'x'
                } else {
                    line[at]
                };
                line.splice(at..at, std::iter::repeat_n(byte, stretch));
            }
            let j = i + later.index(lines.len() - i);
            let copy = lines[j].clone();
            lines.splice(j..j, std::iter::repeat_n(copy, copies));
            lines.join(&b'\n')
        })
}

/// Lines made of `words` (a format's own markers), numbers and noise: past a parser's
/// first checks more often than arbitrary bytes.
pub fn lines_of(words: &'static [&'static str]) -> impl Strategy<Value = Vec<u8>> {
    let token = prop_oneof![
        4 => proptest::sample::select(words).prop_map(|w| w.as_bytes().to_vec()),
        2 => "[0-9]{1,24}".prop_map(String::into_bytes),
        1 => nasty(),
        1 => Just(b" ".to_vec()),
    ];
    let line = proptest::collection::vec(token, 0..12).prop_map(|t| t.concat());
    proptest::collection::vec(line, 0..64).prop_map(|l| l.join(&b'\n'))
}

/// Arbitrary bytes, as many as a small capture.
pub fn any_bytes() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..4096)
}

/// What the agent makes of a tool's output: text, invalid UTF-8 replaced.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn edits_change_what_they_say() {
    let b = b"one\ntwo\nthree".to_vec();
    assert_eq!(
        apply(b.clone(), &Edit::Repeat(Index(0.4), 2)),
        b"one\ntwo\ntwo\ntwo\nthree"
    );
    assert_eq!(apply(b.clone(), &Edit::Truncate(Index(0.0))), b"");
    assert_eq!(
        apply(b.clone(), &Edit::Insert(Index(0.0), b"x".to_vec())),
        b"xone\ntwo\nthree"
    );
    assert_eq!(apply(b, &Edit::Remove(Index(0.0), 4)), b"two\nthree");
}
