//! Host identity: hostname, kernel, os-release, DMI, container and launcher context.
//!
//! On the live machine the environment comes from the agent's own process. For any other
//! root it comes only from `<root>/proc/self/environ` if the tree provides one (NUL- or
//! newline-separated `KEY=value`), so a fixture never picks up the test runner's
//! variables.

use std::collections::BTreeMap;

use heddle_types::facts::{ContainerContext, CpuFacts, Dmi, HostFacts, NumaNode, OsRelease};

use super::sysfs::{Root, cpulist_count};

/// Exact variable names kept in `launcher_env`.
const ENV_EXACT: &[&str] = &[
    "KUBERNETES_SERVICE_HOST",
    "KUBERNETES_SERVICE_PORT",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "JOB_UUID",
    "POD_NAME",
    "POD_NAMESPACE",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
];
/// Prefixes kept in `launcher_env`: NCCL/UCX tuning and RunAI job identity.
const ENV_PREFIXES: &[&str] = &["NCCL_", "UCX_", "RUNAI_", "TORCHELASTIC_"];
/// Never report a variable whose name contains one of these, whatever its prefix.
const ENV_SECRET_MARKERS: &[&str] = &["TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "CREDENTIAL"];

pub fn keep_env(name: &str) -> bool {
    if ENV_SECRET_MARKERS
        .iter()
        .any(|m| name.to_ascii_uppercase().contains(m))
    {
        return false;
    }
    ENV_EXACT.contains(&name) || ENV_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// The environment to inspect: the process's own on the live machine, the tree's
/// `proc/self/environ` otherwise.
pub fn environment(root: &mut Root) -> BTreeMap<String, String> {
    if root.is_live() {
        return std::env::vars().collect();
    }
    let Some(text) = root.opt("proc/self/environ", "/host/container/launcher_env") else {
        return BTreeMap::new();
    };
    text.split(['\0', '\n'])
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, _)| !k.is_empty())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub fn collect(root: &mut Root, env: &BTreeMap<String, String>) -> HostFacts {
    HostFacts {
        hostname: hostname(root),
        kernel: root.opt("proc/sys/kernel/osrelease", "/host/kernel"),
        os: os_release(root),
        dmi: Dmi {
            sys_vendor: root.opt("sys/class/dmi/id/sys_vendor", "/host/dmi/sys_vendor"),
            product_name: root.opt("sys/class/dmi/id/product_name", "/host/dmi/product_name"),
            chassis_asset_tag: root.opt(
                "sys/class/dmi/id/chassis_asset_tag",
                "/host/dmi/chassis_asset_tag",
            ),
        },
        container: container(root, env),
        azure_enable_rdma: root
            .opt("etc/waagent.conf", "/host/azure_enable_rdma")
            .and_then(|t| waagent_enable_rdma(&t)),
    }
}

fn hostname(root: &mut Root) -> String {
    if root.is_live() {
        match nix::unistd::gethostname() {
            Ok(h) => return h.to_string_lossy().into_owned(),
            Err(e) => root.error("/host/hostname", format!("gethostname failed: {e}")),
        }
    }
    match root.read("etc/hostname") {
        Ok(h) => {
            let h = h
                .lines()
                .map(str::trim)
                .find(|l| !l.is_empty() && !l.starts_with('#'))
                .unwrap_or("");
            if h.is_empty() {
                root.error("/host/hostname", "etc/hostname is empty");
            }
            h.to_string()
        }
        Err(e) => {
            root.error("/host/hostname", e.to_string());
            String::new()
        }
    }
}

fn os_release(root: &mut Root) -> OsRelease {
    let text = root
        .opt("etc/os-release", "/host/os")
        .or_else(|| root.opt("usr/lib/os-release", "/host/os"));
    let mut os = OsRelease::default();
    for line in text.as_deref().unwrap_or("").lines() {
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        let v = v.trim().trim_matches('"').trim_matches('\'').to_string();
        match k.trim() {
            "ID" => os.id = Some(v),
            "VERSION_ID" => os.version_id = Some(v),
            "PRETTY_NAME" => os.pretty_name = Some(v),
            _ => {}
        }
    }
    os
}

/// `OS.EnableRDMA=y` enables the Azure RDMA/IPoIB setup; a commented line does not count.
pub fn waagent_enable_rdma(conf: &str) -> Option<bool> {
    conf.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .find(|(k, _)| k.trim() == "OS.EnableRDMA")
        .map(|(_, v)| {
            matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "y" | "yes" | "true" | "1"
            )
        })
}

fn container(root: &mut Root, env: &BTreeMap<String, String>) -> ContainerContext {
    let kubernetes = env.contains_key("KUBERNETES_SERVICE_HOST")
        || root.exists("var/run/secrets/kubernetes.io/serviceaccount");
    let runtime = if kubernetes {
        Some("kubernetes".to_string())
    } else if root.exists(".dockerenv") {
        Some("docker".to_string())
    } else if root.exists("run/.containerenv") {
        Some("podman".to_string())
    } else {
        env.get("container").cloned()
    };
    let launcher_env = env
        .iter()
        .filter(|(k, _)| keep_env(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    ContainerContext {
        runtime,
        kubernetes,
        launcher_env,
    }
}

pub fn cpu(root: &mut Root) -> CpuFacts {
    let model = root.opt("proc/cpuinfo", "/cpu/model").and_then(|t| {
        t.lines().find_map(|l| {
            l.split_once(':')
                .filter(|(k, _)| k.trim() == "model name")
                .map(|(_, v)| v.trim().to_string())
        })
    });
    let online = root.opt("sys/devices/system/cpu/online", "/cpu/online");
    let online_count = match &online {
        Some(list) => match cpulist_count(list) {
            Some(n) => Some(n),
            None => {
                root.error("/cpu/online", format!("not a CPU list: {list:?}"));
                None
            }
        },
        None => None,
    };
    let mut numa_nodes = Vec::new();
    for name in root.list_or_record("sys/devices/system/node", "/cpu/numa_nodes") {
        let Some(id) = name
            .strip_prefix("node")
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let field = format!("/cpu/numa_nodes/{id}/cpulist");
        let Some(cpulist) = root.opt(&format!("sys/devices/system/node/{name}/cpulist"), &field)
        else {
            continue;
        };
        match cpulist_count(&cpulist) {
            Some(cpu_count) => numa_nodes.push(NumaNode {
                id,
                cpulist,
                cpu_count,
            }),
            None => root.error(&field, format!("not a CPU list: {cpulist:?}")),
        }
    }
    numa_nodes.sort_by_key(|n| n.id);
    CpuFacts {
        model,
        online,
        online_count,
        numa_nodes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waagent_needs_an_uncommented_yes() {
        assert_eq!(waagent_enable_rdma("# OS.EnableRDMA=y\n"), None);
        assert_eq!(waagent_enable_rdma("OS.EnableRDMA=y\n"), Some(true));
        assert_eq!(waagent_enable_rdma("OS.EnableRDMA=n\n"), Some(false));
    }

    #[test]
    fn secrets_never_pass_the_env_filter() {
        assert!(keep_env("NCCL_IB_HCA"));
        assert!(keep_env("MASTER_ADDR"));
        assert!(!keep_env("RUNAI_API_TOKEN"));
        assert!(!keep_env("HOME"));
        assert!(!keep_env("UCX_SECRET_KEY"));
    }
}
