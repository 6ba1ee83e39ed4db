//! `ibnetdiscover`'s topology file (infiniband-diags): a block per node — `vendid=`,
//! `devid=`, `sysimgguid=`, `switchguid=`/`caguid=`/`rtguid=` lines, then
//! `Switch 24 "S-<guid>"  # "<NodeDescription>" base port 0 lid 6 lmc 0` or
//! `Ca 2 "H-<guid>"  # "<NodeDescription>"`, then one line per cabled port:
//! `[22]  "H-<guid>"[1](<portguid>)  # "<peer description>" lid 4 4xSDR` on a switch,
//! `[1](<portguid>)  "S-<guid>"[6]  # lid 16 lmc 1 "<peer description>" lid 3 4xSDR` on a
//! CA. Each link is printed from both ends; where the two ends disagree, the CA's node
//! gets a note.

use std::collections::{BTreeMap, HashMap};

use super::{MAX_LINE_BYTES, lines, shown};
use crate::fabric::{
    ErrorList, Errors, Fabric, Link, MAX_NICS_PER_NODE, MAX_NODES, MAX_SWITCHES, Nic, Node, Note,
    Switch, Tier, check_name,
};

/// The most ports one IB node may say it has.
const MAX_PORTS: u32 = 1024;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Switch,
    Ca,
    Router,
}

struct Dev {
    kind: Kind,
    guid: String,
    desc: String,
    line: usize,
    ports: Vec<Port>,
}

#[derive(Clone)]
struct Port {
    line: usize,
    port: u32,
    port_guid: Option<String>,
    peer: String,
    peer_port: u32,
    rate: Option<(u32, String, f64)>,
}

pub(super) fn parse(text: &str) -> Result<Fabric, Errors> {
    let mut errors = ErrorList::default();
    let mut devs: Vec<Dev> = Vec::new();
    let mut by_guid: HashMap<String, usize> = HashMap::new();
    for (no, raw) in lines(text)? {
        if raw.len() > MAX_LINE_BYTES {
            errors.push(format!("line {no}: longer than {MAX_LINE_BYTES} bytes"));
            continue;
        }
        let line = raw.trim();
        if line.is_empty()
            || line.starts_with('#')
            || line.starts_with("Chassis")
            || line == "Non-Chassis Nodes"
            || [
                "vendid=",
                "devid=",
                "sysimgguid=",
                "switchguid=",
                "caguid=",
                "rtguid=",
            ]
            .iter()
            .any(|k| line.starts_with(k))
        {
            continue;
        }
        let result = if line.starts_with('[') {
            match devs.last_mut() {
                None => Err("a port line before any Switch or Ca line".to_string()),
                Some(dev) => port_line(no, line, dev.kind).and_then(|p| {
                    if dev.ports.iter().any(|q| q.port == p.port) {
                        Err(format!("port {} of {} is listed twice", p.port, dev.guid))
                    } else if dev.ports.len() as u32 >= MAX_PORTS {
                        Err(format!("more than {MAX_PORTS} ports"))
                    } else {
                        dev.ports.push(p);
                        Ok(())
                    }
                }),
            }
        } else {
            dev_line(no, line).and_then(|d| {
                if devs.len() >= MAX_NODES + MAX_SWITCHES {
                    Err("more nodes and switches than a fabric may hold".into())
                } else if let Some(&i) = by_guid.get(&d.guid) {
                    Err(format!(
                        "{} was listed on line {} already",
                        d.guid, devs[i].line
                    ))
                } else {
                    by_guid.insert(d.guid.clone(), devs.len());
                    devs.push(d);
                    Ok(())
                }
            })
        };
        if let Err(e) = result {
            errors.push(format!("line {no}: {e}: {}", shown(line)));
        }
    }
    errors.finish()?;
    build(&devs, &by_guid)
}

