//! NCCL's INFO log as transport evidence ([`NcclEvidence`]): the network it chose, the
//! HCA ports it listed, the bootstrap interface, what every channel ran over, GPUDirect
//! RDMA, the RoCE GID index, NCCL's reasons for not using IB, and its warnings. The
//! judgement of that evidence lives in `heddle_types::transport`.
//!
//! Line shapes handled (NCCL 2.5 to 2.28, captures in agent/tests/captures/):
//! `host:pid:tid [dev] NCCL INFO <msg>`, `host:pid:tid [dev] file.cc:12 NCCL WARN <msg>`,
//! and nccl-tests' bare `NCCL version 2.19.3+cuda12.3`.

use heddle_types::transport::{NcclEvidence, NetDevice};

const MAX_WARNINGS: usize = 50;
const MAX_REASONS: usize = 20;

/// Environment variables whose value explains why IB was not chosen.
const IB_ENV: &[&str] = &[
    "NCCL_IB_DISABLE",
    "NCCL_NET",
    "NCCL_IB_HCA",
    "NCCL_IBEXT_DISABLE",
];

/// `[0]mlx5_0:1/IB` or `mlx5_2:1/RoCE` → a device.
fn device(token: &str) -> Option<NetDevice> {
    let t = token.trim_matches(|c: char| c == ',' || c == '{' || c == '}' || c == ';');
    let t = match t.strip_prefix('[') {
        Some(rest) => rest.split_once(']')?.1,
        None => t,
    };
    // `mlx5_0:1/IB`, `mlx5_0:1/IB/SHARP` (with a collective plugin).
    let (name, port_layer) = t.split_once(':')?;
    let mut parts = port_layer.split('/');
    let port = parts.next()?;
    let layer = parts.next()?;
    if name.is_empty() || !(layer == "IB" || layer == "RoCE") {
        return None;
    }
    Some(NetDevice {
        name: name.to_string(),
        port: port.parse().ok(),
        link_layer: Some(layer.to_string()),
    })
}

/// The `<n>` in `... GID <n> ...` or `... GID index <n> ...` of a NET/IB line.
fn gid_in(msg: &str) -> Option<u32> {
    let mut words = msg.split_whitespace();
    while let Some(w) = words.next() {
        if w == "GID" || w == "gid" {
            let mut next = words.next()?;
            if next == "index" || next == "Index" {
                next = words.next()?;
            }
            let digits: String = next.chars().take_while(char::is_ascii_digit).collect();
            return digits.parse().ok();
        }
    }
    None
}

/// `P2P/CUMEM/read` → `P2P`; `NET/IB/0/GDRDMA` → `NET/IB`; `NET/Socket/0` → `NET/Socket`.
pub fn family(transport: &str) -> String {
    let mut parts = transport.split('/');
    let first = parts.next().unwrap_or("");
    match (first, parts.next()) {
        ("NET", Some(net)) => format!("NET/{net}"),
        _ => first.to_string(),
    }
}

