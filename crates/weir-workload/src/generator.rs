//! Request generators.

use crate::{AccessSpec, Direction, Nanos, WorkloadError};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// One request a worker issues.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct IoRequest {
    pub offset_bytes: u64,
    pub size_bytes: u32,
    pub dir: Direction,
}

/// What a polled worker does now.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Issue {
    /// Issue this request now (poll again for more).
    Io(IoRequest),
    /// Nothing before this time (a burst delay, a think time): poll again then.
    At(Nanos),
    /// Nothing until one of this worker's requests completes.
    Blocked,
}

/// A source of requests, one independent stream per worker.
///
/// Driver contract: poll a worker at start, at the time it last asked for with
/// [`Issue::At`], and after each of its requests ends (reporting it first with
/// `on_complete`, or `on_failure` when it failed); keep polling while it answers
/// [`Issue::Io`]. `outstanding` is the number of this worker's requests in flight.
pub trait IoGenerator {
    fn workers(&self) -> u32;
    fn poll(&mut self, now_ns: Nanos, worker: u32, outstanding: u32) -> Issue;
    /// One of the worker's requests finished (think-time models start their timer here).
    fn on_complete(&mut self, now_ns: Nanos, worker: u32, request: &IoRequest, latency_ns: Nanos);
    /// One of the worker's requests failed (an error reply, no reply, a lost
    /// connection): what it was part of fails for the model's user too (an order,
    /// an RPC, a login), and the model counts it so, never as done.
    fn on_failure(&mut self, now_ns: Nanos, worker: u32, request: &IoRequest);

    /// What the model's users experienced over `[from_ns, to_ns)` of the driver's
    /// clock (orders per minute, RPC latency, login times, VSImax…). Plain access
    /// specifications report none.
    fn metrics(&self, _from_ns: Nanos, _to_ns: Nanos) -> Vec<crate::ModelMetric> {
        Vec::new()
    }

    /// The part of the volume every worker reads identically (a golden image shared
    /// by linked clones), for clone-aware caches.
    fn shared_region(&self) -> Option<crate::SharedRegion> {
        None
    }

    /// Which clone (desktop) a worker's current request belongs to: a cache that is
    /// not clone-aware keeps one copy of a shared block per clone.
    fn clone_of(&self, worker: u32) -> u32 {
        worker
    }

    /// Whether a host-side read cache may keep this offset (000 cached the database
    /// drive, not the log drive).
    fn host_cacheable(&self, _offset_bytes: u64) -> bool {
        true
    }

    /// The orchestrated operations this instance ran so far (clone creations,
    /// power-ons, logins), so that a driver can measure a model's schedule across
    /// all its instances ([`ScheduleLog::merge`]). Plain access specifications and
    /// models without such a schedule have none.
    fn schedule(&self) -> Option<ScheduleLog> {
        None
    }
}

/// What a model's orchestrator did: spans of the operations it limits to a number
/// at a time, and the start of each login. `end` is `Nanos::MAX` for an operation
/// still running.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ScheduleLog {
    /// `(start, end)` of each clone creation.
    pub creates: Vec<(Nanos, Nanos)>,
    /// `(start, end)` of each power-on (boot).
    pub power_ons: Vec<(Nanos, Nanos)>,
    /// When each login started.
    pub login_starts: Vec<Nanos>,
}

impl ScheduleLog {
    /// Adds another instance's log.
    pub fn merge(&mut self, other: &ScheduleLog) {
        self.creates.extend_from_slice(&other.creates);
        self.power_ons.extend_from_slice(&other.power_ons);
        self.login_starts.extend_from_slice(&other.login_starts);
    }
}

/// The most spans open at one time among `spans` clipped to `[from, to)`. A span
/// ending when another starts does not overlap it (a slot that finishes one
/// desktop and starts the next runs one at a time).
pub fn peak_concurrent(spans: &[(Nanos, Nanos)], from: Nanos, to: Nanos) -> u32 {
    let mut edges: Vec<(Nanos, i8)> = Vec::with_capacity(spans.len() * 2);
    for &(start, end) in spans {
        let (a, b) = (start.max(from), end.min(to));
        if a < b {
            edges.push((a, 1));
            edges.push((b, -1));
        }
    }
    // Ends (-1) sort before starts (+1) at the same instant.
    edges.sort_unstable();
    let (mut open, mut peak) = (0i64, 0i64);
    for (_, d) in edges {
        open += d as i64;
        peak = peak.max(open);
    }
    peak as u32
}

