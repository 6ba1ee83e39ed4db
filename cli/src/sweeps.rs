//! `heddle runs sweep`: a sweep's cells × size bands, the winner of each band, and keeping
//! a winner as a tuning profile.

use heddle_types::nodes::TuningProfile;
use heddle_types::sweeps::{Band, ProfileScope, SweepKeep, SweepTable};

use crate::client::Client;
use crate::table;

#[derive(clap::Args)]
pub struct SweepArgs {
    pub id: uuid::Uuid,
    /// Keep the band's winning cell as a tuning profile with this name.
    #[arg(long)]
    pub keep: Option<String>,
    /// Size band whose winner is kept: small (< 64 KiB), medium, large (>= 64 MiB).
    #[arg(long, default_value = "large", value_parser = |s: &str| s.parse::<Band>())]
    pub band: Band,
    /// Where the kept profile applies: node (the sweep's node) or site (that node's site).
    #[arg(long, default_value = "node", value_parser = parse_scope)]
    pub scope: ProfileScope,
    /// Wait for the sweep to end first, showing the cells done.
    #[arg(long)]
    pub watch: bool,
}

fn parse_scope(s: &str) -> Result<ProfileScope, String> {
    match s {
        "node" => Ok(ProfileScope::Node),
        "site" => Ok(ProfileScope::Site),
        _ => Err(format!("unknown scope {s:?} (node or site)")),
    }
}

fn env_text(env: &std::collections::BTreeMap<String, String>) -> String {
    env.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A node profile that sets a variable every rank must see alike gives it to one node:
/// runs across that node and others will be refused until the value is site-wide.
fn keep_warning(p: &TuningProfile, scope: ProfileScope, run: uuid::Uuid) -> Option<String> {
    if scope != ProfileScope::Node {
        return None;
    }
    let names: Vec<&str> = p
        .env
        .keys()
        .map(String::as_str)
        .filter(|n| heddle_types::must_agree::must_agree(n))
        .collect();
    if names.is_empty() {
        return None;
    }
    Some(format!(
        "warning: {} must be equal on every rank of a communicator, and this profile gives it \
         to the sweep's node only: runs across that node and nodes without the same value will \
         be refused. To give it to the whole site instead: heddle runs sweep {run} --keep {}-site \
         --scope site (and delete this node profile)",
        names.join(", "),
        p.name
    ))
}

pub async fn command(client: &Client, a: SweepArgs, json: bool) -> anyhow::Result<()> {
    let base = format!("/api/v1/runs/{}/sweep", a.id);
    if a.watch {
        crate::runs::follow(client, a.id, json).await?;
    }
    if let Some(name) = a.keep {
        let body = SweepKeep {
            name,
            band: a.band,
            scope: a.scope,
        };
        let scope = body.scope;
        let p: TuningProfile = client.post(&format!("{base}/keep"), &body).await?;
        if let Some(w) = keep_warning(&p, scope, a.id) {
            eprintln!("{w}");
        }
        if json {
            crate::output::print_json(&p)?;
        } else {
            println!(
                "kept tuning profile {} ({}): {}",
                p.name,
                p.id,
                env_text(&p.env)
            );
        }
        return Ok(());
    }
    let t: SweepTable = client.get(&base).await?;
    if json {
        return crate::output::print_json(&t);
    }
    println!(
        "sweep {} on {} ({}), mean busbw GB/s per size band",
        t.run_id,
        t.hostname,
        t.collective.as_deref().unwrap_or("?")
    );
    let mut tab = table::new(&[
        "CELL",
        "SMALL <64K",
        "MEDIUM",
        "LARGE >=64M",
        "PEAK",
        "WRONG",
    ]);
    for c in &t.cells {
        let b = &c.busbw_gbs;
        tab.add_row(vec![
            env_text(&c.env),
            table::float(b.small, 2),
            table::float(b.medium, 2),
            table::float(b.large, 2),
            table::float(c.peak_busbw_gbs, 2),
            c.wrong.to_string(),
        ]);
    }
    table::right(&mut tab, &[1, 2, 3, 4, 5]);
    println!("{tab}");
    let mut w = table::new(&["BAND", "WINNER", "BUSBW", "RUNNER-UP"]);
    for x in &t.winners {
        w.add_row(vec![
            x.band.as_str().to_string(),
            env_text(&x.env),
            format!("{:.2}", x.busbw_gbs),
            table::float(x.runner_up_busbw_gbs, 2),
        ]);
    }
    table::right(&mut w, &[2, 3]);
    println!("{w}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeping_a_must_agree_value_for_one_node_warns() {
        let profile = |env: &[(&str, &str)]| TuningProfile {
            id: uuid::Uuid::nil(),
            name: "fast".into(),
            node_id: Some(uuid::Uuid::nil()),
            site_id: None,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            source_run_id: None,
            created_by: "t".into(),
            created_at: chrono::Utc::now(),
        };
        let run = uuid::Uuid::nil();
        let p = profile(&[("NCCL_ALGO", "Ring"), ("NCCL_SOCKET_NTHREADS", "4")]);
        let w = keep_warning(&p, ProfileScope::Node, run).unwrap();
        assert!(w.contains("NCCL_ALGO must be equal"), "{w}");
        assert!(!w.contains("NCCL_SOCKET_NTHREADS"), "{w}");
        assert!(w.contains("--keep fast-site --scope site"), "{w}");
        assert!(keep_warning(&p, ProfileScope::Site, run).is_none());
        let free = profile(&[("NCCL_SOCKET_NTHREADS", "4")]);
        assert!(keep_warning(&free, ProfileScope::Node, run).is_none());
    }
}
