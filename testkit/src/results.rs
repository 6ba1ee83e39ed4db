//! Results as tests make and read them.

use serde_json::Value;

/// The codes and severities of a stored result's verdict reasons (those with a code).
pub fn codes(result: &Value) -> Vec<(String, String)> {
    result["verdict"]["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| {
            Some((
                r["code"].as_str()?.to_string(),
                r["severity"].as_str().unwrap().to_string(),
            ))
        })
        .collect()
}

/// A deterministic wobble of about ±1 % for `node`'s figure on `day` of a simulated
/// history.
pub fn noise(day: usize, node: usize) -> f64 {
    let h = ((day * 31 + node * 17) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
    1.0 + 0.02 * ((h % 1000) as f64 / 1000.0 - 0.5)
}
