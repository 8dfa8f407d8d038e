//! Drive models against physically motivated bands (datasheet arithmetic, not seed
//! figures).

use weir_model::harness::{SplitMix64, run_closed_loop};
use weir_model::{Component, DeviceIo, Hdd, HddSpec, IoDir, Ssd, SsdSpec};

const KIB: u32 = 1024;

fn random_io(rng: &mut SplitMix64, capacity: u64, size: u32, dir: IoDir) -> DeviceIo {
    let blocks = capacity / size as u64;
    DeviceIo {
        offset_bytes: rng.below(blocks) * size as u64,
        size_bytes: size,
        dir,
    }
}

fn hdd_random_reads(spec: &HddSpec, qd: u32, n: u64) -> f64 {
    let mut hdd = Hdd::new(spec).unwrap();
    let mut rng = SplitMix64(7);
    let cap = spec.capacity_bytes;
    run_closed_loop(&mut hdd, qd, n, |_| {
        random_io(&mut rng, cap, 8 * KIB, IoDir::Read)
    })
    .iops()
}

/// 1 / (average seek + half a revolution + transfer + command overhead).
fn qd1_expectation(spec: &HddSpec) -> f64 {
    let rev_ms = 60_000.0 / spec.rpm as f64;
    let mid_rate = (spec.media_rate_outer_mbps + spec.media_rate_inner_mbps) / 2.0;
    let xfer_ms = 8192.0 / (mid_rate * 1e3);
    1e3 / (spec.average_seek_ms + rev_ms / 2.0 + xfer_ms + spec.command_overhead_us / 1e3)
}

#[test]
fn hdd_15k_random_8k_qd1_matches_seek_plus_half_rotation() {
    let spec = HddSpec::savvio_15k3();
    let iops = hdd_random_reads(&spec, 1, 4000);
    let expected = qd1_expectation(&spec);
    assert!(
        (iops / expected - 1.0).abs() < 0.08,
        "QD1 {iops:.0} IOPS vs expected {expected:.0}"
    );
    // A 15K drive does ≈ 170–220 random IOPS at QD1 (2.6 ms seek + 2 ms latency).
    assert!((170.0..=230.0).contains(&iops), "{iops}");
}

#[test]
fn hdd_other_presets_follow_the_same_physics() {
    for spec in [
        HddSpec::cheetah_15k7(),
        HddSpec::savvio_10k5(),
        HddSpec::sata_7200(),
    ] {
        let iops = hdd_random_reads(&spec, 1, 2000);
        let expected = qd1_expectation(&spec);
        assert!(
            (iops / expected - 1.0).abs() < 0.08,
            "{} rpm: {iops:.0} vs {expected:.0}",
            spec.rpm
        );
    }
}

#[test]
fn hdd_queue_reordering_raises_iops() {
    let spec = HddSpec::savvio_15k3();
    let qd1 = hdd_random_reads(&spec, 1, 3000);
    let qd32 = hdd_random_reads(&spec, 32, 6000);
    let gain = qd32 / qd1;
    // Literature: SPTF over 32 commands gives ≈ 1.5–2.5× on real firmware; this model's
    // scheduler knows the rotational position exactly (no estimation slack), so it sits
    // at the top of that range (≈ 2.7× measured). Band kept honest rather than tuned.
    assert!(
        (1.5..=3.0).contains(&gain),
        "QD32/QD1 = {gain:.2} ({qd32:.0} / {qd1:.0})"
    );
    // Deeper queues keep helping, but with diminishing returns.
    let qd8 = hdd_random_reads(&spec, 8, 4000);
    assert!(qd1 < qd8 && qd8 < qd32, "{qd1} {qd8} {qd32}");
}

#[test]
fn hdd_sequential_reads_stream_at_media_rate() {
    let spec = HddSpec::savvio_15k3();
    for qd in [1, 4] {
        let mut hdd = Hdd::new(&spec).unwrap();
        let r = run_closed_loop(&mut hdd, qd, 2000, |i| DeviceIo {
            offset_bytes: i * 64 * KIB as u64,
            size_bytes: 64 * KIB,
            dir: IoDir::Read,
        });
        let ratio = r.mbps() / spec.media_rate_outer_mbps;
        assert!(
            (0.9..=1.01).contains(&ratio),
            "QD{qd}: {:.1} MB/s",
            r.mbps()
        );
    }
}

