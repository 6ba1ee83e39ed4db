//! PCI functions that matter to a GPU cluster (GPUs, network and InfiniBand controllers)
//! and the PCI distance between two of them.
//!
//! Distances use the labels of `nvidia-smi topo -m`, derived from sysfs paths the way
//! NCCL's topology code does: the chain of bridges between the root complex
//! (`pci0000:00`) and the device tells whether two devices share a PCIe switch (PIX),
//! several switches (PXB), only the host bridge (PHB), only the NUMA node (NODE), or
//! nothing but the inter-socket link (SYS).

use heddle_types::facts::{PciDevice, PciKind};

use super::sysfs::Root;

pub const NVIDIA: u16 = 0x10de;

pub fn collect(root: &mut Root) -> Vec<PciDevice> {
    let mut out = Vec::new();
    for bdf in root.list_or_record("sys/bus/pci/devices", "/pci") {
        let dir = format!("sys/bus/pci/devices/{bdf}");
        let field = format!("/pci/{bdf}");
        let Some(class) = root.opt_parse(
            &format!("{dir}/class"),
            &format!("{field}/class"),
            "a hex class code",
            parse_hex_u32,
        ) else {
            continue;
        };
        let Some(vendor) = root.opt_parse(
            &format!("{dir}/vendor"),
            &format!("{field}/vendor_id"),
            "a hex vendor id",
            parse_hex_u16,
        ) else {
            continue;
        };
        let kind = match class >> 16 {
            0x03 if vendor == NVIDIA => PciKind::Gpu,
            0x02 => PciKind::Network,
            _ => continue,
        };
        let device = root.opt_parse(
            &format!("{dir}/device"),
            &format!("{field}/device_id"),
            "a hex device id",
            parse_hex_u16,
        );
        let numa_node = root
            .opt_parse(
                &format!("{dir}/numa_node"),
                &format!("{field}/numa_node"),
                "a NUMA node number",
                |s| s.trim().parse::<i32>().ok(),
            )
            .and_then(|n| u32::try_from(n).ok());
        let sysfs_path = match root.resolve(&dir) {
            Ok(p) => Some(format!("/{p}")),
            Err(e) => {
                root.error(&format!("{field}/sysfs_path"), e.to_string());
                None
            }
        };
        out.push(PciDevice {
            bdf: bdf.to_ascii_lowercase(),
            kind,
            vendor_id: format!("0x{vendor:04x}"),
            device_id: device.map(|d| format!("0x{d:04x}")).unwrap_or_default(),
            class: format!("0x{class:06x}"),
            driver: root.link_name(&format!("{dir}/driver")),
            numa_node,
            local_cpulist: root.opt(
                &format!("{dir}/local_cpulist"),
                &format!("{field}/local_cpulist"),
            ),
            sysfs_path,
        });
    }
    out.sort_by(|a, b| a.bdf.cmp(&b.bdf));
    out
}

pub fn parse_hex_u32(s: &str) -> Option<u32> {
    u32::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok()
}

pub fn parse_hex_u16(s: &str) -> Option<u16> {
    u16::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok()
}

/// Normalizes a bus id as NVML prints it (`00000000:06:00.0`, upper case) to sysfs form
/// (`0000:06:00.0`).
pub fn normalize_bdf(bus_id: &str) -> Option<String> {
    let bus_id = bus_id.trim().trim_end_matches('\0');
    let (domain, rest) = bus_id.split_once(':')?;
    let domain = u32::from_str_radix(domain, 16).ok()?;
    let (bus, devfn) = rest.split_once(':')?;
    let (dev, func) = devfn.split_once('.')?;
    let bus = u8::from_str_radix(bus, 16).ok()?;
    let dev = u8::from_str_radix(dev, 16).ok()?;
    let func = u8::from_str_radix(func, 16).ok()?;
    Some(format!("{domain:04x}:{bus:02x}:{dev:02x}.{func:x}"))
}

/// The PCI function a resolved sysfs path belongs to: its last `dddd:bb:dd.f` component.
/// A virtio NIC's `device` link ends in `…/0000:00:03.0/virtio0`, hence not just the last.
pub fn last_bdf(path: &str) -> Option<String> {
    path.rsplit('/')
        .find(|c| normalize_bdf(c).as_deref() == Some(*c))
        .map(str::to_string)
}

/// The NVML-style name of common data-centre GPUs, for when NVML is unavailable. Kept
/// small on purpose: an unknown id gives `None`, never a guess.
pub fn gpu_name(device_id: u16) -> Option<&'static str> {
    Some(match device_id {
        0x1db1 => "Tesla V100-SXM2-16GB",
        0x1db4 => "Tesla V100-PCIE-16GB",
        0x1db5 => "Tesla V100-SXM2-32GB",
        0x1db6 => "Tesla V100-PCIE-32GB",
        0x1df6 => "Tesla V100S-PCIE-32GB",
        0x20b0 => "NVIDIA A100-SXM4-40GB",
        0x20b2 => "NVIDIA A100-SXM4-80GB",
        0x20b5 => "NVIDIA A100 80GB PCIe",
        0x20f1 => "NVIDIA A100-PCIE-40GB",
        0x2330 => "NVIDIA H100 80GB HBM3",
        0x2331 => "NVIDIA H100 PCIe",
        0x2335 => "NVIDIA H200",
        0x2339 => "NVIDIA H100 NVL",
        0x26b5 => "NVIDIA L40",
        0x26b9 => "NVIDIA L40S",
        0x27b8 => "NVIDIA L4",
        _ => return None,
    })
}

