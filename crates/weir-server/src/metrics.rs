//! Per-volume and per-host counters (lock-free on the I/O path) and their
//! Prometheus text rendering.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::qos::PoolGauges;

/// Upper bounds of the latency histogram buckets, microseconds (then +Inf).
pub const LATENCY_BUCKETS_US: [u64; 15] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000,
];

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum OpKind {
    Read,
    Write,
    /// Flush, trim, write zeroes, cache, block status.
    Other,
}

#[derive(Default, Debug)]
pub struct IoCounters {
    read_ios: AtomicU64,
    write_ios: AtomicU64,
    other_ios: AtomicU64,
    read_bytes: AtomicU64,
    write_bytes: AtomicU64,
    errors: AtomicU64,
    latency_sum_ns: AtomicU64,
    buckets: [AtomicU64; LATENCY_BUCKETS_US.len() + 1],
}

/// A copy of the counters at one moment (JSON of the stats endpoint).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CounterSnapshot {
    pub read_ios: u64,
    pub write_ios: u64,
    pub other_ios: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub errors: u64,
    pub latency_sum_ns: u64,
    /// Counts per bucket (not cumulative), the last one for > 2.5 s.
    pub latency_buckets: Vec<u64>,
}

impl CounterSnapshot {
    pub fn ios(&self) -> u64 {
        self.read_ios + self.write_ios + self.other_ios
    }
    pub fn mean_latency_ms(&self) -> f64 {
        if self.ios() == 0 {
            0.0
        } else {
            self.latency_sum_ns as f64 / self.ios() as f64 / 1e6
        }
    }
}

impl IoCounters {
    pub fn record(&self, kind: OpKind, bytes: u64, latency_ns: u64, ok: bool) {
        match kind {
            OpKind::Read => {
                self.read_ios.fetch_add(1, Relaxed);
                self.read_bytes.fetch_add(bytes, Relaxed);
            }
            OpKind::Write => {
                self.write_ios.fetch_add(1, Relaxed);
                self.write_bytes.fetch_add(bytes, Relaxed);
            }
            OpKind::Other => {
                self.other_ios.fetch_add(1, Relaxed);
            }
        }
        if !ok {
            self.errors.fetch_add(1, Relaxed);
        }
        self.latency_sum_ns.fetch_add(latency_ns, Relaxed);
        let us = latency_ns / 1000;
        let i = LATENCY_BUCKETS_US
            .iter()
            .position(|&b| us <= b)
            .unwrap_or(LATENCY_BUCKETS_US.len());
        self.buckets[i].fetch_add(1, Relaxed);
    }

    pub fn snapshot(&self) -> CounterSnapshot {
        CounterSnapshot {
            read_ios: self.read_ios.load(Relaxed),
            write_ios: self.write_ios.load(Relaxed),
            other_ios: self.other_ios.load(Relaxed),
            read_bytes: self.read_bytes.load(Relaxed),
            write_bytes: self.write_bytes.load(Relaxed),
            errors: self.errors.load(Relaxed),
            latency_sum_ns: self.latency_sum_ns.load(Relaxed),
            latency_buckets: self.buckets.iter().map(|b| b.load(Relaxed)).collect(),
        }
    }
}

/// All counters of a server.
#[derive(Default, Debug)]
pub struct Metrics {
    volumes: Mutex<BTreeMap<String, Arc<IoCounters>>>,
    hosts: Mutex<BTreeMap<IpAddr, Arc<IoCounters>>>,
}

impl Metrics {
    pub fn volume(&self, name: &str) -> Arc<IoCounters> {
        let mut v = self.volumes.lock().unwrap_or_else(|e| e.into_inner());
        v.entry(name.to_string()).or_default().clone()
    }
    pub fn forget_volume(&self, name: &str) {
        self.volumes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
    }
    pub fn host(&self, host: IpAddr) -> Arc<IoCounters> {
        let mut h = self.hosts.lock().unwrap_or_else(|e| e.into_inner());
        h.entry(host).or_default().clone()
    }
    /// Every host's counters now (the sampler's per-host rates).
    pub fn host_snapshots(&self) -> Vec<(IpAddr, CounterSnapshot)> {
        let h = self.hosts.lock().unwrap_or_else(|e| e.into_inner());
        h.iter().map(|(ip, c)| (*ip, c.snapshot())).collect()
    }