#[test]
fn hdd_inner_zone_is_slower_than_outer() {
    let spec = HddSpec::savvio_15k3();
    let seq = |base: u64| {
        let mut hdd = Hdd::new(&spec).unwrap();
        run_closed_loop(&mut hdd, 4, 1000, |i| DeviceIo {
            offset_bytes: base + i * 256 * KIB as u64,
            size_bytes: 256 * KIB,
            dir: IoDir::Read,
        })
        .mbps()
    };
    let outer = seq(0);
    let inner = seq(spec.capacity_bytes - (300 << 20));
    assert!(
        (inner / spec.media_rate_inner_mbps - 1.0).abs() < 0.1,
        "inner {inner:.1} MB/s"
    );
    assert!(outer > inner * 1.2, "outer {outer:.1} inner {inner:.1}");
}

#[test]
fn hdd_sequential_writes_without_cache_lose_a_revolution_at_qd1() {
    let mut spec = HddSpec::savvio_15k3();
    spec.write_cache = false;
    let seq_writes = |spec: &HddSpec, qd| {
        let mut hdd = Hdd::new(spec).unwrap();
        run_closed_loop(&mut hdd, qd, 1000, |i| DeviceIo {
            offset_bytes: i * 64 * KIB as u64,
            size_bytes: 64 * KIB,
            dir: IoDir::Write,
        })
    };
    let qd1 = seq_writes(&spec, 1);
    // Each 64 KiB write waits for the sector to come round again: ≈ one revolution
    // (4 ms) plus the transfer per write.
    let per_write_ms = qd1.elapsed_ns as f64 / 1e6 / 1000.0;
    assert!(
        (3.9..=4.8).contains(&per_write_ms),
        "{per_write_ms} ms per write"
    );
    // Queued writes chain without the gap.
    let qd4 = seq_writes(&spec, 4);
    assert!(
        qd4.mbps() > 0.9 * spec.media_rate_outer_mbps,
        "{}",
        qd4.mbps()
    );
    // The drive's write cache acknowledges before the media.
    spec.write_cache = true;
    let cached = seq_writes(&spec, 1);
    assert!(cached.mean_latency_ns < qd1.mean_latency_ns / 2.0);
}

#[test]
fn hdd_rejects_inconsistent_specs() {
    let mut spec = HddSpec::savvio_15k3();
    spec.average_seek_ms = 9.0; // above full stroke
    assert!(Hdd::new(&spec).is_err());
    let mut spec = HddSpec::savvio_15k3();
    spec.rpm = 0;
    let err = Hdd::new(&spec).unwrap_err().to_string();
    assert!(err.contains("rpm"), "{err}");
    let mut spec = HddSpec::savvio_15k3();
    spec.media_rate_inner_mbps = f64::NAN;
    assert!(Hdd::new(&spec).is_err());
    let mut spec = HddSpec::savvio_15k3();
    spec.queue_depth = u32::MAX;
    assert!(
        Hdd::new(&spec)
            .unwrap_err()
            .to_string()
            .contains("queue_depth")
    );
    let mut spec = SsdSpec::intel_710();
    spec.channels = 0;
    assert!(Ssd::new(&spec).is_err());
}

#[test]
fn hdd_out_of_range_offsets_wrap_instead_of_panicking() {
    let spec = HddSpec::savvio_15k3();
    let mut hdd = Hdd::new(&spec).unwrap();
    let r = run_closed_loop(&mut hdd, 2, 10, |i| DeviceIo {
        offset_bytes: u64::MAX - i * 4096,
        size_bytes: u32::MAX,
        dir: IoDir::Read,
    });
    assert_eq!(r.completed, 10);
}

