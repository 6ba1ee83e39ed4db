//! Named checks of a node's conditions ([`crate::conditions`]): the one home of the rules
//! that say whether a PCIe link, a power cap, ECC, an IB port, a bond or an NCCL config
//! file is what it should be, and what to do when it is not.
//!
//! Pure functions: the server evaluates them when a node's health or detail is read, with
//! the previous facts of the node (for counter deltas and Xid events since the last
//! report) and the facts of the other nodes of its site (for IPoIB subnets). Every check
//! has a stable `name` that scripts match on; a warn or fail becomes a verdict reason
//! whose `code` is that name (see docs/health.md).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::conditions::ConditionFacts;
use crate::facts::NodeFacts;
use crate::health::{Reason, Severity, Verdict};

mod gpu;

/// One named check of one subject (a GPU, a port, a bond, a file), or of the whole node
/// when `subject` is `None`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodeCheck {
    /// Stable: `gpu-pcie-link`, `gpu-power-cap`, `gpu-throttle`, `gpu-persistence`,
    /// `gpu-ecc`, `gpu-processes`, `gpu-xid`, `ib-port-errors`, `ib-phys-state`,
    /// `port-mtu`, `bond-members`, `ipoib-subnet`, `nccl-conf`, `rdma-core`.
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// `pass`, `warn`, `fail`, or `unknown` when the node did not report what is needed.
    pub state: Verdict,
    /// What was seen and, when it is not `pass`, what to do.
    pub reason: String,
}

/// The basis of the verdict reasons these checks give.
pub const BASIS: &str = "node-check";

impl NodeCheck {
    fn new(name: &str, subject: Option<String>, state: Verdict, reason: String) -> Self {
        NodeCheck {
            name: name.into(),
            subject,
            state,
            reason,
        }
    }

    /// The verdict reason of a warn or fail; `None` for pass and unknown.
    pub fn to_reason(&self) -> Option<Reason> {
        let severity = match self.state {
            Verdict::Warn => Severity::Warn,
            Verdict::Fail => Severity::Fail,
            Verdict::Pass | Verdict::Unknown => return None,
        };
        let message = match &self.subject {
            Some(s) => format!("{s}: {}", self.reason),
            None => self.reason.clone(),
        };
        Some(Reason {
            severity,
            message,
            metric: None,
            observed: None,
            expected: None,
            basis: BASIS.into(),
            code: Some(self.name.clone()),
            evidence: None,
        })
    }
}

/// Every check of one node. `previous` is the node's facts of the report before these
/// (from the facts history), for counter deltas and Xid events since that report.
pub fn evaluate(facts: &NodeFacts, previous: Option<&NodeFacts>) -> Vec<NodeCheck> {
    let mut out = Vec::new();
    let empty = ConditionFacts::default();
    let cond = facts.conditions.as_ref().unwrap_or(&empty);
    let prev = previous.and_then(|p| p.conditions.as_ref());
    if !facts.gpus.is_empty() {
        gpu::gpu_checks(cond, &mut out);
        gpu::xid_check(facts, cond, prev, &mut out);
    }
    ib_counter_check(cond, prev, &mut out);
    phys_state_check(facts, &mut out);
    mtu_check(facts, &mut out);
    bond_check(cond, &mut out);
    nccl_conf_check(cond, &mut out);
    rdma_core_check(facts, cond, &mut out);
    out
}

fn ib_counter_check(
    cond: &ConditionFacts,
    prev: Option<&ConditionFacts>,
    out: &mut Vec<NodeCheck>,
) {
    for c in &cond.ib_counters {
        let before = prev.and_then(|p| {
            p.ib_counters
                .iter()
                .find(|b| b.device == c.device && b.port == c.port)
        });
        let mut grew = Vec::new();
        for (i, (name, now)) in c.values().into_iter().enumerate() {
            let Some(now) = now else { continue };
            let delta = match before.and_then(|b| b.values()[i].1) {
                // A counter below its last value was cleared (or the node rebooted).
                Some(then) if now >= then => now - then,
                _ => now,
            };
            if delta > 0 {
                grew.push(format!("{name} +{delta}"));
            }
        }
        let window = if before.is_some() {
            "since the last report"
        } else {
            "since the counters were last cleared (no earlier report to compare with)"
        };
        let (state, reason) = if grew.is_empty() {
            (Verdict::Pass, format!("no port errors {window}"))
        } else {
            (
                Verdict::Warn,
                format!(
                    "{} {window}: a marginal cable, transceiver or port; reseat or replace the cable and check the switch side (`ibdiagnet`, `perfquery -x`)",
                    grew.join(", ")
                ),
            )
        };
        out.push(NodeCheck::new(
            "ib-port-errors",
            Some(format!("{}:{}", c.device, c.port)),
            state,
            reason,
        ));
    }
}

