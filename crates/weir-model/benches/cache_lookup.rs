//! Prints the CPU cost of the cache models: ns per flash-cache operation, and simulated
//! I/Os per CPU second for the clone-cache array and the hybrid array.
//! Run: `cargo bench -p weir-model --bench cache_lookup`

use weir_model::harness::{SplitMix64, run_closed_loop};
use weir_model::{
    Array, ArraySpec, BlockCache, CachePolicy, CloneCacheSpec, DeviceIo, FlashCache,
    FlashCacheSpec, HybridArray, IoDir, ReadPlan,
};

/// CPU time of this thread (immune to other processes sharing the machine), s.
fn cpu_s() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the provided timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// 8 KiB random reads over `working_set` bytes of a 4 GiB flash cache (4 KiB
/// blocks, the server's and the simulator's model); misses are filled, one
/// operation in four is a write (which invalidates what it covers).
fn host_lookup(policy: CachePolicy, working_set: u64, n: u64) {
    let mut c = FlashCache::new(FlashCacheSpec {
        capacity_blocks: ((4u64 << 30) / 4096) as u32,
        block_bytes: 4096,
        policy,
        scan_bytes: 4 << 20,
    });
    let v = c.add_volume(true);
    let mut rng = SplitMix64(1);
    let blocks = working_set / 8192;
    let op = |c: &mut FlashCache, off: u64, write: bool| {
        if write {
            let w = c.write_begin(v, off, 8192);
            c.write_end(w);
        } else if let ReadPlan::Miss { fill: Some(fill) } = c.read(v, off, 8192) {
            let _ = c.fill_slots(fill);
            c.filled(fill, true);
        }
    };
    // Warm up (and reach the steady-state table size).
    for _ in 0..n {
        op(&mut c, rng.below(blocks) * 8192, false);
    }
    let before = c.stats(v);
    let t0 = cpu_s();
    for i in 0..n {
        op(&mut c, rng.below(blocks) * 8192, i % 4 == 3);
    }
    let wall = cpu_s() - t0;
    let s = c.stats(v).since(&before);
    println!(
        "flash cache {policy:?}, working set {} MiB: {:.0} ns per operation (3/4 reads + fills, 1/4 writes), hit ratio {:.2}",
        working_set >> 20,
        wall * 1e9 / n as f64,
        s.hit_ratio()
    );
}

/// `aware`: None = no clone cache (the controller's own 1 GiB cache), the baseline.
fn clone_array(aware: Option<bool>, n: u64) {
    let mut spec = ArraySpec::preset("15k-sas-raid5x24").expect("preset");
    spec.clone_cache = aware.map(|aware| CloneCacheSpec {
        size_mib: 2048,
        aware,
        block_bytes: 4096,
        policy: CachePolicy::Slru,
    });
    let mut a = Array::new(&spec, 1).expect("array");
    let image_bytes = 24u64 << 30;
    let clones = 100u64;
    if aware.is_some() {
        let img = a.add_image(0, image_bytes).expect("image");
        for i in 1..=clones {
            a.add_clone(i * image_bytes, image_bytes, img)
                .expect("clone");
        }
    }
    let mut rng = SplitMix64(3);
    let t0 = cpu_s();
    let r = run_closed_loop(&mut a, 64, n, |_| {
        let clone = 1 + rng.below(clones);
        DeviceIo {
            // Boot-like: reads over the first 1 GiB of the image, 20 % writes.
            offset_bytes: clone * image_bytes + rng.below((1 << 30) / 65536) * 65536,
            size_bytes: 65536,
            dir: if rng.below(5) == 0 {
                IoDir::Write
            } else {
                IoDir::Read
            },
        }
    });
    let wall = cpu_s() - t0;
    let (hits, lookups) = a
        .clone_cache_stats()
        .map_or((a.stats().read_cache_hits, a.stats().host_reads), |s| {
            (s.read_hits, s.read_lookups)
        });
    let label = match aware {
        Some(true) => "clone cache aware",
        Some(false) => "clone cache unaware",
        None => "no clone cache (baseline)",
    };
    println!(
        "100 clones, 64K boot reads, 20 % writes, QD64, {label}: {:.0} simulated IOPS, {:.0} host I/Os per CPU s ({:.0} ns each); read hits {hits}/{lookups}",
        r.iops(),
        n as f64 / wall,
        wall * 1e9 / n as f64,
    );
}

fn hybrid(n: u64) {
    let mut a = HybridArray::from_preset("iocontrol-n5-150", 1).expect("preset");
    let mut rng = SplitMix64(5);
    let t0 = cpu_s();
    let r = run_closed_loop(&mut a, 64, n, |_| {
        // 80 % of I/Os on a 20 GiB hot set, the rest over 2 TB.
        let off = if rng.below(10) < 8 {
            rng.below(20 << 17) * 8192
        } else {
            rng.below(2_000_000_000_000 / 8192) * 8192
        };
        DeviceIo {
            offset_bytes: off,
            size_bytes: 8192,
            dir: if rng.below(10) < 7 {
                IoDir::Read
            } else {
                IoDir::Write
            },
        }
    });
    let wall = cpu_s() - t0;
    let s = a.stats();
    println!(
        "hybrid iocontrol-n5-150 OLTP 70/30 8K QD64: {:.0} simulated IOPS, mean {:.2} ms, flash reads {:.0} % (flash {:.3} ms, disk {:.2} ms), {:.0} host I/Os per CPU s ({:.0} ns each)",
        r.iops(),
        r.mean_latency_ns / 1e6,
        100.0 * s.flash_read_ratio(),
        s.mean_flash_read_latency_ms(),
        s.mean_disk_read_latency_ms(),
        n as f64 / wall,
        wall * 1e9 / n as f64
    );
}

/// The block cache index alone, full, as the simulator's array flash tier uses it:
/// 512 GiB of 64 KiB blocks (8 Mi entries, LRU), random keys over three times that;
/// a lookup per request, a miss inserted (evicting), every fourth request a write
/// (inserted). Memory-bound: the table and slab are ≈ 400 MB.
fn block_index(n: u64) {
    let capacity = 1u32 << 23;
    let mut c = BlockCache::new(capacity, CachePolicy::Lru);
    let mut rng = SplitMix64(7);
    let keys = capacity as u64 * 3;
    let key = |rng: &mut SplitMix64| {
        let k = rng.below(keys);
        (k.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5EED) as u128
    };
    for _ in 0..capacity as u64 * 2 {
        c.insert(key(&mut rng));
    }
    let t0 = cpu_s();
    let mut hits = 0u64;
    for i in 0..n {
        let k = key(&mut rng);
        if i % 4 == 3 {
            c.insert(k);
        } else if c.touch(k) {
            hits += 1;
        } else {
            c.insert(k);
        }
    }
    let cpu = cpu_s() - t0;
    println!(
        "block index, 8 Mi blocks full (LRU): {:.0} ns per request (3/4 lookups, misses inserted; 1/4 inserts), hit ratio {:.2}",
        cpu * 1e9 / n as f64,
        hits as f64 / (n - n / 4) as f64
    );
}

fn main() {
    if std::env::args().any(|a| a == "index") {
        block_index(5_000_000);
        return;
    }
    block_index(5_000_000);
    host_lookup(CachePolicy::Slru, 1 << 30, 2_000_000);
    host_lookup(CachePolicy::Slru, 16 << 30, 2_000_000);
    host_lookup(CachePolicy::Lru, 16 << 30, 2_000_000);
    clone_array(Some(true), 300_000);
    clone_array(Some(false), 300_000);
    clone_array(None, 300_000);
    hybrid(300_000);
}
