//! Network interfaces from `/sys/class/net`, plus IP addresses on the live machine.
//!
//! IP addresses are not in sysfs, so they come from `getifaddrs(3)` and only when the
//! root is `/`; a fixture's interfaces have none.

use std::collections::BTreeMap;

use heddle_types::facts::{NetInterface, NetworkFacts};

use super::sysfs::{Root, natural_cmp};

const CLASS: &str = "sys/class/net";

pub fn collect(root: &mut Root) -> NetworkFacts {
    let mut addrs = if root.is_live() {
        live_addresses(root)
    } else {
        BTreeMap::new()
    };
    let mut interfaces = Vec::new();
    for name in root.list_or_record(CLASS, "/network/interfaces") {
        if name == "bonding_masters" {
            continue;
        }
        let dir = format!("{CLASS}/{name}");
        if !root.path(&dir).is_dir() {
            continue;
        }
        let field = format!("/network/interfaces/{name}");
        let if_type = root.opt_parse(
            &format!("{dir}/type"),
            &format!("{field}/if_type"),
            "an ARPHRD number",
            |s| s.parse::<u32>().ok(),
        );
        let resolved = root.resolve(&dir).unwrap_or_default();
        let pci_bdf = root
            .resolve(&format!("{dir}/device"))
            .ok()
            .and_then(|p| super::pci::last_bdf(&p));
        let mut slaves: Vec<String> = root
            .opt(&format!("{dir}/bonding/slaves"), &format!("{field}/slaves"))
            .map(|s| s.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default();
        slaves.sort_by(|a, b| natural_cmp(a, b));
        interfaces.push(NetInterface {
            kind: match if_type {
                Some(1) => "ethernet",
                Some(32) => "infiniband",
                Some(772) => "loopback",
                _ => "other",
            }
            .to_string(),
            if_type,
            mtu: root.opt_parse(
                &format!("{dir}/mtu"),
                &format!("{field}/mtu"),
                "an MTU",
                |s| s.parse::<u32>().ok(),
            ),
            operstate: root.opt(&format!("{dir}/operstate"), &format!("{field}/operstate")),
            address: root.opt(&format!("{dir}/address"), &format!("{field}/address")),
            // EINVAL while the link is down is normal, so a failed read is not an error.
            speed_mbps: root
                .read(&format!("{dir}/speed"))
                .ok()
                .and_then(|s| s.parse::<i64>().ok())
                .and_then(|s| u32::try_from(s).ok()),
            master: root.link_name(&format!("{dir}/master")),
            slaves,
            pci_bdf,
            virtual_device: resolved.contains("/virtual/"),
            addresses: addrs.remove(&name).unwrap_or_default(),
            name,
        });
    }
    NetworkFacts { interfaces }
}

fn live_addresses(root: &mut Root) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let ifaddrs = match nix::ifaddrs::getifaddrs() {
        Ok(i) => i,
        Err(e) => {
            root.error(
                "/network/interfaces/addresses",
                format!("getifaddrs failed: {e}"),
            );
            return out;
        }
    };
    for ifa in ifaddrs {
        let (Some(addr), Some(mask)) = (ifa.address, ifa.netmask) else {
            continue;
        };
        let cidr = if let (Some(a), Some(m)) = (addr.as_sockaddr_in(), mask.as_sockaddr_in()) {
            format!("{}/{}", a.ip(), u32::from(m.ip()).count_ones())
        } else if let (Some(a), Some(m)) = (addr.as_sockaddr_in6(), mask.as_sockaddr_in6()) {
            format!("{}/{}", a.ip(), u128::from(m.ip()).count_ones())
        } else {
            continue;
        };
        out.entry(ifa.interface_name).or_default().push(cidr);
    }
    for v in out.values_mut() {
        v.sort();
        v.dedup();
    }
    out
}
