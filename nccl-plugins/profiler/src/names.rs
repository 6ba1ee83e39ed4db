//! The strings NCCL puts in event descriptors, turned into small numbers on the event path
//! (no allocation, one comparison per known name) and back into the names the spool file
//! carries.

use std::ffi::{CStr, c_char};

/// NCCL's collective and point-to-point function names (`ncclFuncToString`); anything else
/// is counted as `Other`.
pub const FUNCS: [&str; 12] = [
    "AllGather",
    "AllReduce",
    "AlltoAll",
    "Broadcast",
    "Gather",
    "Recv",
    "Reduce",
    "ReduceScatter",
    "Scatter",
    "SendRecv",
    "Send",
    "Other",
];

/// Algorithms as `NCCL_ALGO` spells them, so a row reads like the setting that would force
/// it. NCCL's descriptors say `RING`, `TREE`, `COLLNET_DIRECT`, ... (`ncclAlgoToString`).
pub const ALGOS: [&str; 8] = [
    "Tree",
    "Ring",
    "CollnetDirect",
    "CollnetChain",
    "NVLS",
    "NVLSTree",
    "PAT",
    "other",
];

/// Protocols as `NCCL_PROTO` spells them (descriptors say `LL`, `LL128`, `SIMPLE`).
pub const PROTOS: [&str; 4] = ["LL", "LL128", "Simple", "other"];

/// No algorithm or protocol: point-to-point operations carry none.
pub const NONE: u8 = u8::MAX;

/// The bytes of a NUL-terminated string NCCL handed over, or empty for NULL.
///
/// # Safety
/// `p` is NULL or points at a NUL-terminated string that lives for the call.
pub unsafe fn bytes<'a>(p: *const c_char) -> &'a [u8] {
    if p.is_null() {
        return &[];
    }
    // SAFETY: the caller's promise.
    unsafe { CStr::from_ptr(p) }.to_bytes()
}

pub fn func_id(name: &[u8]) -> u8 {
    FUNCS[..FUNCS.len() - 1]
        .iter()
        .position(|f| f.as_bytes() == name)
        .unwrap_or(FUNCS.len() - 1) as u8
}

pub fn algo_id(name: &[u8]) -> u8 {
    match name {
        b"TREE" => 0,
        b"RING" => 1,
        b"COLLNET_DIRECT" => 2,
        b"COLLNET_CHAIN" => 3,
        b"NVLS" => 4,
        b"NVLS_TREE" => 5,
        b"PAT" => 6,
        _ => 7,
    }
}

pub fn proto_id(name: &[u8]) -> u8 {
    match name {
        b"LL" => 0,
        b"LL128" => 1,
        b"SIMPLE" => 2,
        _ => 3,
    }
}

/// Bytes per element of every `ncclDataType_t`, by the name `ncclDatatypeToString` gives.
/// NCCL 2.28 has no name for `ncclUint8` and says `Unknown` for it; every other type has
/// one, so `Unknown` is one byte.
pub fn datatype_size(name: &[u8]) -> u64 {
    match name {
        b"ncclInt8" | b"ncclUint8" | b"ncclChar" => 1,
        b"ncclFloat8e4m3" | b"ncclFloat8e5m2" => 1,
        b"ncclFloat16" | b"ncclHalf" | b"ncclBfloat16" => 2,
        b"ncclInt32" | b"ncclUint32" | b"ncclInt" | b"ncclFloat32" | b"ncclFloat" => 4,
        b"ncclInt64" | b"ncclUint64" | b"ncclFloat64" | b"ncclDouble" => 8,
        _ => 1,
    }
}

/// floor(log2(bytes)), 0 for 0 and 1 byte.
pub fn size_band(bytes: u64) -> u32 {
    if bytes <= 1 {
        0
    } else {
        63 - bytes.leading_zeros()
    }
}

/// Makes a string fit the spool file's rules (`heddle_types::observe`): no control
/// characters, at most `MAX_TEXT_LEN` bytes, cut on a character boundary.
pub fn clean_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len().min(heddle_types::observe::MAX_TEXT_LEN));
    for c in s.chars().filter(|c| !c.is_control()) {
        if out.len() + c.len_utf8() > heddle_types::observe::MAX_TEXT_LEN {
            break;
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_nccl_datatype_has_its_size() {
        // ncclDatatypeToString of NCCL 2.28, and the Uint8 it leaves unnamed.
        for (name, size) in [
            ("ncclInt8", 1),
            ("Unknown", 1),
            ("ncclInt32", 4),
            ("ncclUint32", 4),
            ("ncclInt64", 8),
            ("ncclUint64", 8),
            ("ncclFloat16", 2),
            ("ncclFloat32", 4),
            ("ncclFloat64", 8),
            ("ncclBfloat16", 2),
            ("ncclFloat8e4m3", 1),
            ("ncclFloat8e5m2", 1),
        ] {
            assert_eq!(datatype_size(name.as_bytes()), size, "{name}");
        }
    }

    #[test]
    fn bands_and_names() {
        assert_eq!(size_band(0), 0);
        assert_eq!(size_band(1), 0);
        assert_eq!(size_band(2), 1);
        assert_eq!(size_band(1023), 9);
        assert_eq!(size_band(1024), 10);
        assert_eq!(size_band(u64::MAX), 63);
        assert_eq!(FUNCS[func_id(b"AllReduce") as usize], "AllReduce");
        assert_eq!(FUNCS[func_id(b"Send") as usize], "Send");
        assert_eq!(FUNCS[func_id(b"Bogus") as usize], "Other");
        assert_eq!(ALGOS[algo_id(b"NVLS_TREE") as usize], "NVLSTree");
        assert_eq!(PROTOS[proto_id(b"SIMPLE") as usize], "Simple");
        assert_eq!(clean_text("a\u{1b}b"), "ab");
        assert_eq!(clean_text(&"é".repeat(200)).len(), 256);
    }
}
