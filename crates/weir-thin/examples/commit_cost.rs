//! The cost of committing grain-map changes (what a FLUSH costs a thin volume
//! beyond syncing data): `batch` first writes (64 KiB grains), then one commit;
//! prints the median commit time per batch size. Paired with bench/thin-meta.py
//! (the same batches as SQLite transactions) by `bench/thin.sh meta`.
//!   cargo run --release -p weir-thin --example commit_cost -- DIR

use std::sync::Arc;
use std::time::Instant;

use weir_thin::{Chain, GRAIN_BYTES, Layer, ThinVolume};

fn main() {
    let dir = std::env::args().nth(1).expect("usage: commit_cost DIR");
    let dir = std::path::Path::new(&dir);
    let grains = 1 << 20; // a 64 GiB volume
    let layer = Arc::new(Layer::open(dir, 1, grains, GRAIN_BYTES).unwrap());
    let v = ThinVolume::new(
        Chain {
            layers: vec![layer],
        },
        grains * GRAIN_BYTES,
        true,
        None,
    );
    let data = vec![0xA5u8; 4096];
    let mut next = 0u64;
    for batch in [1u64, 16, 256, 4096] {
        let mut times = Vec::new();
        for _ in 0..7 {
            for _ in 0..batch {
                // Spread over the map like random first writes.
                let g = (next * 2_654_435_761) % grains;
                next += 1;
                v.write(g * GRAIN_BYTES, &data, false).unwrap();
            }
            let t = Instant::now();
            v.flush().unwrap();
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        times.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!(
            "weir map commit: {batch} entries: {:.2} ms (median of 7)",
            times[3]
        );
    }
}
