//! GPUs: inventory from PCI sysfs (works without a driver and on fixtures), enriched by
//! NVML when the live machine has it.
//!
//! NVML is loaded at run time by `nvml-wrapper` (it dlopens `libnvidia-ml.so.1`), so the
//! agent starts on machines without the NVIDIA driver and simply reports "no NVML".

use heddle_types::facts::{GpuFacts, NameSource, NvLink, PciDevice, PciKind, Probe, ProbeState};

use nvml_wrapper::enum_wrappers::device::{P2pCapabilitiesIndex, P2pStatus};
use nvml_wrapper::enum_wrappers::nv_link::Capability as NvLinkCapability;

use super::nvlink;
use super::pci::{gpu_name, normalize_bdf, parse_hex_u16};
use super::sysfs::Root;

/// `NVML_NVLINK_MAX_LINKS` of current NVML headers (18 on Hopper).
const NVML_NVLINK_MAX_LINKS: u32 = 18;

/// What NVML adds to the sysfs view, keyed by bus id.
#[derive(Debug, Default)]
pub struct NvmlView {
    pub driver_version: Option<String>,
    pub cuda_version: Option<String>,
    pub devices: Vec<NvmlDevice>,
    /// What NVML said about the NVLinks, in the fixture form (`heddle-agent facts
    /// --nvml-nvlinks`).
    pub nvlinks: nvlink::Answers,
}

#[derive(Debug, Default)]
pub struct NvmlDevice {
    pub index: u32,
    pub bdf: String,
    pub name: Option<String>,
    pub uuid: Option<String>,
    pub memory_total_bytes: Option<u64>,
    pub nvlinks: Vec<NvLink>,
    /// Power, throttle, persistence, ECC and processes (see `nvml_conditions`).
    pub condition: heddle_types::conditions::GpuCondition,
}

/// GPUs from the PCI list, numbered in bus order, with names from the PCI id table.
pub fn from_pci(pci: &[PciDevice]) -> Vec<GpuFacts> {
    pci.iter()
        .filter(|d| d.kind == PciKind::Gpu)
        .enumerate()
        .map(|(i, d)| {
            let name = parse_hex_u16(&d.device_id)
                .and_then(gpu_name)
                .map(str::to_string);
            GpuFacts {
                index: i as u32,
                bdf: d.bdf.clone(),
                device_id: d.device_id.clone(),
                name_source: name.as_ref().map(|_| NameSource::PciIdTable),
                name,
                uuid: None,
                memory_total_bytes: None,
                numa_node: d.numa_node,
                cpu_affinity: d.local_cpulist.clone(),
                nvlinks: Vec::new(),
            }
        })
        .collect()
}

/// Overlays NVML's answers on the sysfs GPUs. A GPU NVML knows but sysfs does not (a
/// container that hides `/sys/bus/pci`) is added; ordering follows NVML's index.
pub fn merge(gpus: &mut Vec<GpuFacts>, view: &NvmlView) {
    for d in &view.devices {
        let gpu = match gpus.iter_mut().find(|g| g.bdf == d.bdf) {
            Some(g) => g,
            None => {
                gpus.push(GpuFacts {
                    index: d.index,
                    bdf: d.bdf.clone(),
                    device_id: String::new(),
                    name: None,
                    name_source: None,
                    uuid: None,
                    memory_total_bytes: None,
                    numa_node: None,
                    cpu_affinity: None,
                    nvlinks: Vec::new(),
                });
                gpus.last_mut().expect("just pushed")
            }
        };
        gpu.index = d.index;
        if let Some(name) = &d.name {
            gpu.name = Some(name.clone());
            gpu.name_source = Some(NameSource::Nvml);
        }
        gpu.uuid = d.uuid.clone();
        gpu.memory_total_bytes = d.memory_total_bytes;
        gpu.nvlinks = d.nvlinks.clone();
    }
    gpus.sort_by(|a, b| a.index.cmp(&b.index).then_with(|| a.bdf.cmp(&b.bdf)));
}

