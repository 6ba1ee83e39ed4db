//! RDMA devices from `/sys/class/infiniband`: HCA identity, ports and GID tables.
//!
//! The GID table is what NCCL_IB_GID_INDEX points into, so every non-zero GID is kept
//! with its type (`IB/RoCE v1`, `RoCE v2`) and netdev. Reading `gid_attrs/types/<i>` of an
//! unused entry fails with EINVAL on real kernels, which is why only non-zero GIDs are
//! followed up.

use heddle_types::facts::{Gid, Probe, ProbeState, RdmaDevice, RdmaPort};

use super::sysfs::Root;

const CLASS: &str = "sys/class/infiniband";

pub fn collect(root: &mut Root) -> (Probe, Vec<RdmaDevice>) {
    if !root.exists(CLASS) {
        let probe = Probe {
            state: ProbeState::Missing,
            message:
                "no RDMA devices: /sys/class/infiniband does not exist (no RDMA driver loaded)"
                    .into(),
        };
        return (probe, Vec::new());
    }
    let names = match root.list(CLASS) {
        Ok(n) => n,
        Err(e) => {
            return (
                Probe {
                    state: ProbeState::Failed,
                    message: e.to_string(),
                },
                Vec::new(),
            );
        }
    };
    let devices: Vec<RdmaDevice> = names.iter().map(|n| device(root, n)).collect();
    let probe = if devices.is_empty() {
        Probe {
            state: ProbeState::Missing,
            message: "no RDMA devices: /sys/class/infiniband is empty".into(),
        }
    } else {
        let list: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
        Probe {
            state: ProbeState::Available,
            message: format!("{} RDMA device(s): {}", devices.len(), list.join(", ")),
        }
    };
    (probe, devices)
}

fn device(root: &mut Root, name: &str) -> RdmaDevice {
    let dir = format!("{CLASS}/{name}");
    let field = format!("/rdma/devices/{name}");
    let opt = |root: &mut Root, file: &str| {
        root.opt(&format!("{dir}/{file}"), &format!("{field}/{file}"))
    };
    let pci_bdf = root
        .resolve(&format!("{dir}/device"))
        .ok()
        .and_then(|p| super::pci::last_bdf(&p));
    let mut netdevs = match &pci_bdf {
        Some(bdf) => root
            .list(&format!("sys/bus/pci/devices/{bdf}/net"))
            .unwrap_or_default(),
        None => Vec::new(),
    };
    let mut ports = Vec::new();
    for p in root.list_or_record(&format!("{dir}/ports"), &format!("{field}/ports")) {
        let Ok(num) = p.parse::<u32>() else { continue };
        ports.push(port(root, &dir, &field, num));
    }
    ports.sort_by_key(|p| p.port);
    // A RoCE bond's netdev (bond0) appears only in the GID table, not under the PF.
    for gid in ports.iter().flat_map(|p| &p.gids) {
        if let Some(nd) = &gid.ndev {
            netdevs.push(nd.clone());
        }
    }
    netdevs.sort_by(|a, b| super::sysfs::natural_cmp(a, b));
    netdevs.dedup();
    RdmaDevice {
        name: name.to_string(),
        fw_ver: opt(root, "fw_ver"),
        node_guid: opt(root, "node_guid"),
        sys_image_guid: opt(root, "sys_image_guid"),
        hca_type: opt(root, "hca_type"),
        board_id: opt(root, "board_id"),
        node_type: opt(root, "node_type"),
        pci_bdf,
        netdevs,
        ports,
        seen_by_verbs: None,
    }
}

