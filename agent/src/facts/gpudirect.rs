//! GPUDirect RDMA readiness: what lets an HCA read and write GPU memory directly, each
//! need a named check with a reason (docs/facts.md, "GPUDirect").
//!
//! Read under the root: `sys/module/<name>` and `proc/modules` for the peer-memory module
//! and `gdrdrv`; `dev/infiniband/uverbs*` (opened only on the live machine);
//! `proc/self/limits` for the memlock limit; each bridge's PCI config space for its ACS
//! control; `sys/kernel/iommu_groups` and `proc/cmdline` for the IOMMU mode.

use heddle_types::facts::{
    AcsBridge, GpuDirectCheck, GpuDirectFacts, GpuFacts, PciDevice, RdmaDevice, Topology,
    UverbsDevice,
};

use super::pci::PciLocation;
use super::sysfs::{Root, natural_cmp};

/// Peer-memory modules, newest first: `nvidia_peermem` ships with the driver since R470,
/// `nv_peer_mem` is the older Mellanox one.
const PEER_MEM_MODULES: &[&str] = &["nvidia_peermem", "nv_peer_mem"];
/// Below this locked-memory limit registering GPU-sized buffers fails.
const MEMLOCK_MIN: u64 = 64 << 20;
/// PCIe extended capability id of ACS, and the control bits that send peer-to-peer
/// requests up to the root complex (P2P Request Redirect, P2P Completion Redirect).
const ACS_CAP_ID: u16 = 0x000d;
const ACS_REDIRECT_BITS: u16 = 0x0004 | 0x0008;

fn module_loaded(root: &Root, modules: &str, name: &str) -> bool {
    root.exists(&format!("sys/module/{name}"))
        || modules
            .lines()
            .any(|l| l.split_whitespace().next() == Some(name))
}

fn uverbs(root: &Root) -> Vec<UverbsDevice> {
    let mut names: Vec<String> = root
        .list("dev/infiniband")
        .unwrap_or_default()
        .into_iter()
        .filter(|n| n.starts_with("uverbs"))
        .collect();
    names.sort_by(|a, b| natural_cmp(a, b));
    names
        .into_iter()
        .map(|n| {
            let path = format!("/dev/infiniband/{n}");
            let openable = root.is_live().then(|| {
                std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&path)
                    .is_ok()
            });
            UverbsDevice { path, openable }
        })
        .collect()
}

/// `Max locked memory  65536  65536  bytes` → `65536`, or `unlimited`.
fn memlock(limits: &str) -> Option<String> {
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max locked memory"))?;
    let soft = line
        .trim_start_matches("Max locked memory")
        .split_whitespace()
        .next()?;
    Some(soft.to_string())
}

/// The ACS control word from a config-space dump (only root reads past 64 bytes).
pub fn acs_ctrl(config: &[u8]) -> Option<u16> {
    let word = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(config.get(at..at + 4)?.try_into().ok()?))
    };
    let mut at = 0x100;
    for _ in 0..64 {
        let header = word(at)?;
        if header == 0 || header == 0xffff_ffff {
            return None;
        }
        if (header & 0xffff) as u16 == ACS_CAP_ID {
            let ctrl = config.get(at + 6..at + 8)?;
            return Some(u16::from_le_bytes([ctrl[0], ctrl[1]]));
        }
        at = (header >> 20) as usize;
        if at < 0x100 {
            return None;
        }
    }
    None
}

/// Rank of a `topo -m` label: lower is closer.
fn closeness(label: &str) -> u8 {
    match label {
        "PIX" => 0,
        "PXB" => 1,
        "PHB" => 2,
        "NODE" => 3,
        "SYS" => 4,
        _ => 5,
    }
}

/// Bridges a GPU↔HCA transfer crosses: from where their paths part, on both sides.
fn bridges_between(a: &PciLocation, b: &PciLocation) -> Vec<String> {
    let common = a
        .bridges
        .iter()
        .zip(&b.bridges)
        .take_while(|(x, y)| x == y)
        .count();
    let from = common.saturating_sub(1);
    let mut out: Vec<String> = a.bridges[from.min(a.bridges.len())..]
        .iter()
        .chain(&b.bridges[from.min(b.bridges.len())..])
        .cloned()
        .collect();
    out.sort();
    out.dedup();
    out
}

struct AcsScan {
    bridges: Vec<AcsBridge>,
    /// Bridges whose config space could not be read far enough to find ACS.
    unreadable: usize,
    /// GPU↔HCA pairs looked at.
    pairs: usize,
}

