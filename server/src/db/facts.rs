//! The facts columns people filter on, extracted from the facts document the agent sends.
//! Facts stay JSONB; these columns are what indexes and `GET /nodes?...` filters use.

#[derive(Debug, Default, PartialEq)]
pub struct FactColumns {
    pub gpu_model: Option<String>,
    pub gpu_count: i32,
    pub hcas: Vec<String>,
    pub port_states: Vec<String>,
    pub link_layers: Vec<String>,
}

fn strings<'a>(values: impl Iterator<Item = &'a serde_json::Value>) -> Vec<String> {
    let mut out: Vec<String> = values
        .filter_map(|v| v.as_str())
        .map(str::to_string)
        .collect();
    out.sort();
    out.dedup();
    out
}

pub fn extract(facts: &serde_json::Value) -> FactColumns {
    let gpus = facts
        .pointer("/gpus")
        .and_then(|g| g.as_array())
        .cloned()
        .unwrap_or_default();
    // The most common GPU name, so one odd card does not rename the node.
    let mut names: Vec<&str> = gpus
        .iter()
        .filter_map(|g| g.get("name")?.as_str())
        .collect();
    names.sort_unstable();
    let gpu_model = names
        .chunk_by(|a, b| a == b)
        .max_by_key(|run| run.len())
        .map(|run| run[0].to_string());
    let devices = facts
        .pointer("/rdma/devices")
        .and_then(|d| d.as_array())
        .cloned()
        .unwrap_or_default();
    let ports: Vec<&serde_json::Value> = devices
        .iter()
        .filter_map(|d| d.get("ports")?.as_array())
        .flatten()
        .collect();
    FactColumns {
        gpu_model,
        gpu_count: i32::try_from(gpus.len()).unwrap_or(i32::MAX),
        hcas: strings(devices.iter().filter_map(|d| d.get("name"))),
        port_states: strings(ports.iter().filter_map(|p| p.get("state"))),
        link_layers: strings(ports.iter().filter_map(|p| p.get("link_layer"))),
    }
}

/// Drops a node's facts history beyond its `keep` newest changes (at least one is kept).
/// Called in the transaction that adds a change, so no node's history grows past `keep`.
pub async fn prune_history(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    node_id: uuid::Uuid,
    keep: u32,
) -> Result<u64, sqlx::Error> {
    let done = sqlx::query!(
        "DELETE FROM node_facts_history WHERE node_id = $1 AND id < (
             SELECT id FROM node_facts_history WHERE node_id = $1
             ORDER BY id DESC OFFSET $2 LIMIT 1)",
        node_id,
        i64::from(keep.max(1)) - 1,
    )
    .execute(&mut **tx)
    .await?;
    Ok(done.rows_affected())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn extracts_filter_columns() {
        let facts = json!({
            "host": {"hostname": "nd1"},
            "gpus": [{"name": "Tesla V100-SXM2-32GB"}, {"name": "Tesla V100-SXM2-32GB"}, {"name": null}],
            "rdma": {"devices": [
                {"name": "mlx5_0", "ports": [{"state": "ACTIVE", "link_layer": "InfiniBand"}]},
                {"name": "rdmaP1", "ports": [{"state": "ACTIVE", "link_layer": "Ethernet"}, {"state": "DOWN", "link_layer": "Ethernet"}]}
            ]}
        });
        let c = extract(&facts);
        assert_eq!(c.gpu_model.as_deref(), Some("Tesla V100-SXM2-32GB"));
        assert_eq!(c.gpu_count, 3);
        assert_eq!(c.hcas, vec!["mlx5_0", "rdmaP1"]);
        assert_eq!(c.port_states, vec!["ACTIVE", "DOWN"]);
        assert_eq!(c.link_layers, vec!["Ethernet", "InfiniBand"]);
    }

    #[test]
    fn missing_sections_give_empty_columns() {
        assert_eq!(extract(&json!({})), FactColumns::default());
        assert_eq!(
            extract(&json!({"gpus": "garbage", "rdma": 3})),
            FactColumns::default()
        );
    }
}