fn phys_state_check(facts: &NodeFacts, out: &mut Vec<NodeCheck>) {
    for d in &facts.rdma.devices {
        for p in &d.ports {
            let Some(phys) = &p.phys_state else { continue };
            let (state, reason) = if phys.contains("LinkUp") {
                (Verdict::Pass, format!("physical state {phys}"))
            } else {
                let what = if phys.contains("Polling") {
                    "no link partner: the cable is unplugged or bad, or the switch port is down; check both ends"
                } else if phys.contains("Disabled") {
                    "the port is disabled: fine if intended (no recommendation uses it); else enable it on the HCA or switch"
                } else {
                    "the link is not up; check the cable, the switch port and the subnet manager"
                };
                (
                    Verdict::Warn,
                    format!("physical state {phys}, not LinkUp: {what}"),
                )
            };
            out.push(NodeCheck::new(
                "ib-phys-state",
                Some(format!("{}:{}", d.name, p.port)),
                state,
                reason,
            ));
        }
    }
}

/// Ports of one link layer should share an MTU: NCCL and UCX use the smallest along a path,
/// and IPoIB datagram (2044) against connected (65520) mode on one node is a half-applied
/// change.
fn mtu_check(facts: &NodeFacts, out: &mut Vec<NodeCheck>) {
    // link layer -> (port or netdev label, mtu)
    let mut netdev: BTreeMap<String, Vec<(String, u32)>> = BTreeMap::new();
    let mut active: BTreeMap<String, Vec<(String, u32)>> = BTreeMap::new();
    for d in &facts.rdma.devices {
        for p in d.ports.iter().filter(|p| p.state == "ACTIVE") {
            let layer = p.link_layer.clone().unwrap_or_else(|| "unknown".into());
            if let Some(m) = p.active_mtu {
                active
                    .entry(layer.clone())
                    .or_default()
                    .push((format!("{}:{}", d.name, p.port), m));
            }
            for n in &d.netdevs {
                let mtu = facts
                    .network
                    .interfaces
                    .iter()
                    .find(|i| &i.name == n)
                    .and_then(|i| i.mtu);
                if let Some(m) = mtu {
                    netdev
                        .entry(layer.clone())
                        .or_default()
                        .push((format!("{} ({})", n, d.name), m));
                }
            }
        }
    }
    for (what, map) in [("netdev MTU", netdev), ("active IB MTU", active)] {
        for (layer, mut ports) in map {
            ports.sort();
            ports.dedup();
            let distinct: BTreeSet<u32> = ports.iter().map(|p| p.1).collect();
            let listed: Vec<String> = ports.iter().map(|(l, m)| format!("{l} {m}")).collect();
            let (state, reason) = if distinct.len() > 1 {
                (
                    Verdict::Warn,
                    format!(
                        "{what} differs across the {layer} ports: {}; set one MTU on every port of the fabric (IPoIB: the same datagram/connected mode; RoCE: the same jumbo MTU as the switches)",
                        listed.join(", ")
                    ),
                )
            } else {
                (
                    Verdict::Pass,
                    format!("{what} of the {layer} ports: {}", listed.join(", ")),
                )
            };
            out.push(NodeCheck::new("port-mtu", Some(layer), state, reason));
        }
    }
}

