//! Property tests of the gate (the one QoS driver of the server and the simulator)
//! on a toy device: `slots` parallel servers, each piece served in a time
//! proportional to its cost units,
//! closed-loop clients, virtual time. Case counts are small so the file runs in
//! seconds; every property is checked on every step, not only at the end.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use proptest::prelude::*;
use weir_qos::{
    ClientId, DepthConfig, Gate, GateConfig, GateRequest, IoCost, IoKind, NANOS_PER_SEC, Nanos,
    Policy, SchedulerConfig, ServiceLevel, Shares, Ticket, VolumeId,
};

const SEC: Nanos = NANOS_PER_SEC;
const MS: Nanos = 1_000_000;

#[derive(Clone, Debug)]
struct Load {
    volume: u32,
    client: u32,
    kind: IoKind,
    size: u32,
    queue_depth: u32,
}

struct Outcome {
    /// Per volume: (release time, charged units, charged bytes for limits) per piece.
    releases: BTreeMap<u32, Vec<(Nanos, u64, u64)>>,
    /// Per (volume, client): completed requests and the longest latency.
    finished: BTreeMap<(u32, u32), (u64, Nanos)>,
    busy_ns: u128,
    end: Nanos,
}

/// Runs closed-loop `loads` on `slots` servers taking `ns_per_unit` per cost unit.
fn run(
    config: GateConfig,
    slots: u32,
    ns_per_unit: Nanos,
    volumes: &[(u32, Policy)],
    loads: &[Load],
    duration: Nanos,
) -> Outcome {
    let scfg = config.scheduler.clone();
    let mut gate: Gate<usize> = Gate::new(config);
    for (id, p) in volumes {
        gate.add_volume(0, VolumeId(*id), p.clone());
    }
    let mut out = Vec::new();
    let mut device: BinaryHeap<Reverse<(Nanos, u64, Ticket)>> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut o = Outcome {
        releases: BTreeMap::new(),
        finished: BTreeMap::new(),
        busy_ns: 0,
        end: duration,
    };
    let mut offsets = vec![0u64; loads.len()];
    let mut submit = |gate: &mut Gate<usize>, now: Nanos, i: usize, out: &mut Vec<_>| {
        let l = &loads[i];
        offsets[i] = (offsets[i] + l.size as u64) % (1 << 40);
        let r = GateRequest {
            volume: VolumeId(l.volume),
            client: ClientId(l.client),
            kind: l.kind,
            offset: offsets[i],
            length: l.size,
        };
        gate.submit(now, r, i, out).expect("known volume");
    };
    for (i, l) in loads.iter().enumerate() {
        for _ in 0..l.queue_depth {
            submit(&mut gate, 0, i, &mut out);
        }
    }
    let mut now = 0;
    let mut started: BTreeMap<usize, Nanos> = BTreeMap::new();
    loop {
        for r in out.drain(..) {
            let cost = IoCost {
                kind: r.kind,
                size_bytes: r.piece.length,
            };
            let units = scfg.units(cost);
            let bytes = scfg.charged_bytes(cost).max(scfg.min_limit_bytes());
            o.releases
                .entry(r.volume.0)
                .or_default()
                .push((now, units, bytes));
            seq += 1;
            let service_ns = units * ns_per_unit;
            device.push(Reverse((now + service_ns, seq, r.ticket)));
            o.busy_ns += service_ns as u128;
            started.entry(r.payload).or_insert(now);
        }
        assert!(
            gate.in_flight() <= gate.limit() && device.len() as u32 <= slots.max(gate.limit()),
            "in flight {} over limit {}",
            gate.in_flight(),
            gate.limit()
        );
        let next = [device.peek().map(|r| r.0.0), gate.next_wakeup()]
            .into_iter()
            .flatten()
            .min();
        let Some(t) = next else { break };
        assert!(t >= now, "time went back: {t} < {now}");
        if t >= duration {
            break;
        }
        now = t;
        while device.peek().is_some_and(|r| r.0.0 <= now) {
            let Reverse((_, _, ticket)) = device.pop().unwrap();
            if let Some(f) = gate.complete(now, ticket, &mut out) {
                let e = o.finished.entry((f.volume.0, f.client.0)).or_default();
                e.0 += 1;
                e.1 = e.1.max(f.latency_ns);
                // The client of this request issues its next one (which load: the
                // volume/client pair identifies it).
                let i = loads
                    .iter()
                    .position(|l| l.volume == f.volume.0 && l.client == f.client.0)
                    .unwrap();
                submit(&mut gate, now, i, &mut out);
            }
        }
        gate.wake(now, &mut out);
    }
    o
}