/// `Switch  24 "S-005442ba00003080"  # "ISR9024 Voltaire" base port 0 lid 6 lmc 0`.
fn dev_line(no: usize, line: &str) -> Result<Dev, String> {
    let (head, comment) = line.split_once('#').unwrap_or((line, ""));
    let mut words = head.split_whitespace();
    let kind = match words.next() {
        Some("Switch") => Kind::Switch,
        Some("Ca") => Kind::Ca,
        Some("Rt") => Kind::Router,
        _ => return Err("not a line of an ibnetdiscover topology file".into()),
    };
    let nports: u32 = words
        .next()
        .and_then(|n| n.parse().ok())
        .ok_or("no port count")?;
    if nports == 0 || nports > MAX_PORTS {
        return Err(format!("{nports} ports is not 1 to {MAX_PORTS}"));
    }
    let id = words.next().ok_or("no node id")?;
    let guid = quoted_id(id)?;
    let desc = first_quoted(comment).unwrap_or_default();
    Ok(Dev {
        kind,
        guid,
        desc,
        line: no,
        ports: Vec::new(),
    })
}

/// `"S-005442ba00003080"` → `S-005442ba00003080`, checked.
fn quoted_id(s: &str) -> Result<String, String> {
    let inner = s
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .ok_or("the node id is not quoted")?;
    let (prefix, hex) = inner.split_at_checked(2).ok_or("a node id too short")?;
    if !matches!(prefix, "S-" | "H-" | "R-") || !is_guid(hex) {
        return Err(format!(
            "{:?} is not S-, H- or R- and a 16-digit GUID",
            shown(inner)
        ));
    }
    Ok(format!("{prefix}{}", hex.to_ascii_lowercase()))
}

fn is_guid(hex: &str) -> bool {
    !hex.is_empty() && hex.len() <= 16 && hex.bytes().all(|b| b.is_ascii_hexdigit())
}

fn first_quoted(s: &str) -> Option<String> {
    let start = s.find('"')? + 1;
    let len = s[start..].find('"')?;
    Some(s[start..start + len].to_string())
}

/// `[N]` or `[N](portguid)` or `[N][ext 3]`: the port number and port GUID.
fn port_ref(s: &str) -> Result<(u32, Option<String>, &str), String> {
    let rest = s.strip_prefix('[').ok_or("no [port]")?;
    let end = rest.find(']').ok_or("[port] is not closed")?;
    let port: u32 = rest[..end].parse().map_err(|_| "[port] is not a number")?;
    if port > MAX_PORTS {
        return Err(format!("port {port} is above {MAX_PORTS}"));
    }
    let mut rest = &rest[end + 1..];
    let mut guid = None;
    if let Some(r) = rest.strip_prefix('(') {
        let end = r.find(')').ok_or("(port GUID) is not closed")?;
        if !is_guid(&r[..end]) {
            return Err("the port GUID is not hexadecimal".into());
        }
        guid = Some(format!("0x{:0>16}", r[..end].to_ascii_lowercase()));
        rest = &r[end + 1..];
    }
    // `-g` adds the chassis' external port: `[ext 3]`.
    if let Some(r) = rest.strip_prefix("[ext")
        && let Some(end) = r.find(']')
    {
        rest = &r[end + 1..];
    }
    Ok((port, guid, rest))
}

fn port_line(no: usize, line: &str, kind: Kind) -> Result<Port, String> {
    let (head, comment) = line.split_once('#').unwrap_or((line, ""));
    let (port, own_guid, rest) = port_ref(head.trim())?;
    let rest = rest.trim_start();
    if !rest.starts_with('"') {
        return Err("no quoted peer after the port".into());
    }
    let close = rest[1..].find('"').ok_or("the peer's id is not quoted")? + 2;
    let peer = quoted_id(&rest[..close])?;
    let (peer_port, peer_guid, _) = port_ref(rest[close..].trim_start())?;
    let rate = comment.split_whitespace().rev().find_map(rate);
    Ok(Port {
        line: no,
        port,
        port_guid: if kind == Kind::Switch {
            peer_guid
        } else {
            own_guid
        },
        peer,
        peer_port,
        rate,
    })
}

/// `4xSDR` → (4, "SDR", 8 Gbit/s of data).
fn rate(word: &str) -> Option<(u32, String, f64)> {
    let (width, speed) = word.split_once('x')?;
    let width: u32 = width
        .parse()
        .ok()
        .filter(|w| matches!(w, 1 | 2 | 4 | 8 | 12))?;
    let lane = match speed {
        "SDR" => 2.0,
        "DDR" => 4.0,
        "QDR" => 8.0,
        "FDR10" => 10.0,
        "FDR" => 13.64,
        "EDR" => 25.0,
        "HDR" => 50.0,
        "NDR" => 100.0,
        "XDR" => 200.0,
        _ => return None,
    };
    Some((width, speed.to_string(), width as f64 * lane))
}

