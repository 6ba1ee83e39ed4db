//! Plain Rust mirrors of the WIT records, so plugin logic and its tests never depend on the
//! generated bindings.

/// What `info()` returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Info {
    pub name: String,
    pub version: String,
    pub description: String,
    /// JSON pointers of the facts `detect` reads (`/host/dmi`, `/rdma`, `/gpus/*/name` for
    /// the name of every GPU); empty: all of them. The host passes only these parts, so
    /// declare every path the plugin looks at.
    pub reads: Vec<String>,
}

impl Info {
    pub fn new(name: &str, version: &str, description: &str) -> Self {
        Self {
            name: name.into(),
            version: version.into(),
            description: description.into(),
            reads: Vec::new(),
        }
    }

    /// Declares the parts of the facts the plugin reads (see [`Info::reads`]).
    pub fn reads(mut self, pointers: &[&str]) -> Self {
        self.reads = pointers.iter().map(|p| p.to_string()).collect();
        self
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvVar {
    pub name: String,
    pub value: String,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GpuAffinity {
    pub gpu: u32,
    /// Kernel cpulist syntax (`0-19,40-59`); empty when unknown.
    pub cpus: String,
    pub numa: Option<i32>,
    pub nic: Option<String>,
    pub netdev: Option<String>,
}

/// What a plugin found. Empty means "does not apply to this node".
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Detection {
    /// Ordered (key, value) pairs; a later pair with the same key replaces the earlier one.
    pub traits: Vec<(String, String)>,
    pub env: Vec<EnvVar>,
    pub affinity: Vec<GpuAffinity>,
    pub warnings: Vec<String>,
    /// What tests should reach on this node; results below them are judged FAIL.
    pub expectations: Vec<Expectation>,
}

/// A floor for a test's figure on this node, e.g. all_reduce busbw ≥ 300 GB/s at ≥ 256 MiB.
#[derive(Debug, Clone, PartialEq)]
pub struct Expectation {
    /// `<kind>.<test>`: `nccl.all_reduce`, `rdma.ib_write_bw`, `p2p.h2d`.
    pub test: String,
    /// `busbw_gbs`, `algbw_gbs`, ...
    pub metric: String,
    pub min_size_bytes: u64,
    pub value: f64,
    /// Where the figure comes from, for the operator.
    pub source: String,
}

impl Detection {
    pub fn add_trait(&mut self, key: &str, value: &str) -> &mut Self {
        self.traits.retain(|(k, _)| k != key);
        self.traits.push((key.into(), value.into()));
        self
    }

    /// Recommends `name=value`; a second recommendation of the same name replaces the first.
    pub fn recommend(&mut self, name: &str, value: &str, reason: &str) -> &mut Self {
        self.env.retain(|e| e.name != name);
        self.env.push(EnvVar {
            name: name.into(),
            value: value.into(),
            reason: reason.into(),
        });
        self
    }

    pub fn warn(&mut self, message: impl Into<String>) -> &mut Self {
        self.warnings.push(message.into());
        self
    }

    /// Expects `test`'s `metric` to reach `value` at sizes of at least `min_size_bytes`; a
    /// second expectation for the same test, metric and size replaces the first.
    pub fn expect(
        &mut self,
        test: &str,
        metric: &str,
        min_size_bytes: u64,
        value: f64,
        source: &str,
    ) -> &mut Self {
        self.expectations.retain(|e| {
            !(e.test == test && e.metric == metric && e.min_size_bytes == min_size_bytes)
        });
        self.expectations.push(Expectation {
            test: test.into(),
            metric: metric.into(),
            min_size_bytes,
            value,
            source: source.into(),
        });
        self
    }

    pub fn is_empty(&self) -> bool {
        self.traits.is_empty()
            && self.env.is_empty()
            && self.affinity.is_empty()
            && self.warnings.is_empty()
            && self.expectations.is_empty()
    }

    pub fn trait_value(&self, key: &str) -> Option<&str> {
        self.traits
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn env_value(&self, name: &str) -> Option<&str> {
        self.env
            .iter()
            .find(|e| e.name == name)
            .map(|e| e.value.as_str())
    }
}

/// A plugin failure the host reports as such (not a crash). `code` is open-ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginError {
    pub code: String,
    pub message: String,
}

impl PluginError {
    pub fn new(code: &str, message: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            message: message.into(),
        }
    }

    /// The facts are not the JSON this plugin expects.
    pub fn bad_facts(message: impl Into<String>) -> Self {
        Self::new("bad-facts", message)
    }
}

impl std::fmt::Display for PluginError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for PluginError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recommend_replaces_same_name() {
        let mut d = Detection::default();
        d.recommend("NCCL_IB_HCA", "mlx5_0", "a")
            .recommend("NCCL_IB_HCA", "mlx5_1", "b");
        assert_eq!(d.env.len(), 1);
        assert_eq!(d.env_value("NCCL_IB_HCA"), Some("mlx5_1"));
        assert!(!d.is_empty());
    }

    #[test]
    fn traits_keep_order_and_replace() {
        let mut d = Detection::default();
        d.add_trait("a", "1")
            .add_trait("b", "2")
            .add_trait("a", "3");
        assert_eq!(
            d.traits,
            vec![("b".into(), "2".into()), ("a".into(), "3".into())]
        );
    }
}
