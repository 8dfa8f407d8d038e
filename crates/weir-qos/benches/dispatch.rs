//! One scheduling decision (enqueue + dispatch + complete) with 1,000 backlogged
//! volumes under mixed policies: reservations, limits, shares, service levels with
//! latency targets, request sizes from 4 KiB to 1 MiB.
//!
//! `cargo bench -p weir-qos --bench dispatch -- --warm-up-time 1 --measurement-time 3`
//! prints criterion's estimate and then the median of 300 batches of 1,000 cycles.

use std::hint::black_box;
use std::time::Instant;

use criterion::{Criterion, criterion_group};
use weir_qos::{
    ClientId, Dispatch, IoCost, Nanos, Policy, Scheduler, SchedulerConfig, ServiceLevel, Shares,
    VolumeId,
};

const VOLUMES: u32 = 1000;
const QUEUED_PER_VOLUME: u32 = 4;
/// Virtual time between decisions: a 1M-IOPS device.
const STEP_NS: Nanos = 1000;

fn policy_for(i: u32) -> Policy {
    let mut p = Policy::best_effort(format!("p{}", i % 7));
    p.shares = Shares::new(200 + (i * 37) % 3801).expect("in range");
    match i % 5 {
        0 => p.reservation_iops = Some(200.0 + (i % 13) as f64 * 10.0),
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
            p.latency_target_ms = Some(if i.is_multiple_of(2) { 10.0 } else { 20.0 });
        }
        _ => {}
    }
    p
}

fn size_for(i: u32) -> u32 {
    [4096, 8192, 65536, 4096, 1 << 20][(i % 5) as usize]
}

struct Bench {
    sched: Scheduler<u32>,
    now: Nanos,
}

impl Bench {
    fn new() -> Bench {
        let mut sched = Scheduler::new(SchedulerConfig::default());
        for v in 0..VOLUMES {
            sched.add_volume(0, VolumeId(v), policy_for(v));
            for q in 0..QUEUED_PER_VOLUME {
                sched
                    .enqueue(
                        0,
                        VolumeId(v),
                        ClientId(v % 64),
                        IoCost::read(size_for(v + q)),
                        q,
                    )
                    .expect("volume exists");
            }
        }
        Bench { sched, now: 0 }
    }

    /// One decision: release a request, complete it, and have its client issue the
    /// next one on the same volume (so every volume stays backlogged).
    fn cycle(&mut self) {
        self.now += STEP_NS;
        loop {
            match self.sched.dispatch(self.now) {
                Dispatch::Io(d) => {
                    self.sched.complete(
                        self.now,
                        d.volume,
                        d.client,
                        d.cost,
                        self.now - d.enqueued_at,
                    );
                    let next = IoCost::read(size_for(d.volume.0 + d.payload + 1));
                    self.sched
                        .enqueue(self.now, d.volume, d.client, next, d.payload + 1)
                        .expect("volume exists");
                    black_box(d.phase);
                    return;
                }
                Dispatch::WaitUntil(t) => self.now = t,
                Dispatch::Idle => unreachable!("every volume is backlogged"),
            }
        }
    }
}

fn bench_dispatch(c: &mut Criterion) {
    let mut b = Bench::new();
    // Reach a steady state (tags spread, some volumes limit-held).
    for _ in 0..200_000 {
        b.cycle();
    }
    c.bench_function(
        "enqueue+dispatch+complete, 1000 backlogged volumes",
        |bencher| bencher.iter(|| b.cycle()),
    );
}

fn median_report() {
    let mut b = Bench::new();
    for _ in 0..200_000 {
        b.cycle();
    }
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
    println!(
        "dispatch decision with {VOLUMES} backlogged volumes: median {:.0} ns (p10 {:.0}, p90 {:.0}) over {} batches of {BATCH}",
        q(0.5),
        q(0.1),
        q(0.9),
        per_cycle_ns.len()
    );
    let s = (0..VOLUMES)
        .filter_map(|v| b.sched.stats(VolumeId(v)))
        .fold((0u64, 0u64, 0u64), |acc, s| {
            (
                acc.0 + s.dispatched_ios,
                acc.1 + s.reservation_dispatches,
                acc.2 + s.protected_dispatches,
            )
        });
    println!(
        "  releases {} (reservation phase {}, protected {})",
        s.0, s.1, s.2
    );
}

criterion_group!(benches, bench_dispatch);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    median_report();
}
