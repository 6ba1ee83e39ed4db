//! What the plugin keeps per communicator: a fixed table of (function, size band) rows and
//! a few network rows, all atomics, allocated once when NCCL initialises the communicator.
//! Events add to them without locks; the writer only reads them.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering::Relaxed};

use heddle_types::observe::{CommObservation, MAX_BANDS_PER_COMM, NetUse, OpBand};

use crate::names::{ALGOS, FUNCS, NONE, PROTOS};

/// Networks tracked per communicator (IB, Socket, and two others).
pub const MAX_NETS: usize = 4;

/// One (function, size band) row. `key` is 0 while the row is free, else key + 1.
#[derive(Default)]
pub struct Row {
    key: AtomicU32,
    ops: AtomicU64,
    bytes: AtomicU64,
    time_ns: AtomicU64,
    exec_ops: AtomicU64,
    exec_bytes: AtomicU64,
    exec_ns: AtomicU64,
    algos: [AtomicU64; ALGOS.len()],
    protos: [AtomicU64; PROTOS.len()],
    max_channels: AtomicU32,
}

/// One network type seen in this communicator's net plugin events.
#[derive(Default)]
struct NetRow {
    /// The plugin id's type bits + 1; 0 while free.
    key: AtomicU64,
    ops: AtomicU64,
    bytes: AtomicU64,
}

/// One finished operation, as added to its row.
pub struct Done {
    pub bytes: u64,
    pub time_ns: u64,
    /// GPU execution time from the kernel channel events, when all of them came.
    pub exec_ns: Option<u64>,
    pub algo: u8,
    pub proto: u8,
    pub channels: u32,
}

pub struct Comm {
    pub hash: u64,
    pub name: Option<String>,
    pub nranks: u32,
    pub nnodes: u32,
    pub rank: u32,
    rows: Box<[Row]>,
    nets: [NetRow; MAX_NETS],
    pub proxy_ops: AtomicU64,
    /// Operations lost because every row was taken by other (function, band) pairs.
    pub dropped_rows: AtomicU64,
    /// Milliseconds since the epoch when NCCL finalized it; 0 while live.
    finalized_ms: AtomicI64,
    /// Name of a network type other than IB and Socket (the net plugin NCCL loaded).
    pub other_net_name: OnceLock<String>,
    pub progress: crate::progress::Tracker,
}

impl Comm {
    pub fn new(hash: u64, name: Option<String>, nnodes: i32, nranks: i32, rank: i32) -> Comm {
        let nranks = nranks.max(1) as u32;
        Comm {
            hash,
            name,
            nranks,
            nnodes: nnodes.max(0) as u32,
            rank: (rank.max(0) as u32).min(nranks - 1),
            rows: (0..MAX_BANDS_PER_COMM).map(|_| Row::default()).collect(),
            nets: Default::default(),
            proxy_ops: AtomicU64::new(0),
            dropped_rows: AtomicU64::new(0),
            finalized_ms: AtomicI64::new(0),
            other_net_name: OnceLock::new(),
            progress: Default::default(),
        }
    }

    /// The row of (function, band), taking a free one on first use; `None` when the table
    /// is full. Linear probing from the key's hash; rows are never given back.
    pub fn row_for(&self, func: u8, band: u32) -> Option<u32> {
        let key = (func as u32) * 64 + band + 1;
        let n = self.rows.len();
        let start = (key as usize).wrapping_mul(0x9E37_79B9) % n;
        for i in 0..n {
            let idx = (start + i) % n;
            let row = &self.rows[idx];
            match row.key.load(Relaxed) {
                k if k == key => return Some(idx as u32),
                0 => match row.key.compare_exchange(0, key, Relaxed, Relaxed) {
                    Ok(_) => return Some(idx as u32),
                    Err(k) if k == key => return Some(idx as u32),
                    Err(_) => continue,
                },
                _ => continue,
            }
        }
        None
    }

    pub fn add(&self, row: u32, done: &Done) {
        let Some(r) = self.rows.get(row as usize) else {
            return;
        };
        r.ops.fetch_add(1, Relaxed);
        r.bytes.fetch_add(done.bytes, Relaxed);
        r.time_ns.fetch_add(done.time_ns, Relaxed);
        if let Some(ns) = done.exec_ns {
            r.exec_ops.fetch_add(1, Relaxed);
            r.exec_bytes.fetch_add(done.bytes, Relaxed);
            r.exec_ns.fetch_add(ns, Relaxed);
        }
        if let Some(a) = r.algos.get(done.algo as usize) {
            a.fetch_add(1, Relaxed);
        }
        if let Some(p) = r.protos.get(done.proto as usize) {
            p.fetch_add(1, Relaxed);
        }
        if done.channels > r.max_channels.load(Relaxed) {
            r.max_channels.fetch_max(done.channels, Relaxed);
        }
    }

    /// Counts one network plugin event of the plugin id's type.
    pub fn add_net(&self, net_type: u64, bytes: u64) {
        let key = net_type + 1;
        for n in &self.nets {
            let k = n.key.load(Relaxed);
            let ours = k == key
                || (k == 0
                    && match n.key.compare_exchange(0, key, Relaxed, Relaxed) {
                        Ok(_) => true,
                        Err(k) => k == key,
                    });
            if ours {
                n.ops.fetch_add(1, Relaxed);
                n.bytes.fetch_add(bytes, Relaxed);
                return;
            }
        }
    }

