//! Per-volume and per-host counters (lock-free on the I/O path) and their
//! Prometheus text rendering.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use weir_qos::{Policy, VolumeStats};

use crate::hosts::{HostSession, HostTable};
use crate::qos::PoolGauges;
use crate::store::VolumeRecord;

/// Upper bounds of the latency histogram buckets, microseconds (then +Inf):
/// 10 µs to 10 s, 1-2.5-5 steps (a page-cache read takes 10-50 µs, a
/// throttled one seconds).
pub const LATENCY_BUCKETS_US: [u64; 19] = [
    10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000,
    500_000, 1_000_000, 2_500_000, 5_000_000, 10_000_000,
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
    qos_wait_ns: AtomicU64,
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
    /// Time requests waited in the QoS gate before their release (throttled by a
    /// limit, behind others' reservations and shares, or for a device slot).
    #[serde(default)]
    pub qos_wait_ns: u64,
    /// Counts per bucket of [`LATENCY_BUCKETS_US`] (not cumulative), the last one
    /// for > 10 s.
    pub latency_buckets: Vec<u64>,
}

impl CounterSnapshot {
    /// All requests (saturating: the CLI adds a server's figures, whatever they are).
    pub fn ios(&self) -> u64 {
        self.read_ios
            .saturating_add(self.write_ios)
            .saturating_add(self.other_ios)
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
        let i = LATENCY_BUCKETS_US.partition_point(|&b| b * 1000 < latency_ns);
        self.buckets[i].fetch_add(1, Relaxed);
    }

    /// A request left the QoS gate `wait_ns` after it arrived.
    pub fn record_qos_wait(&self, wait_ns: u64) {
        self.qos_wait_ns.fetch_add(wait_ns, Relaxed);
    }

    /// Adds `s` to these counters (a forgotten host's into `host="other"`).
    pub fn add(&self, s: &CounterSnapshot) {
        self.read_ios.fetch_add(s.read_ios, Relaxed);
        self.write_ios.fetch_add(s.write_ios, Relaxed);
        self.other_ios.fetch_add(s.other_ios, Relaxed);
        self.read_bytes.fetch_add(s.read_bytes, Relaxed);
        self.write_bytes.fetch_add(s.write_bytes, Relaxed);
        self.errors.fetch_add(s.errors, Relaxed);
        self.latency_sum_ns.fetch_add(s.latency_sum_ns, Relaxed);
        self.qos_wait_ns.fetch_add(s.qos_wait_ns, Relaxed);
        for (b, n) in self.buckets.iter().zip(&s.latency_buckets) {
            b.fetch_add(*n, Relaxed);
        }
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
            qos_wait_ns: self.qos_wait_ns.load(Relaxed),
            latency_buckets: self.buckets.iter().map(|b| b.load(Relaxed)).collect(),
        }
    }
}

/// All counters of a server.
#[derive(Default, Debug)]
pub struct Metrics {
    volumes: Mutex<BTreeMap<String, Arc<IoCounters>>>,
    hosts: HostTable,
}

/// What `/metrics` says of one volume besides its I/O counters: its record
/// (size, pool, policy name), its policy's figures and its scheduler's counts.
#[derive(Clone, Debug)]
pub struct VolumeView {
    pub record: VolumeRecord,
    pub policy: Option<Policy>,
    pub sched: VolumeStats,
}

/// Writes one metric family's `# HELP` and `# TYPE` lines.
fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// A sample value: integers as such, `+Inf`/`NaN` as Prometheus spells them.
fn value(v: f64) -> String {
    if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_string()
    } else if v.is_nan() {
        "NaN".to_string()
    } else {
        format!("{v}")
    }
}

type Figure = fn(&VolumeView) -> Option<f64>;

