//! Durations as people type them, in flags and job parameters: humantime's syntax
//! (`500ms`, `90s`, `30m`, `1h 30m`, `1.5h`, `2d`) or a bare number of seconds (`3600`,
//! `0.25`). The CLI and the agent parse every duration through here, so they accept the
//! same things.

use std::time::Duration;

const EXPECTED: &str = "expected e.g. 500ms, 90s, 30m, 1h, 2d or a number of seconds";

/// A duration in humantime's syntax or a bare, non-negative number of seconds.
pub fn parse(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err(format!("empty duration: {EXPECTED}"));
    }
    // Only plain decimals count as seconds: `f64::from_str` also reads `inf` and `NaN`.
    if t.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        let secs: f64 = t
            .parse()
            .map_err(|_| format!("{s:?} is not a duration: {EXPECTED}"))?;
        return Duration::try_from_secs_f64(secs).map_err(|_| format!("{s:?} is too long"));
    }
    humantime::parse_duration(t).map_err(|e| format!("{s:?} is not a duration ({e}): {EXPECTED}"))
}

/// A duration the API takes in whole seconds (`max_age_s`, `wait_s`, ...).
pub fn whole_seconds(s: &str) -> Result<u32, String> {
    let d = parse(s)?;
    if d.subsec_nanos() != 0 {
        return Err(format!("{s:?}: give whole seconds"));
    }
    u32::try_from(d.as_secs()).map_err(|_| format!("{s:?} is too long (at most {} s)", u32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn humantime_syntax_and_bare_seconds() {
        for (text, want) in [
            ("500ms", Duration::from_millis(500)),
            ("5s", Duration::from_secs(5)),
            ("5 s", Duration::from_secs(5)),
            ("2m", Duration::from_secs(120)),
            ("1h", Duration::from_secs(3600)),
            ("1h 30m", Duration::from_secs(5400)),
            ("1.5h", Duration::from_secs(5400)),
            ("2d", Duration::from_secs(172_800)),
            ("3600", Duration::from_secs(3600)),
            ("0.25", Duration::from_millis(250)),
            (" 90s ", Duration::from_secs(90)),
            ("0", Duration::ZERO),
        ] {
            assert_eq!(parse(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn refuses_what_is_not_a_duration() {
        for bad in [
            "",
            " ",
            "h",
            "-1",
            "-1s",
            "5 parsecs",
            "ten seconds",
            "inf",
            "NaN",
            "1e3",
            "1.2.3",
            "99999999999999999999999s",
        ] {
            let err = parse(bad).unwrap_err();
            assert!(
                err.contains("duration") || err.contains("too long"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn whole_seconds_for_the_api() {
        assert_eq!(whole_seconds("3600"), Ok(3600));
        assert_eq!(whole_seconds("90s"), Ok(90));
        assert_eq!(whole_seconds("1h"), Ok(3600));
        assert_eq!(whole_seconds("2d"), Ok(172_800));
        assert_eq!(whole_seconds("1.5m"), Ok(90));
        assert!(
            whole_seconds("500ms")
                .unwrap_err()
                .contains("whole seconds")
        );
        assert!(whole_seconds("200y").unwrap_err().contains("too long"));
        assert!(whole_seconds("h").is_err());
    }
}