fn port(root: &mut Root, dev_dir: &str, dev_field: &str, num: u32) -> RdmaPort {
    let dir = format!("{dev_dir}/ports/{num}");
    let field = format!("{dev_field}/ports/{num}");
    let opt = |root: &mut Root, file: &str| {
        root.opt(&format!("{dir}/{file}"), &format!("{field}/{file}"))
    };
    let state_raw = opt(root, "state");
    let state = match &state_raw {
        Some(raw) => normalize_state(raw).unwrap_or_else(|| {
            root.error(
                &format!("{field}/state"),
                format!("unrecognized port state {raw:?}"),
            );
            "UNKNOWN".to_string()
        }),
        None => "UNKNOWN".to_string(),
    };
    let link_layer = opt(root, "link_layer");
    let mut gids = Vec::new();
    for entry in root.list(&format!("{dir}/gids")).unwrap_or_default() {
        let Ok(index) = entry.parse::<u32>() else {
            continue;
        };
        let gid_field = format!("{field}/gids/{index}");
        let Some(gid) = root.opt(&format!("{dir}/gids/{index}"), &gid_field) else {
            continue;
        };
        let Some(bytes) = parse_gid(&gid) else {
            root.error(&gid_field, format!("not a GID: {gid:?}"));
            continue;
        };
        if bytes.iter().all(|b| *b == 0) {
            continue;
        }
        gids.push(Gid {
            index,
            gid_type: root.opt(
                &format!("{dir}/gid_attrs/types/{index}"),
                &format!("{gid_field}/gid_type"),
            ),
            ndev: root.opt(
                &format!("{dir}/gid_attrs/ndevs/{index}"),
                &format!("{gid_field}/ndev"),
            ),
            ipv4: ipv4_mapped(&bytes),
            gid,
        });
    }
    gids.sort_by_key(|g| g.index);
    RdmaPort {
        port: num,
        state,
        state_raw,
        phys_state: opt(root, "phys_state"),
        rate: opt(root, "rate"),
        link_layer,
        lid: opt(root, "lid"),
        sm_lid: opt(root, "sm_lid"),
        active_mtu: None,
        gids,
    }
}

/// `4: ACTIVE` → `ACTIVE`. The number is authoritative (IB spec port states), the text
/// is what the kernel prints and sometimes differs (`ACTIVE_DEFER`).
pub fn normalize_state(raw: &str) -> Option<String> {
    let (num, text) = match raw.split_once(':') {
        Some((n, t)) => (n.trim().parse::<u32>().ok(), t.trim()),
        None => (raw.trim().parse::<u32>().ok(), raw.trim()),
    };
    let from_num = num.and_then(state_name);
    let from_text = ["NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"]
        .into_iter()
        .find(|s| text.eq_ignore_ascii_case(s) || text.eq_ignore_ascii_case(&format!("PORT_{s}")));
    from_num.or(from_text).map(str::to_string)
}

pub fn state_name(num: u32) -> Option<&'static str> {
    Some(match num {
        0 => "NOP",
        1 => "DOWN",
        2 => "INIT",
        3 => "ARMED",
        4 => "ACTIVE",
        5 => "ACTIVE_DEFER",
        _ => return None,
    })
}

/// Parses `fe80:0000:0000:0000:0015:5dff:fd33:ff16` into 16 bytes.
pub fn parse_gid(s: &str) -> Option<[u8; 16]> {
    let groups: Vec<&str> = s.trim().split(':').collect();
    if groups.len() != 8 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, g) in groups.iter().enumerate() {
        if g.is_empty() || g.len() > 4 {
            return None;
        }
        let v = u16::from_str_radix(g, 16).ok()?;
        out[2 * i..2 * i + 2].copy_from_slice(&v.to_be_bytes());
    }
    Some(out)
}

fn ipv4_mapped(b: &[u8; 16]) -> Option<String> {
    let v6 = std::net::Ipv6Addr::from(*b);
    v6.to_ipv4_mapped().map(|v4| v4.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_normalize_from_number_or_text() {
        assert_eq!(normalize_state("4: ACTIVE").as_deref(), Some("ACTIVE"));
        assert_eq!(normalize_state("1: DOWN").as_deref(), Some("DOWN"));
        assert_eq!(normalize_state("PORT_INIT").as_deref(), Some("INIT"));
        assert_eq!(normalize_state("9: WEIRD"), None);
        assert_eq!(normalize_state("garbage"), None);
    }

    #[test]
    fn gids_parse_and_map_ipv4() {
        let b = parse_gid("0000:0000:0000:0000:0000:ffff:0a00:0005").unwrap();
        assert_eq!(ipv4_mapped(&b).as_deref(), Some("10.0.0.5"));
        let link_local = parse_gid("fe80:0000:0000:0000:0015:5dff:fd33:ff16").unwrap();
        assert_eq!(ipv4_mapped(&link_local), None);
        assert!(parse_gid("fe80::1").is_none());
        assert!(parse_gid("zzzz:0000:0000:0000:0000:0000:0000:0000").is_none());
    }
}