/// A switch's name: Mellanox's `MF0;leaf-1:MQM8790/U1` says `leaf-1`; a description that
/// is a name is the name; anything else (`ISR9024 Voltaire`) keeps the GUID id.
fn switch_name(d: &Dev) -> String {
    let desc = d.desc.trim();
    let candidate = desc
        .strip_prefix("MF0;")
        .and_then(|r| r.split(':').next())
        .unwrap_or(desc);
    if check_name(candidate).is_ok() {
        candidate.to_string()
    } else {
        d.guid.clone()
    }
}

/// A CA's host and NIC: `gpu-0412 mlx5_3` → (`gpu-0412`, `mlx5_3`).
fn ca_names(d: &Dev) -> Option<(String, String)> {
    let mut words = d.desc.split_whitespace();
    let (host, nic) = (words.next()?, words.next()?);
    if words.next().is_some() || check_name(host).is_err() || check_name(nic).is_err() {
        return None;
    }
    Some((host.to_string(), nic.to_string()))
}

fn build(devs: &[Dev], by_guid: &HashMap<String, usize>) -> Result<Fabric, Errors> {
    let mut fabric = Fabric::default();
    let mut errors = ErrorList::default();
    // Switch names, unique: a repeated description falls back to the GUID id.
    let mut names: HashMap<usize, String> = HashMap::new();
    let mut taken: HashMap<String, usize> = HashMap::new();
    for (i, d) in devs.iter().enumerate().filter(|(_, d)| d.kind != Kind::Ca) {
        let mut name = switch_name(d);
        if taken.contains_key(&name) {
            name = d.guid.clone();
        }
        taken.insert(name.clone(), i);
        names.insert(i, name);
    }
    let peer_of = |p: &Port| by_guid.get(&p.peer).copied();
    let has_ca = |d: &Dev| {
        d.ports
            .iter()
            .any(|p| peer_of(p).is_some_and(|j| devs[j].kind == Kind::Ca))
    };
    let leaves: Vec<bool> = devs.iter().map(has_ca).collect();
    for (i, d) in devs.iter().enumerate().filter(|(_, d)| d.kind != Kind::Ca) {
        let tier = if d.kind == Kind::Switch && leaves[i] {
            Tier::Leaf
        } else if d
            .ports
            .iter()
            .any(|p| peer_of(p).is_some_and(|j| leaves[j]))
        {
            Tier::Spine
        } else {
            Tier::Core
        };
        if d.kind == Kind::Router {
            fabric.notes.push(Note {
                subject: names[&i].clone(),
                message: "a router: kept as a switch, not planned through".into(),
            });
        }
        fabric.switches.push(Switch {
            name: names[&i].clone(),
            tier,
            guid: Some(format!("0x{:0>16}", &d.guid[2..])),
        });
    }
    // Switch-to-switch links, once each (both ends print them).
    let mut seen: HashMap<(usize, u32, usize, u32), Option<(u32, String, f64)>> = HashMap::new();
    for (i, d) in devs.iter().enumerate().filter(|(_, d)| d.kind != Kind::Ca) {
        for p in &d.ports {
            let Some(j) = peer_of(p) else {
                errors.push(format!(
                    "line {}: the peer {} is not listed in the file",
                    p.line, p.peer
                ));
                continue;
            };
            if devs[j].kind == Kind::Ca {
                continue;
            }
            let key = if (i, p.port) < (j, p.peer_port) {
                (i, p.port, j, p.peer_port)
            } else {
                (j, p.peer_port, i, p.port)
            };
            if let Some(first) = seen.get(&key) {
                if let (Some(a), Some(b)) = (first, &p.rate)
                    && a != b
                {
                    fabric.notes.push(Note {
                        subject: names[&i].clone(),
                        message: format!(
                            "port {} to {} port {}: one end says {}x{}, the other {}x{}",
                            p.port, names[&j], p.peer_port, a.0, a.1, b.0, b.1
                        ),
                    });
                }
            } else {
                seen.insert(key, p.rate.clone());
                fabric.links.push(Link {
                    a: names[&i].clone(),
                    b: names[&j].clone(),
                    gbps: p.rate.as_ref().map(|r| r.2),
                    a_port: Some(p.port),
                    b_port: Some(p.peer_port),
                });
            }
        }
    }
    // Nodes: CAs grouped by the host their description names.
    let mut nodes: BTreeMap<String, Node> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    for (i, d) in devs.iter().enumerate().filter(|(_, d)| d.kind == Kind::Ca) {
        let (host, ca) = match ca_names(d) {
            Some(n) => n,
            None => {
                fabric.notes.push(Note {
                    subject: d.guid.clone(),
                    message: format!(
                        "NodeDescription {:?} names no host (\"HOST NIC\"): named by its GUID",
                        shown(&d.desc)
                    ),
                });
                (d.guid.clone(), "hca".to_string())
            }
        };
        if !nodes.contains_key(&host) {
            order.push(host.clone());
        }
        let node = nodes.entry(host.clone()).or_insert_with(|| Node {
            name: host.clone(),
            ..Node::default()
        });
        if d.ports.is_empty() {
            fabric.notes.push(Note {
                subject: host.clone(),
                message: format!("{ca} ({}) has no cabled port", d.guid),
            });
        }
        let several = d.ports.len() > 1;
        for p in &d.ports {
            let nic_name = if several {
                format!("{ca}-{}", p.port)
            } else {
                ca.clone()
            };
            let peer = peer_of(p);
            let leaf = match peer {
                Some(j) if devs[j].kind == Kind::Switch => Some(names[&j].clone()),
                Some(j) => {
                    fabric.notes.push(Note {
                        subject: host.clone(),
                        message: format!(
                            "{nic_name} is cabled to {} ({}), not to a switch: left unmapped",
                            devs[j].guid,
                            if devs[j].kind == Kind::Ca {
                                "a CA"
                            } else {
                                "a router"
                            }
                        ),
                    });
                    None
                }
                None => {
                    errors.push(format!(
                        "line {}: the peer {} is not listed",
                        p.line, p.peer
                    ));
                    None
                }
            };
            if let Some(j) = peer {
                check_ends(devs, i, p, j, &host, &nic_name, &mut fabric.notes);
            }
            if node.nics.len() >= MAX_NICS_PER_NODE {
                errors.push(format!(
                    "line {}: node {host:?} has more than {MAX_NICS_PER_NODE} NICs",
                    p.line
                ));
                continue;
            }
            node.nics.push(Nic {
                name: nic_name,
                rail: None,
                leaf,
                gbps: p.rate.as_ref().map(|r| r.2),
                port: peer.map(|_| p.peer_port),
                guid: p.port_guid.clone(),
            });
        }
    }
    errors.finish()?;
    // One NIC each is one rail, not a guess; several are left for the admin to map.
    let single = nodes.values().all(|n| n.nics.len() <= 1);
    for name in order {
        let mut node = nodes.remove(&name).expect("every name was inserted");
        if single {
            for nic in &mut node.nics {
                nic.rail = Some(0);
            }
        } else if !node.nics.is_empty() {
            fabric.notes.push(Note {
                subject: name.clone(),
                message: format!(
                    "rails unmapped: ibnetdiscover does not say which of its {} NICs is on which rail",
                    node.nics.len()
                ),
            });
        }
        fabric.nodes.push(node);
    }
    fabric.check()?;
    Ok(fabric)
}

/// The switch's line for this cable must name this CA's port back, with the same rate.
fn check_ends(
    devs: &[Dev],
    ca: usize,
    p: &Port,
    sw: usize,
    host: &str,
    nic: &str,
    notes: &mut Vec<Note>,
) {
    let back = devs[sw].ports.iter().find(|q| q.port == p.peer_port);
    let message = match back {
        None => format!(
            "{nic}: the CA says port {} of {}, whose own lines do not list that port",
            p.peer_port, devs[sw].guid
        ),
        Some(q) if q.peer != devs[ca].guid || q.peer_port != p.port => format!(
            "{nic}: the CA says port {} of {}, which says it goes to {} port {}",
            p.peer_port, devs[sw].guid, q.peer, q.peer_port
        ),
        Some(q) => match (&p.rate, &q.rate) {
            (Some(a), Some(b)) if a != b => format!(
                "{nic}: the CA's end says {}x{}, the switch's end {}x{}",
                a.0, a.1, b.0, b.1
            ),
            _ => return,
        },
    };
    notes.push(Note {
        subject: host.to_string(),
        message,
    });
}

#[cfg(test)]
#[path = "ibnetdiscover_tests.rs"]
mod tests;
