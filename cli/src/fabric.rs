//! `heddle fabric`: import the site's fabric from a topology file, and show it as a tree
//! of switches with their nodes (docs/fabric.md).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use clap::Subcommand;
use heddle_types::fabric::Fabric;
use heddle_types::fabric::stored::{FabricImport, FabricSource, FabricSummary, StoredFabric, tree};
use heddle_types::hostlist;

use crate::client::Client;
use crate::exit::UsageError;
use crate::output::print_json;
use crate::table;

#[derive(Subcommand)]
pub enum FabricCmd {
    /// Replace the site's fabric with one read from a file (admin). The server reads and
    /// checks it; a file that does not read is refused with every bad line named.
    Import {
        #[command(flatten)]
        from: ImportFrom,
    },
    /// The site's fabric: switches by tier with the switches and nodes below them, and
    /// what the import noted about nodes (`--json`: the stored document).
    Show,
}

/// The one file to import, by its kind; `-` reads standard input.
#[derive(clap::Args)]
#[group(required = true, multiple = false)]
pub struct ImportFrom {
    /// Slurm's `topology.conf` (the `topology/tree` plugin's `SwitchName=` lines).
    #[arg(long, value_name = "FILE")]
    slurm_topology: Option<PathBuf>,
    /// The topology file `ibnetdiscover` prints (with or without `-g`).
    #[arg(long, value_name = "FILE")]
    ibnetdiscover: Option<PathBuf>,
    /// A Heddle fabric file (JSON, docs/fabric.md).
    #[arg(long, value_name = "FILE")]
    file: Option<PathBuf>,
}

impl ImportFrom {
    fn source(self) -> (FabricSource, PathBuf) {
        match (self.slurm_topology, self.ibnetdiscover, self.file) {
            (Some(p), _, _) => (FabricSource::SlurmTopology, p),
            (_, Some(p), _) => (FabricSource::Ibnetdiscover, p),
            (_, _, Some(p)) => (FabricSource::Heddle, p),
            _ => unreachable!("clap requires one of them"),
        }
    }
}

fn read_file(path: &Path) -> Result<String, UsageError> {
    let mut bytes = Vec::new();
    let read = if path == Path::new("-") {
        std::io::stdin().read_to_end(&mut bytes)
    } else {
        std::fs::File::open(path).and_then(|mut f| f.read_to_end(&mut bytes))
    };
    read.map_err(|e| UsageError(format!("cannot read {}: {e}", path.display())))?;
    String::from_utf8(bytes)
        .map_err(|e| UsageError(format!("{} is not UTF-8 text: {e}", path.display())))
}

pub async fn run(client: &Client, cmd: FabricCmd, json: bool) -> anyhow::Result<()> {
    match cmd {
        FabricCmd::Import { from } => {
            let (source, path) = from.source();
            let body = FabricImport {
                source,
                text: read_file(&path)?,
            };
            let summary: FabricSummary = client.put("/api/v1/fabric", &body).await?;
            if json {
                return print_json(&summary);
            }
            println!(
                "imported the fabric from {}: {}",
                path.display(),
                counts(&summary)
            );
            if summary.notes > 0 {
                println!(
                    "{}",
                    notes_table(summary.first_notes.iter().map(|n| (&n.subject, &n.message)))
                );
                if summary.notes > summary.first_notes.len() {
                    println!(
                        "... and {} more notes: heddle fabric show",
                        summary.notes - summary.first_notes.len()
                    );
                }
            }
        }
        FabricCmd::Show => {
            let stored: StoredFabric = client.get("/api/v1/fabric").await?;
            if json {
                return print_json(&stored);
            }
            let s = &stored.summary;
            println!(
                "fabric from {}, imported {} by {}: {}",
                s.source,
                s.imported_at.format("%Y-%m-%d %H:%M:%S UTC"),
                s.imported_by,
                counts(s)
            );
            print!("{}", render(&stored.fabric));
        }
    }
    Ok(())
}

fn counts(s: &FabricSummary) -> String {
    format!(
        "{} nodes, {} switches, {} links, {} notes",
        s.nodes, s.switches, s.links, s.notes
    )
}

fn or_dash(s: String) -> String {
    if s.is_empty() { "-".into() } else { s }
}

/// The switch tree and the notes as tables; nodes as Slurm hostlists.
fn render(fabric: &Fabric) -> String {
    let mut out = String::new();
    let mut t = table::new(&["TIER", "SWITCH", "SWITCHES", "NODES"]);
    for s in tree(fabric) {
        t.add_row(vec![
            format!("{:?}", s.tier).to_lowercase(),
            s.name.clone(),
            or_dash(hostlist::compress(&s.switches)),
            or_dash(hostlist::compress(&s.nodes)),
        ]);
    }
    out.push_str(&format!("{t}\n"));
    let loose: Vec<&str> = fabric
        .nodes
        .iter()
        .filter(|n| n.leaf.is_none() && n.nics.iter().all(|nic| nic.leaf.is_none()))
        .map(|n| n.name.as_str())
        .collect();
    if !loose.is_empty() {
        out.push_str(&format!(
            "under no switch: {}\n",
            hostlist::compress(&loose)
        ));
    }
    if !fabric.notes.is_empty() {
        let notes = fabric.notes.iter().map(|n| (&n.subject, &n.message));
        out.push_str(&format!("{}\n", notes_table(notes)));
    }
    out
}

/// One row per distinct note, with the nodes and switches it is about as a hostlist.
fn notes_table<'a>(notes: impl Iterator<Item = (&'a String, &'a String)>) -> comfy_table::Table {
    let mut by_message: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut order = Vec::new();
    for (subject, message) in notes {
        let subjects = by_message.entry(message).or_insert_with(|| {
            order.push(message.as_str());
            Vec::new()
        });
        subjects.push(subject);
    }
    let mut t = table::new(&["NODES", "NOTE"]);
    for message in order {
        t.add_row(vec![
            hostlist::compress(&by_message[message]),
            message.to_string(),
        ]);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tree_shows_hostlists_and_grouped_notes() {
        let f = FabricSource::SlurmTopology
            .read("SwitchName=s0 Nodes=n[01-03]\nSwitchName=s1 Nodes=n[04-05],x\nSwitchName=top Switches=s[0-1]\n")
            .unwrap();
        let out = render(&f);
        assert!(out.contains("top"), "{out}");
        assert!(out.contains("s[0-1]"), "{out}");
        assert!(out.contains("n[01-03]"), "{out}");
        assert!(out.contains("n[04-05],x"), "{out}");
        // Six nodes, one note each, shown once.
        assert!(out.contains("n[01-05],x"), "{out}");
        assert_eq!(out.matches("NICs unmapped").count(), 1, "{out}");
        let lines: Vec<&str> = out.lines().collect();
        let top = lines.iter().position(|l| l.contains("top")).unwrap();
        let s0 = lines.iter().position(|l| l.contains(" s0 ")).unwrap();
        assert!(top < s0, "{out}");
    }
}
