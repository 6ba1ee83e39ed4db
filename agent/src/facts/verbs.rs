//! Cross-check of sysfs against libibverbs, loaded at run time.
//!
//! The agent must start on nodes without rdma-core, so libibverbs is `dlopen`ed
//! (`libibverbs.so.1`) instead of linked; a missing library is reported as "no
//! libibverbs". Only stable, exported entry points are used. `ibv_query_port` is called
//! through its exported compat symbol, which fills the leading (stable) part of
//! `struct ibv_port_attr`; the buffer given to it is larger than any version of the
//! struct and zeroed, so newer trailing fields cannot overflow it.

use std::ffi::{CStr, c_char, c_int, c_void};

use heddle_types::facts::{Probe, ProbeState, RdmaDevice};
use libloading::{Library, Symbol};

pub const DEFAULT_LIBRARY: &str = "libibverbs.so.1";

/// The leading, ABI-stable fields of `struct ibv_port_attr` (rdma-core `verbs.h`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct PortAttr {
    state: u32,
    max_mtu: u32,
    active_mtu: u32,
    gid_tbl_len: c_int,
    port_cap_flags: u32,
    max_msg_sz: u32,
    bad_pkey_cntr: u32,
    qkey_viol_cntr: u32,
    pkey_tbl_len: u16,
    lid: u16,
    sm_lid: u16,
    lmc: u8,
    max_vl_num: u8,
    sm_sl: u8,
    subnet_timeout: u8,
    init_type_reply: u8,
    active_width: u8,
    active_speed: u8,
    phys_state: u8,
    link_layer: u8,
    flags: u8,
    port_cap_flags2: u16,
    active_speed_ex: u32,
    /// Room for fields added after this layout was written.
    _spare: [u64; 8],
}

/// IB MTU enum (`IBV_MTU_256` = 1 … `IBV_MTU_4096` = 5) to bytes.
pub fn mtu_bytes(mtu: u32) -> Option<u32> {
    (1..=5).contains(&mtu).then(|| 128u32 << mtu)
}

type GetDeviceList = unsafe extern "C" fn(*mut c_int) -> *mut *mut c_void;
type FreeDeviceList = unsafe extern "C" fn(*mut *mut c_void);
type GetDeviceName = unsafe extern "C" fn(*mut c_void) -> *const c_char;
type OpenDevice = unsafe extern "C" fn(*mut c_void) -> *mut c_void;
type CloseDevice = unsafe extern "C" fn(*mut c_void) -> c_int;
type QueryPort = unsafe extern "C" fn(*mut c_void, u8, *mut PortAttr) -> c_int;

/// Loads libibverbs and updates `devices` in place (seen_by_verbs, active_mtu). Devices
/// verbs lists but sysfs does not are reported in the probe message.
pub fn cross_check(library: &str, devices: &mut [RdmaDevice]) -> Probe {
    // SAFETY: loading libibverbs runs its constructors, which only register providers.
    let lib = match unsafe { Library::new(library) } {
        Ok(l) => l,
        Err(e) => {
            return Probe {
                state: ProbeState::Missing,
                message: format!(
                    "no libibverbs: {library} could not be loaded ({e}); RDMA facts come from sysfs only"
                ),
            };
        }
    };
    match unsafe { query(&lib, devices) } {
        Ok(probe) => probe,
        Err(e) => Probe {
            state: ProbeState::Failed,
            message: format!("libibverbs loaded but a symbol is missing: {e}"),
        },
    }
}

/// The rdma-core release of the libibverbs mapped into this process, read from
/// `/proc/self/maps` while the library is loaded: rdma-core names the file
/// `libibverbs.so.1.<abi>.<release>`, e.g. `libibverbs.so.1.14.44.0` for rdma-core 44.0.
pub fn rdma_core_version(library: &str) -> Option<String> {
    // SAFETY: as in `cross_check`.
    let _lib = unsafe { Library::new(library) }.ok()?;
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .find_map(|l| l.rsplit('/').next().and_then(rdma_core_from_file_name))
}

pub fn rdma_core_from_file_name(name: &str) -> Option<String> {
    let rest = name.trim().strip_prefix("libibverbs.so.1.")?;
    let (_abi, release) = rest.split_once('.')?;
    release
        .split('.')
        .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        .then(|| release.to_string())
}