    /// Prometheus text exposition format (version 0.0.4), with the gauges of
    /// each volume (`queued`: requests waiting in its pool's gate) and each pool's
    /// gate (`pools`: in flight, device depth limit, its ceiling, queued).
    pub fn render_prometheus(
        &self,
        queued: &BTreeMap<String, usize>,
        pools: &BTreeMap<String, PoolGauges>,
    ) -> String {
        let volumes: Vec<(String, CounterSnapshot)> = self
            .volumes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(k, v)| (format!("volume=\"{}\"", escape(k)), v.snapshot()))
            .collect();
        let hosts: Vec<(String, CounterSnapshot)> = self
            .hosts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(k, v)| (format!("host=\"{k}\""), v.snapshot()))
            .collect();
        let mut out = String::new();
        for (scope, rows) in [("volume", &volumes), ("host", &hosts)] {
            let _ = writeln!(
                out,
                "# HELP weir_{scope}_ios_total I/Os completed, by operation."
            );
            let _ = writeln!(out, "# TYPE weir_{scope}_ios_total counter");
            for (l, s) in rows {
                let _ = writeln!(
                    out,
                    "weir_{scope}_ios_total{{{l},op=\"read\"}} {}",
                    s.read_ios
                );
                let _ = writeln!(
                    out,
                    "weir_{scope}_ios_total{{{l},op=\"write\"}} {}",
                    s.write_ios
                );
                let _ = writeln!(
                    out,
                    "weir_{scope}_ios_total{{{l},op=\"other\"}} {}",
                    s.other_ios
                );
            }
            let _ = writeln!(
                out,
                "# HELP weir_{scope}_bytes_total Bytes moved, by direction."
            );
            let _ = writeln!(out, "# TYPE weir_{scope}_bytes_total counter");
            for (l, s) in rows {
                let _ = writeln!(
                    out,
                    "weir_{scope}_bytes_total{{{l},op=\"read\"}} {}",
                    s.read_bytes
                );
                let _ = writeln!(
                    out,
                    "weir_{scope}_bytes_total{{{l},op=\"write\"}} {}",
                    s.write_bytes
                );
            }
            let _ = writeln!(
                out,
                "# HELP weir_{scope}_errors_total Requests answered with an error."
            );
            let _ = writeln!(out, "# TYPE weir_{scope}_errors_total counter");
            for (l, s) in rows {
                let _ = writeln!(out, "weir_{scope}_errors_total{{{l}}} {}", s.errors);
            }
            let _ = writeln!(
                out,
                "# HELP weir_{scope}_latency_seconds Request latency (QoS queueing included)."
            );
            let _ = writeln!(out, "# TYPE weir_{scope}_latency_seconds histogram");
            for (l, s) in rows {
                let mut cumulative = 0;
                for (i, count) in s.latency_buckets.iter().enumerate() {
                    cumulative += count;
                    let le = match LATENCY_BUCKETS_US.get(i) {
                        Some(us) => format!("{}", *us as f64 / 1e6),
                        None => "+Inf".to_string(),
                    };
                    let _ = writeln!(
                        out,
                        "weir_{scope}_latency_seconds_bucket{{{l},le=\"{le}\"}} {cumulative}"
                    );
                }
                let _ = writeln!(
                    out,
                    "weir_{scope}_latency_seconds_sum{{{l}}} {}",
                    s.latency_sum_ns as f64 / 1e9
                );
                let _ = writeln!(out, "weir_{scope}_latency_seconds_count{{{l}}} {}", s.ios());
            }
        }
        let _ = writeln!(
            out,
            "# HELP weir_volume_queued Requests waiting in the QoS scheduler."
        );
        let _ = writeln!(out, "# TYPE weir_volume_queued gauge");
        for (name, q) in queued {
            let _ = writeln!(out, "weir_volume_queued{{volume=\"{}\"}} {q}", escape(name));
        }
        type Gauge = fn(&PoolGauges) -> u64;
        let gauges: [(&str, &str, Gauge); 4] = [
            (
                "in_flight",
                "Pieces the pool's QoS gate has at the backend now.",
                |g| g.in_flight.into(),
            ),
            (
                "depth_limit",
                "The pool's device in-flight limit now (adaptive depth).",
                |g| g.depth_limit.into(),
            ),
            (
                "max_in_flight",
                "The pool's max_in_flight (the depth limit's ceiling).",
                |g| g.max_in_flight.into(),
            ),
            ("queued", "Requests waiting in the pool's QoS gate.", |g| {
                g.queued as u64
            }),
        ];
        for (name, help, value) in gauges {
            let _ = writeln!(out, "# HELP weir_pool_{name} {help}");
            let _ = writeln!(out, "# TYPE weir_pool_{name} gauge");
            for (pool, g) in pools {
                let _ = writeln!(
                    out,
                    "weir_pool_{name}{{pool=\"{}\"}} {}",
                    escape(pool),
                    value(g)
                );
            }
        }
        out
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_and_prometheus_text() {
        let m = Metrics::default();
        let v = m.volume("sql");
        v.record(OpKind::Read, 4096, 80_000, true); // 80 µs
        v.record(OpKind::Write, 8192, 3_000_000, false); // 3 ms
        m.host("127.0.0.1".parse().unwrap())
            .record(OpKind::Other, 0, 10_000_000_000, true);
        let s = v.snapshot();
        assert_eq!(
            (
                s.read_ios,
                s.write_ios,
                s.read_bytes,
                s.write_bytes,
                s.errors
            ),
            (1, 1, 4096, 8192, 1)
        );
        assert_eq!(s.latency_buckets[1], 1);
        assert_eq!(s.latency_buckets[6], 1);
        let pools = BTreeMap::from([(
            "default".to_string(),
            PoolGauges {
                in_flight: 5,
                depth_limit: 48,
                max_in_flight: 64,
                queued: 7,
            },
        )]);
        let text = m.render_prometheus(&BTreeMap::from([("sql".to_string(), 3)]), &pools);
        assert!(text.contains("weir_pool_in_flight{pool=\"default\"} 5"));
        assert!(text.contains("weir_pool_depth_limit{pool=\"default\"} 48"));
        assert!(text.contains("weir_pool_max_in_flight{pool=\"default\"} 64"));
        assert!(text.contains("# TYPE weir_pool_queued gauge"));
        assert!(text.contains("weir_volume_ios_total{volume=\"sql\",op=\"read\"} 1"));
        assert!(
            text.contains("weir_volume_latency_seconds_bucket{volume=\"sql\",le=\"0.0001\"} 1")
        );
        assert!(text.contains("weir_volume_latency_seconds_bucket{volume=\"sql\",le=\"0.005\"} 2"));
        assert!(text.contains("weir_volume_latency_seconds_count{volume=\"sql\"} 2"));
        assert!(
            text.contains("weir_host_latency_seconds_bucket{host=\"127.0.0.1\",le=\"+Inf\"} 1")
        );
        assert!(text.contains("weir_volume_queued{volume=\"sql\"} 3"));
    }
}
