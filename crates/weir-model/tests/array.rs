//! Whole-array behaviour: controller cap, RAID costs through the controller, cache
//! policies, determinism, TOML specs.

use weir_model::harness::{SplitMix64, run_closed_loop};
use weir_model::{
    Array, ArraySpec, BatteryState, Completion, Component, ControllerRef, ControllerSpec, DeviceIo,
    DriveRef, IoDir, IoPolicy, PolicyOverride, RaidSpec, ReadPolicy, WritePolicy,
};

const KIB: u32 = 1024;

fn spec(level: u32, drives: u32, controller: &str, policy: PolicyOverride) -> ArraySpec {
    ArraySpec {
        controller: ControllerRef::Preset(controller.into()),
        raid: RaidSpec::new(level, drives, 64 * KIB),
        drive: DriveRef::Preset("sas-15k".into()),
        policy,
        clone_cache: None,
    }
}

fn write_through() -> PolicyOverride {
    PolicyOverride {
        write_policy: Some(WritePolicy::WriteThrough),
        read_policy: Some(ReadPolicy::NoReadAhead),
        io_policy: Some(IoPolicy::Direct),
        ..PolicyOverride::default()
    }
}

fn seq(size: u32, dir: IoDir) -> impl FnMut(u64) -> DeviceIo {
    move |i| DeviceIo {
        offset_bytes: i * size as u64,
        size_bytes: size,
        dir,
    }
}

/// MB/s of `ios` 1 MiB sequential reads, `queue_depth` at a time, on a write-through
/// RAID 0 of `drives` behind `controller`.
fn raid0_sequential_read_mbps(drives: u32, controller: &str, queue_depth: u32, ios: u64) -> f64 {
    let mut a = Array::new(&spec(0, drives, controller, write_through()), 1).unwrap();
    run_closed_loop(&mut a, queue_depth, ios, seq(1 << 20, IoDir::Read)).mbps()
}

#[test]
fn raid0_x24_sequential_read_is_capped_by_the_controller() {
    // 24 drives could stream ≈ 24 × 200 MB/s; PCIe Gen2 x8 caps at 2,800 MB/s.
    let gen2 = raid0_sequential_read_mbps(24, "pcie-gen2", 32, 3000);
    assert!((gen2 / 2800.0 - 1.0).abs() < 0.03, "gen2 {gen2:.0} MB/s");
    let gen3 = raid0_sequential_read_mbps(24, "pcie-gen3", 32, 3000);
    assert!((gen3 / 4000.0 - 1.0).abs() < 0.05, "gen3 {gen3:.0} MB/s");
    // Few drives: drive-bound, ≈ media rate each.
    let four = raid0_sequential_read_mbps(4, "pcie-gen2", 16, 800);
    assert!((600.0..=830.0).contains(&four), "4 drives {four:.0} MB/s");
}

/// MB/s of 1 MiB sequential writes, 24 at a time, on a write-through array of 24
/// drives (disk caches on, so the drives stream) behind `controller`.
fn sequential_write_mbps(level: u32, controller: ControllerSpec) -> f64 {
    let policy = PolicyOverride {
        disk_cache: Some(true),
        ..write_through()
    };
    let spec = ArraySpec {
        controller: ControllerRef::Custom(controller),
        ..spec(level, 24, "pcie-gen2", policy)
    };
    let mut a = Array::new(&spec, 1).unwrap();
    run_closed_loop(&mut a, 24, 2000, seq(1 << 20, IoDir::Write)).mbps()
}