/// Queries NVML. Only called for the live machine; `library` overrides the soname (tests
/// point it at a library that does not exist to exercise the "no NVML" path).
pub fn query_nvml(root: &mut Root, library: Option<&str>) -> (Probe, Option<NvmlView>) {
    let init = match library {
        Some(lib) => nvml_wrapper::Nvml::builder()
            .lib_path(std::ffi::OsStr::new(lib))
            .init(),
        None => nvml_wrapper::Nvml::init(),
    };
    let nvml = match init {
        Ok(n) => n,
        Err(e) => {
            use nvml_wrapper::error::NvmlError;
            let lib = library.unwrap_or("libnvidia-ml.so.1");
            let state = if matches!(
                e,
                NvmlError::LibloadingError(_) | NvmlError::DriverNotLoaded
            ) {
                ProbeState::Missing
            } else {
                ProbeState::Failed
            };
            let message = match &e {
                NvmlError::LibloadingError(_) => format!("no NVML: {lib} could not be loaded ({e}); GPU inventory comes from PCI sysfs only"),
                NvmlError::DriverNotLoaded => "no NVML: the NVIDIA kernel driver is not loaded; GPU inventory comes from PCI sysfs only".to_string(),
                other => format!("no NVML: initialisation failed ({other}); GPU inventory comes from PCI sysfs only"),
            };
            return (Probe { state, message }, None);
        }
    };
    let mut view = NvmlView {
        driver_version: nvml
            .sys_driver_version()
            .map_err(|e| root.error("/software/nvidia_driver", format!("NVML: {e}")))
            .ok(),
        cuda_version: nvml
            .sys_cuda_driver_version()
            .map(|v| {
                format!(
                    "{}.{}",
                    nvml_wrapper::cuda_driver_version_major(v),
                    nvml_wrapper::cuda_driver_version_minor(v)
                )
            })
            .map_err(|e| root.error("/software/cuda_driver", format!("NVML: {e}")))
            .ok(),
        devices: Vec::new(),
        nvlinks: Default::default(),
    };
    let count = match nvml.device_count() {
        Ok(c) => c,
        Err(e) => {
            return (
                Probe {
                    state: ProbeState::Failed,
                    message: format!("NVML loaded but cannot count devices: {e}"),
                },
                Some(view),
            );
        }
    };
    let mut answers = nvlink::Answers::default();
    for i in 0..count {
        let field = format!("/gpus/{i}");
        let dev = match nvml.device_by_index(i) {
            Ok(d) => d,
            Err(e) => {
                root.error(&field, format!("NVML device {i}: {e}"));
                continue;
            }
        };
        let Some(bdf) = dev.pci_info().ok().and_then(|p| normalize_bdf(&p.bus_id)) else {
            root.error(&format!("{field}/bdf"), "NVML gave no usable PCI bus id");
            continue;
        };
        let mut links = Vec::new();
        for link in 0..NVML_NVLINK_MAX_LINKS {
            let wrapper = dev.link_wrapper_for(link);
            // NotSupported / InvalidArg past the last link are expected, not errors.
            if !wrapper.is_active().unwrap_or(false) {
                continue;
            }
            links.push(nvlink::LinkAnswers {
                link,
                // Inside VMs whose NVSwitches are hidden NVML answers `ffffffff:ff:ff.0`.
                remote_pci: wrapper.remote_pci_info().ok().map(|p| p.bus_id),
                remote_type: wrapper
                    .remote_device_type(link)
                    .ok()
                    .map(|t| format!("{t:?}").to_ascii_lowercase()),
                p2p_supported: wrapper.has_capability(NvLinkCapability::P2p).ok(),
            });
        }
        answers.gpus.push(nvlink::GpuAnswers {
            bdf: bdf.clone(),
            links,
        });
        let index = dev.index().unwrap_or(i);
        let condition = super::nvml_conditions::read(&nvml, &dev, index, &bdf);
        view.devices.push(NvmlDevice {
            index,
            condition,
            bdf,
            name: dev
                .name()
                .map_err(|e| root.error(&format!("{field}/name"), format!("NVML: {e}")))
                .ok(),
            uuid: dev
                .uuid()
                .map_err(|e| root.error(&format!("{field}/uuid"), format!("NVML: {e}")))
                .ok(),
            memory_total_bytes: dev
                .memory_info()
                .map(|m| m.total)
                .map_err(|e| {
                    root.error(&format!("{field}/memory_total_bytes"), format!("NVML: {e}"))
                })
                .ok(),
            nvlinks: Vec::new(),
        });
    }
    answers.p2p_nvlink = p2p_nvlink(&nvml, count);
    for d in &mut view.devices {
        if let Some(g) = answers.gpus.iter().find(|g| g.bdf == d.bdf) {
            d.nvlinks = nvlink::links_of(&answers, g);
        }
    }
    view.nvlinks = answers;
    let message = format!(
        "NVML {} reports {count} GPU(s)",
        view.driver_version
            .as_deref()
            .unwrap_or("(driver version unknown)")
    );
    (
        Probe {
            state: ProbeState::Available,
            message,
        },
        Some(view),
    )
}

