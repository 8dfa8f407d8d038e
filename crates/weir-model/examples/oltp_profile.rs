//! Profiling target: RAID 5 OLTP at QD48 (not part of the test suite).
use weir_model::harness::{SplitMix64, run_closed_loop};
use weir_model::{Array, DeviceIo, IoDir};
fn main() {
    let mut a = Array::from_preset("15k-sas-raid5x24", 1).expect("preset");
    let mut rng = SplitMix64(1);
    let blocks = a.capacity_bytes() * 7 / 10 / 8192;
    let r = run_closed_loop(&mut a, 48, 1_000_000, |_| DeviceIo {
        offset_bytes: rng.below(blocks) * 8192,
        size_bytes: 8192,
        dir: if rng.below(10) < 7 {
            IoDir::Read
        } else {
            IoDir::Write
        },
    });
    println!("{:.0} IOPS", r.iops());
}