/// Where a device hangs in the PCI tree, taken from its resolved sysfs path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciLocation {
    /// `pci0000:00`: the host bridge (root complex).
    pub root: String,
    /// Bridges between the host bridge and the device, top first (root port, switch
    /// upstream port, switch downstream port, …).
    pub bridges: Vec<String>,
    pub numa_node: Option<u32>,
}

impl PciLocation {
    pub fn from_path(path: &str, numa_node: Option<u32>) -> Option<Self> {
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        let root_pos = parts.iter().rposition(|p| is_root_complex(p))?;
        let mut chain: Vec<String> = parts[root_pos + 1..]
            .iter()
            .take_while(|p| is_bdf(p))
            .map(|s| s.to_string())
            .collect();
        chain.pop()?; // the device itself
        Some(PciLocation {
            root: parts[root_pos].to_string(),
            bridges: chain,
            numa_node,
        })
    }
}

fn is_root_complex(s: &str) -> bool {
    let Some(rest) = s.strip_prefix("pci") else {
        return false;
    };
    let Some((dom, bus)) = rest.split_once(':') else {
        return false;
    };
    !dom.is_empty()
        && !bus.is_empty()
        && dom
            .chars()
            .chain(bus.chars())
            .all(|c| c.is_ascii_hexdigit())
}

fn is_bdf(s: &str) -> bool {
    normalize_bdf(s).is_some()
}

/// The `topo -m` label for two distinct devices over PCIe.
///
/// NCCL folds each switch's upstream and downstream ports into one node, so two devices
/// that branch apart at most one level below their deepest common bridge sit on one
/// switch (PIX); deeper branching crosses several switches (PXB). Without a common
/// bridge the path climbs to the host bridge (PHB); different host bridges meet in the
/// CPU of one NUMA node (NODE) or cross the socket interconnect (SYS).
pub fn distance(a: &PciLocation, b: &PciLocation) -> &'static str {
    if a.root != b.root {
        return if a.numa_node == b.numa_node {
            "NODE"
        } else {
            "SYS"
        };
    }
    let common = a
        .bridges
        .iter()
        .zip(&b.bridges)
        .take_while(|(x, y)| x == y)
        .count();
    if common == 0 {
        return "PHB";
    }
    // A root port alone is not a switch: devices that share only it (functions of one
    // card aside) still meet at the host bridge.
    if common == 1 && (a.bridges.len() > 1 || b.bridges.len() > 1) {
        return "PHB";
    }
    if a.bridges.len() - common <= 1 && b.bridges.len() - common <= 1 {
        "PIX"
    } else {
        "PXB"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc(path: &str, numa: u32) -> PciLocation {
        PciLocation::from_path(path, Some(numa)).unwrap()
    }

    #[test]
    fn nvml_bus_ids_normalize_to_sysfs_form() {
        assert_eq!(
            normalize_bdf("00000000:06:00.0").as_deref(),
            Some("0000:06:00.0")
        );
        assert_eq!(
            normalize_bdf("00000001:00:00.0").as_deref(),
            Some("0001:00:00.0")
        );
        assert_eq!(
            normalize_bdf("0000:1B:00.1").as_deref(),
            Some("0000:1b:00.1")
        );
        assert_eq!(normalize_bdf("pci0000:00"), None);
    }

    #[test]
    fn dgx1_style_paths_give_topo_labels() {
        let sw = "/sys/devices/pci0000:00/0000:00:02.0/0000:03:00.0";
        let gpu0 = loc(&format!("{sw}/0000:04:08.0/0000:06:00.0"), 0);
        let gpu1 = loc(&format!("{sw}/0000:04:10.0/0000:07:00.0"), 0);
        let hca = loc(&format!("{sw}/0000:04:04.0/0000:05:00.0"), 0);
        let gpu2 = loc(
            "/sys/devices/pci0000:00/0000:00:03.0/0000:08:00.0/0000:09:08.0/0000:0a:00.0",
            0,
        );
        let gpu4 = loc(
            "/sys/devices/pci0000:80/0000:80:02.0/0000:82:00.0/0000:83:08.0/0000:85:00.0",
            1,
        );
        assert_eq!(distance(&gpu0, &gpu1), "PIX");
        assert_eq!(distance(&gpu0, &hca), "PIX");
        assert_eq!(distance(&gpu0, &gpu2), "PHB");
        assert_eq!(distance(&gpu0, &gpu4), "SYS");
    }

    #[test]
    fn nested_switches_are_pxb_and_separate_roots_node() {
        let a = loc(
            "/sys/devices/pci0000:10/0000:10:01.0/0000:11:00.0/0000:12:00.0/0000:13:00.0/0000:14:00.0/0000:15:00.0",
            0,
        );
        let b = loc(
            "/sys/devices/pci0000:10/0000:10:01.0/0000:11:00.0/0000:12:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0",
            0,
        );
        assert_eq!(distance(&a, &b), "PXB");
        let c = loc("/sys/devices/pci0000:20/0000:20:01.0/0000:21:00.0", 0);
        assert_eq!(distance(&a, &c), "NODE");
        // Two functions of one card share every bridge.
        let f0 = loc("/sys/devices/pci0000:20/0000:20:01.0/0000:21:00.0", 0);
        let f1 = loc("/sys/devices/pci0000:20/0000:20:01.0/0000:21:00.1", 0);
        assert_eq!(distance(&f0, &f1), "PIX");
    }

    #[test]
    fn hyperv_paths_find_the_root_complex_after_vmbus() {
        let l = loc(
            "/sys/devices/LNXSYSTM:00/LNXSYBUS:00/PNP0A03:00/device:07/VMBUS:01/47505500-0001-0000-3130-444531303244/pci0001:00/0001:00:00.0",
            0,
        );
        assert_eq!(l.root, "pci0001:00");
        assert!(l.bridges.is_empty());
    }
}
