//! The facts of one node as tables: host, GPUs, HCAs with their ports and GIDs, NICs,
//! software, and whatever the agent could not read.

use heddle_types::facts::{NodeFacts, RdmaDevice};
use leptos::prelude::*;

use crate::ui::{port_badge, when};

fn or_dash(v: &Option<String>) -> String {
    v.clone().unwrap_or_else(|| "—".into())
}

fn gib(bytes: Option<u64>) -> String {
    bytes
        .map(|b| format!("{:.0} GiB", b as f64 / (1u64 << 30) as f64))
        .unwrap_or_else(|| "—".into())
}

#[component]
pub fn FactsView(facts: NodeFacts) -> impl IntoView {
    let h = &facts.host;
    let host_line = format!(
        "{} · kernel {} · {} {} · collected {}{}",
        h.os.pretty_name
            .clone()
            .unwrap_or_else(|| "unknown OS".into()),
        or_dash(&h.kernel),
        or_dash(&h.dmi.sys_vendor),
        or_dash(&h.dmi.product_name),
        when(Some(facts.collected_at)),
        h.container
            .runtime
            .as_ref()
            .map(|r| format!(" · in {r}"))
            .unwrap_or_default(),
    );
    let cpu_line = format!(
        "{} · {} CPUs online · NUMA nodes: {}",
        or_dash(&facts.cpu.model),
        facts
            .cpu
            .online_count
            .map(|c| c.to_string())
            .unwrap_or_else(|| "?".into()),
        facts
            .cpu
            .numa_nodes
            .iter()
            .map(|n| format!("{} ({})", n.id, n.cpulist))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let gpus = facts
        .gpus
        .iter()
        .map(|g| {
            view! { <tr>
                <td>{format!("GPU{}", g.index)}</td><td>{or_dash(&g.name)}</td><td class="mono">{g.bdf.clone()}</td>
                <td>{gib(g.memory_total_bytes)}</td><td>{g.numa_node.map(|n| n.to_string()).unwrap_or_else(|| "—".into())}</td>
                <td class="mono">{or_dash(&g.cpu_affinity)}</td><td>{g.nvlinks.len()}</td>
            </tr> }
        })
        .collect_view();
    let hcas = facts.rdma.devices.iter().map(hca_rows).collect_view();
    let nics = facts
        .network
        .interfaces
        .iter()
        .filter(|i| i.kind != "loopback")
        .map(|i| {
            view! { <tr>
                <td class="mono">{i.name.clone()}</td><td>{i.kind.clone()}</td><td>{or_dash(&i.operstate)}</td>
                <td>{i.speed_mbps.map(|s| format!("{} Gb/s", s / 1000)).unwrap_or_else(|| "—".into())}</td>
                <td>{i.mtu.map(|m| m.to_string()).unwrap_or_default()}</td>
                <td class="mono">{or_dash(&i.pci_bdf)}</td>
                <td class="mono">{i.master.clone().or_else(|| (!i.slaves.is_empty()).then(|| i.slaves.join(" "))).unwrap_or_default()}</td>
                <td class="mono">{i.addresses.join(" ")}</td>
            </tr> }
        })
        .collect_view();
    let s = &facts.software;
    let software = format!(
        "driver {} · CUDA {} · NCCL {} · UCX {} · OFED {}",
        or_dash(&s.nvidia_driver),
        or_dash(&s.cuda_driver),
        or_dash(&s.nccl),
        or_dash(&s.ucx),
        or_dash(&s.ofed)
    );
    let probes = format!(
        "NVML: {} · RDMA: {} · verbs: {}",
        facts.nvml.message, facts.rdma.sysfs.message, facts.rdma.verbs.message
    );
    let errors = facts
        .errors
        .iter()
        .map(|e| view! { <li><code>{e.field.clone()}</code>": "{e.message.clone()}</li> })
        .collect_view();
    let has_errors = !facts.errors.is_empty();
    let no_gpus = facts.gpus.is_empty();
    let no_hcas = facts.rdma.devices.is_empty();
    view! {
        <div class="facts">
            <p>{host_line}</p>
            <p>{cpu_line}</p>
            <p class="muted">{software}</p>
            <p class="muted">{probes}</p>
            <h3>"GPUs"</h3>
            {if no_gpus { view! { <p class="empty">"No NVIDIA GPUs."</p> }.into_any() } else { view! {
                <table class="grid" id="gpus"><thead><tr><th>"GPU"</th><th>"Model"</th><th>"PCI"</th><th>"Memory"</th>
                    <th>"NUMA"</th><th>"CPU affinity"</th><th>"NVLinks"</th></tr></thead><tbody>{gpus}</tbody></table>
            }.into_any() }}
            <h3>"HCAs, ports and GIDs"</h3>
            {if no_hcas { view! { <p class="empty">"No RDMA devices."</p> }.into_any() } else { view! {
                <table class="grid" id="hcas"><thead><tr><th>"HCA"</th><th>"Port"</th><th>"State"</th><th>"Rate"</th>
                    <th>"Link layer"</th><th>"MTU"</th><th>"GIDs (index: type, netdev, IPv4)"</th></tr></thead><tbody>{hcas}</tbody></table>
            }.into_any() }}
            <h3>"Network interfaces"</h3>
            <table class="grid" id="nics"><thead><tr><th>"Name"</th><th>"Kind"</th><th>"State"</th><th>"Speed"</th><th>"MTU"</th>
                <th>"PCI"</th><th>"Bond"</th><th>"Addresses"</th></tr></thead><tbody>{nics}</tbody></table>
            <Show when=move || has_errors>
                <h3>"Could not read"</h3>
            </Show>
            <ul class="fact-errors">{errors}</ul>
        </div>
    }
}

fn hca_rows(d: &RdmaDevice) -> impl IntoView + use<> {
    let head = format!(
        "{}{}{}",
        d.name,
        d.pci_bdf
            .as_ref()
            .map(|b| format!(" · {b}"))
            .unwrap_or_default(),
        if d.netdevs.is_empty() {
            String::new()
        } else {
            format!(" · {}", d.netdevs.join(" "))
        }
    );
    if d.ports.is_empty() {
        return view! { <tr><td class="mono">{head}</td><td colspan="6" class="muted">"no ports"</td></tr> }.into_any();
    }
    d.ports
        .iter()
        .map(|p| {
            let gids = p
                .gids
                .iter()
                .map(|g| {
                    let detail = [g.gid_type.clone(), g.ndev.clone(), g.ipv4.clone()].into_iter().flatten().collect::<Vec<_>>().join(", ");
                    view! { <div class="gid" title=g.gid.clone()>{format!("{}: {detail}", g.index)}</div> }
                })
                .collect_view();
            view! { <tr>
                <td class="mono">{head.clone()}</td><td>{p.port}</td><td>{port_badge(&p.state)}</td><td>{or_dash(&p.rate)}</td>
                <td>{or_dash(&p.link_layer)}</td><td>{p.active_mtu.map(|m| m.to_string()).unwrap_or_else(|| "—".into())}</td>
                <td class="mono small">{gids}</td>
            </tr> }
        })
        .collect_view()
        .into_any()
}