/// NVML's P2P status over NVLink for every ordered pair of GPUs it can open.
fn p2p_nvlink(nvml: &nvml_wrapper::Nvml, count: u32) -> Vec<nvlink::P2pAnswer> {
    let devs: Vec<(String, nvml_wrapper::Device<'_>)> = (0..count)
        .filter_map(|i| {
            let d = nvml.device_by_index(i).ok()?;
            let bdf = d.pci_info().ok().and_then(|p| normalize_bdf(&p.bus_id))?;
            Some((bdf, d))
        })
        .collect();
    let mut out = Vec::new();
    for (from, a) in &devs {
        for (to, b) in &devs {
            if from == to {
                continue;
            }
            let status = match a.p2p_status(b, P2pCapabilitiesIndex::NvLink) {
                Ok(P2pStatus::Ok) => "ok".to_string(),
                Ok(other) => snake(&format!("{other:?}")),
                Err(e) => format!("error: {e}"),
            };
            out.push(nvlink::P2pAnswer {
                from: from.clone(),
                to: to.clone(),
                status,
            });
        }
    }
    out
}

/// `ChipsetNotSupported` → `chipset_not_supported`.
fn snake(name: &str) -> String {
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pci_gpu(bdf: &str, device: &str) -> PciDevice {
        PciDevice {
            bdf: bdf.into(),
            kind: PciKind::Gpu,
            vendor_id: "0x10de".into(),
            device_id: device.into(),
            class: "0x030200".into(),
            driver: None,
            numa_node: Some(0),
            local_cpulist: Some("0-7".into()),
            sysfs_path: None,
        }
    }

    #[test]
    fn unknown_pci_ids_get_no_name() {
        let gpus = from_pci(&[
            pci_gpu("0000:06:00.0", "0x1db1"),
            pci_gpu("0000:07:00.0", "0xffff"),
        ]);
        assert_eq!(gpus[0].name.as_deref(), Some("Tesla V100-SXM2-16GB"));
        assert_eq!(gpus[0].name_source, Some(NameSource::PciIdTable));
        assert_eq!(gpus[1].name, None);
        assert_eq!(gpus[1].name_source, None);
    }

    #[test]
    fn nvml_overrides_names_and_indices() {
        let mut gpus = from_pci(&[
            pci_gpu("0000:06:00.0", "0x1db1"),
            pci_gpu("0000:07:00.0", "0x1db1"),
        ]);
        let view = NvmlView {
            devices: vec![
                NvmlDevice {
                    index: 0,
                    bdf: "0000:07:00.0".into(),
                    name: Some("Tesla V100-SXM2-32GB".into()),
                    ..Default::default()
                },
                NvmlDevice {
                    index: 1,
                    bdf: "0000:06:00.0".into(),
                    name: Some("Tesla V100-SXM2-32GB".into()),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        merge(&mut gpus, &view);
        assert_eq!(gpus[0].bdf, "0000:07:00.0");
        assert_eq!(gpus[0].name_source, Some(NameSource::Nvml));
        assert_eq!(gpus[1].index, 1);
    }

    #[test]
    fn missing_nvml_library_is_reported_not_fatal() {
        let mut root = Root::new("/");
        let (probe, view) = query_nvml(&mut root, Some("libnvidia-ml-does-not-exist.so.1"));
        assert!(view.is_none());
        assert_eq!(probe.state, ProbeState::Missing);
        assert!(probe.message.starts_with("no NVML"), "{}", probe.message);
    }
}