#[derive(Clone, Debug)]
struct Worker {
    next_seq_offset: u64,
    burst_left: u32,
    resume_at: Option<Nanos>,
}

/// Iometer's behaviour for one [`AccessSpec`] on one volume: each worker keeps
/// `outstanding_ios` requests in flight (in bursts of `burst_ios` separated by
/// `burst_delay_ms` when set); a request picks its line by `access_pct`, is a read with
/// `read_pct`, and jumps to a uniform random aligned offset with `random_pct`, otherwise
/// it continues the worker's sequential stream (workers start at evenly spaced points of
/// the dataset and wrap at its end). Deterministic for a given seed.
#[derive(Clone, Debug)]
pub struct AccessGenerator {
    spec: AccessSpec,
    dataset_bytes: u64,
    /// Cumulative access_pct thresholds, one per line.
    cumulative_pct: Vec<f64>,
    burst_delay_ns: Nanos,
    workers: Vec<Worker>,
    rng: ChaCha8Rng,
}

impl AccessGenerator {
    pub fn new(
        spec: &AccessSpec,
        volume_size_bytes: u64,
        seed: u64,
    ) -> Result<Self, WorkloadError> {
        spec.validate()?;
        let max_size = spec.max_size_bytes() as u64;
        let dataset_bytes = (volume_size_bytes as f64 * spec.dataset_fraction) as u64;
        let align = spec
            .alignment_bytes
            .map(u64::from)
            .unwrap_or(max_size)
            .max(1);
        let dataset_bytes = dataset_bytes / align * align;
        if dataset_bytes < max_size {
            return Err(WorkloadError::invalid(
                "dataset_fraction",
                format!(
                    "the dataset ({dataset_bytes} bytes of a {volume_size_bytes}-byte volume) is smaller than the largest transfer ({max_size} bytes)"
                ),
            ));
        }
        let mut acc = 0.0;
        let cumulative_pct = spec
            .lines
            .iter()
            .map(|l| {
                acc += l.access_pct;
                acc
            })
            .collect();
        let n = spec.workers as u64;
        let workers = (0..n)
            .map(|w| {
                let start = dataset_bytes / n * w;
                Worker {
                    next_seq_offset: start / align * align,
                    burst_left: spec.burst_ios,
                    resume_at: None,
                }
            })
            .collect();
        Ok(AccessGenerator {
            spec: spec.clone(),
            dataset_bytes,
            cumulative_pct,
            burst_delay_ns: (spec.burst_delay_ms * 1e6).round() as Nanos,
            workers,
            rng: ChaCha8Rng::seed_from_u64(seed),
        })
    }

    pub fn spec(&self) -> &AccessSpec {
        &self.spec
    }

    /// Bytes the workers address.
    pub fn dataset_bytes(&self) -> u64 {
        self.dataset_bytes
    }

    fn make_request(&mut self, worker: usize) -> IoRequest {
        let line = if self.spec.lines.len() == 1 {
            0
        } else {
            let x = self.rng.random::<f64>() * 100.0;
            self.cumulative_pct
                .iter()
                .position(|&c| x < c)
                .unwrap_or(self.spec.lines.len() - 1)
        };
        let l = &self.spec.lines[line];
        let size = l.size_bytes as u64;
        let dir = if l.read_pct >= 100.0
            || (l.read_pct > 0.0 && self.rng.random::<f64>() * 100.0 < l.read_pct)
        {
            Direction::Read
        } else {
            Direction::Write
        };
        let random = l.random_pct >= 100.0
            || (l.random_pct > 0.0 && self.rng.random::<f64>() * 100.0 < l.random_pct);
        let align = self
            .spec
            .alignment_bytes
            .map(u64::from)
            .unwrap_or(size)
            .max(1);
        let w = &mut self.workers[worker];
        let offset = if random {
            let slots = (self.dataset_bytes - size) / align + 1;
            self.rng.random_range(0..slots) * align
        } else {
            let mut o = w.next_seq_offset.div_ceil(align) * align;
            if o + size > self.dataset_bytes {
                o = 0;
            }
            o
        };
        w.next_seq_offset = offset + size;
        IoRequest {
            offset_bytes: offset,
            size_bytes: l.size_bytes,
            dir,
        }
    }
}

impl IoGenerator for AccessGenerator {
    fn workers(&self) -> u32 {
        self.spec.workers
    }

