//! Host flash read cache: physically motivated checks and cache invariants.

use proptest::prelude::*;
use weir_model::harness::SplitMix64;
use weir_model::{
    CachePolicy, Completion, Component, DeviceIo, HostCacheLookup, HostCacheSpec, HostFlashCache,
    HostWriteMode, IoDir,
};

const KIB: u64 = 1024;
const MIB: u64 = 1 << 20;

fn cache(capacity_bytes: u64, policy: CachePolicy) -> HostFlashCache {
    let mut spec = HostCacheSpec::iodrive2(capacity_bytes);
    spec.policy = policy;
    let mut c = HostFlashCache::new(&spec).unwrap();
    c.enable_volume(0).unwrap();
    c
}

/// Looks up, and on a miss fills at once (an instantaneous array).
fn read(c: &mut HostFlashCache, volume: u32, offset: u64, size: u32) -> HostCacheLookup {
    let r = c.lookup(volume, offset, size);
    match r {
        HostCacheLookup::Miss { fill } | HostCacheLookup::Partial { fill, .. } => {
            c.fill_on_read_completion(0, fill);
        }
        _ => {}
    }
    r
}

fn drain(c: &mut HostFlashCache) -> Vec<Completion> {
    let mut done = Vec::new();
    while let Some(t) = c.next_event_ns() {
        c.advance(t, &mut done);
    }
    done
}

#[test]
fn hit_is_served_at_pcie_flash_latency() {
    let mut c = cache(64 * MIB, CachePolicy::Slru);
    assert!(matches!(
        read(&mut c, 0, 8 * KIB, 8192),
        HostCacheLookup::Miss { .. }
    ));
    drain(&mut c); // background fill write
    assert_eq!(c.lookup(0, 8 * KIB, 8192), HostCacheLookup::Hit);
    let t0 = 10_000_000;
    c.submit(
        t0,
        DeviceIo {
            offset_bytes: 8 * KIB,
            size_bytes: 8192,
            dir: IoDir::Read,
        },
        42,
    );
    let done = drain(&mut c);
    assert_eq!(done.len(), 1, "the fill write is not reported");
    assert_eq!(done[0].token, 42);
    // ioDrive2: 68 µs access + 8 KiB at 1.5 GB/s ≈ 5.5 µs.
    let lat = done[0].at_ns - t0;
    assert!((65_000..90_000).contains(&lat), "hit latency {lat} ns");
}

#[test]
fn working_set_that_fits_gets_nearly_all_hits() {
    let mut c = cache(256 * MIB, CachePolicy::Slru);
    let mut rng = SplitMix64(3);
    let blocks = 64 * MIB / 4096;
    for b in 0..blocks {
        read(&mut c, 0, b * 4096, 4096);
    }
    let before = c.stats();
    for _ in 0..100_000 {
        read(&mut c, 0, rng.below(blocks) * 4096, 4096);
    }
    let s = c.stats();
    let hits = s.read_hits - before.read_hits;
    assert_eq!(hits, 100_000, "{s:?}");
    assert_eq!(c.resident_bytes(), 64 * MIB);
    assert!(s.byte_hit_ratio() > 0.6);
}

#[test]
fn working_set_twice_the_cache_hits_about_half() {
    for policy in [CachePolicy::Lru, CachePolicy::Slru] {
        let mut c = cache(32 * MIB, policy);
        let mut rng = SplitMix64(5);
        let blocks = 64 * MIB / 4096;
        for _ in 0..50_000 {
            read(&mut c, 0, rng.below(blocks) * 4096, 4096);
        }
        let before = c.stats();
        for _ in 0..50_000 {
            read(&mut c, 0, rng.below(blocks) * 4096, 4096);
        }
        let hits = (c.stats().read_hits - before.read_hits) as f64 / 50_000.0;
        assert!((0.35..0.65).contains(&hits), "{policy:?}: hit ratio {hits}");
        assert!(c.resident_bytes() <= 32 * MIB);
    }
}

#[test]
fn scan_resistant_policy_keeps_the_hot_set_through_a_backup_scan() {
    let mut hot_after = Vec::new();
    for policy in [CachePolicy::Lru, CachePolicy::Slru] {
        let mut c = cache(16 * MIB, policy);
        let hot = 8 * MIB / 4096;
        for _ in 0..3 {
            for b in 0..hot {
                read(&mut c, 0, b * 4096, 4096);
            }
        }
        // A sequential scan of 1 GiB in 64 KiB reads.
        for i in 0..(1 << 30) / (64 * KIB) {
            read(&mut c, 0, (1 << 32) + i * 64 * KIB, 65536);
        }
        let resident = (0..hot).filter(|&b| c.is_resident(0, b * 4096)).count();
        hot_after.push(resident as u64);
    }
    assert_eq!(hot_after[0], 0, "LRU: the scan flushes the hot set");
    assert_eq!(hot_after[1], 8 * MIB / 4096, "SLRU keeps it");
}

