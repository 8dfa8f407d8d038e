//! Counters and latency histograms, turned into a `ScenarioReport` at the end.

use hdrhistogram::Histogram;
use weir_report::{IoCounts, LatencySummary, TimelineSeries, WorkloadResult};
use weir_workload::Direction;

/// Latencies are recorded in microseconds, up to an hour.
const MAX_LATENCY_US: u64 = 3_600_000_000;
/// Per-VM timelines are kept when there are at most this many VMs.
pub const MAX_VM_TIMELINES: usize = 16;

fn histogram(sigfig: u8) -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_US, sigfig).expect("valid histogram bounds")
}

#[derive(Clone, Debug)]
pub struct Counters {
    pub reads: u64,
    pub writes: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub errors: u64,
    pub mismatched_reads: u64,
    pub latency_us: Histogram<u64>,
}

impl Counters {
    pub fn new(sigfig: u8) -> Counters {
        Counters {
            reads: 0,
            writes: 0,
            read_bytes: 0,
            write_bytes: 0,
            errors: 0,
            mismatched_reads: 0,
            latency_us: histogram(sigfig),
        }
    }

    /// One request that ended: a success counts as an I/O (its bytes and latency); a
    /// failure (error reply, no reply, lost connection) only as an error.
    pub fn record(&mut self, dir: Direction, bytes: u64, latency_us: u64, ok: bool) {
        if !ok {
            self.errors += 1;
            return;
        }
        match dir {
            Direction::Read => {
                self.reads += 1;
                self.read_bytes += bytes;
            }
            Direction::Write => {
                self.writes += 1;
                self.write_bytes += bytes;
            }
        }
        self.latency_us
            .saturating_record(latency_us.clamp(1, MAX_LATENCY_US));
    }

    pub fn ios(&self) -> u64 {
        self.reads + self.writes
    }

    pub fn result(&self, name: &str, duration_s: f64) -> WorkloadResult {
        let counts = IoCounts {
            ios: self.ios(),
            reads: self.reads,
            writes: self.writes,
            bytes: self.read_bytes + self.write_bytes,
            errors: self.errors + self.mismatched_reads,
        };
        let h = &self.latency_us;
        let ms = |us: f64| us / 1000.0;
        WorkloadResult::from_counts(name.to_string(), duration_s, counts, || LatencySummary {
            mean: ms(h.mean()),
            p50: ms(h.value_at_quantile(0.50) as f64),
            p95: ms(h.value_at_quantile(0.95) as f64),
            p99: ms(h.value_at_quantile(0.99) as f64),
            max: ms(h.max() as f64),
        })
    }
}

/// One interval of the timeline.
#[derive(Clone, Debug)]
pub struct Interval {
    pub ios: u64,
    pub reads: u64,
    pub writes: u64,
    pub bytes: u64,
    pub errors: u64,
    /// VMs with at least one completion in the interval.
    pub active_vms: u64,
    /// Actual length, s (the last interval of a run may be shorter); 0: the nominal one.
    pub length_s: f64,
    pub latency_us: Histogram<u64>,
    pub vm_ios: Vec<u64>,
}

impl Interval {
    pub fn new(vms: usize) -> Interval {
        Interval {
            ios: 0,
            reads: 0,
            writes: 0,
            bytes: 0,
            errors: 0,
            active_vms: 0,
            length_s: 0.0,
            latency_us: histogram(2),
            vm_ios: vec![0; if vms <= MAX_VM_TIMELINES { vms } else { 0 }],
        }
    }
}

impl Interval {
    /// One request that ended in this interval (VM `vm`): as [`Counters::record`],
    /// a failure is only an error.
    pub fn record(&mut self, vm: usize, dir: Direction, bytes: u64, latency_us: u64, ok: bool) {
        if !ok {
            self.errors += 1;
            return;
        }
        self.ios += 1;
        self.bytes += bytes;
        match dir {
            Direction::Read => self.reads += 1,
            Direction::Write => self.writes += 1,
        }
        self.latency_us.saturating_record(latency_us.max(1));
        if let Some(v) = self.vm_ios.get_mut(vm) {
            *v += 1;
        }
    }
}