    fn poll(&mut self, now_ns: Nanos, worker: u32, outstanding: u32) -> Issue {
        let Some(w) = self.workers.get_mut(worker as usize) else {
            return Issue::Blocked;
        };
        if let Some(t) = w.resume_at {
            if now_ns < t {
                return Issue::At(t);
            }
            w.resume_at = None;
            w.burst_left = self.spec.burst_ios;
        }
        if self.spec.burst_ios > 0 && w.burst_left == 0 {
            if outstanding > 0 {
                return Issue::Blocked;
            }
            if self.burst_delay_ns > 0 {
                let t = now_ns + self.burst_delay_ns;
                w.resume_at = Some(t);
                return Issue::At(t);
            }
            w.burst_left = self.spec.burst_ios;
        }
        if outstanding >= self.spec.outstanding_ios {
            return Issue::Blocked;
        }
        if self.spec.burst_ios > 0 {
            w.burst_left -= 1;
        }
        Issue::Io(self.make_request(worker as usize))
    }

    fn on_complete(
        &mut self,
        _now_ns: Nanos,
        _worker: u32,
        _request: &IoRequest,
        _latency_ns: Nanos,
    ) {
    }

    /// An access specification has no users: a failure is only the driver's error.
    fn on_failure(&mut self, _now_ns: Nanos, _worker: u32, _request: &IoRequest) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TransferLine;

    fn drain(g: &mut AccessGenerator, worker: u32, n: usize) -> Vec<IoRequest> {
        // Completes each request at once: a closed loop with one outstanding.
        (0..n)
            .map(|_| match g.poll(0, worker, 0) {
                Issue::Io(r) => r,
                other => panic!("expected an I/O, got {other:?}"),
            })
            .collect()
    }

    #[test]
    fn peak_concurrent_counts_overlaps_not_hand_offs() {
        use super::peak_concurrent;
        // A slot handing over at 10 (end = next start) runs one at a time.
        assert_eq!(peak_concurrent(&[(0, 10), (10, 20), (20, 30)], 0, 100), 1);
        assert_eq!(peak_concurrent(&[(0, 10), (5, 20), (6, 7)], 0, 100), 3);
        // Still running at the end (`u64::MAX`), clipped to the window.
        assert_eq!(peak_concurrent(&[(0, u64::MAX), (50, 60)], 0, 100), 2);
        assert_eq!(peak_concurrent(&[(0, u64::MAX), (50, 60)], 0, 40), 1);
        assert_eq!(peak_concurrent(&[(0, 10)], 10, 20), 0);
        assert_eq!(peak_concurrent(&[], 0, 10), 0);
    }

    #[test]
    fn same_seed_same_stream_and_other_seed_differs() {
        let spec = AccessSpec::simple(8192, 70.0, 100.0, 4);
        let mut a = AccessGenerator::new(&spec, 1 << 30, 7).unwrap();
        let mut b = AccessGenerator::new(&spec, 1 << 30, 7).unwrap();
        let mut c = AccessGenerator::new(&spec, 1 << 30, 8).unwrap();
        let (ra, rb, rc) = (
            drain(&mut a, 0, 200),
            drain(&mut b, 0, 200),
            drain(&mut c, 0, 200),
        );
        assert_eq!(ra, rb);
        assert_ne!(ra, rc);
    }

    #[test]
    fn random_offsets_are_aligned_inside_the_dataset_and_mix_holds() {
        let spec = AccessSpec::simple(8192, 70.0, 100.0, 1);
        let volume = 1u64 << 30;
        let mut g = AccessGenerator::new(&spec, volume, 1).unwrap();
        let reqs = drain(&mut g, 0, 20_000);
        let dataset = (volume as f64 * 0.7) as u64;
        assert!(
            reqs.iter()
                .all(|r| r.offset_bytes % 8192 == 0 && r.offset_bytes + 8192 <= dataset)
        );
        let reads =
            reqs.iter().filter(|r| r.dir == Direction::Read).count() as f64 / reqs.len() as f64;
        assert!((reads - 0.7).abs() < 0.02, "read share {reads}");
        // Random: the upper half of the dataset is reached about half the time.
        let upper = reqs
            .iter()
            .filter(|r| r.offset_bytes >= dataset / 2)
            .count() as f64
            / reqs.len() as f64;
        assert!((upper - 0.5).abs() < 0.03, "upper share {upper}");
    }

