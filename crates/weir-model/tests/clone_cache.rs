//! Clone-aware array cache: N linked clones booting from one golden image.

use weir_model::harness::{ClosedLoopResult, SplitMix64, run_closed_loop};
use weir_model::{
    Array, ArraySpec, CloneCacheSpec, Component, ControllerRef, DeviceIo, DriveRef, IoDir,
    PolicyOverride, RaidSpec, WritePolicy,
};

const MIB: u64 = 1 << 20;
const IMAGE_BYTES: u64 = 256 * MIB;

fn array(aware: bool, size_mib: u64) -> Array {
    let spec = ArraySpec {
        controller: ControllerRef::Preset("pcie-gen2".into()),
        raid: RaidSpec::new(5, 8, 64 << 10),
        drive: DriveRef::Preset("sas-15k".into()),
        policy: PolicyOverride {
            write_policy: Some(WritePolicy::WriteThrough),
            ..PolicyOverride::default()
        },
        clone_cache: Some(CloneCacheSpec {
            size_mib,
            aware,
            block_bytes: 4096,
            policy: Default::default(),
        }),
    };
    Array::new(&spec, 1).unwrap()
}

/// Registers the image at 0 and `n` clones after it; returns the clone base offsets.
fn clones(a: &mut Array, n: u64) -> Vec<u64> {
    let img = a.add_image(0, IMAGE_BYTES).unwrap();
    (1..=n)
        .map(|i| {
            let base = i * IMAGE_BYTES;
            a.add_clone(base, IMAGE_BYTES, img).unwrap();
            base
        })
        .collect()
}

/// Each clone boots: reads the same 16 MiB of boot blocks (64 KiB reads in a
/// clone-specific order), one clone after another.
fn boot(a: &mut Array, bases: &[u64]) -> ClosedLoopResult {
    let boot_reads = 16 * MIB / 65536;
    let mut rng = SplitMix64(7);
    let mut order: Vec<u64> = Vec::new();
    let n = bases.len() as u64;
    run_closed_loop(a, 8, n * boot_reads, |i| {
        if i % boot_reads == 0 {
            order = (0..boot_reads).collect();
            for k in (1..order.len()).rev() {
                order.swap(k, rng.below(k as u64 + 1) as usize);
            }
        }
        let clone = bases[(i / boot_reads) as usize];
        DeviceIo {
            // Boot blocks spread over the first 128 MiB of the image.
            offset_bytes: clone + order[(i % boot_reads) as usize] * 8 * 65536,
            size_bytes: 65536,
            dir: IoDir::Read,
        }
    })
}

/// An array whose clone cache holds `size_mib`, the image and `n` clones of it, each
/// clone booted once; returns the array, the clone bases and the boot's result.
fn booted(aware: bool, size_mib: u64, n: u64) -> (Array, Vec<u64>, ClosedLoopResult) {
    let mut a = array(aware, size_mib);
    let bases = clones(&mut a, n);
    let result = boot(&mut a, &bases);
    (a, bases, result)
}

#[test]
fn clone_aware_cache_reads_shared_blocks_once() {
    let n = 12;
    let (aware, _, ra) = booted(true, 1024, n);
    let (unaware, _, ru) = booted(false, 1024, n);
    let (sa, su) = (aware.stats(), unaware.stats());
    let (ca, cu) = (
        aware.clone_cache_stats().unwrap(),
        unaware.clone_cache_stats().unwrap(),
    );
    // Aware: the first clone reads the 16 MiB from disk, the others hit (reads of
    // the next clone overlapping the previous clone's reads still in flight wait
    // for them instead of reading again).
    let boot_blocks = 16 * MIB / 4096;
    assert_eq!(ca.shared_block_misses, boot_blocks, "{ca:?}");
    // Unaware: every clone reads them again.
    assert_eq!(cu.shared_block_misses, n * boot_blocks, "{cu:?}");
    let ratio = su.drive_reads as f64 / sa.drive_reads as f64;
    assert!(
        (0.9 * n as f64..1.1 * n as f64).contains(&ratio),
        "drive reads aware {} unaware {} ratio {ratio}",
        sa.drive_reads,
        su.drive_reads
    );
    assert!(sa.read_cache_hits >= (n - 1) * 256 - 8, "{sa:?}");
    // Boot storm time: much shorter when one copy serves all clones.
    assert!(
        ru.elapsed_ns as f64 > 4.0 * ra.elapsed_ns as f64,
        "aware {} ms, unaware {} ms",
        ra.elapsed_ns / 1_000_000,
        ru.elapsed_ns / 1_000_000
    );
}

