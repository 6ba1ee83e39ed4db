-- rdma_ab results are judged on the ratio of their legs' bus bandwidth in the large band
-- (metric rdma_speedup; docs/health.md, "RDMA against sockets"), which operators tune
-- with an expectation like any other figure.
ALTER TABLE expectations DROP CONSTRAINT expectations_metric_check;
ALTER TABLE expectations ADD CONSTRAINT expectations_metric_check
    CHECK (metric IN ('busbw_gbs', 'algbw_gbs', 'time_us', 'rdma_speedup'));