#[test]
fn only_enabled_volumes_are_cached() {
    let mut c = cache(16 * MIB, CachePolicy::Slru);
    assert_eq!(c.lookup(1, 0, 4096), HostCacheLookup::Bypass);
    c.on_write(0, 1, 0, 4096);
    assert_eq!(c.stats().lookups, 0);
    read(&mut c, 0, 0, 4096);
    assert!(c.is_resident(0, 0));
    c.disable_volume(0);
    assert_eq!(c.lookup(0, 0, 4096), HostCacheLookup::Bypass);
    c.enable_volume(0).unwrap();
    // Blocks cached before the volume was disabled are not trusted again.
    assert!(matches!(c.lookup(0, 0, 4096), HostCacheLookup::Miss { .. }));
    assert!(c.enable_volume(u32::MAX).is_err());
}

#[test]
fn write_through_updates_or_invalidates() {
    let mut c = cache(16 * MIB, CachePolicy::Slru);
    read(&mut c, 0, 0, 16384);
    c.on_write(5, 0, 4096, 4096);
    assert_eq!(c.lookup(0, 0, 16384), HostCacheLookup::Hit);
    assert_eq!(c.stats().write_updated_blocks, 1);
    assert_eq!(c.stats().flash_writes, 2, "fill + update");

    let mut spec = HostCacheSpec::iodrive2(16 * MIB);
    spec.write_mode = HostWriteMode::Invalidate;
    let mut c = HostFlashCache::new(&spec).unwrap();
    c.enable_volume(0).unwrap();
    read(&mut c, 0, 0, 16384);
    c.on_write(5, 0, 4096, 4096);
    match c.lookup(0, 0, 16384) {
        HostCacheLookup::Partial {
            hit_bytes,
            miss_offset_bytes,
            miss_size_bytes,
            ..
        } => {
            assert_eq!(hit_bytes, 12288);
            assert_eq!((miss_offset_bytes, miss_size_bytes), (4096, 4096));
        }
        other => panic!("expected a partial hit, got {other:?}"),
    }
}

#[test]
fn populate_on_write_inserts_whole_blocks_only() {
    let mut spec = HostCacheSpec::iodrive2(16 * MIB);
    spec.populate_on_write = true;
    let mut c = HostFlashCache::new(&spec).unwrap();
    c.enable_volume(0).unwrap();
    c.on_write(0, 0, 2048, 8192); // covers block 1 fully, blocks 0 and 2 partly
    assert!(!c.is_resident(0, 0));
    assert!(c.is_resident(0, 4096));
    assert!(!c.is_resident(0, 8192));
}

#[test]
fn a_fill_racing_with_a_write_is_dropped() {
    let mut c = cache(16 * MIB, CachePolicy::Slru);
    let HostCacheLookup::Miss { fill } = c.lookup(0, 0, 65536) else {
        panic!("cold cache must miss");
    };
    // The write reaches the array while the read is in flight: the read may
    // return the old data, which must not be cached.
    c.on_write(10, 0, 8192, 4096);
    assert_eq!(c.fill_on_read_completion(20, fill), 0);
    assert_eq!(c.stats().fills_cancelled, 1);
    assert!(matches!(
        c.lookup(0, 0, 65536),
        HostCacheLookup::Miss { .. }
    ));
    // A used ticket does nothing.
    assert_eq!(c.fill_on_read_completion(30, fill), 0);
}

#[test]
fn unaligned_reads_fill_only_covered_blocks() {
    let mut c = cache(16 * MIB, CachePolicy::Slru);
    read(&mut c, 0, 512, 8192); // covers block 1 only
    assert!(!c.is_resident(0, 0));
    assert!(c.is_resident(0, 4096));
    assert!(!c.is_resident(0, 8192));
}