#[test]
fn mirrored_bytes_cross_the_drive_side_links_twice() {
    let gen2 = ControllerSpec::pcie_gen2();
    let backend = gen2.backend_mbps.expect("the SAS2208 has a drive side");
    // RAID 0: every host byte crosses the drive side once; the host side (2,800) binds.
    let raid0 = sequential_write_mbps(0, gen2.clone());
    assert!(
        (raid0 / 2800.0 - 1.0).abs() < 0.03,
        "RAID 0 {raid0:.0} MB/s"
    );
    // RAID 10: twice, so half the drive side (002 Figure 7: half of RAID 0).
    let raid10 = sequential_write_mbps(10, gen2.clone());
    assert!(
        (raid10 / (backend / 2.0) - 1.0).abs() < 0.03,
        "RAID 10 {raid10:.0} MB/s against {backend} / 2"
    );
    // Without the term, the 12 mirrored pairs' media rate binds instead: more.
    let unmodelled = ControllerSpec {
        backend_mbps: None,
        ..gen2
    };
    let free = sequential_write_mbps(10, unmodelled);
    assert!(
        free > raid10 * 1.1,
        "RAID 10 without the drive side {free:.0} MB/s"
    );
}

#[test]
fn raid_write_penalties_reach_the_drives() {
    let mut rng = SplitMix64(11);
    let mut run = |level: u32| {
        let mut a = Array::new(&spec(level, 24, "pcie-gen2", write_through()), 1).unwrap();
        let cap = a.capacity_bytes() / 8192;
        let r = run_closed_loop(&mut a, 8, 400, |_| DeviceIo {
            offset_bytes: rng.below(cap) * 8192,
            size_bytes: 8 * KIB,
            dir: IoDir::Write,
        });
        assert_eq!(r.completed, 400);
        let s = a.stats();
        let per_write = (s.drive_reads + s.drive_writes) as f64 / 400.0;
        let drive_ios: u64 = a
            .drive_stats()
            .iter()
            .map(|d| d.stats.reads + d.stats.writes)
            .sum();
        assert_eq!(drive_ios, s.drive_reads + s.drive_writes);
        (per_write, r.iops())
    };
    let (r5, r5_iops) = run(5);
    let (r10, r10_iops) = run(10);
    let (r0, r0_iops) = run(0);
    assert_eq!(r5, 4.0);
    assert_eq!(r10, 2.0);
    assert_eq!(r0, 1.0);
    assert!(
        r0_iops > r10_iops && r10_iops > r5_iops,
        "{r0_iops} {r10_iops} {r5_iops}"
    );
}

#[test]
fn write_back_absorbs_a_burst_faster_than_write_through() {
    let burst = |policy: PolicyOverride| {
        let mut a = Array::new(&spec(5, 24, "pcie-gen2", policy), 1).unwrap();
        let mut rng = SplitMix64(5);
        let cap = a.capacity_bytes() / 8192;
        // 2,000 random 8 KiB writes arriving at once.
        run_closed_loop(&mut a, 2000, 2000, |_| DeviceIo {
            offset_bytes: rng.below(cap) * 8192,
            size_bytes: 8 * KIB,
            dir: IoDir::Write,
        })
    };
    let wb = burst(PolicyOverride {
        write_policy: Some(WritePolicy::WriteBack),
        ..PolicyOverride::default()
    });
    let wt = burst(write_through());
    assert!(
        wb.elapsed_ns * 20 < wt.elapsed_ns,
        "write-back {} ns vs write-through {} ns",
        wb.elapsed_ns,
        wt.elapsed_ns
    );
}

#[test]
fn write_back_without_battery_falls_back_unless_forced() {
    let mk = |wp, battery| {
        Array::new(
            &spec(
                5,
                8,
                "pcie-gen2",
                PolicyOverride {
                    write_policy: Some(wp),
                    battery: Some(battery),
                    ..PolicyOverride::default()
                },
            ),
            1,
        )
        .unwrap()
        .write_back_in_effect()
    };
    assert!(mk(WritePolicy::WriteBack, BatteryState::Good));
    assert!(!mk(WritePolicy::WriteBack, BatteryState::Failed));
    assert!(!mk(WritePolicy::WriteBack, BatteryState::Absent));
    assert!(mk(WritePolicy::AlwaysWriteBack, BatteryState::Absent));
    assert!(!mk(WritePolicy::WriteThrough, BatteryState::Good));
}