fn acs(
    root: &Root,
    gpus: &[GpuFacts],
    hcas: &[RdmaDevice],
    pci: &[PciDevice],
    topo: &Topology,
) -> AcsScan {
    let location = |bdf: &str| {
        pci.iter()
            .find(|d| d.bdf == bdf)
            .and_then(|d| PciLocation::from_path(d.sysfs_path.as_deref()?, d.numa_node))
    };
    let idx = |label: &str| topo.devices.iter().position(|d| d == label);
    let mut scan = AcsScan {
        bridges: Vec::new(),
        unreadable: 0,
        pairs: 0,
    };
    let mut seen = std::collections::BTreeSet::new();
    for (gi, gpu) in gpus.iter().enumerate() {
        let Some(row) = idx(&format!("GPU{gi}")) else {
            continue;
        };
        let nearest = hcas
            .iter()
            .filter(|h| h.pci_bdf.is_some())
            .filter_map(|h| {
                let col = idx(&h.name)?;
                let label = topo.matrix.get(row)?.get(col)?;
                Some((closeness(label), h))
            })
            .min_by_key(|(c, _)| *c);
        let Some((_, hca)) = nearest else { continue };
        let (Some(a), Some(b)) = (
            location(&gpu.bdf),
            hca.pci_bdf.as_deref().and_then(location),
        ) else {
            continue;
        };
        scan.pairs += 1;
        for bridge in bridges_between(&a, &b) {
            if !seen.insert(bridge.clone()) {
                continue;
            }
            let config = std::fs::read(root.path(&format!("sys/bus/pci/devices/{bridge}/config")));
            let ctrl = config.ok().and_then(|c| {
                if c.len() <= 0x100 {
                    None
                } else {
                    Some(acs_ctrl(&c))
                }
            });
            match ctrl {
                None => scan.unreadable += 1,
                Some(None) => {}
                Some(Some(word)) if word & ACS_REDIRECT_BITS != 0 => scan.bridges.push(AcsBridge {
                    bdf: bridge,
                    between: format!("GPU{gi} and {}", hca.name),
                    acs_ctrl: Some(format!("{word:#06x}")),
                }),
                Some(Some(_)) => {}
            }
        }
    }
    scan
}

fn iommu(root: &Root) -> Option<String> {
    let cmdline = root.read("proc/cmdline").unwrap_or_default();
    for arg in cmdline.split_whitespace() {
        if let Some(v) = arg
            .strip_prefix("iommu=")
            .filter(|v| *v == "pt" || *v == "off")
        {
            return Some(v.to_string());
        }
        if arg == "intel_iommu=off" || arg == "amd_iommu=off" {
            return Some("off".into());
        }
    }
    match root.list("sys/kernel/iommu_groups") {
        Ok(groups) if !groups.is_empty() => Some("on".into()),
        // A kernel without an IOMMU still has the (empty) directory; a tree without it
        // does not say.
        Ok(_) => Some("off".into()),
        Err(_) => None,
    }
}

fn check(name: &str, state: &str, reason: impl Into<String>) -> GpuDirectCheck {
    GpuDirectCheck {
        name: name.into(),
        state: state.into(),
        reason: reason.into(),
    }
}

