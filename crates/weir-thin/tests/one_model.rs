//! One cache model, two clocks: the same boot storm — clones of one golden
//! image, each reading the same boot grains in its own order — driven through
//! the simulator's clone-aware array cache (weir-model's `Array` on a virtual
//! clock, as `weir sim vdi-week` runs it) and through `weir serve`'s thin
//! volumes (real files, real threads) gives the same hits, misses and evictions,
//! because both drive `weir_model::ReadCache`.

use std::sync::Arc;

use weir_model::harness::{SplitMix64, run_closed_loop};
use weir_model::{
    Array, ArraySpec, CloneCacheSpec, ControllerRef, DeviceIo, DriveRef, IoDir, PolicyOverride,
    RaidSpec, WritePolicy,
};
use weir_thin::{Chain, GRAIN_BYTES, GrainCache, Layer, ThinVolume};

const IMAGE_GRAINS: u64 = 1024; // 64 MiB
const BOOT_GRAINS: u64 = 192;
const CACHE_GRAINS: u64 = 128; // smaller than the boot set: evictions happen
const CLONES: u64 = 6;

/// Clone `c`'s boot: the boot grains (every 5th grain of the image) in a
/// clone-specific order.
fn boot_order(rng: &mut SplitMix64) -> Vec<u64> {
    let mut order: Vec<u64> = (0..BOOT_GRAINS).map(|i| i * 5).collect();
    for k in (1..order.len()).rev() {
        order.swap(k, rng.below(k as u64 + 1) as usize);
    }
    order
}

fn trace() -> Vec<(u64, u64)> {
    let mut rng = SplitMix64(11);
    (0..CLONES)
        .flat_map(|c| boot_order(&mut rng).into_iter().map(move |g| (c, g)))
        .collect()
}

#[test]
fn simulator_and_server_caches_make_the_same_decisions() {
    let trace = trace();
    // The simulator's side: an array with a clone-aware cache of 64 KiB blocks,
    // the image at 0 and each clone in its own region, one read at a time.
    let spec = ArraySpec {
        controller: ControllerRef::Preset("pcie-gen2".into()),
        raid: RaidSpec::new(5, 8, 64 << 10),
        drive: DriveRef::Preset("sas-15k".into()),
        policy: PolicyOverride {
            write_policy: Some(WritePolicy::WriteThrough),
            ..PolicyOverride::default()
        },
        clone_cache: Some(CloneCacheSpec {
            size_mib: (CACHE_GRAINS * GRAIN_BYTES) >> 20,
            aware: true,
            block_bytes: GRAIN_BYTES as u32,
            policy: Default::default(),
        }),
    };
    let mut array = Array::new(&spec, 1).unwrap();
    let image_bytes = IMAGE_GRAINS * GRAIN_BYTES;
    let img = array.add_image(0, image_bytes).unwrap();
    for c in 1..=CLONES {
        array.add_clone(c * image_bytes, image_bytes, img).unwrap();
    }
    run_closed_loop(&mut array, 1, trace.len() as u64, |i| {
        let (c, g) = trace[i as usize];
        DeviceIo {
            offset_bytes: (c + 1) * image_bytes + g * GRAIN_BYTES,
            size_bytes: GRAIN_BYTES as u32,
            dir: IoDir::Read,
        }
    });
    let sim = array.clone_cache_stats().unwrap();

    // The server's side: a golden layer frozen under CLONES clone tops, reads
    // through the pool's GrainCache.
    let dir = tempfile::tempdir().unwrap();
    let golden = Arc::new(Layer::open(dir.path(), 1, IMAGE_GRAINS, GRAIN_BYTES).unwrap());
    let image = ThinVolume::new(
        Chain {
            layers: vec![golden.clone()],
        },
        image_bytes,
        true,
        None,
    );
    image
        .write(0, &vec![0x5A; image_bytes as usize], false)
        .unwrap();
    image.flush().unwrap();
    golden.freeze();
    let cache = Arc::new(GrainCache::new(CACHE_GRAINS * GRAIN_BYTES, GRAIN_BYTES));
    let clones: Vec<ThinVolume> = (0..CLONES)
        .map(|c| {
            let top = Arc::new(Layer::open(dir.path(), 10 + c, IMAGE_GRAINS, GRAIN_BYTES).unwrap());
            let chain = Chain {
                layers: vec![top, golden.clone()],
            };
            ThinVolume::new(chain, image_bytes, true, Some(cache.clone()))
        })
        .collect();
    let mut buf = vec![0u8; GRAIN_BYTES as usize];
    for &(c, g) in &trace {
        clones[c as usize].read(g * GRAIN_BYTES, &mut buf).unwrap();
    }
    let live = cache.stats();

    assert!(sim.evicted_blocks > 0, "the trace must evict: {sim:?}");
    assert_eq!(
        (live.hits, live.misses, live.evictions, live.resident),
        (
            sim.block_hits,
            sim.block_misses,
            sim.evicted_blocks,
            sim.resident_blocks
        ),
        "server {live:?} vs simulator {sim:?}"
    );
}
