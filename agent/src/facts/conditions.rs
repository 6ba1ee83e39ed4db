//! Conditions operators used to check by eye, read from files under the root: GPU PCIe
//! links, IB port error counters, bonds, NCCL config files, Xid lines of the kernel log and
//! the installed rdma-core. The NVML part is `nvml_conditions`; the rules that judge all of
//! it are `heddle_types::node_checks`.

use std::collections::BTreeMap;
use std::path::Path;

use heddle_types::conditions::{
    Bond, BondMember, ConditionFacts, GpuCondition, IbPortCounters, NcclConfFile, PcieLink,
    XidEvent,
};
use heddle_types::facts::{GpuFacts, NetInterface, RdmaDevice};

use super::sysfs::Root;

/// How many Xid events are kept: enough to see a storm, bounded so facts stay small.
const MAX_XID_EVENTS: usize = 64;

/// Counters read per port; see [`IbPortCounters`].
const COUNTERS: [&str; 4] = [
    "symbol_error",
    "link_downed",
    "port_rcv_errors",
    "link_error_recovery",
];

/// Library directories searched for `libibverbs.so.1.*`.
const LIB_DIRS: [&str; 6] = [
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib64",
    "usr/lib",
    "lib64",
    "lib/x86_64-linux-gnu",
];

pub struct Inputs<'a> {
    pub gpus: &'a [GpuFacts],
    pub rdma: &'a [RdmaDevice],
    pub interfaces: &'a [NetInterface],
    pub env: &'a BTreeMap<String, String>,
}

/// Everything but the NVML fields, which [`super::nvml_conditions`] fills in.
pub fn collect(root: &mut Root, input: &Inputs<'_>) -> ConditionFacts {
    let (xid_events, xid_source) = xid_events(root);
    ConditionFacts {
        gpus: input
            .gpus
            .iter()
            .map(|g| GpuCondition {
                index: g.index,
                bdf: g.bdf.clone(),
                pcie: pcie_link(root, &g.bdf),
                ..Default::default()
            })
            .collect(),
        nvml_source: None,
        ib_counters: ib_counters(root, input.rdma),
        bonds: bonds(root, input.interfaces),
        nccl_conf: nccl_conf(root, input.env),
        xid_events,
        xid_source,
        rdma_core_installed: installed_rdma_core(root),
    }
}

/// `8.0 GT/s PCIe` (or `8 GT/s`) → 3.
pub fn pcie_gen(speed: &str) -> Option<u32> {
    let gts: f64 = speed.split_whitespace().next()?.parse().ok()?;
    [
        (2.5, 1),
        (5.0, 2),
        (8.0, 3),
        (16.0, 4),
        (32.0, 5),
        (64.0, 6),
    ]
    .iter()
    .find(|(s, _)| (gts - s).abs() < 0.01)
    .map(|&(_, g)| g)
}

fn pcie_link(root: &mut Root, bdf: &str) -> Option<PcieLink> {
    let dir = format!("sys/bus/pci/devices/{bdf}");
    let field = format!("/conditions/gpus/{bdf}/pcie");
    // "Unknown" speeds and a width of 0 are what a link in a low-power state reports.
    let speed = |root: &mut Root, f: &str| {
        root.opt(&format!("{dir}/{f}"), &format!("{field}/{f}"))
            .filter(|s| !s.starts_with("Unknown"))
    };
    let width = |root: &mut Root, f: &str| {
        root.opt_parse(
            &format!("{dir}/{f}"),
            &format!("{field}/{f}"),
            "a link width",
            |s| s.parse::<u32>().ok(),
        )
        .filter(|w| *w > 0)
    };
    let link = PcieLink {
        current_gen: None,
        max_gen: None,
        current_speed: speed(root, "current_link_speed"),
        max_speed: speed(root, "max_link_speed"),
        current_width: width(root, "current_link_width"),
        max_width: width(root, "max_link_width"),
    };
    if link.current_speed.is_none() && link.max_speed.is_none() && link.current_width.is_none() {
        return None;
    }
    Some(PcieLink {
        current_gen: link.current_speed.as_deref().and_then(pcie_gen),
        max_gen: link.max_speed.as_deref().and_then(pcie_gen),
        ..link
    })
}

