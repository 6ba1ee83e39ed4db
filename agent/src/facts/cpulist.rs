//! CPU lists as the kernel writes them (`local_cpulist`, `cpuset.cpus`): `0-19,40-59`.

use anyhow::bail;

/// Most CPU numbers one list may name, all its ranges together: far beyond any machine's
/// (the kernel's own limit is 8192), and a bound on what a list of repeated ranges
/// (`0-65535,0-65535,...`) makes of a few bytes.
pub const MAX_CPUS: usize = 1 << 16;

/// `0-19,40-59` → the CPU numbers.
pub fn parse_cpulist(list: &str) -> anyhow::Result<Vec<usize>> {
    let mut out = Vec::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse()?, b.parse()?);
                if b < a || b - a >= MAX_CPUS - out.len() {
                    bail!("bad CPU range {part:?} (at most {MAX_CPUS} CPUs in all)");
                }
                out.extend(a..=b);
            }
            None if out.len() < MAX_CPUS => out.push(part.parse()?),
            None => bail!("more than {MAX_CPUS} CPUs in one list"),
        }
    }
    Ok(out)
}