#[test]
fn unaware_cache_is_polluted_by_copies() {
    // A cache holding 4 × the boot set: enough for all clones only if aware.
    let n = 12;
    let (mut aware, ba, _) = booted(true, 64, n);
    let (mut unaware, bu, _) = booted(false, 64, n);
    // Second boot of every clone.
    let first = aware.clone_cache_stats().unwrap();
    boot(&mut aware, &ba);
    let before = unaware.clone_cache_stats().unwrap();
    boot(&mut unaware, &bu);
    let ca = aware.clone_cache_stats().unwrap();
    let cu = unaware.clone_cache_stats().unwrap();
    assert_eq!(
        ca.shared_block_misses, first.shared_block_misses,
        "second boot all hits"
    );
    assert!(cu.evicted_blocks > 0);
    assert!(
        cu.shared_block_misses - before.shared_block_misses >= (n - 4) * 16 * MIB / 4096,
        "{cu:?}"
    );
}

#[test]
fn clone_writes_are_redirected_to_the_clone() {
    let mut a = array(true, 64);
    let img = a.add_image(0, IMAGE_BYTES).unwrap();
    let c1 = a.add_clone(IMAGE_BYTES, IMAGE_BYTES, img).unwrap();
    let c2 = a.add_clone(2 * IMAGE_BYTES, IMAGE_BYTES, img).unwrap();
    let mut done = Vec::new();
    let mut now = 0;
    let mut io = |a: &mut Array, off, dir| {
        a.submit(
            now,
            DeviceIo {
                offset_bytes: off,
                size_bytes: 8192,
                dir,
            },
            0,
        );
        while let Some(t) = a.next_event_ns() {
            a.advance(t, &mut done);
            now = t;
        }
    };
    io(&mut a, IMAGE_BYTES + 65536, IoDir::Write);
    assert_eq!(a.clone_delta_blocks(c1), Some((2, IMAGE_BYTES / 4096)));
    assert_eq!(a.clone_delta_blocks(c2), Some((0, IMAGE_BYTES / 4096)));
    // Clone 2 reads the image's block (not in cache: a disk read).
    let before = a.clone_cache_stats().unwrap();
    io(&mut a, 2 * IMAGE_BYTES + 65536, IoDir::Read);
    let s = a.clone_cache_stats().unwrap();
    assert_eq!(s.shared_block_misses - before.shared_block_misses, 2);
    // Clone 1 reads its own written block: a hit, not shared.
    io(&mut a, IMAGE_BYTES + 65536, IoDir::Read);
    let s2 = a.clone_cache_stats().unwrap();
    assert_eq!(s2.read_hits, s.read_hits + 1);
    assert_eq!(s2.redirected_blocks, 2);
}