unsafe fn query(lib: &Library, devices: &mut [RdmaDevice]) -> Result<Probe, libloading::Error> {
    // SAFETY (whole function): the signatures match rdma-core's exported symbols, the
    // device list is freed exactly once, and each opened context is closed.
    unsafe {
        let get_list: Symbol<GetDeviceList> = lib.get(b"ibv_get_device_list\0")?;
        let free_list: Symbol<FreeDeviceList> = lib.get(b"ibv_free_device_list\0")?;
        let get_name: Symbol<GetDeviceName> = lib.get(b"ibv_get_device_name\0")?;
        let open: Symbol<OpenDevice> = lib.get(b"ibv_open_device\0")?;
        let close: Symbol<CloseDevice> = lib.get(b"ibv_close_device\0")?;
        let query_port: Symbol<QueryPort> = lib.get(b"ibv_query_port\0")?;

        let mut n: c_int = 0;
        let list = get_list(&mut n);
        if list.is_null() {
            let err = std::io::Error::last_os_error();
            for d in devices.iter_mut() {
                d.seen_by_verbs = Some(false);
            }
            return Ok(Probe {
                state: ProbeState::Missing,
                message: format!(
                    "libibverbs loaded; ibv_get_device_list found no RDMA devices ({err})"
                ),
            });
        }
        let mut seen = Vec::new();
        for i in 0..n.max(0) as usize {
            let dev = *list.add(i);
            if dev.is_null() {
                break;
            }
            let name_ptr = get_name(dev);
            if name_ptr.is_null() {
                continue;
            }
            let name = CStr::from_ptr(name_ptr).to_string_lossy().into_owned();
            if let Some(d) = devices.iter_mut().find(|d| d.name == name) {
                d.seen_by_verbs = Some(true);
                let ctx = open(dev);
                if !ctx.is_null() {
                    for port in d.ports.iter_mut() {
                        let Ok(num) = u8::try_from(port.port) else {
                            continue;
                        };
                        let mut attr = PortAttr::default();
                        if query_port(ctx, num, &mut attr) == 0 {
                            port.active_mtu = mtu_bytes(attr.active_mtu);
                        }
                    }
                    close(ctx);
                }
            }
            seen.push(name);
        }
        free_list(list);
        let mut extra: Vec<&String> = seen
            .iter()
            .filter(|n| !devices.iter().any(|d| &d.name == *n))
            .collect();
        extra.sort();
        for d in devices.iter_mut() {
            d.seen_by_verbs.get_or_insert(false);
        }
        if seen.is_empty() {
            return Ok(Probe {
                state: ProbeState::Missing,
                message: "libibverbs loaded; ibv_get_device_list returned no RDMA devices".into(),
            });
        }
        let mut message = format!("libibverbs lists {} device(s)", seen.len());
        if !extra.is_empty() {
            message.push_str(&format!(
                "; not in sysfs: {}",
                extra
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        let missing: Vec<&str> = devices
            .iter()
            .filter(|d| d.seen_by_verbs == Some(false))
            .map(|d| d.name.as_str())
            .collect();
        if !missing.is_empty() {
            message.push_str(&format!("; in sysfs but not verbs: {}", missing.join(", ")));
        }
        Ok(Probe {
            state: ProbeState::Available,
            message,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rdma_core_release_comes_from_the_file_name() {
        assert_eq!(
            rdma_core_from_file_name("libibverbs.so.1.14.44.0").as_deref(),
            Some("44.0")
        );
        assert_eq!(
            rdma_core_from_file_name("libibverbs.so.1.14.50.0").as_deref(),
            Some("50.0")
        );
        assert_eq!(rdma_core_from_file_name("libibverbs.so.1"), None);
        assert_eq!(rdma_core_from_file_name("libibverbs.so.1.1.16.0.old"), None);
        assert_eq!(rdma_core_from_file_name("libmlx5.so.1.24.44.0"), None);
    }

    #[test]
    fn mtu_enum_maps_to_bytes() {
        assert_eq!(mtu_bytes(5), Some(4096));
        assert_eq!(mtu_bytes(3), Some(1024));
        assert_eq!(mtu_bytes(0), None);
        assert_eq!(mtu_bytes(6), None);
    }

    #[test]
    fn port_attr_prefix_matches_the_c_layout() {
        // offsetof(struct ibv_port_attr, lid) == 34 and link_layer == 46 in verbs.h.
        assert_eq!(std::mem::offset_of!(PortAttr, lid), 34);
        assert_eq!(std::mem::offset_of!(PortAttr, link_layer), 46);
        assert_eq!(std::mem::offset_of!(PortAttr, active_speed_ex), 52);
    }

    #[test]
    fn missing_library_says_no_libibverbs() {
        let probe = cross_check("libibverbs-not-here.so.9", &mut []);
        assert_eq!(probe.state, ProbeState::Missing);
        assert!(
            probe.message.starts_with("no libibverbs"),
            "{}",
            probe.message
        );
    }
}
