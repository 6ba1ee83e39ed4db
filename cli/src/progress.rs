//! What a command prints on stderr while it waits on long work (a run, a sweep, an
//! investigation, pre-flight checks): a progress bar on a terminal; one plain line per
//! change when stderr is a file or a pipe (a CI log); nothing with `--json`, so that
//! stdout and stderr hold nothing but the JSON and errors.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Resolution of the bar: fractions are shown to the per-mille.
const STEPS: u64 = 1000;

pub struct Progress {
    mode: Mode,
}

enum Mode {
    Bar(ProgressBar),
    Lines {
        out: Box<dyn Write + Send>,
        last: String,
    },
    Quiet,
}

impl Progress {
    /// A bar for work whose fraction done is known as it goes (jobs, pairs, cells).
    pub fn bar(json: bool) -> Progress {
        Progress::new(json, std::io::stderr().is_terminal(), true)
    }

    /// A spinner for one long request; nothing at all when stderr is not a terminal.
    pub fn spinner(json: bool, text: &str) -> Progress {
        let mut p = Progress::new(json, std::io::stderr().is_terminal(), false);
        p.update(None, text);
        p
    }

    fn new(json: bool, terminal: bool, lines: bool) -> Progress {
        let mode = match (json, terminal) {
            (true, _) => Mode::Quiet,
            (false, true) => {
                let bar = ProgressBar::with_draw_target(
                    Some(STEPS),
                    ProgressDrawTarget::stderr_with_hz(10),
                );
                let style = if lines {
                    ProgressStyle::with_template(
                        "{spinner} {elapsed:>4} [{bar:30}] {percent:>3}% {wide_msg}",
                    )
                } else {
                    ProgressStyle::with_template("{spinner} {elapsed:>4} {wide_msg}")
                };
                bar.set_style(style.expect("a valid template").progress_chars("=> "));
                bar.enable_steady_tick(Duration::from_millis(120));
                Mode::Bar(bar)
            }
            (false, false) if lines => Mode::Lines {
                out: Box::new(std::io::stderr()),
                last: String::new(),
            },
            (false, false) => Mode::Quiet,
        };
        Progress { mode }
    }

    /// Plain lines into `out`, as when stderr is not a terminal.
    #[cfg(test)]
    fn lines(out: Box<dyn Write + Send>) -> Progress {
        Progress {
            mode: Mode::Lines {
                out,
                last: String::new(),
            },
        }
    }

    /// `fraction` of the work done (0..=1) when known, and what is happening.
    pub fn update(&mut self, fraction: Option<f64>, text: &str) {
        match &mut self.mode {
            Mode::Bar(bar) => {
                if let Some(f) = fraction {
                    bar.set_position((f.clamp(0.0, 1.0) * STEPS as f64).round() as u64);
                }
                bar.set_message(text.to_string());
            }
            Mode::Lines { out, last } => {
                if text != last {
                    let _ = writeln!(out, "{text}");
                    *last = text.to_string();
                }
            }
            Mode::Quiet => {}
        }
    }

    /// Takes the bar off the screen before the answer is printed.
    pub fn finish(self) {
        if let Mode::Bar(bar) = self.mode {
            bar.finish_and_clear();
        }
    }
}

/// A note on stderr (e.g. "started run ..."), left out with `--json`.
pub fn note(json: bool, text: &str) {
    if !json {
        eprintln!("{text}");
    }
}

/// GETs `path` every 2 s until `ended` says so, showing `line`'s fraction and words as
/// the progress; the last answer. Pairwise and fabric investigations are followed so.
pub async fn poll<T: serde::de::DeserializeOwned>(
    client: &crate::client::Client,
    path: &str,
    json: bool,
    line: impl Fn(&T) -> (f64, String),
    ended: impl Fn(&T) -> bool,
) -> anyhow::Result<T> {
    let mut progress = Progress::bar(json);
    loop {
        let answer: T = match client.get(path).await {
            Ok(a) => a,
            Err(err) => {
                progress.finish();
                return Err(err.into());
            }
        };
        let (fraction, words) = line(&answer);
        progress.update(Some(fraction), &words);
        if ended(&answer) {
            progress.finish();
            return Ok(answer);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().write(buf)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn off_a_terminal_each_change_is_one_plain_line() {
        let buf = Shared::default();
        let mut p = Progress::lines(Box::new(buf.clone()));
        p.update(Some(0.0), "queued: 0/2 jobs done");
        p.update(Some(0.1), "queued: 0/2 jobs done");
        p.update(Some(0.5), "running: 1/2 jobs done");
        p.finish();
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text, "queued: 0/2 jobs done\nrunning: 1/2 jobs done\n");
        assert!(!text.contains('\x1b'));
    }

    #[test]
    fn json_and_spinners_off_a_terminal_print_nothing() {
        assert!(matches!(Progress::new(true, true, true).mode, Mode::Quiet));
        assert!(matches!(Progress::new(true, false, true).mode, Mode::Quiet));
        assert!(matches!(
            Progress::new(false, false, false).mode,
            Mode::Quiet
        ));
        assert!(matches!(
            Progress::new(false, false, true).mode,
            Mode::Lines { .. }
        ));
    }
}
