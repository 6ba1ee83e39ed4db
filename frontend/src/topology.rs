//! The topology heatmap: the `nvidia-smi topo -m` matrix from the node facts, coloured by
//! link class so the fast paths (NVLink, a shared PCIe switch) stand out from the slow ones
//! (across the CPU interconnect), with each GPU's CPU and NUMA affinity on the right.

use heddle_types::facts::Topology;
use leptos::prelude::*;

/// CSS class of a cell; ordered from the fastest path to the slowest.
pub fn link_class(label: &str) -> &'static str {
    match label {
        "X" => "t-self",
        l if l.starts_with("NV") => match l[2..].parse::<u32>().unwrap_or(1) {
            0..=1 => "t-nv1",
            2..=4 => "t-nv2",
            _ => "t-nv3",
        },
        "PIX" => "t-pix",
        "PXB" => "t-pxb",
        "PHB" => "t-phb",
        "NODE" => "t-node",
        "SYS" => "t-sys",
        _ => "t-unknown",
    }
}

const LEGEND: [(&str, &str, &str); 8] = [
    ("X", "t-self", "itself"),
    ("NV#", "t-nv2", "NVLink, # links"),
    ("PIX", "t-pix", "one PCIe switch"),
    ("PXB", "t-pxb", "several PCIe switches"),
    ("PHB", "t-phb", "through a PCIe host bridge"),
    ("NODE", "t-node", "between host bridges of one NUMA node"),
    ("SYS", "t-sys", "across the CPU interconnect (QPI/UPI/xGMI)"),
    ("?", "t-unknown", "unknown"),
];

#[component]
pub fn Heatmap(topology: Topology) -> impl IntoView {
    if topology.devices.is_empty() {
        return view! { <p class="empty">"The facts have no topology matrix (no GPUs or RDMA devices were found)."</p> }.into_any();
    }
    let affinity = |dev: &str| topology.gpu_affinity.iter().find(|a| a.gpu == dev).cloned();
    let header = topology
        .devices
        .iter()
        .map(|d| view! { <th class="mono">{d.clone()}</th> })
        .collect_view();
    let rows = topology
        .devices
        .iter()
        .enumerate()
        .map(|(i, dev)| {
            let cells = topology
                .devices
                .iter()
                .enumerate()
                .map(|(j, other)| {
                    let label = topology.matrix.get(i).and_then(|r| r.get(j)).cloned().unwrap_or_else(|| "?".into());
                    let title = format!("{dev} ↔ {other}: {label}");
                    let class = format!("cell {}", link_class(&label));
                    view! { <td class=class title=title>{label}</td> }
                })
                .collect_view();
            let aff = affinity(dev);
            let cpu = aff.as_ref().and_then(|a| a.cpu_affinity.clone()).unwrap_or_else(|| "—".into());
            let numa = aff.and_then(|a| a.numa_node).map(|n| n.to_string()).unwrap_or_else(|| "—".into());
            view! { <tr><th class="mono">{dev.clone()}</th>{cells}<td class="mono">{cpu}</td><td class="mono">{numa}</td></tr> }
        })
        .collect_view();
    let legend = LEGEND
        .iter()
        .map(|(l, c, what)| view! { <span class="legend-item"><span class=format!("swatch {c}")>{*l}</span>{format!(" {what}")}</span> })
        .collect_view();
    view! {
        <div class="heatmap-wrap">
            <table class="heatmap" id="topology">
                <thead><tr><th></th>{header}<th>"CPU affinity"</th><th>"NUMA"</th></tr></thead>
                <tbody>{rows}</tbody>
            </table>
            <p class="legend">{legend}</p>
            <p class="muted">{format!("GPU↔GPU links: {}", topology.nvlink_source)}</p>
        </div>
    }
    .into_any()
}