#[test]
fn clone_map_errors() {
    let mut plain = Array::from_preset("15k-sas-raid5x24", 0).unwrap();
    let e = plain.add_image(0, IMAGE_BYTES).unwrap_err().to_string();
    assert!(e.contains("clone_cache"), "{e}");
    let mut a = array(true, 64);
    let img = a.add_image(0, IMAGE_BYTES).unwrap();
    assert!(a.add_image(MIB, IMAGE_BYTES).is_err(), "overlap");
    assert!(
        a.add_clone(IMAGE_BYTES + 1, IMAGE_BYTES, img).is_err(),
        "unaligned"
    );
    assert!(a.add_clone(IMAGE_BYTES, MIB, img).is_err(), "size");
    assert!(
        a.add_clone(IMAGE_BYTES, IMAGE_BYTES, weir_model::ImageId(9))
            .is_err()
    );
    let cap = a.capacity_bytes();
    assert!(a.add_image(cap - 4096, 8192).is_err(), "beyond capacity");
    let bad = CloneCacheSpec {
        size_mib: 64,
        aware: true,
        block_bytes: 1000,
        policy: Default::default(),
    };
    assert!(bad.validate().is_err());
}

#[test]
fn clone_cache_from_toml() {
    let spec: ArraySpec = toml::from_str(
        r#"
controller = "pcie-gen2"
drive = "sas-15k"
raid = { level = 5, drives = 8, stripe_element_bytes = 65536 }
clone_cache = { size_mib = 4096, aware = false }
"#,
    )
    .unwrap();
    let c = spec.clone_cache.clone().unwrap();
    assert_eq!((c.size_mib, c.aware, c.block_bytes), (4096, false, 4096));
    assert!(Array::new(&spec, 0).is_ok());
}

#[test]
fn deterministic() {
    let run = || {
        let (a, _, r) = booted(false, 32, 4);
        (r.completions, a.stats(), a.clone_cache_stats())
    };
    assert_eq!(run(), run());
}

#[test]
fn concurrent_boot_storm_merges_misses_in_flight() {
    // 32 clones boot at once (reads interleaved across clones, 64 outstanding).
    let n = 32u64;
    let mut res = Vec::new();
    for aware in [true, false] {
        let mut a = array(aware, 1024);
        let bases = clones(&mut a, n);
        let boot_reads = 4 * MIB / 65536;
        let r = run_closed_loop(&mut a, 64, n * boot_reads, |i| DeviceIo {
            offset_bytes: bases[(i % n) as usize] + (i / n) * 8 * 65536,
            size_bytes: 65536,
            dir: IoDir::Read,
        });
        assert_eq!(r.completed, n * boot_reads);
        let s = a.clone_cache_stats().unwrap();
        assert_eq!(s.inflight_blocks, 0);
        res.push((s.shared_block_misses, r.elapsed_ns));
    }
    assert_eq!(res[0].0, 4 * MIB / 4096, "aware: each boot block read once");
    assert_eq!(res[1].0, n * 4 * MIB / 4096, "unaware: once per clone");
    assert!(res[1].1 > 5 * res[0].1, "{res:?}");
}

mod props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Any mix of reads and writes over an image and its clones completes (no
        /// read waits forever on a merged miss) and leaves nothing in flight.
        #[test]
        fn every_request_completes(
            ios in proptest::collection::vec(
                (0u64..7, 0u64..64, 1u32..5, any::<bool>()), 1..150),
            qd in 1u32..40,
            aware in any::<bool>(),
            cache_mib in prop_oneof![Just(1u64), Just(64)],
        ) {
            let mut a = array(aware, cache_mib);
            let img = a.add_image(0, IMAGE_BYTES).unwrap();
            for i in 1..4 {
                a.add_clone(i * IMAGE_BYTES, IMAGE_BYTES, img).unwrap();
            }
            // Regions 5 and 6: thin clones with 256 KiB deltas (they wrap).
            let cap = a.capacity_bytes();
            for i in 0..2 {
                a.add_thin_clone(cap + i * IMAGE_BYTES, img, 8 * IMAGE_BYTES + i * (256 << 10), 256 << 10)
                    .unwrap();
            }
            let r = run_closed_loop(&mut a, qd, ios.len() as u64, |i| {
                let (region, block, blocks, write) = ios[i as usize];
                let base = if region >= 5 { cap + (region - 5) * IMAGE_BYTES } else { region * IMAGE_BYTES };
                DeviceIo {
                    offset_bytes: base + block * 16384,
                    size_bytes: blocks * 16384 - if write { 0 } else { 512 },
                    dir: if write { IoDir::Write } else { IoDir::Read },
                }
            });
            prop_assert_eq!(r.completed, ios.len() as u64);
            prop_assert_eq!(a.host_in_flight(), 0);
            let s = a.clone_cache_stats().unwrap();
            prop_assert_eq!(s.inflight_blocks, 0);
            prop_assert!(s.resident_blocks <= cache_mib * 256);
        }
    }
}