/// Whole-run timeline series from the closed intervals.
pub fn timeline(
    intervals: &[Interval],
    interval_s: f64,
    vm_names: &[String],
) -> Vec<TimelineSeries> {
    let len = |i: &Interval| {
        if i.length_s > 0.0 {
            i.length_s
        } else {
            interval_s
        }
    };
    let series = |name: &str, unit: &str, f: &dyn Fn(&Interval) -> f64| TimelineSeries {
        name: name.to_string(),
        unit: unit.to_string(),
        interval_s,
        values: intervals.iter().map(f).collect(),
    };
    let lat = |q: f64| {
        move |i: &Interval| {
            if i.latency_us.is_empty() {
                f64::NAN
            } else if q == 0.0 {
                i.latency_us.mean() / 1000.0
            } else {
                i.latency_us.value_at_quantile(q) as f64 / 1000.0
            }
        }
    };
    let mut out = vec![
        series("total IOPS", "IOPS", &|i| i.ios as f64 / len(i)),
        series("total MB/s", "MB/s", &|i| i.bytes as f64 / 1e6 / len(i)),
        series("read IOPS", "IOPS", &|i| i.reads as f64 / len(i)),
        series("write IOPS", "IOPS", &|i| i.writes as f64 / len(i)),
        series("total latency mean ms", "ms", &lat(0.0)),
        series("total latency p99 ms", "ms", &lat(0.99)),
        series("errors", "count", &|i| i.errors as f64),
    ];
    if vm_names.len() <= MAX_VM_TIMELINES && vm_names.len() > 1 {
        for (k, name) in vm_names.iter().enumerate() {
            out.push(series(&format!("{name} IOPS"), "IOPS", &|i| {
                i.vm_ios.get(k).copied().unwrap_or(0) as f64 / len(i)
            }));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_from_counters() {
        let mut c = Counters::new(3);
        for us in [100, 200, 300, 400] {
            c.record(Direction::Read, 4096, us, true);
        }
        c.record(Direction::Write, 8192, 1000, true);
        let r = c.result("vm", 2.0);
        assert_eq!(r.ios, 5);
        assert_eq!(r.iops, 2.5);
        assert_eq!(r.read_iops, 2.0);
        assert!((r.mbps - (4.0 * 4096.0 + 8192.0) / 1e6 / 2.0).abs() < 1e-12);
        assert!(
            (r.latency_ms.mean - 0.4).abs() < 0.001,
            "{:?}",
            r.latency_ms
        );
        assert!((r.latency_ms.max - 1.0).abs() < 0.002);
        let empty = Counters::new(2).result("idle", 1.0);
        assert!(empty.latency_ms.p99.is_nan());
        assert_eq!(empty.iops, 0.0);
    }

    /// Failed requests (error replies, no reply at the drain) are errors only: no
    /// IOPS, bytes or latency of their own.
    #[test]
    fn failures_are_errors_not_completions() {
        let mut c = Counters::new(3);
        c.record(Direction::Read, 4096, 500, true);
        for _ in 0..1000 {
            c.record(Direction::Write, 65536, 12_000_000, false);
        }
        let r = c.result("vm", 1.0);
        assert_eq!((r.ios, r.errors), (1, 1000));
        assert_eq!((r.iops, r.write_iops), (1.0, 0.0));
        assert!((r.mbps - 4096.0 / 1e6).abs() < 1e-12, "{}", r.mbps);
        assert!((r.latency_ms.max - 0.5).abs() < 0.01, "{:?}", r.latency_ms);
        let mut all_failed = Counters::new(2);
        all_failed.record(Direction::Read, 4096, 300, false);
        let r = all_failed.result("vm", 1.0);
        assert_eq!((r.ios, r.errors, r.mbps), (0, 1, 0.0));
        assert!(r.latency_ms.mean.is_nan());
        let mut iv = Interval::new(2);
        iv.record(1, Direction::Read, 4096, 300, true);
        iv.record(1, Direction::Write, 4096, 12_000_000, false);
        assert_eq!((iv.ios, iv.writes, iv.bytes, iv.errors), (1, 0, 4096, 1));
        assert_eq!(iv.vm_ios, vec![0, 1]);
        assert_eq!(iv.latency_us.len(), 1);
    }

    #[test]
    fn timeline_series_per_interval() {
        let mut a = Interval::new(2);
        a.ios = 10;
        a.bytes = 2_000_000;
        a.vm_ios = vec![4, 6];
        a.latency_us.record(1500).unwrap();
        let b = Interval::new(2);
        let mut short = Interval::new(2);
        short.ios = 5;
        short.length_s = 0.25;
        let t = timeline(&[a, b, short], 0.5, &["x".into(), "y".into()]);
        let get = |n: &str| t.iter().find(|s| s.name == n).unwrap().values.clone();
        assert_eq!(
            get("total IOPS"),
            vec![20.0, 0.0, 20.0],
            "a short last interval"
        );
        assert_eq!(get("total MB/s"), vec![4.0, 0.0, 0.0]);
        assert_eq!(get("y IOPS"), vec![12.0, 0.0, 0.0]);
        let mean = get("total latency mean ms");
        assert!((mean[0] - 1.5).abs() < 0.02 && mean[1].is_nan());
    }
}