/// A small cache fills up, after which writes run at the drives' pace.
#[test]
fn sustained_write_back_is_bounded_by_the_drives() {
    let mut c = ControllerSpec::pcie_gen2();
    c.cache_mib = 8;
    c.write_policy = WritePolicy::WriteBack;
    let sp = ArraySpec {
        controller: ControllerRef::Custom(c),
        ..spec(5, 8, "pcie-gen2", PolicyOverride::default())
    };
    let mut rng = SplitMix64(9);
    let mut a = Array::new(&sp, 1).unwrap();
    let cap = a.capacity_bytes() / 8192;
    let r = run_closed_loop(&mut a, 32, 6000, |_| DeviceIo {
        offset_bytes: rng.below(cap) * 8192,
        size_bytes: 8 * KIB,
        dir: IoDir::Write,
    });
    let s = a.stats();
    assert!(s.write_stalls > 0, "{s:?}");
    assert!(s.destage_ops > 0);
    // 8 drives × at most ≈ 600 IOPS each with deep queues, 4 I/Os per RAID 5 write.
    assert!(r.iops() < 8.0 * 600.0 / 4.0 * 1.5, "{}", r.iops());
    assert!(a.dirty_bytes() <= 6 << 20);
}

#[test]
fn writes_larger_than_the_dirty_space_bypass_the_cache() {
    let mut c = ControllerSpec::pcie_gen2();
    c.cache_mib = 1; // 768 KiB of dirty space
    let sp = ArraySpec {
        controller: ControllerRef::Custom(c),
        ..spec(5, 8, "pcie-gen2", PolicyOverride::default())
    };
    let mut a = Array::new(&sp, 1).unwrap();
    let r = run_closed_loop(&mut a, 4, 40, |i| DeviceIo {
        offset_bytes: i * (4 << 20),
        size_bytes: if i % 2 == 0 { 4 << 20 } else { 8 * KIB },
        dir: IoDir::Write,
    });
    assert_eq!(r.completed, 40);
    assert_eq!(a.stats().writes_cached, 20);
    assert_eq!(a.host_in_flight(), 0);
}

#[test]
fn write_back_coalesces_sequential_writes_into_full_stripes() {
    let mut a = Array::new(
        &spec(
            5,
            8,
            "pcie-gen2",
            PolicyOverride {
                write_policy: Some(WritePolicy::WriteBack),
                ..PolicyOverride::default()
            },
        ),
        1,
    )
    .unwrap();
    // 3,500 × 64 KiB = 500 whole rows of 7 data strips.
    let r = run_closed_loop(&mut a, 16, 3500, seq(64 * KIB, IoDir::Write));
    assert_eq!(r.completed, 3500);
    // Let the destager drain (drive everything to idle).
    let mut done = Vec::new();
    while let Some(t) = a.next_event_ns() {
        a.advance(t, &mut done);
    }
    let s = a.stats();
    assert_eq!(a.dirty_bytes(), 0);
    // Full-stripe writes: no parity reads at all.
    assert_eq!(s.drive_reads, 0, "{s:?}");
    // Data plus 1/7 parity.
    let written: u64 = a.drive_stats().iter().map(|d| d.stats.write_bytes).sum();
    let expected = 3500 * 64 * 1024 * 8 / 7;
    assert!(
        (written as f64 / expected as f64 - 1.0).abs() < 0.01,
        "{written}"
    );
}

#[test]
fn read_ahead_turns_a_sequential_stream_into_cache_hits() {
    let run = |rp| {
        let mut a = Array::new(
            &spec(
                10,
                8,
                "pcie-gen2",
                PolicyOverride {
                    read_policy: Some(rp),
                    io_policy: Some(IoPolicy::Direct),
                    ..PolicyOverride::default()
                },
            ),
            1,
        )
        .unwrap();
        let r = run_closed_loop(&mut a, 1, 2000, seq(64 * KIB, IoDir::Read));
        (r, a.stats())
    };
    let (plain, plain_stats) = run(ReadPolicy::NoReadAhead);
    let (ra, ra_stats) = run(ReadPolicy::ReadAhead);
    let (adaptive, _) = run(ReadPolicy::Adaptive);
    assert_eq!(plain_stats.read_cache_hits, 0);
    assert!(ra_stats.read_cache_hits > 1800, "{ra_stats:?}");
    assert!(
        ra.mbps() > 1.5 * plain.mbps(),
        "{} vs {}",
        ra.mbps(),
        plain.mbps()
    );
    assert!(adaptive.mbps() > 1.5 * plain.mbps());
}