fn ib_counters(root: &mut Root, devices: &[RdmaDevice]) -> Vec<IbPortCounters> {
    let mut out = Vec::new();
    for d in devices {
        for p in &d.ports {
            let dir = format!("sys/class/infiniband/{}/ports/{}/counters", d.name, p.port);
            if !root.exists(&dir) {
                continue;
            }
            let mut c = IbPortCounters {
                device: d.name.clone(),
                port: p.port,
                ..Default::default()
            };
            for name in COUNTERS {
                let v = root.opt_parse(
                    &format!("{dir}/{name}"),
                    &format!("/conditions/ib_counters/{}/{}/{name}", d.name, p.port),
                    "a counter",
                    |s| s.parse::<u64>().ok(),
                );
                match name {
                    "symbol_error" => c.symbol_error = v,
                    "link_downed" => c.link_downed = v,
                    "port_rcv_errors" => c.port_rcv_errors = v,
                    _ => c.link_error_recovery = v,
                }
            }
            out.push(c);
        }
    }
    out
}

fn bonds(root: &mut Root, interfaces: &[NetInterface]) -> Vec<Bond> {
    let mut out = Vec::new();
    for i in interfaces {
        let dir = format!("sys/class/net/{}/bonding", i.name);
        if !root.path(&dir).is_dir() {
            continue;
        }
        let field = format!("/conditions/bonds/{}", i.name);
        let members = i
            .slaves
            .iter()
            .map(|m| BondMember {
                name: m.clone(),
                mii_status: root.opt(
                    &format!("sys/class/net/{m}/bonding_slave/mii_status"),
                    &format!("{field}/{m}/mii_status"),
                ),
            })
            .collect();
        out.push(Bond {
            name: i.name.clone(),
            mode: root.opt(&format!("{dir}/mode"), &format!("{field}/mode")),
            active_slave: root.opt(
                &format!("{dir}/active_slave"),
                &format!("{field}/active_slave"),
            ),
            members,
        });
    }
    out
}