    #[test]
    fn sequential_streams_per_worker_and_wrap_at_dataset_end() {
        let mut spec = AccessSpec::simple(1 << 20, 100.0, 0.0, 1);
        spec.workers = 2;
        let volume = 10u64 << 20; // dataset 7 MiB
        let mut g = AccessGenerator::new(&spec, volume, 3).unwrap();
        let w0: Vec<u64> = drain(&mut g, 0, 9)
            .iter()
            .map(|r| r.offset_bytes >> 20)
            .collect();
        assert_eq!(w0, vec![0, 1, 2, 3, 4, 5, 6, 0, 1]);
        let w1: Vec<u64> = drain(&mut g, 1, 5)
            .iter()
            .map(|r| r.offset_bytes >> 20)
            .collect();
        assert_eq!(w1, vec![3, 4, 5, 6, 0]);
    }

    #[test]
    fn outstanding_limit_and_bursts() {
        let mut spec = AccessSpec::simple(4096, 100.0, 0.0, 2);
        assert!(matches!(
            AccessGenerator::new(&spec, 1 << 20, 1)
                .unwrap()
                .poll(0, 0, 2),
            Issue::Blocked
        ));
        spec.outstanding_ios = 8;
        spec.burst_ios = 3;
        spec.burst_delay_ms = 5.0;
        let mut g = AccessGenerator::new(&spec, 1 << 20, 1).unwrap();
        for i in 0..3 {
            assert!(matches!(g.poll(0, 0, i), Issue::Io(_)));
        }
        assert_eq!(g.poll(0, 0, 3), Issue::Blocked);
        // Burst finished at t = 1 ms: the next burst starts 5 ms later.
        assert_eq!(g.poll(1_000_000, 0, 0), Issue::At(6_000_000));
        assert_eq!(g.poll(2_000_000, 0, 0), Issue::At(6_000_000));
        assert!(matches!(g.poll(6_000_000, 0, 0), Issue::Io(_)));
        assert!(
            matches!(g.poll(6_000_000, 7, 0), Issue::Blocked),
            "unknown worker is blocked, not a panic"
        );
    }

    #[test]
    fn mixed_lines_follow_access_pct() {
        let mut spec = AccessSpec::simple(4096, 0.0, 100.0, 1);
        spec.lines[0].access_pct = 25.0;
        spec.lines.push(TransferLine {
            size_bytes: 65536,
            access_pct: 75.0,
            read_pct: 100.0,
            random_pct: 0.0,
        });
        let mut g = AccessGenerator::new(&spec, 1 << 30, 5).unwrap();
        let reqs = drain(&mut g, 0, 10_000);
        let small = reqs.iter().filter(|r| r.size_bytes == 4096).count() as f64 / 10_000.0;
        assert!((small - 0.25).abs() < 0.02, "{small}");
        assert!(
            reqs.iter()
                .all(|r| (r.size_bytes == 4096) == (r.dir == Direction::Write))
        );
    }

    #[test]
    fn dataset_smaller_than_transfer_is_an_error() {
        let spec = AccessSpec::simple(4 << 20, 100.0, 0.0, 1);
        let e = AccessGenerator::new(&spec, 4 << 20, 1).unwrap_err();
        assert!(
            e.to_string().contains("smaller than the largest transfer"),
            "{e}"
        );
    }

    proptest::proptest! {
        #[test]
        fn requests_stay_inside_the_dataset_and_aligned(
            size_kib in 1u32..2048,
            align_kib in proptest::option::of(1u32..512),
            read_pct in 0.0f64..=100.0,
            random_pct in 0.0f64..=100.0,
            workers in 1u32..8,
            fraction in 0.05f64..=1.0,
            volume_mib in 64u64..4096,
            seed in 0u64..1000,
        ) {
            let mut spec = AccessSpec::simple(size_kib * 1024, read_pct, random_pct, 4);
            spec.workers = workers;
            spec.dataset_fraction = fraction;
            spec.alignment_bytes = align_kib.map(|a| a * 1024);
            let volume = volume_mib << 20;
            match AccessGenerator::new(&spec, volume, seed) {
                Err(_) => proptest::prop_assert!((volume as f64 * fraction) < (size_kib as f64 * 1024.0) * 2.0),
                Ok(mut g) => {
                    let align = spec.alignment_bytes.unwrap_or(size_kib * 1024) as u64;
                    for w in 0..workers {
                        for _ in 0..50 {
                            let Issue::Io(r) = g.poll(0, w, 0) else { panic!("blocked with nothing outstanding") };
                            proptest::prop_assert!(r.offset_bytes + r.size_bytes as u64 <= g.dataset_bytes());
                            proptest::prop_assert!(g.dataset_bytes() <= volume);
                            proptest::prop_assert_eq!(r.offset_bytes % align, 0);
                        }
                    }
                }
            }
        }
    }
}
