//! What Heddle's Slurm hooks agree on: the notes a `Prolog` (`heddle slurm prolog`, run as
//! root on each node before a job) leaves for the job's tasks, which the `TaskProlog`
//! (`heddle-agent slurm task-prolog`, run as the job's user) prints into the job's output
//! and the `Epilog` (`heddle-agent slurm epilog`) removes.
//!
//! A note is one line of text in a root-owned file named after the job: Slurm reads a
//! TaskProlog's output line by line (`export`, `unset`, `print`), so a note that held a
//! newline could smuggle an `export` into every task. [`note_line`] makes any text one
//! harmless line, and [`printable`] is checked again by the reader.

/// Where the prolog keeps its notes and counts (root's, readable by every job's user).
pub const DEFAULT_DIR: &str = "/var/lib/heddle-slurm";
/// Longest note kept, in bytes; the reader reads at most [`MAX_NOTES_FILE_LEN`].
pub const MAX_NOTE_LEN: usize = 400;
/// Largest notes file a task prolog reads.
pub const MAX_NOTES_FILE_LEN: usize = 8192;
/// Longest drain reason handed to `scontrol` (Slurm keeps reasons short in its tables).
pub const MAX_REASON_LEN: usize = 160;
/// The file that counts the prolog's passes without a verdict, in the same directory.
pub const COUNTS_FILE: &str = "prolog-counts";

/// A Slurm job id as the hooks accept it from their environment: decimal digits only, so
/// it can name a file.
pub fn job_id(raw: &str) -> Option<&str> {
    let id = raw.trim();
    (!id.is_empty() && id.len() <= 20 && id.bytes().all(|b| b.is_ascii_digit())).then_some(id)
}

/// The notes file of job `id` (from [`job_id`]).
pub fn notes_file(id: &str) -> String {
    format!("job-{id}.notes")
}

/// `text` as one line a TaskProlog may print: control characters (newlines among them)
/// become spaces, and it is cut to [`MAX_NOTE_LEN`] bytes on a character boundary.
pub fn note_line(text: &str) -> String {
    cut(
        &text
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect::<String>(),
        MAX_NOTE_LEN,
    )
}

/// The drain reason for a node whose verdict is FAIL: `heddle: ` and the first reason, one
/// line, at most [`MAX_REASON_LEN`] bytes.
pub fn drain_reason(why: &str) -> String {
    cut(&note_line(&format!("heddle: {why}")), MAX_REASON_LEN)
}

fn cut(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].trim_end().to_string()
}

/// Whether a line read back from a notes file may be printed: no control character.
pub fn printable(line: &str) -> bool {
    !line.is_empty() && line.len() <= MAX_NOTE_LEN && !line.chars().any(char::is_control)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_is_always_one_printable_line() {
        let n = note_line("bad\nexport LD_PRELOAD=/tmp/x.so\r\u{1b}[2J");
        assert!(printable(&n), "{n:?}");
        assert!(!n.contains('\n'));
        let long = note_line(&"é".repeat(1000));
        assert!(long.len() <= MAX_NOTE_LEN && printable(&long));
        assert!(!printable("a\tb") && !printable(""));
    }

    #[test]
    fn job_ids_are_digits() {
        assert_eq!(job_id(" 42\n"), Some("42"));
        assert_eq!(job_id("../x"), None);
        assert_eq!(job_id("12_3"), None);
        assert_eq!(notes_file("42"), "job-42.notes");
    }

    #[test]
    fn drain_reasons_are_short_and_marked() {
        let r = drain_reason(&format!("memcpy {}\nsecond line", "x".repeat(500)));
        assert!(r.starts_with("heddle: memcpy ") && r.len() <= MAX_REASON_LEN);
        assert!(!r.contains('\n'));
    }
}