#[test]
fn ssd_latency_and_parallelism() {
    let spec = SsdSpec::intel_710();
    let run = |qd, dir| {
        let mut ssd = Ssd::new(&spec).unwrap();
        let mut rng = SplitMix64(3);
        run_closed_loop(&mut ssd, qd, 20_000, |_| {
            random_io(&mut rng, spec.capacity_bytes, 4 * KIB, dir)
        })
    };
    // QD1: flash latency + one data-path slot.
    let qd1 = run(1, IoDir::Read);
    let expect_ns = 75_000.0 + (1e9 / 38_500.0f64).max(4096.0 / 0.27);
    assert!(
        (qd1.mean_latency_ns / expect_ns - 1.0).abs() < 0.02,
        "{}",
        qd1.mean_latency_ns
    );
    // QD32: the IOPS cap.
    let qd32 = run(32, IoDir::Read);
    assert!(
        (qd32.iops() / 38_500.0 - 1.0).abs() < 0.03,
        "{}",
        qd32.iops()
    );
    // Random writes are bounded by the steady-state write IOPS.
    let w = run(32, IoDir::Write);
    assert!((w.iops() / 2_300.0 - 1.0).abs() < 0.03, "{}", w.iops());
    // Random 64 KiB writes pay garbage collection per 4 KiB; sequential ones only the
    // bandwidth.
    let mut ssd = Ssd::new(&spec).unwrap();
    let mut rng = SplitMix64(4);
    let random = run_closed_loop(&mut ssd, 8, 500, |_| {
        random_io(&mut rng, spec.capacity_bytes, 64 * KIB, IoDir::Write)
    });
    assert!(
        (random.mbps() / (2_300.0 * 4096.0 / 1e6) - 1.0).abs() < 0.03,
        "{}",
        random.mbps()
    );
    let mut ssd = Ssd::new(&spec).unwrap();
    let sequential = run_closed_loop(&mut ssd, 8, 2000, |i| DeviceIo {
        offset_bytes: i * 64 * 1024,
        size_bytes: 64 * KIB,
        dir: IoDir::Write,
    });
    assert!(
        (sequential.mbps() / 170.0 - 1.0).abs() < 0.03,
        "{}",
        sequential.mbps()
    );
    // Sequential large reads: bandwidth.
    let mut ssd = Ssd::new(&spec).unwrap();
    let seq = run_closed_loop(&mut ssd, 8, 2000, |i| DeviceIo {
        offset_bytes: i << 20,
        size_bytes: 1 << 20,
        dir: IoDir::Read,
    });
    assert!((seq.mbps() / 270.0 - 1.0).abs() < 0.03, "{}", seq.mbps());
    assert!(ssd.busy_ns() > 0);
}

#[test]
fn pcie_flash_is_an_order_of_magnitude_faster() {
    let mut flash = Ssd::new(&SsdSpec::iodrive2()).unwrap();
    let mut rng = SplitMix64(5);
    let r = run_closed_loop(&mut flash, 64, 50_000, |_| {
        random_io(&mut rng, 785_000_000_000, 4 * KIB, IoDir::Read)
    });
    assert!(
        r.iops() > 200_000.0 && r.iops() <= 270_000.0 * 1.01,
        "{}",
        r.iops()
    );
}

/// NCQ priority: an urgent command queued behind 31 ordinary ones is served as soon
/// as the command in service finishes, instead of waiting its SPTF turn; a device
/// without priority queueing (the default `submit_urgent`) treats it as ordinary.
#[test]
fn hdd_serves_an_urgent_command_next() {
    let spec = HddSpec::savvio_15k3();
    let cap = spec.capacity_bytes;
    let finish_of_urgent = |urgent: bool, seed: u64| {
        let mut hdd = Hdd::new(&spec).unwrap();
        let mut rng = SplitMix64(seed);
        for t in 0..31 {
            hdd.submit(0, random_io(&mut rng, cap, 8 * KIB, IoDir::Read), t);
        }
        let io = random_io(&mut rng, cap, 8 * KIB, IoDir::Read);
        if urgent {
            hdd.submit_urgent(0, io, 99);
        } else {
            hdd.submit(0, io, 99);
        }
        let mut done = Vec::new();
        while let Some(t) = hdd.next_event_ns() {
            hdd.advance(t, &mut done);
        }
        done.iter().position(|c| c.token == 99).unwrap()
    };
    for seed in 1..20 {
        assert!(
            finish_of_urgent(true, seed) <= 1,
            "seed {seed}: urgent not served next"
        );
    }
    let ordinary: usize = (1..20).map(|s| finish_of_urgent(false, s)).sum();
    assert!(
        ordinary / 19 > 5,
        "without priority it waits its SPTF turn ({ordinary})"
    );
}