#[test]
fn bad_specs_are_errors() {
    let mut s = HostCacheSpec::iodrive2(1 << 40);
    assert!(HostFlashCache::new(&s).is_err(), "larger than the card");
    s.capacity_bytes = 16 * MIB;
    s.block_bytes = 3000;
    let e = HostFlashCache::new(&s).unwrap_err().to_string();
    assert!(e.contains("block_bytes"), "{e}");
    let toml_spec: HostCacheSpec =
        toml::from_str("capacity_bytes = 1073741824\npolicy = \"lru\"\n").unwrap();
    assert_eq!(toml_spec.block_bytes, 4096);
    assert_eq!(toml_spec.policy, CachePolicy::Lru);
    assert!(toml::from_str::<HostCacheSpec>("capacity_bytes = 1\nsize = 2\n").is_err());
}

#[test]
fn deterministic() {
    let run = || {
        let mut c = cache(8 * MIB, CachePolicy::Slru);
        let mut rng = SplitMix64(11);
        let mut done = Vec::new();
        for i in 0..20_000u64 {
            let off = rng.below(4096) * 4096;
            if rng.below(10) < 3 {
                c.on_write(i * 1000, 0, off, 4096);
            } else if read(&mut c, 0, off, 4096) == HostCacheLookup::Hit {
                c.submit(
                    i * 1000,
                    DeviceIo {
                        offset_bytes: off,
                        size_bytes: 4096,
                        dir: IoDir::Read,
                    },
                    i,
                );
            }
            c.advance(i * 1000, &mut done);
        }
        done.extend(drain(&mut c));
        (c.stats(), done)
    };
    assert_eq!(run(), run());
}

#[derive(Clone, Debug)]
enum Op {
    /// Lookup of blocks [b, b+n); the fill completes after `delay` more ops.
    Read {
        b: u64,
        n: u64,
        delay: usize,
    },
    Write {
        b: u64,
        n: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u64..64, 1u64..6, 0usize..4).prop_map(|(b, n, delay)| Op::Read { b, n, delay }),
        1 => (0u64..64, 1u64..4).prop_map(|(b, n)| Op::Write { b, n }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Every block the cache claims to hold carries the latest written version:
    /// fills carry the versions read when the array read was issued, and are only
    /// accepted if no write intervened.
    #[test]
    fn never_serves_stale_data(
        ops in proptest::collection::vec(op(), 1..200),
        update in any::<bool>(),
        lru in any::<bool>(),
    ) {
        let mut spec = HostCacheSpec::iodrive2(16 * 4096);
        spec.write_mode = if update { HostWriteMode::Update } else { HostWriteMode::Invalidate };
        spec.policy = if lru { CachePolicy::Lru } else { CachePolicy::Slru };
        let mut c = HostFlashCache::new(&spec).unwrap();
        c.enable_volume(0).unwrap();
        let mut version = [0u64; 80];
        // What the cache would hold for each block if it holds it.
        let mut cached_version = [u64::MAX; 80];
        // Fills in flight: (ticket, first block, blocks, versions at issue, due step).
        let mut inflight: Vec<(weir_model::FillTicket, u64, u64, Vec<u64>, usize)> = Vec::new();
        for (step, op) in ops.iter().enumerate() {
            let mut k = 0;
            while k < inflight.len() {
                if inflight[k].4 <= step {
                    let (t, b, n, vers, _) = inflight.swap_remove(k);
                    if c.fill_on_read_completion(step as u64, t) > 0 {
                        for i in 0..n {
                            cached_version[(b + i) as usize] = vers[i as usize];
                        }
                    }
                } else {
                    k += 1;
                }
            }
            match *op {
                Op::Read { b, n, delay } => {
                    let r = c.lookup(0, b * 4096, (n * 4096) as u32);
                    for i in b..b + n {
                        if c.is_resident(0, i * 4096) {
                            prop_assert_eq!(cached_version[i as usize], version[i as usize],
                                "stale block {} served", i);
                        }
                    }
                    match r {
                        HostCacheLookup::Hit => {}
                        HostCacheLookup::Miss { fill } | HostCacheLookup::Partial { fill, .. } => {
                            let vers = (b..b + n).map(|i| version[i as usize]).collect();
                            inflight.push((fill, b, n, vers, step + delay));
                        }
                        HostCacheLookup::Bypass => prop_assert!(false, "enabled volume bypassed"),
                    }
                }
                Op::Write { b, n } => {
                    for i in b..b + n {
                        version[i as usize] += 1;
                    }
                    c.on_write(step as u64, 0, b * 4096, (n * 4096) as u32);
                    if update {
                        for i in b..b + n {
                            cached_version[i as usize] = version[i as usize];
                        }
                    }
                }
            }
            prop_assert!(c.resident_bytes() <= 16 * 4096);
            let s = c.stats();
            prop_assert_eq!(s.read_hits + s.read_misses + s.read_partial, s.lookups);
        }
    }
}