fn bond_check(cond: &ConditionFacts, out: &mut Vec<NodeCheck>) {
    for b in &cond.bonds {
        let down: Vec<&str> = b
            .members
            .iter()
            .filter(|m| m.mii_status.as_deref().is_some_and(|s| s != "up"))
            .map(|m| m.name.as_str())
            .collect();
        let unread = b.members.iter().filter(|m| m.mii_status.is_none()).count();
        let (state, reason) = if b.members.is_empty() {
            (Verdict::Warn, "the bond has no members".to_string())
        } else if down.is_empty() && unread > 0 {
            (
                Verdict::Unknown,
                format!("{unread} member(s) without a readable bonding_slave/mii_status"),
            )
        } else if down.len() == b.members.len() {
            (
                Verdict::Fail,
                format!(
                    "every member is down ({}): the bond carries nothing; check the cables and switch ports",
                    down.join(", ")
                ),
            )
        } else if !down.is_empty() {
            (
                Verdict::Warn,
                format!(
                    "member(s) {} down of {}: the bond runs on part of its bandwidth with no redundancy; check the cable and switch port (`/proc/net/bonding/{}`)",
                    down.join(", "),
                    b.members.len(),
                    b.name
                ),
            )
        } else {
            let names: Vec<&str> = b.members.iter().map(|m| m.name.as_str()).collect();
            (
                Verdict::Pass,
                format!("all members up: {}", names.join(", ")),
            )
        };
        out.push(NodeCheck::new(
            "bond-members",
            Some(b.name.clone()),
            state,
            reason,
        ));
    }
}

fn nccl_conf_check(cond: &ConditionFacts, out: &mut Vec<NodeCheck>) {
    for f in &cond.nccl_conf {
        let (state, reason) = if f.variables.is_empty() {
            (Verdict::Pass, "present but sets nothing".to_string())
        } else {
            let set: Vec<String> = f
                .variables
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            (
                Verdict::Warn,
                format!(
                    "NCCL applies {} to every job that does not set them itself, and neither `heddle env` nor the job's environment shows it; move these into a tuning profile and remove the file, or keep it and know that it wins over recommendations the job does not export",
                    set.join(" ")
                ),
            )
        };
        out.push(NodeCheck::new(
            "nccl-conf",
            Some(f.path.clone()),
            state,
            reason,
        ));
    }
}

/// rdma-core releases that distributions ship beside these kernels: user space older than
/// the kernel's own pairing may not know the kernel's device ABI (`libmlx5: couldn't
/// load driver`, missing RoCE v2 GIDs).
const KERNEL_RDMA_CORE: [((u32, u32), u32); 5] = [
    ((4, 15), 17), // Ubuntu 18.04
    ((5, 4), 28),  // Ubuntu 20.04
    ((5, 15), 39), // Ubuntu 22.04
    ((6, 1), 44),  // Debian 12
    ((6, 8), 50),  // Ubuntu 24.04
];

