//! Each GPU's NVLinks from what NVML answers about them, and the peer of a link whose far
//! end NVML hides.
//!
//! Inside VMs (Azure ND, 2×H200 slices of an HGX) the hypervisor hides the NVSwitches:
//! NVML answers `ffffffff:ff:ff.0` for every link's remote PCI address (and, on a 2×H200
//! slice, an NVSwitch as the remote type, with the switch itself hidden), while `nvidia-smi topo -p2p n` still says OK between the GPUs. There the
//! peers come from NVML's P2P status over NVLink (`nvmlDeviceGetP2PStatus` with
//! `NVML_P2P_CAPS_INDEX_NVLINK`) for every pair of GPUs, kept only when it is OK both ways,
//! on the links whose capabilities allow P2P (`NVML_NVLINK_CAP_P2P_SUPPORTED`); such links
//! say `peer_inferred: true` and list the GPUs they reach in `peers`.
//!
//! The answers are a plain structure so that a fixture tree can carry them in [`FIXTURE`]
//! (NVML is consulted only for `/`), the way `nvml-conditions.json` carries the GPUs'
//! condition, and so that `heddle-agent facts --nvml-nvlinks` prints them from a live node
//! in that same form.

use std::collections::BTreeSet;

use heddle_types::facts::NvLink;
use serde::{Deserialize, Serialize};

use super::pci::normalize_bdf;

/// Where a fixture tree keeps NVML's answers about NVLinks.
pub const FIXTURE: &str = "var/lib/heddle/nvml-nvlinks.json";

/// The PCI domain of the remote address NVML gives when the far end is hidden
/// (`ffffffff:ff:ff.0`).
const HIDDEN_DOMAIN: &str = "ffffffff:";