fn fixed(slots: u32) -> GateConfig {
    GateConfig {
        scheduler: SchedulerConfig::default(),
        max_in_flight: slots,
        depth: DepthConfig {
            adaptive: false,
            ..DepthConfig::default()
        },
    }
}

fn max_in_window(
    r: &[(Nanos, u64, u64)],
    window: Nanos,
    f: impl Fn(&(Nanos, u64, u64)) -> u64,
) -> u64 {
    let mut best = 0;
    let mut sum = 0;
    let mut j = 0;
    for i in 0..r.len() {
        sum += f(&r[i]);
        while r[i].0 - r[j].0 >= window {
            sum -= f(&r[j]);
            j += 1;
        }
        best = best.max(sum);
    }
    best
}

fn kind() -> impl Strategy<Value = IoKind> {
    prop::sample::select(vec![
        IoKind::Read,
        IoKind::Write,
        IoKind::Cache,
        IoKind::Trim,
        IoKind::WriteZeroes,
        IoKind::Flush,
        IoKind::Other,
    ])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Limits hold over every 1 s window (units against IOPS, bytes against MB/s,
    /// every command kind, requests up to 32 MiB paced in pieces, several clients
    /// per volume), within 2 % plus one piece.
    #[test]
    fn limits_hold_for_every_command_and_size(
        iops in prop::option::of(200.0..3000.0f64),
        mbps in prop::option::of(2.0..40.0f64),
        loads in prop::collection::vec((kind(), prop::sample::select(vec![4096u32, 65536, 1 << 20, 32 << 20]), 1u32..=8), 1..=3),
    ) {
        let policy = Policy { limit_iops: iops, limit_mbps: mbps, ..Policy::best_effort("lim") };
        let loads: Vec<Load> = loads.iter().enumerate().map(|(c, &(kind, size, qd))| Load {
            volume: 1, client: c as u32 + 1, kind, size, queue_depth: qd,
        }).collect();
        let o = run(fixed(16), 16, 10_000, &[(1, policy)], &loads, 3 * SEC);
        let r = o.releases.get(&1).cloned().unwrap_or_default();
        let piece_slack = |rate: f64| rate * 0.005 + 1.0;
        if let Some(l) = iops {
            let max = max_in_window(&r, SEC, |x| x.1);
            prop_assert!(max as f64 <= 1.02 * l + piece_slack(l), "{max} units in 1 s, limit {l}");
        }
        if let Some(m) = mbps {
            let max = max_in_window(&r, SEC, |x| x.2);
            let l = m * 1e6;
            prop_assert!(max as f64 <= 1.02 * l + piece_slack(l) + 4096.0, "{max} bytes in 1 s, limit {m} MB/s");
        }
    }

    /// Work conservation and no starvation: with no limits the device is kept busy,
    /// and every client of every volume completes requests (none waits forever:
    /// the longest latency stays within the time it takes to serve everyone's
    /// queue a few times over).
    #[test]
    fn busy_and_no_client_starves(
        volumes in prop::collection::vec((200u32..=4000, 1u32..=3), 1..=4),
        sizes in prop::collection::vec(prop::sample::select(vec![4096u32, 65536, 1 << 20]), 4),
    ) {
        let mut vols = Vec::new();
        let mut loads = Vec::new();
        for (i, &(shares, clients)) in volumes.iter().enumerate() {
            let v = i as u32 + 1;
            vols.push((v, Policy { shares: Shares::new(shares).unwrap(), ..Policy::best_effort("s") }));
            for c in 0..clients {
                loads.push(Load { volume: v, client: c + 1, kind: IoKind::Read, size: sizes[(i + c as usize) % 4], queue_depth: 8 });
            }
        }
        // 4 slots x 100 µs per 4 KiB unit: 40,000 units/s.
        let per_unit = 100_000;
        let o = run(fixed(4), 4, per_unit, &vols, &loads, 2 * SEC);
        let busy = o.busy_ns as f64 / (4.0 * o.end as f64);
        prop_assert!(busy >= 0.98, "device busy {busy:.3} with demand above capacity");
        let total_shares: u64 = volumes.iter().map(|v| v.0 as u64).sum();
        for l in &loads {
            let (n, worst) = o.finished.get(&(l.volume, l.client)).copied().unwrap_or_default();
            prop_assert!(n > 0, "volume {} client {} never completed", l.volume, l.client);
            // Fair queueing, two levels: the volume gets its share of the device and
            // each of its clients an equal part of that, so a request waits at most
            // for its client's queue served at that rate (twice over for slack).
            let (shares, clients) = volumes[l.volume as usize - 1];
            let client_units = l.queue_depth as u64 * (l.size as u64).div_ceil(4096);
            let volume_units: u64 = loads.iter().filter(|x| x.volume == l.volume)
                .map(|x| x.queue_depth as u64 * (x.size as u64).div_ceil(4096)).sum();
            let units = volume_units.max(client_units * clients as u64);
            let bound = 2 * units * per_unit * total_shares / shares as u64 / 4 + 100 * MS;
            prop_assert!(worst <= bound, "volume {} client {} ({} clients): waited {} ms, bound {} ms", l.volume, l.client, clients, worst / MS, bound / MS);
        }
    }

    /// Under service-level protection the protected volumes still split the device by
    /// their shares, and none of them starves: business-critical volumes whose tight
    /// latency target keeps their level at risk, beside a non-critical flood (held
    /// back meanwhile, as the levels say, but for one release in 16, so its waits stay
    /// bounded by its own queue). Session 23: a protected release was charged from a
    /// virtual time the held-back flood pinned, so the volume with fewer shares got
    /// nothing for as long as protection lasted.
    /// Session 24: the held-back level had no floor, so in `mixed-workload-cache`
    /// a non-critical pool's first boot reads waited 208 s, the whole storm.
    #[test]
    fn protected_volumes_split_by_shares_and_none_starves(
        protected in prop::collection::vec(200u32..=4000, 2..=3),
        flood_shares in 200u32..=4000,
    ) {
        let business = |shares: u32| Policy {
            service_level: Some(ServiceLevel::BusinessCritical),
            latency_target_ms: Some(0.5),
            shares: Shares::new(shares).unwrap(),
            ..Policy::best_effort("bc")
        };
        let mut vols = Vec::new();
        let mut loads = Vec::new();
        for (i, &shares) in protected.iter().enumerate() {
            let v = i as u32 + 1;
            vols.push((v, business(shares)));
            loads.push(Load { volume: v, client: v, kind: IoKind::Read, size: 4096, queue_depth: 16 });
        }
        let flood = protected.len() as u32 + 1;
        vols.push((flood, Policy {
            service_level: Some(ServiceLevel::NonCritical),
            shares: Shares::new(flood_shares).unwrap(),
            ..Policy::best_effort("nc")
        }));
        loads.push(Load { volume: flood, client: flood, kind: IoKind::Read, size: 4096, queue_depth: 16 });
        // 4 slots x 1 ms: 4,000 IOPS, every request waits several ms (at risk).
        let o = run(fixed(4), 4, MS, &vols, &loads, 2 * SEC);
        let done = |v: u32| o.finished.get(&(v, v)).map_or(0, |f| f.0) as f64;
        let served: f64 = (1..flood).map(done).sum();
        let total_shares: u32 = protected.iter().sum();
        // 2 s of 4 slots at 1 ms: 8,000 releases, one in 16 for the held-back flood.
        let every = weir_qos::HELD_BACK_EVERY as u64;
        prop_assert!(served > 0.9 * 7500.0, "the protected volumes got {served} of ≈ 7,500");
        let (flood_done, flood_worst) = o.finished.get(&(flood, flood)).copied().unwrap_or_default();
        prop_assert!(
            (450..=560).contains(&flood_done),
            "the held-back flood completed {flood_done}: one release in {every} is ≈ 500 in 2 s"
        );
        // Its queue of 16 at 4,000 / 16 releases a second: 64 ms (twice over).
        let bound = 2 * 16 * every * SEC / 4000 + 10 * MS;
        prop_assert!(flood_worst <= bound, "the flood waited {} ms", flood_worst / MS);
        for (i, &shares) in protected.iter().enumerate() {
            let v = i as u32 + 1;
            let got = done(v) / served;
            let want = shares as f64 / total_shares as f64;
            prop_assert!(
                (got / want - 1.0).abs() < 0.15,
                "volume {v} ({shares} shares) got {:.3} of the protected volumes' I/O, its share {:.3}",
                got, want
            );
        }
    }

    /// Feasible reservations (summing to at most 80 % of the device) are met beside
    /// high-share floods, and the floods split what is left by their shares.
    #[test]
    fn reservations_are_met_and_the_rest_splits_by_shares(
        reservations in prop::collection::vec(100.0..800.0f64, 1..=3),
        flood_shares in prop::collection::vec(200u32..=4000, 2),
    ) {
        // 4 slots x 1 ms = 4,000 IOPS; every load floods (QD16 > its part).
        let total: f64 = reservations.iter().sum();
        let scale = if total > 3200.0 { 3200.0 / total } else { 1.0 };
        let mut vols = Vec::new();
        let mut loads = Vec::new();
        for (i, r) in reservations.iter().enumerate() {
            let v = i as u32 + 1;
            vols.push((v, Policy { reservation_iops: Some(r * scale), shares: Shares::new(200).unwrap(), ..Policy::best_effort("r") }));
            loads.push(Load { volume: v, client: v, kind: IoKind::Read, size: 4096, queue_depth: 16 });
        }
        for (k, s) in flood_shares.iter().enumerate() {
            let v = 10 + k as u32;
            vols.push((v, Policy { shares: Shares::new(*s).unwrap(), ..Policy::best_effort("f") }));
            loads.push(Load { volume: v, client: v, kind: IoKind::Read, size: 4096, queue_depth: 16 });
        }
        let o = run(fixed(4), 4, MS, &vols, &loads, 3 * SEC);
        let rate = |v: u32| o.finished.get(&(v, v)).map_or(0, |f| f.0) as f64 / 3.0;
        for (i, r) in reservations.iter().enumerate() {
            let got = rate(i as u32 + 1);
            prop_assert!(got >= 0.98 * r * scale, "volume {}: {got:.0} IOPS, reserved {:.0}", i + 1, r * scale);
        }
        let (a, b) = (rate(10), rate(11));
        let want = flood_shares[0] as f64 / flood_shares[1] as f64;
        prop_assert!((a / b / want - 1.0).abs() <= 0.05, "floods {a:.0} : {b:.0}, shares {want:.3}");
    }

    /// Infeasible reservations are cut in proportion, whatever the order the
    /// volumes were declared in.
    #[test]
    fn infeasible_reservations_split_in_proportion_in_any_order(
        reservations in prop::collection::vec(200.0..2000.0f64, 2..=4),
        rotate in 0usize..4,
    ) {
        // 4 slots x 1 ms = 4,000 IOPS; reservations summing above that.
        let sum: f64 = reservations.iter().sum();
        let scale = 6000.0 / sum;
        let mut vols: Vec<(u32, Policy)> = reservations.iter().enumerate().map(|(i, r)| {
            (i as u32 + 1, Policy { reservation_iops: Some(r * scale), ..Policy::best_effort("r") })
        }).collect();
        let n = vols.len();
        vols.rotate_left(rotate % n);
        let loads: Vec<Load> = (1..=n as u32).map(|v| Load { volume: v, client: v, kind: IoKind::Read, size: 4096, queue_depth: 16 }).collect();
        let o = run(fixed(4), 4, MS, &vols, &loads, 3 * SEC);
        for (i, r) in reservations.iter().enumerate() {
            let v = i as u32 + 1;
            let got = o.finished.get(&(v, v)).map_or(0, |f| f.0) as f64 / 3.0;
            let want = r * scale * 4000.0 / 6000.0;
            prop_assert!((got / want - 1.0).abs() <= 0.05, "volume {v}: {got:.0} IOPS, proportional share {want:.0} (declared rotated by {rotate})");
        }
    }
}

/// Shares 2:1 between two volumes at QD32 each on a device whose throughput grows
/// with depth: with the share-aware depth the scheduler gets a queue to order and
/// the split is 2:1 (at a fixed depth of 64 nothing would wait in the gate).
#[test]
fn shares_act_when_both_volumes_fit_in_the_device_queue() {
    let vols = [
        (
            1,
            Policy {
                shares: Shares::HIGH,
                ..Policy::best_effort("hi")
            },
        ),
        (2, Policy::best_effort("lo")),
    ];
    let loads = [
        Load {
            volume: 1,
            client: 1,
            kind: IoKind::Read,
            size: 4096,
            queue_depth: 32,
        },
        Load {
            volume: 2,
            client: 2,
            kind: IoKind::Read,
            size: 4096,
            queue_depth: 32,
        },
    ];
    let ratio = |config: GateConfig| {
        let o = run(config, 64, 8 * MS, &vols, &loads, 5 * SEC);
        o.finished[&(1, 1)].0 as f64 / o.finished[&(2, 2)].0 as f64
    };
    let fixed_64 = ratio(fixed(64));
    assert!(
        (fixed_64 - 1.0).abs() < 0.05,
        "fixed depth 64: {fixed_64:.2}"
    );
    let adaptive = ratio(GateConfig {
        max_in_flight: 64,
        ..GateConfig::default()
    });
    assert!(
        (adaptive - 2.0).abs() <= 0.05,
        "share-aware depth: {adaptive:.2}"
    );
}

/// The ends of the accepted policy ranges are enforced (issue 15: a limit of
/// 1e-300 MB/s was accepted and limited nothing; such figures are now refused,
/// and the smallest accepted ones must still hold): over two minutes of 4 KiB and
/// 1 MiB reads, the smallest MB/s and IOPS limits let through their rate, within
/// 2 % plus one piece, and no less than 90 % of it.
#[test]
fn the_smallest_accepted_limits_hold() {
    use weir_qos::policy::{MIN_LIMIT_IOPS, MIN_MBPS};
    let loads = [
        Load {
            volume: 1,
            client: 1,
            kind: IoKind::Read,
            size: 4096,
            queue_depth: 4,
        },
        Load {
            volume: 1,
            client: 2,
            kind: IoKind::Read,
            size: 1 << 20,
            queue_depth: 2,
        },
    ];
    let secs = 120;
    let by_mbps = Policy {
        limit_mbps: Some(MIN_MBPS),
        ..Policy::best_effort("slowest-mbps")
    };
    let by_iops = Policy {
        limit_iops: Some(MIN_LIMIT_IOPS),
        ..Policy::best_effort("slowest-iops")
    };
    for (policy, rate, what) in [
        (by_mbps, MIN_MBPS * 1e6, 2usize),
        (by_iops, MIN_LIMIT_IOPS, 1usize),
    ] {
        let o = run(fixed(16), 16, 10_000, &[(1, policy)], &loads, secs * SEC);
        let r = o.releases.get(&1).cloned().unwrap_or_default();
        let total: u64 = r.iter().map(|x| if what == 1 { x.1 } else { x.2 }).sum();
        let allowed = rate * secs as f64;
        let piece = if what == 1 { 1.0 } else { 8192.0 };
        assert!(
            total as f64 <= 1.02 * allowed + piece,
            "{total} let through in {secs} s at a limit of {rate}/s"
        );
        assert!(
            total as f64 >= 0.9 * allowed,
            "{total} let through in {secs} s: the limit starves"
        );
    }
}
