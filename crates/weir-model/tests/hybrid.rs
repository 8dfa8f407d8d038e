//! Hybrid flash + disk array: dynamic data placement.

use weir_model::harness::SplitMix64;
use weir_model::{
    ArraySpec, Component, ControllerRef, DeviceIo, DriveRef, HybridArray, HybridSpec, IoDir,
    PolicyOverride, RaidSpec, SsdSpec,
};

const MIB: u64 = 1 << 20;

fn spec(flash_extents: u64) -> HybridSpec {
    HybridSpec {
        disk: ArraySpec {
            controller: ControllerRef::Preset("pcie-gen2".into()),
            raid: RaidSpec::new(10, 8, 64 << 10),
            drive: DriveRef::Preset("sata-7200".into()),
            policy: PolicyOverride::default(),
            clone_cache: None,
        },
        flash: SsdSpec::iodrive2(),
        flash_devices: 1,
        flash_capacity_bytes: flash_extents * MIB,
        extent_bytes: MIB,
        promote_heat: 3.0,
        heat_half_life_ms: 60_000.0,
        migration_mbps: 400.0,
        write_log_bytes: 64 * MIB,
    }
}

/// Closed loop at `qd`; returns per-request (submit ns, latency ns) in completion
/// order and the end time.
fn run(
    a: &mut HybridArray,
    start_ns: u64,
    qd: u32,
    n: u64,
    mut next: impl FnMut(u64) -> DeviceIo,
) -> (Vec<(u64, u64)>, u64) {
    let mut at = vec![0u64; n as usize];
    let mut issued = 0;
    for _ in 0..qd.min(n as u32) {
        at[issued as usize] = start_ns;
        a.submit(start_ns, next(issued), issued);
        issued += 1;
    }
    let mut out = Vec::new();
    let mut done = Vec::new();
    let mut now = start_ns;
    while (out.len() as u64) < n {
        let t = a.next_event_ns().expect("requests outstanding");
        done.clear();
        a.advance(t, &mut done);
        now = t;
        for c in &done {
            out.push((at[c.token as usize], c.at_ns - at[c.token as usize]));
            if issued < n {
                at[issued as usize] = c.at_ns;
                a.submit(c.at_ns, next(issued), issued);
                issued += 1;
            }
        }
    }
    (out, now)
}

fn mean_ms(v: &[(u64, u64)]) -> f64 {
    v.iter().map(|x| x.1 as f64).sum::<f64>() / v.len() as f64 / 1e6
}

#[test]
fn hot_set_migrates_to_flash_and_latency_drops() {
    let mut a = HybridArray::new(&spec(1024), 1).unwrap();
    let mut rng = SplitMix64(2);
    // 64 MiB hot set, random 4 KiB reads.
    let (lat, _) = run(&mut a, 0, 8, 40_000, |_| DeviceIo {
        offset_bytes: (1 << 30) + rng.below(64 * MIB / 4096) * 4096,
        size_bytes: 4096,
        dir: IoDir::Read,
    });
    let early = mean_ms(&lat[..500]);
    let late = mean_ms(&lat[lat.len() - 10_000..]);
    let s = a.stats();
    assert!(
        early > 3.0,
        "early reads come from 7,200 rpm disks: {early} ms"
    );
    assert!(late < 0.3, "late reads come from flash: {late} ms");
    assert_eq!(s.promotions, 64, "{s:?}");
    assert_eq!(s.resident_extents, 64);
    assert!(s.mean_flash_read_latency_ms() < 0.3);
    assert!(s.mean_disk_read_latency_ms() > 3.0);
    assert!(s.flash_read_ratio() > 0.5, "{s:?}");
    assert!(a.is_on_flash((1 << 30) + 5 * MIB));
    assert!(!a.is_on_flash(0));
}

#[test]
fn a_single_pass_scan_is_not_promoted() {
    let mut a = HybridArray::new(&spec(1024), 1).unwrap();
    run(&mut a, 0, 4, 4096, |i| DeviceIo {
        offset_bytes: i * 256 * 1024,
        size_bytes: 256 * 1024,
        dir: IoDir::Read,
    });
    // Each 1 MiB extent is touched by 4 reads: heat 4 ≥ 3 → promoted. A 1 MiB-read
    // scan touches each extent once and must not be promoted.
    let promoted = a.stats().promotions;
    let mut b = HybridArray::new(&spec(1024), 1).unwrap();
    run(&mut b, 0, 4, 1024, |i| DeviceIo {
        offset_bytes: i * MIB,
        size_bytes: MIB as u32,
        dir: IoDir::Read,
    });
    assert_eq!(b.stats().promotions, 0);
    assert!(promoted > 0);
}

#[test]
fn writes_land_on_flash_and_are_destaged() {
    let mut a = HybridArray::new(&spec(1024), 1).unwrap();
    let mut rng = SplitMix64(4);
    let (lat, end) = run(&mut a, 0, 8, 4000, |_| DeviceIo {
        offset_bytes: rng.below(1 << 18) * 8192,
        size_bytes: 8192,
        dir: IoDir::Write,
    });
    let s = a.stats();
    // All writes land on flash: in the log, or in place for the few extents hot
    // enough to have been promoted meanwhile.
    assert_eq!(s.log_writes + s.flash_writes, 4000, "{s:?}");
    assert!(s.log_writes > 3900, "{s:?}");
    assert!(
        mean_ms(&lat) < 0.5,
        "acked at flash speed: {} ms",
        mean_ms(&lat)
    );
    // Drain: the log empties into the disk tier.
    let mut done = Vec::new();
    while let Some(t) = a.next_event_ns() {
        a.advance(t.max(end), &mut done);
    }
    let s = a.stats();
    assert_eq!(a.write_log_bytes(), 0);
    assert_eq!(s.destaged_bytes, s.log_writes * 8192);
    assert_eq!(a.disk().stats().host_writes, s.log_writes);
}

