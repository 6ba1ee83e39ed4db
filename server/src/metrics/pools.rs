//! The replica's Postgres pools in `/metrics`: connections open and idle per pool (read
//! when scraped), and how long requests waited for a connection (timed where they take
//! one, [`PoolMetrics::acquire`]), with the waits that ran out.

use std::sync::OnceLock;
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    pub pool: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolStateLabels {
    pub pool: &'static str,
    /// `idle` or `in_use`.
    pub state: &'static str,
}

pub struct PoolMetrics {
    pools: OnceLock<Vec<(&'static str, sqlx::PgPool)>>,
    connections: Family<PoolStateLabels, Gauge>,
    max: Family<PoolLabels, Gauge>,
    waits: Family<PoolLabels, Histogram>,
    timeouts: Family<PoolLabels, Counter>,
}

impl PoolMetrics {
    pub fn new(r: &mut Registry) -> Self {
        let m = PoolMetrics {
            pools: OnceLock::new(),
            connections: Family::default(),
            max: Family::default(),
            waits: Family::new_with_constructor(|| {
                Histogram::new([
                    0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5, 1.0, 5.0,
                ])
            }),
            timeouts: Family::default(),
        };
        r.register(
            "db_pool_connections",
            "Postgres connections this replica holds open, per pool and whether a request is using them",
            m.connections.clone(),
        );
        r.register(
            "db_pool_max_connections",
            "The most connections a pool of this replica opens",
            m.max.clone(),
        );
        r.register_with_unit(
            "db_pool_acquire",
            "How long a request of this replica waited for a pooled connection",
            Unit::Seconds,
            m.waits.clone(),
        );
        r.register(
            "db_pool_acquire_timeouts",
            "Requests of this replica that waited for a pooled connection past the pool's timeout",
            m.timeouts.clone(),
        );
        m
    }

    /// The pools to report, named (`main`, `agent`); set once at start-up.
    pub fn watch(&self, pools: Vec<(&'static str, sqlx::PgPool)>) {
        let _ = self.pools.set(pools);
    }

    /// Reads each pool's connections into the gauges (at scrape time).
    pub fn sample(&self) {
        for (name, pool) in self.pools.get().into_iter().flatten() {
            let (size, idle) = (i64::from(pool.size()), pool.num_idle() as i64);
            let set = |state, v| {
                self.connections
                    .get_or_create(&PoolStateLabels { pool: name, state })
                    .set(v)
            };
            set("idle", idle);
            set("in_use", (size - idle).max(0));
            self.max
                .get_or_create(&PoolLabels { pool: name })
                .set(i64::from(pool.options().get_max_connections()));
        }
    }

    /// A connection of `pool` (named `name` in the series), its wait timed and counted.
    pub async fn acquire(
        &self,
        name: &'static str,
        pool: &sqlx::PgPool,
    ) -> Result<sqlx::pool::PoolConnection<sqlx::Postgres>, sqlx::Error> {
        let started = Instant::now();
        let got = pool.acquire().await;
        let labels = PoolLabels { pool: name };
        self.waits
            .get_or_create(&labels)
            .observe(started.elapsed().as_secs_f64());
        if matches!(got, Err(sqlx::Error::PoolTimedOut)) {
            self.timeouts.get_or_create(&labels).inc();
        }
        got
    }

    /// [`PoolMetrics::acquire`] that begins a transaction on the connection (what
    /// `PgPool::begin` does, with the wait timed).
    pub async fn begin(
        &self,
        name: &'static str,
        pool: &sqlx::PgPool,
    ) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, sqlx::Error> {
        let conn = self.acquire(name, pool).await?;
        sqlx::Transaction::begin(conn, None).await
    }
}