#[test]
fn thin_clones_live_beyond_the_capacity_and_write_to_their_delta() {
    let n = 8u64;
    let mut res = Vec::new();
    for aware in [true, false] {
        let mut a = array(aware, 1024);
        let cap = a.capacity_bytes();
        let img = a.add_image(0, IMAGE_BYTES).unwrap();
        // 8 clones of a 256 MiB image in 8 × 16 MiB of deltas.
        let bases: Vec<u64> = (0..n)
            .map(|i| {
                let v = cap + i * IMAGE_BYTES;
                a.add_thin_clone(v, img, IMAGE_BYTES + i * 16 * MIB, 16 * MIB)
                    .unwrap();
                v
            })
            .collect();
        let r = boot(&mut a, &bases);
        assert_eq!(r.completed, n * 256);
        res.push((
            a.clone_cache_stats().unwrap().shared_block_misses,
            a.stats().drive_reads,
        ));
        // A clone writes 64 KiB: redirected to its delta, read back as its own.
        let before = a.clone_cache_stats().unwrap();
        let w = run_closed_loop(&mut a, 1, 2, |i| DeviceIo {
            offset_bytes: bases[3] + 4 * MIB,
            size_bytes: 65536,
            dir: if i == 0 { IoDir::Write } else { IoDir::Read },
        });
        assert_eq!(w.completed, 2);
        let s = a.clone_cache_stats().unwrap();
        assert_eq!(s.redirected_blocks - before.redirected_blocks, 16);
        assert_eq!(s.read_hits, before.read_hits + 1);
        if aware {
            // The data sits at the start of clone 3's delta: reading that physical
            // address directly finds the same cached blocks.
            let r = run_closed_loop(&mut a, 1, 1, |_| DeviceIo {
                offset_bytes: IMAGE_BYTES + 3 * 16 * MIB,
                size_bytes: 65536,
                dir: IoDir::Read,
            });
            assert_eq!(r.completed, 1);
            assert_eq!(a.clone_cache_stats().unwrap().read_hits, s.read_hits + 1);
        }
        assert_eq!(
            a.clone_delta_blocks(weir_model::CloneId(3)),
            Some((16, IMAGE_BYTES / 4096))
        );
    }
    assert_eq!(res[0].0, 16 * MIB / 4096);
    assert_eq!(res[1].0, n * 16 * MIB / 4096);
}

#[test]
fn thin_clone_errors_register_nothing() {
    let mut a = array(true, 64);
    let cap = a.capacity_bytes();
    let img = a.add_image(0, IMAGE_BYTES).unwrap();
    assert!(
        a.add_thin_clone(IMAGE_BYTES, img, IMAGE_BYTES * 2, MIB)
            .is_err(),
        "inside capacity"
    );
    assert!(
        a.add_thin_clone(cap, img, cap - 4096, MIB).is_err(),
        "delta beyond capacity"
    );
    assert!(
        a.add_thin_clone(cap, img, 0, MIB).is_err(),
        "delta overlaps the image"
    );
    a.add_thin_clone(cap, img, IMAGE_BYTES, MIB).unwrap();
    assert!(
        a.add_thin_clone(cap + 4096, img, 2 * IMAGE_BYTES, MIB)
            .is_err(),
        "virtual ranges overlap"
    );
    // The failed call left its delta unregistered: the same delta can be used now.
    a.add_thin_clone(cap + IMAGE_BYTES, img, 2 * IMAGE_BYTES, MIB)
        .unwrap();
}