#[test]
fn striped_cards_add_their_throughput_and_keep_their_latency() {
    let one = SsdSpec::iodrive2();
    let two = one.striped(2).unwrap();
    let run = |spec: &SsdSpec, qd| {
        let mut ssd = Ssd::new(spec).unwrap();
        let mut rng = SplitMix64(9);
        run_closed_loop(&mut ssd, qd, 40_000, |_| {
            random_io(&mut rng, spec.capacity_bytes, 4 * KIB, IoDir::Read)
        })
    };
    // Saturated: twice the IOPS cap.
    let (a, b) = (run(&one, 128), run(&two, 128));
    assert!(
        (b.iops() / a.iops() - 2.0).abs() < 0.05,
        "{} vs {}",
        b.iops(),
        a.iops()
    );
    // Unloaded: the same flash access; only the data path's few µs shrink (the
    // approximation of perfect striping: 68 + 3.7 µs vs 68 + 1.9 µs).
    let (a, b) = (run(&one, 1), run(&two, 1));
    let r = b.mean_latency_ns / a.mean_latency_ns;
    assert!((0.97..=1.0).contains(&r), "{r}");
    assert_eq!(two.capacity_bytes, 2 * one.capacity_bytes);
    assert!(one.striped(0).is_err() && one.striped(65).is_err());
}

/// Values no device has (a 1e300 µs access, a 1e-300 MB/s path) are refused with
/// the field named, instead of overflowing the nanosecond clock into nonsense: a
/// 1e300 µs SSD used to simulate at 293,000 IOPS.
#[test]
fn absurd_values_are_refused_before_they_overflow() {
    let field = |r: Result<(), weir_model::ModelError>| match r {
        Err(weir_model::ModelError::InvalidField { field, .. }) => field,
        other => panic!("accepted: {other:?}"),
    };
    let ssd = |f: fn(&mut SsdSpec)| {
        let mut s = SsdSpec::iodrive2();
        f(&mut s);
        s
    };
    for (spec, name) in [
        (ssd(|s| s.read_latency_us = 1e300), "read_latency_us"),
        (ssd(|s| s.write_latency_us = f64::NAN), "write_latency_us"),
        (
            ssd(|s| s.read_bandwidth_mbps = 1e-300),
            "read_bandwidth_mbps",
        ),
        (ssd(|s| s.write_iops = 1e-9), "write_iops"),
    ] {
        assert_eq!(field(spec.validate()), name);
        assert!(Ssd::new(&spec).is_err());
    }
    let hdd = |f: fn(&mut HddSpec)| {
        let mut h = HddSpec::savvio_15k3();
        f(&mut h);
        h
    };
    for (spec, name) in [
        (
            hdd(|h| h.full_stroke_seek_ms = 1e300),
            "full_stroke_seek_ms",
        ),
        (
            hdd(|h| h.media_rate_inner_mbps = 1e-300),
            "media_rate_inner_mbps",
        ),
        (
            hdd(|h| h.command_overhead_us = 1e300),
            "command_overhead_us",
        ),
        (hdd(|h| h.rpm = u32::MAX), "rpm"),
    ] {
        assert_eq!(field(spec.validate()), name);
    }
    let ctl = weir_model::ControllerSpec::pcie_gen2();
    let bad = weir_model::ControllerSpec {
        bandwidth_mbps: 1e-300,
        ..ctl.clone()
    };
    assert_eq!(field(bad.validate()), "bandwidth_mbps");
    let bad = weir_model::ControllerSpec {
        backend_mbps: Some(f64::NAN),
        ..ctl.clone()
    };
    assert_eq!(field(bad.validate()), "backend_mbps");
    let bad = weir_model::ControllerSpec {
        max_iops: 1e300,
        ..ctl
    };
    assert_eq!(field(bad.validate()), "max_iops");
    let link = weir_model::LinkSpec::preset("10gbe").unwrap();
    let bad = weir_model::LinkSpec {
        latency_us: 1e300,
        ..link.clone()
    };
    assert_eq!(field(bad.validate()), "latency_us");
    let bad = weir_model::LinkSpec {
        bandwidth_mbps: 1e-300,
        ..link
    };
    assert_eq!(field(bad.validate()), "bandwidth_mbps");
    // The presets themselves are inside the ranges.
    for s in [
        SsdSpec::intel_710(),
        SsdSpec::iodrive2(),
        SsdSpec::ramsan_400(),
    ] {
        s.validate().unwrap();
    }
}