/// Per-volume gauges of the policy and the scheduler: (name, type, help, value;
/// `None`: no sample, e.g. no limit).
const VOLUME_FIGURES: [(&str, &str, &str, Figure); 12] = [
    (
        "weir_volume_size_bytes",
        "gauge",
        "The volume's size (what clients see).",
        |v| Some(v.record.size_bytes as f64),
    ),
    (
        "weir_volume_reservation_iops",
        "gauge",
        "IOPS its policy reserves (0: none).",
        |v| Some(v.policy.as_ref()?.reservation_iops.unwrap_or(0.0)),
    ),
    (
        "weir_volume_reservation_bytes_per_second",
        "gauge",
        "Bandwidth its policy reserves (0: none).",
        |v| Some(v.policy.as_ref()?.reservation_mbps.unwrap_or(0.0) * 1e6),
    ),
    (
        "weir_volume_limit_iops",
        "gauge",
        "IOPS its policy allows at most (no sample: unlimited).",
        |v| v.policy.as_ref()?.effective_limit_iops(),
    ),
    (
        "weir_volume_limit_bytes_per_second",
        "gauge",
        "Bandwidth its policy allows at most (no sample: unlimited).",
        |v| Some(v.policy.as_ref()?.limit_mbps? * 1e6),
    ),
    (
        "weir_volume_latency_target_seconds",
        "gauge",
        "Its policy's latency target (no sample: none).",
        |v| Some(v.policy.as_ref()?.latency_target_ms? / 1e3),
    ),
    (
        "weir_volume_shares",
        "gauge",
        "Its policy's shares (proportional weight under contention).",
        |v| Some(v.policy.as_ref()?.shares.get().into()),
    ),
    (
        "weir_volume_queued",
        "gauge",
        "Requests waiting in the QoS scheduler.",
        |v| Some(v.sched.queued as f64),
    ),
    (
        "weir_volume_dispatches_total",
        "counter",
        "Requests (or pieces) the QoS scheduler released to the backend.",
        |v| Some(v.sched.dispatched_ios as f64),
    ),
    (
        "weir_volume_reservation_dispatches_total",
        "counter",
        "Releases made to meet the volume's reservation (the rest went by shares).",
        |v| Some(v.sched.reservation_dispatches as f64),
    ),
    (
        "weir_volume_protected_dispatches_total",
        "counter",
        "Releases service-level protection moved ahead of the volume the share rule would have picked.",
        |v| Some(v.sched.protected_dispatches as f64),
    ),
    (
        "weir_volume_held_back_dispatches_total",
        "counter",
        "Releases made while protection held the volume's service level back (its floor: 1/16 of the cost released, for the levels held back together).",
        |v| Some(v.sched.held_back_dispatches as f64),
    ),
];

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
    /// A session of `host`: its QoS client id and counters (see [`HostTable`]).
    pub fn attach_host(&self, host: IpAddr) -> HostSession {
        self.hosts.attach(host)
    }
    /// Every remembered host's counters now, then the forgotten ones' sum (the
    /// sampler's per-host rates).
    pub fn host_snapshots(&self) -> Vec<(String, CounterSnapshot)> {
        self.hosts.snapshots()
    }

    /// Prometheus text exposition format (version 0.0.4): every volume of
    /// `volumes` (with zeros before its first I/O), every host seen, each pool's
    /// gate (`pools`: in flight, device depth limit, its ceiling, queued).
    pub fn render_prometheus(
        &self,
        volumes: &[VolumeView],
        pools: &BTreeMap<String, PoolGauges>,
    ) -> String {
        let vols: Vec<(String, CounterSnapshot)> = volumes
            .iter()
            .map(|v| {
                let name = &v.record.name;
                (
                    format!("volume=\"{}\"", escape(name)),
                    self.volume(name).snapshot(),
                )
            })
            .collect();
        let hosts: Vec<(String, CounterSnapshot)> = self
            .hosts
            .snapshots()
            .into_iter()
            .map(|(k, v)| (format!("host=\"{k}\""), v))
            .collect();
        let mut out = String::new();
        render_volume_info(&mut out, volumes);
        for (scope, rows) in [("volume", &vols), ("host", &hosts)] {
            render_counters(&mut out, scope, rows);
        }
        family(
            &mut out,
            "weir_volume_qos_wait_seconds_total",
            "counter",
            "Time requests waited in the QoS gate before release (throttled by a limit, behind reservations and shares, or for a device slot).",
        );
        for (l, s) in &vols {
            let wait_s = s.qos_wait_ns as f64 / 1e9;
            let _ = writeln!(out, "weir_volume_qos_wait_seconds_total{{{l}}} {wait_s}");
        }
        for (name, kind, help, figure) in VOLUME_FIGURES {
            family(&mut out, name, kind, help);
            for (v, (l, _)) in volumes.iter().zip(&vols) {
                if let Some(x) = figure(v) {
                    let _ = writeln!(out, "{name}{{{l}}} {}", value(x));
                }
            }
        }
        family(
            &mut out,
            "weir_hosts_forgotten_total",
            "counter",
            "Client addresses forgotten to keep the host table bounded (their counters are summed under host=\"other\").",
        );
        let _ = writeln!(out, "weir_hosts_forgotten_total {}", self.hosts.forgotten());
        render_pools(&mut out, pools);
        out
    }
}