/// The files NCCL reads at init, in its order: `NCCL_CONF_FILE` if set, else
/// `$HOME/.nccl.conf`; then `/etc/nccl.conf`. These are the root's own files, never the
/// host's /etc: the jobs run where the agent runs.
fn nccl_conf(root: &mut Root, env: &BTreeMap<String, String>) -> Vec<NcclConfFile> {
    let mut paths = Vec::new();
    match env.get("NCCL_CONF_FILE").filter(|p| !p.is_empty()) {
        Some(p) => paths.push(p.clone()),
        None => {
            if let Some(home) = env.get("HOME").filter(|h| h.starts_with('/')) {
                paths.push(format!("{}/.nccl.conf", home.trim_end_matches('/')));
            }
        }
    }
    paths.push("/etc/nccl.conf".into());
    let mut out = Vec::new();
    for path in paths {
        match super::sysfs::read_capped(&root.own_path(&path)) {
            Ok(bytes) => out.push(NcclConfFile {
                variables: parse_nccl_conf(&String::from_utf8_lossy(&bytes)),
                path,
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => root.error("/conditions/nccl_conf", format!("{path}: {e}")),
        }
    }
    out
}

/// NCCL's own reading of a config file: one `NAME=VALUE` per line, `#` starts a comment
/// line, blanks around the name and value are dropped.
pub fn parse_nccl_conf(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .filter(|(k, _)| !k.is_empty())
        .collect()
}

fn installed_rdma_core(root: &mut Root) -> Option<String> {
    let mut found: Vec<String> = LIB_DIRS
        .iter()
        .flat_map(|d| root.list(d).unwrap_or_default())
        .filter_map(|n| super::verbs::rdma_core_from_file_name(&n))
        .collect();
    found.sort_by(|a, b| super::sysfs::natural_cmp(a, b));
    found.pop()
}

/// Xid lines of the kernel log. Live: `/dev/kmsg` read without blocking (needs
/// CAP_SYSLOG where `kernel.dmesg_restrict` is set); a fixture tree keeps the same record
/// format in a plain `dev/kmsg` file.
fn xid_events(root: &mut Root) -> (Vec<XidEvent>, Option<String>) {
    let path = root.own_path("/dev/kmsg");
    if !root.is_live() && !path.exists() {
        return (Vec::new(), None);
    }
    match read_kmsg(&path, root.is_live()) {
        Ok(records) => {
            let mut events: Vec<XidEvent> =
                records.iter().filter_map(|r| parse_xid_record(r)).collect();
            let skip = events.len().saturating_sub(MAX_XID_EVENTS);
            events.drain(..skip);
            (events, Some("/dev/kmsg".into()))
        }
        Err(e) => {
            root.error(
                "/conditions/xid_events",
                format!("/dev/kmsg: {e} (the agent needs CAP_SYSLOG to read the kernel log)"),
            );
            (Vec::new(), None)
        }
    }
}

fn read_kmsg(path: &Path, live: bool) -> std::io::Result<Vec<String>> {
    if !live {
        let text = std::fs::read_to_string(path)?;
        return Ok(text
            .lines()
            .filter(|l| !l.starts_with(' '))
            .map(str::to_string)
            .collect());
    }
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let mut records = Vec::new();
    let mut buf = vec![0u8; 8192];
    loop {
        // Each read returns one record; EAGAIN means the end of the buffer, EPIPE that
        // older records were overwritten while reading (the next read resumes).
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let text = String::from_utf8_lossy(&buf[..n]);
                if let Some(first) = text.lines().next() {
                    records.push(first.to_string());
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(records)
}

/// `4,1093,63291739215,-;NVRM: Xid (PCI:0000:07:00): 79, pid='<unknown>', name=<unknown>,
/// GPU has fallen off the bus.` → seq 1093, pci `0000:07:00`, Xid 79.
pub fn parse_xid_record(record: &str) -> Option<XidEvent> {
    let (header, message) = record.split_once(';')?;
    let seq: u64 = header.split(',').nth(1)?.trim().parse().ok()?;
    let rest = message.split_once("NVRM: Xid (")?.1;
    let (pci, rest) = rest.split_once("):")?;
    let pci = pci.trim().trim_start_matches("PCI:").to_string();
    let rest = rest.trim_start();
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let xid: u32 = digits.parse().ok()?;
    Some(XidEvent {
        seq,
        pci,
        xid,
        text: rest.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pcie_generations_from_sysfs_speeds() {
        assert_eq!(pcie_gen("8.0 GT/s PCIe"), Some(3));
        assert_eq!(pcie_gen("8 GT/s"), Some(3));
        assert_eq!(pcie_gen("16.0 GT/s PCIe"), Some(4));
        assert_eq!(pcie_gen("2.5 GT/s PCIe"), Some(1));
        assert_eq!(pcie_gen("Unknown"), None);
    }

    #[test]
    fn xid_records_as_the_kernel_writes_them() {
        let e = parse_xid_record("4,1093,63291739215,-;NVRM: Xid (PCI:0000:07:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.").unwrap();
        assert_eq!((e.seq, e.pci.as_str(), e.xid), (1093, "0000:07:00", 79));
        assert!(e.text.ends_with("fallen off the bus."));
        assert!(
            parse_xid_record("6,1,2,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module").is_none()
        );
        assert!(parse_xid_record("garbage").is_none());
    }

    #[test]
    fn nccl_conf_as_nccl_reads_it() {
        let v = parse_nccl_conf(
            "# site defaults\nNCCL_IB_DISABLE=1\n  NCCL_SOCKET_IFNAME = eth0 \n\nbad line\n",
        );
        assert_eq!(v.len(), 2);
        assert_eq!(v["NCCL_IB_DISABLE"], "1");
        assert_eq!(v["NCCL_SOCKET_IFNAME"], "eth0");
    }

    #[test]
    fn live_kernel_log_reads_or_says_why_not() {
        let mut root = Root::new("/");
        let (events, source) = xid_events(&mut root);
        match source {
            Some(s) => assert_eq!(s, "/dev/kmsg"),
            None => {
                assert!(events.is_empty());
                let errs = root.take_errors();
                assert!(
                    errs.iter().any(|e| e.field == "/conditions/xid_events"),
                    "{errs:?}"
                );
            }
        }
    }
}
