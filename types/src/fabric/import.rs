//! Turning what a site already keeps into a [`Fabric`]: Slurm's `topology.conf`
//! ([`slurm_topology`], node level: which switch a node hangs off) and `ibnetdiscover`'s
//! topology file ([`ibnetdiscover`], port level: switches, ports, GUIDs, widths, speeds).
//! Both read hostile text: bounded in bytes, lines and counts, and every bad line is
//! an error that names it (`line 12: ...`). What a source does not say (a NIC's rail, a
//! node's NICs) or says two ways is a [`Note`](super::Note) on that node, never a guess.

use super::{Errors, Fabric};

mod ibnetdiscover;
mod slurm;

/// The largest input an importer reads, in bytes.
pub const MAX_INPUT_BYTES: usize = 256 << 20;
/// The longest line an importer reads, in bytes.
pub const MAX_LINE_BYTES: usize = 64 << 10;
/// The most lines an importer reads.
pub const MAX_LINES: usize = 5_000_000;

/// Slurm's `topology.conf` (the `topology/tree` plugin's `SwitchName=... Nodes=...
/// Switches=...` lines, hostlists expanded): switches with `Nodes=` are leaves, the
/// switches above them spines, anything higher core. Nodes get their leaf only: the file
/// knows no NIC, so each says so in a note.
pub fn slurm_topology(text: &str) -> Result<Fabric, Errors> {
    slurm::parse(text)
}

/// `ibnetdiscover`'s output (with or without `-g`): every switch and channel adapter,
/// the ports between them with their width and speed. A CA whose NodeDescription reads
/// `HOST NIC` (what Linux sets, `gpu-0412 mlx5_3`) becomes NIC `NIC` of node `HOST`.
pub fn ibnetdiscover(text: &str) -> Result<Fabric, Errors> {
    ibnetdiscover::parse(text)
}

/// The lines of an input, checked against the bounds above; `Err` for the whole input.
pub(crate) fn lines(text: &str) -> Result<impl Iterator<Item = (usize, &str)>, Errors> {
    if text.len() > MAX_INPUT_BYTES {
        return Err(Errors(vec![format!(
            "the input is {} bytes, more than the {MAX_INPUT_BYTES} an importer reads",
            text.len()
        )]));
    }
    let count = text.lines().count();
    if count > MAX_LINES {
        return Err(Errors(vec![format!(
            "the input has {count} lines, more than the {MAX_LINES} an importer reads"
        )]));
    }
    Ok(text.lines().enumerate().map(|(i, l)| (i + 1, l)))
}

/// A line shown in an error: its start, without control characters.
pub(crate) fn shown(line: &str) -> String {
    let mut s: String = line
        .chars()
        .take(80)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if line.chars().count() > 80 {
        s.push_str("...");
    }
    s
}