/// `weir_volume_info`: 1 per volume, its pool, policy and service level as
/// labels (join on `volume` to group any per-volume series by them).
fn render_volume_info(out: &mut String, volumes: &[VolumeView]) {
    family(
        out,
        "weir_volume_info",
        "gauge",
        "1 per volume; labels: pool, policy, service level, mode (rw or ro).",
    );
    for v in volumes {
        let r = &v.record;
        let level = v
            .policy
            .as_ref()
            .and_then(|p| p.service_level)
            .map_or("none", |l| l.name());
        let mode = if r.read_only { "ro" } else { "rw" };
        let _ = writeln!(
            out,
            "weir_volume_info{{volume=\"{}\",pool=\"{}\",policy=\"{}\",service_level=\"{level}\",mode=\"{mode}\"}} 1",
            escape(&r.name),
            escape(&r.pool),
            escape(&r.policy)
        );
    }
}

/// I/O, byte and error counters and the latency histogram of each row.
fn render_counters(out: &mut String, scope: &str, rows: &[(String, CounterSnapshot)]) {
    family(
        out,
        &format!("weir_{scope}_ios_total"),
        "counter",
        "I/Os completed, by operation.",
    );
    for (l, s) in rows {
        for (op, n) in [
            ("read", s.read_ios),
            ("write", s.write_ios),
            ("other", s.other_ios),
        ] {
            let _ = writeln!(out, "weir_{scope}_ios_total{{{l},op=\"{op}\"}} {n}");
        }
    }
    family(
        out,
        &format!("weir_{scope}_bytes_total"),
        "counter",
        "Bytes moved, by direction.",
    );
    for (l, s) in rows {
        for (op, n) in [("read", s.read_bytes), ("write", s.write_bytes)] {
            let _ = writeln!(out, "weir_{scope}_bytes_total{{{l},op=\"{op}\"}} {n}");
        }
    }
    family(
        out,
        &format!("weir_{scope}_errors_total"),
        "counter",
        "Requests answered with an error.",
    );
    for (l, s) in rows {
        let _ = writeln!(out, "weir_{scope}_errors_total{{{l}}} {}", s.errors);
    }
    family(
        out,
        &format!("weir_{scope}_latency_seconds"),
        "histogram",
        "Request latency (QoS queueing included).",
    );
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

fn render_pools(out: &mut String, pools: &BTreeMap<String, PoolGauges>) {
    type Gauge = fn(&PoolGauges) -> Option<u64>;
    let gauges: [(&str, &str, Gauge); 7] = [
        (
            "in_flight",
            "Pieces the pool's QoS gate has at the backend now.",
            |g| Some(g.in_flight.into()),
        ),
        (
            "depth_limit",
            "The pool's device in-flight limit now (adaptive depth, gateway window).",
            |g| Some(g.depth_limit.into()),
        ),
        (
            "max_in_flight",
            "The pool's max_in_flight (the depth limit's ceiling).",
            |g| Some(g.max_in_flight.into()),
        ),
        ("queued", "Requests waiting in the pool's QoS gate.", |g| {
            Some(g.queued as u64)
        }),
        (
            "gateway_window",
            "This gateway's window on the datastore it shares (gateway_congestion).",
            |g| g.gateway_window.map(u64::from),
        ),
        (
            "gateway_shares",
            "The shares the gateway window steps with (volumes active last period).",
            |g| g.gateway_shares,
        ),
        (
            "gateway_rate",
            "The fair rate this gateway paces to, cost units per second \
             (gateway_congestion.fair_rate, while paced).",
            |g| g.gateway_rate.map(|r| r.round() as u64),
        ),
    ];
    for (name, help, get) in gauges {
        if pools.values().all(|g| get(g).is_none()) {
            continue;
        }
        family(out, &format!("weir_pool_{name}"), "gauge", help);
        for (pool, g) in pools {
            if let Some(v) = get(g) {
                let _ = writeln!(out, "weir_pool_{name}{{pool=\"{}\"}} {v}", escape(pool));
            }
        }
    }
}

/// The commit the running binary was built from, set once by the program that
/// embeds the server (`weir` knows it from its build script); "unknown" if not.
static BUILD_COMMIT: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Records the commit `weir_build_info` reports (the first call wins).
pub fn set_build_commit(commit: &str) {
    let _ = BUILD_COMMIT.set(commit.to_string());
}

pub fn build_commit() -> &'static str {
    BUILD_COMMIT.get().map_or("unknown", String::as_str)
}