#[test]
fn cached_io_serves_re_reads_direct_does_not() {
    let run = |io_policy| {
        let mut a = Array::new(
            &spec(
                5,
                8,
                "pcie-gen2",
                PolicyOverride {
                    io_policy: Some(io_policy),
                    read_policy: Some(ReadPolicy::NoReadAhead),
                    ..PolicyOverride::default()
                },
            ),
            1,
        )
        .unwrap();
        // 100 distinct random blocks, each read 5 times, one at a time (at higher
        // depths a repeat can overtake the first read still on the drives).
        let mut rng = SplitMix64(1);
        let blocks: Vec<u64> = (0..100).map(|_| rng.below(1 << 20) * 8192).collect();
        run_closed_loop(&mut a, 1, 500, |i| DeviceIo {
            offset_bytes: blocks[(i % 100) as usize],
            size_bytes: 8 * KIB,
            dir: IoDir::Read,
        });
        a.stats().read_cache_hits
    };
    assert_eq!(run(IoPolicy::Cached), 400);
    assert_eq!(run(IoPolicy::Direct), 0);
}

fn mixed_run(seed_offsets: u64) -> Vec<Completion> {
    let mut a = Array::from_preset("15k-sas-raid5x24", 42).unwrap();
    let mut rng = SplitMix64(seed_offsets);
    let cap = a.capacity_bytes() / 8192;
    run_closed_loop(&mut a, 48, 3000, |_| DeviceIo {
        offset_bytes: rng.below(cap) * 8192,
        size_bytes: 8 * KIB,
        dir: if rng.below(10) < 7 {
            IoDir::Read
        } else {
            IoDir::Write
        },
    })
    .completions
}

#[test]
fn same_inputs_same_completions() {
    let a = mixed_run(3);
    assert_eq!(a.len(), 3000);
    assert_eq!(a, mixed_run(3));
    assert_ne!(a, mixed_run(4));
}

#[test]
fn all_presets_build_and_serve_io() {
    for name in weir_model::ARRAY_PRESETS {
        let mut a = Array::from_preset(name, 0).unwrap();
        let r = run_closed_loop(&mut a, 8, 200, seq(64 * KIB, IoDir::Write));
        assert_eq!(r.completed, 200, "{name}");
        assert!(a.busy_ns() > 0, "{name}");
    }
    for drive in [
        "sas-15k",
        "sas-15k-lff",
        "sas-10k",
        "sata-7200",
        "sata-ssd",
        "pcie-flash",
    ] {
        let sp = ArraySpec {
            drive: DriveRef::Preset(drive.into()),
            ..spec(6, 6, "pcie-gen3", PolicyOverride::default())
        };
        let mut a = Array::new(&sp, 0).unwrap();
        let r = run_closed_loop(&mut a, 4, 50, seq(64 * KIB, IoDir::Read));
        assert_eq!(r.completed, 50, "{drive}");
    }
    let err = Array::from_preset("raid7", 0).unwrap_err().to_string();
    assert!(err.contains("15k-sas-raid5x24"), "{err}");
}

