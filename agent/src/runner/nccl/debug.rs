//! What NCCL's own `NCCL_DEBUG=INFO` log says about a run: which transports carried the
//! data (P2P over NVLink, shared memory, a socket or IB network) and over how many
//! channels. A busbw figure without this is hard to judge: the same table means a healthy
//! NVLink box or a broken one silently falling back to sockets.

use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct DebugSummary {
    /// The full version line, e.g. `2.28.3+cuda12.9`.
    pub version: Option<String>,
    /// Distinct `via ...` transports of the channel set-up lines, e.g. `P2P/CUMEM/read`.
    pub transports: BTreeSet<String>,
    /// Counts per transport family (`P2P`, `SHM`, `NET`, ...), over all channel lines.
    pub connections: BTreeMap<String, u64>,
    /// Distinct channel numbers that were connected.
    pub channels: usize,
    /// `Using network Socket` / `IB`.
    pub network: Option<String>,
    /// The `N coll channels, ... p2p channels ...` line, verbatim.
    pub channel_line: Option<String>,
    /// NCCL warnings, verbatim (at most 20).
    pub warnings: Vec<String>,
}

pub fn parse(log: &str) -> DebugSummary {
    let mut s = DebugSummary::default();
    let mut channels = BTreeSet::new();
    for line in log.lines() {
        let Some(msg) = line.split_once(" NCCL INFO ").map(|(_, m)| m.trim()) else {
            if let Some((_, w)) = line.split_once(" NCCL WARN ")
                && s.warnings.len() < 20
            {
                s.warnings.push(w.trim().to_string());
            }
            continue;
        };
        if let Some(v) = msg.strip_prefix("NCCL version ") {
            s.version.get_or_insert_with(|| v.trim().to_string());
        } else if let Some(n) = msg.strip_prefix("Using network ") {
            s.network.get_or_insert_with(|| n.trim().to_string());
        } else if msg.contains(" coll channels") {
            s.channel_line.get_or_insert_with(|| msg.to_string());
        } else if let Some(rest) = msg.strip_prefix("Channel ")
            && let Some((_, via)) = rest.split_once(" via ")
        {
            let id: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
            if let Ok(id) = id.parse::<u32>() {
                channels.insert(id);
            }
            let transport = via.split_whitespace().next().unwrap_or("").to_string();
            let family = transport.split('/').next().unwrap_or("").to_string();
            *s.connections.entry(family).or_default() += 1;
            s.transports.insert(transport);
        }
    }
    s.channels = channels.len();
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_and_p2p_lines() {
        let log = "\
h:1:1 [0] NCCL INFO NCCL version 2.28.3+cuda12.9
h:1:1 [0] NCCL INFO Using network Socket
h:1:9 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
h:1:9 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/CUMEM/read
h:1:9 [1] NCCL INFO Channel 01/0 : 1[1] -> 0[0] [send] via NET/Socket/0
h:1:9 [1] NCCL INFO 24 coll channels, 24 collnet channels, 0 nvls channels, 32 p2p channels, 32 p2p channels per peer
h:1:9 [1] NCCL WARN something odd
unrelated line";
        let s = parse(log);
        assert_eq!(s.version.as_deref(), Some("2.28.3+cuda12.9"));
        assert_eq!(s.network.as_deref(), Some("Socket"));
        assert_eq!(s.channels, 2);
        assert_eq!(
            s.transports.iter().cloned().collect::<Vec<_>>(),
            vec!["NET/Socket/0".to_string(), "P2P/CUMEM/read".to_string()]
        );
        assert_eq!(s.connections.get("P2P"), Some(&2));
        assert_eq!(s.connections.get("NET"), Some(&1));
        assert!(s.channel_line.unwrap().starts_with("24 coll channels"));
        assert_eq!(s.warnings, vec!["something odd".to_string()]);
        assert_eq!(parse(""), DebugSummary::default());
    }
}