/// Everything NVML said about the NVLinks of a node.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Answers {
    pub gpus: Vec<GpuAnswers>,
    /// `nvmlDeviceGetP2PStatus(from, to, NVML_P2P_CAPS_INDEX_NVLINK)` for every ordered
    /// pair of GPUs NVML could ask about.
    #[serde(default)]
    pub p2p_nvlink: Vec<P2pAnswer>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuAnswers {
    pub bdf: String,
    /// The active links only (`nvmlDeviceGetNvLinkState` said enabled).
    pub links: Vec<LinkAnswers>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkAnswers {
    pub link: u32,
    /// `nvmlDeviceGetNvLinkRemotePciInfo`'s bus id as NVML wrote it; `None` when it failed.
    #[serde(default)]
    pub remote_pci: Option<String>,
    /// `nvmlDeviceGetNvLinkRemoteDeviceType`: `gpu`, `switch`, `ibmnpu`, `unknown`.
    #[serde(default)]
    pub remote_type: Option<String>,
    /// `nvmlDeviceGetNvLinkCapability(NVML_NVLINK_CAP_P2P_SUPPORTED)`; `None` when it failed.
    #[serde(default)]
    pub p2p_supported: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct P2pAnswer {
    pub from: String,
    pub to: String,
    /// NVML's `nvmlGpuP2PStatus_t` in snake case: `ok`, `not_supported`, `disabled_by_regkey`, ...
    pub status: String,
}

/// The remote address of a link when NVML told it (not hidden, parseable).
fn known_remote(l: &LinkAnswers) -> Option<String> {
    l.remote_pci
        .as_deref()
        .and_then(normalize_bdf)
        .filter(|b| !b.starts_with(HIDDEN_DOMAIN))
}

/// The GPUs (bus ids) each GPU reaches over NVLink by NVML's P2P status, OK both ways.
fn p2p_peers(a: &Answers, bdf: &str) -> Vec<String> {
    let norm = |s: &str| normalize_bdf(s).unwrap_or_else(|| s.to_ascii_lowercase());
    let ok: BTreeSet<(String, String)> = a
        .p2p_nvlink
        .iter()
        .filter(|p| p.status == "ok")
        .map(|p| (norm(&p.from), norm(&p.to)))
        .collect();
    let me = norm(bdf);
    let mut out: Vec<String> = a
        .gpus
        .iter()
        .map(|g| norm(&g.bdf))
        .filter(|other| {
            *other != me
                && ok.contains(&(me.clone(), other.clone()))
                && ok.contains(&(other.clone(), me.clone()))
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// One GPU's links as the facts show them: the far end NVML told, or for a hidden far end
/// the peers NVML's P2P status implies.
pub fn links_of(a: &Answers, gpu: &GpuAnswers) -> Vec<NvLink> {
    let peers = p2p_peers(a, &gpu.bdf);
    let mut out: Vec<NvLink> = gpu
        .links
        .iter()
        .map(|l| {
            let remote_bdf = known_remote(l);
            let inferable = remote_bdf.is_none() && l.p2p_supported != Some(false);
            let peers = if inferable { peers.clone() } else { Vec::new() };
            NvLink {
                link: l.link,
                remote_bdf,
                remote_kind: l.remote_type.clone(),
                peer_inferred: !peers.is_empty(),
                peers,
            }
        })
        .collect();
    out.sort_by_key(|l| l.link);
    out
}

/// Reads [`FIXTURE`] of a fixture tree: `None` when the tree has none, an error message
/// when it does not parse.
pub fn read_fixture(path: &std::path::Path) -> Option<Result<Answers, String>> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => return Some(Err(format!("cannot read {FIXTURE}: {e}"))),
    };
    Some(serde_json::from_slice(&bytes).map_err(|e| format!("{FIXTURE} does not parse: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm(status_back: &str, p2p: Option<bool>) -> Answers {
        let gpu = |bdf: &str| GpuAnswers {
            bdf: bdf.into(),
            links: (0..18)
                .map(|link| LinkAnswers {
                    link,
                    remote_pci: Some("FFFFFFFF:FF:FF.0".into()),
                    remote_type: Some("unknown".into()),
                    p2p_supported: p2p,
                })
                .collect(),
        };
        Answers {
            gpus: vec![gpu("0000:00:06.0"), gpu("0000:00:07.0")],
            p2p_nvlink: vec![
                P2pAnswer {
                    from: "00000000:00:06.0".into(),
                    to: "00000000:00:07.0".into(),
                    status: "ok".into(),
                },
                P2pAnswer {
                    from: "00000000:00:07.0".into(),
                    to: "00000000:00:06.0".into(),
                    status: status_back.into(),
                },
            ],
        }
    }

    #[test]
    fn hidden_far_ends_take_their_peer_from_p2p_status() {
        let a = vm("ok", Some(true));
        let links = links_of(&a, &a.gpus[0]);
        assert_eq!(links.len(), 18);
        assert!(
            links
                .iter()
                .all(|l| l.remote_bdf.is_none() && l.peer_inferred && l.peers == ["0000:00:07.0"])
        );
    }

    #[test]
    fn no_inference_without_p2p_both_ways_or_on_links_without_p2p() {
        let a = vm("not_supported", Some(true));
        assert!(
            links_of(&a, &a.gpus[0])
                .iter()
                .all(|l| !l.peer_inferred && l.peers.is_empty())
        );
        let a = vm("ok", Some(false));
        assert!(links_of(&a, &a.gpus[1]).iter().all(|l| !l.peer_inferred));
        // A capability NVML could not tell does not stop the inference.
        let a = vm("ok", None);
        assert!(
            links_of(&a, &a.gpus[1])
                .iter()
                .all(|l| l.peers == ["0000:00:06.0"])
        );
    }

    #[test]
    fn known_far_ends_are_kept_as_told() {
        let mut a = vm("ok", Some(true));
        a.gpus[0].links[0].remote_pci = Some("00000000:07:00.0".into());
        a.gpus[0].links[0].remote_type = Some("gpu".into());
        let l = &links_of(&a, &a.gpus[0])[0];
        assert_eq!(l.remote_bdf.as_deref(), Some("0000:07:00.0"));
        assert!(!l.peer_inferred && l.peers.is_empty());
    }
}
