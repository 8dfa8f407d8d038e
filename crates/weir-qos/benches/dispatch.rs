//! One gate decision (a piece completes, the gate releases what that allows, a
//! finished request's client submits its next) with 1,000 backlogged volumes under
//! mixed policies: reservations, limits, shares, service levels with latency
//! targets, request sizes from 4 KiB to 1 MiB (paced in pieces under limits).
//!
//! Two cases: `healthy` (a 10M-IOPS virtual device and latency targets of 100/200 ms,
//! so protection rarely kicks in and the full share path runs) and `overload` (a
//! 1M-IOPS device and 10/20 ms targets: the low-share critical volumes are at risk
//! and most releases go through service-level protection).
//!
//! `cargo bench -p weir-qos --bench dispatch -- --warm-up-time 1 --measurement-time 3`
//! prints criterion's estimates and then, per case, the median of 300 batches of
//! 1,000 cycles.

use std::hint::black_box;
use std::time::Instant;

use std::collections::VecDeque;

use criterion::{Criterion, criterion_group};
use weir_qos::{
    ClientId, Gate, GateConfig, GateRequest, IoKind, Nanos, Policy, Release, ServiceLevel, Shares,
    Ticket, VolumeId,
};

const VOLUMES: u32 = 1000;
const QUEUED_PER_VOLUME: u32 = 4;
#[derive(Copy, Clone)]
struct Case {
    name: &'static str,
    /// Virtual time between decisions.
    step_ns: Nanos,
    /// Latency targets of the mission-critical / business-critical volumes.
    targets_ms: (f64, f64),
}

const HEALTHY: Case = Case {
    name: "healthy",
    step_ns: 100,
    targets_ms: (100.0, 200.0),
};
const OVERLOAD: Case = Case {
    name: "overload",
    step_ns: 1000,
    targets_ms: (10.0, 20.0),
};

fn policy_for(i: u32, case: Case) -> Policy {
    let mut p = Policy::best_effort(format!("p{}", i % 7));
    p.shares = Shares::new(200 + (i * 37) % 3801).expect("in range");
    match i % 5 {
        0 => p.reservation_iops = Some(5000.0 + (i % 13) as f64 * 1000.0),
        1 => p.limit_iops = Some(500.0 + (i % 11) as f64 * 100.0),
        2 => {
            p.reservation_mbps = Some(1.0);
            p.limit_mbps = Some(20.0);
        }
        3 => {
            p.service_level = Some(if i.is_multiple_of(2) {
                ServiceLevel::MissionCritical
            } else {
                ServiceLevel::BusinessCritical
            });
            p.latency_target_ms = Some(if i.is_multiple_of(2) {
                case.targets_ms.0
            } else {
                case.targets_ms.1
            });
        }
        _ => {}
    }
    p
}

fn size_for(i: u32) -> u32 {
    [4096, 8192, 65536, 4096, 1 << 20][(i % 5) as usize]
}

/// Outstanding pieces at the bench's "device" (the gate's in-flight limit).
const DEVICE_DEPTH: u32 = 64;

struct Bench {
    gate: Gate<u32>,
    /// Released pieces, completed oldest first (a FIFO device).
    device: VecDeque<Ticket>,
    out: Vec<Release<u32>>,
    now: Nanos,
    step_ns: Nanos,
    seq: u32,
}

impl Bench {
    fn new(case: Case) -> Bench {
        let mut gate = Gate::new(GateConfig {
            max_in_flight: DEVICE_DEPTH,
            ..GateConfig::default()
        });
        for v in 0..VOLUMES {
            gate.add_volume(0, VolumeId(v), policy_for(v, case));
        }
        let mut b = Bench {
            gate,
            device: VecDeque::new(),
            out: Vec::new(),
            now: 0,
            step_ns: case.step_ns,
            seq: 0,
        };
        for v in 0..VOLUMES {
            for _ in 0..QUEUED_PER_VOLUME {
                b.submit(VolumeId(v), ClientId(v % 64));
            }
        }
        b.collect();
        // Reach a steady state (tags spread, some volumes limit-held).
        for _ in 0..200_000 {
            b.cycle();
        }
        b
    }

    fn submit(&mut self, volume: VolumeId, client: ClientId) {
        self.seq = self.seq.wrapping_add(1);
        let request = GateRequest {
            volume,
            client,
            kind: IoKind::Read,
            offset: self.seq as u64 * 4096,
            length: size_for(volume.0 + self.seq),
        };
        self.gate
            .submit(self.now, request, self.seq, &mut self.out)
            .expect("volume exists");
    }

    fn collect(&mut self) {
        for r in self.out.drain(..) {
            black_box(r.phase);
            self.device.push_back(r.ticket);
        }
    }

    /// One decision: the device completes its oldest piece, the gate releases what
    /// that allows, and a finished request's client issues its next one on the same
    /// volume (so every volume stays backlogged).
    fn cycle(&mut self) {
        self.now += self.step_ns;
        match self.device.pop_front() {
            Some(ticket) => {
                if let Some(f) = self.gate.complete(self.now, ticket, &mut self.out) {
                    self.submit(f.volume, f.client);
                }
            }
            None => {
                // Everything is held by limits: jump to when the gate says.
                if let Some(t) = self.gate.next_wakeup() {
                    self.now = self.now.max(t);
                }
                self.gate.wake(self.now, &mut self.out);
            }
        }
        self.collect();
    }
}

fn bench_dispatch(c: &mut Criterion) {
    for case in [HEALTHY, OVERLOAD] {
        let mut b = Bench::new(case);
        let name = format!(
            "gate complete+release+submit, {VOLUMES} backlogged volumes, {}",
            case.name
        );
        c.bench_function(&name, |bencher| bencher.iter(|| b.cycle()));
    }
}

fn median_report(case: Case) {
    let mut b = Bench::new(case);
    const BATCH: u32 = 1000;
    let mut per_cycle_ns: Vec<f64> = (0..300)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..BATCH {
                b.cycle();
            }
            start.elapsed().as_nanos() as f64 / BATCH as f64
        })
        .collect();
    per_cycle_ns.sort_by(f64::total_cmp);
    let q = |f: f64| per_cycle_ns[((per_cycle_ns.len() - 1) as f64 * f) as usize];
    let s = (0..VOLUMES)
        .filter_map(|v| b.gate.volume_stats(VolumeId(v)))
        .fold((0u64, 0u64, 0u64), |acc, s| {
            (
                acc.0 + s.dispatched_ios,
                acc.1 + s.reservation_dispatches,
                acc.2 + s.protected_dispatches,
            )
        });
    println!(
        "{}: gate decision (complete + release + submit) with {VOLUMES} backlogged volumes, depth {}: \
         median {:.0} ns (p10 {:.0}, p90 {:.0}) over {} batches of {BATCH}; \
         releases {} (reservation phase {:.1} %, protected {:.1} %)",
        case.name,
        b.gate.limit(),
        q(0.5),
        q(0.1),
        q(0.9),
        per_cycle_ns.len(),
        s.0,
        100.0 * s.1 as f64 / s.0 as f64,
        100.0 * s.2 as f64 / s.0 as f64,
    );
}

criterion_group!(benches, bench_dispatch);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    median_report(HEALTHY);
    median_report(OVERLOAD);
}
