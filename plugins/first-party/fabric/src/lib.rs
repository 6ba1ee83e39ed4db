//! What the first-party plugins agree on about a node's RDMA ports, written once: which
//! ports may be recommended at all (ACTIVE and LinkUp), how NCCL and UCX name them, which
//! fabric NCCL should use when a node has both, which interface carries NCCL's bootstrap,
//! and the UCX transports for the GPU stack present.
//!
//! Every rule that could send traffic to a port goes through [`Port::is_usable`], so no
//! plugin can recommend a port that is down, and every port left out is reported with its
//! state by the plugin that owns its fabric ([`Port::dropped_warning`]).

use heddle_plugin_sdk::facts::{as_u64, entries};
use heddle_plugin_sdk::{Detection, Facts, Json};

/// The facts [`ports`] and [`interfaces`] look at; add them to a plugin's `reads`.
pub const READS: &[&str] = &[
    "/live",
    "/gpus/*/index",
    "/rdma/devices/*/name",
    "/rdma/devices/*/netdevs",
    "/rdma/devices/*/ports/*/port",
    "/rdma/devices/*/ports/*/state",
    "/rdma/devices/*/ports/*/phys_state",
    "/rdma/devices/*/ports/*/link_layer",
    "/network/interfaces/*/name",
    "/network/interfaces/*/operstate",
    "/network/interfaces/*/master",
    "/network/interfaces/*/slaves",
    "/network/interfaces/*/addresses",
];