/// `weir_build_info` and the standard `process_*` metrics (CPU time, memory,
/// descriptors, threads, start time) from `/proc/self`.
pub fn render_process() -> String {
    let mut out = String::new();
    family(
        &mut out,
        "weir_build_info",
        "gauge",
        "1; labels: the server's version and commit.",
    );
    let _ = writeln!(
        out,
        "weir_build_info{{version=\"{}\",commit=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION"),
        escape(build_commit())
    );
    let Some(p) = ProcessFigures::read() else {
        return out;
    };
    let rows: [(&str, &str, &str, f64); 7] = [
        (
            "process_cpu_seconds_total",
            "counter",
            "Total user and system CPU time spent in seconds.",
            p.cpu_seconds,
        ),
        (
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes.",
            p.resident_bytes,
        ),
        (
            "process_virtual_memory_bytes",
            "gauge",
            "Virtual memory size in bytes.",
            p.virtual_bytes,
        ),
        (
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since unix epoch in seconds.",
            p.start_time_s,
        ),
        (
            "process_open_fds",
            "gauge",
            "Number of open file descriptors.",
            p.open_fds,
        ),
        (
            "process_max_fds",
            "gauge",
            "Maximum number of open file descriptors.",
            p.max_fds,
        ),
        (
            "process_threads",
            "gauge",
            "Number of OS threads in the process.",
            p.threads,
        ),
    ];
    for (name, kind, help, v) in rows {
        family(&mut out, name, kind, help);
        let _ = writeln!(out, "{name} {}", value(v));
    }
    out
}

/// What `/proc/self` says of this process.
struct ProcessFigures {
    cpu_seconds: f64,
    resident_bytes: f64,
    virtual_bytes: f64,
    start_time_s: f64,
    open_fds: f64,
    max_fds: f64,
    threads: f64,
}

impl ProcessFigures {
    fn read() -> Option<ProcessFigures> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // Fields after the command name (which may hold spaces), from field 3.
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let field = |n: usize| fields.get(n - 3)?.parse::<f64>().ok();
        // SAFETY: sysconf reads a constant of the system.
        let (ticks, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK) as f64,
                libc::sysconf(libc::_SC_PAGESIZE) as f64,
            )
        };
        let boot_s = std::fs::read_to_string("/proc/stat")
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("btime "))?
            .trim()
            .parse::<f64>()
            .ok()?;
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes the struct it is given.
        let max_fds = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
            limit.rlim_cur as f64
        } else {
            f64::NAN
        };
        let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as f64;
        Some(ProcessFigures {
            cpu_seconds: (field(14)? + field(15)?) / ticks,
            threads: field(20)?,
            start_time_s: boot_s + field(22)? / ticks,
            virtual_bytes: field(23)?,
            resident_bytes: field(24)? * page,
            open_fds,
            max_fds,
        })
    }
}