#[test]
fn array_spec_from_toml() {
    let s: ArraySpec = toml::from_str(
        r#"
        controller = "pcie-gen3"
        drive = "sas-10k"
        raid = { level = 50, drives = 12, stripe_element_bytes = 262144, spans = 2 }
        policy = { write_policy = "always-write-back", battery = "absent", read_policy = "adaptive" }
        "#,
    )
    .unwrap();
    let a = Array::new(&s, 0).unwrap();
    assert!(a.write_back_in_effect());
    assert_eq!(a.controller().bandwidth_mbps, 5500.0);
    assert_eq!(a.controller().backend_mbps, Some(4000.0));
    assert_eq!(a.layout().row_bytes(), 5 * 262144);

    let custom: ArraySpec = toml::from_str(
        r#"
        raid = { level = 6, drives = 8, stripe_element_bytes = 65536 }
        [controller]
        bandwidth_mbps = 1000.0
        max_iops = 100000.0
        cache_mib = 512
        write_policy = "write-through"
        read_policy = "no-read-ahead"
        io_policy = "direct"
        battery = "good"
        [drive]
        kind = "ssd"
        read_latency_us = 80.0
        write_latency_us = 90.0
        channels = 8
        read_bandwidth_mbps = 500.0
        write_bandwidth_mbps = 400.0
        read_iops = 50000.0
        write_iops = 20000.0
        capacity_bytes = 200000000000
        "#,
    )
    .unwrap();
    let a = Array::new(&custom, 0).unwrap();
    assert!(!a.write_back_in_effect());

    let unknown = toml::from_str::<ArraySpec>(
        r#"
        controller = "pcie-gen2"
        drive = "sas-15k"
        raid = { level = 5, drives = 8, stripe_element_bytes = 65536, stripes = 2 }
        "#,
    );
    assert!(unknown.unwrap_err().to_string().contains("stripes"));

    let bad_preset: ArraySpec = toml::from_str(
        r#"
        controller = "pcie-gen9"
        drive = "sas-15k"
        raid = { level = 5, drives = 8, stripe_element_bytes = 65536 }
        "#,
    )
    .unwrap();
    let err = Array::new(&bad_preset, 0).unwrap_err().to_string();
    assert!(
        err.contains("pcie-gen9") && err.contains("pcie-gen2"),
        "{err}"
    );
    let bad_raid = ArraySpec {
        raid: RaidSpec::new(5, 2, 65536),
        ..bad_preset
    };
    assert!(Array::new(&bad_raid, 0).is_err());
}

/// Open-loop arrivals driven two ways — exactly at each event, and with extra
/// `advance` calls on a fixed 37 µs grid — must give identical completions.
#[test]
fn extra_advance_calls_do_not_change_results() {
    let arrivals: Vec<(u64, DeviceIo)> = {
        let mut rng = SplitMix64(77);
        (0..3000u64)
            .map(|i| {
                let io = DeviceIo {
                    offset_bytes: rng.below(1 << 24) * 8192,
                    size_bytes: (8 * KIB) << rng.below(4),
                    dir: if rng.below(10) < 6 {
                        IoDir::Read
                    } else {
                        IoDir::Write
                    },
                };
                (i * 150_000, io)
            })
            .collect()
    };
    let drive = |grid_ns: Option<u64>| {
        let mut a = Array::from_preset("15k-sas-raid5x24", 0).unwrap();
        let mut done = Vec::new();
        let mut next_grid = grid_ns.unwrap_or(u64::MAX);
        let mut i = 0;
        loop {
            let next_arrival = arrivals.get(i).map_or(u64::MAX, |a| a.0);
            let next_event = a.next_event_ns().unwrap_or(u64::MAX);
            let t = next_arrival.min(next_event).min(next_grid);
            if t == u64::MAX {
                break;
            }
            a.advance(t, &mut done);
            if t == next_grid {
                next_grid += grid_ns.unwrap_or(0);
                if i >= arrivals.len() && a.next_event_ns().is_none() {
                    break;
                }
            }
            while i < arrivals.len() && arrivals[i].0 == t {
                a.submit(t, arrivals[i].1, i as u64);
                i += 1;
            }
        }
        done
    };
    let exact = drive(None);
    assert_eq!(exact.len(), 3000);
    assert!(exact.windows(2).all(|w| w[0].at_ns <= w[1].at_ns));
    assert_eq!(exact, drive(Some(37_000)));
}