    pub fn finalize(&self, now_ms: i64) -> bool {
        self.finalized_ms
            .compare_exchange(0, now_ms.max(1), Relaxed, Relaxed)
            .is_ok()
    }

    /// What the spool file says of this communicator now.
    pub fn observe(&self) -> CommObservation {
        let mut ops: Vec<OpBand> = Vec::new();
        for r in self.rows.iter() {
            let key = r.key.load(Relaxed);
            let count = r.ops.load(Relaxed);
            if key == 0 || count == 0 {
                continue;
            }
            let key = key - 1;
            let counts = |cells: &[AtomicU64], names: &[&str]| {
                cells
                    .iter()
                    .zip(names)
                    .filter_map(|(c, n)| {
                        let v = c.load(Relaxed);
                        (v > 0).then(|| (n.to_string(), v))
                    })
                    .collect()
            };
            ops.push(OpBand {
                func: FUNCS
                    .get((key / 64) as usize)
                    .copied()
                    .unwrap_or("Other")
                    .to_string(),
                size_band: key % 64,
                ops: count,
                bytes: r.bytes.load(Relaxed),
                time_ns: r.time_ns.load(Relaxed),
                exec_ops: r.exec_ops.load(Relaxed).min(count),
                exec_bytes: r.exec_bytes.load(Relaxed),
                exec_ns: r.exec_ns.load(Relaxed),
                algos: counts(&r.algos, &ALGOS),
                protos: counts(&r.protos, &PROTOS),
                max_channels: r.max_channels.load(Relaxed),
            });
        }
        ops.sort_by(|a, b| (&a.func, a.size_band).cmp(&(&b.func, b.size_band)));
        let net = self
            .nets
            .iter()
            .filter_map(|n| {
                let key = n.key.load(Relaxed);
                let ops = n.ops.load(Relaxed);
                (key != 0 && ops > 0).then(|| NetUse {
                    net: self.net_name(key - 1),
                    ops,
                    bytes: n.bytes.load(Relaxed),
                    inferred: false,
                })
            })
            .collect();
        let finalized_ms = self.finalized_ms.load(Relaxed);
        CommObservation {
            comm_hash: format!("{:016x}", self.hash),
            name: self.name.clone(),
            nranks: self.nranks,
            nnodes: self.nnodes,
            rank: self.rank,
            ops,
            net,
            proxy_ops: self.proxy_ops.load(Relaxed),
            dropped_events: self.dropped_rows.load(Relaxed),
            finalized_at: (finalized_ms != 0)
                .then(|| chrono::DateTime::from_timestamp_millis(finalized_ms))
                .flatten(),
            progress: None,
        }
    }

    fn net_name(&self, net_type: u64) -> String {
        match net_type as i64 {
            crate::abi::NET_TYPE_IB => "IB".to_string(),
            crate::abi::NET_TYPE_SOCK => "Socket".to_string(),
            t => self
                .other_net_name
                .get()
                .cloned()
                .unwrap_or_else(|| format!("net-type-{}", t >> 16)),
        }
    }
}

/// An operation's algorithm and protocol ids when it has none (point-to-point).
pub const NO_ALGO: (u8, u8) = (NONE, NONE);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_fill_then_refuse() {
        let c = Comm::new(0xabc, None, 1, 2, 1);
        let mut taken = std::collections::HashSet::new();
        let mut refused = 0;
        for func in 0..12u8 {
            for band in 0..64 {
                match c.row_for(func, band) {
                    Some(r) => {
                        assert!(taken.insert(r));
                        assert_eq!(c.row_for(func, band), Some(r));
                    }
                    None => refused += 1,
                }
            }
        }
        assert_eq!(taken.len(), MAX_BANDS_PER_COMM);
        assert_eq!(refused, 12 * 64 - MAX_BANDS_PER_COMM);
    }

    #[test]
    fn a_row_is_small() {
        // 256 rows a communicator, 64 communicators: docs/profiler.md quotes the total.
        assert_eq!(std::mem::size_of::<Row>(), 152);
    }

    #[test]
    fn observes_what_was_added() {
        let c = Comm::new(0xabc, Some("dp".into()), 2, 4, 3);
        let r = c.row_for(1, 20).unwrap();
        let done = |exec| Done {
            bytes: 1 << 20,
            time_ns: 10,
            exec_ns: exec,
            algo: 1,
            proto: 2,
            channels: 4,
        };
        c.add(r, &done(Some(1000)));
        c.add(r, &done(None));
        c.add_net(crate::abi::NET_TYPE_IB as u64, 4096);
        c.add_net(7 << 16, 1);
        let _ = c.other_net_name.set("aws-ofi".into());
        let o = c.observe();
        assert_eq!(o.comm_hash, "0000000000000abc");
        assert_eq!((o.rank, o.nranks, o.nnodes), (3, 4, 2));
        let b = &o.ops[0];
        assert_eq!((b.func.as_str(), b.size_band, b.ops), ("AllReduce", 20, 2));
        assert_eq!(
            (b.bytes, b.exec_ops, b.exec_bytes, b.exec_ns),
            (2 << 20, 1, 1 << 20, 1000)
        );
        assert_eq!(b.algos["Ring"], 2);
        assert_eq!(b.protos["Simple"], 2);
        assert_eq!(b.max_channels, 4);
        assert_eq!(o.net[0].net, "IB");
        assert_eq!(o.net[1].net, "aws-ofi");
    }
}