#[test]
fn full_log_sends_writes_to_disk() {
    let mut sp = spec(1024);
    sp.write_log_bytes = MIB;
    sp.migration_mbps = 1.0; // destage far slower than the writes arrive
    let mut a = HybridArray::new(&sp, 1).unwrap();
    let mut rng = SplitMix64(4);
    run(&mut a, 0, 8, 2000, |_| DeviceIo {
        offset_bytes: rng.below(1 << 18) * 8192,
        size_bytes: 8192,
        dir: IoDir::Write,
    });
    let s = a.stats();
    assert!(s.disk_writes > 1500, "{s:?}");
    assert!(s.log_writes <= 130, "{s:?}");
}

#[test]
fn dirty_extents_are_written_back_before_demotion() {
    // Flash holds 8 extents; two hot sets of 8 in turn. A round lasts several
    // half-lives, so the set of the round before cools below the displacement
    // bar (DISPLACE_FACTOR × its heat) while the new one heats up.
    let mut sp = spec(8);
    sp.heat_half_life_ms = 1_000.0;
    let mut a = HybridArray::new(&sp, 1).unwrap();
    let mut rng = SplitMix64(6);
    let mut now = 0;
    for round in 0..4u64 {
        let base = (round % 2) * 64 * MIB;
        let (_, end) = run(&mut a, now, 4, 6000, |_| DeviceIo {
            offset_bytes: base + rng.below(8 * MIB / 4096) * 4096,
            size_bytes: 4096,
            dir: if rng.below(4) == 0 {
                IoDir::Write
            } else {
                IoDir::Read
            },
        });
        now = end;
    }
    let s = a.stats();
    assert!(s.resident_extents <= 8);
    assert!(s.demotions >= 8, "{s:?}");
    assert!(s.write_backs >= 1, "{s:?}");
    assert!(s.promotions >= 16, "{s:?}");
}

#[test]
fn preset_and_validation() {
    let a = HybridArray::from_preset("iocontrol-n5-150", 0).unwrap();
    // 16 × 3 TB in RAID 10.
    let tb = a.capacity_bytes() as f64 / 1e12;
    assert!((23.0..24.1).contains(&tb), "{tb} TB");
    assert_eq!(a.spec().flash_capacity_bytes, 2_400_000_000_000);
    assert!(HybridArray::from_preset("n6", 0).is_err());
    let mut bad = spec(8);
    bad.flash_capacity_bytes = 1 << 50;
    assert!(HybridArray::new(&bad, 0).is_err());
    let mut bad = spec(8);
    bad.extent_bytes = 3 * MIB;
    assert!(HybridArray::new(&bad, 0).is_err());
    let mut bad = spec(8);
    bad.migration_mbps = 0.0;
    assert!(HybridArray::new(&bad, 0).is_err());
    let toml_spec: HybridSpec = toml::from_str(
        r#"
flash_devices = 2
flash_capacity_bytes = 1000000000
disk = { controller = "pcie-gen2", drive = "sata-7200", raid = { level = 10, drives = 8, stripe_element_bytes = 65536 } }
"#,
    )
    .unwrap();
    assert_eq!(toml_spec.extent_bytes, MIB);
    assert!(HybridArray::new(&toml_spec, 0).is_ok());
}

#[test]
fn deterministic() {
    let go = || {
        let mut a = HybridArray::new(&spec(16), 3).unwrap();
        let mut rng = SplitMix64(8);
        let (lat, _) = run(&mut a, 0, 8, 5000, |_| DeviceIo {
            offset_bytes: rng.below(64 * MIB / 4096) * 4096,
            size_bytes: 4096,
            dir: if rng.below(3) == 0 {
                IoDir::Write
            } else {
                IoDir::Read
            },
        });
        (lat, a.stats())
    };
    assert_eq!(go(), go());
}

mod props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Any request mix completes; placement stays within the flash capacity; the
        /// write log drains completely once idle.
        #[test]
        fn requests_complete_and_log_drains(
            ios in proptest::collection::vec((0u64..24, 0u64..256, 1u32..64, any::<bool>()), 1..300),
            qd in 1u32..32,
            flash_extents in 1u64..12,
            log_kib in prop_oneof![Just(64u64), Just(65536)],
        ) {
            let mut sp = spec(flash_extents);
            sp.promote_heat = 2.0;
            sp.write_log_bytes = log_kib * 1024;
            let mut a = HybridArray::new(&sp, 1).unwrap();
            let (lat, end) = run(&mut a, 0, qd, ios.len() as u64, |i| {
                let (extent, page, pages, write) = ios[i as usize];
                DeviceIo {
                    offset_bytes: extent * MIB + page * 4096,
                    size_bytes: pages * 4096,
                    dir: if write { IoDir::Write } else { IoDir::Read },
                }
            });
            prop_assert_eq!(lat.len(), ios.len());
            prop_assert!(a.stats().resident_extents <= flash_extents);
            let mut done = Vec::new();
            while let Some(t) = a.next_event_ns() {
                a.advance(t.max(end), &mut done);
            }
            prop_assert!(done.is_empty(), "no host completions after the run");
            prop_assert_eq!(a.write_log_bytes(), 0);
            let s = a.stats();
            prop_assert_eq!(s.flash_reads + s.disk_reads, s.host_reads);
            prop_assert_eq!(s.flash_writes + s.log_writes + s.disk_writes, s.host_writes);
        }
    }
}