pub fn parse(log: &str) -> NcclEvidence {
    let mut ev = NcclEvidence::default();
    let mut gdr_channels = false;
    let mut gdr_disabled: Option<String> = None;
    let mut gdr_enabled = false;
    for line in log.lines() {
        let line = line.trim_end();
        if let Some((_, w)) = line.split_once(" NCCL WARN ") {
            let w = w.trim();
            if ev.warnings.len() < MAX_WARNINGS {
                ev.warnings.push(w.to_string());
            }
            let lower = w.to_ascii_lowercase();
            if (lower.contains("net/ib")
                || lower.contains("ibv")
                || lower.contains("gid")
                || lower.contains("verbs"))
                && ev.ib_unavailable.len() < MAX_REASONS
            {
                ev.ib_unavailable.push(w.to_string());
            }
            continue;
        }
        let msg = match line.split_once(" NCCL INFO ") {
            Some((_, m)) => m.trim(),
            None => {
                if let Some(v) = line.trim().strip_prefix("NCCL version ") {
                    ev.version.get_or_insert_with(|| v.trim().to_string());
                }
                continue;
            }
        };
        if let Some(v) = msg.strip_prefix("NCCL version ") {
            ev.version.get_or_insert_with(|| v.trim().to_string());
        } else if let Some(n) = msg.strip_prefix("Using network ") {
            if ev.network.is_none() {
                ev.network = Some(n.trim().to_string());
                ev.network_line = Some(msg.to_string());
            }
        } else if let Some((name, value)) = msg.split_once(" set by environment to ") {
            let value = value.trim().trim_end_matches('.').to_string();
            if IB_ENV.contains(&name) && ev.ib_unavailable.len() < MAX_REASONS {
                ev.ib_unavailable.push(msg.to_string());
            }
            if name == "NCCL_IB_GID_INDEX" {
                ev.gid_index = value.parse().ok().or(ev.gid_index);
            }
            ev.env.insert(name.to_string(), value);
        } else if let Some(rest) = msg
            .strip_prefix("Bootstrap : Using ")
            .or_else(|| msg.strip_prefix("Bootstrap: Using "))
        {
            // `[0]ib8:192.168.1.8<0> [1]...` in old releases: the first one is used.
            let first = rest.split_whitespace().next().unwrap_or("");
            let first = match first.strip_prefix('[') {
                Some(r) => r.split_once(']').map_or(first, |(_, n)| n),
                None => first,
            };
            ev.oob.get_or_insert_with(|| first.to_string());
        } else if let Some(rest) = msg
            .strip_prefix("NET/IB : Using ")
            .or_else(|| msg.strip_prefix("NET/IB: Using "))
        {
            let (list, oob) = match rest.split_once("OOB ") {
                Some((l, o)) => (l, Some(o.trim())),
                None => (rest, None),
            };
            if ev.devices.is_empty() {
                ev.devices = list
                    .split(|c: char| c.is_whitespace() || c == ',' || c == '{' || c == '}')
                    .filter_map(device)
                    .collect();
            }
            if let Some(o) = oob {
                ev.oob = Some(o.to_string());
            }
        } else if msg.starts_with("NET/IB") || msg.starts_with("Failed to initialize NET plugin IB")
        {
            if msg.contains("GPU Direct RDMA Disabled") {
                gdr_disabled.get_or_insert_with(|| msg.to_string());
            } else if msg.contains("GPU Direct RDMA Enabled") {
                gdr_enabled = true;
            } else if msg.contains("No device found") || msg.starts_with("Failed to initialize") {
                if ev.ib_unavailable.len() < MAX_REASONS {
                    ev.ib_unavailable.push(msg.to_string());
                }
            } else if ev.gid_index.is_none() {
                ev.gid_index = gid_in(msg);
            }
        } else if let Some(rest) = msg.strip_prefix("Channel ")
            && let Some((_, via)) = rest.split_once(" via ")
        {
            let transport = via.split_whitespace().next().unwrap_or("").to_string();
            if transport.is_empty() {
                continue;
            }
            ev.channel_lines += 1;
            let fam = family(&transport);
            if fam.starts_with("NET/") {
                ev.net_channel_line.get_or_insert_with(|| msg.to_string());
                if fam != "NET/Socket" && transport.contains("/GDRDMA") {
                    gdr_channels = true;
                }
            }
            *ev.transports.entry(fam).or_default() += 1;
            ev.channel_transports.insert(transport);
        }
    }
    ev.ib_unavailable.dedup();
    let rdma_connections = ev.net_connections() - ev.socket_connections();
    if gdr_channels {
        ev.gdr = Some(true);
    } else if rdma_connections > 0 {
        ev.gdr = Some(false);
        ev.gdr_line = gdr_disabled.or_else(|| ev.net_channel_line.clone());
    } else if let Some(line) = gdr_disabled.filter(|_| !gdr_enabled) {
        // NCCL decided against GPUDirect RDMA for every HCA before any channel connected.
        ev.gdr = Some(false);
        ev.gdr_line = Some(line);
    } else if ev.socket_connections() > 0 {
        ev.gdr = Some(false);
    }
    ev
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_tokens_of_every_layout() {
        assert_eq!(
            device("[0]mlx5_0:1/IB"),
            Some(NetDevice {
                name: "mlx5_0".into(),
                port: Some(1),
                link_layer: Some("IB".into())
            })
        );
        assert_eq!(device("mlx5_2:1/RoCE,").unwrap().name, "mlx5_2");
        assert_eq!(device("[RO];"), None);
        assert_eq!(device("[3]mlx5_5:1/IB/SHARP").unwrap().name, "mlx5_5");
        assert_eq!(device("eth0:192.0.2.2<0>"), None);
        assert_eq!(family("NET/IB/0/GDRDMA"), "NET/IB");
        assert_eq!(family("P2P/CUMEM/read"), "P2P");
        assert_eq!(family("SHM/direct/direct"), "SHM");
        assert_eq!(
            gid_in("NET/IB: IbDev 0 Port 1 qpn 12 mtu 5 GID 3 (0/A)"),
            Some(3)
        );
        assert_eq!(gid_in("NET/IB: nothing here"), None);
    }

    #[test]
    fn merged_devices_and_plugin_network() {
        let log = "\
b:1:2 [0] NCCL INFO NET/IB : Using [0]={[0] mlx5_2:1/RoCE, [1] mlx5_3:1/RoCE} [1]={[2] mlx5_0:1/RoCE, [3] mlx5_1:1/RoCE} [RO]; OOB bond0.526:169.136.106.9<0>
b:1:2 [0] NCCL INFO Using network IBext_v8
b:1:2 [0] NCCL INFO Channel 00/0 : 1[0] -> 2[0] [receive] via NET/IBext_v8/1";
        let ev = parse(log);
        let names: Vec<&str> = ev.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["mlx5_2", "mlx5_3", "mlx5_0", "mlx5_1"]);
        assert_eq!(ev.oob.as_deref(), Some("bond0.526:169.136.106.9<0>"));
        assert_eq!(ev.network.as_deref(), Some("IBext_v8"));
        assert_eq!(ev.transports.get("NET/IBext_v8"), Some(&1));
        assert_eq!(ev.gdr, Some(false));
        assert!(parse("").is_silent());
    }
}