pub fn collect(
    root: &mut Root,
    gpus: &[GpuFacts],
    hcas: &[RdmaDevice],
    pci: &[PciDevice],
    topo: &Topology,
) -> GpuDirectFacts {
    let modules = root.read("proc/modules").unwrap_or_default();
    let peer_mem_module = PEER_MEM_MODULES
        .iter()
        .find(|m| module_loaded(root, &modules, m))
        .map(|m| m.to_string());
    let gdrdrv = module_loaded(root, &modules, "gdrdrv");
    let uverbs = uverbs(root);
    let memlock = root
        .read("proc/self/limits")
        .ok()
        .as_deref()
        .and_then(memlock);
    let scan = acs(root, gpus, hcas, pci, topo);
    let iommu = iommu(root);

    let mut checks = Vec::new();
    if gpus.is_empty() || hcas.is_empty() {
        checks.push(check(
            "gpudirect",
            "unknown",
            format!(
                "GPUDirect RDMA needs a GPU and an HCA; this node has {} GPU(s) and {} RDMA device(s)",
                gpus.len(),
                hcas.len()
            ),
        ));
    } else {
        checks.push(match &peer_mem_module {
            Some(m) => check(
                "peer-mem",
                "ok",
                format!("{m} is loaded: HCAs can reach GPU memory"),
            ),
            None => check(
                "peer-mem",
                "fail",
                "neither nvidia_peermem nor nv_peer_mem is loaded, so NCCL and UCX stage every \
                 network transfer through host memory: `modprobe nvidia_peermem` (and add it to \
                 /etc/modules-load.d)",
            ),
        });
        checks.push(if gdrdrv {
            check("gdrdrv", "ok", "gdrdrv (GDRCopy) is loaded")
        } else {
            check(
                "gdrdrv",
                "warn",
                "gdrdrv (GDRCopy) is not loaded: UCX's gdr_copy transport and NCCL's GDRCopy \
                 paths for small messages are off; install and load gdrdrv where they matter",
            )
        });
        checks.push(if uverbs.is_empty() {
            check(
                "uverbs",
                "fail",
                "no /dev/infiniband/uverbs*: nothing can open the HCAs (load ib_uverbs; in a \
                 container pass /dev/infiniband)",
            )
        } else if let Some(u) = uverbs.iter().find(|u| u.openable == Some(false)) {
            check(
                "uverbs",
                "fail",
                format!(
                    "{} cannot be opened read-write by the agent: check its permissions and the \
                     container's device list",
                    u.path
                ),
            )
        } else {
            check(
                "uverbs",
                "ok",
                format!("{} uverbs device(s) present", uverbs.len()),
            )
        });
        checks.push(match memlock.as_deref() {
            None => check(
                "memlock",
                "unknown",
                "the locked-memory limit could not be read",
            ),
            Some("unlimited") => check("memlock", "ok", "locked memory is unlimited"),
            Some(v) => match v.parse::<u64>() {
                Ok(n) if n >= MEMLOCK_MIN => {
                    check("memlock", "ok", format!("locked memory limit {n} bytes"))
                }
                _ => check(
                    "memlock",
                    "fail",
                    format!(
                        "locked memory is limited to {v} bytes (ulimit -l): RDMA registrations of \
                         large buffers fail; set LimitMEMLOCK=infinity for the agent's service and \
                         `ulimit -l unlimited` for jobs"
                    ),
                ),
            },
        });
        checks.push(if !scan.bridges.is_empty() {
            check(
                "pcie-acs",
                "fail",
                format!(
                    "ACS redirects peer-to-peer traffic to the root complex on {}: GPUDirect RDMA \
                     detours through the CPU or fails; disable ACS on bare metal (BIOS, or \
                     `setpci -s <bdf> ECAP_ACS+6.w=0000`)",
                    scan.bridges
                        .iter()
                        .map(|b| format!("{} ({})", b.bdf, b.between))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
        } else if scan.pairs == 0 {
            check(
                "pcie-acs",
                "unknown",
                "no GPU and HCA with known PCIe paths",
            )
        } else if scan.unreadable > 0 {
            check(
                "pcie-acs",
                "unknown",
                format!(
                    "{} bridge(s) between a GPU and its nearest HCA have no readable extended \
                     config space (the agent needs root to read it)",
                    scan.unreadable
                ),
            )
        } else {
            check(
                "pcie-acs",
                "ok",
                "no bridge between a GPU and its nearest HCA redirects peer-to-peer traffic",
            )
        });
        checks.push(match iommu.as_deref() {
            Some("on") => check(
                "iommu",
                "warn",
                "the IOMMU translates DMA (groups present, no iommu=pt): GPUDirect RDMA may fail or \
                 slow down on bare metal; boot with iommu=pt",
            ),
            Some(mode) => check("iommu", "ok", format!("IOMMU {mode}")),
            None => check("iommu", "unknown", "the IOMMU mode could not be read"),
        });
    }
    GpuDirectFacts {
        peer_mem_module,
        gdrdrv,
        uverbs,
        memlock,
        acs_bridges: scan.bridges,
        iommu,
        checks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memlock_from_proc_limits() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max locked memory         8388608              8388608              bytes\n";
        assert_eq!(memlock(limits).as_deref(), Some("8388608"));
        assert_eq!(
            memlock("Max locked memory         unlimited            unlimited            bytes")
                .as_deref(),
            Some("unlimited")
        );
        assert_eq!(memlock(""), None);
    }

    #[test]
    fn acs_capability_in_the_extended_config_space() {
        let mut config = vec![0u8; 4096];
        // AER at 0x100 pointing to ACS at 0x148; ACS control 0x001d (redirects on).
        config[0x100..0x104].copy_from_slice(&(0x0001u32 | (0x148 << 20)).to_le_bytes());
        config[0x148..0x14c].copy_from_slice(&(ACS_CAP_ID as u32).to_le_bytes());
        config[0x14e..0x150].copy_from_slice(&0x001du16.to_le_bytes());
        assert_eq!(acs_ctrl(&config), Some(0x001d));
        config[0x14e..0x150].copy_from_slice(&0u16.to_le_bytes());
        assert_eq!(acs_ctrl(&config), Some(0));
        assert_eq!(acs_ctrl(&[0u8; 256]), None);
    }

    #[test]
    fn bridges_from_where_the_paths_part() {
        let a = PciLocation::from_path(
            "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0",
            Some(0),
        )
        .unwrap();
        let b = PciLocation::from_path(
            "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0",
            Some(0),
        )
        .unwrap();
        assert_eq!(
            bridges_between(&a, &b),
            ["0000:01:00.0", "0000:02:00.0", "0000:02:01.0"]
        );
    }
}