/// GID tables, for the RoCE selection only (they are the bulk of the RDMA facts).
pub const GID_READS: &[&str] = &["/rdma/devices/*/ports/*/gids"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkLayer {
    InfiniBand,
    Ethernet,
    Unknown,
}

#[derive(Debug, Clone)]
pub struct Gid {
    pub index: u64,
    pub gid: String,
    pub v2: bool,
    pub ndev: Option<String>,
    /// The address of an IPv4-mapped GID (`…:ffff:a.b.c.d`).
    pub ipv4: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Port {
    pub device: String,
    pub port: u64,
    pub link_layer: LinkLayer,
    /// Normalised state: `ACTIVE`, `DOWN`, `INIT`, ...
    pub state: String,
    /// The sysfs text, e.g. `5: LinkUp`; `None` when the agent could not read it.
    pub phys_state: Option<String>,
    pub netdevs: Vec<String>,
    pub gids: Vec<Gid>,
    /// How many ports the device has; NCCL and UCX need `:port` when it is more than one.
    pub ports_on_device: usize,
}

impl Port {
    /// ACTIVE at the logical layer and LinkUp at the physical one. A port that is ACTIVE
    /// while its physical state says otherwise is flapping or being retrained.
    pub fn is_usable(&self) -> bool {
        self.state == "ACTIVE"
            && self
                .phys_state
                .as_deref()
                .is_none_or(|p| p.contains("LinkUp"))
    }

    /// `mlx5_0:1`, how UCX (and NCCL with a port) names a port.
    pub fn ucx_name(&self) -> String {
        format!("{}:{}", self.device, self.port)
    }

    /// The warning for a port [`is_usable`](Self::is_usable) refused, with its states and
    /// what to do.
    pub fn dropped_warning(&self) -> String {
        format!(
            "{} port {} is {} (physical state {}): left out of NCCL_IB_HCA and UCX_NET_DEVICES. \
             Check the cable and the switch port (`ibstat {}`), or disable the port if it is unused",
            self.device,
            self.port,
            self.state,
            self.phys_state.as_deref().unwrap_or("unknown"),
            self.device
        )
    }
}

/// Every port of every RDMA device, in the agent's order (natural name order).
pub fn ports(facts: &Facts) -> Vec<Port> {
    let mut out = Vec::new();
    for (device, dev) in facts.entries("/rdma/devices") {
        let netdevs: Vec<String> = dev
            .get("netdevs")
            .and_then(Json::as_array)
            .map(|a| a.filter_map(Json::as_str).map(str::to_string).collect())
            .unwrap_or_default();
        let dev_ports = dev.get("ports").map(entries).unwrap_or_default();
        let count = dev_ports.len();
        for (key, p) in dev_ports {
            let text = |k: &str| p.get(k).and_then(Json::as_str).map(str::to_string);
            let link_layer = match text("link_layer").as_deref().map(str::to_ascii_lowercase) {
                Some(l) if l == "infiniband" => LinkLayer::InfiniBand,
                Some(l) if l == "ethernet" => LinkLayer::Ethernet,
                _ => LinkLayer::Unknown,
            };
            let gids = p
                .get("gids")
                .map(entries)
                .unwrap_or_default()
                .into_iter()
                .filter_map(|(_, g)| {
                    let gid = g.get("gid").and_then(Json::as_str)?.to_string();
                    let ipv4 = g
                        .get("ipv4")
                        .and_then(Json::as_str)
                        .map(str::to_string)
                        .or_else(|| ipv4_of(&gid));
                    Some(Gid {
                        index: g.get("index").and_then(as_u64)?,
                        v2: g
                            .get("gid_type")
                            .and_then(Json::as_str)
                            .is_some_and(|t| t.trim().eq_ignore_ascii_case("RoCE v2")),
                        ndev: g.get("ndev").and_then(Json::as_str).map(str::to_string),
                        ipv4,
                        gid,
                    })
                })
                .collect();
            out.push(Port {
                device: device.clone(),
                port: p
                    .get("port")
                    .and_then(as_u64)
                    .or_else(|| key.parse().ok())
                    .unwrap_or(1),
                link_layer,
                state: text("state").unwrap_or_else(|| "UNKNOWN".into()),
                phys_state: text("phys_state"),
                netdevs: netdevs.clone(),
                gids,
                ports_on_device: count,
            });
        }
    }
    out
}

/// `a.b.c.d` of an IPv4-mapped GID (`0000:0000:0000:0000:0000:ffff:0a14:1e07`).
fn ipv4_of(gid: &str) -> Option<String> {
    let rest = gid
        .to_ascii_lowercase()
        .strip_prefix("0000:0000:0000:0000:0000:ffff:")?
        .to_string();
    let (hi, lo) = rest.split_once(':')?;
    let (hi, lo) = (
        u16::from_str_radix(hi, 16).ok()?,
        u16::from_str_radix(lo, 16).ok()?,
    );
    Some(format!(
        "{}.{}.{}.{}",
        hi >> 8,
        hi & 0xff,
        lo >> 8,
        lo & 0xff
    ))
}

/// A network interface as the agent saw it in its own network namespace.
#[derive(Debug, Clone)]
pub struct Iface {
    pub name: String,
    pub up: bool,
    pub master: Option<String>,
    pub slaves: Vec<String>,
    /// CIDR addresses; known on the live machine only.
    pub addresses: Vec<String>,
}

/// The node's interfaces, and whether their addresses were read (live machine).
pub fn interfaces(facts: &Facts) -> (Vec<Iface>, bool) {
    let list = facts
        .entries("/network/interfaces")
        .into_iter()
        .map(|(name, i)| {
            let strings = |k: &str| -> Vec<String> {
                i.get(k)
                    .and_then(Json::as_array)
                    .map(|a| a.filter_map(Json::as_str).map(str::to_string).collect())
                    .unwrap_or_default()
            };
            Iface {
                up: i
                    .get("operstate")
                    .and_then(Json::as_str)
                    .is_some_and(|s| s.eq_ignore_ascii_case("up")),
                master: i.get("master").and_then(Json::as_str).map(str::to_string),
                slaves: strings("slaves"),
                addresses: strings("addresses"),
                name,
            }
        })
        .collect();
    let live = facts.get("/live").and_then(Json::as_bool) == Some(true);
    (list, live)
}

/// True for the RDMA function of a transparent VF, such as Azure's accelerated networking:
/// its netdev is enslaved to a synthetic interface that is not a bond, so the VF can be
/// hot-removed at any time and its traffic is the VM's front-end network, never a fabric.
pub fn is_transparent_vf(port: &Port, ifaces: &[Iface]) -> bool {
    port.netdevs.iter().any(|n| {
        ifaces.iter().any(|i| {
            &i.name == n
                && i.master
                    .as_ref()
                    .is_some_and(|m| !ifaces.iter().any(|b| &b.name == m && b.slaves.contains(n)))
        })
    })
}

/// Which fabric NCCL should use: InfiniBand when any InfiniBand port is usable, else RoCE.
/// The one place that decides it, so the InfiniBand and RoCE rules never both claim
/// `NCCL_IB_HCA`.
pub fn prefers_infiniband(ports: &[Port]) -> bool {
    ports
        .iter()
        .any(|p| p.link_layer == LinkLayer::InfiniBand && p.is_usable())
}

/// `NCCL_IB_HCA` in exact-match form. NCCL reads a plain list as prefixes (`mlx5_1` also
/// takes `mlx5_10` … `mlx5_19`); a leading `=` makes every entry exact. Ports are named
/// (`mlx5_0:1`) where the device has several, so a second, unused port stays out.
pub fn nccl_hca_list(selected: &[&Port]) -> String {
    let mut items: Vec<String> = Vec::new();
    for p in selected {
        let item = if p.ports_on_device > 1 {
            p.ucx_name()
        } else {
            p.device.clone()
        };
        if !items.contains(&item) {
            items.push(item);
        }
    }
    format!("={}", items.join(","))
}

/// `UCX_NET_DEVICES`: always `device:port`.
pub fn ucx_net_devices(selected: &[&Port]) -> String {
    let mut items: Vec<String> = Vec::new();
    for p in selected {
        let item = p.ucx_name();
        if !items.contains(&item) {
            items.push(item);
        }
    }
    items.join(",")
}

/// The interface NCCL's bootstrap should use on an InfiniBand node: the first IPoIB
/// interface of a selected port that is up (and, on the live machine, has an address). The
/// result is an exact match (`=ib0`) for the same reason as [`nccl_hca_list`]: `ib1` as a
/// prefix also takes `ib10`. Returns the interfaces passed over, for a warning.
pub fn ipoib_ifname(
    selected: &[&Port],
    ifaces: &[Iface],
    live: bool,
) -> (Option<String>, Vec<String>) {
    let mut skipped = Vec::new();
    for p in selected {
        for n in &p.netdevs {
            let Some(i) = ifaces.iter().find(|i| &i.name == n) else {
                continue;
            };
            if i.up && (!live || !i.addresses.is_empty()) {
                return (Some(format!("={n}")), skipped);
            }
            let why = if i.up { "has no address" } else { "is not up" };
            skipped.push(format!("{n} {why}"));
        }
    }
    (None, skipped)
}

/// The UCX settings for the selected ports and the GPUs present: the devices, the
/// transports the runbooks settle on (`rc,cuda_copy,cuda_ipc`) and, with GPUs, the
/// rendezvous and memory-type settings UCX-Py and UCXX apply themselves, so plain UCX
/// applications (ucx_perftest, cuML comms, MPI) behave the same.
pub fn recommend_ucx(d: &mut Detection, selected: &[&Port], gpus: usize, fabric: &str) {
    if selected.is_empty() {
        return;
    }
    d.recommend(
        "UCX_NET_DEVICES",
        &ucx_net_devices(selected),
        &format!(
            "the {fabric} ports that are ACTIVE and LinkUp; UCX would otherwise also try \
             every other device it finds, down ports included"
        ),
    );
    if gpus == 0 {
        d.recommend(
            "UCX_TLS",
            "rc,sm,self",
            &format!("no GPU: reliable connections over {fabric}, shared memory within the node"),
        );
        return;
    }
    let (tls, why) = if gpus > 1 {
        (
            "rc,cuda_copy,cuda_ipc",
            "cuda_ipc moves GPU buffers between GPUs of this node over NVLink/PCIe",
        )
    } else {
        ("rc,cuda_copy", "one GPU, so no cuda_ipc")
    };
    d.recommend(
        "UCX_TLS",
        tls,
        &format!(
            "{fabric} reliable connections plus CUDA memory transports, as the UCX/Dask \
             runbooks set them; {why}; add gdr_copy when the gdrdrv module is loaded"
        ),
    );
    d.recommend(
        "UCX_MEMTYPE_CACHE",
        "n",
        "the memory-type cache misclassifies CUDA buffers allocated after UCX starts (RMM \
         pools, cudaMallocAsync); UCX-Py and UCXX turn it off for the same reason",
    );
    d.recommend(
        "UCX_RNDV_SCHEME",
        "get_zcopy",
        "zero-copy RDMA reads for large GPU messages, the rendezvous scheme UCX-Py applies",
    );
    d.recommend(
        "UCX_RNDV_THRESH",
        "8192",
        "switch to rendezvous (zero-copy) from 8 KiB, as UCX-Py does; the default keeps \
         eager copies through host memory for larger GPU messages",
    );
}

/// GPUs on the node.
pub fn gpu_count(facts: &Facts) -> usize {
    facts.entries("/gpus").len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn port(device: &str, port: u64, count: usize, state: &str, phys: &str) -> Port {
        Port {
            device: device.into(),
            port,
            link_layer: LinkLayer::InfiniBand,
            state: state.into(),
            phys_state: Some(phys.into()),
            netdevs: vec![],
            gids: vec![],
            ports_on_device: count,
        }
    }

    #[test]
    fn exact_names_and_ports_where_a_device_has_several() {
        let a = port("mlx5_1", 1, 1, "ACTIVE", "5: LinkUp");
        let b = port("mlx5_10", 1, 2, "ACTIVE", "5: LinkUp");
        let c = port("mlx5_10", 2, 2, "ACTIVE", "5: LinkUp");
        assert_eq!(nccl_hca_list(&[&a, &b, &c]), "=mlx5_1,mlx5_10:1,mlx5_10:2");
        assert_eq!(ucx_net_devices(&[&a, &b]), "mlx5_1:1,mlx5_10:1");
    }

    #[test]
    fn only_active_and_linkup_ports_are_usable() {
        assert!(port("m", 1, 1, "ACTIVE", "5: LinkUp").is_usable());
        assert!(!port("m", 1, 1, "DOWN", "3: Disabled").is_usable());
        assert!(!port("m", 1, 1, "INIT", "5: LinkUp").is_usable());
        let flapping = port("m", 1, 1, "ACTIVE", "4: PortConfigurationTraining");
        assert!(!flapping.is_usable());
        let w = flapping.dropped_warning();
        assert!(
            w.contains("ACTIVE") && w.contains("PortConfigurationTraining"),
            "{w}"
        );
    }

    #[test]
    fn ipv4_mapped_gids_decode() {
        assert_eq!(
            ipv4_of("0000:0000:0000:0000:0000:ffff:ac12:030e").as_deref(),
            Some("172.18.3.14")
        );
        assert_eq!(ipv4_of("fe80:0000:0000:0000:bace:f6ff:fef1:2a3c"), None);
    }

    #[test]
    fn a_vf_enslaved_to_a_synthetic_nic_is_not_a_bond_member() {
        let facts = Facts::parse(
            &json!({"rdma": {"devices": [
                {"name": "rdmaP1", "netdevs": ["enP1"], "ports": [{"port": 1, "state": "ACTIVE", "link_layer": "Ethernet"}]},
                {"name": "mlx5_bond_0", "netdevs": ["bond0", "ens1f0"], "ports": [{"port": 1, "state": "ACTIVE", "link_layer": "Ethernet"}]}]},
              "network": {"interfaces": [
                {"name": "enP1", "master": "eth0", "slaves": []},
                {"name": "eth0", "master": null, "slaves": []},
                {"name": "ens1f0", "master": "bond0", "slaves": []},
                {"name": "bond0", "master": null, "slaves": ["ens1f0", "ens1f1"]}]}})
            .to_string(),
        )
        .unwrap();
        let ports = ports(&facts);
        let (ifaces, live) = interfaces(&facts);
        assert!(!live);
        assert!(is_transparent_vf(&ports[0], &ifaces));
        assert!(!is_transparent_vf(&ports[1], &ifaces));
    }
}