fn leading_number(s: &str) -> Option<u32> {
    let digits: String = s.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// The rdma-core release an MLNX_OFED / DOCA-OFED version ships: `5.8-1.0.1` → 58,
/// `23.10-1.1.9` → 2310 (its packages are `58mlnx43`, `2310mlnx47`).
fn ofed_rdma_core(version: &str) -> Option<u32> {
    let v = version
        .trim()
        .trim_start_matches("MLNX_OFED_LINUX-")
        .trim_start_matches("OFED-internal-");
    let (release, _) = v.split_once('-')?;
    let (major, minor) = release.split_once('.')?;
    let (major, minor): (u32, u32) = (major.parse().ok()?, minor.parse().ok()?);
    Some(if major < 10 {
        major * 10 + minor
    } else {
        major * 100 + minor
    })
}

fn rdma_core_check(facts: &NodeFacts, cond: &ConditionFacts, out: &mut Vec<NodeCheck>) {
    if facts.host.container.runtime.is_none() || facts.rdma.devices.is_empty() {
        return;
    }
    let Some(mine) = cond
        .rdma_core_installed
        .clone()
        .or_else(|| facts.software.rdma_core.clone())
    else {
        out.push(NodeCheck::new(
            "rdma-core",
            None,
            Verdict::Unknown,
            "the container's rdma-core release is not known (no libibverbs.so.1.* found)".into(),
        ));
        return;
    };
    let Some(my_release) = leading_number(&mine) else {
        return;
    };
    let mlnx = mine.contains("mlnx");
    // MLNX_OFED's version: `ofed_info -s`, else mlx5_core's module version when it has
    // OFED's three parts (the in-box module says `5.0-0` whatever the kernel).
    let ofed = facts.software.ofed.clone().or_else(|| {
        facts
            .software
            .mlx5_core
            .clone()
            .filter(|v| v.split_once('-').is_some_and(|(_, b)| b.contains('.')))
    });
    let kernel = facts.host.kernel.as_deref().and_then(|k| {
        let mut it = k.split(['.', '-']);
        Some((
            it.next()?.parse::<u32>().ok()?,
            it.next()?.parse::<u32>().ok()?,
        ))
    });
    let (needed, host) = match (&ofed, mlnx) {
        (Some(o), true) => match ofed_rdma_core(o) {
            Some(n) => (n, format!("the host's MLNX_OFED {o}")),
            None => return,
        },
        _ => {
            let Some(k) = kernel else { return };
            let Some(&(_, n)) = KERNEL_RDMA_CORE.iter().rev().find(|(kv, _)| *kv <= k) else {
                return;
            };
            let kname = facts.host.kernel.clone().unwrap_or_default();
            match &ofed {
                Some(o) => (
                    n,
                    format!(
                        "the host's kernel {kname} with MLNX_OFED {o} (whose own user space the image lacks)"
                    ),
                ),
                None => (
                    n,
                    format!("the host's kernel {kname} (distributions pair it with rdma-core {n})"),
                ),
            }
        }
    };
    let (state, reason) = if my_release < needed {
        (
            Verdict::Warn,
            format!(
                "the container's rdma-core {mine} is older than {host}: verbs may fail to open the HCA or miss RoCE v2 GIDs; rebuild the image with rdma-core {needed} or newer, or mount the host's libibverbs and provider libraries"
            ),
        )
    } else {
        (
            Verdict::Pass,
            format!("the container's rdma-core {mine} is not older than {host}"),
        )
    };
    out.push(NodeCheck::new("rdma-core", None, state, reason));
}

/// IPoIB subnets across the nodes of one site: each IPoIB interface name (`ib0`) should
/// sit in the same IPv4 subnet on every node, or NCCL's bootstrap over it
/// (`NCCL_SOCKET_IFNAME=ib0`) and IPoIB traffic cannot reach the odd ones out. Returns the
/// check of node `me` (a hostname in `site`), or `None` when it has no IPoIB address.
pub fn ipoib_subnets(me: &str, site: &[(String, &NodeFacts)]) -> Vec<NodeCheck> {
    // interface -> subnet -> hostnames
    let mut seen: BTreeMap<String, BTreeMap<String, BTreeSet<&str>>> = BTreeMap::new();
    for (host, f) in site {
        for i in f
            .network
            .interfaces
            .iter()
            .filter(|i| i.kind == "infiniband")
        {
            for a in &i.addresses {
                if let Some(net) = ipv4_subnet(a) {
                    seen.entry(i.name.clone())
                        .or_default()
                        .entry(net)
                        .or_default()
                        .insert(host.as_str());
                }
            }
        }
    }
    let mut out = Vec::new();
    for (iface, subnets) in seen {
        let Some((mine, _)) = subnets.iter().find(|(_, hosts)| hosts.contains(me)) else {
            continue;
        };
        let total: usize = subnets.values().map(BTreeSet::len).sum();
        let (state, reason) = if subnets.len() == 1 {
            (
                Verdict::Pass,
                format!("{iface} is on {mine} like every node of its site ({total})"),
            )
        } else {
            let (common, hosts) = subnets
                .iter()
                .max_by_key(|(net, h)| (h.len(), std::cmp::Reverse(net.as_str())))
                .expect("not empty");
            let others: Vec<String> = subnets
                .iter()
                .map(|(n, h)| format!("{n}: {}", h.iter().copied().collect::<Vec<_>>().join(", ")))
                .collect();
            if common == mine {
                (
                    Verdict::Warn,
                    format!(
                        "{iface} subnets differ across the site ({}): the nodes outside {mine} cannot reach this one over IPoIB",
                        others.join("; ")
                    ),
                )
            } else {
                (
                    Verdict::Warn,
                    format!(
                        "{iface} is on {mine} but {} of the site's {total} nodes use {common}: fix this node's IPoIB address (or the site assignment), or its NCCL bootstrap over {iface} cannot reach them",
                        hosts.len()
                    ),
                )
            }
        };
        out.push(NodeCheck::new("ipoib-subnet", Some(iface), state, reason));
    }
    out
}

/// `10.0.0.5/24` → `10.0.0.0/24`; `None` for IPv6 or malformed addresses.
fn ipv4_subnet(cidr: &str) -> Option<String> {
    let (addr, len) = cidr.split_once('/')?;
    let addr: std::net::Ipv4Addr = addr.parse().ok()?;
    let len: u32 = len.parse().ok().filter(|l| *l <= 32)?;
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    Some(format!(
        "{}/{len}",
        std::net::Ipv4Addr::from(u32::from(addr) & mask)
    ))
}

#[cfg(test)]
#[path = "node_checks/tests.rs"]
mod tests;