pub(crate) fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(name: &str, policy: Policy, queued: usize) -> VolumeView {
        VolumeView {
            record: VolumeRecord {
                id: 1,
                name: name.into(),
                pool: "default".into(),
                size_bytes: 1 << 30,
                policy: policy.name.clone(),
                access_groups: vec![],
                read_only: false,
                description: String::new(),
                layer: None,
                origin: None,
                cache: Default::default(),
                exclusive_lease: None,
            },
            policy: Some(policy),
            sched: VolumeStats {
                queued,
                ..VolumeStats::default()
            },
        }
    }

    #[test]
    fn counters_and_prometheus_text() {
        let m = Metrics::default();
        let v = m.volume("sql");
        v.record(OpKind::Read, 4096, 80_000, true); // 80 µs
        v.record(OpKind::Write, 8192, 3_000_000, false); // 3 ms
        v.record(OpKind::Read, 4096, 7_000, true); // 7 µs: the 10 µs bucket
        m.attach_host("127.0.0.1".parse().unwrap()).counters.record(
            OpKind::Other,
            0,
            20_000_000_000,
            true,
        );
        let s = v.snapshot();
        assert_eq!(
            (
                s.read_ios,
                s.write_ios,
                s.read_bytes,
                s.write_bytes,
                s.errors
            ),
            (2, 1, 8192, 8192, 1)
        );
        assert_eq!(s.latency_buckets.len(), LATENCY_BUCKETS_US.len() + 1);
        assert_eq!(s.latency_buckets[0], 1);
        assert_eq!(s.latency_buckets[3], 1);
        assert_eq!(s.latency_buckets[8], 1);
        let pools = BTreeMap::from([(
            "default".to_string(),
            PoolGauges {
                in_flight: 5,
                depth_limit: 48,
                max_in_flight: 64,
                queued: 7,
                gateway_window: Some(21),
                gateway_shares: Some(3000),
                gateway_rate: Some(1234.4),
            },
        )]);
        let gold = Policy {
            name: "gold".into(),
            reservation_iops: Some(5000.0),
            limit_mbps: Some(200.0),
            ..Policy::best_effort("gold")
        };
        let volumes = [
            view("sql", gold, 3),
            view("idle", Policy::best_effort("plain"), 0),
        ];
        let text = m.render_prometheus(&volumes, &pools);
        assert!(text.contains("weir_pool_in_flight{pool=\"default\"} 5"));
        assert!(text.contains("weir_pool_depth_limit{pool=\"default\"} 48"));
        assert!(text.contains("weir_pool_max_in_flight{pool=\"default\"} 64"));
        assert!(text.contains("# TYPE weir_pool_queued gauge"));
        assert!(text.contains("weir_pool_gateway_window{pool=\"default\"} 21"));
        assert!(text.contains("weir_pool_gateway_shares{pool=\"default\"} 3000"));
        assert!(text.contains("weir_pool_gateway_rate{pool=\"default\"} 1234"));
        assert!(text.contains("weir_volume_ios_total{volume=\"sql\",op=\"read\"} 2"));
        assert!(
            text.contains("weir_volume_latency_seconds_bucket{volume=\"sql\",le=\"0.00001\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("weir_volume_latency_seconds_bucket{volume=\"sql\",le=\"0.0001\"} 2")
        );
        assert!(text.contains("weir_volume_latency_seconds_bucket{volume=\"sql\",le=\"0.005\"} 3"));
        assert!(text.contains("weir_volume_latency_seconds_bucket{volume=\"sql\",le=\"10\"} 3"));
        assert!(text.contains("weir_volume_latency_seconds_count{volume=\"sql\"} 3"));
        assert!(text.contains("weir_host_latency_seconds_bucket{host=\"127.0.0.1\",le=\"10\"} 0"));
        assert!(
            text.contains("weir_host_latency_seconds_bucket{host=\"127.0.0.1\",le=\"+Inf\"} 1")
        );
        assert!(text.contains("weir_volume_queued{volume=\"sql\"} 3"));
        // A volume without I/O has every series, at zero.
        assert!(text.contains("weir_volume_ios_total{volume=\"idle\",op=\"write\"} 0"));
        assert!(text.contains("weir_volume_queued{volume=\"idle\"} 0"));
        assert!(text.contains("weir_volume_size_bytes{volume=\"idle\"} 1073741824"));
        assert!(text.contains(
            "weir_volume_info{volume=\"sql\",pool=\"default\",policy=\"gold\",service_level=\"none\",mode=\"rw\"} 1"
        ));
        assert!(text.contains("weir_volume_reservation_iops{volume=\"sql\"} 5000"));
        assert!(text.contains("weir_volume_reservation_iops{volume=\"idle\"} 0"));
        assert!(text.contains("weir_volume_limit_bytes_per_second{volume=\"sql\"} 200000000"));
        assert!(!text.contains("weir_volume_limit_bytes_per_second{volume=\"idle\"}"));
        assert!(text.contains("weir_volume_qos_wait_seconds_total{volume=\"idle\"} 0"));
    }

    #[test]
    fn build_info_and_process_metrics() {
        // CPU time counts in clock ticks (10 ms): a test run alone may not have
        // used one yet, so work until it has (at most 5 s).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut x = 1u64;
        while render_process().contains("process_cpu_seconds_total 0\n")
            && std::time::Instant::now() < deadline
        {
            for _ in 0..1_000_000 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
        }
        let text = render_process();
        assert!(text.contains("weir_build_info{version=\""), "{text}");
        for name in [
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
            "process_open_fds",
            "process_max_fds",
            "process_start_time_seconds",
        ] {
            let line = text
                .lines()
                .find(|l| l.starts_with(&format!("{name} ")))
                .unwrap_or_else(|| panic!("no {name} in {text}"));
            let v: f64 = line.split(' ').nth(1).unwrap().parse().unwrap();
            assert!(v > 0.0, "{line}");
        }
    }
}
